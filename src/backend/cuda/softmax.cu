// Softmax, log-softmax and softmax-cross-entropy: the bodies of kernels/softmax.hpp, one block
// per tile (softmax) or row (cross-entropy), shared-memory trees for the row max and sums.
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/softmax.hpp"

namespace mpt::cuda {
namespace {
using namespace mpt::kernels;

/// The tree over region r of shared memory, one barrier before each step.
template <class C, class Combine>
__device__ void tree(const Thread& t, C* sh, const ReduceGeom& g, int r, Combine c) {
  for (unsigned half = g.ty / 2; half > 0; half >>= 1) {
    __syncthreads();
    region_step(t, sh, g, r, half, c);
  }
  __syncthreads();
}

template <class T>
__global__ void softmax_kernel(const T* x, T* out, bool log, ReduceGeom g) {
  __shared__ compute_t<T> sh[2 * kReduceThreads];
  const Thread t = this_thread();
  softmax_max_partial(t, sh, x, g);
  tree(t, sh, g, 0, MaxOp{});
  softmax_sum_partial(t, sh, x, g);
  tree(t, sh, g, 1, SumOp{});
  softmax_write(t, sh, x, out, log, g);
}

template <class T>
__global__ void softmax_backward_kernel(const T* y, const void* dy, DType dy_dtype, T* dx, bool log, ReduceGeom g) {
  __shared__ compute_t<T> sh[kReduceThreads];
  const Thread t = this_thread();
  softmax_backward_partial(t, sh, y, dy, dy_dtype, log, g);
  tree(t, sh, g, 0, SumOp{});
  softmax_backward_write(t, sh, y, dy, dy_dtype, dx, log, g);
}

template <class T, class L>
__global__ void xent_kernel(const T* x, Labels l, bool from_logits, L* loss, ReduceGeom g) {
  __shared__ compute_t<T> sh[3 * kReduceThreads];
  const Thread t = this_thread();
  if (from_logits) {
    softmax_max_partial(t, sh, x, g);
    tree(t, sh, g, 0, MaxOp{});
    softmax_sum_partial(t, sh, x, g);
    tree(t, sh, g, 1, SumOp{});
  } else {
    xent_psum_partial(t, sh, x, g);
    tree(t, sh, g, 0, SumOp{});
  }
  xent_loss_partial(t, sh, x, l, from_logits, g);
  tree(t, sh, g, 2, SumOp{});
  xent_loss_write(t, sh, loss, g);
}

template <class T>
__global__ void xent_backward_kernel(const T* x, Labels l, bool from_logits, const void* dloss, DType dloss_dtype,
                                     T* dx, ReduceGeom g) {
  __shared__ compute_t<T> sh[3 * kReduceThreads];
  const Thread t = this_thread();
  if (from_logits) {
    softmax_max_partial(t, sh, x, g);
    tree(t, sh, g, 0, MaxOp{});
    xent_grad_sums_partial(t, sh, x, l, g);
    for (unsigned half = g.ty / 2; half > 0; half >>= 1) {  // R1 and R2 in the same steps
      __syncthreads();
      region_step(t, sh, g, 1, half, SumOp{});
      region_step(t, sh, g, 2, half, SumOp{});
    }
    __syncthreads();
  } else {
    xent_psum_partial(t, sh, x, g);
    tree(t, sh, g, 0, SumOp{});
    xent_grad_dot_partial(t, sh, x, l, g);
    tree(t, sh, g, 1, SumOp{});
  }
  xent_grad_write(t, sh, x, l, from_logits, dloss, dloss_dtype, dx, g);
}

Labels labels_of(const Tensor& labels) { return {labels.data_ptr(), labels.dtype(), is_integer(labels.dtype())}; }
}  // namespace

void CudaBackend::softmax(const Tensor& x, std::int64_t axis, bool log, Tensor& out) {
  MPT_CHECK(out.dtype() == x.dtype(), "softmax: out ", to_string(out.dtype()), " for x ", to_string(x.dtype()));
  std::int64_t outer, n, inner;
  split_axis(x.shape(), axis, outer, n, inner);
  if (outer * n * inner == 0) return;
  const ReduceGeom geom = reduce_geom(outer, n, inner);
  DeviceGuard guard(out.device().index);
  dispatch_float(x.dtype(), "softmax", [&](auto xt) {
    using T = typename decltype(xt)::type;
    for_tile_chunks(geom, [&](unsigned blocks, const ReduceGeom& g) {
      softmax_kernel<T><<<blocks, g.threads(), 0, stream(guard.index())>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), log, g);
      check_launch(log ? "log_softmax" : "softmax");
    });
  });
}

void CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy, std::int64_t axis, bool log, Tensor& dx) {
  MPT_CHECK(dx.dtype() == y.dtype(), "softmax_backward: dx ", to_string(dx.dtype()), " for y ", to_string(y.dtype()));
  std::int64_t outer, n, inner;
  split_axis(y.shape(), axis, outer, n, inner);
  if (outer * n * inner == 0) return;
  const ReduceGeom geom = reduce_geom(outer, n, inner);
  DeviceGuard guard(dx.device().index);
  dispatch_float(y.dtype(), "softmax_backward", [&](auto yt) {
    using T = typename decltype(yt)::type;
    for_tile_chunks(geom, [&](unsigned blocks, const ReduceGeom& g) {
      softmax_backward_kernel<T><<<blocks, g.threads(), 0, stream(guard.index())>>>(
          static_cast<const T*>(y.data_ptr()), dy.data_ptr(), dy.dtype(), static_cast<T*>(dx.data_ptr()), log, g);
      check_launch(log ? "log_softmax backward" : "softmax backward");
    });
  });
}

void CudaBackend::cross_entropy(const Tensor& x, const Tensor& labels, bool from_logits, Tensor& loss) {
  const std::int64_t rows = x.shape()[0], n = x.shape()[1];
  if (rows == 0) return;
  const ReduceGeom geom = reduce_geom(rows, n, 1);
  DeviceGuard guard(loss.device().index);
  dispatch_float(x.dtype(), "cross_entropy", [&](auto xt) {
    using T = typename decltype(xt)::type;
    dispatch_float(loss.dtype(), "cross_entropy", [&](auto lt) {
      using L = typename decltype(lt)::type;
      for_tile_chunks(geom, [&](unsigned blocks, const ReduceGeom& g) {
        xent_kernel<T, L><<<blocks, g.threads(), 0, stream(guard.index())>>>(
            static_cast<const T*>(x.data_ptr()), labels_of(labels), from_logits, static_cast<L*>(loss.data_ptr()), g);
        check_launch("cross_entropy");
      });
    });
  });
}

void CudaBackend::cross_entropy_backward(const Tensor& x, const Tensor& labels, bool from_logits,
                                         const Tensor& dloss, Tensor& dx) {
  MPT_CHECK(dx.dtype() == x.dtype(), "cross_entropy_backward: dx ", to_string(dx.dtype()), " for x ",
            to_string(x.dtype()));
  const std::int64_t rows = x.shape()[0], n = x.shape()[1];
  if (rows == 0 || n == 0) return;
  const ReduceGeom geom = reduce_geom(rows, n, 1);
  DeviceGuard guard(dx.device().index);
  dispatch_float(x.dtype(), "cross_entropy_backward", [&](auto xt) {
    using T = typename decltype(xt)::type;
    for_tile_chunks(geom, [&](unsigned blocks, const ReduceGeom& g) {
      xent_backward_kernel<T><<<blocks, g.threads(), 0, stream(guard.index())>>>(
          static_cast<const T*>(x.data_ptr()), labels_of(labels), from_logits, dloss.data_ptr(), dloss.dtype(),
          static_cast<T*>(dx.data_ptr()), g);
      check_launch("cross_entropy_backward");
    });
  });
}

}  // namespace mpt::cuda
