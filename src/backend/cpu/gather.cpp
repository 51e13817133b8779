// Row gathers (shuffled batches) and zero padding / cropping by per-axis offsets.
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"

namespace mpt::cpu {

void CpuBackend::gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) {
  const std::int64_t count = indices.numel();
  const std::size_t row = x.shape()[0] > 0 ? x.nbytes() / static_cast<std::size_t>(x.shape()[0]) : 0;
  if (row == 0 || count == 0) return;
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const auto* idx = indices.data<std::int64_t>();
  const std::int64_t rows = x.shape()[0];
  for (std::int64_t k = 0; k < count; ++k)  // one sequential pass: an index outside x is an error, never a read
    MPT_CHECK(idx[k] >= 0 && idx[k] < rows, "gather_rows: index ", idx[k], " (position ", k, ") is outside [0, ",
              rows, ") for x of ", rows, " rows");
  // Scattered rows are memory-latency bound: both threads help from a few hundred KB on.
  parallel_for(count, std::max<std::int64_t>(1, (std::int64_t{1} << 17) / static_cast<std::int64_t>(row)),
               [&](std::int64_t b, std::int64_t e) {
                 for (std::int64_t k = b; k < e; ++k)
                   std::memcpy(dst + static_cast<std::size_t>(k) * row, src + static_cast<std::size_t>(idx[k]) * row, row);
               });
}

void CpuBackend::scatter_add_rows(const Tensor& src, const Tensor& indices, Tensor& out) {
  const std::int64_t count = indices.numel(), rows = out.shape()[0];
  const std::int64_t width = rows > 0 ? out.numel() / rows : 0;
  if (count == 0 || width == 0) return;
  const auto* idx = indices.data<std::int64_t>();
  for (std::int64_t k = 0; k < count; ++k)  // ops checks the ids it scatters by; this is the last guard
    MPT_CHECK(idx[k] >= 0 && idx[k] < rows, "scatter_add_rows: index ", idx[k], " (position ", k,
              ") is outside [0, ", rows, ") for a table of ", rows, " rows");
  with_compute_type(out.dtype(), [&](auto c) {
    using C = decltype(c);
    C* o = out.data<C>();
    // The columns are split between the threads; each column adds its rows in k order, so the
    // sums do not depend on the thread count (and match the CUDA body's).
    parallel_for(width, 256, [&](std::int64_t b, std::int64_t e) {
      std::vector<C> scratch(static_cast<std::size_t>(e - b));
      for (std::int64_t k = 0; k < count; ++k) {
        const C* s = load<C>(src, k * width + b, e - b, scratch.data());
        C* dst = o + idx[k] * width + b;
        for (std::int64_t j = 0; j < e - b; ++j) dst[j] += s[j];
      }
    });
  });
}

void CpuBackend::pad(const Tensor& x, const std::vector<std::int64_t>& offset, Tensor& out) {
  const Shape& xs = x.shape();
  const Shape& os = out.shape();
  const auto nd = static_cast<std::int64_t>(os.size());
  const std::size_t es = itemsize(out.dtype());
  if (out.numel() == 0) return;
  if (nd == 0) {
    std::memcpy(out.data_ptr(), x.data_ptr(), es);
    return;
  }
  // Per output row (all axes but the last): the source row, or none; then a run along the last axis.
  const std::int64_t last = os[nd - 1], rows = out.numel() / last;
  const std::int64_t lo = std::max<std::int64_t>(0, offset[nd - 1]);
  const std::int64_t hi = std::min(last, xs[nd - 1] + offset[nd - 1]);
  auto* dst = static_cast<char*>(out.data_ptr());
  const auto* src = static_cast<const char*>(x.data_ptr());
  parallel_for(rows, std::max<std::int64_t>(1, 16384 / last), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      char* o = dst + static_cast<std::size_t>(r * last) * es;
      std::int64_t rest = r, src_row = 0, stride = 1;
      bool inside = hi > lo;
      for (std::int64_t d = nd - 2; d >= 0 && inside; --d) {
        const std::int64_t i = rest % os[d] - offset[d];
        rest /= os[d];
        inside = i >= 0 && i < xs[d];
        src_row += i * stride;
        stride *= xs[d];
      }
      if (!inside) {
        std::memset(o, 0, static_cast<std::size_t>(last) * es);
        continue;
      }
      std::memset(o, 0, static_cast<std::size_t>(lo) * es);
      std::memcpy(o + static_cast<std::size_t>(lo) * es,
                  src + static_cast<std::size_t>(src_row * xs[nd - 1] + lo - offset[nd - 1]) * es,
                  static_cast<std::size_t>(hi - lo) * es);
      std::memset(o + static_cast<std::size_t>(hi) * es, 0, static_cast<std::size_t>(last - hi) * es);
    }
  });
}

}  // namespace mpt::cpu
