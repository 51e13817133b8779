#pragma once
// Every elementwise unary op, defined once for both backends: the table (MPT_UNARY_OPS), the
// forward and gradient formulas (unary_apply, unary_grad) as host-and-device templates in the
// compute type, and the dispatch from the run-time op to the compile-time one (with_unary_op).
// The CPU's loops (cpu/elementwise.cpp) and the CUDA kernel bodies (cuda/kernels/elementwise.hpp,
// which the tests also run on the host) instantiate the same functions, so a formula cannot
// differ between them; activations written elsewhere (reference convolutions, GEMM epilogues)
// call unary_value.
//
// Adding an op: a row in MPT_UNARY_OPS, its enumerator in backend.hpp's UnaryOp (same place: a
// static_assert below compares the orders), a branch in unary_apply and in unary_grad (a missing
// branch is a compile error, never another op's formula), and its public function in ops.
//
// Arithmetic goes through exact:: so that nvcc does not contract a * b + c into an fma where the
// CPU rounds twice; transcendentals are libm's on the host and CUDA's on the device (a few ulp).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/backend.hpp"
#include "backend/common/host_device.hpp"

namespace mpt::common {

// X(enumerator, name, defined on integers): one row per UnaryOp, in the enum's order.
#define MPT_UNARY_OPS(X)    \
  X(Neg, "negative", true)  \
  X(Exp, "exp", false)      \
  X(Log, "log", false)      \
  X(Sqrt, "sqrt", false)    \
  X(Square, "square", true) \
  X(Abs, "abs", true)       \
  X(Relu, "relu", true)     \
  X(Sigmoid, "sigmoid", false) \
  X(Tanh, "tanh", false)    \
  X(Gelu, "gelu", false)    \
  X(Silu, "silu", false)    \
  X(Sign, "sign", true)

namespace detail {
#define MPT_UNARY_INDEX(op, name, ints) UnaryOp::op,
inline constexpr UnaryOp kUnaryOrder[] = {MPT_UNARY_OPS(MPT_UNARY_INDEX)};
#undef MPT_UNARY_INDEX
constexpr bool table_matches_enum() {
  for (std::size_t i = 0; i < sizeof(kUnaryOrder) / sizeof(kUnaryOrder[0]); ++i)
    if (static_cast<std::size_t>(kUnaryOrder[i]) != i) return false;
  return true;
}
}  // namespace detail
static_assert(detail::table_matches_enum(), "MPT_UNARY_OPS must list UnaryOp's enumerators in order");
inline constexpr int kUnaryOpCount = sizeof(detail::kUnaryOrder) / sizeof(detail::kUnaryOrder[0]);
static_assert(static_cast<int>(UnaryOp::Sign) == kUnaryOpCount - 1, "UnaryOp has an op MPT_UNARY_OPS lacks");

/// The op's name, as ops and error messages spell it.
constexpr const char* unary_name(UnaryOp op) {
  switch (op) {
#define MPT_UNARY_NAME(o, name, ints) \
  case UnaryOp::o: return name;
    MPT_UNARY_OPS(MPT_UNARY_NAME)
#undef MPT_UNARY_NAME
  }
  return "?";
}

/// True for the ops defined on integer dtypes too (computed in int64).
constexpr bool unary_on_integers(UnaryOp op) {
  switch (op) {
#define MPT_UNARY_INTS(o, name, ints) \
  case UnaryOp::o: return ints;
    MPT_UNARY_OPS(MPT_UNARY_INTS)
#undef MPT_UNARY_INTS
  }
  return false;
}

/// Calls f(std::integral_constant<UnaryOp, op>{}) for the run-time op; every enumerator has a
/// case (the compiler's -Wswitch says when one is missing).
template <class F>
decltype(auto) with_unary_op(UnaryOp op, F&& f) {
  switch (op) {
#define MPT_UNARY_CASE(o, name, ints) \
  case UnaryOp::o: return f(std::integral_constant<UnaryOp, UnaryOp::o>{});
    MPT_UNARY_OPS(MPT_UNARY_CASE)
#undef MPT_UNARY_CASE
  }
  return f(std::integral_constant<UnaryOp, UnaryOp::Neg>{});  // unreachable: every op has a case
}

/// Calls f(std::integral_constant<UnaryOp, op>{}) for every op of the table, in order (tests
/// that cover every op loop over this, so a new row is tested without a new list).
template <class F>
void for_each_unary_op(F&& f) {
#define MPT_UNARY_VISIT(o, name, ints) f(std::integral_constant<UnaryOp, UnaryOp::o>{});
  MPT_UNARY_OPS(MPT_UNARY_VISIT)
#undef MPT_UNARY_VISIT
}

// ---- arithmetic both backends round the same way -------------------------------------------
namespace exact {
template <class C>
MPT_HOST_DEVICE inline C mul(C a, C b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>) return __fmul_rn(a, b);
  else if constexpr (std::is_same_v<C, double>) return __dmul_rn(a, b);
  else return a * b;
#else
  return a * b;
#endif
}
template <class C>
MPT_HOST_DEVICE inline C add(C a, C b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>) return __fadd_rn(a, b);
  else if constexpr (std::is_same_v<C, double>) return __dadd_rn(a, b);
  else return a + b;
#else
  return a + b;
#endif
}
template <class C>
MPT_HOST_DEVICE inline C sub(C a, C b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>) return __fsub_rn(a, b);
  else if constexpr (std::is_same_v<C, double>) return __dsub_rn(a, b);
  else return a - b;
#else
  return a - b;
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

// ---- the formulas ---------------------------------------------------------------------------
template <UnaryOp>
inline constexpr bool kNoFormula = false;

template <class C>
MPT_HOST_DEVICE inline C sigmoid(C v) { return exact::div(C(1), exact::add(C(1), fn::exp(C(-v)))); }

/// d gelu / dx of the erf form: Φ(x) + x φ(x).
template <class C>
MPT_HOST_DEVICE inline C gelu_grad(C x) {
  const C cdf = exact::mul(C(0.5), exact::add(C(1), fn::erf(exact::mul(x, C(M_SQRT1_2)))));
  const C pdf = exact::mul(fn::exp(exact::mul(exact::mul(C(-0.5), x), x)), C(0.3989422804014327));
  return exact::add(cdf, exact::mul(x, pdf));
}

/// The op's forward value in the compute type C (float, double; int64 for unary_on_integers).
template <UnaryOp Op, class C>
MPT_HOST_DEVICE inline C unary_apply(C v) {
  if constexpr (Op == UnaryOp::Neg) return C(-v);
  else if constexpr (Op == UnaryOp::Abs) return v < C(0) ? C(-v) : v;
  else if constexpr (Op == UnaryOp::Square) return exact::mul(v, v);
  else if constexpr (Op == UnaryOp::Sign) return C((v > C(0)) - (v < C(0)));
  else if constexpr (Op == UnaryOp::Relu) return v > C(0) ? v : C(0);
  else if constexpr (Op == UnaryOp::Exp) return fn::exp(v);
  else if constexpr (Op == UnaryOp::Log) return fn::log(v);
  else if constexpr (Op == UnaryOp::Sqrt) return exact::sqrt(v);
  else if constexpr (Op == UnaryOp::Sigmoid) return sigmoid(v);
  else if constexpr (Op == UnaryOp::Tanh) return fn::tanh(v);
  else if constexpr (Op == UnaryOp::Gelu)
    return exact::mul(exact::mul(C(0.5), v), exact::add(C(1), fn::erf(exact::mul(v, C(M_SQRT1_2)))));
  else if constexpr (Op == UnaryOp::Silu) return exact::mul(v, sigmoid(v));
  else static_assert(kNoFormula<Op>, "unary_apply: this op has no forward formula");
}

/// dx from x (a), the forward output y (o) and dy (d), each op reading x or y as the CPU always
/// has (float, double).
template <UnaryOp Op, class C>
MPT_HOST_DEVICE inline C unary_grad(C a, C o, C d) {
  if constexpr (Op == UnaryOp::Neg) return C(-d);
  else if constexpr (Op == UnaryOp::Abs) return exact::mul(C((a > 0) - (a < 0)), d);
  else if constexpr (Op == UnaryOp::Square) return exact::mul(exact::mul(C(2), a), d);
  else if constexpr (Op == UnaryOp::Sign) return C(0);
  else if constexpr (Op == UnaryOp::Relu) return a > C(0) ? d : C(0);
  else if constexpr (Op == UnaryOp::Exp) return exact::mul(o, d);
  else if constexpr (Op == UnaryOp::Log) return exact::div(d, a);
  else if constexpr (Op == UnaryOp::Sqrt) return exact::div(d, exact::mul(C(2), o));
  else if constexpr (Op == UnaryOp::Sigmoid) return exact::mul(exact::mul(d, o), exact::sub(C(1), o));
  else if constexpr (Op == UnaryOp::Tanh) return exact::mul(d, exact::sub(C(1), exact::mul(o, o)));
  else if constexpr (Op == UnaryOp::Gelu) return exact::mul(d, gelu_grad(a));
  else if constexpr (Op == UnaryOp::Silu) {
    const C s = sigmoid(a);
    return exact::mul(d, exact::add(s, exact::mul(exact::mul(a, s), exact::sub(C(1), s))));
  } else {
    static_assert(kNoFormula<Op>, "unary_grad: this op has no gradient formula");
  }
}

/// unary_apply for a run-time op, for the code that applies an activation element by element
/// outside the vectorised loops (reference convolutions, GEMM epilogues).
template <class C>
inline C unary_value(UnaryOp op, C v) {
  return with_unary_op(op, [v](auto o) -> C { return unary_apply<decltype(o)::value>(v); });
}

/// An activation applied to one value (Linear: v itself), with the ops' formulas.
template <class C>
inline C activate(Activation act, C v) {
  switch (act) {
    case Activation::Linear: return v;
    case Activation::Relu: return unary_apply<UnaryOp::Relu>(v);
    case Activation::Sigmoid: return unary_apply<UnaryOp::Sigmoid>(v);
    case Activation::Tanh: return unary_apply<UnaryOp::Tanh>(v);
    case Activation::Gelu: return unary_apply<UnaryOp::Gelu>(v);
    case Activation::Silu: return unary_apply<UnaryOp::Silu>(v);
  }
  return v;
}

}  // namespace mpt::common
