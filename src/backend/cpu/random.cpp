// Philox random numbers: the body of backend/common/philox.hpp, per element, so the values do
// not depend on how the work is split over threads (or, on a GPU, over blocks).
#include "backend/common/random.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"

namespace mpt::cpu {

void CpuBackend::random(Distribution dist, double a, double b, std::uint64_t seed, std::uint64_t offset,
                        Tensor& out) {
  const bool normal = dist == Distribution::Normal;
  parallel_for(out.numel(), 4096, [&](std::int64_t begin, std::int64_t end) {
    double v[kBlock];
    for (std::int64_t i = begin; i < end; i += kBlock) {
      const std::int64_t m = std::min(kBlock, end - i);
      for (std::int64_t j = 0; j < m; ++j) {
        const auto k = static_cast<std::uint64_t>(i + j);
        v[j] = normal ? kernels::normal_value(seed, offset, k, a, b) : kernels::uniform_value(seed, offset, k, a, b);
      }
      detail::convert(v, float64, static_cast<char*>(out.data_ptr()) + i * itemsize(out.dtype()), out.dtype(),
                      static_cast<std::size_t>(m));
    }
  });
}

}  // namespace mpt::cpu
