#pragma once
// Reductions over one axis of x viewed as [outer, n, inner] (sum, mean, max, min, argmax), the
// tile geometry and shared-memory tree that softmax and cross-entropy (softmax.hpp) reuse.
//
// A block owns one tile: tx neighbouring columns j of one outer index o (tx = 1 when inner = 1,
// a row per block), its tx * ty threads as ty slices of the axis per column. Phase 1: thread
// (cx, cy) folds elements i = cy, cy + ty, ... of its column into a partial, stored in shared
// memory at tid = cy * tx + cx. Then one phase per tree step (half = ty/2, ..., 1) folds slice
// cy + half into cy; the column's total ends in shared[cx]. The CPU accumulates each row in
// order in the same compute type (float32 for 16-bit and float32, float64, int64 for
// integers), so max/min/argmax agree exactly and sums within float32 reordering error.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backend/backend.hpp"
#include "backend/common/reduce_ops.hpp"
#include "backend/common/shape.hpp"
#include "backend/cuda/kernels/launch.hpp"
#include "backend/cuda/kernels/element_types.hpp"

namespace mpt::kernels {

constexpr unsigned kReduceThreads = 256;
/// Tree steps of the largest block (log2 kReduceThreads): host emulation runs this many step
/// phases, the ones beyond log2(ty) doing nothing.
constexpr int kReduceTreeSteps = 8;
/// Blocks per launch; more tiles are launched in chunks (tile_base).
constexpr std::int64_t kMaxReduceBlocks = std::int64_t{1} << 30;

struct ReduceGeom {
  std::int64_t outer = 1, n = 1, inner = 1;
  unsigned tx = 1, ty = 1;       // block = tx * ty threads; ty a power of two
  std::int64_t col_tiles = 1;    // ceil(inner / tx)
  std::int64_t tile_base = 0;    // tile of block 0 of this launch
  std::int64_t mean_count = 0;   // Mean divides by this when set (a split's last pass), else by n
  MPT_HOST_DEVICE unsigned threads() const { return tx * ty; }
  MPT_HOST_DEVICE std::int64_t tiles() const { return outer * col_tiles; }
};

inline unsigned pow2_at_least(std::int64_t v, unsigned cap) {
  unsigned p = 1;
  while (p < cap && static_cast<std::int64_t>(p) < v) p <<= 1;
  return p;
}

/// Tile shape for [outer, n, inner]: up to 32 columns (coalesced loads along inner), as many
/// slices of the axis as fill `threads`, no more slices than n needs, wider tiles when n is short.
inline ReduceGeom reduce_geom(std::int64_t outer, std::int64_t n, std::int64_t inner,
                              unsigned threads = kReduceThreads) {
  ReduceGeom g;
  g.outer = outer, g.n = n, g.inner = inner;
  g.tx = pow2_at_least(inner, inner > 1 ? 32 : 1);
  g.ty = pow2_at_least(n, threads / g.tx);
  if (g.tx * g.ty < threads && inner > g.tx) g.tx = pow2_at_least(inner, threads / g.ty);
  g.col_tiles = (inner + g.tx - 1) / g.tx;
  return g;
}

/// A long axis over few tiles, split across blocks in two passes. One block per tile folds n
/// elements in its ty slices, so a leading-axis sum such as a bias gradient ([N*H*W, C], outer
/// 1, a tile or two) ran in one block: 11 ms for [692224, 32] on an H100. Split, the first pass
/// reduces `splits` runs of `run` rows each (and the `rest` rows after them as one more) into
/// float32 (float64 for float64) partials [splits + (rest > 0), inner], the second those partials
/// into out; Mean sums in the first pass and divides by n in the second. Only outer == 1 (the
/// runs are then contiguous views) and floating dtypes; splits == 1 means one pass.
struct ReduceSplit {
  std::int64_t splits = 1, run = 0, rest = 0;
  std::int64_t partial_rows() const { return splits + (rest > 0 ? 1 : 0); }
};
constexpr std::int64_t kReduceSplitRows = 2048;  ///< rows per run at least
constexpr std::int64_t kReduceSplitBlocks = 512; ///< first-pass blocks aimed at (a few per SM)
inline ReduceSplit reduce_split(std::int64_t outer, std::int64_t n, std::int64_t inner, bool floating) {
  ReduceSplit s;
  const std::int64_t tiles = reduce_geom(outer, n, inner).tiles();
  if (!floating || outer != 1 || n < 2 * kReduceSplitRows || tiles >= kReduceSplitBlocks / 4) return s;
  s.splits = std::max<std::int64_t>(2, std::min(n / kReduceSplitRows, kReduceSplitBlocks / tiles));
  s.run = n / s.splits;
  s.rest = n - s.splits * s.run;
  return s;
}

using detail::split_axis;  // shape [outer, n, inner] around an axis, as the CPU backend

/// Host side of a tiled launch: runs launch(blocks, geometry) over all tiles of g, at most
/// kMaxReduceBlocks blocks a launch, each launch's geometry starting at its tile_base.
template <class F>
void for_tile_chunks(ReduceGeom g, F&& launch) {
  for (std::int64_t base = 0; base < g.tiles(); base += kMaxReduceBlocks) {
    g.tile_base = base;
    launch(static_cast<unsigned>(std::min(kMaxReduceBlocks, g.tiles() - base)), g);
  }
}

/// The element of (o, i, j) for this thread's tile: column j (maybe past inner), slice cy.
struct TilePos {
  unsigned tid, cx, cy;
  std::int64_t o, j;
};
MPT_HOST_DEVICE inline TilePos tile_pos(const Thread& t, const ReduceGeom& g) {
  TilePos p;
  p.tid = t.thread.x;
  p.cx = p.tid % g.tx;
  p.cy = p.tid / g.tx;
  const std::int64_t tile = g.tile_base + t.block.x;
  p.o = tile / g.col_tiles;
  p.j = (tile % g.col_tiles) * g.tx + p.cx;
  return p;
}
MPT_HOST_DEVICE inline std::int64_t at(const ReduceGeom& g, std::int64_t o, std::int64_t i, std::int64_t j) {
  return (o * g.n + i) * g.inner + j;
}

/// One tree step over a region of block-sized shared memory: slice cy < half takes in cy + half.
template <class S, class Combine>
MPT_HOST_DEVICE inline void tree_step(const Thread& t, S* region, unsigned tx, unsigned half, Combine c) {
  const unsigned tid = t.thread.x;
  if (tid / tx < half) region[tid] = c(region[tid], region[tid + half * tx]);
}

// ---- sum / mean / max / min -------------------------------------------------------------------

// reduce_init and ReduceCombine: backend/common/reduce_ops.hpp (the CPU's too).
using common::reduce_init;
using common::ReduceCombine;

/// Phase 1: this thread's partial over its slice of its column.
template <class T>
MPT_HOST_DEVICE void reduce_partial(const Thread& t, compute_t<T>* sh, const T* x, ReduceOp op,
                                    const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  const ReduceCombine<C> combine{op};
  C acc = reduce_init<C>(op);
  if (p.j < g.inner)
    for (std::int64_t i = p.cy; i < g.n; i += g.ty) acc = combine(acc, load(x[at(g, p.o, i, p.j)]));
  sh[p.tid] = acc;
}

template <class C>
MPT_HOST_DEVICE void reduce_step(const Thread& t, C* sh, ReduceOp op, const ReduceGeom& g, unsigned half) {
  tree_step(t, sh, g.tx, half, ReduceCombine<C>{op});
}

/// Last phase: slice 0 stores its column's result (mean divides in the compute type, integer
/// division for integers, as the CPU).
template <class O, class C>
MPT_HOST_DEVICE void reduce_finish(const Thread& t, const C* sh, O* out, ReduceOp op, const ReduceGeom& g) {
  const TilePos p = tile_pos(t, g);
  if (p.cy != 0 || p.j >= g.inner) return;
  C acc = sh[p.cx];
  if (op == ReduceOp::Mean) acc = C(acc / C(g.mean_count > 0 ? g.mean_count : g.n));
  out[p.o * g.inner + p.j] = store<O>(acc);
}

// ---- argmax -----------------------------------------------------------------------------------

/// A candidate: value and index (i < 0: none yet).
template <class C>
struct ArgPair {
  C v;
  std::int64_t i;
};

/// The CPU's rule, made order independent: the first NaN if any, else the first maximum.
template <class C>
struct ArgCombine {
  MPT_HOST_DEVICE ArgPair<C> operator()(ArgPair<C> a, ArgPair<C> b) const {
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    const bool an = a.v != a.v, bn = b.v != b.v;
    bool take_b;
    if (an || bn) take_b = an && bn ? b.i < a.i : bn;
    else take_b = b.v > a.v || (b.v == a.v && b.i < a.i);
    return take_b ? b : a;
  }
};

template <class T>
MPT_HOST_DEVICE void argmax_partial(const Thread& t, ArgPair<compute_t<T>>* sh, const T* x, const ReduceGeom& g) {
  using C = compute_t<T>;
  const TilePos p = tile_pos(t, g);
  ArgPair<C> best{C(0), -1};
  if (p.j < g.inner)
    for (std::int64_t i = p.cy; i < g.n; i += g.ty) {
      const C cur = load(x[at(g, p.o, i, p.j)]);
      // Indices rise along the slice, so "strictly better" keeps the first, as the CPU's scan.
      if (best.i < 0 || cur > best.v || (cur != cur && best.v == best.v)) best = {cur, i};
    }
  sh[p.tid] = best;
}

template <class C>
MPT_HOST_DEVICE void argmax_step(const Thread& t, ArgPair<C>* sh, const ReduceGeom& g, unsigned half) {
  tree_step(t, sh, g.tx, half, ArgCombine<C>{});
}

template <class C>
MPT_HOST_DEVICE void argmax_finish(const Thread& t, const ArgPair<C>* sh, std::int64_t* out, const ReduceGeom& g) {
  const TilePos p = tile_pos(t, g);
  if (p.cy != 0 || p.j >= g.inner) return;
  out[p.o * g.inner + p.j] = sh[p.cx].i < 0 ? 0 : sh[p.cx].i;
}

}  // namespace mpt::kernels
