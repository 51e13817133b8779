#pragma once
/// Private helper of the CUDA backend: turns a failed CUDA runtime call into mpt::Error.
///
///   check_cuda(cudaMalloc(&p, n), "cudaMalloc");   // "cudaMalloc: cudaErrorMemoryAllocation (out of memory)"
#ifdef MPT_WITH_CUDA
#include <cuda_runtime_api.h>

namespace mpt::cuda {

/// Throws mpt::Error "<what>: <error name> (<error string>)" unless status is cudaSuccess.
/// Clears the runtime's last-error state first so the failure does not leak into later calls.
void check_cuda(cudaError_t status, const char* what);

}  // namespace mpt::cuda

#define MPT_CUDA_CHECK(call) ::mpt::cuda::check_cuda((call), #call)
#endif  // MPT_WITH_CUDA
