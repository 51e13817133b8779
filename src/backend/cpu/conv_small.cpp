// Direct convolutions for inputs with 1 to 4 channels (the first layer of a CNN). Such a layer
// does a few FMAs per output element (9 for a 3x3 kernel over one channel), but oneDNN 2.6 runs
// it as a general convolution, bfloat16 even through float32 copies of the batch (it has no AMX
// kernel for it).
//
// Both passes work on blocks of output rows of one image. A block's input rows are staged as
// float32 with the padding written out as zeros (the input is Cout/Cin times smaller than the
// output, so the copy is cheap), after which every output pixel reads all kh*kw*Cin taps at
// fixed offsets from its own base, with no bounds checks. The kernels take the block's pixels
// in strips of 8 (across row ends, so that only the block's last strip is partial) and
// vectorize over 32 or 16 output channels (weights padded to whole blocks of 16): the forward
// keeps the strip's sums in registers and loads each weight row once per strip; the weight
// gradient keeps the strip's dy in registers and updates each tap's float32 sum once per strip.
// 16-bit outputs, and those of sigmoid and tanh, go through float32 blocks (one rounding, by
// the core's vectorized conversion); bfloat16 dy is widened in registers, float16 dy converted.
#include "backend/cpu/conv_small.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/common/unary_ops.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/row_chunks.hpp"
#include "backend/cpu/vector_types.hpp"

namespace mpt::cpu {
namespace {

constexpr std::int64_t kLanes = 16;          // output channels per block: one AVX-512 register
constexpr std::int64_t kStrip = 8;           // output pixels per strip
constexpr std::int64_t kBlockItems = 16384;  // output elements per block of rows (64 KB as float32)

/// One convolution, the layout of its staged input and its blocks of output rows.
struct Dims {
  std::int64_t n, h, w, cin, oh, ow, cout, kh, kw;
  std::int64_t coutp;              // cout rounded up to whole blocks
  std::int64_t wp;                 // staged row width in pixels: the columns the output reads
  std::int64_t rows;               // output rows per block
  std::vector<std::int64_t> off;   // per tap (i, j, ci), the kernel's row order: staged offset
  std::vector<std::int64_t> base;  // per pixel of a block (row-major): staged offset of its taps
};

Dims dims_of(const Shape& x, const Shape& w, const Shape& y, const Conv2dGeometry& g) {
  Dims d;
  d.n = x[0], d.h = x[1], d.w = x[2], d.cin = x[3], d.oh = y[1], d.ow = y[2], d.cout = y[3], d.kh = w[0], d.kw = w[1];
  d.coutp = (d.cout + kLanes - 1) / kLanes * kLanes;
  d.wp = (d.ow - 1) * g.stride_w + (d.kw - 1) * g.dilation_w + 1;
  d.rows = std::max<std::int64_t>(1, std::min(d.oh, kBlockItems / std::max<std::int64_t>(d.ow * d.cout, 1)));
  for (std::int64_t i = 0; i < d.kh; ++i)
    for (std::int64_t j = 0; j < d.kw; ++j)
      for (std::int64_t c = 0; c < d.cin; ++c)
        d.off.push_back((i * g.dilation_h * d.wp + j * g.dilation_w) * d.cin + c);
  for (std::int64_t r = 0; r < d.rows; ++r)
    for (std::int64_t ox = 0; ox < d.ow; ++ox) d.base.push_back((r * g.stride_h * d.wp + ox * g.stride_w) * d.cin);
  return d;
}

std::int64_t taps_of(const Dims& d) { return static_cast<std::int64_t>(d.off.size()); }

/// Stages the input that output rows [o0, o0 + rows) of image n read: staged row r, column c
/// holds x[n, o0 * stride_h - pad_top + r, c - pad_left, :] as float32, zero outside the image.
void stage(const Tensor& x, const Dims& d, const Conv2dGeometry& g, std::int64_t n, std::int64_t o0, std::int64_t rows,
           std::vector<float>& buf) {
  const std::int64_t span = (rows - 1) * g.stride_h + (d.kh - 1) * g.dilation_h + 1, row = d.wp * d.cin;
  buf.assign(static_cast<std::size_t>(span * row), 0.f);
  const std::int64_t c0 = std::clamp<std::int64_t>(g.pad_left, 0, d.wp);
  const std::int64_t c1 = std::clamp<std::int64_t>(g.pad_left + d.w, c0, d.wp);
  const std::size_t es = itemsize(x.dtype());
  const char* img = static_cast<const char*>(x.data_ptr()) + static_cast<std::size_t>(n * d.h * d.w * d.cin) * es;
  for (std::int64_t r = 0; r < span; ++r) {
    const std::int64_t iy = o0 * g.stride_h - g.pad_top + r;
    if (iy < 0 || iy >= d.h) continue;
    detail::convert(img + static_cast<std::size_t>((iy * d.w + c0 - g.pad_left) * d.cin) * es, x.dtype(),
                    buf.data() + r * row + c0 * d.cin, float32, static_cast<std::size_t>((c1 - c0) * d.cin));
  }
}

/// Calls f(image, first output row, rows) for blocks of at most d.rows output rows, each within
/// one image, that cover rows [b, e) of the batch's N * OH output rows.
template <class F>
void for_row_blocks(const Dims& d, std::int64_t b, std::int64_t e, F&& f) {
  for (std::int64_t u = b; u < e;) {
    const std::int64_t o0 = u % d.oh, rows = std::min({d.rows, d.oh - o0, e - u});
    f(u / d.oh, o0, rows);
    u += rows;
  }
}

/// Staged offsets of the strip of pixels [q, q + kStrip) of a block of `pixels`; pixels past
/// the block repeat its last one, so that every read stays in the staged input.
void strip_bases(const Dims& d, std::int64_t q, std::int64_t pixels, std::int64_t* base) {
  for (std::int64_t p = 0; p < kStrip; ++p) base[p] = d.base[std::min(q + p, pixels - 1)];
}

// ---- registers of lanes -----------------------------------------------------------------------

/// kLanes float32 lanes: one AVX-512 register in the avx512f clone, four SSE registers in the
/// baseline one. The strip kernels keep their sums and operands in these: GCC keeps float
/// arrays indexed in loops on the stack, and the round trips cost a fifth of the run time.
using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));
using Lanes16 = std::uint16_t __attribute__((vector_size(kLanes * sizeof(std::uint16_t))));
using Lanes32 = std::uint32_t __attribute__((vector_size(kLanes * sizeof(std::uint32_t))));

/// v = the first n <= kLanes values at p as float32 (bfloat16 widened), zero beyond.
// GCC 12 warns that the tail loop's 16th iteration would be undefined, in a weight-gradient
// strip inlined into its tier wrappers, though n < kLanes there: the loop never gets that far.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Waggressive-loop-optimizations"
#endif
template <class T>
[[gnu::always_inline]] inline void load_lanes(Lanes& v, const T* p, std::int64_t n) {
  if (n < kLanes) {
    v = Lanes{};
    for (std::int64_t c = 0; c < n; ++c) v[c] = widen(p[c]);
  } else if constexpr (std::is_same_v<T, float>) {
    __builtin_memcpy(&v, p, sizeof v);
  } else {
    Lanes16 h;
    __builtin_memcpy(&h, p, sizeof h);
    const Lanes32 bits = __builtin_convertvector(h, Lanes32) << 16;  // bfloat16 is float32's high half
    __builtin_memcpy(&v, &bits, sizeof v);
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/// The first n <= kLanes lanes of v to p.
[[gnu::always_inline]] inline void store_lanes(const Lanes& v, float* p, std::int64_t n) {
  if (n == kLanes) __builtin_memcpy(p, &v, sizeof v);
  else
    for (std::int64_t c = 0; c < n; ++c) p[c] = v[c];
}

// ---- forward ----------------------------------------------------------------------------------

/// The kernel [kh, kw, Cin, Cout] as float32 rows of coutp channels, zero beyond Cout.
std::vector<float> padded_weights(const Tensor& w, const Dims& d) {
  const std::int64_t taps = taps_of(d);
  const std::vector<float> v = values_of<float>(w, taps * d.cout, 0.f);
  std::vector<float> p(static_cast<std::size_t>(taps * d.coutp), 0.f);
  for (std::int64_t t = 0; t < taps; ++t) std::copy_n(v.begin() + t * d.cout, d.cout, p.begin() + t * d.coutp);
  return p;
}

/// A strip of kStrip output pixels (staged input x at offsets base), of which the first np are
/// stored, for B blocks of channels, of which the first nc are stored (w, bias and y at the
/// first block's first channel).
template <bool Relu, std::int64_t B>
[[gnu::always_inline]] inline void forward_strip(const float* __restrict x, const std::int64_t* base, const Dims& d,
                                                 const float* __restrict w, const float* __restrict bias,
                                                 std::int64_t np, std::int64_t nc, float* __restrict y) {
  const float* xp[kStrip];
  for (std::int64_t p = 0; p < kStrip; ++p) xp[p] = x + base[p];
  Lanes acc[kStrip][B];
  for (std::int64_t b = 0; b < B; ++b) {
    load_lanes(acc[0][b], bias + b * kLanes, kLanes);
    for (std::int64_t p = 1; p < kStrip; ++p) acc[p][b] = acc[0][b];
  }
  const std::int64_t taps = taps_of(d);
  for (std::int64_t t = 0; t < taps; ++t) {
    const std::int64_t o = d.off[t];
    Lanes wv[B];
    for (std::int64_t b = 0; b < B; ++b) load_lanes(wv[b], w + t * d.coutp + b * kLanes, kLanes);
    for (std::int64_t p = 0; p < kStrip; ++p)
      for (std::int64_t b = 0; b < B; ++b) acc[p][b] += xp[p][o] * wv[b];
  }
  const std::int64_t cout = d.cout;  // a local: the stores to y could otherwise alias d
  for (std::int64_t p = 0; p < np; ++p)
    for (std::int64_t b = 0; b < B; ++b) {
      if constexpr (Relu) acc[p][b] = acc[p][b] > 0.f ? acc[p][b] : 0.f;
      store_lanes(acc[p][b], y + p * cout + b * kLanes, std::min(kLanes, nc - b * kLanes));
    }
}

/// The `pixels` output pixels of a block of rows (x: its staged input; y: its output, float32):
/// pairs of channel blocks, then single blocks (the last one partial).
template <bool Relu>
MPT_KERNEL void forward_block(const float* __restrict x, const Dims& d, std::int64_t pixels,
                                     const float* __restrict w, const float* __restrict bias, float* __restrict y) {
  std::int64_t base[kStrip];
  for (std::int64_t q = 0; q < pixels; q += kStrip) {
    strip_bases(d, q, pixels, base);
    const std::int64_t np = std::min(kStrip, pixels - q);
    float* ys = y + q * d.cout;
    std::int64_t c0 = 0;
    for (; c0 + 2 * kLanes <= d.cout; c0 += 2 * kLanes)
      if (np == kStrip) forward_strip<Relu, 2>(x, base, d, w + c0, bias + c0, kStrip, 2 * kLanes, ys + c0);
      else forward_strip<Relu, 2>(x, base, d, w + c0, bias + c0, np, 2 * kLanes, ys + c0);
    for (; c0 < d.cout; c0 += kLanes)
      forward_strip<Relu, 1>(x, base, d, w + c0, bias + c0, np, std::min(kLanes, d.cout - c0), ys + c0);
  }
}

/// The activation of float32 outputs (linear and ReLU are done in the kernel).
void activate(Activation act, float* y, std::int64_t n) {
  if (act == Activation::Linear || act == Activation::Relu) return;
  common::with_unary_op(act, [&](auto o) {
    const float p = static_cast<float>(common::unary_default_param(act));
    for (std::int64_t i = 0; i < n; ++i) y[i] = common::unary_apply<decltype(o)::value>(y[i], p);
  });
}

void forward(const Tensor& x, const Dims& d, const Conv2dGeometry& g, const float* w, const float* bias, Activation act,
             Tensor& out) {
  const std::int64_t m = d.ow * d.cout;
  parallel_for(d.n * d.oh, std::max<std::int64_t>(1, kBlockItems / m), [&](std::int64_t b, std::int64_t e) {
    std::vector<float> in, scratch(out.dtype() == float32 ? 0 : static_cast<std::size_t>(d.rows * m));
    for_row_blocks(d, b, e, [&](std::int64_t n, std::int64_t o0, std::int64_t rows) {
      stage(x, d, g, n, o0, rows, in);
      const std::int64_t o = (n * d.oh + o0) * m;
      float* y = store_target<float>(out, o, scratch.data());
      if (act == Activation::Relu) isa_call<forward_block<true>>(in.data(), d, rows * d.ow, w, bias, y);
      else isa_call<forward_block<false>>(in.data(), d, rows * d.ow, w, bias, y);
      activate(act, y, rows * m);
      store<float>(out, o, rows * m, y);
    });
  });
}

// ---- weight gradient --------------------------------------------------------------------------

/// Adds a strip of kStrip output pixels (staged input x at offsets base; dy: the first one's
/// gradient at the first block's first channel), of which the first np count, into B blocks of
/// channels, of which the first nc are real: dw[t, c] += sum_p x[p, t] * dy[p, c] and
/// db[c] += sum_p dy[p, c] (dw, db: float32 sums at the first block).
template <class T, std::int64_t B>
[[gnu::always_inline]] inline void weights_strip(const float* __restrict x, const std::int64_t* base, const Dims& d,
                                                 const T* __restrict dy, std::int64_t np, std::int64_t nc,
                                                 float* __restrict dw, float* __restrict db) {
  const float* xp[kStrip];
  for (std::int64_t p = 0; p < kStrip; ++p) xp[p] = x + base[p];
  Lanes gy[kStrip][B], s;
  for (std::int64_t p = 0; p < kStrip; ++p)
    for (std::int64_t b = 0; b < B; ++b)
      load_lanes(gy[p][b], dy + p * d.cout + b * kLanes, p < np ? std::min(kLanes, nc - b * kLanes) : 0);
  for (std::int64_t b = 0; b < B; ++b) {
    load_lanes(s, db + b * kLanes, kLanes);
    for (std::int64_t p = 0; p < kStrip; ++p) s += gy[p][b];
    store_lanes(s, db + b * kLanes, kLanes);
  }
  const std::int64_t taps = taps_of(d);
  for (std::int64_t t = 0; t < taps; ++t) {
    const std::int64_t o = d.off[t];
    for (std::int64_t b = 0; b < B; ++b) {
      float* wt = dw + t * d.coutp + b * kLanes;
      load_lanes(s, wt, kLanes);
      for (std::int64_t p = 0; p < kStrip; ++p) s += xp[p][o] * gy[p][b];
      store_lanes(s, wt, kLanes);
    }
  }
}

/// Adds the `pixels` output pixels of a block of rows (x: its staged input; dy: its gradient).
template <class T>
MPT_KERNEL void weights_block(const float* __restrict x, const Dims& d, std::int64_t pixels,
                                     const T* __restrict dy, float* __restrict dw, float* __restrict db) {
  std::int64_t base[kStrip];
  for (std::int64_t q = 0; q < pixels; q += kStrip) {
    strip_bases(d, q, pixels, base);
    const std::int64_t np = std::min(kStrip, pixels - q);
    const T* gs = dy + q * d.cout;
    std::int64_t c0 = 0;
    for (; c0 + 2 * kLanes <= d.cout; c0 += 2 * kLanes)
      if (np == kStrip) weights_strip<T, 2>(x, base, d, gs + c0, kStrip, 2 * kLanes, dw + c0, db + c0);
      else weights_strip<T, 2>(x, base, d, gs + c0, np, 2 * kLanes, dw + c0, db + c0);
    for (; c0 < d.cout; c0 += kLanes)
      weights_strip<T, 1>(x, base, d, gs + c0, np, std::min(kLanes, d.cout - c0), dw + c0, db + c0);
  }
}

/// Sums of dw [taps, coutp] followed by db [coutp]: float32 per block of rows, float64 per
/// chunk of the batch and over the chunks (in chunk order: deterministic). T is how the
/// kernel reads dy: bfloat16 bits, or float (float16 converted per block).
template <class T>
std::vector<double> weight_sums(const Tensor& x, const Tensor& dy, const Dims& d, const Conv2dGeometry& g) {
  const std::int64_t size = (taps_of(d) + 1) * d.coutp, rows = d.n * d.oh, m = d.ow * d.cout;
  const int chunks = row_chunks(rows, m);
  std::vector<double> part(static_cast<std::size_t>(chunks * size), 0.0);
  for_row_chunks(chunks, rows, [&](int chunk, std::int64_t b, std::int64_t e) {
    std::vector<float> in, acc(static_cast<std::size_t>(size));
    std::vector<float> scratch(dy.dtype() == storage_dtype<T>() ? 0 : static_cast<std::size_t>(d.rows * m));
    double* total = part.data() + chunk * size;
    for_row_blocks(d, b, e, [&](std::int64_t n, std::int64_t o0, std::int64_t count) {
      stage(x, d, g, n, o0, count, in);
      const std::int64_t o = (n * d.oh + o0) * m;
      const T* gy;
      if constexpr (std::is_same_v<T, float>) gy = load<float>(dy, o, count * m, scratch.data());
      else gy = static_cast<const T*>(dy.data_ptr()) + o;
      std::fill(acc.begin(), acc.end(), 0.f);
      isa_call<weights_block<T>>(in.data(), d, count * d.ow, gy, acc.data(), acc.data() + size - d.coutp);
      for (std::int64_t i = 0; i < size; ++i) total[i] += acc[i];
    });
  });
  for (int c = 1; c < chunks; ++c)
    for (std::int64_t i = 0; i < size; ++i) part[i] += part[c * size + i];
  part.resize(static_cast<std::size_t>(size));
  return part;
}

/// The direct kernels run at the avx512 tier only: at avx2 (measured on AMD Zen 3, and on an
/// AVX-512 Xeon capped at avx2: docs/design.md) oneDNN's jit:avx2 convolutions are faster.
/// MPT_CPU_SMALL_CONV=direct|onednn forces one path (benchmarks).
bool direct_wins() {
  static const bool wins = [] {
    const char* e = std::getenv("MPT_CPU_SMALL_CONV");
    if (e && !std::strcmp(e, "direct")) return true;
    if (e && !std::strcmp(e, "onednn")) return false;
    return detail::cpu_isa() == detail::CpuIsa::avx512;
  }();
  return wins;
}

}  // namespace

bool small_conv_applies(const Shape& x, const Shape& w, DType d) { return direct_wins() && small_conv_supports(x, w, d); }

bool small_conv_supports(const Shape& x, const Shape& w, DType d) {
  return x.size() == 4 && w.size() == 4 && x[3] >= 1 && x[3] <= 4 && w[2] == x[3] &&
         (d == float32 || d == bfloat16 || d == float16);
}

void small_conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g, Activation act,
                        Tensor& out) {
  if (out.numel() == 0) return;
  const Dims d = dims_of(x.shape(), w.shape(), out.shape(), g);
  const std::vector<float> wp = padded_weights(w, d);
  std::vector<float> bp = values_of<float>(bias, d.cout, 0.f);
  bp.resize(static_cast<std::size_t>(d.coutp), 0.f);
  forward(x, d, g, wp.data(), bp.data(), act, out);
}

void small_conv_backward_weights(const Tensor& x, const Tensor& dy, const Conv2dGeometry& g, Tensor& dw,
                                 Tensor& dbias) {
  if (!dw.defined() && !dbias.defined()) return;
  const Shape& ys = dy.shape();
  Dims d = dims_of(x.shape(), dw.defined() ? dw.shape() : Shape{1, 1, x.shape()[3], ys[3]}, ys, g);
  if (!dw.defined()) d.off.clear();  // dbias alone: a kernel without taps
  const std::int64_t taps = taps_of(d);
  std::vector<double> s(static_cast<std::size_t>((taps + 1) * d.coutp), 0.0);
  if (dy.numel() > 0) {
    if (dy.dtype() == bfloat16) s = weight_sums<bf16_bits>(x, dy, d, g);
    else s = weight_sums<float>(x, dy, d, g);
  }
  if (dw.defined()) {
    std::vector<double> v(static_cast<std::size_t>(taps * d.cout));
    for (std::int64_t t = 0; t < taps; ++t) std::copy_n(s.begin() + t * d.coutp, d.cout, v.begin() + t * d.cout);
    write_values(v, dw);
  }
  if (dbias.defined())
    write_values(std::vector<double>(s.begin() + taps * d.coutp, s.begin() + taps * d.coutp + d.cout), dbias);
}

}  // namespace mpt::cpu
