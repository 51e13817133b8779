// Max and average pooling over NHWC with own kernels (oneDNN 2.6's NHWC pooling took ~1 ms for
// the 2x2 pooling of a [128, 26, 26, 32] batch, several times what the memory traffic needs).
// Images run in parallel; each output pixel's window is read as channel vectors (float32,
// float64, or bfloat16 widened in registers; float16 goes through float32 copies; max pooling
// compares either 16-bit type as bit patterns in 16-bit lanes instead). Max pooling in training
// records the winning window position per element (uint16) for its backward, and lets NaN win so
// that overflows stay visible to loss scaling.
#include <cstdint>
#include <limits>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/vector_types.hpp"

namespace mpt::cpu {
namespace {

using Index = std::uint16_t;  // window position of the maximum (pool_h * pool_w <= 65536)

struct Dims {
  std::int64_t n, h, w, c, oh, ow;
};

Dims dims_of(const Shape& x, const Shape& y) { return {x[0], x[1], x[2], x[3], y[1], y[2]}; }

/// The window of output (oy, ox), clipped to the image: rows [y0, y1), cols [x0, x1), and the
/// unclipped origin (for window positions).
struct Window {
  std::int64_t y0, y1, x0, x1, oy0, ox0;
};

inline Window window(const Pool2dGeometry& g, const Dims& d, std::int64_t oy, std::int64_t ox) {
  const std::int64_t wy = oy * g.stride_h - g.pad_top, wx = ox * g.stride_w - g.pad_left;
  return {std::max<std::int64_t>(wy, 0), std::min(wy + g.pool_h, d.h), std::max<std::int64_t>(wx, 0),
          std::min(wx + g.pool_w, d.w), wy, wx};
}

// ---- per-pixel kernels, vectorized over channels ----------------------------------------------

// One block of up to 16 channels of output (oy, ox): the running maxima and their window
// positions stay in registers for full blocks (the constant trip count of the inlined call).
// Positions are 32-bit lanes beside the float32 values: mixed 16/32-bit lanes defeat GCC's
// vectorizer.
template <class T, class C>
[[gnu::always_inline]] inline void max_block(const T* __restrict img, const Dims& d, const Pool2dGeometry& g,
                                             const Window& w, std::int64_t c0, std::int64_t n, T* __restrict y,
                                             Index* __restrict ws) {
  C acc[16];
  std::int32_t arg[16];
  for (std::int64_t c = 0; c < n; ++c) acc[c] = -std::numeric_limits<C>::infinity(), arg[c] = 0;
  for (std::int64_t iy = w.y0; iy < w.y1; ++iy)
    for (std::int64_t ix = w.x0; ix < w.x1; ++ix) {
      const T* p = img + (iy * d.w + ix) * d.c + c0;
      const auto k = static_cast<std::int32_t>((iy - w.oy0) * g.pool_w + (ix - w.ox0));
#pragma omp simd
      for (std::int64_t c = 0; c < n; ++c) {
        const C v = static_cast<C>(widen(p[c]));
        const bool take = v > acc[c] || v != v;  // NaN wins: overflows stay visible
        acc[c] = take ? v : acc[c];
        arg[c] = take ? k : arg[c];
      }
    }
#pragma omp simd
  for (std::int64_t c = 0; c < n; ++c) y[c0 + c] = narrow<T>(acc[c]);
  if (ws)
    for (std::int64_t c = 0; c < n; ++c) ws[c0 + c] = static_cast<Index>(arg[c]);
}

// A key that orders float16/bfloat16 bit patterns (kInf: +inf) as their values, in int16 lanes:
// the magnitude, negated for negative numbers, so -0 and +0 tie as they compare in float. NaNs
// keep their magnitude whatever their sign, which puts them above every number (> kInf).
template <std::uint16_t kInf>
inline std::int16_t order_key(std::uint16_t b) {
  const auto m = static_cast<std::int16_t>(b & 0x7fff), s = static_cast<std::int16_t>(b);
  // All ones for negative numbers: as int16 their bits run up to -inf's; the -NaNs lie above.
  const auto neg = static_cast<std::int16_t>(-(s <= static_cast<std::int16_t>(0x8000 | kInf)));
  return static_cast<std::int16_t>((m ^ neg) - neg);  // -m where neg
}

// max_block for 16-bit floats on their bits: the same winners and positions as comparing the
// widened values, with every lane 16 bits wide (keys, bits and positions), so the loads need no
// widening and twice the channels fit a register. The winner's NaN comes out quiet (kQuiet), as
// from the float32 round trip.
template <std::uint16_t kInf, std::uint16_t kQuiet>
[[gnu::always_inline]] inline void max_block_bits(const std::uint16_t* __restrict img, const Dims& d,
                                                  const Pool2dGeometry& g, const Window& w, std::int64_t c0,
                                                  std::int64_t n, std::uint16_t* __restrict y, Index* __restrict ws) {
  std::int16_t key[32];
  std::uint16_t bits[32];
  Index arg[32];
  for (std::int64_t c = 0; c < n; ++c) key[c] = order_key<kInf>(0x8000 | kInf), bits[c] = 0x8000 | kInf, arg[c] = 0;
  for (std::int64_t iy = w.y0; iy < w.y1; ++iy)
    for (std::int64_t ix = w.x0; ix < w.x1; ++ix) {
      const std::uint16_t* p = img + (iy * d.w + ix) * d.c + c0;
      const auto k = static_cast<Index>((iy - w.oy0) * g.pool_w + (ix - w.ox0));
#pragma omp simd
      for (std::int64_t c = 0; c < n; ++c) {
        const std::int16_t v = order_key<kInf>(p[c]);
        // NaN wins: overflows stay visible. t is all ones where taken; blends as bit masks,
        // since GCC 12 left ?: here scalar in some clones and ~1.5x slower in the others.
        const std::int16_t t = -static_cast<std::int16_t>((v > key[c]) | (v > kInf));
        key[c] = static_cast<std::int16_t>((v & t) | (key[c] & ~t));
        bits[c] = static_cast<std::uint16_t>((p[c] & t) | (bits[c] & ~t));
        arg[c] = static_cast<Index>((k & t) | (arg[c] & ~t));
      }
    }
#pragma omp simd
  for (std::int64_t c = 0; c < n; ++c)
    y[c0 + c] = static_cast<std::uint16_t>(key[c] > kInf ? bits[c] | kQuiet : bits[c]);
  if (ws)
    for (std::int64_t c = 0; c < n; ++c) ws[c0 + c] = arg[c];
}

/// Output row oy of one image (y, ws: that row).
template <class T, class C>
MPT_KERNEL void max_row(const T* __restrict img, const Dims& d, const Pool2dGeometry& g, std::int64_t oy,
                               T* __restrict y, Index* __restrict ws) {
  for (std::int64_t ox = 0; ox < d.ow; ++ox) {
    const Window w = window(g, d, oy, ox);
    T* yo = y + ox * d.c;
    Index* wo = ws ? ws + ox * d.c : nullptr;
    std::int64_t c0 = 0;
    for (; c0 + 16 <= d.c; c0 += 16) max_block<T, C>(img, d, g, w, c0, 16, yo, wo);
    if (c0 < d.c) max_block<T, C>(img, d, g, w, c0, d.c - c0, yo, wo);
  }
}

template <std::uint16_t kInf, std::uint16_t kQuiet>
MPT_KERNEL void max_row_bits(const std::uint16_t* __restrict img, const Dims& d, const Pool2dGeometry& g,
                                       std::int64_t oy, std::uint16_t* __restrict y, Index* __restrict ws) {
  for (std::int64_t ox = 0; ox < d.ow; ++ox) {
    const Window w = window(g, d, oy, ox);
    std::uint16_t* yo = y + ox * d.c;
    Index* wo = ws ? ws + ox * d.c : nullptr;
    std::int64_t c0 = 0;
    for (; c0 + 32 <= d.c; c0 += 32) max_block_bits<kInf, kQuiet>(img, d, g, w, c0, 32, yo, wo);
    if (c0 < d.c) max_block_bits<kInf, kQuiet>(img, d, g, w, c0, d.c - c0, yo, wo);
  }
}

/// Non-overlapping windows: every input position gets at most one gradient, written directly
/// in dx's own type (positions outside all windows were zeroed).
template <class T, class C>
MPT_KERNEL void backward_row_direct(const T* __restrict dy, const Index* __restrict ws, const Dims& d,
                                           const Pool2dGeometry& g, std::int64_t oy, T* __restrict dx) {
  for (std::int64_t ox = 0; ox < d.ow; ++ox) {
    const Window w = window(g, d, oy, ox);
    const T* gy = dy + ox * d.c;
    const C inv = C(1) / static_cast<C>((w.y1 - w.y0) * (w.x1 - w.x0));
    for (std::int64_t iy = w.y0; iy < w.y1; ++iy)
      for (std::int64_t ix = w.x0; ix < w.x1; ++ix) {
        T* p = dx + (iy * d.w + ix) * d.c;
        if (ws) {
          const Index* k = ws + ox * d.c;
          const auto here = static_cast<Index>((iy - w.oy0) * g.pool_w + (ix - w.ox0));
          if constexpr (std::is_same_v<T, bf16_bits>) {  // 16-bit lanes throughout: a bit mask
#pragma omp simd
            for (std::int64_t c = 0; c < d.c; ++c)
              p[c] = static_cast<bf16_bits>(gy[c] & static_cast<bf16_bits>(-static_cast<int>(k[c] == here)));
          } else {
#pragma omp simd
            for (std::int64_t c = 0; c < d.c; ++c) p[c] = static_cast<std::int32_t>(k[c]) == here ? gy[c] : T(0);
          }
        } else {
#pragma omp simd
          for (std::int64_t c = 0; c < d.c; ++c) p[c] = narrow<T>(static_cast<C>(widen(gy[c])) * inv);
        }
      }
  }
}

template <class T, class C>
MPT_KERNEL void avg_pixel(const T* __restrict img, const Dims& d, const Window& w, C* __restrict acc,
                                 T* __restrict y) {
  const std::int64_t ch = d.c;
  for (std::int64_t c = 0; c < ch; ++c) acc[c] = C(0);
  for (std::int64_t iy = w.y0; iy < w.y1; ++iy)
    for (std::int64_t ix = w.x0; ix < w.x1; ++ix) {
      const T* p = img + (iy * d.w + ix) * ch;
#pragma omp simd
      for (std::int64_t c = 0; c < ch; ++c) acc[c] += static_cast<C>(widen(p[c]));
    }
  const C inv = C(1) / static_cast<C>((w.y1 - w.y0) * (w.x1 - w.x0));  // padding left out of the mean
#pragma omp simd
  for (std::int64_t c = 0; c < ch; ++c) y[c] = narrow<T>(acc[c] * inv);
}

/// dx (float32/float64 accumulator of one image) += dy routed to each window position; g and
/// arg are per-channel scratch.
template <class T, class C>
MPT_KERNEL void backward_pixel(const T* __restrict dy, const Index* __restrict ws, const Dims& d,
                                      const Pool2dGeometry& g, const Window& w, C* __restrict grad,
                                      std::int32_t* __restrict arg, C* __restrict dx) {
  const std::int64_t ch = d.c;
  const C scale = ws ? C(1) : C(1) / static_cast<C>((w.y1 - w.y0) * (w.x1 - w.x0));
  for (std::int64_t c = 0; c < ch; ++c) grad[c] = static_cast<C>(widen(dy[c])) * scale;
  if (ws)
    for (std::int64_t c = 0; c < ch; ++c) arg[c] = ws[c];
  for (std::int64_t iy = w.y0; iy < w.y1; ++iy)
    for (std::int64_t ix = w.x0; ix < w.x1; ++ix) {
      C* p = dx + (iy * d.w + ix) * ch;
      if (ws) {
        const auto k = static_cast<std::int32_t>((iy - w.oy0) * g.pool_w + (ix - w.ox0));
#pragma omp simd
        for (std::int64_t c = 0; c < ch; ++c) p[c] += arg[c] == k ? grad[c] : C(0);
      } else {
#pragma omp simd
        for (std::int64_t c = 0; c < ch; ++c) p[c] += grad[c];
      }
    }
}

template <class T, class C>
MPT_KERNEL void narrow_image(const C* __restrict acc, std::int64_t n, T* __restrict out) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) out[i] = narrow<T>(acc[i]);
}

// ---- whole tensors ----------------------------------------------------------------------------

template <class T, class C>
void forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y, Index* ws) {
  const Dims d = dims_of(x.shape(), y.shape());
  const T* X = static_cast<const T*>(x.data_ptr());
  T* Y = static_cast<T*>(y.data_ptr());
  parallel_for(d.n * d.oh, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(d.ow * d.c, 1)),
               [&](std::int64_t b, std::int64_t e) {
                 std::vector<C> acc(d.c);
                 for (std::int64_t u = b; u < e; ++u) {
                   const std::int64_t n = u / d.oh, oy = u % d.oh;
                   const T* img = X + n * d.h * d.w * d.c;
                   const std::int64_t o = u * d.ow * d.c;
                   if (g.kind == PoolKind::Max) {
                     Index* wo = ws ? ws + o : nullptr;
                     if constexpr (std::is_same_v<T, std::uint16_t>) {  // either 16-bit float
                       if (x.dtype() == bfloat16) isa_call16<max_row_bits<0x7f80, 0x0040>>(img, d, g, oy, Y + o, wo);
                       else isa_call16<max_row_bits<0x7c00, 0x0200>>(img, d, g, oy, Y + o, wo);
                     } else {
                       isa_call<max_row<T, C>>(img, d, g, oy, Y + o, wo);
                     }
                     continue;
                   }
                   for (std::int64_t ox = 0; ox < d.ow; ++ox)
                     isa_call<avg_pixel<T, C>>(img, d, window(g, d, oy, ox), acc.data(), Y + o + ox * d.c);
                 }
               });
}

template <class T, class C>
void backward(const Tensor& dy, const Index* ws, const Pool2dGeometry& g, Tensor& dx) {
  const Dims d = dims_of(dx.shape(), dy.shape());
  const T* DY = static_cast<const T*>(dy.data_ptr());
  T* DX = static_cast<T*>(dx.data_ptr());
  const std::int64_t image = d.h * d.w * d.c;
  if (g.stride_h >= g.pool_h && g.stride_w >= g.pool_w) {  // windows do not overlap
    parallel_for(d.n, 1, [&](std::int64_t b, std::int64_t e) {
      std::fill(DX + b * image, DX + e * image, T(0));
      for (std::int64_t u = b * d.oh; u < e * d.oh; ++u) {
        const std::int64_t o = u * d.ow * d.c;
        isa_call<backward_row_direct<T, C>>(DY + o, ws ? ws + o : nullptr, d, g, u % d.oh, DX + (u / d.oh) * image);
      }
    });
    return;
  }
  parallel_for(d.n, 1, [&](std::int64_t b, std::int64_t e) {  // images scatter independently
    std::vector<C> acc(std::is_same_v<T, C> ? 0 : image), grad(d.c);
    std::vector<std::int32_t> arg(d.c);
    for (std::int64_t n = b; n < e; ++n) {
      C* out = std::is_same_v<T, C> ? reinterpret_cast<C*>(DX + n * image) : acc.data();
      std::fill(out, out + image, C(0));
      for (std::int64_t oy = 0; oy < d.oh; ++oy)
        for (std::int64_t ox = 0; ox < d.ow; ++ox) {
          const std::int64_t o = ((n * d.oh + oy) * d.ow + ox) * d.c;
          isa_call<backward_pixel<T, C>>(DY + o, ws ? ws + o : nullptr, d, g, window(g, d, oy, ox), grad.data(), arg.data(), out);
        }
      if constexpr (!std::is_same_v<T, C>) isa_call<narrow_image<T, C>>(out, image, DX + n * image);
    }
  });
}

Tensor as_float32(CpuBackend& be, const Tensor& t) {
  Tensor f = Tensor::empty(t.shape(), float32, t.device());
  be.cast(t, f);
  return f;
}

}  // namespace

void CpuBackend::pool2d(const Tensor& x, const Pool2dGeometry& g, bool training, Tensor& out, Tensor& workspace) {
  if (out.numel() == 0) return;
  if (training && g.kind == PoolKind::Max) workspace = Tensor::empty({out.numel() * 2}, uint8, out.device());
  Index* ws = workspace.defined() ? static_cast<Index*>(workspace.data_ptr()) : nullptr;
  if (x.dtype() == float16 && g.kind == PoolKind::Max)  // compares bit patterns, as bfloat16 does
    return forward<std::uint16_t, float>(x, g, out, ws);
  if (x.dtype() == float16) {  // float32 copies
    Tensor y32 = Tensor::empty(out.shape(), float32, out.device());
    forward<float, float>(as_float32(*this, x), g, y32, ws);
    return cast(y32, out);
  }
  with_vector_types(x.dtype(), [&](auto t, auto c) { forward<decltype(t), decltype(c)>(x, g, out, ws); });
}

void CpuBackend::pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& workspace,
                                 const Pool2dGeometry& g, Tensor& dx) {
  if (dx.numel() == 0) return;
  Tensor ws = workspace;
  if (g.kind == PoolKind::Max && !ws.defined()) {  // the forward ran without one: find the maxima again
    Tensor again = Tensor::empty(y.shape(), y.dtype(), y.device());
    pool2d(x, g, true, again, ws);
  }
  const Index* w = g.kind == PoolKind::Max ? static_cast<const Index*>(ws.data_ptr()) : nullptr;
  if (dy.numel() == 0) return fill(dx, 0.0);
  if (dy.dtype() == float16 && w && g.stride_h >= g.pool_h && g.stride_w >= g.pool_w)
    // Max pooling's gradient over windows that do not overlap only selects dy's values: the
    // 16-bit bit-mask path serves float16 as it serves bfloat16 (no float32 copies).
    return backward<bf16_bits, float>(dy, w, g, dx);
  if (dy.dtype() == float16) {
    Tensor dx32 = Tensor::empty(dx.shape(), float32, dx.device());
    backward<float, float>(as_float32(*this, dy), w, g, dx32);
    return cast(dx32, dx);
  }
  with_vector_types(dy.dtype(), [&](auto t, auto c) { backward<decltype(t), decltype(c)>(dy, w, g, dx); });
}

}  // namespace mpt::cpu
