// Device memory for the caching allocator; without the CUDA backend every call is an error.
#include <cstddef>

#include "mpt/error.hpp"
#ifdef MPT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.hpp"
#endif

namespace mpt::detail {

#ifdef MPT_WITH_CUDA
void* cuda_malloc(int device, std::size_t nbytes) {
  void* p = nullptr;
  cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
  cuda::check_cuda(cudaMalloc(&p, nbytes), "cudaMalloc");
  return p;
}
void cuda_free(int device, void* ptr) {
  cudaSetDevice(device);
  cudaFree(ptr);  // never throws from a destructor path
}
void cuda_copy(void* dst, const void* src, std::size_t n, bool dst_cuda, bool src_cuda) {
  auto kind = dst_cuda ? (src_cuda ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                       : cudaMemcpyDeviceToHost;
  cuda::check_cuda(cudaMemcpy(dst, src, n, kind), "cudaMemcpy");
}
#else
void* cuda_malloc(int, std::size_t) { fail("allocator: mpt was built without CUDA (MPT_WITH_CUDA=OFF)"); }
void cuda_free(int, void*) {}
void cuda_copy(void*, const void*, std::size_t, bool, bool) {
  fail("copy: mpt was built without CUDA (MPT_WITH_CUDA=OFF)");
}
#endif

}  // namespace mpt::detail
