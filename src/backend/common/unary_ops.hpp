#pragma once
// Every elementwise unary op and activation, defined once for both backends: the table
// (MPT_UNARY_OPS, from which the UnaryOp enum, the names, the Keras activation lookup and its
// "valid:" list are generated), the forward and gradient formulas (unary_apply, unary_grad) as
// host-and-device templates in the compute type, and the dispatch from the run-time op to the
// compile-time one (with_unary_op). The CPU's loops (cpu/elementwise.cpp) and the CUDA kernel
// bodies (cuda/kernels/elementwise.hpp, which the tests also run on the host) instantiate the
// same functions, so a formula cannot differ between them; activations applied elsewhere
// (reference convolutions, GEMM epilogues) go through with_unary_op too.
//
// Adding an op (docs/design.md, "Add an elementwise op"): a row in MPT_UNARY_OPS, a branch in
// unary_apply and in unary_grad (a missing branch is a compile error, never another op's
// formula), its public function in ops, and its row in tests/ops/test_op_table.cpp.
//
// Arithmetic goes through exact:: so that nvcc does not contract a * b + c into an fma where the
// CPU rounds twice; transcendentals are libm's on the host and CUDA's on the device (a few ulp),
// except float32 GELU (forward and gradient), which is float_math.hpp's arithmetic everywhere: the
// CPU runs it on vector lanes (libm's erff, called per element, was a quarter of a GPT step).
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/common/host_device.hpp"

// X(enumerator, op name, Keras activation name or nullptr, defined on integers, gradient from
//   the output alone, parameter name or nullptr, parameter default)
// - Keras activation name: the string layers and ops::dense/conv2d accept (Dense(activation=...)).
// - gradient from the output alone: unary_grad reads only y (the x it gets may be y), so a GEMM
//   or convolution may apply the op in its epilogue and keep only its output for backward.
// - parameter: the op's one scalar argument (LeakyReLU's negative slope) and its default;
//   activations named by string always use the default, as Keras's activations do.
#define MPT_UNARY_OPS(X)                                                        \
  X(Linear, "linear", "linear", true, true, nullptr, 0.0)                       \
  X(Neg, "negative", nullptr, true, false, nullptr, 0.0)                        \
  X(Exp, "exp", "exponential", false, true, nullptr, 0.0)                       \
  X(Log, "log", nullptr, false, false, nullptr, 0.0)                            \
  X(Sqrt, "sqrt", nullptr, false, false, nullptr, 0.0)                          \
  X(Square, "square", nullptr, true, false, nullptr, 0.0)                       \
  X(Abs, "abs", nullptr, true, false, nullptr, 0.0)                             \
  X(Sign, "sign", nullptr, true, false, nullptr, 0.0)                           \
  X(Relu, "relu", "relu", true, true, nullptr, 0.0)                             \
  X(Relu6, "relu6", "relu6", false, true, nullptr, 0.0)                         \
  X(LeakyRelu, "leaky_relu", "leaky_relu", false, true, "negative_slope", 0.2)  \
  X(Sigmoid, "sigmoid", "sigmoid", false, true, nullptr, 0.0)                   \
  X(Tanh, "tanh", "tanh", false, true, nullptr, 0.0)                            \
  X(Gelu, "gelu", "gelu", false, false, nullptr, 0.0)                           \
  X(GeluTanh, "gelu_tanh", nullptr, false, false, nullptr, 0.0)                 \
  X(Silu, "silu", "silu", false, false, nullptr, 0.0)

namespace mpt {

#define MPT_UNARY_ENUM(o, name, keras, ints, from_output, param_name, param) o,
/// Elementwise unary ops; Linear (the identity) makes every activation one of them.
enum class UnaryOp : std::uint8_t { MPT_UNARY_OPS(MPT_UNARY_ENUM) };
#undef MPT_UNARY_ENUM
/// An activation (Dense's, Conv2D's, the Activation layer's) is the unary op of its name.
using Activation = UnaryOp;

}  // namespace mpt

namespace mpt::common {

#define MPT_UNARY_COUNT(o, name, keras, ints, from_output, param_name, param) +1
inline constexpr int kUnaryOpCount = 0 MPT_UNARY_OPS(MPT_UNARY_COUNT);
#undef MPT_UNARY_COUNT

/// One row of the table, readable at run time and at compile time.
struct UnaryInfo {
  const char* name;
  const char* keras;  ///< nullptr: not an activation
  bool on_integers;
  bool grad_from_output;
  const char* param_name;  ///< nullptr: the op takes no parameter
  double param;
};

inline constexpr UnaryInfo kUnaryInfo[] = {
#define MPT_UNARY_ROW(o, name, keras, ints, from_output, param_name, param) {name, keras, ints, from_output, param_name, param},
    MPT_UNARY_OPS(MPT_UNARY_ROW)
#undef MPT_UNARY_ROW
};
static_assert(sizeof(kUnaryInfo) / sizeof(kUnaryInfo[0]) == kUnaryOpCount);

constexpr const UnaryInfo& unary_info(UnaryOp op) { return kUnaryInfo[static_cast<int>(op)]; }
/// The op's name, as ops and error messages spell it.
constexpr const char* unary_name(UnaryOp op) { return unary_info(op).name; }
/// True for the ops defined on integer dtypes too (computed in int64).
constexpr bool unary_on_integers(UnaryOp op) { return unary_info(op).on_integers; }
/// True when unary_grad reads only the output: the op may run fused into an epilogue.
constexpr bool unary_grad_from_output(UnaryOp op) { return unary_info(op).grad_from_output; }
/// True for the ops with a parameter (the others ignore the one they are given).
constexpr bool unary_takes_param(UnaryOp op) { return unary_info(op).param_name != nullptr; }
/// The parameter an activation named by string uses.
constexpr double unary_default_param(UnaryOp op) { return unary_info(op).param; }

/// Calls f(std::integral_constant<UnaryOp, op>{}) for the run-time op; every enumerator has a
/// case (the compiler's -Wswitch says when one is missing). Always inlined, so that a CPU kernel
/// compiled for a tier (a GEMM's epilogue) gets f in its own instruction set, not a baseline copy.
template <class F>
__attribute__((always_inline)) inline decltype(auto) with_unary_op(UnaryOp op, F&& f) {
  switch (op) {
#define MPT_UNARY_CASE(o, name, keras, ints, from_output, param_name, param) \
  case UnaryOp::o: return f(std::integral_constant<UnaryOp, UnaryOp::o>{});
    MPT_UNARY_OPS(MPT_UNARY_CASE)
#undef MPT_UNARY_CASE
  }
  return f(std::integral_constant<UnaryOp, UnaryOp::Linear>{});  // unreachable: every op has a case
}

/// Calls f(std::integral_constant<UnaryOp, op>{}) for every op of the table, in order (tests
/// that cover every op loop over this, so a new row is tested without a new list).
template <class F>
void for_each_unary_op(F&& f) {
#define MPT_UNARY_VISIT(o, name, keras, ints, from_output, param_name, param) f(std::integral_constant<UnaryOp, UnaryOp::o>{});
  MPT_UNARY_OPS(MPT_UNARY_VISIT)
#undef MPT_UNARY_VISIT
}

/// The activation of a Keras name ("swish" is Keras's other name for silu); false when none.
inline bool activation_of_name(const std::string& name, Activation& act) {
  for (int i = 0; i < kUnaryOpCount; ++i)
    if (kUnaryInfo[i].keras != nullptr && name == kUnaryInfo[i].keras) {
      act = static_cast<Activation>(i);
      return true;
    }
  if (name == "swish") return act = Activation::Silu, true;
  return false;
}

/// "linear, exponential, relu, ...": every activation name, for "valid: ..." messages.
inline std::string activation_names() {
  std::string s;
  for (const UnaryInfo& r : kUnaryInfo)
    if (r.keras != nullptr) s += (s.empty() ? "" : ", ") + std::string(r.keras);
  return s + ", swish";
}

// ---- arithmetic both backends round the same way -------------------------------------------
namespace exact {
template <class C>
inline constexpr bool kWrapsAround = std::is_integral_v<C> && !std::is_same_v<C, bool>;
// Integer +, -, × wrap around modulo 2^bits (NumPy's result, and no undefined behaviour on
// overflow): computed modulo 2^64, then narrowed (modular since C++20).
template <class C>
MPT_HOST_DEVICE inline C wrap_add(C a, C b) {
  return static_cast<C>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}
template <class C>
MPT_HOST_DEVICE inline C wrap_sub(C a, C b) {
  return static_cast<C>(static_cast<std::uint64_t>(a) - static_cast<std::uint64_t>(b));
}
template <class C>
MPT_HOST_DEVICE inline C wrap_mul(C a, C b) {
  return static_cast<C>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
}
template <class C>
MPT_HOST_DEVICE inline C mul(C a, C b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>) return __fmul_rn(a, b);
  else if constexpr (std::is_same_v<C, double>) return __dmul_rn(a, b);
  else if constexpr (kWrapsAround<C>) return wrap_mul(a, b);
  else return a * b;
#else
  if constexpr (kWrapsAround<C>) return wrap_mul(a, b);
  else return a * b;
#endif
}
template <class C>
MPT_HOST_DEVICE inline C add(C a, C b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>) return __fadd_rn(a, b);
  else if constexpr (std::is_same_v<C, double>) return __dadd_rn(a, b);
  else if constexpr (kWrapsAround<C>) return wrap_add(a, b);
  else return a + b;
#else
  if constexpr (kWrapsAround<C>) return wrap_add(a, b);
  else return a + b;
#endif
}
template <class C>
MPT_HOST_DEVICE inline C sub(C a, C b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>) return __fsub_rn(a, b);
  else if constexpr (std::is_same_v<C, double>) return __dsub_rn(a, b);
  else if constexpr (kWrapsAround<C>) return wrap_sub(a, b);
  else return a - b;
#else
  if constexpr (kWrapsAround<C>) return wrap_sub(a, b);
  else return a - b;
#endif
}
template <class C>
MPT_HOST_DEVICE inline C div(C a, C b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>) return __fdiv_rn(a, b);  // IEEE even under fast math
  else if constexpr (std::is_same_v<C, double>) return __ddiv_rn(a, b);
  else return a / b;
#else
  return a / b;
#endif
}
/// -a; integers wrap (-INT64_MIN is INT64_MIN, as NumPy gives), floats flip the sign (-0 of +0).
template <class C>
MPT_HOST_DEVICE inline C neg(C a) {
  if constexpr (kWrapsAround<C>) return wrap_sub(C(0), a);
  else return -a;
}
MPT_HOST_DEVICE inline float sqrt(float v) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(v);
#else
  return std::sqrt(v);
#endif
}
MPT_HOST_DEVICE inline double sqrt(double v) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(v);
#else
  return std::sqrt(v);
#endif
}
}  // namespace exact

// libm's float functions on the host (what std::exp(float) calls), CUDA's on the device.
namespace fn {
MPT_HOST_DEVICE inline float exp(float v) { return ::expf(v); }
MPT_HOST_DEVICE inline double exp(double v) { return ::exp(v); }
MPT_HOST_DEVICE inline float log(float v) { return ::logf(v); }
MPT_HOST_DEVICE inline double log(double v) { return ::log(v); }
MPT_HOST_DEVICE inline float tanh(float v) { return ::tanhf(v); }
MPT_HOST_DEVICE inline double tanh(double v) { return ::tanh(v); }
MPT_HOST_DEVICE inline float erf(float v) { return ::erff(v); }
MPT_HOST_DEVICE inline double erf(double v) { return ::erf(v); }
MPT_HOST_DEVICE inline float pow(float a, float b) { return ::powf(a, b); }
MPT_HOST_DEVICE inline double pow(double a, double b) { return ::pow(a, b); }
}  // namespace fn
}  // namespace mpt::common

// float32 exp and GELU from arithmetic alone, one definition for scalars and vector lanes.
#include "backend/common/float_math.hpp"

namespace mpt::common {

// ---- the formulas ---------------------------------------------------------------------------
template <UnaryOp>
inline constexpr bool kNoFormula = false;

template <class C>
MPT_HOST_DEVICE inline C sigmoid(C v) {
  if constexpr (std::is_same_v<C, float>) return sigmoid_f32<ScalarOps>(v);
  else return exact::div(C(1), exact::add(C(1), fn::exp(C(-v))));
}
/// tanh: float_math's for float32 (the CPU's lanes run the same arithmetic), libm's for float64.
template <class C>
MPT_HOST_DEVICE inline C tanh_of(C v) {
  if constexpr (std::is_same_v<C, float>) return tanh_f32<ScalarOps>(v);
  else return fn::tanh(v);
}

/// d gelu / dx of the erf form: Φ(x) + x φ(x).
template <class C>
MPT_HOST_DEVICE inline C gelu_grad(C x) {
  if constexpr (std::is_same_v<C, float>) return gelu_grad_f32<ScalarOps>(x);
  const C cdf = exact::mul(C(0.5), exact::add(C(1), fn::erf(exact::mul(x, C(M_SQRT1_2)))));
  const C pdf = exact::mul(fn::exp(exact::mul(exact::mul(C(-0.5), x), x)), C(0.3989422804014327));
  return exact::add(cdf, exact::mul(x, pdf));
}

/// d gelu / dx of the tanh approximation: with u = √(2/π)(x + 0.044715 x³) and t = tanh(u),
/// 0.5 (1 + t) + 0.5 x (1 - t²) √(2/π)(1 + 3 · 0.044715 x²).
template <class C>
MPT_HOST_DEVICE inline C gelu_tanh_inner(C x) {
  const C x3 = exact::mul(exact::mul(x, x), x);
  return exact::mul(C(0.7978845608028654), exact::add(x, exact::mul(C(0.044715), x3)));
}
template <class C>
MPT_HOST_DEVICE inline C gelu_tanh_grad(C x) {
  if constexpr (std::is_same_v<C, float>) {
    return gelu_tanh_grad_f32<ScalarOps>(x);
  } else {
    const C t = fn::tanh(gelu_tanh_inner(x));
    const C du = exact::mul(C(0.7978845608028654),
                            exact::add(C(1), exact::mul(C(3 * 0.044715), exact::mul(x, x))));
    return exact::add(exact::mul(C(0.5), exact::add(C(1), t)),
                      exact::mul(exact::mul(exact::mul(C(0.5), x), exact::sub(C(1), exact::mul(t, t))), du));
  }
}

/// The op's forward value in the compute type C (float, double; int64 for unary_on_integers);
/// p is the op's parameter (unary_default_param unless the caller sets one).
template <UnaryOp Op, class C>
MPT_HOST_DEVICE inline C unary_apply(C v, [[maybe_unused]] C p) {
  if constexpr (Op == UnaryOp::Linear) return v;
  else if constexpr (Op == UnaryOp::Neg) return exact::neg(v);
  else if constexpr (Op == UnaryOp::Abs) return v < C(0) ? exact::neg(v) : v;
  else if constexpr (Op == UnaryOp::Square) return exact::mul(v, v);
  else if constexpr (Op == UnaryOp::Sign) return C((v > C(0)) - (v < C(0)));
  else if constexpr (Op == UnaryOp::Relu) return v > C(0) ? v : C(0);
  else if constexpr (Op == UnaryOp::Relu6) return v > C(0) ? (v < C(6) ? v : C(6)) : C(0);
  else if constexpr (Op == UnaryOp::LeakyRelu) return v >= C(0) ? v : exact::mul(p, v);
  else if constexpr (Op == UnaryOp::Exp) return fn::exp(v);
  else if constexpr (Op == UnaryOp::Log) return fn::log(v);
  else if constexpr (Op == UnaryOp::Sqrt) return exact::sqrt(v);
  else if constexpr (Op == UnaryOp::Sigmoid) return sigmoid(v);
  else if constexpr (Op == UnaryOp::Tanh) return tanh_of(v);
  else if constexpr (Op == UnaryOp::Gelu && std::is_same_v<C, float>) return gelu_f32<ScalarOps>(v);
  else if constexpr (Op == UnaryOp::Gelu)
    return exact::mul(exact::mul(C(0.5), v), exact::add(C(1), fn::erf(exact::mul(v, C(M_SQRT1_2)))));
  else if constexpr (Op == UnaryOp::GeluTanh && std::is_same_v<C, float>) return gelu_tanh_f32<ScalarOps>(v);
  else if constexpr (Op == UnaryOp::GeluTanh)
    return exact::mul(exact::mul(C(0.5), v), exact::add(C(1), fn::tanh(gelu_tanh_inner(v))));
  else if constexpr (Op == UnaryOp::Silu) return exact::mul(v, sigmoid(v));
  else static_assert(kNoFormula<Op>, "unary_apply: this op has no forward formula");
}

/// dx from x (a), the forward output y (o) and dy (d), each op reading x or y as the CPU always
/// has (float, double). Ops marked "gradient from the output alone" must give the same result
/// when a is y: fused epilogues keep only y.
template <UnaryOp Op, class C>
MPT_HOST_DEVICE inline C unary_grad(C a, C o, C d, [[maybe_unused]] C p) {
  if constexpr (Op == UnaryOp::Linear) return d;
  else if constexpr (Op == UnaryOp::Neg) return C(-d);
  else if constexpr (Op == UnaryOp::Abs) return exact::mul(C((a > 0) - (a < 0)), d);
  else if constexpr (Op == UnaryOp::Square) return exact::mul(exact::mul(C(2), a), d);
  else if constexpr (Op == UnaryOp::Sign) return C(0);
  else if constexpr (Op == UnaryOp::Relu) return a > C(0) ? d : C(0);
  else if constexpr (Op == UnaryOp::Relu6) return a > C(0) && a < C(6) ? d : C(0);
  else if constexpr (Op == UnaryOp::LeakyRelu) return a > C(0) ? d : exact::mul(p, d);
  else if constexpr (Op == UnaryOp::Exp) return exact::mul(o, d);
  else if constexpr (Op == UnaryOp::Log) return exact::div(d, a);
  else if constexpr (Op == UnaryOp::Sqrt) return exact::div(d, exact::mul(C(2), o));
  else if constexpr (Op == UnaryOp::Sigmoid) return exact::mul(exact::mul(d, o), exact::sub(C(1), o));
  else if constexpr (Op == UnaryOp::Tanh) return exact::mul(d, exact::sub(C(1), exact::mul(o, o)));
  else if constexpr (Op == UnaryOp::Gelu) return exact::mul(d, gelu_grad(a));
  else if constexpr (Op == UnaryOp::GeluTanh) return exact::mul(d, gelu_tanh_grad(a));
  else if constexpr (Op == UnaryOp::Silu && std::is_same_v<C, float>) return exact::mul(d, silu_grad_f32<ScalarOps>(a));
  else if constexpr (Op == UnaryOp::Silu) {
    const C s = sigmoid(a);
    return exact::mul(d, exact::add(s, exact::mul(exact::mul(a, s), exact::sub(C(1), s))));
  } else {
    static_assert(kNoFormula<Op>, "unary_grad: this op has no gradient formula");
  }
}

/// An activation applied to one value with its default parameter, for code that applies it
/// element by element outside the vectorised loops (reference convolutions and GEMMs).
template <class C>
inline C activate(Activation act, C v) {
  return with_unary_op(act, [v, act](auto o) -> C {
    return unary_apply<decltype(o)::value>(v, C(unary_default_param(act)));
  });
}

}  // namespace mpt::common
