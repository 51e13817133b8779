// Batch normalization over x viewed as [rows, C] (channels last). Own kernels: they read 16-bit
// data directly, compute in float32 (float64 for float64 data), sum per-channel blocks in float32
// and totals in float64, and fuse an optional ReLU; two passes over x in each direction.
#include <cmath>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/rows.hpp"

namespace mpt::cpu {
namespace {

// Row kernels: one row of `ch` channels; restrict-qualified so that they vectorize over channels.

template <class C>
void stats_row(const C* __restrict x, const C* __restrict shift, C* __restrict s1, C* __restrict s2, std::int64_t ch) {
#pragma omp simd
  for (std::int64_t c = 0; c < ch; ++c) {
    const C d = x[c] - shift[c];
    s1[c] += d;
    s2[c] += d * d;
  }
}

template <class C, bool Relu>
void affine_row(const C* __restrict x, const C* __restrict scale, const C* __restrict shift, C* __restrict y,
                std::int64_t ch) {
#pragma omp simd
  for (std::int64_t c = 0; c < ch; ++c) {
    const C v = x[c] * scale[c] + shift[c];
    y[c] = Relu ? (v > C(0) ? v : C(0)) : v;
  }
}

/// Sums of dy and dy * (x - mean), dy masked by the fused ReLU (its input recomputed from x).
template <class C, bool Relu>
void grad_sums_row(const C* __restrict x, const C* __restrict dy, const C* __restrict scale, const C* __restrict shift,
                   const C* __restrict mean, C* __restrict s1, C* __restrict s2, std::int64_t ch) {
#pragma omp simd
  for (std::int64_t c = 0; c < ch; ++c) {
    C d = dy[c];
    if constexpr (Relu) d = x[c] * scale[c] + shift[c] > C(0) ? d : C(0);
    s1[c] += d;
    s2[c] += d * (x[c] - mean[c]);
  }
}

/// dx = a * dy + b * x + d0 per channel (dy masked as above).
template <class C, bool Relu>
void grad_input_row(const C* __restrict x, const C* __restrict dy, const C* __restrict scale, const C* __restrict shift,
                    const C* __restrict a, const C* __restrict b, const C* __restrict d0, C* __restrict dx,
                    std::int64_t ch) {
#pragma omp simd
  for (std::int64_t c = 0; c < ch; ++c) {
    C d = dy[c];
    if constexpr (Relu) d = x[c] * scale[c] + shift[c] > C(0) ? d : C(0);
    dx[c] = a[c] * d + b[c] * x[c] + d0[c];
  }
}

/// Per-channel float64 totals of two sums over the rows of x (and dy): row(px, pd, s1, s2)
/// accumulates one row into float32 block sums, which are added up in float64 per block.
template <class C, class Row>
std::vector<double> channel_sums(const Tensor& x, const Tensor* dy, std::int64_t ch, Row row) {
  const std::int64_t rows = x.numel() / std::max<std::int64_t>(ch, 1);
  const int chunks = row_chunks(rows, ch);
  std::vector<double> part(static_cast<std::size_t>(chunks) * 2 * ch, 0.0);
  const std::int64_t rb = block_rows(ch);
  for_row_chunks(chunks, rows, [&](int t, std::int64_t b, std::int64_t e) {
    std::vector<C> sx(rb * ch), sd(dy ? rb * ch : 0), acc(2 * ch);
    double* out = part.data() + static_cast<std::size_t>(t) * 2 * ch;
    for (std::int64_t r0 = b; r0 < e; r0 += rb) {
      const std::int64_t n = std::min(rb, e - r0);
      const C* px = load<C>(x, r0 * ch, n * ch, sx.data());
      const C* pd = dy ? load<C>(*dy, r0 * ch, n * ch, sd.data()) : nullptr;
      std::fill(acc.begin(), acc.end(), C(0));
      for (std::int64_t r = 0; r < n; ++r) row(px + r * ch, pd ? pd + r * ch : nullptr, acc.data(), acc.data() + ch);
      for (std::int64_t i = 0; i < 2 * ch; ++i) out[i] += static_cast<double>(acc[i]);
    }
  });
  for (int t = 1; t < chunks; ++t)
    for (std::int64_t i = 0; i < 2 * ch; ++i) part[i] += part[static_cast<std::size_t>(t) * 2 * ch + i];
  part.resize(static_cast<std::size_t>(2 * ch));
  return part;
}

/// Applies row(px, pd, out) to blocks of rows of x (and dy), writing `out`, in parallel.
template <class C, class Row>
void map_rows(const Tensor& x, const Tensor* dy, Tensor& out, std::int64_t ch, Row row) {
  const std::int64_t rows = x.numel() / std::max<std::int64_t>(ch, 1), rb = block_rows(ch);
  parallel_for((rows + rb - 1) / rb, std::max<std::int64_t>(1, 32768 / (rb * ch)), [&](std::int64_t b, std::int64_t e) {
    std::vector<C> sx(rb * ch), sd(dy ? rb * ch : 0), so(rb * ch);
    for (std::int64_t blk = b; blk < e; ++blk) {
      const std::int64_t r0 = blk * rb, n = std::min(rb, rows - r0);
      const C* px = load<C>(x, r0 * ch, n * ch, sx.data());
      const C* pd = dy ? load<C>(*dy, r0 * ch, n * ch, sd.data()) : nullptr;
      C* po = store_target<C>(out, r0 * ch, so.data());
      for (std::int64_t r = 0; r < n; ++r) row(px + r * ch, pd ? pd + r * ch : nullptr, po + r * ch);
      store<C>(out, r0 * ch, n * ch, po);
    }
  });
}

template <class C>
void stats(const Tensor& x, Tensor& mean, Tensor& var) {
  const std::int64_t ch = x.shape().back(), rows = x.numel() / std::max<std::int64_t>(ch, 1);
  // Sums of (x - first row) keep the float32 block sums well conditioned.
  std::vector<C> shift(ch);
  const C* first = load<C>(x, 0, ch, shift.data());
  if (first != shift.data()) std::copy(first, first + ch, shift.begin());
  auto s = channel_sums<C>(x, nullptr, ch, [&](const C* px, const C*, C* s1, C* s2) { stats_row(px, shift.data(), s1, s2, ch); });
  std::vector<double> m(ch), v(ch);
  for (std::int64_t c = 0; c < ch; ++c) {
    const double d = s[c] / static_cast<double>(rows);
    m[c] = static_cast<double>(shift[c]) + d;
    v[c] = std::max(s[ch + c] / static_cast<double>(rows) - d * d, 0.0);
  }
  write_values(m, mean);
  write_values(v, var);
}

template <class C>
struct Coefficients {
  std::vector<C> rstd, scale, shift;  // y = x * scale + shift
};

template <class C>
Coefficients<C> coefficients(const Tensor& mean, const Tensor& var, const Tensor& gamma, const Tensor& beta,
                             std::int64_t ch, double eps) {
  auto m = values_of<double>(mean, ch, 0.0), v = values_of<double>(var, ch, 1.0);
  auto g = values_of<double>(gamma, ch, 1.0), bt = values_of<double>(beta, ch, 0.0);
  Coefficients<C> k{std::vector<C>(ch), std::vector<C>(ch), std::vector<C>(ch)};
  for (std::int64_t c = 0; c < ch; ++c) {
    const double r = 1.0 / std::sqrt(v[c] + eps);
    k.rstd[c] = static_cast<C>(r);
    k.scale[c] = static_cast<C>(g[c] * r);
    k.shift[c] = static_cast<C>(bt[c] - m[c] * g[c] * r);
  }
  return k;
}

template <class C>
void forward(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& gamma, const Tensor& beta, double eps,
             bool relu, Tensor& y) {
  const std::int64_t ch = x.shape().back();
  const Coefficients<C> k = coefficients<C>(mean, var, gamma, beta, ch, eps);
  const C* sc = k.scale.data();
  const C* sf = k.shift.data();
  if (relu) map_rows<C>(x, nullptr, y, ch, [&](const C* px, const C*, C* po) { affine_row<C, true>(px, sc, sf, po, ch); });
  else map_rows<C>(x, nullptr, y, ch, [&](const C* px, const C*, C* po) { affine_row<C, false>(px, sc, sf, po, ch); });
}

template <class C, bool Relu>
void backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& var, const Tensor& gamma,
              const Tensor& beta, double eps, bool batch_stats, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const std::int64_t ch = x.shape().back(), rows = x.numel() / std::max<std::int64_t>(ch, 1);
  const Coefficients<C> k = coefficients<C>(mean, var, gamma, beta, ch, eps);
  const auto m = values_of<C>(mean, ch, C(0));
  const C* sc = k.scale.data();
  const C* sf = k.shift.data();
  std::vector<double> s(2 * ch, 0.0);  // sum(dy), sum(dy * (x - mean))
  if (batch_stats || dgamma.defined() || dbeta.defined())
    s = channel_sums<C>(x, &dy, ch, [&](const C* px, const C* pd, C* s1, C* s2) {
      grad_sums_row<C, Relu>(px, pd, sc, sf, m.data(), s1, s2, ch);
    });
  if (dbeta.defined()) write_values(std::vector<double>(s.begin(), s.begin() + ch), dbeta);
  if (dgamma.defined()) {
    std::vector<double> dg(ch);
    for (std::int64_t c = 0; c < ch; ++c) dg[c] = s[ch + c] * static_cast<double>(k.rstd[c]);
    write_values(dg, dgamma);
  }
  if (!dx.defined()) return;
  // dx = a * dy + b * x + d0 (b = d0 = 0 with fixed statistics): the batch statistics' own
  // gradients folded into per-channel coefficients.
  std::vector<C> a(k.scale), bx(ch, C(0)), d0(ch, C(0));
  if (batch_stats)
    for (std::int64_t c = 0; c < ch; ++c) {
      const double r = k.rstd[c], n = static_cast<double>(rows);
      const double bc = -static_cast<double>(a[c]) * r * r * s[ch + c] / n;
      bx[c] = static_cast<C>(bc);
      d0[c] = static_cast<C>(-static_cast<double>(a[c]) * s[c] / n - bc * static_cast<double>(m[c]));
    }
  map_rows<C>(x, &dy, dx, ch, [&](const C* px, const C* pd, C* po) {
    grad_input_row<C, Relu>(px, pd, sc, sf, a.data(), bx.data(), d0.data(), po, ch);
  });
}

}  // namespace

void CpuBackend::batch_norm_stats(const Tensor& x, Tensor& mean, Tensor& var) {
  if (x.numel() == 0) return;
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    if constexpr (std::is_floating_point_v<C>) stats<C>(x, mean, var);
  });
}

void CpuBackend::batch_norm_forward(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& gamma,
                                    const Tensor& beta, double eps, Activation act, Tensor& y) {
  if (x.numel() == 0) return;
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    if constexpr (std::is_floating_point_v<C>) {
      forward<C>(x, mean, var, gamma, beta, eps, act == Activation::Relu, y);
    }
  });
}

void CpuBackend::batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& var,
                                     const Tensor& gamma, const Tensor& beta, double eps, bool batch_stats,
                                     Activation act, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  if (x.numel() == 0) {
    if (dgamma.defined()) fill(dgamma, 0.0);
    if (dbeta.defined()) fill(dbeta, 0.0);
    return;
  }
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    if constexpr (std::is_floating_point_v<C>) {
      if (act == Activation::Relu) backward<C, true>(x, dy, mean, var, gamma, beta, eps, batch_stats, dx, dgamma, dbeta);
      else backward<C, false>(x, dy, mean, var, gamma, beta, eps, batch_stats, dx, dgamma, dbeta);
    }
  });
}

}  // namespace mpt::cpu
