// Scaled dot-product attention on the GPU where cuDNN's fused graphs do not go (float32,
// float64, explicit masks, unusual head dims): one thread per query row (forward, delta, dq) or
// key row (dk, dv) running the row bodies of backend/common/attention.hpp, with the row's own
// vectors in registers up to 128 lanes in float32 (kernels/attention.hpp picks the length); deterministic,
// no atomics, nothing of size Tq·Tk stored. The threads of a warp take consecutive rows of one
// (batch, head), so the key or query rows they loop over are read once for the warp.
#include <type_traits>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/attention.hpp"

namespace mpt::cuda {
namespace {
using namespace mpt::kernels;

constexpr unsigned kThreads = 128;

template <int N, class C>
__global__ void forward_kernel(AttentionGeometry g, const C* q, const C* k, const C* v, const std::uint8_t* mask,
                               C* out, C* lse) {
  attention_forward_body<N>(this_thread(), g, q, k, v, mask, out, lse);
}
template <int N, class C>
__global__ void delta_kernel(AttentionGeometry g, const C* out, const C* dout, C* delta) {
  attention_delta_body<N>(this_thread(), g, out, dout, delta);
}
template <int N, class C>
__global__ void dq_kernel(AttentionGeometry g, const C* q, const C* k, const C* v, const std::uint8_t* mask,
                          const C* lse, const C* delta, const C* dout, C* dq) {
  attention_dq_body<N>(this_thread(), g, q, k, v, mask, lse, delta, dout, dq);
}
template <int N, class C, bool kDk, bool kDv>
__global__ void dkv_kernel(AttentionGeometry g, const C* q, const C* k, const C* v, const std::uint8_t* mask,
                           const C* lse, const C* delta, const C* dout, C* dk, C* dv) {
  attention_dkv_body<N, C, kDk, kDv>(this_thread(), g, q, k, v, mask, lse, delta, dout, dk, dv);
}

const std::uint8_t* mask_ptr(const Tensor& mask) {
  return mask.defined() ? static_cast<const std::uint8_t*>(mask.data_ptr()) : nullptr;
}

/// f(C{}, lanes) for the operands' compute type (ops casts 16-bit inputs to float32 first) and
/// the register length of the problem, as an integral constant.
template <class F>
void with_attention_kernels(DType d, const AttentionGeometry& g, F&& f) {
  auto typed = [&](auto c) {
    using C = decltype(c);
    if constexpr (std::is_same_v<C, float>) {
      switch (attention_lanes(g, false)) {
        case 32: f(c, std::integral_constant<int, 32>{}); return;
        case 64: f(c, std::integral_constant<int, 64>{}); return;
        case 128: f(c, std::integral_constant<int, 128>{}); return;
        default: break;
      }
    }
    f(c, std::integral_constant<int, 0>{});
  };
  if (d == float64) typed(double{});
  else typed(float{});
}

}  // namespace

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                            const AttentionGeometry& g, Tensor& out, Tensor& lse) {
  const std::int64_t rows = g.batch * g.heads * g.q_len;
  if (rows == 0) return;
  DeviceGuard guard(out.device().index);
  with_attention_kernels(q.dtype(), g, [&](auto c, auto lanes) {
    using C = decltype(c);
    constexpr int N = decltype(lanes)::value;
    forward_kernel<N, C><<<blocks_for(rows, kThreads), kThreads, 0, stream(guard.index())>>>(
        g, q.data<C>(), k.data<C>(), v.data<C>(), mask_ptr(mask), out.data<C>(), lse.data<C>());
    check_launch("attention");
  });
}

void CudaBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                     const Tensor& out, const Tensor& lse, const Tensor& dout,
                                     const AttentionGeometry& g, Tensor& dq, Tensor& dk, Tensor& dv) {
  const std::int64_t q_rows = g.batch * g.heads * g.q_len, k_rows = g.batch * g.heads * g.kv_len;
  if (q_rows == 0 && k_rows == 0) return;
  DeviceGuard guard(dq.device().index);
  with_attention_kernels(q.dtype(), g, [&](auto c, auto lanes) {
    using C = decltype(c);
    constexpr int N = decltype(lanes)::value;
    Tensor delta = Tensor::empty({q_rows}, q.dtype(), q.device());
    const cudaStream_t s = stream(guard.index());
    if (q_rows > 0) {
      delta_kernel<N, C><<<blocks_for(q_rows, kThreads), kThreads, 0, s>>>(g, out.data<C>(), dout.data<C>(),
                                                                           delta.data<C>());
      check_launch("attention backward (delta)");
      dq_kernel<N, C><<<blocks_for(q_rows, kThreads), kThreads, 0, s>>>(
          g, q.data<C>(), k.data<C>(), v.data<C>(), mask_ptr(mask), lse.data<C>(), delta.data<C>(), dout.data<C>(),
          dq.data<C>());
      check_launch("attention backward (dq)");
    }
    // dk and dv: in registers, one kernel each (both sums and k, v would not fit); else one.
    auto dkv = [&](auto dk_on, auto dv_on) {
      dkv_kernel<N, C, decltype(dk_on)::value, decltype(dv_on)::value><<<blocks_for(k_rows, kThreads), kThreads, 0, s>>>(
          g, q.data<C>(), k.data<C>(), v.data<C>(), mask_ptr(mask), lse.data<C>(), delta.data<C>(), dout.data<C>(),
          dk.data<C>(), dv.data<C>());
      check_launch("attention backward (dk, dv)");
    };
    if (k_rows > 0) {
      if constexpr (N > 0) {
        dkv(std::true_type{}, std::false_type{});
        dkv(std::false_type{}, std::true_type{});
      } else {
        dkv(std::true_type{}, std::true_type{});
      }
    }
  });
}

}  // namespace mpt::cuda
