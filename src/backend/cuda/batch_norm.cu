// Batch normalization over x viewed as [rows, C]: the kernels of kernels/batch_norm.hpp (threads
// on channels, blocks on row ranges, float64 per-block partials in a workspace added up by a
// second kernel), launched on the compute stream of the output's GPU.
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/batch_norm.hpp"
#include "backend/cuda/norm_common.cuh"

namespace mpt::cuda {
namespace {
using namespace mpt::kernels;

// ---- thin wrappers -----------------------------------------------------------------------------

template <class T, class P>
__global__ void stats_finalize_kernel(const T* x, const double* part, std::int64_t blocks, std::int64_t rows,
                                      std::int64_t cols, P* mean, P* var) {
  stats_finalize_body(this_thread(), x, part, blocks, rows, cols, mean, var);
}

template <class C, class P>
__global__ void coefficients_kernel(const P* mean, const P* var, const P* gamma, const P* beta, double eps,
                                    std::int64_t cols, C* k) {
  coefficients_body(this_thread(), mean, var, gamma, beta, eps, cols, k);
}

template <class C, class P>
__global__ void grad_finalize_kernel(const double* part, std::int64_t blocks, std::int64_t rows, std::int64_t cols,
                                     const C* k, bool batch_stats, P* dgamma, P* dbeta, C* g) {
  grad_finalize_body(this_thread(), part, blocks, rows, cols, k, batch_stats, dgamma, dbeta, g);
}

template <class T, bool Relu>
__global__ void forward_kernel(const T* x, const compute_t<T>* k, std::int64_t rows, std::int64_t cols,
                               std::int64_t cw, T* y) {
  forward_body<T, Relu>(this_thread(), x, k, rows, cols, cw, y);
}

template <class T, bool Relu>
__global__ void grad_input_kernel(const T* x, const T* dy, const compute_t<T>* k, const compute_t<T>* g,
                                  std::int64_t rows, std::int64_t cols, std::int64_t cw, T* dx) {
  grad_input_body<T, Relu>(this_thread(), x, dy, k, g, rows, cols, cw, dx);
}

// ---- launch helpers ----------------------------------------------------------------------------

/// The coefficients [4][C] (rstd, scale, shift, mean) in the compute type C, in a new tensor.
template <class C>
Tensor coefficients(const Tensor& mean, const Tensor& var, const Tensor& gamma, const Tensor& beta, double eps,
                    std::int64_t cols, Device device, cudaStream_t s, const char* op) {
  Tensor k = Tensor::empty({4 * cols}, dtype_of<C>(), device);
  coefficients_kernel<<<blocks_for(cols, kNormThreads), kNormThreads, 0, s>>>(
      mean.data<C>(), var.data<C>(), optional<C>(gamma), optional<C>(beta), eps, cols, k.data<C>());
  check_launch(op);
  return k;
}

}  // namespace

void CudaBackend::batch_norm_stats(const Tensor& x, Tensor& mean, Tensor& var) {
  if (x.numel() == 0) return;
  const char* op = "batch_norm_stats";
  const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
  DeviceGuard g(mean.device().index);
  const cudaStream_t s = stream(g.index());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    const Tiling tl = tiling(rows, cols, op);
    Tensor part = column_sums<C>(StatsTerm<T>{px, cols}, tl, x.device(), s, op);
    stats_finalize_kernel<<<blocks_for(cols, kNormThreads), kNormThreads, 0, s>>>(
        px, part.data<double>(), static_cast<std::int64_t>(tl.grid.y), rows, cols, mean.data<C>(), var.data<C>());
    check_launch(op);
  });
}

void CudaBackend::batch_norm(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& gamma,
                                     const Tensor& beta, double eps, Activation act, Tensor& y) {
  if (x.numel() == 0) return;
  const char* op = "batch_norm";
  const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
  DeviceGuard g(y.device().index);
  const cudaStream_t s = stream(g.index());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const Tensor k = coefficients<C>(mean, var, gamma, beta, eps, cols, x.device(), s, op);
    const Tiling tl = tiling(rows, cols, op);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    if (act == Activation::Relu)
      forward_kernel<T, true><<<tl.grid, kNormThreads, 0, s>>>(px, k.data<C>(), rows, cols, tl.cw, py);
    else
      forward_kernel<T, false><<<tl.grid, kNormThreads, 0, s>>>(px, k.data<C>(), rows, cols, tl.cw, py);
    check_launch(op);
  });
}

void CudaBackend::batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& var,
                                      const Tensor& gamma, const Tensor& beta, double eps, bool batch_stats,
                                      Activation act, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  if (x.numel() == 0) {
    if (dgamma.defined()) fill(dgamma, 0.0);
    if (dbeta.defined()) fill(dbeta, 0.0);
    return;
  }
  const char* op = "batch_norm_backward";
  const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
  DeviceGuard g(x.device().index);
  const cudaStream_t s = stream(g.index());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const Tensor k = coefficients<C>(mean, var, gamma, beta, eps, cols, x.device(), s, op);
    const Tiling tl = tiling(rows, cols, op);
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pd = static_cast<const T*>(dy.data_ptr());
    // sum(dy), sum(dy * (x - mean)): needed by the batch statistics' gradient and by dgamma/dbeta.
    Tensor part;
    if (batch_stats || dgamma.defined() || dbeta.defined()) {
      if (act == Activation::Relu) part = column_sums<C>(GradTerm<T, true>{px, pd, k.data<C>(), cols}, tl, x.device(), s, op);
      else part = column_sums<C>(GradTerm<T, false>{px, pd, k.data<C>(), cols}, tl, x.device(), s, op);
    }
    Tensor coef = Tensor::empty({3 * cols}, dtype_of<C>(), x.device());
    grad_finalize_kernel<<<blocks_for(cols, kNormThreads), kNormThreads, 0, s>>>(
        part.defined() ? part.data<double>() : nullptr, static_cast<std::int64_t>(tl.grid.y), rows, cols,
        k.data<C>(), batch_stats, optional_out<C>(dgamma), optional_out<C>(dbeta), coef.data<C>());
    check_launch(op);
    if (!dx.defined()) return;
    T* po = static_cast<T*>(dx.data_ptr());
    if (act == Activation::Relu)
      grad_input_kernel<T, true><<<tl.grid, kNormThreads, 0, s>>>(px, pd, k.data<C>(), coef.data<C>(), rows, cols, tl.cw, po);
    else
      grad_input_kernel<T, false><<<tl.grid, kNormThreads, 0, s>>>(px, pd, k.data<C>(), coef.data<C>(), rows, cols, tl.cw, po);
    check_launch(op);
  });
}

}  // namespace mpt::cuda
