#pragma once
// Every broadcasting binary op, defined once for both backends as unary_ops.hpp does for the
// unary ones: the table (MPT_BINARY_OPS, from which the BinaryOp enum, the names and the
// comparison set are generated), the formulas (binary_apply, host-and-device, in the compute
// type) and the dispatch (with_binary_op). The CPU's broadcast loops (cpu/elementwise.cpp) and
// the CUDA kernel bodies (cuda/kernels/elementwise.hpp) instantiate the same binary_apply.
//
// Adding one: a row here, a branch in binary_apply (a missing branch does not compile), its
// public function in ops (ops.hpp, ops/elementwise.cpp) and its gradient there.
#include <cstdint>
#include <type_traits>

#include "backend/common/unary_ops.hpp"  // exact::, fn::

// X(enumerator, op name, comparison: the result is bool)
#define MPT_BINARY_OPS(X)             \
  X(Add, "add", false)                \
  X(Sub, "subtract", false)           \
  X(Mul, "multiply", false)           \
  X(Div, "divide", false)             \
  X(Pow, "power", false)              \
  X(Maximum, "maximum", false)        \
  X(Minimum, "minimum", false)        \
  X(Equal, "equal", true)             \
  X(NotEqual, "not_equal", true)      \
  X(Less, "less", true)               \
  X(LessEqual, "less_equal", true)    \
  X(Greater, "greater", true)         \
  X(GreaterEqual, "greater_equal", true)

namespace mpt {

#define MPT_BINARY_ENUM(o, name, cmp) o,
enum class BinaryOp : std::uint8_t { MPT_BINARY_OPS(MPT_BINARY_ENUM) };
#undef MPT_BINARY_ENUM

}  // namespace mpt

namespace mpt::common {

/// The op's name, as Keras's ops spell it.
constexpr const char* binary_name(BinaryOp op) {
  switch (op) {
#define MPT_BINARY_NAME(o, name, cmp) \
  case BinaryOp::o: return name;
    MPT_BINARY_OPS(MPT_BINARY_NAME)
#undef MPT_BINARY_NAME
  }
  return "?";
}

/// True for the comparisons, whose output is bool.
constexpr bool is_comparison(BinaryOp op) {
  switch (op) {
#define MPT_BINARY_CMP(o, name, cmp) \
  case BinaryOp::o: return cmp;
    MPT_BINARY_OPS(MPT_BINARY_CMP)
#undef MPT_BINARY_CMP
  }
  return false;
}

/// Calls f(std::integral_constant<BinaryOp, op>{}) for the run-time op (one kernel per op).
template <class F>
decltype(auto) with_binary_op(BinaryOp op, F&& f) {
  switch (op) {
#define MPT_BINARY_CASE(o, name, cmp) \
  case BinaryOp::o: return f(std::integral_constant<BinaryOp, BinaryOp::o>{});
    MPT_BINARY_OPS(MPT_BINARY_CASE)
#undef MPT_BINARY_CASE
  }
  return f(std::integral_constant<BinaryOp, BinaryOp::Add>{});  // unreachable: every op has a case
}

/// Calls f(std::integral_constant<BinaryOp, op>{}) for every op of the table, in order.
template <class F>
void for_each_binary_op(F&& f) {
#define MPT_BINARY_VISIT(o, name, cmp) f(std::integral_constant<BinaryOp, BinaryOp::o>{});
  MPT_BINARY_OPS(MPT_BINARY_VISIT)
#undef MPT_BINARY_VISIT
}

/// double -> integer as x86's cvttsd2si: truncation; NaN and values out of the int32 (int64)
/// range give INT32_MIN (INT64_MIN); narrower types keep the low bits of the int32 conversion.
template <class D>
MPT_HOST_DEVICE inline D trunc_to_int(double v) {
  if constexpr (std::is_same_v<D, std::int64_t>) {
    return (v >= -0x1p63 && v < 0x1p63) ? static_cast<std::int64_t>(v) : INT64_MIN;
  } else {
    const std::int32_t r = (v > -2147483649.0 && v < 2147483648.0) ? static_cast<std::int32_t>(v) : INT32_MIN;
    return static_cast<D>(r);
  }
}

template <BinaryOp>
inline constexpr bool kNoBinaryFormula = false;

/// The op on two values of the compute type C (float, double, int64); comparisons give C(0) or
/// C(1). Integer division by zero gives 0 and INT_MIN / -1 gives INT_MIN (NumPy's results; ops
/// check nothing per element); integer +, -, × wrap around.
template <BinaryOp Op, class C>
MPT_HOST_DEVICE inline C binary_apply(C x, C y) {
  if constexpr (Op == BinaryOp::Add) return exact::add(x, y);
  else if constexpr (Op == BinaryOp::Sub) return exact::sub(x, y);
  else if constexpr (Op == BinaryOp::Mul) return exact::mul(x, y);
  else if constexpr (Op == BinaryOp::Div) {
    if constexpr (std::is_floating_point_v<C>) return exact::div(x, y);
    else return y == 0 ? C(0) : y == C(-1) ? exact::neg(x) : C(x / y);  // MIN / -1 wraps to MIN
  } else if constexpr (Op == BinaryOp::Pow) {
    if constexpr (std::is_floating_point_v<C>) return fn::pow(x, y);
    else return trunc_to_int<C>(fn::pow(static_cast<double>(x), static_cast<double>(y)));
  }
  else if constexpr (Op == BinaryOp::Maximum) return (x > y || x != x) ? x : y;  // NaN propagates
  else if constexpr (Op == BinaryOp::Minimum) return (x < y || x != x) ? x : y;
  else if constexpr (Op == BinaryOp::Equal) return C(x == y);
  else if constexpr (Op == BinaryOp::NotEqual) return C(x != y);
  else if constexpr (Op == BinaryOp::Less) return C(x < y);
  else if constexpr (Op == BinaryOp::LessEqual) return C(x <= y);
  else if constexpr (Op == BinaryOp::Greater) return C(x > y);
  else if constexpr (Op == BinaryOp::GreaterEqual) return C(x >= y);
  else static_assert(kNoBinaryFormula<Op>, "binary_apply: this op has no formula");
}

}  // namespace mpt::common
