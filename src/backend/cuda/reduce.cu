// Reductions over one axis (sum, mean, max, min) and argmax: the bodies of kernels/reduce.hpp,
// one block per tile of [outer, n, inner], a shared-memory tree at the barriers.
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/reduce.hpp"

namespace mpt::cuda {
namespace {
using namespace mpt::kernels;

template <class T, class O>
__global__ void reduce_kernel(const T* x, O* out, ReduceOp op, ReduceGeom g) {
  using C = compute_t<T>;
  __shared__ C sh[kReduceThreads];
  const Thread t = this_thread();
  reduce_partial(t, sh, x, op, g);
  for (unsigned half = g.ty / 2; half > 0; half >>= 1) {
    __syncthreads();
    reduce_step(t, sh, op, g, half);
  }
  __syncthreads();
  reduce_finish(t, sh, out, op, g);
}

template <class T>
__global__ void argmax_kernel(const T* x, std::int64_t* out, ReduceGeom g) {
  using C = compute_t<T>;
  __shared__ ArgPair<C> sh[kReduceThreads];
  const Thread t = this_thread();
  argmax_partial(t, sh, x, g);
  for (unsigned half = g.ty / 2; half > 0; half >>= 1) {
    __syncthreads();
    argmax_step(t, sh, g, half);
  }
  __syncthreads();
  argmax_finish(t, sh, out, g);
}

}  // namespace

void CudaBackend::reduce(ReduceOp op, const Tensor& x, std::int64_t axis, Tensor& out) {
  std::int64_t outer, n, inner;
  split_axis(x.shape(), axis, outer, n, inner);
  if (outer * inner == 0) return;
  const ReduceGeom geom = reduce_geom(outer, n, inner);
  DeviceGuard guard(out.device().index);
  dispatch(x.dtype(), [&](auto xt) {
    using T = typename decltype(xt)::type;
    dispatch(out.dtype(), [&](auto ot) {
      using O = typename decltype(ot)::type;
      for_tile_chunks(geom, [&](unsigned blocks, const ReduceGeom& g) {
        reduce_kernel<T, O><<<blocks, g.threads(), 0, stream(guard.index())>>>(
            static_cast<const T*>(x.data_ptr()), static_cast<O*>(out.data_ptr()), op, g);
        check_launch("reduce");
      });
    });
  });
}

void CudaBackend::argmax(const Tensor& x, std::int64_t axis, Tensor& out) {
  std::int64_t outer, n, inner;
  split_axis(x.shape(), axis, outer, n, inner);
  if (outer * inner == 0) return;
  const ReduceGeom geom = reduce_geom(outer, n, inner);
  DeviceGuard guard(out.device().index);
  dispatch(x.dtype(), [&](auto xt) {
    using T = typename decltype(xt)::type;
    for_tile_chunks(geom, [&](unsigned blocks, const ReduceGeom& g) {
      argmax_kernel<T><<<blocks, g.threads(), 0, stream(guard.index())>>>(
          static_cast<const T*>(x.data_ptr()), out.data<std::int64_t>(), g);
      check_launch("argmax");
    });
  });
}

}  // namespace mpt::cuda
