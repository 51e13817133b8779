#pragma once
// How a CUDA kernel of mpt is written so that the test suite can run its very body on the CPU.
//
// A kernel's arithmetic is an MPT_HOST_DEVICE function taking a `Thread` (its block and thread
// indices and the launch's dimensions) as its first argument:
//
//   template <class T>
//   MPT_HOST_DEVICE void scale_body(const Thread& t, const T* x, T* y, float s, std::int64_t n) {
//     for (std::int64_t i = t.global(); i < n; i += t.stride()) y[i] = from_float<T>(to_float(x[i]) * s);
//   }
//
// The .cu file wraps it in a __global__ function that passes `this_thread()`; the tests call
// `emulate(grid, block, f)`, which runs f for every (block, thread) pair in order on the host.
// Kernels with shared memory and barriers are split into phases at each __syncthreads(): the
// device runs phase 1, syncs, phase 2, ...; `emulate_phases` runs phase 1 for every thread of a
// block, then phase 2, and so on, with the block's shared memory as a host array. Grid-stride
// loops, tails and block-level reductions are therefore exercised on the CPU with the very
// indices a GPU would use.
#include <cstdint>
#include <vector>

#include "backend/common/host_device.hpp"

namespace mpt::kernels {

struct Dim {
  unsigned x = 1, y = 1, z = 1;
};

/// One thread's view of a launch (blockIdx, threadIdx, blockDim, gridDim).
struct Thread {
  Dim block, thread, block_dim, grid_dim;
  /// Linear index of this thread in the whole launch (x dimension).
  MPT_HOST_DEVICE std::int64_t global() const {
    return static_cast<std::int64_t>(block.x) * block_dim.x + thread.x;
  }
  /// Threads in the whole launch (x dimension): the step of a grid-stride loop.
  MPT_HOST_DEVICE std::int64_t stride() const {
    return static_cast<std::int64_t>(grid_dim.x) * block_dim.x;
  }
};

#if defined(__CUDACC__)
/// The calling GPU thread's indices.
__device__ inline Thread this_thread() {
  Thread t;
  t.block = {blockIdx.x, blockIdx.y, blockIdx.z};
  t.thread = {threadIdx.x, threadIdx.y, threadIdx.z};
  t.block_dim = {blockDim.x, blockDim.y, blockDim.z};
  t.grid_dim = {gridDim.x, gridDim.y, gridDim.z};
  return t;
}
#endif

/// Runs f(thread) on the host for every thread of a launch of `grid` blocks of `block` threads,
/// block by block, thread by thread.
template <class F>
void emulate(Dim grid, Dim block, F&& f) {
  Thread t;
  t.grid_dim = grid;
  t.block_dim = block;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx)
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx) {
              t.block = {bx, by, bz};
              t.thread = {tx, ty, tz};
              f(t);
            }
}

/// Runs a kernel split at its barriers: for every block, each phase(thread, shared) in turn
/// for all of the block's threads (x only), with `shared_elems` elements of shared memory of
/// type S that live for the block, as on the GPU.
template <class S, class... Phases>
void emulate_phases(Dim grid, unsigned block, std::size_t shared_elems, Phases&&... phases) {
  Thread t;
  t.grid_dim = grid;
  t.block_dim = {block, 1, 1};
  std::vector<S> shared(shared_elems);
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      t.block = {bx, by, 0};
      auto run = [&](auto&& phase) {
        for (unsigned tx = 0; tx < block; ++tx) {
          t.thread = {tx, 0, 0};
          phase(t, shared.data());
        }
      };
      (run(phases), ...);
    }
}

/// Blocks for a grid-stride loop over n elements: enough to fill a large GPU, never 0, at most
/// max_blocks (the loop covers the rest).
inline unsigned blocks_for(std::int64_t n, unsigned threads, unsigned max_blocks = 65535) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

}  // namespace mpt::kernels
