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

/// One pass of reduce_kernel over x viewed as [outer, n, inner]; Mean divides by mean_count when set.
template <class T, class O>
void reduce_pass(ReduceOp op, const T* x, O* out, std::int64_t outer, std::int64_t n, std::int64_t inner,
                 std::int64_t mean_count, cudaStream_t s) {
  ReduceGeom geom = reduce_geom(outer, n, inner);
  geom.mean_count = mean_count;
  for_tile_chunks(geom, [&](unsigned blocks, const ReduceGeom& g) {
    reduce_kernel<T, O><<<blocks, g.threads(), 0, s>>>(x, out, op, g);
    check_launch("reduce");
  });
}

}  // namespace

void CudaBackend::reduce(ReduceOp op, const Tensor& x, std::int64_t axis, Tensor& out) {
  std::int64_t outer, n, inner;
  split_axis(x.shape(), axis, outer, n, inner);
  if (outer * inner == 0) return;
  DeviceGuard guard(out.device().index);
  const cudaStream_t s = stream(guard.index());
  const ReduceSplit split = reduce_split(outer, n, inner, is_floating(x.dtype()));
  // Partials in the compute type: float32, float64 for float64.
  const DType partial_dtype = x.dtype() == float64 ? float64 : float32;
  Tensor partial = split.splits > 1 ? Tensor::empty({split.partial_rows(), inner}, partial_dtype, out.device()) : Tensor();
  dispatch(x.dtype(), [&](auto xt) {
    using T = typename decltype(xt)::type;
    dispatch(out.dtype(), [&](auto ot) {
      using O = typename decltype(ot)::type;
      const T* xp = static_cast<const T*>(x.data_ptr());
      O* op_out = static_cast<O*>(out.data_ptr());
      if (split.splits == 1) return reduce_pass<T, O>(op, xp, op_out, outer, n, inner, 0, s);
      using C = compute_t<T>;
      C* pp = static_cast<C*>(partial.data_ptr());
      const ReduceOp first = op == ReduceOp::Mean ? ReduceOp::Sum : op;
      reduce_pass<T, C>(first, xp, pp, split.splits, split.run, inner, 0, s);
      if (split.rest > 0)
        reduce_pass<T, C>(first, xp + split.splits * split.run * inner, pp + split.splits * inner, 1, split.rest, inner, 0, s);
      reduce_pass<C, O>(op, pp, op_out, 1, split.partial_rows(), inner, n, s);
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
