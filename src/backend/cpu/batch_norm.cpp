// Batch normalization over x viewed as [rows, C] (channels last). Own kernels: two passes over x
// in each direction, an optional fused ReLU, statistics in float32 blocks with float64 totals.
// The block kernels read float32, float64 and bfloat16 storage directly (bfloat16 widened in
// registers) and are compiled for AVX-512 as well as the baseline ISA (picked at load time);
// float16 is staged through float32 blocks.
#include <cmath>
#include <cstdint>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/row_chunks.hpp"
#include "backend/cpu/vector_types.hpp"

namespace mpt::cpu {
namespace {

// ---- block kernels: n rows of ch channels, vectorized over the channels ---------------------

template <class T, class C>
MPT_KERNEL void stats_block(const T* __restrict x, std::int64_t n, std::int64_t ch, const C* __restrict shift,
                                   C* __restrict s1, C* __restrict s2) {
  for (std::int64_t r = 0; r < n; ++r, x += ch)
#pragma omp simd
    for (std::int64_t c = 0; c < ch; ++c) {
      const C d = static_cast<C>(widen(x[c])) - shift[c];
      s1[c] += d;
      s2[c] += d * d;
    }
}

template <class T, class C, bool Relu>
MPT_KERNEL void affine_block(const T* __restrict x, std::int64_t n, std::int64_t ch, const C* __restrict scale,
                                    const C* __restrict shift, T* __restrict y) {
  for (std::int64_t r = 0; r < n; ++r, x += ch, y += ch)
#pragma omp simd
    for (std::int64_t c = 0; c < ch; ++c) {
      C v = static_cast<C>(widen(x[c])) * scale[c] + shift[c];
      if constexpr (Relu) v = v > C(0) ? v : C(0);
      y[c] = narrow<T>(v);
    }
}

/// Sums of dy and dy * (x - mean), dy masked by the fused ReLU (its input recomputed from x).
template <class T, class C, bool Relu>
MPT_KERNEL void grad_sums_block(const T* __restrict x, const T* __restrict dy, std::int64_t n, std::int64_t ch,
                                       const C* __restrict scale, const C* __restrict shift, const C* __restrict mean,
                                       C* __restrict s1, C* __restrict s2) {
  for (std::int64_t r = 0; r < n; ++r, x += ch, dy += ch)
#pragma omp simd
    for (std::int64_t c = 0; c < ch; ++c) {
      const C xv = static_cast<C>(widen(x[c]));
      C d = static_cast<C>(widen(dy[c]));
      if constexpr (Relu) d = xv * scale[c] + shift[c] > C(0) ? d : C(0);
      s1[c] += d;
      s2[c] += d * (xv - mean[c]);
    }
}

/// dx = a * dy + b * x + d0 per channel (dy masked as above).
template <class T, class C, bool Relu>
MPT_KERNEL void grad_input_block(const T* __restrict x, const T* __restrict dy, std::int64_t n, std::int64_t ch,
                                        const C* __restrict scale, const C* __restrict shift, const C* __restrict a,
                                        const C* __restrict b, const C* __restrict d0, T* __restrict dx) {
  for (std::int64_t r = 0; r < n; ++r, x += ch, dy += ch, dx += ch)
#pragma omp simd
    for (std::int64_t c = 0; c < ch; ++c) {
      const C xv = static_cast<C>(widen(x[c]));
      C d = static_cast<C>(widen(dy[c]));
      if constexpr (Relu) d = xv * scale[c] + shift[c] > C(0) ? d : C(0);
      dx[c] = narrow<T>(a[c] * d + b[c] * xv + d0[c]);
    }
}

// ---- storage ----------------------------------------------------------------------------------

/// Blocks of a tensor as T: its own memory, or (float16) a float32 copy in `buf`.
template <class T>
struct Staged {
  std::vector<T> buf;
  const T* in(const Tensor& t, std::int64_t begin, std::int64_t count) {
    if (t.dtype() == storage_dtype<T>()) return static_cast<const T*>(t.data_ptr()) + begin;
    buf.resize(static_cast<std::size_t>(count));
    detail::convert(static_cast<const char*>(t.data_ptr()) + begin * itemsize(t.dtype()), t.dtype(), buf.data(),
                    storage_dtype<T>(), static_cast<std::size_t>(count));
    return buf.data();
  }
  T* out(Tensor& t, std::int64_t begin, std::int64_t count) {
    if (t.dtype() == storage_dtype<T>()) return static_cast<T*>(t.data_ptr()) + begin;
    buf.resize(static_cast<std::size_t>(count));
    return buf.data();
  }
  void commit(Tensor& t, std::int64_t begin, std::int64_t count) {
    if (t.dtype() == storage_dtype<T>()) return;
    detail::convert(buf.data(), storage_dtype<T>(), static_cast<char*>(t.data_ptr()) + begin * itemsize(t.dtype()),
                    t.dtype(), static_cast<std::size_t>(count));
  }
};

/// Per-channel float64 totals of two sums over the rows of x (and dy): block(px, pd, n, s1, s2)
/// adds n rows into float32 block sums, which are added up in float64.
template <class T, class C, class Block>
std::vector<double> channel_sums(const Tensor& x, const Tensor* dy, std::int64_t ch, Block block) {
  const std::int64_t rows = x.numel() / std::max<std::int64_t>(ch, 1);
  const int chunks = row_chunks(rows, ch);
  std::vector<double> part(static_cast<std::size_t>(chunks) * 2 * ch, 0.0);
  const std::int64_t rb = block_rows(ch);
  for_row_chunks(chunks, rows, [&](int t, std::int64_t b, std::int64_t e) {
    Staged<T> sx, sd;
    std::vector<C> acc(2 * ch);
    double* out = part.data() + static_cast<std::size_t>(t) * 2 * ch;
    for (std::int64_t r0 = b; r0 < e; r0 += rb) {
      const std::int64_t n = std::min(rb, e - r0);
      const T* px = sx.in(x, r0 * ch, n * ch);
      const T* pd = dy ? sd.in(*dy, r0 * ch, n * ch) : nullptr;
      std::fill(acc.begin(), acc.end(), C(0));
      block(px, pd, n, acc.data(), acc.data() + ch);
      for (std::int64_t i = 0; i < 2 * ch; ++i) out[i] += static_cast<double>(acc[i]);
    }
  });
  for (int t = 1; t < chunks; ++t)
    for (std::int64_t i = 0; i < 2 * ch; ++i) part[i] += part[static_cast<std::size_t>(t) * 2 * ch + i];
  part.resize(static_cast<std::size_t>(2 * ch));
  return part;
}

/// Applies block(px, pd, n, po) to blocks of rows of x (and dy), writing `out`, in parallel.
template <class T, class Block>
void map_blocks(const Tensor& x, const Tensor* dy, Tensor& out, std::int64_t ch, Block block) {
  const std::int64_t rows = x.numel() / std::max<std::int64_t>(ch, 1), rb = block_rows(ch);
  parallel_for((rows + rb - 1) / rb, std::max<std::int64_t>(1, 32768 / (rb * ch)), [&](std::int64_t b, std::int64_t e) {
    Staged<T> sx, sd, so;
    for (std::int64_t blk = b; blk < e; ++blk) {
      const std::int64_t r0 = blk * rb, n = std::min(rb, rows - r0);
      const T* px = sx.in(x, r0 * ch, n * ch);
      const T* pd = dy ? sd.in(*dy, r0 * ch, n * ch) : nullptr;
      T* po = so.out(out, r0 * ch, n * ch);
      block(px, pd, n, po);
      so.commit(out, r0 * ch, n * ch);
    }
  });
}

// ---- the three kernels ------------------------------------------------------------------------

template <class T, class C>
void stats(const Tensor& x, Tensor& mean, Tensor& var) {
  const std::int64_t ch = x.shape().back(), rows = x.numel() / std::max<std::int64_t>(ch, 1);
  // Sums of (x - first row) keep the float32 block sums well conditioned.
  const std::vector<C> shift = values_of<C>(x, ch, C(0));
  auto s = channel_sums<T, C>(x, nullptr, ch, [&](const T* px, const T*, std::int64_t n, C* s1, C* s2) {
    isa_call<stats_block<T, C>>(px, n, ch, shift.data(), s1, s2);
  });
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
  std::vector<C> rstd, scale, shift, mean;  // normalized and scaled: y = x * scale + shift
};

template <class C>
Coefficients<C> coefficients(const Tensor& mean, const Tensor& var, const Tensor& gamma, const Tensor& beta,
                             std::int64_t ch, double eps) {
  auto m = values_of<double>(mean, ch, 0.0), v = values_of<double>(var, ch, 1.0);
  auto g = values_of<double>(gamma, ch, 1.0), bt = values_of<double>(beta, ch, 0.0);
  Coefficients<C> k{std::vector<C>(ch), std::vector<C>(ch), std::vector<C>(ch), std::vector<C>(ch)};
  for (std::int64_t c = 0; c < ch; ++c) {
    const double r = 1.0 / std::sqrt(v[c] + eps);
    k.rstd[c] = static_cast<C>(r);
    k.scale[c] = static_cast<C>(g[c] * r);
    k.shift[c] = static_cast<C>(bt[c] - m[c] * g[c] * r);
    k.mean[c] = static_cast<C>(m[c]);
  }
  return k;
}

template <class T, class C, bool Relu>
void forward(const Tensor& x, const Coefficients<C>& k, Tensor& y) {
  const std::int64_t ch = x.shape().back();
  map_blocks<T>(x, nullptr, y, ch, [&](const T* px, const T*, std::int64_t n, T* po) {
    isa_call<affine_block<T, C, Relu>>(px, n, ch, k.scale.data(), k.shift.data(), po);
  });
}

template <class T, class C, bool Relu>
void backward(const Tensor& x, const Tensor& dy, const Coefficients<C>& k, bool batch_stats, Tensor& dx, Tensor& dgamma,
              Tensor& dbeta) {
  const std::int64_t ch = x.shape().back(), rows = x.numel() / std::max<std::int64_t>(ch, 1);
  std::vector<double> s(2 * ch, 0.0);  // sum(dy), sum(dy * (x - mean))
  if (batch_stats || dgamma.defined() || dbeta.defined())
    s = channel_sums<T, C>(x, &dy, ch, [&](const T* px, const T* pd, std::int64_t n, C* s1, C* s2) {
      isa_call<grad_sums_block<T, C, Relu>>(px, pd, n, ch, k.scale.data(), k.shift.data(), k.mean.data(), s1, s2);
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
      d0[c] = static_cast<C>(-static_cast<double>(a[c]) * s[c] / n - bc * static_cast<double>(k.mean[c]));
    }
  map_blocks<T>(x, &dy, dx, ch, [&](const T* px, const T* pd, std::int64_t n, T* po) {
    isa_call<grad_input_block<T, C, Relu>>(px, pd, n, ch, k.scale.data(), k.shift.data(), a.data(), bx.data(), d0.data(), po);
  });
}

}  // namespace

void CpuBackend::batch_norm_stats(const Tensor& x, Tensor& mean, Tensor& var) {
  if (x.numel() == 0) return;
  with_vector_types(x.dtype(), [&](auto t, auto c) { stats<decltype(t), decltype(c)>(x, mean, var); });
}

void CpuBackend::batch_norm(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& gamma,
                                    const Tensor& beta, double eps, Activation act, Tensor& y) {
  if (x.numel() == 0) return;
  with_vector_types(x.dtype(), [&](auto t, auto c) {
    using T = decltype(t);
    using C = decltype(c);
    const auto k = coefficients<C>(mean, var, gamma, beta, x.shape().back(), eps);
    if (act == Activation::Relu) forward<T, C, true>(x, k, y);
    else forward<T, C, false>(x, k, y);
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
  with_vector_types(x.dtype(), [&](auto t, auto c) {
    using T = decltype(t);
    using C = decltype(c);
    const auto k = coefficients<C>(mean, var, gamma, beta, x.shape().back(), eps);
    if (act == Activation::Relu) backward<T, C, true>(x, dy, k, batch_stats, dx, dgamma, dbeta);
    else backward<T, C, false>(x, dy, k, batch_stats, dx, dgamma, dbeta);
  });
}

}  // namespace mpt::cpu
