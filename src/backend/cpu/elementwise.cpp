#include <atomic>
#include <cmath>
#include <cstring>

#include "backend/common/unary_ops.hpp"
#include "backend/cpu/broadcast.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/vector_types.hpp"

namespace mpt::cpu {
namespace {

constexpr std::int64_t kGrain = 1 << 15;

/// out = block(x) in blocks of kBlock values of C: block(const C* x, C* out, m).
template <class C, class B>
void map1_blocks(const Tensor& x, Tensor& out, B block) {
  parallel_for(out.numel(), kGrain, [&](std::int64_t b, std::int64_t e) {
    C sx[kBlock], so[kBlock];
    for (std::int64_t i = b; i < e; i += kBlock) {
      std::int64_t m = std::min(kBlock, e - i);
      const C* px = load<C>(x, i, m, sx);
      C* po = store_target<C>(out, i, so);
      block(px, po, m);
      store<C>(out, i, m, po);
    }
  });
}

/// The loops of map1, map3 and binary_loop are kernel bodies: each op's formula (f, inlined)
/// runs at the process's ISA tier (isa_dispatch.hpp).
template <class C, class F>
MPT_KERNEL void map1_loop(const C* px, C* po, std::int64_t m, const F& f) {
  for (std::int64_t j = 0; j < m; ++j) po[j] = f(px[j]);
}

template <class C, class F>
void map1(const Tensor& x, Tensor& out, F f) {
  map1_blocks<C>(x, out, [&](const C* px, C* po, std::int64_t m) { isa_call<map1_loop<C, F>>(px, po, m, f); });
}

/// out = block(x, y, dy) in blocks of kBlock values of C: block(x, y, dy, out, m).
template <class C, class B>
void map3_blocks(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& out, B block) {
  parallel_for(out.numel(), kGrain, [&](std::int64_t b, std::int64_t e) {
    C sx[kBlock], sy[kBlock], sd[kBlock], so[kBlock];
    for (std::int64_t i = b; i < e; i += kBlock) {
      std::int64_t m = std::min(kBlock, e - i);
      const C* px = load<C>(x, i, m, sx);
      const C* py = load<C>(y, i, m, sy);
      const C* pd = load<C>(dy, i, m, sd);
      C* po = store_target<C>(out, i, so);
      block(px, py, pd, po, m);
      store<C>(out, i, m, po);
    }
  });
}

template <class C, class F>
MPT_KERNEL void map3_loop(const C* px, const C* py, const C* pd, C* po, std::int64_t m, const F& f) {
  for (std::int64_t j = 0; j < m; ++j) po[j] = f(px[j], py[j], pd[j]);
}

template <class C, class F>
void map3(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& out, F f) {
  map3_blocks<C>(x, y, dy, out, [&](const C* px, const C* py, const C* pd, C* po, std::int64_t m) {
    isa_call<map3_loop<C, F>>(px, py, pd, po, m, f);
  });
}

// ---- transcendental activations on lanes ---------------------------------------------------
// float32 GELU (both forms), sigmoid, tanh and SiLU are common/float_math.hpp's arithmetic
// (unary_apply and unary_grad call its scalar form, as the CUDA kernels do): here on the tier's
// lanes (B bytes: isa_call_native), then the tail as scalars, the same bits in every lane at
// every width. (libm's tanhf had run one value at a time in every clone: 7 ns a value.)

/// Whether op's float32 forward, and its gradient, run on lanes here.
constexpr bool forward_on_lanes(UnaryOp op) {
  return op == UnaryOp::Gelu || op == UnaryOp::GeluTanh || op == UnaryOp::Sigmoid || op == UnaryOp::Tanh ||
         op == UnaryOp::Silu;
}
/// (The others' gradients read y and are plain arithmetic: sigmoid dy·y·(1 - y), tanh dy·(1 - y²).)
constexpr bool gradient_on_lanes(UnaryOp op) {
  return op == UnaryOp::Gelu || op == UnaryOp::GeluTanh || op == UnaryOp::Silu;
}

template <UnaryOp Op, class L>
[[gnu::always_inline]] inline typename L::T forward_lanes(typename L::T x) {
  if constexpr (Op == UnaryOp::Gelu) return common::gelu_f32<L>(x);
  else if constexpr (Op == UnaryOp::GeluTanh) return common::gelu_tanh_f32<L>(x);
  else if constexpr (Op == UnaryOp::Sigmoid) return common::sigmoid_f32<L>(x);
  else if constexpr (Op == UnaryOp::Tanh) return common::tanh_f32<L>(x);
  else return common::silu_f32<L>(x);
}

/// d op / dx (unary_grad's factor of dy).
template <UnaryOp Op, class L>
[[gnu::always_inline]] inline typename L::T slope_lanes(typename L::T x) {
  if constexpr (Op == UnaryOp::Gelu) return common::gelu_grad_f32<L>(x);
  else if constexpr (Op == UnaryOp::GeluTanh) return common::gelu_tanh_grad_f32<L>(x);
  else return common::silu_grad_f32<L>(x);
}

template <UnaryOp Op, int B>
MPT_KERNEL void forward_block(const float* __restrict x, float* __restrict y, std::int64_t n) {
  using L = LaneOpsN<B>;
  constexpr std::int64_t W = Lanes<float, B>::W;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) store_lanes(y + i, forward_lanes<Op, L>(load_lanes<typename L::T>(x + i)));
  for (; i < n; ++i) y[i] = common::unary_apply<Op>(x[i], 0.f);
}

template <UnaryOp Op, int B>
MPT_KERNEL void gradient_block(const float* __restrict x, const float* __restrict dy, float* __restrict dx,
                               std::int64_t n) {
  using L = LaneOpsN<B>;
  using T = typename L::T;
  constexpr std::int64_t W = Lanes<float, B>::W;
  std::int64_t i = 0;
  for (; i + W <= n; i += W)  // unary_grad's exact::mul(d, slope(a))
    store_lanes(dx + i, load_lanes<T>(dy + i) * slope_lanes<Op, L>(load_lanes<T>(x + i)));
  for (; i < n; ++i) dx[i] = common::unary_grad<Op>(x[i], 0.f, dy[i], 0.f);
}

/// 16-bit GELU by table. A bfloat16 or float16 input has 65,536 values, so the forward's results
/// (the float32 lanes' bits on the widened value, rounded) and the gradient's float32 factors
/// gelu'(x) (gradient_block with dy = 1: exactly gelu_grad_f32) are computed once per process
/// and dtype, on the lanes, for all of them (128 + 256 KiB: they stay in L2); a call is then a
/// lookup per element, and for the gradient one float32 product with dy rounded once, as the
/// staged and lane paths do: the same bits, without the erf's 20-odd operations and its division
/// per element (which had kept GELU at a tenth of a bfloat16 transformer step).
struct Gelu16Table {
  std::vector<std::uint16_t> y;
  std::vector<float> dydx;
};
Gelu16Table build_gelu16_table(DType dt, std::int64_t n) {
  const auto un = static_cast<std::size_t>(n);
  Gelu16Table t{std::vector<std::uint16_t>(un), std::vector<float>(un)};
  std::vector<std::uint16_t> bits(un);
  std::vector<float> x(un), y(un), one(un, 1.0f);
  for (std::size_t i = 0; i < un; ++i) bits[i] = static_cast<std::uint16_t>(i);
  detail::convert(bits.data(), dt, x.data(), float32, un);
  isa_call_native<forward_block<UnaryOp::Gelu, 64>, forward_block<UnaryOp::Gelu, 32>, forward_block<UnaryOp::Gelu, 16>>(
      x.data(), y.data(), n);
  detail::convert(y.data(), float32, t.y.data(), dt, un);
  isa_call_native<gradient_block<UnaryOp::Gelu, 64>, gradient_block<UnaryOp::Gelu, 32>, gradient_block<UnaryOp::Gelu, 16>>(
      x.data(), one.data(), t.dydx.data(), n);
  return t;
}
const Gelu16Table& gelu16_table(DType dt) {
  // n hidden from the optimizer: as a known constant, GCC 12 warns of undefined behaviour in the
  // lane bodies' unreached scalar tails.
  auto build = [](DType d) {
    std::int64_t n = std::int64_t{1} << 16;
    asm("" : "+r"(n));
    return build_gelu16_table(d, n);
  };
  if (dt == bfloat16) {
    static const Gelu16Table bf = build(bfloat16);
    return bf;
  }
  static const Gelu16Table f16 = build(float16);
  return f16;
}

/// dx = dy · f for bfloat16 dy and dx and float32 factors f: widened and rounded on the lanes.
template <int B>
MPT_KERNEL void mul_bf16_by(const bf16_bits* dy, const float* f, bf16_bits* dx, std::int64_t n) {
  using H = Bf16Lanes<B>;
  constexpr std::int64_t W = Lanes<float, B>::W;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) H::store(dx + i, H::load(dy + i) * load_lanes<typename Lanes<float, B>::V>(f + i));
  for (; i < n; ++i) dx[i] = narrow<bf16_bits>(widen(dy[i]) * f[i]);
}

/// dx = dy · gelu'(x) for 16-bit x, dy, dx (dtype dt), the factors from gelu16_table, looked up
/// a block at a time; bfloat16 widened and rounded on the lanes (it had run one value at a time
/// at the baseline tier: 4 % of a bfloat16 GPT-mini step), float16 through the bulk (F16C)
/// conversions.
void gelu16_backward(DType dt, const std::uint16_t* x, const std::uint16_t* dy, std::uint16_t* dx, std::int64_t n) {
  const float* g = gelu16_table(dt).dydx.data();
  parallel_for(n, kGrain, [&](std::int64_t b, std::int64_t e) {
    if (dt == bfloat16) {
      float f[kBlock];
      for (std::int64_t i = b; i < e; i += kBlock) {
        const std::int64_t m = std::min(kBlock, e - i);
        for (std::int64_t j = 0; j < m; ++j) f[j] = g[x[i + j]];
        isa_call_native<mul_bf16_by<64>, mul_bf16_by<32>, mul_bf16_by<16>>(dy + i, f, dx + i, m);
      }
      return;
    }
    float d[kBlock];
    for (std::int64_t i = b; i < e; i += kBlock) {
      const std::int64_t m = std::min(kBlock, e - i);
      half_to_float(dy + i, d, static_cast<std::size_t>(m));
      for (std::int64_t j = 0; j < m; ++j) d[j] *= g[x[i + j]];
      float_to_half(d, dx + i, static_cast<std::size_t>(m));
    }
  });
}

/// Broadcasting map over K operands; f(const C* ptrs[K], strides, m, C* out).
template <class C, int K, class F>
void map_broadcast(const std::array<const Tensor*, K>& in, Tensor& out, F f) {
  std::array<const Shape*, K> shapes;
  for (int k = 0; k < K; ++k) shapes[k] = &in[k]->shape();
  BroadcastPlan<K> plan(out.shape(), shapes);
  const std::int64_t chunks_per_row = (plan.inner + kBlock - 1) / kBlock;
  parallel_for(plan.rows * chunks_per_row, std::max<std::int64_t>(1, kGrain / kBlock),
               [&](std::int64_t b, std::int64_t e) {
                 C scratch[K][kBlock], so[kBlock];
                 for (std::int64_t u = b; u < e; ++u) {
                   std::int64_t r = u / chunks_per_row, j = (u % chunks_per_row) * kBlock;
                   std::int64_t m = std::min(kBlock, plan.inner - j);
                   std::array<const C*, K> p;
                   for (int k = 0; k < K; ++k) {
                     std::int64_t off = plan.row_offset(k, r) + j * plan.inner_stride[k];
                     p[k] = load<C>(*in[k], off, plan.inner_stride[k] ? m : 1, scratch[k]);
                   }
                   std::int64_t o = r * plan.inner + j;
                   C* po = store_target<C>(out, o, so);
                   f(p, plan.inner_stride, m, po);
                   store<C>(out, o, m, po);
                 }
               });
}

template <class C, class F>
MPT_KERNEL void binary_loop(const std::array<const C*, 2>& p, const std::array<std::int64_t, 2>& s,
                            std::int64_t m, C* o, const F& f) {
  const C* a = p[0];
  const C* b = p[1];
  if (s[0] && s[1]) {
    for (std::int64_t j = 0; j < m; ++j) o[j] = f(a[j], b[j]);
  } else if (s[0]) {
    const C bv = b[0];
    for (std::int64_t j = 0; j < m; ++j) o[j] = f(a[j], bv);
  } else if (s[1]) {
    const C av = a[0];
    for (std::int64_t j = 0; j < m; ++j) o[j] = f(av, b[j]);
  } else {
    const C v = f(a[0], b[0]);
    for (std::int64_t j = 0; j < m; ++j) o[j] = v;
  }
}

/// bfloat16 a op b for same-shape operands (add, subtract, multiply: the residual adds and
/// gradient sums of a transformer): binary_apply's float32 formula on lanes widened as they are
/// loaded and rounded as they are stored, the bits of the staged path (whose float32 blocks cost
/// three conversion passes per block). out may be a or b.
template <BinaryOp Op, int B>
MPT_KERNEL void binary_bf16(const bf16_bits* a, const bf16_bits* b, bf16_bits* o, std::int64_t n) {
  using H = Bf16Lanes<B>;
  constexpr std::int64_t W = Lanes<float, B>::W;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) H::store(o + i, common::binary_apply<Op>(H::load(a + i), H::load(b + i)));
  for (; i < n; ++i) o[i] = narrow<bf16_bits>(common::binary_apply<Op>(widen(a[i]), widen(b[i])));
}

/// ReLU backward on float16/bfloat16 bit patterns (kInf: +inf; kQuiet: the quiet-NaN bit):
/// x > 0 means 0 < x <= +inf as unsigned bits (sign clear, nonzero, not NaN), and a NaN
/// gradient passed through comes out quiet, as the float32 round trip of map3 made it. Staying
/// in 16-bit lanes keeps it at memory speed; map3 converted three blocks per block of output.
template <std::uint16_t kInf, std::uint16_t kQuiet>
MPT_KERNEL void relu_backward_bits(const std::uint16_t* x, const std::uint16_t* dy, std::uint16_t* dx,
                                             std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t d = dy[i];
    const auto g = static_cast<std::uint16_t>((d & 0x7fffu) > kInf ? d | kQuiet : d);
    dx[i] = static_cast<std::uint16_t>(x[i] - 1u) < kInf ? g : std::uint16_t{0};
  }
}

}  // namespace

void CpuBackend::fill(Tensor& out, double value) {
  if (is_half(out.dtype())) {  // one rounding from double, then replicate the bit pattern
    std::uint16_t bits;
    detail::convert(&value, float64, &bits, out.dtype(), 1);
    auto* p = static_cast<std::uint16_t*>(out.data_ptr());
    parallel_for(out.numel(), kGrain, [&](std::int64_t b, std::int64_t e) { std::fill(p + b, p + e, bits); });
    return;
  }
  with_compute_type(out.dtype(), [&](auto c) {
    using C = decltype(c);
    const C v = static_cast<C>(value);
    parallel_for(out.numel(), kGrain, [&](std::int64_t b, std::int64_t e) {
      C so[kBlock];
      for (std::int64_t i = b; i < e; i += kBlock) {
        std::int64_t m = std::min(kBlock, e - i);
        C* po = store_target<C>(out, i, so);
        for (std::int64_t j = 0; j < m; ++j) po[j] = v;
        store<C>(out, i, m, po);
      }
    });
  });
}

void CpuBackend::arange(Tensor& out, double start, double step) {
  const std::int64_t n = out.numel();
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = start + static_cast<double>(i) * step;
  detail::convert(v.data(), float64, out.data_ptr(), out.dtype(), v.size());
}

void CpuBackend::cast(const Tensor& x, Tensor& out) {
  const std::size_t in_size = itemsize(x.dtype()), out_size = itemsize(out.dtype());
  parallel_for(x.numel(), kGrain, [&](std::int64_t b, std::int64_t e) {
    detail::convert(static_cast<const char*>(x.data_ptr()) + b * in_size, x.dtype(),
                    static_cast<char*>(out.data_ptr()) + b * out_size, out.dtype(),
                    static_cast<std::size_t>(e - b));
  });
}

void CpuBackend::copy2d(Device, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                        std::size_t row_bytes, std::size_t rows) {
  if (row_bytes == 0 || rows == 0) return;  // empty tensors may have no memory at all
  if (row_bytes == dst_pitch && row_bytes == src_pitch) {
    std::memcpy(dst, src, row_bytes * rows);
    return;
  }
  for (std::size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                static_cast<const char*>(src) + r * src_pitch, row_bytes);
}

void CpuBackend::unary(UnaryOp op, const Tensor& x, Tensor& out, double param) {
  // The formulas are backend/common/unary_ops.hpp's, the CUDA kernels' too.
  common::with_unary_op(op, [&](auto o) {
    using OpT = decltype(o);  // a type, so the loops below need no capture
    constexpr UnaryOp Op = OpT::value;
    with_compute_type(x.dtype(), [&](auto c) {
      using C = decltype(c);
      if constexpr (Op == UnaryOp::Gelu && std::is_same_v<C, float>) {
        if (is_half(x.dtype()) && out.dtype() == x.dtype()) {
          const auto* px = static_cast<const std::uint16_t*>(x.data_ptr());
          auto* po = static_cast<std::uint16_t*>(out.data_ptr());
          const std::uint16_t* table = gelu16_table(x.dtype()).y.data();
          parallel_for(out.numel(), kGrain, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t i = b; i < e; ++i) po[i] = table[px[i]];
          });
          return;
        }
      }
      if constexpr (forward_on_lanes(Op) && std::is_same_v<C, float>) {
        map1_blocks<C>(x, out, [](const float* a, float* o, std::int64_t m) {
          constexpr UnaryOp F = OpT::value;
          isa_call_native<forward_block<F, 64>, forward_block<F, 32>, forward_block<F, 16>>(a, o, m);
        });
      } else if constexpr (std::is_floating_point_v<C> || common::unary_on_integers(Op))
        if constexpr (common::unary_takes_param(Op))
          map1<C>(x, out, [p = C(param)](C v) { return common::unary_apply<OpT::value>(v, p); });
        else  // no capture: the loop keeps nothing but the values in registers
          map1<C>(x, out, [](C v) { return common::unary_apply<OpT::value>(v, C(0)); });
      else
        fail("unary op ", common::unary_name(Op), ": not defined for ", to_string(x.dtype()));
    });
  });
}

void CpuBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy,
                                Tensor& dx, double param) {
  if (op == UnaryOp::Relu && is_half(x.dtype())) {
    const auto* px = static_cast<const std::uint16_t*>(x.data_ptr());
    const auto* pd = static_cast<const std::uint16_t*>(dy.data_ptr());
    auto* po = static_cast<std::uint16_t*>(dx.data_ptr());
    const bool bf = x.dtype() == bfloat16;
    parallel_for(dx.numel(), kGrain, [&](std::int64_t b, std::int64_t e) {
      if (bf) isa_call16<relu_backward_bits<0x7f80, 0x0040>>(px + b, pd + b, po + b, e - b);
      else isa_call16<relu_backward_bits<0x7c00, 0x0200>>(px + b, pd + b, po + b, e - b);
    });
    return;
  }
  common::with_unary_op(op, [&](auto o) {
    using OpT = decltype(o);
    with_compute_type(x.dtype(), [&](auto c) {
      using C = decltype(c);
      if constexpr (OpT::value == UnaryOp::Gelu && std::is_same_v<C, float>) {
        if (is_half(x.dtype()) && dy.dtype() == x.dtype() && dx.dtype() == x.dtype()) {
          gelu16_backward(x.dtype(), static_cast<const std::uint16_t*>(x.data_ptr()),
                          static_cast<const std::uint16_t*>(dy.data_ptr()), static_cast<std::uint16_t*>(dx.data_ptr()),
                          dx.numel());
          return;
        }
      }
      if constexpr (gradient_on_lanes(OpT::value) && std::is_same_v<C, float>) {
        map3_blocks<C>(x, y, dy, dx, [](const C* a, const C*, const C* d, C* o, std::int64_t m) {
          constexpr UnaryOp Op = OpT::value;
          isa_call_native<gradient_block<Op, 64>, gradient_block<Op, 32>, gradient_block<Op, 16>>(a, d, o, m);
        });
      } else if constexpr (std::is_floating_point_v<C>)
        if constexpr (common::unary_takes_param(OpT::value))
          map3<C>(x, y, dy, dx, [p = C(param)](C a, C out, C d) { return common::unary_grad<OpT::value>(a, out, d, p); });
        else
          map3<C>(x, y, dy, dx, [](C a, C out, C d) { return common::unary_grad<OpT::value>(a, out, d, C(0)); });
      else
        fail("unary backward: not defined for ", to_string(x.dtype()));
    });
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  if (a.dtype() == bfloat16 && b.dtype() == bfloat16 && out.dtype() == bfloat16 && a.shape() == out.shape() &&
      b.shape() == out.shape() && (op == BinaryOp::Add || op == BinaryOp::Sub || op == BinaryOp::Mul)) {
    const auto* pa = static_cast<const bf16_bits*>(a.data_ptr());
    const auto* pb = static_cast<const bf16_bits*>(b.data_ptr());
    auto* po = static_cast<bf16_bits*>(out.data_ptr());
    common::with_binary_op(op, [&](auto o) {
      using OpT = decltype(o);
      if constexpr (OpT::value == BinaryOp::Add || OpT::value == BinaryOp::Sub || OpT::value == BinaryOp::Mul)
        parallel_for(out.numel(), kGrain, [&](std::int64_t s, std::int64_t e) {
          isa_call_native<binary_bf16<OpT::value, 64>, binary_bf16<OpT::value, 32>, binary_bf16<OpT::value, 16>>(
              pa + s, pb + s, po + s, e - s);
        });
    });
    return;
  }
  with_compute_type(a.dtype(), [&](auto c) {
    using C = decltype(c);
    auto run = [&](auto f) {
      map_broadcast<C, 2>({&a, &b}, out, [&](auto& p, auto& s, std::int64_t m, C* o) {
        isa_call<binary_loop<C, decltype(f)>>(p, s, m, o, f);
      });
    };
    // The formulas are backend/common/binary_ops.hpp's, the CUDA kernels' too.
    common::with_binary_op(op, [&](auto o) {
      using OpT = decltype(o);  // a type, so the loop body needs no capture
      run([](C x, C y) { return common::binary_apply<OpT::value>(x, y); });
    });
  });
}

void CpuBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  with_compute_type(a.dtype(), [&](auto c) {
    using C = decltype(c);
    // The condition is loaded as C too (bool -> 0/1), so one plan serves all three operands.
    Tensor cc = cond;
    map_broadcast<C, 3>({&cc, &a, &b}, out, [](auto& p, auto& s, std::int64_t m, C* o) {
      for (std::int64_t j = 0; j < m; ++j)
        o[j] = p[0][j * s[0]] != C(0) ? p[1][j * s[1]] : p[2][j * s[2]];
    });
  });
}

namespace {
/// True when any element's exponent bits are all ones (inf or NaN): an integer test on the raw
/// bits, so it vectorises and needs no conversion of 16-bit data.
template <class Bits>
bool any_exponent_all_ones(const void* data, std::int64_t n, Bits mask) {
  const auto* p = static_cast<const Bits*>(data);
  std::atomic<bool> found{false};
  parallel_for(n, std::int64_t{1} << 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e && !found.load(std::memory_order_relaxed); i += 4096) {
      const std::int64_t end = std::min(e, i + 4096);
      Bits hit = 0;
      for (std::int64_t j = i; j < end; ++j) hit |= static_cast<Bits>((p[j] & mask) == mask);
      if (hit) found = true;
    }
  });
  return found;
}
}  // namespace

bool CpuBackend::has_nonfinite(const Tensor& x) {
  switch (x.dtype()) {
    case DType::Float32: return any_exponent_all_ones<std::uint32_t>(x.data_ptr(), x.numel(), 0x7f800000u);
    case DType::Float64: return any_exponent_all_ones<std::uint64_t>(x.data_ptr(), x.numel(), 0x7ff0000000000000ull);
    case DType::Float16: return any_exponent_all_ones<std::uint16_t>(x.data_ptr(), x.numel(), 0x7c00);
    case DType::BFloat16: return any_exponent_all_ones<std::uint16_t>(x.data_ptr(), x.numel(), 0x7f80);
    default: return false;
  }
}

void CpuBackend::one_hot(const Tensor& indices, Tensor& out) {
  fill(out, 0.0);
  const std::int64_t depth = out.shape().back(), n = indices.numel();
  std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
  detail::convert(indices.data_ptr(), indices.dtype(), idx.data(), int64, idx.size());
  const double one = 1.0;
  const std::size_t isz = itemsize(out.dtype());
  char* base = static_cast<char*>(out.data_ptr());
  for (std::int64_t i = 0; i < n; ++i)
    if (idx[i] >= 0 && idx[i] < depth)  // out-of-range indices give a zero row, as in Keras
      detail::convert(&one, float64, base + (i * depth + idx[i]) * isz, out.dtype(), 1);
}

}  // namespace mpt::cpu
