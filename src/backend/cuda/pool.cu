// Max and average pooling over NHWC on the GPU (the CUDA twin of src/backend/cpu/pool.cpp;
// arithmetic, tie rule and workspace layout in kernels/pool.hpp): one thread per output element
// forward, one per input element backward (a gather: deterministic, no atomics).
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/pool.hpp"
#include "mpt/error.hpp"

namespace mpt::cuda {
namespace {

namespace k = mpt::kernels;

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxBlocks = 65535;  // grid-stride loops cover the rest

template <class T>
__global__ void pool_forward_kernel(const T* x, T* y, std::uint16_t* ws, k::PoolDims d) {
  k::pool_forward_body(k::this_thread(), x, y, ws, d);
}

template <class T>
__global__ void pool_backward_kernel(const T* dy, const std::uint16_t* ws, T* dx, k::PoolDims d) {
  k::pool_backward_body(k::this_thread(), dy, ws, dx, d);
}

/// x [N,H,W,C] and its pooled shape [N,OH,OW,C].
k::PoolDims dims_of(const Shape& x, const Shape& y, const Pool2dGeometry& g) {
  return {x[0], x[1], x[2], x[3], y[1], y[2], g.pool_h, g.pool_w, g.stride_h, g.stride_w, g.pad_top, g.pad_left,
          g.kind == PoolKind::Max, g.stride_h >= g.pool_h && g.stride_w >= g.pool_w};
}

}  // namespace

void CudaBackend::pool2d(const Tensor& x, const Pool2dGeometry& g, bool training, Tensor& out, Tensor& workspace) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  // uint16 window positions (src/ops allows at most 65536 per window), one per output element
  // (the CPU's layout), in a uint8 tensor.
  if (training && g.kind == PoolKind::Max) workspace = Tensor::empty({n * 2}, uint8, out.device());
  auto* ws = workspace.defined() ? static_cast<std::uint16_t*>(workspace.data_ptr()) : nullptr;
  const k::PoolDims d = dims_of(x.shape(), out.shape(), g);
  DeviceGuard guard(out.device().index);
  k::dispatch_float(x.dtype(), "pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    pool_forward_kernel<T><<<k::blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream(guard.index())>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), ws, d);
  });
  check_launch("pool2d");
}

void CudaBackend::pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& workspace,
                                  const Pool2dGeometry& g, Tensor& dx) {
  const std::int64_t n = dx.numel();
  if (n == 0) return;
  Tensor ws = workspace;
  if (g.kind == PoolKind::Max && !ws.defined() && y.numel() > 0) {  // forward ran without one: find the maxima again
    Tensor again = Tensor::empty(y.shape(), y.dtype(), y.device());
    pool2d(x, g, true, again, ws);
  }
  // With no output (dy empty) no window holds any element: the kernel writes zeros, never reading ws.
  const auto* w = g.kind == PoolKind::Max && ws.defined() ? static_cast<const std::uint16_t*>(ws.data_ptr()) : nullptr;
  const k::PoolDims d = dims_of(dx.shape(), dy.shape(), g);
  DeviceGuard guard(dx.device().index);
  k::dispatch_float(dy.dtype(), "pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    pool_backward_kernel<T><<<k::blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream(guard.index())>>>(
        static_cast<const T*>(dy.data_ptr()), w, static_cast<T*>(dx.data_ptr()), d);
  });
  check_launch("pool2d_backward");
}

}  // namespace mpt::cuda
