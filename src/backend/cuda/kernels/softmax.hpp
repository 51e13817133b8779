#pragma once
// Softmax, log-softmax and softmax-cross-entropy over the tiles of reduce.hpp, in the CPU's
// compute type (float32; float64 for float64), with its formulas and operation order per
// element; only the order of the row sums differs (a shared-memory tree instead of a scan).
//
// Shared memory is a float array of up to three block-sized regions (R0, R1, R2); per-thread
// values do not survive a barrier (the host emulation calls each phase afresh), so everything a
// later phase needs is re-read from shared memory: column cx's total of region r is
// region_r[cx] after its tree.
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/cuda/kernels/reduce.hpp"

namespace mpt::kernels {

MPT_HOST_DEVICE inline float exp_c(float v) { return expf(v); }
MPT_HOST_DEVICE inline double exp_c(double v) { return exp(v); }
MPT_HOST_DEVICE inline float log_c(float v) { return logf(v); }
MPT_HOST_DEVICE inline double log_c(double v) { return log(v); }

struct SumOp {
  template <class C> MPT_HOST_DEVICE C operator()(C a, C b) const { return a + b; }
};
/// Max as std::max (NaN rows end NaN whichever order: exp(NaN) enters the sum).
struct MaxOp {
  template <class C> MPT_HOST_DEVICE C operator()(C a, C b) const { return a < b ? b : a; }
};

/// Element i of a tensor of runtime dtype d as C (for labels, targets, dloss and dy, whose
/// dtype the CPU also converts on load): 16-bit through float32, as the CPU.
template <class C>
MPT_HOST_DEVICE inline C load_dyn(const void* p, DType d, std::int64_t i) {
  switch (d) {
    case DType::Float32: return static_cast<C>(static_cast<const float*>(p)[i]);
    case DType::Float64: return static_cast<C>(static_cast<const double*>(p)[i]);
    case DType::Float16: return static_cast<C>(__half2float(static_cast<const __half*>(p)[i]));
    case DType::BFloat16: return static_cast<C>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
    case DType::Int32: return static_cast<C>(static_cast<const std::int32_t*>(p)[i]);
    case DType::Int64: return static_cast<C>(static_cast<const std::int64_t*>(p)[i]);
    case DType::UInt8: return static_cast<C>(static_cast<const std::uint8_t*>(p)[i]);
    case DType::Bool: return static_cast<C>(static_cast<const bool*>(p)[i]);
  }
  return C(0);
}

// ---- softmax / log-softmax: shared = 2 regions ------------------------------------------------

/// Phase 1: partial max of the column -> R0.
template <class T>
MPT_HOST_DEVICE void softmax_max_partial(const Thread& t, compute_t<T>* sh, const T* x, const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  C m = -std::numeric_limits<C>::infinity();
  if (p.j < g.inner)
    for (std::int64_t i = p.cy; i < g.n; i += g.ty) m = MaxOp{}(m, load(x[at(g, p.o, i, p.j)]));
  sh[p.tid] = m;
}

/// Phase 2 (after R0's tree): partial sum of exp(x - max) -> R1.
template <class T>
MPT_HOST_DEVICE void softmax_sum_partial(const Thread& t, compute_t<T>* sh, const T* x, const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  C s = 0;
  if (p.j < g.inner) {
    const C mx = sh[p.cx];
    for (std::int64_t i = p.cy; i < g.n; i += g.ty) s += exp_c(load(x[at(g, p.o, i, p.j)]) - mx);
  }
  sh[g.threads() + p.tid] = s;
}

/// Tree step on region r (0, 1 or 2) with the given combine.
template <class C, class Combine>
MPT_HOST_DEVICE void region_step(const Thread& t, C* sh, const ReduceGeom& g, int r, unsigned half, Combine c) {
  tree_step(t, sh + static_cast<std::int64_t>(r) * g.threads(), g.tx, half, c);
}

/// Last phase: out = exp(x - max) / sum, or x - (max + log(sum)).
template <class T>
MPT_HOST_DEVICE void softmax_write(const Thread& t, const compute_t<T>* sh, const T* x, T* out, bool log,
                                   const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  if (p.j >= g.inner) return;
  const C mx = sh[p.cx], sum = sh[g.threads() + p.cx];
  const C lse = mx + log_c(sum);
  for (std::int64_t i = p.cy; i < g.n; i += g.ty) {
    const std::int64_t k = at(g, p.o, i, p.j);
    const C v = load(x[k]);
    out[k] = store<T>(log ? C(v - lse) : C(exp_c(v - mx) / sum));
  }
}

/// Backward phase 1: partial sum(dy) (log) or sum(dy * y) -> R0; dy of any float dtype.
template <class T>
MPT_HOST_DEVICE void softmax_backward_partial(const Thread& t, compute_t<T>* sh, const T* y, const void* dy,
                                              DType dy_dtype, bool log, const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  C s = 0;
  if (p.j < g.inner)
    for (std::int64_t i = p.cy; i < g.n; i += g.ty) {
      const std::int64_t k = at(g, p.o, i, p.j);
      const C gr = load_dyn<C>(dy, dy_dtype, k);
      s += log ? gr : C(gr * load(y[k]));
    }
  sh[p.tid] = s;
}

/// Backward last phase: dx = dy - exp(y) * s (log) or y * (dy - s).
template <class T>
MPT_HOST_DEVICE void softmax_backward_write(const Thread& t, const compute_t<T>* sh, const T* y, const void* dy,
                                            DType dy_dtype, T* dx, bool log, const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  if (p.j >= g.inner) return;
  const C s = sh[p.cx];
  for (std::int64_t i = p.cy; i < g.n; i += g.ty) {
    const std::int64_t k = at(g, p.o, i, p.j);
    const C gr = load_dyn<C>(dy, dy_dtype, k), yv = load(y[k]);
    dx[k] = store<T>(log ? C(gr - exp_c(yv) * s) : C(yv * (gr - s)));
  }
}

// ---- cross-entropy over x [rows, n] (inner = 1): shared = 3 regions ----------------------------

constexpr double kProbEpsilon = 1e-7;  // Keras's backend.epsilon(), as the CPU

/// Labels of one launch: int class ids [rows] (sparse) or targets [rows, n], any dtype.
struct Labels {
  const void* p;
  DType dtype;
  bool sparse;
};

/// Target t[r, i]: one-hot of an int label (all NaN for a label out of range, as the CPU), or
/// the given distribution.
template <class C>
MPT_HOST_DEVICE inline C target_at(const Labels& l, std::int64_t r, std::int64_t i, std::int64_t n) {
  if (l.sparse) {
    const std::int64_t k = load_dyn<std::int64_t>(l.p, l.dtype, r);
    if (k < 0 || k >= n) return std::numeric_limits<C>::quiet_NaN();
    return i == k ? C(1) : C(0);
  }
  return load_dyn<C>(l.p, l.dtype, r * n + i);
}

/// Probabilities: phase 1, partial sum of p -> R0 (the normaliser s).
template <class T>
MPT_HOST_DEVICE void xent_psum_partial(const Thread& t, compute_t<T>* sh, const T* x, const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  C s = 0;
  for (std::int64_t i = p.cy; i < g.n; i += g.ty) s += load(x[at(g, p.o, i, 0)]);
  sh[p.tid] = s;
}

/// Forward phase 3 (logits: after R0 max and R1 sum-exp trees) or 2 (probabilities: after the
/// R0 normaliser tree): partial sum of t * log q -> R2, log q = x - lse, or log(clip(p / s)).
template <class T>
MPT_HOST_DEVICE void xent_loss_partial(const Thread& t, compute_t<T>* sh, const T* x, Labels l, bool from_logits,
                                       const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  const unsigned B = g.threads();
  const C eps = C(kProbEpsilon);
  C lse = 0, s = 0;
  if (from_logits) lse = sh[0] + log_c(sh[B]);
  else s = sh[0];
  C acc = 0;
  for (std::int64_t i = p.cy; i < g.n; i += g.ty) {
    const C v = load(x[at(g, p.o, i, 0)]);
    C lq;
    if (from_logits) {
      lq = v - lse;
    } else {
      const C q = v / s;
      lq = log_c(q < eps ? eps : (C(1) - eps) < q ? C(1) - eps : q);  // std::clamp, NaN kept
    }
    const C tv = target_at<C>(l, p.o, i, g.n);
    if (tv != C(0)) acc += tv * lq;  // a class with no target weight adds nothing, even at -inf (0 · -inf is NaN)
  }
  sh[2 * B + p.tid] = acc;
}

/// Forward last phase: loss[r] = 0 - sum(t * log q).
template <class C, class L>
MPT_HOST_DEVICE void xent_loss_write(const Thread& t, const C* sh, L* loss, const ReduceGeom& g) {
  const TilePos p = tile_pos(t, g);
  if (p.tid == 0) loss[p.o] = store<L>(C(C(0) - sh[2 * g.threads()]));
}

/// Backward from logits, phase 2 (after R0's max tree): partial sum-exp -> R1 and partial
/// sum(t) -> R2.
template <class T>
MPT_HOST_DEVICE void xent_grad_sums_partial(const Thread& t, compute_t<T>* sh, const T* x, Labels l,
                                            const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  const unsigned B = g.threads();
  const C mx = sh[0];
  C se = 0, ts = 0;
  for (std::int64_t i = p.cy; i < g.n; i += g.ty) {
    se += exp_c(load(x[at(g, p.o, i, 0)]) - mx);
    ts += target_at<C>(l, p.o, i, g.n);
  }
  sh[B + p.tid] = se;
  sh[2 * B + p.tid] = ts;
}

/// Backward from probabilities, phase 2 (after R0's normaliser tree): partial
/// dot = sum(dq * q) -> R1, dq = -t / q inside (eps, 1 - eps), else 0.
template <class T>
MPT_HOST_DEVICE void xent_grad_dot_partial(const Thread& t, compute_t<T>* sh, const T* x, Labels l,
                                           const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  const C eps = C(kProbEpsilon), s = sh[0];
  C dot = 0;
  for (std::int64_t i = p.cy; i < g.n; i += g.ty) {
    const C q = load(x[at(g, p.o, i, 0)]) / s;
    const C dq = (q > eps && q < C(1) - eps) ? C(-target_at<C>(l, p.o, i, g.n) / q) : C(0);
    dot += dq * q;
  }
  sh[g.threads() + p.tid] = dot;
}

/// Backward last phase: dx = g * (softmax(x) * sum(t) - t) from logits, else
/// g * (dq - dot) / s; g = dloss[r] of any float dtype.
template <class T>
MPT_HOST_DEVICE void xent_grad_write(const Thread& t, const compute_t<T>* sh, const T* x, Labels l,
                                     bool from_logits, const void* dloss, DType dloss_dtype, T* dx,
                                     const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  const unsigned B = g.threads();
  const C eps = C(kProbEpsilon);
  const C gr = load_dyn<C>(dloss, dloss_dtype, p.o);
  for (std::int64_t i = p.cy; i < g.n; i += g.ty) {
    const std::int64_t k = at(g, p.o, i, 0);
    const C v = load(x[k]), tv = target_at<C>(l, p.o, i, g.n);
    C d;
    if (from_logits) {
      const C sm = exp_c(v - sh[0]) / sh[B];
      d = gr * (sm * sh[2 * B] - tv);
    } else {
      const C s = sh[0], q = v / s;
      const C dq = (q > eps && q < C(1) - eps) ? C(-tv / q) : C(0);
      d = gr * (dq - sh[B]) / s;
    }
    dx[k] = store<T>(d);
  }
}

}  // namespace mpt::kernels
