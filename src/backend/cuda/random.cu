// Philox random numbers: each thread computes its elements from (seed, offset, index) with
// backend/common/random.hpp, as the CPU does, so both devices give the same bits.
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/random.hpp"

namespace mpt::cuda {
namespace {
using namespace mpt::kernels;

constexpr unsigned kThreads = 256;

template <class T>
__global__ void random_kernel(T* out, std::int64_t n, bool normal, double a, double b, std::uint64_t seed,
                              std::uint64_t offset) {
  random_body(this_thread(), out, n, normal, a, b, seed, offset);
}
}  // namespace

void CudaBackend::random(Distribution dist, double a, double b, std::uint64_t seed, std::uint64_t offset,
                         Tensor& out) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device().index);
  dispatch(out.dtype(), [&](auto ot) {
    using T = typename decltype(ot)::type;
    random_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream(guard.index())>>>(
        static_cast<T*>(out.data_ptr()), n, dist == Distribution::Normal, a, b, seed, offset);
    check_launch("random");
  });
}

}  // namespace mpt::cuda
