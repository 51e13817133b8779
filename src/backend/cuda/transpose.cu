// Transpose on the GPU: the permutation simplified by kernels/transpose.hpp, then a copy (no
// permutation left), the tiled shared-memory kernel (last two axes swapped) or the general
// strided kernel, all moving words of the element's size.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/transpose.hpp"
#include "mpt/error.hpp"

namespace mpt::cuda {
namespace {
using namespace mpt::kernels;

constexpr unsigned kThreads = 256;
constexpr std::int64_t kMaxGridY = 65535;

template <class W>
__global__ void transpose_kernel(const W* x, W* out, TransposeGeom g) {
  transpose_body(this_thread(), x, out, g);
}

template <class W>
__global__ void transpose_tile_kernel(const W* x, W* out, TileGeom g) {
  __shared__ W sh[kTileShared];
  const Thread t = this_thread();
  transpose_tile_load(t, sh, x, g);
  __syncthreads();
  transpose_tile_store(t, sh, out, g);
}

/// Calls f(W{}) with the unsigned word of `bytes` bytes (1, 2, 4 or 8).
template <class F>
void with_word(std::size_t bytes, F&& f) {
  switch (bytes) {
    case 8: return f(std::uint64_t{});
    case 4: return f(std::uint32_t{});
    case 2: return f(std::uint16_t{});
    default: return f(std::uint8_t{});
  }
}

bool is_identity(const std::vector<std::int64_t>& perm) {
  for (std::size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<std::int64_t>(i)) return false;
  return true;
}
}  // namespace

void CudaBackend::transpose(const Tensor& x, const std::vector<std::int64_t>& perm, Tensor& out) {
  if (x.numel() == 0) return;
  DeviceGuard guard(out.device().index);
  cudaStream_t s = stream(guard.index());
  const TransposePlan plan = simplify_transpose(x.shape(), perm);
  if (is_identity(plan.perm)) {  // only size-1 axes moved: the bytes are unchanged
    check_cuda(cudaMemcpyAsync(out.data_ptr(), x.data_ptr(), x.nbytes(), cudaMemcpyDeviceToDevice, s),
               "transpose: cudaMemcpyAsync");
    return;
  }
  TileGeom tg;
  // Tiles pay off when both matrix sides fill a tile; thin matrices take the general kernel.
  const bool tiled = tile_geom(plan, tg) && tg.rows >= kTile && tg.cols >= kTile;
  const TransposeGeom geom = transpose_geom(plan);
  with_word(itemsize(x.dtype()), [&](auto w) {
    using W = decltype(w);
    const W* src = static_cast<const W*>(x.data_ptr());
    W* dst = static_cast<W*>(out.data_ptr());
    if (tiled) {
      const std::int64_t tiles = tg.tiles_r() * tg.tiles_c();
      MPT_CHECK(tiles <= 0x7fffffff, "transpose: ", tiles, " tiles in one matrix");
      for (std::int64_t base = 0; base < tg.batch; base += kMaxGridY) {
        tg.batch_base = base;
        const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(std::min(kMaxGridY, tg.batch - base)));
        transpose_tile_kernel<W><<<grid, kTileThreads, 0, s>>>(src, dst, tg);
        check_launch("transpose");
      }
    } else {
      transpose_kernel<W><<<blocks_for(geom.n, kThreads), kThreads, 0, s>>>(src, dst, geom);
      check_launch("transpose");
    }
  });
}

}  // namespace mpt::cuda
