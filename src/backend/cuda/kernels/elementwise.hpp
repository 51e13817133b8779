#pragma once
// Kernel bodies of the elementwise ops (src/backend/cuda/elementwise.cu launches them; the tests
// run them on the host): fill, arange, cast, unary and its backward, broadcasting binary and
// where, has_nonfinite and one_hot.
//
// They mirror src/backend/cpu/elementwise.cpp bit for bit:
// - Conversions are src/core/convert.cpp's, element by element (convert_value): 16-bit NaNs keep
//   sign and payload and come out quiet (mpt/half.hpp's rule, where cuda_fp16's intrinsics give
//   a canonical NaN), double -> 16-bit rounds to odd in float first, float -> int truncates and
//   gives x86's "integer indefinite" for NaN and out-of-range values (what the CPU's cvttsd2si
//   does; C++ leaves it undefined), uint8 takes the low byte of that int32.
// - Arithmetic is in compute_t<T> (float, double, int64) with the CPU's operation order; the ew::
//   helpers are the round-to-nearest intrinsics on the device, which nvcc never contracts into
//   an fma (the CPU rounds a * b + c twice), and plain operators on the host.
// - Transcendentals are libm's on the host and CUDA's on the device: exp, log, tanh, erf and pow
//   may differ from the CPU by a few ulp there (CUDA documents 1-2 ulp for expf, logf, tanhf,
//   erff, powf); sqrt and everything else is exact.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/backend.hpp"
#include "backend/common/shape.hpp"
#include "backend/cuda/kernels/launch.hpp"
#include "backend/cuda/kernels/element_types.hpp"

namespace mpt::kernels {

namespace ew {

// Arithmetic that nvcc does not contract into fma: types.hpp's exact:: helpers.
using exact::add;
using exact::div;
using exact::mul;
using exact::sub;
// libm's functions on the host, CUDA's on the device (backend/common/unary_ops.hpp).
MPT_HOST_DEVICE inline float pow_(float a, float b) { return common::fn::pow(a, b); }
MPT_HOST_DEVICE inline double pow_(double a, double b) { return common::fn::pow(a, b); }

// ---- conversions of src/core/convert.cpp, one element ----------------------------------------
/// float16 / bfloat16 -> float32; NaNs come out quiet with sign and payload (mpt/half.hpp).
template <class T>
MPT_HOST_DEVICE inline float half_to_f32(T v) {
  return load(v);  // types.hpp keeps NaN sign and payload as the CPU does
}

/// float32 -> float16 / bfloat16, round to nearest even; NaNs as mpt/half.hpp (quiet, sign and
/// top payload bits kept).
template <class T>
MPT_HOST_DEVICE inline T f32_to_half(float f) {
  return store<T>(f);
}

/// float32 <-> float64 as x86's cvtss2sd / cvtsd2ss, NaN payloads included (CUDA's cvt gives a
/// canonical NaN).
MPT_HOST_DEVICE inline double f32_to_f64(float f) {
  const std::uint32_t x = bits_as<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return bits_as<double>((static_cast<std::uint64_t>(x & 0x80000000u) << 32) | 0x7ff8000000000000ull |
                           (static_cast<std::uint64_t>(x & 0x7fffffu) << 29));
  return static_cast<double>(f);
}
MPT_HOST_DEVICE inline float f64_to_f32(double d) {
  const std::uint64_t x = bits_as<std::uint64_t>(d);
  if ((x & 0x7fffffffffffffffull) > 0x7ff0000000000000ull)
    return bits_as<float>(static_cast<std::uint32_t>((x >> 32) & 0x80000000u) | 0x7fc00000u |
                          static_cast<std::uint32_t>((x >> 29) & 0x7fffffu));
  return static_cast<float>(d);
}

/// double -> float rounding to odd, so that the next rounding to 16 bits is that of v itself.
MPT_HOST_DEVICE inline float f64_to_f32_round_odd(double v) {
  float f = f64_to_f32(v);
  std::uint32_t b = bits_as<std::uint32_t>(f);
  if (!nonfinite(v) && static_cast<double>(f) != v && (b & 1u) == 0) {
    // One step towards v: away from zero when |v| > |f| (0 -> smallest subnormal, inf -> max).
    b = ::fabs(v) > ::fabs(static_cast<double>(f)) ? b + 1u : b - 1u;
    f = bits_as<float>(b);
  }
  return f;
}

/// double -> integer as x86-64's truncating conversion: NaN and values out of int32 (int64)
/// range give INT32_MIN (INT64_MIN); uint8 keeps the low byte of the int32 conversion.
using common::trunc_to_int;

template <class S>
MPT_HOST_DEVICE inline double to_double(S v) {
  if constexpr (is_half_v<S>) return f32_to_f64(half_to_f32(v));
  else if constexpr (std::is_same_v<S, float>) return f32_to_f64(v);
  else return static_cast<double>(v);
}

template <class D>
MPT_HOST_DEVICE inline D from_double(double v) {
  if constexpr (is_half_v<D>) return f32_to_half<D>(f64_to_f32_round_odd(v));
  else if constexpr (std::is_same_v<D, bool>) return v != 0.0;
  else if constexpr (std::is_same_v<D, float>) return f64_to_f32(v);
  else if constexpr (std::is_same_v<D, double>) return v;
  else return trunc_to_int<D>(v);
}

}  // namespace ew

/// One element of detail::convert(src dtype S -> dst dtype D), bit for bit.
template <class D, class S>
MPT_HOST_DEVICE inline D convert_value(S v) {
  if constexpr (std::is_same_v<D, S>) return v;
  else if constexpr (std::is_same_v<S, float> && is_half_v<D>) return ew::f32_to_half<D>(v);
  else if constexpr (is_half_v<S> && std::is_same_v<D, float>) return ew::half_to_f32(v);
  else if constexpr (is_half_v<S> && is_half_v<D>) return ew::f32_to_half<D>(ew::half_to_f32(v));
  else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, double>) return ew::f32_to_f64(v);
  else if constexpr (std::is_same_v<S, double> && std::is_same_v<D, float>) return ew::f64_to_f32(v);
  else if constexpr (std::is_integral_v<S> && std::is_integral_v<D> && !std::is_same_v<D, bool>)
    return static_cast<D>(v);  // modulo 2^bits, as the CPU's convert (never through a double)
  else return ew::from_double<D>(ew::to_double(v));
}

/// An element as its compute type, and a compute value stored as T, as the CPU's load/store.
template <class T>
MPT_HOST_DEVICE inline compute_t<T> load_exact(T v) { return convert_value<compute_t<T>>(v); }
template <class T, class C>
MPT_HOST_DEVICE inline T store_exact(C v) { return convert_value<T>(v); }

/// The element CpuBackend::fill writes for `value`: 16-bit rounds once from double, the other
/// dtypes go through their compute type (so fill(bool, 0.5) is false, as on the CPU).
template <class T>
inline T fill_value(double value) {
  if constexpr (is_half_v<T>) return convert_value<T>(value);
  else return convert_value<T>(convert_value<compute_t<T>>(value));
}

// ---- fill, arange, cast -------------------------------------------------------------------------
template <class T>
MPT_HOST_DEVICE void fill_body(const Thread& t, T* out, T v, std::int64_t n) {
  for (std::int64_t i = t.global(); i < n; i += t.stride()) out[i] = v;
}

/// out[i] = start + i * step in double (two roundings, as the CPU), then converted to T.
template <class T>
MPT_HOST_DEVICE void arange_body(const Thread& t, T* out, double start, double step, std::int64_t n) {
  for (std::int64_t i = t.global(); i < n; i += t.stride())
    out[i] = convert_value<T>(ew::add(start, ew::mul(static_cast<double>(i), step)));
}

template <class S, class D>
MPT_HOST_DEVICE void cast_body(const Thread& t, const S* x, D* out, std::int64_t n) {
  for (std::int64_t i = t.global(); i < n; i += t.stride()) out[i] = convert_value<D>(x[i]);
}

// ---- unary: the formulas are backend/common/unary_ops.hpp's, shared with the CPU ----------
using common::unary_apply;
using common::unary_grad;
using common::unary_on_integers;

/// param: the op's parameter (LeakyReLU's slope), converted to the compute type as the CPU does.
template <UnaryOp Op, class T>
MPT_HOST_DEVICE void unary_body(const Thread& t, const T* x, T* out, std::int64_t n, double param) {
  using C = decltype(load_exact(*x));
  const C p = static_cast<C>(param);
  for (std::int64_t i = t.global(); i < n; i += t.stride())
    out[i] = store_exact<T>(unary_apply<Op>(load_exact(x[i]), p));
}

template <UnaryOp Op, class T>
MPT_HOST_DEVICE void unary_backward_body(const Thread& t, const T* x, const T* y, const T* dy, T* dx,
                                         std::int64_t n, double param) {
  using C = decltype(load_exact(*x));
  const C p = static_cast<C>(param);
  for (std::int64_t i = t.global(); i < n; i += t.stride())
    dx[i] = store_exact<T>(unary_grad<Op>(load_exact(x[i]), load_exact(y[i]), load_exact(dy[i]), p));
}

// ---- broadcasting -------------------------------------------------------------------------------
constexpr int kMaxBroadcastDims = 12;

/// The output walked as collapsed dims (adjacent axes merged where every operand allows, size-1
/// axes dropped, as the CPU's BroadcastPlan); per operand a stride per dim, 0 where broadcast.
template <int K>
struct BroadcastGeom {
  int nd = 1;
  std::int64_t n = 0;       // output elements
  bool contiguous = false;  // every operand has the output's shape: index i everywhere
  std::int64_t dims[kMaxBroadcastDims] = {};
  std::int64_t strides[K][kMaxBroadcastDims] = {};

  /// Element offsets of every operand at output element i.
  MPT_HOST_DEVICE void offsets(std::int64_t i, std::int64_t (&off)[K]) const {
    for (int k = 0; k < K; ++k) off[k] = 0;
    for (int d = nd - 1; d >= 0; --d) {
      const std::int64_t idx = i % dims[d];
      i /= dims[d];
      for (int k = 0; k < K; ++k) off[k] += idx * strides[k][d];
    }
  }
};

/// The geometry of operands `in` broadcast to `out` (shapes already validated by src/ops).
template <int K>
BroadcastGeom<K> make_broadcast(const Shape& out, const std::array<const Shape*, K>& in) {
  const mpt::detail::CollapsedBroadcast<K> c = mpt::detail::collapse_broadcast<K>(out, in);
  const std::vector<std::int64_t>& dims = c.dims;
  const auto& strides = c.strides;
  MPT_CHECK(dims.size() <= static_cast<std::size_t>(kMaxBroadcastDims), "cuda broadcast: more than ",
            kMaxBroadcastDims, " dimensions after merging (", dims.size(), ")");
  BroadcastGeom<K> g;
  g.nd = static_cast<int>(dims.size());
  g.n = numel_of(out);
  g.contiguous = g.nd == 1;
  for (int d = 0; d < g.nd; ++d) {
    g.dims[d] = dims[d];
    for (int k = 0; k < K; ++k) {
      g.strides[k][d] = strides[k][d];
      if (strides[k][d] != 1) g.contiguous = false;
    }
  }
  return g;
}

// ---- binary and where ------------------------------------------------------------------------
// The formulas are backend/common/binary_ops.hpp's, shared with the CPU.
using common::binary_apply;
using common::is_comparison;

/// out = a op b broadcast (O: T, or bool for comparisons).
template <BinaryOp Op, class T, class O>
MPT_HOST_DEVICE void binary_body(const Thread& t, const T* a, const T* b, O* out, const BroadcastGeom<2>& g) {
  if (g.contiguous) {  // equal shapes: no index arithmetic
    for (std::int64_t i = t.global(); i < g.n; i += t.stride())
      out[i] = store_exact<O>(binary_apply<Op>(load_exact(a[i]), load_exact(b[i])));
    return;
  }
  for (std::int64_t i = t.global(); i < g.n; i += t.stride()) {
    std::int64_t off[2];
    g.offsets(i, off);
    out[i] = store_exact<O>(binary_apply<Op>(load_exact(a[off[0]]), load_exact(b[off[1]])));
  }
}

/// out = cond ? a : b broadcast; cond is bool read as bytes; a and b pass through the compute
/// type as on the CPU (a 16-bit signalling NaN comes out quiet).
template <class T>
MPT_HOST_DEVICE void where_body(const Thread& t, const std::uint8_t* cond, const T* a, const T* b, T* out,
                                const BroadcastGeom<3>& g) {
  for (std::int64_t i = t.global(); i < g.n; i += t.stride()) {
    std::int64_t off[3];
    if (g.contiguous) off[0] = off[1] = off[2] = i;
    else g.offsets(i, off);
    out[i] = store_exact<T>(cond[off[0]] != 0 ? load_exact(a[off[1]]) : load_exact(b[off[2]]));
  }
}

// ---- has_nonfinite, one_hot -----------------------------------------------------------------
/// Exponent bits all ones (inf or NaN), on the raw bits as the CPU.
template <class T>
MPT_HOST_DEVICE inline bool nonfinite_bits(T v) {
  if constexpr (std::is_same_v<T, __half>) return (kernels::bits_as<std::uint16_t>(v) & 0x7c00u) == 0x7c00u;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return (kernels::bits_as<std::uint16_t>(v) & 0x7f80u) == 0x7f80u;
  else return nonfinite(v);
}

/// Sets *flag = 1 when any element is inf or NaN (every writer stores the same value: an OR
/// reduction without atomics); the caller zeroes the flag first.
template <class T>
MPT_HOST_DEVICE void nonfinite_body(const Thread& t, const T* x, std::int64_t n, unsigned* flag) {
  bool hit = false;
  for (std::int64_t i = t.global(); i < n; i += t.stride()) hit |= nonfinite_bits(x[i]);
  if (hit) *flag = 1u;
}

/// out [n, depth] = (indices[i] == j): one pass, no separate fill; out-of-range indices give a
/// zero row, as the CPU.
template <class I, class O>
MPT_HOST_DEVICE void one_hot_body(const Thread& t, const I* indices, O* out, std::int64_t total, std::int64_t depth,
                                  O one, O zero) {
  for (std::int64_t e = t.global(); e < total; e += t.stride()) {
    const std::int64_t i = e / depth, j = e - i * depth;
    out[e] = static_cast<std::int64_t>(indices[i]) == j ? one : zero;
  }
}

}  // namespace mpt::kernels
