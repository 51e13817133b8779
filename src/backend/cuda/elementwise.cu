// Elementwise ops on the GPU: fill, arange, cast, copy2d, unary (and backward), broadcasting
// binary and where, has_nonfinite, one_hot. The arithmetic is in kernels/elementwise.hpp (the
// tests run it on the host against the CPU backend); here only grid-stride launches on the
// compute stream of the output's GPU.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/elementwise.hpp"
#include "mpt/error.hpp"

namespace mpt::cuda {
namespace {
using namespace mpt::kernels;

constexpr unsigned kThreads = 256;

template <class T>
__global__ void fill_kernel(T* out, T v, std::int64_t n) {
  fill_body(this_thread(), out, v, n);
}

template <class T>
__global__ void arange_kernel(T* out, double start, double step, std::int64_t n) {
  arange_body(this_thread(), out, start, step, n);
}

template <class S, class D>
__global__ void cast_kernel(const S* x, D* out, std::int64_t n) {
  cast_body(this_thread(), x, out, n);
}

template <UnaryOp Op, class T>
__global__ void unary_kernel(const T* x, T* out, std::int64_t n, double param) {
  unary_body<Op>(this_thread(), x, out, n, param);
}

template <UnaryOp Op, class T>
__global__ void unary_backward_kernel(const T* x, const T* y, const T* dy, T* dx, std::int64_t n, double param) {
  unary_backward_body<Op>(this_thread(), x, y, dy, dx, n, param);
}

template <BinaryOp Op, class T, class O>
__global__ void binary_kernel(const T* a, const T* b, O* out, BroadcastGeom<2> g) {
  binary_body<Op>(this_thread(), a, b, out, g);
}

template <class T>
__global__ void where_kernel(const std::uint8_t* cond, const T* a, const T* b, T* out, BroadcastGeom<3> g) {
  where_body(this_thread(), cond, a, b, out, g);
}

template <class T>
__global__ void nonfinite_kernel(const T* x, std::int64_t n, unsigned* flag) {
  nonfinite_body(this_thread(), x, n, flag);
}

template <class I, class O>
__global__ void one_hot_kernel(const I* indices, O* out, std::int64_t total, std::int64_t depth, O one, O zero) {
  one_hot_body(this_thread(), indices, out, total, depth, one, zero);
}

/// Calls f(std::integral_constant<UnaryOp, op>{}): one kernel per op, no switch per element.
using common::with_unary_op;

using common::with_binary_op;

template <class T>
const T* in(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <class T>
T* out_of(Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace

void CudaBackend::fill(Tensor& out, double value) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard g(out.device().index);
  dispatch(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream(g.index())>>>(out_of<T>(out), fill_value<T>(value), n);
  });
  check_launch("fill");
}

void CudaBackend::arange(Tensor& out, double start, double step) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard g(out.device().index);
  dispatch(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    arange_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream(g.index())>>>(out_of<T>(out), start, step, n);
  });
  check_launch("arange");
}

void CudaBackend::cast(const Tensor& x, Tensor& out) {
  const std::int64_t n = x.numel();
  if (n == 0) return;
  DeviceGuard g(out.device().index);
  if (x.dtype() == out.dtype()) {  // a plain copy, as detail::convert's memcpy
    check_cuda(cudaMemcpyAsync(out.data_ptr(), x.data_ptr(), x.nbytes(), cudaMemcpyDeviceToDevice, stream(g.index())),
               "cast: cudaMemcpyAsync");
    return;
  }
  dispatch(x.dtype(), [&](auto st) {
    using S = typename decltype(st)::type;
    dispatch(out.dtype(), [&](auto dt) {
      using D = typename decltype(dt)::type;
      cast_kernel<S, D><<<blocks_for(n, kThreads), kThreads, 0, stream(g.index())>>>(in<S>(x), out_of<D>(out), n);
    });
  });
  check_launch("cast");
}

void CudaBackend::copy2d(Device device, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                         std::size_t row_bytes, std::size_t rows) {
  if (row_bytes == 0 || rows == 0) return;  // empty tensors may have no memory at all
  DeviceGuard g(device.index);
  check_cuda(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice,
                               stream(g.index())),
             "copy2d: cudaMemcpy2DAsync");
}

void CudaBackend::unary(UnaryOp op, const Tensor& x, Tensor& out, double param) {
  const std::int64_t n = x.numel();
  DeviceGuard g(out.device().index);
  dispatch(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_unary_op(op, [&](auto opc) {
      constexpr UnaryOp Op = decltype(opc)::value;
      if constexpr (std::is_floating_point_v<compute_t<T>> || unary_on_integers(Op)) {
        if (n == 0) return;
        unary_kernel<Op, T><<<blocks_for(n, kThreads), kThreads, 0, stream(g.index())>>>(in<T>(x), out_of<T>(out), n, param);
        check_launch("unary");
      } else {
        fail("unary op ", common::unary_name(op), ": not defined for ", to_string(x.dtype()));
      }
    });
  });
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx,
                                 double param) {
  const std::int64_t n = dx.numel();
  DeviceGuard g(dx.device().index);
  dispatch_float(x.dtype(), "unary backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_unary_op(op, [&](auto opc) {
      constexpr UnaryOp Op = decltype(opc)::value;
      if (n == 0) return;
      unary_backward_kernel<Op, T><<<blocks_for(n, kThreads), kThreads, 0, stream(g.index())>>>(
          in<T>(x), in<T>(y), in<T>(dy), out_of<T>(dx), n, param);
      check_launch("unary backward");
    });
  });
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  MPT_CHECK(a.dtype() == b.dtype(), "binary: operands of different dtypes (", to_string(a.dtype()), ", ",
            to_string(b.dtype()), ")");
  MPT_CHECK(out.dtype() == (is_comparison(op) ? bool_ : a.dtype()), "binary: output dtype ",
            to_string(out.dtype()), " for ", to_string(a.dtype()), " operands");
  const BroadcastGeom<2> geom = make_broadcast<2>(out.shape(), {&a.shape(), &b.shape()});
  if (geom.n == 0) return;
  DeviceGuard g(out.device().index);
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_binary_op(op, [&](auto opc) {
      constexpr BinaryOp Op = decltype(opc)::value;
      using O = std::conditional_t<is_comparison(Op), bool, T>;
      binary_kernel<Op, T, O><<<blocks_for(geom.n, kThreads), kThreads, 0, stream(g.index())>>>(
          in<T>(a), in<T>(b), out_of<O>(out), geom);
    });
  });
  check_launch("binary");
}

void CudaBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  MPT_CHECK(a.dtype() == b.dtype() && out.dtype() == a.dtype() && itemsize(cond.dtype()) == 1,
            "where: dtypes ", to_string(cond.dtype()), ", ", to_string(a.dtype()), ", ", to_string(b.dtype()),
            " -> ", to_string(out.dtype()));
  const BroadcastGeom<3> geom = make_broadcast<3>(out.shape(), {&cond.shape(), &a.shape(), &b.shape()});
  if (geom.n == 0) return;
  DeviceGuard g(out.device().index);
  dispatch(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    where_kernel<T><<<blocks_for(geom.n, kThreads), kThreads, 0, stream(g.index())>>>(
        in<std::uint8_t>(cond), in<T>(a), in<T>(b), out_of<T>(out), geom);
  });
  check_launch("where");
}

bool CudaBackend::has_nonfinite(const Tensor& x) {
  const std::int64_t n = x.numel();
  if (n == 0 || !is_floating(x.dtype())) return false;
  DeviceGuard g(x.device().index);
  cudaStream_t s = stream(g.index());
  Tensor flag = Tensor::empty({1}, int32, x.device());  // from the caching allocator, stream ordered
  auto* f = static_cast<unsigned*>(flag.data_ptr());
  check_cuda(cudaMemsetAsync(f, 0, sizeof(unsigned), s), "has_nonfinite: cudaMemsetAsync");
  dispatch_float(x.dtype(), "has_nonfinite", [&](auto tag) {
    using T = typename decltype(tag)::type;
    nonfinite_kernel<T><<<blocks_for(n, kThreads, 4096), kThreads, 0, s>>>(in<T>(x), n, f);
  });
  check_launch("has_nonfinite");
  // The contract's one host read: the flag, once.
  unsigned host = 0;
  check_cuda(cudaMemcpyAsync(&host, f, sizeof host, cudaMemcpyDeviceToHost, s), "has_nonfinite: cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(s), "has_nonfinite: cudaStreamSynchronize");
  return host != 0;
}

void CudaBackend::one_hot(const Tensor& indices, Tensor& out) {
  const std::int64_t total = out.numel(), depth = out.shape().back();
  if (total == 0) return;
  DeviceGuard g(out.device().index);
  dispatch(indices.dtype(), [&](auto it) {
    using I = typename decltype(it)::type;
    if constexpr (std::is_integral_v<I>) {
      dispatch(out.dtype(), [&](auto ot) {
        using O = typename decltype(ot)::type;
        // The CPU's elements: fill(out, 0.0), then convert(1.0 -> out dtype) at the hits.
        one_hot_kernel<I, O><<<blocks_for(total, kThreads), kThreads, 0, stream(g.index())>>>(
            in<I>(indices), out_of<O>(out), total, depth, convert_value<O>(1.0), fill_value<O>(0.0));
      });
    } else {
      fail("one_hot: indices must be integers, got ", to_string(indices.dtype()));
    }
  });
  check_launch("one_hot");
}

}  // namespace mpt::cuda
