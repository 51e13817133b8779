#pragma once
/// Private helpers of the CUDA backend: every CUDA runtime, cuBLAS(Lt) and cuDNN status becomes
/// an mpt::Error naming the op; devices and their compute streams.
///
///   check_cuda(cudaMallocAsync(&p, n, s), "cudaMallocAsync");   // "cudaMallocAsync: cudaErrorMemoryAllocation (out of memory)"
///   DeviceGuard g(x.device().index);   // cudaSetDevice for this scope
///   kernel<<<grid, block, 0, stream(g.index())>>>(...); check_launch("relu");
#ifdef MPT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <initializer_list>

namespace mpt::cuda {

/// Throws mpt::Error "<what>: <error name> (<error string>)" unless status is cudaSuccess.
/// Clears the runtime's last-error state first so the failure does not leak into later calls.
void check_cuda(cudaError_t status, const char* what);
/// The same for cuBLAS / cuBLASLt (cublasStatus_t) and cuDNN (cudnnStatus_t) statuses, passed
/// as int so this header needs neither library's headers.
void check_cublas(int status, const char* what);
void check_cudnn(int status, const char* what);
/// After a kernel launch: a launch error (bad configuration, no device) as mpt::Error naming op.
void check_launch(const char* op);

/// Once per process and op: a log line when a 16-bit GEMM or convolution has a dimension that
/// is not a multiple of 8 (tensor cores then run padded or not at all). dims: the op's M, N, K
/// or channel counts.
void hint_tensor_core_shape(const char* op, int dtype, std::initializer_list<long long> dims);

/// Makes GPU `index` current for this scope (and restores the previous one).
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  int index() const { return index_; }

 private:
  int index_, previous_ = -1;
};

/// The one compute stream of GPU `index` (non-blocking, created on first use): every op, copy
/// and allocation of that GPU is ordered on it.
cudaStream_t stream(int index);

}  // namespace mpt::cuda

#define MPT_CUDA_CHECK(call) ::mpt::cuda::check_cuda((call), #call)
#endif  // MPT_WITH_CUDA
