#pragma once
// The arithmetic of the image resampling op (ops::affine_transform, ops::resize), one definition
// for the CPU backend and the CUDA kernel: for each output pixel, the source pixels it reads
// ("taps") with their weights, and the weighted sum over them. Keras's semantics
// (keras.ops.image.affine_transform, whose map_coordinates follows SciPy's): output pixel (y, x)
// samples the input at
//   x' = (a0·x + a1·y + a2) / k,  y' = (b0·x + b1·y + b2) / k,  k = c0·x + c1·y + 1
// on the integer pixel grid (pixel centres at integers), bilinearly (floor and the two
// neighbours, weights 1 - f and f per axis) or at the nearest pixel (round half to even); a
// source index outside the image is mapped back in by the fill mode (Keras's index fixers), or,
// with "constant", contributes fill_value. Every rounding goes through exact:: (no contraction
// into FMAs on either side), so the two backends give the same bits.
#include <cmath>
#include <cstdint>

#include "backend/common/host_device.hpp"
#include "backend/common/unary_ops.hpp"  // exact::

namespace mpt::common {

enum class Interpolation : std::uint8_t { Nearest, Bilinear };
/// Keras's fill modes: constant (fill_value), nearest (a a a | a b c d | d d d),
/// wrap (a b c d | a b c d | a b c d), mirror (d c b | a b c d | c b a),
/// reflect (c b a | a b c d | d c b).
enum class FillMode : std::uint8_t { Constant, Nearest, Wrap, Mirror, Reflect };

/// How an image is resampled (the backend's parameters for affine_transform).
struct ImageTransform {
  Interpolation interpolation = Interpolation::Bilinear;
  FillMode fill_mode = FillMode::Constant;
  double fill_value = 0.0;
};

namespace image {

/// a mod m in [0, m) for m > 0 (Python's %).
MPT_HOST_DEVICE inline std::int64_t floor_mod(std::int64_t a, std::int64_t m) {
  const std::int64_t r = a % m;
  return r < 0 ? r + m : r;
}

/// The triangular wave of Keras's _mirror_index_fixer: |((i + s) mod 2s) - s|, s = n - 1.
MPT_HOST_DEVICE inline std::int64_t mirror_index(std::int64_t i, std::int64_t n) {
  if (n <= 1) return 0;
  const std::int64_t s = n - 1, r = floor_mod(i + s, 2 * s) - s;
  return r < 0 ? -r : r;
}

/// Index i of an axis of n pixels mapped into [0, n) by the fill mode; "constant" clamps (the
/// tap is then invalid and reads nothing).
MPT_HOST_DEVICE inline std::int64_t fix_index(std::int64_t i, std::int64_t n, FillMode mode) {
  switch (mode) {
    case FillMode::Wrap: return floor_mod(i, n);
    case FillMode::Mirror: return mirror_index(i, n);
    // mirror(2i + 1, 2n + 1) is odd, so the halving is exact: (m - 1) / 2 in [0, n).
    case FillMode::Reflect: return (mirror_index(2 * i + 1, 2 * n + 1) - 1) / 2;
    default: return i < 0 ? 0 : (i >= n ? n - 1 : i);
  }
}

/// A coordinate's integer part for indexing, kept within ±2^40 (so the fill-mode arithmetic
/// cannot overflow; any such index is far outside every image); NaN goes to the lower end.
template <class C>
MPT_HOST_DEVICE inline std::int64_t index_of(C v) {
  constexpr C kLimit = C(1099511627776.0);  // 2^40
  if (!(v > -kLimit)) return -1099511627776;
  if (v > kLimit) return 1099511627776;
  return static_cast<std::int64_t>(v);
}

/// The source pixels of one output pixel: up to 4 (pixel offset in the image, weight,
/// whether it reads the image or stands for fill_value).
template <class C>
struct Taps {
  std::int64_t pixel[4];
  C weight[4];
  bool inside[4];
  int count;
};

/// One axis's nodes: (index, weight) pairs before fixing.
template <class C>
struct Nodes {
  std::int64_t index[2];
  C weight[2];
  int count;
};

template <class C>
MPT_HOST_DEVICE inline Nodes<C> nodes(C coordinate, Interpolation interpolation) {
  Nodes<C> n{};
  if (interpolation == Interpolation::Nearest) {
    if constexpr (sizeof(C) == 4) n.index[0] = index_of<C>(::rintf(coordinate));  // half to even, as torch.round
    else n.index[0] = index_of<C>(::rint(coordinate));
    n.weight[0] = C(1);
    n.count = 1;
    return n;
  }
  C lower;
  if constexpr (sizeof(C) == 4) lower = ::floorf(coordinate);
  else lower = ::floor(coordinate);
  const C upper_weight = exact::sub(coordinate, lower);
  n.index[0] = index_of<C>(lower);
  n.index[1] = n.index[0] + 1;
  n.weight[0] = exact::sub(C(1), upper_weight);
  n.weight[1] = upper_weight;
  n.count = 2;
  return n;
}

/// The taps of output pixel (y, x) of an image of h × w pixels under transform t (8 values:
/// a0 a1 a2 b0 b1 b2 c0 c1), in Keras's order (source row nodes outer, column nodes inner).
template <class C>
MPT_HOST_DEVICE inline Taps<C> taps(const C* t, std::int64_t y, std::int64_t x, std::int64_t h, std::int64_t w,
                                    Interpolation interpolation, FillMode mode) {
  const C xf = static_cast<C>(x), yf = static_cast<C>(y);
  C sx = exact::add(exact::add(exact::mul(t[0], xf), exact::mul(t[1], yf)), t[2]);
  C sy = exact::add(exact::add(exact::mul(t[3], xf), exact::mul(t[4], yf)), t[5]);
  if (t[6] != C(0) || t[7] != C(0)) {  // projective: divide by k (k = 1 for every affine transform)
    const C k = exact::add(exact::add(exact::mul(t[6], xf), exact::mul(t[7], yf)), C(1));
    sx = exact::div(sx, k);
    sy = exact::div(sy, k);
  }
  const Nodes<C> ny = nodes(sy, interpolation), nx = nodes(sx, interpolation);
  Taps<C> out{};
  out.count = 0;
  for (int i = 0; i < ny.count; ++i)
    for (int j = 0; j < nx.count; ++j) {
      const std::int64_t iy = ny.index[i], ix = nx.index[j];
      const int k = out.count++;
      out.inside[k] = mode != FillMode::Constant || (iy >= 0 && iy < h && ix >= 0 && ix < w);
      out.pixel[k] = fix_index(iy, h, mode) * w + fix_index(ix, w, mode);
      out.weight[k] = exact::mul(ny.weight[i], nx.weight[j]);
    }
  return out;
}

/// Σ weight · (inside ? value : fill) over the taps, in their order; load(pixel) reads the
/// channel being computed at that pixel, in C.
template <class C, class Load>
MPT_HOST_DEVICE inline C blend(const Taps<C>& tp, C fill, Load&& load) {
  C acc = exact::mul(tp.weight[0], tp.inside[0] ? load(tp.pixel[0]) : fill);
  for (int k = 1; k < tp.count; ++k) acc = exact::add(acc, exact::mul(tp.weight[k], tp.inside[k] ? load(tp.pixel[k]) : fill));
  return acc;
}

}  // namespace image
}  // namespace mpt::common
