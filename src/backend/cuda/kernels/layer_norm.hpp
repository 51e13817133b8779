#pragma once
// Layer normalization over each row of x viewed as [rows, D], the CUDA twin of
// src/backend/cpu/layer_norm.cpp: one block per row (blockIdx.x), its threads striding over the
// row; the row's sums are float64, as on the CPU, added up by a shared-memory tree (phases split
// at the barriers, so emulate_phases runs them on the host). Elementwise work is in the compute
// type (float32 for 16-bit and float32 data). dgamma/dbeta are column sums over the rows, done by
// batch_norm.hpp's column-sum kernels.
//
// Shared memory: 2 * blockDim.x doubles (blockDim.x <= kNormThreads, the trees' reach).
#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels/batch_norm.hpp"
#include "backend/cuda/kernels/launch.hpp"
#include "backend/cuda/kernels/element_types.hpp"

namespace mpt::kernels {

/// Tree step over the block's threads on the halves [lo, hi) of sh (half h: sh[h * B + tid]):
/// thread i adds thread i + s, for s = tree_stride(step).
MPT_HOST_DEVICE inline void row_tree_step(const Thread& t, double* sh, int step, int lo, int hi) {
  const std::int64_t s = tree_stride(step), i = t.thread.x, b = t.block_dim.x;
  if (i >= s || i + s >= b) return;
  for (int h = lo; h < hi; ++h) sh[h * b + i] += sh[h * b + i + s];
}

// ---- forward: sum phase, tree on half 0, deviation phase, tree on half 1, store phase ----------

/// Phase 1: this thread's float64 sum of its elements of the row into sh[tid].
template <class T>
MPT_HOST_DEVICE void ln_sum_phase(const Thread& t, double* sh, const T* x, std::int64_t d) {
  const T* px = x + static_cast<std::int64_t>(t.block.x) * d;
  double s = 0;
  for (std::int64_t i = t.thread.x; i < d; i += t.block_dim.x) s += static_cast<double>(load(px[i]));
  sh[t.thread.x] = s;
}

/// Phase 2 (after the tree on half 0): the float64 sum of squared deviations from the mean
/// sh[0] / d into sh[B + tid].
template <class T>
MPT_HOST_DEVICE void ln_deviation_phase(const Thread& t, double* sh, const T* x, std::int64_t d) {
  const T* px = x + static_cast<std::int64_t>(t.block.x) * d;
  const double m = sh[0] / static_cast<double>(d);
  double s = 0;
  for (std::int64_t i = t.thread.x; i < d; i += t.block_dim.x) {
    const double v = static_cast<double>(load(px[i])) - m;
    s += v * v;
  }
  sh[t.block_dim.x + t.thread.x] = s;
}

/// Last phase: y = (x - mean) * rstd * gamma + beta in the compute type (gamma/beta null meaning
/// 1/0); thread 0 saves the row's mean and rstd (P: float, double for float64 x).
template <class T, class P>
MPT_HOST_DEVICE void ln_forward_phase(const Thread& t, const double* sh, const T* x, const P* gamma, const P* beta,
                                      double eps, std::int64_t d, T* y, P* mean, P* rstd) {
  using C = compute_t<T>;
  const std::int64_t row = t.block.x;
  const double m = sh[0] / static_cast<double>(d);
  const double rs = 1.0 / ::sqrt(sh[t.block_dim.x] / static_cast<double>(d) + eps);
  if (t.thread.x == 0) mean[row] = static_cast<P>(m), rstd[row] = static_cast<P>(rs);
  const C mc = static_cast<C>(m), rc = static_cast<C>(rs);
  const T* px = x + row * d;
  T* py = y + row * d;
  for (std::int64_t i = t.thread.x; i < d; i += t.block_dim.x) {
    const C g = gamma ? static_cast<C>(gamma[i]) : C(1), b = beta ? static_cast<C>(beta[i]) : C(0);
    py[i] = store<T>((load(px[i]) - mc) * rc * g + b);
  }
}

// ---- backward dx: sums phase, tree on both halves, store phase ---------------------------------

/// Phase 1: float64 sums of gg = dy * gamma and gg * xhat (xhat = (x - mean) * rstd, in the
/// compute type) over this thread's elements into sh[tid] and sh[B + tid].
template <class T, class P>
MPT_HOST_DEVICE void ln_grad_sums_phase(const Thread& t, double* sh, const T* x, const T* dy, const P* mean,
                                        const P* rstd, const P* gamma, std::int64_t d) {
  using C = compute_t<T>;
  const std::int64_t row = t.block.x;
  const C m = static_cast<C>(mean[row]), rs = static_cast<C>(rstd[row]);
  double s1 = 0, s2 = 0;
  for (std::int64_t i = t.thread.x; i < d; i += t.block_dim.x) {
    const C xh = (load(x[row * d + i]) - m) * rs;
    const C gg = load(dy[row * d + i]) * (gamma ? static_cast<C>(gamma[i]) : C(1));
    s1 += static_cast<double>(gg);
    s2 += static_cast<double>(gg * xh);
  }
  sh[t.thread.x] = s1;
  sh[t.block_dim.x + t.thread.x] = s2;
}

/// Last phase: dx = rstd * (gg - mean(gg) - xhat * mean(gg * xhat)).
template <class T, class P>
MPT_HOST_DEVICE void ln_grad_input_phase(const Thread& t, const double* sh, const T* x, const T* dy, const P* mean,
                                         const P* rstd, const P* gamma, std::int64_t d, T* dx) {
  using C = compute_t<T>;
  const std::int64_t row = t.block.x;
  const C m = static_cast<C>(mean[row]), rs = static_cast<C>(rstd[row]);
  const C a = static_cast<C>(sh[0] / static_cast<double>(d));
  const C c2 = static_cast<C>(sh[t.block_dim.x] / static_cast<double>(d));
  for (std::int64_t i = t.thread.x; i < d; i += t.block_dim.x) {
    const C xh = (load(x[row * d + i]) - m) * rs;
    const C gg = load(dy[row * d + i]) * (gamma ? static_cast<C>(gamma[i]) : C(1));
    dx[row * d + i] = store<T>(rs * (gg - a - xh * c2));
  }
}

// ---- backward dgamma/dbeta: column sums of dy * xhat and dy ------------------------------------

template <class T, class P>
struct LayerNormParamTerm {
  const T* x;
  const T* dy;
  const P* mean;
  const P* rstd;
  std::int64_t cols;
  using C = compute_t<T>;
  MPT_HOST_DEVICE void operator()(std::int64_t r, std::int64_t c, C& s1, C& s2) const {
    const C xh = (load(x[r * cols + c]) - static_cast<C>(mean[r])) * static_cast<C>(rstd[r]);
    const C d = load(dy[r * cols + c]);
    s1 += d * xh;
    s2 += d;
  }
};

/// dgamma = sum(dy * xhat), dbeta = sum(dy) per column (each when non-null) from the partials.
template <class P>
MPT_HOST_DEVICE void ln_params_finalize_body(const Thread& t, const double* part, std::int64_t blocks,
                                             std::int64_t cols, P* dgamma, P* dbeta) {
  for (std::int64_t c = t.global(); c < cols; c += t.stride()) {
    double s1, s2;
    column_sums_total(part, blocks, cols, c, s1, s2);
    if (dgamma) dgamma[c] = static_cast<P>(s1);
    if (dbeta) dbeta[c] = static_cast<P>(s2);
  }
}

}  // namespace mpt::kernels
