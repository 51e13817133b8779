#pragma once
// Kernel bodies of transpose (any permutation): pure data movement in words W of the element's
// size, so the bits equal the CPU's. The permutation is first simplified (size-1 axes dropped,
// input axes that stay adjacent in the output merged); a swap of the last two axes, with or
// without a leading batch axis, then runs tiled through shared memory (coalesced reads and
// writes), everything else through the general strided kernel.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cuda/kernels/launch.hpp"
#include "mpt/error.hpp"
#include "mpt/tensor.hpp"

namespace mpt::kernels {

constexpr int kMaxTransposeDims = 12;

/// The simplified permutation: input dims `in_shape`, out axis i = input axis perm[i].
struct TransposePlan {
  std::vector<std::int64_t> in_shape, perm;
};

/// Drops size-1 axes and merges runs of input axes that stay adjacent and in order in the
/// output; always at least one axis.
inline TransposePlan simplify_transpose(const Shape& s, const std::vector<std::int64_t>& perm) {
  const std::size_t nd = s.size();
  std::vector<std::int64_t> renum(nd, -1);  // input axis -> index among the kept axes
  std::vector<std::int64_t> kept_shape;
  for (std::size_t a = 0; a < nd; ++a)
    if (s[a] != 1) renum[a] = static_cast<std::int64_t>(kept_shape.size()), kept_shape.push_back(s[a]);
  std::vector<std::int64_t> q;  // out order of kept axes
  for (std::size_t i = 0; i < nd; ++i)
    if (renum[perm[i]] >= 0) q.push_back(renum[perm[i]]);
  TransposePlan p;
  if (q.empty()) {
    p.in_shape = {1};
    p.perm = {0};
    return p;
  }
  // Groups of consecutive out axes that are consecutive input axes; each becomes one axis.
  std::vector<std::int64_t> group_first, group_size;  // per group in out order: first input axis, product
  for (std::size_t i = 0; i < q.size(); ++i) {
    if (i > 0 && q[i] == q[i - 1] + 1) {
      group_size.back() *= kept_shape[q[i]];
    } else {
      group_first.push_back(q[i]);
      group_size.push_back(kept_shape[q[i]]);
    }
  }
  const std::size_t g = group_first.size();
  std::vector<std::int64_t> order(g);  // groups sorted by first input axis: the new input order
  for (std::size_t i = 0; i < g; ++i) order[i] = static_cast<std::int64_t>(i);
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return group_first[a] < group_first[b]; });
  std::vector<std::int64_t> rank(g);
  p.in_shape.resize(g);
  for (std::size_t r = 0; r < g; ++r) rank[order[r]] = static_cast<std::int64_t>(r), p.in_shape[r] = group_size[order[r]];
  p.perm.resize(g);
  for (std::size_t i = 0; i < g; ++i) p.perm[i] = rank[i];
  return p;
}

/// General kernel: out element i (row-major over out_shape) reads x at sum idx[d] * src_stride[d].
struct TransposeGeom {
  int nd = 1;
  std::int64_t n = 0;
  std::int64_t out_shape[kMaxTransposeDims] = {};
  std::int64_t src_stride[kMaxTransposeDims] = {};
};

inline TransposeGeom transpose_geom(const TransposePlan& p) {
  const int nd = static_cast<int>(p.in_shape.size());
  MPT_CHECK(nd <= kMaxTransposeDims, "transpose: ", nd, " dimensions after merging, above the CUDA kernel's ",
            kMaxTransposeDims);
  std::vector<std::int64_t> in_stride(nd);
  in_stride[nd - 1] = 1;
  for (int i = nd - 1; i > 0; --i) in_stride[i - 1] = in_stride[i] * p.in_shape[i];
  TransposeGeom g;
  g.nd = nd;
  g.n = 1;
  for (int i = 0; i < nd; ++i) {
    g.out_shape[i] = p.in_shape[p.perm[i]];
    g.src_stride[i] = in_stride[p.perm[i]];
    g.n *= g.out_shape[i];
  }
  return g;
}

template <class W>
MPT_HOST_DEVICE void transpose_body(const Thread& t, const W* x, W* out, const TransposeGeom& g) {
  for (std::int64_t i = t.global(); i < g.n; i += t.stride()) {
    std::int64_t rest = i, off = 0;
    for (int d = g.nd - 1; d >= 0; --d) {
      off += (rest % g.out_shape[d]) * g.src_stride[d];
      rest /= g.out_shape[d];
    }
    out[i] = x[off];
  }
}

// ---- tiled: x [batch, rows, cols] -> out [batch, cols, rows] ---------------------------------
constexpr int kTile = 32;                 // a tile is kTile x kTile elements
constexpr int kTileRowsPerPass = 8;       // a block is kTile x 8 threads, each doing 4 rows
constexpr unsigned kTileThreads = kTile * kTileRowsPerPass;
constexpr int kTileShared = kTile * (kTile + 1);  // +1 column: no shared-memory bank conflicts

/// One block per tile of a matrix (block.x over the tiles of one matrix), block.y + batch_base
/// the matrix.
struct TileGeom {
  std::int64_t batch = 1, rows = 0, cols = 0, batch_base = 0;
  std::int64_t tiles_r() const { return (rows + kTile - 1) / kTile; }
  std::int64_t tiles_c() const { return (cols + kTile - 1) / kTile; }
};

/// Phase 1: the block reads its tile row by row (consecutive threads, consecutive columns).
template <class W>
MPT_HOST_DEVICE void transpose_tile_load(const Thread& t, W* sh, const W* x, const TileGeom& g) {
  const std::int64_t tiles_c = (g.cols + kTile - 1) / kTile;
  const std::int64_t tr = t.block.x / tiles_c, tc = t.block.x % tiles_c;
  const std::int64_t b = g.batch_base + t.block.y;
  const int tx = static_cast<int>(t.thread.x % kTile), ty = static_cast<int>(t.thread.x / kTile);
  const std::int64_t col = tc * kTile + tx;
  const W* base = x + b * g.rows * g.cols;
  for (int r = ty; r < kTile; r += kTileRowsPerPass) {
    const std::int64_t row = tr * kTile + r;
    if (row < g.rows && col < g.cols) sh[r * (kTile + 1) + tx] = base[row * g.cols + col];
  }
}

/// Phase 2 (after the barrier): the block writes the tile transposed, again row by row of out.
template <class W>
MPT_HOST_DEVICE void transpose_tile_store(const Thread& t, const W* sh, W* out, const TileGeom& g) {
  const std::int64_t tiles_c = (g.cols + kTile - 1) / kTile;
  const std::int64_t tr = t.block.x / tiles_c, tc = t.block.x % tiles_c;
  const std::int64_t b = g.batch_base + t.block.y;
  const int tx = static_cast<int>(t.thread.x % kTile), ty = static_cast<int>(t.thread.x / kTile);
  const std::int64_t ocol = tr * kTile + tx;  // out column = x row
  W* base = out + b * g.rows * g.cols;
  for (int r = ty; r < kTile; r += kTileRowsPerPass) {
    const std::int64_t orow = tc * kTile + r;  // out row = x column
    if (orow < g.cols && ocol < g.rows) base[orow * g.rows + ocol] = sh[tx * (kTile + 1) + r];
  }
}

/// The tiled geometry when the simplified permutation swaps the last two of at most three axes
/// (plan [1, 0] or [0, 2, 1]); false otherwise.
inline bool tile_geom(const TransposePlan& p, TileGeom& g) {
  if (p.perm == std::vector<std::int64_t>{1, 0}) {
    g.batch = 1, g.rows = p.in_shape[0], g.cols = p.in_shape[1];
    return true;
  }
  if (p.perm == std::vector<std::int64_t>{0, 2, 1}) {
    g.batch = p.in_shape[0], g.rows = p.in_shape[1], g.cols = p.in_shape[2];
    return true;
  }
  return false;
}

}  // namespace mpt::kernels
