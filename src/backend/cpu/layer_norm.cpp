// Layer normalization over the last axis of x viewed as [rows, D]: per-row statistics in float64,
// elementwise work in float32 (float64 for float64 data), 16-bit data read and written directly.
#include <cmath>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/row_chunks.hpp"

namespace mpt::cpu {
namespace {

template <class C>
void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& mean,
             Tensor& rstd) {
  const std::int64_t d = x.shape().back(), rows = x.numel() / std::max<std::int64_t>(d, 1);
  const auto g = values_of<C>(gamma, d, C(1)), bt = values_of<C>(beta, d, C(0));
  std::vector<double> means(rows), rstds(rows);
  parallel_for(rows, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(d, 1)), [&](std::int64_t b, std::int64_t e) {
    std::vector<C> sx(d), sy(d);
    for (std::int64_t r = b; r < e; ++r) {
      const C* px = load<C>(x, r * d, d, sx.data());
      double s = 0, s2 = 0;
      for (std::int64_t i = 0; i < d; ++i) s += static_cast<double>(px[i]);
      const double m = s / static_cast<double>(d);
      for (std::int64_t i = 0; i < d; ++i) s2 += (static_cast<double>(px[i]) - m) * (static_cast<double>(px[i]) - m);
      const double rs = 1.0 / std::sqrt(s2 / static_cast<double>(d) + eps);
      means[r] = m, rstds[r] = rs;
      const C mc = static_cast<C>(m), rc = static_cast<C>(rs);
      C* py = store_target<C>(y, r * d, sy.data());
      for (std::int64_t i = 0; i < d; ++i) py[i] = (px[i] - mc) * rc * g[i] + bt[i];
      store<C>(y, r * d, d, py);
    }
  });
  write_values(means, mean);
  write_values(rstds, rstd);
}

template <class C>
void backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd, const Tensor& gamma,
              Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const std::int64_t d = x.shape().back(), rows = x.numel() / std::max<std::int64_t>(d, 1);
  const auto g = values_of<C>(gamma, d, C(1));
  const auto m = values_of<C>(mean, rows, C(0)), rs = values_of<C>(rstd, rows, C(1));
  const int chunks = row_chunks(rows, d);
  const bool params = dgamma.defined() || dbeta.defined();
  std::vector<double> part(params ? static_cast<std::size_t>(chunks) * 2 * d : 0, 0.0);  // sum(dy*xhat), sum(dy)
  for_row_chunks(chunks, rows, [&](int t, std::int64_t b, std::int64_t e) {
    std::vector<C> sx(d), sd(d), so(d), xh(d), gg(d);
    double* acc = params ? part.data() + static_cast<std::size_t>(t) * 2 * d : nullptr;
    for (std::int64_t r = b; r < e; ++r) {
      const C* px = load<C>(x, r * d, d, sx.data());
      const C* pd = load<C>(dy, r * d, d, sd.data());
      double m1 = 0, m2 = 0;
      for (std::int64_t i = 0; i < d; ++i) {
        xh[i] = (px[i] - m[r]) * rs[r];
        gg[i] = pd[i] * g[i];
        m1 += static_cast<double>(gg[i]);
        m2 += static_cast<double>(gg[i] * xh[i]);
      }
      if (acc)
        for (std::int64_t i = 0; i < d; ++i) {
          acc[i] += static_cast<double>(pd[i] * xh[i]);
          acc[d + i] += static_cast<double>(pd[i]);
        }
      if (!dx.defined()) continue;
      const C a = static_cast<C>(m1 / static_cast<double>(d)), c2 = static_cast<C>(m2 / static_cast<double>(d));
      C* po = store_target<C>(dx, r * d, so.data());
      for (std::int64_t i = 0; i < d; ++i) po[i] = rs[r] * (gg[i] - a - xh[i] * c2);
      store<C>(dx, r * d, d, po);
    }
  });
  if (!params) return;
  for (int t = 1; t < chunks; ++t)
    for (std::int64_t i = 0; i < 2 * d; ++i) part[i] += part[static_cast<std::size_t>(t) * 2 * d + i];
  write_values(std::vector<double>(part.begin(), part.begin() + d), dgamma);
  write_values(std::vector<double>(part.begin() + d, part.begin() + 2 * d), dbeta);
}

}  // namespace

void CpuBackend::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y,
                            Tensor& mean, Tensor& rstd) {
  if (x.numel() == 0) return;
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    if constexpr (std::is_floating_point_v<C>) forward<C>(x, gamma, beta, eps, y, mean, rstd);
  });
}

void CpuBackend::layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  if (x.numel() == 0) {
    if (dgamma.defined()) fill(dgamma, 0.0);
    if (dbeta.defined()) fill(dbeta, 0.0);
    return;
  }
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    if constexpr (std::is_floating_point_v<C>) backward<C>(x, dy, mean, rstd, gamma, dx, dgamma, dbeta);
  });
}

}  // namespace mpt::cpu
