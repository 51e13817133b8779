#pragma once
// Kernel bodies of max and average pooling over NHWC (src/backend/cuda/pool.cu launches them;
// the tests run them on the host). The CUDA twin of src/backend/cpu/pool.cpp, with its rules:
//
// - Windows are clipped to the image; average pooling divides by the clipped count (padding
//   left out of the mean). 16-bit values are summed in float32, float64 in float64.
// - Max pooling: the first maximum in row-major window order wins ties (-0 and +0 tie), and a
//   NaN wins over everything (the last NaN of the window), so overflows stay visible to loss
//   scaling. The output is the winner's own value (a 16-bit NaN comes out quiet, as the CPU's).
// - Workspace (training), the CPU's layout: one uint16 per output element, the winner's
//   position (wy * pool_w + wx) in the unclipped window (0 when nothing beat -inf).
// - Backward is a gather: one thread per dx element sums, in (oy, ox) order, the dy of the
//   windows that hold it (max: only windows whose recorded winner it is), the order in which the
//   CPU scatters, so the float32 sums are bit-equal and the result deterministic. When windows do
//   not overlap (stride >= pool) each element has at most one window and takes its value
//   directly, as the CPU's direct path does (max: dy's own bits).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cuda/kernels/launch.hpp"
#include "backend/cuda/kernels/element_types.hpp"

namespace mpt::kernels {

struct PoolDims {
  std::int64_t n, h, w, c, oh, ow;
  std::int64_t pool_h, pool_w, stride_h, stride_w, pad_top, pad_left;
  bool max;     ///< max pooling (else average)
  bool direct;  ///< windows do not overlap (backward)
};

/// Rows [y0, y1) and columns [x0, x1) of window (oy, ox) inside the image, and its unclipped origin.
struct PoolWindow {
  std::int64_t y0, y1, x0, x1, wy, wx;
};

MPT_HOST_DEVICE inline PoolWindow pool_window(const PoolDims& d, std::int64_t oy, std::int64_t ox) {
  const std::int64_t wy = oy * d.stride_h - d.pad_top, wx = ox * d.stride_w - d.pad_left;
  return {wy > 0 ? wy : 0, wy + d.pool_h < d.h ? wy + d.pool_h : d.h,
          wx > 0 ? wx : 0, wx + d.pool_w < d.w ? wx + d.pool_w : d.w, wy, wx};
}

/// a * b + c rounded twice, as the CPU computes it: nvcc would fuse it into one fma on the device.
MPT_HOST_DEVICE inline float mul_add_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(a, b), c);
#else
  return a * b + c;
#endif
}
MPT_HOST_DEVICE inline double mul_add_rn(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(__dmul_rn(a, b), c);
#else
  return a * b + c;
#endif
}

/// -inf as T.
template <class T>
MPT_HOST_DEVICE inline T neg_inf() {
  return store<T>(-compute_t<T>(INFINITY));
}

/// A NaN of a 16-bit type with its quiet bit set (kept as is for float32/float64).
template <class T>
MPT_HOST_DEVICE inline T quiet(T v) {
  if constexpr (is_half_v<T>) {
    const auto b = bits_as<std::uint16_t>(v);
    v = bits_as<T>(static_cast<std::uint16_t>(b | (std::is_same_v<T, __half> ? 0x0200 : 0x0040)));
  }
  return v;
}

/// y [N,OH,OW,C] from x [N,H,W,C]; ws (uint16 per output element) written when not null.
template <class T>
MPT_HOST_DEVICE void pool_forward_body(const Thread& t, const T* x, T* y, std::uint16_t* ws, PoolDims d) {
  using C = compute_t<T>;
  const std::int64_t total = d.n * d.oh * d.ow * d.c;
  for (std::int64_t o = t.global(); o < total; o += t.stride()) {
    const std::int64_t c = o % d.c, ox = (o / d.c) % d.ow, oy = (o / (d.c * d.ow)) % d.oh,
                       n = o / (d.c * d.ow * d.oh);
    const PoolWindow w = pool_window(d, oy, ox);
    const T* img = x + n * d.h * d.w * d.c + c;
    if (d.max) {
      C best = -C(INFINITY);
      T best_raw = neg_inf<T>();
      std::int64_t arg = 0;
      for (std::int64_t iy = w.y0; iy < w.y1; ++iy)
        for (std::int64_t ix = w.x0; ix < w.x1; ++ix) {
          const T raw = img[(iy * d.w + ix) * d.c];
          const C v = load(raw);
          if (v > best || v != v) {  // NaN wins
            best = v, best_raw = raw;
            arg = (iy - w.wy) * d.pool_w + (ix - w.wx);
          }
        }
      y[o] = best != best ? quiet(best_raw) : best_raw;
      if (ws) ws[o] = static_cast<std::uint16_t>(arg);
    } else {
      C acc = 0;
      for (std::int64_t iy = w.y0; iy < w.y1; ++iy)
        for (std::int64_t ix = w.x0; ix < w.x1; ++ix) acc += load(img[(iy * d.w + ix) * d.c]);
      const C inv = C(1) / static_cast<C>((w.y1 - w.y0) * (w.x1 - w.x0));
      y[o] = store<T>(acc * inv);
    }
  }
}

/// dx [N,H,W,C] from dy [N,OH,OW,C] (and, for max pooling, the forward's ws).
template <class T>
MPT_HOST_DEVICE void pool_backward_body(const Thread& t, const T* dy, const std::uint16_t* ws, T* dx, PoolDims d) {
  using C = compute_t<T>;
  const std::int64_t total = d.n * d.h * d.w * d.c;
  for (std::int64_t i = t.global(); i < total; i += t.stride()) {
    const std::int64_t c = i % d.c, ix = (i / d.c) % d.w, iy = (i / (d.c * d.w)) % d.h, n = i / (d.c * d.w * d.h);
    // Windows holding (iy, ix): oy * stride - pad <= iy < oy * stride - pad + pool.
    const std::int64_t ry = iy + d.pad_top, rx = ix + d.pad_left;
    std::int64_t oy0 = ry - d.pool_h + 1 > 0 ? (ry - d.pool_h + d.stride_h) / d.stride_h : 0;
    std::int64_t oy1 = ry / d.stride_h + 1;
    std::int64_t ox0 = rx - d.pool_w + 1 > 0 ? (rx - d.pool_w + d.stride_w) / d.stride_w : 0;
    std::int64_t ox1 = rx / d.stride_w + 1;
    if (oy1 > d.oh) oy1 = d.oh;
    if (ox1 > d.ow) ox1 = d.ow;
    const std::int64_t base = n * d.oh * d.ow * d.c + c;
    if (d.direct) {
      T v = store<T>(C(0));
      if (oy0 < oy1 && ox0 < ox1) {  // the one window holding it
        const std::int64_t o = base + (oy0 * d.ow + ox0) * d.c;
        const PoolWindow w = pool_window(d, oy0, ox0);
        if (d.max) {
          if (ws[o] == (iy - w.wy) * d.pool_w + (ix - w.wx)) v = dy[o];
        } else {
          v = store<T>(load(dy[o]) * (C(1) / static_cast<C>((w.y1 - w.y0) * (w.x1 - w.x0))));
        }
      }
      dx[i] = v;
      continue;
    }
    C acc = 0;
    for (std::int64_t oy = oy0; oy < oy1; ++oy)
      for (std::int64_t ox = ox0; ox < ox1; ++ox) {
        const std::int64_t o = base + (oy * d.ow + ox) * d.c;
        const PoolWindow w = pool_window(d, oy, ox);
        if (d.max) {
          if (ws[o] == (iy - w.wy) * d.pool_w + (ix - w.wx)) acc += load(dy[o]);
        } else {
          acc = mul_add_rn(load(dy[o]), C(1) / static_cast<C>((w.y1 - w.y0) * (w.x1 - w.x0)), acc);
        }
      }
    dx[i] = store<T>(acc);
  }
}

}  // namespace mpt::kernels
