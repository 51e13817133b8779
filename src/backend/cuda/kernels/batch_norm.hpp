#pragma once
// Batch normalization over x viewed as [rows, C] (channels innermost, NHWC), the CUDA twin of
// src/backend/cpu/batch_norm.cpp.
//
// Layout of every kernel here: a block covers a tile of `cw` consecutive channels and
// lanes = blockDim.x / cw consecutive rows at a time (thread t: lane t / cw, channel
// blockIdx.x * cw + t % cw), so a warp reads contiguous memory; the blocks of grid.y walk the rows
// by grid-stride. Per-channel sums over the rows ("column sums") are computed in two kernels:
//
//   1. column_sums_*: each thread adds its rows' terms in the compute type (float32 for 16-bit and
//      float32 data) in blocks of kFlushRows rows, each block's sum added into a float64 total,
//      as the CPU adds float32 blocks into float64 totals; the block's lanes are then added in
//      float64 by a shared-memory tree (phases, so emulate_phases runs them on the host), and
//      lane 0 writes the block's two float64 partials to part[blockIdx.y][2][C].
//   2. a per-channel kernel adds the grid.y partials in float64 and finishes (mean/var, or the
//      gradient coefficients), exactly in the CPU's float64 formulas.
//
// The column-sum machinery takes a `Term` functor (term(row, col, s1, s2) adds one element's two
// terms), so layer_norm.hpp reuses it for dgamma/dbeta.
#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels/launch.hpp"
#include "backend/cuda/kernels/element_types.hpp"

namespace mpt::kernels {

/// Threads per block of the norm kernels; the shared-memory trees cover at most this many lanes.
inline constexpr unsigned kNormThreads = 256;
/// Tree steps of a kNormThreads block: strides 128, 64, ..., 1 (a step whose stride reaches
/// past the lanes in use does nothing).
inline constexpr int kTreeSteps = 8;
/// Rows a thread adds in the compute type before adding that block sum into its float64 total.
inline constexpr int kFlushRows = 32;

/// Stride of tree step `step` (0 .. kTreeSteps-1).
MPT_HOST_DEVICE inline unsigned tree_stride(int step) { return (kNormThreads / 2) >> step; }

/// Channels per block tile: all of them when few, else 64 (128 contiguous bytes of 16-bit data
/// per row and lane; 4 lanes of rows per block).
inline std::int64_t channel_tile(std::int64_t cols, unsigned threads = kNormThreads) {
  std::int64_t cw = cols < 64 ? cols : 64;
  if (cw > static_cast<std::int64_t>(threads)) cw = threads;
  return cw < 1 ? 1 : cw;
}

/// Blocks along the rows (grid.y): about 16 rows per thread, at most ~1024 blocks in all (each
/// leaves 2 * C float64 partials) and 65535.
inline unsigned row_blocks(std::int64_t rows, std::int64_t lanes, std::int64_t channel_tiles) {
  std::int64_t b = (rows + lanes * 16 - 1) / (lanes * 16);
  const std::int64_t cap = channel_tiles >= 1024 ? 1 : 1024 / channel_tiles;
  if (b > cap) b = cap;
  if (b > 65535) b = 65535;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

/// A thread's place in the [rows, C] tiling.
struct ColumnLane {
  std::int64_t col;   // its channel
  std::int64_t lane;  // its row lane within the block
  std::int64_t lanes; // row lanes of the block
  bool active;        // lane and channel in range
};

MPT_HOST_DEVICE inline ColumnLane column_lane(const Thread& t, std::int64_t cols, std::int64_t cw) {
  ColumnLane l;
  l.lanes = t.block_dim.x / cw;
  l.lane = t.thread.x / cw;
  l.col = static_cast<std::int64_t>(t.block.x) * cw + t.thread.x % cw;
  l.active = l.lane < l.lanes && l.col < cols;
  return l;
}

// ---- column sums: phase 1, tree steps, store ---------------------------------------------------

/// Phase 1: this thread's float64 totals of term over its rows into sh[tid] and sh[B + tid]
/// (B = blockDim.x; sh holds 2 * B doubles). C: the compute type of the terms.
template <class C, class Term>
MPT_HOST_DEVICE void column_sums_phase(const Thread& t, double* sh, const Term& term, std::int64_t rows,
                                       std::int64_t cols, std::int64_t cw) {
  const ColumnLane l = column_lane(t, cols, cw);
  double d1 = 0, d2 = 0;
  if (l.active) {
    C a1 = 0, a2 = 0;
    int k = 0;
    const std::int64_t step = static_cast<std::int64_t>(t.grid_dim.y) * l.lanes;
    for (std::int64_t r = static_cast<std::int64_t>(t.block.y) * l.lanes + l.lane; r < rows; r += step) {
      term(r, l.col, a1, a2);
      if (++k == kFlushRows) {
        d1 += static_cast<double>(a1), d2 += static_cast<double>(a2);
        a1 = a2 = C(0), k = 0;
      }
    }
    d1 += static_cast<double>(a1), d2 += static_cast<double>(a2);
  }
  sh[t.thread.x] = d1;
  sh[t.block_dim.x + t.thread.x] = d2;
}

/// Tree step: lane l adds lane l + s of its channel (both sums), for s = tree_stride(step).
MPT_HOST_DEVICE inline void column_sums_step(const Thread& t, double* sh, std::int64_t cols, std::int64_t cw, int step) {
  const ColumnLane l = column_lane(t, cols, cw);
  const std::int64_t s = tree_stride(step);
  if (!l.active || l.lane >= s || l.lane + s >= l.lanes) return;
  const std::int64_t i = t.thread.x, j = i + s * cw, b = t.block_dim.x;
  sh[i] += sh[j];
  sh[b + i] += sh[b + j];
}

/// Last phase: lane 0 writes the block's partials, part[blockIdx.y][0 or 1][col].
MPT_HOST_DEVICE inline void column_sums_store(const Thread& t, const double* sh, double* part, std::int64_t cols,
                                              std::int64_t cw) {
  const ColumnLane l = column_lane(t, cols, cw);
  if (!l.active || l.lane != 0) return;
  double* p = part + static_cast<std::int64_t>(t.block.y) * 2 * cols;
  p[l.col] = sh[t.thread.x];
  p[cols + l.col] = sh[t.block_dim.x + t.thread.x];
}

/// The float64 totals of channel c over the `blocks` partials of part (0 when part is null).
MPT_HOST_DEVICE inline void column_sums_total(const double* part, std::int64_t blocks, std::int64_t cols,
                                              std::int64_t c, double& s1, double& s2) {
  s1 = s2 = 0;
  if (!part) return;
  for (std::int64_t b = 0; b < blocks; ++b) {
    s1 += part[b * 2 * cols + c];
    s2 += part[b * 2 * cols + cols + c];
  }
}

// ---- terms -------------------------------------------------------------------------------------

/// Statistics: sums of d = x - x[first row] and d * d (the shift keeps float32 sums well
/// conditioned, as on the CPU).
template <class T>
struct StatsTerm {
  const T* x;
  std::int64_t cols;
  using C = compute_t<T>;
  MPT_HOST_DEVICE void operator()(std::int64_t r, std::int64_t c, C& s1, C& s2) const {
    const C d = load(x[r * cols + c]) - load(x[c]);
    s1 += d;
    s2 += d * d;
  }
};

/// Backward: sums of dy and dy * (x - mean), dy masked by the fused ReLU recomputed from x.
/// k: the coefficients [4][C] (rstd, scale, shift, mean).
template <class T, bool Relu>
struct GradTerm {
  const T* x;
  const T* dy;
  const compute_t<T>* k;
  std::int64_t cols;
  using C = compute_t<T>;
  MPT_HOST_DEVICE void operator()(std::int64_t r, std::int64_t c, C& s1, C& s2) const {
    const C xv = load(x[r * cols + c]);
    C d = load(dy[r * cols + c]);
    if constexpr (Relu) d = xv * k[cols + c] + k[2 * cols + c] > C(0) ? d : C(0);
    s1 += d;
    s2 += d * (xv - k[3 * cols + c]);
  }
};

// ---- per-channel kernels -----------------------------------------------------------------------

/// mean and biased variance of each channel from the partials of StatsTerm, in float64 as the
/// CPU: mean = shift + s1 / rows, var = max(s2 / rows - (s1 / rows)^2, 0). P: the statistics'
/// type (float, double for float64 x).
template <class T, class P>
MPT_HOST_DEVICE void stats_finalize_body(const Thread& t, const T* x, const double* part, std::int64_t blocks,
                                         std::int64_t rows, std::int64_t cols, P* mean, P* var) {
  for (std::int64_t c = t.global(); c < cols; c += t.stride()) {
    double s1, s2;
    column_sums_total(part, blocks, cols, c, s1, s2);
    const double d = s1 / static_cast<double>(rows);
    const double v = s2 / static_cast<double>(rows) - d * d;
    mean[c] = static_cast<P>(static_cast<double>(load(x[c])) + d);
    var[c] = static_cast<P>(v > 0.0 ? v : 0.0);
  }
}

/// The normalization as an affine map, y = x * scale + shift, into k [4][C] (rstd, scale, shift,
/// mean) in C, from mean/var/gamma/beta (P; gamma/beta null meaning 1/0) in float64 as the CPU.
template <class C, class P>
MPT_HOST_DEVICE void coefficients_body(const Thread& t, const P* mean, const P* var, const P* gamma, const P* beta,
                                       double eps, std::int64_t cols, C* k) {
  for (std::int64_t c = t.global(); c < cols; c += t.stride()) {
    const double m = static_cast<double>(mean[c]), v = static_cast<double>(var[c]);
    const double g = gamma ? static_cast<double>(gamma[c]) : 1.0, b = beta ? static_cast<double>(beta[c]) : 0.0;
    const double r = 1.0 / ::sqrt(v + eps);
    k[c] = static_cast<C>(r);
    k[cols + c] = static_cast<C>(g * r);
    k[2 * cols + c] = static_cast<C>(b - m * g * r);
    k[3 * cols + c] = static_cast<C>(m);
  }
}

/// dgamma/dbeta (when non-null) from the partials of GradTerm, and dx's per-channel coefficients
/// into g [3][C]: dx = a * dy + b * x + d0, with b = d0 = 0 for fixed statistics. part null: no
/// sums were needed (fixed statistics, no parameter gradients).
template <class C, class P>
MPT_HOST_DEVICE void grad_finalize_body(const Thread& t, const double* part, std::int64_t blocks, std::int64_t rows,
                                        std::int64_t cols, const C* k, bool batch_stats, P* dgamma, P* dbeta,
                                        C* g) {
  for (std::int64_t c = t.global(); c < cols; c += t.stride()) {
    double s1, s2;
    column_sums_total(part, blocks, cols, c, s1, s2);
    const double r = static_cast<double>(k[c]);
    if (dbeta) dbeta[c] = static_cast<P>(s1);
    if (dgamma) dgamma[c] = static_cast<P>(s2 * r);
    const C a = k[cols + c];
    C bx = C(0), d0 = C(0);
    if (batch_stats) {
      const double n = static_cast<double>(rows);
      const double bc = -static_cast<double>(a) * r * r * s2 / n;
      bx = static_cast<C>(bc);
      d0 = static_cast<C>(-static_cast<double>(a) * s1 / n - bc * static_cast<double>(k[3 * cols + c]));
    }
    g[c] = a;
    g[cols + c] = bx;
    g[2 * cols + c] = d0;
  }
}

// ---- elementwise kernels (same tiling: no division per element) --------------------------------

/// y = act(x * scale + shift), k as coefficients_body writes it.
template <class T, bool Relu>
MPT_HOST_DEVICE void forward_body(const Thread& t, const T* x, const compute_t<T>* k, std::int64_t rows,
                                  std::int64_t cols, std::int64_t cw, T* y) {
  using C = compute_t<T>;
  const ColumnLane l = column_lane(t, cols, cw);
  if (!l.active) return;
  const C scale = k[cols + l.col], shift = k[2 * cols + l.col];
  const std::int64_t step = static_cast<std::int64_t>(t.grid_dim.y) * l.lanes;
  for (std::int64_t r = static_cast<std::int64_t>(t.block.y) * l.lanes + l.lane; r < rows; r += step) {
    const std::int64_t i = r * cols + l.col;
    C v = load(x[i]) * scale + shift;
    if constexpr (Relu) v = v > C(0) ? v : C(0);
    y[i] = store<T>(v);
  }
}

/// dx = a * dy + b * x + d0 (dy masked by the fused ReLU); k the coefficients, g as
/// grad_finalize_body writes it.
template <class T, bool Relu>
MPT_HOST_DEVICE void grad_input_body(const Thread& t, const T* x, const T* dy, const compute_t<T>* k,
                                     const compute_t<T>* g, std::int64_t rows, std::int64_t cols, std::int64_t cw,
                                     T* dx) {
  using C = compute_t<T>;
  const ColumnLane l = column_lane(t, cols, cw);
  if (!l.active) return;
  const C scale = k[cols + l.col], shift = k[2 * cols + l.col];
  const C a = g[l.col], b = g[cols + l.col], d0 = g[2 * cols + l.col];
  const std::int64_t step = static_cast<std::int64_t>(t.grid_dim.y) * l.lanes;
  for (std::int64_t r = static_cast<std::int64_t>(t.block.y) * l.lanes + l.lane; r < rows; r += step) {
    const std::int64_t i = r * cols + l.col;
    const C xv = load(x[i]);
    C d = load(dy[i]);
    if constexpr (Relu) d = xv * scale + shift > C(0) ? d : C(0);
    dx[i] = store<T>(a * d + b * xv + d0);
  }
}

}  // namespace mpt::kernels
