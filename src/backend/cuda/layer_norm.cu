// Layer normalization over each row of x viewed as [rows, D]: the kernels of kernels/layer_norm.hpp
// (one block per row, float64 row sums by a shared-memory tree; dgamma/dbeta as column sums with
// float64 per-block partials added up by a second kernel), on the compute stream of x's GPU.
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/layer_norm.hpp"
#include "backend/cuda/norm_common.cuh"

namespace mpt::cuda {
namespace {
using namespace mpt::kernels;

// ---- thin wrappers -----------------------------------------------------------------------------

template <class T, class P>
__global__ void forward_kernel(const T* x, const P* gamma, const P* beta, double eps, std::int64_t d, T* y, P* mean,
                               P* rstd) {
  __shared__ double sh[2 * kNormThreads];
  const Thread t = this_thread();
  ln_sum_phase(t, sh, x, d);
  for (int step = 0; step < kTreeSteps; ++step) {
    __syncthreads();
    row_tree_step(t, sh, step, 0, 1);
  }
  __syncthreads();
  ln_deviation_phase(t, sh, x, d);
  for (int step = 0; step < kTreeSteps; ++step) {
    __syncthreads();
    row_tree_step(t, sh, step, 1, 2);
  }
  __syncthreads();
  ln_forward_phase(t, sh, x, gamma, beta, eps, d, y, mean, rstd);
}

template <class T, class P>
__global__ void grad_input_kernel(const T* x, const T* dy, const P* mean, const P* rstd, const P* gamma,
                                  std::int64_t d, T* dx) {
  __shared__ double sh[2 * kNormThreads];
  const Thread t = this_thread();
  ln_grad_sums_phase(t, sh, x, dy, mean, rstd, gamma, d);
  for (int step = 0; step < kTreeSteps; ++step) {
    __syncthreads();
    row_tree_step(t, sh, step, 0, 2);
  }
  __syncthreads();
  ln_grad_input_phase(t, sh, x, dy, mean, rstd, gamma, d, dx);
}

template <class P>
__global__ void params_finalize_kernel(const double* part, std::int64_t blocks, std::int64_t cols, P* dgamma,
                                       P* dbeta) {
  ln_params_finalize_body(this_thread(), part, blocks, cols, dgamma, dbeta);
}

/// Threads per row block: enough for the row (a multiple of 32), at most kNormThreads.
unsigned row_threads(std::int64_t d) {
  const std::int64_t w = (d + 31) / 32 * 32;
  return static_cast<unsigned>(w < static_cast<std::int64_t>(kNormThreads) ? w : kNormThreads);
}

/// One block per row: rows must fit a grid's x dimension.
unsigned row_grid(std::int64_t rows, const char* op) {
  MPT_CHECK(rows <= 0x7fffffff, op, ": too many rows (", rows, ") for one block per row");
  return static_cast<unsigned>(rows);
}

}  // namespace

void CudaBackend::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y,
                             Tensor& mean, Tensor& rstd) {
  if (x.numel() == 0) return;
  const char* op = "layer_norm";
  const std::int64_t d = x.shape().back(), rows = x.numel() / d;
  DeviceGuard g(y.device().index);
  const cudaStream_t s = stream(g.index());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using P = compute_t<T>;
    forward_kernel<<<row_grid(rows, op), row_threads(d), 0, s>>>(
        static_cast<const T*>(x.data_ptr()), optional<P>(gamma), optional<P>(beta), eps, d,
        static_cast<T*>(y.data_ptr()), mean.data<P>(), rstd.data<P>());
    check_launch(op);
  });
}

void CudaBackend::layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  if (x.numel() == 0) {
    if (dgamma.defined()) fill(dgamma, 0.0);
    if (dbeta.defined()) fill(dbeta, 0.0);
    return;
  }
  const char* op = "layer_norm_backward";
  const std::int64_t d = x.shape().back(), rows = x.numel() / d;
  DeviceGuard g(x.device().index);
  const cudaStream_t s = stream(g.index());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using P = compute_t<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pd = static_cast<const T*>(dy.data_ptr());
    const P* pm = mean.data<P>();
    const P* pr = rstd.data<P>();
    if (dx.defined()) {
      grad_input_kernel<<<row_grid(rows, op), row_threads(d), 0, s>>>(px, pd, pm, pr, optional<P>(gamma), d,
                                                                      static_cast<T*>(dx.data_ptr()));
      check_launch(op);
    }
    if (!dgamma.defined() && !dbeta.defined()) return;
    // Column sums over the rows, tiled as batch norm's channels.
    const Tiling tl = tiling(rows, d, op);
    const Tensor part = column_sums<P>(LayerNormParamTerm<T, P>{px, pd, pm, pr, d}, tl, x.device(), s, op);
    params_finalize_kernel<<<blocks_for(d, kNormThreads), kNormThreads, 0, s>>>(
        part.data<double>(), static_cast<std::int64_t>(tl.grid.y), d, optional_out<P>(dgamma), optional_out<P>(dbeta));
    check_launch(op);
  });
}

}  // namespace mpt::cuda
