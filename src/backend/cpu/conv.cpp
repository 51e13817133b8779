// 2-D convolution through oneDNN: NHWC activations, the Keras [kh, kw, Cin, Cout] kernel
// reordered into the layout each primitive prefers, primitives cached per shape (conv_plans.cpp);
// float64 runs the reference loops (conv_reference.cpp), and inputs with at most 4 channels (a
// network's first layer) direct kernels (conv_small.cpp), faster than oneDNN's in every dtype.
//
// Each pass of a 16-bit convolution uses the compute measured fastest on this CPU. float16
// computes in float32. bfloat16 runs natively (bf16 operands, f32 accumulation) where oneDNN runs
// the pass on AMX or where vdpbf16ps runs at the FMA rate (AMD Zen 4 and later:
// bf16_dot_full_rate; there native passes make model B's bf16 step 1.45x and model C's 1.55x
// faster than float32 compute), and in float32 otherwise: on Intel CPUs without AMX, vdpbf16ps
// issues at half the rate of float32 FMAs (101 vs 216 GFLOP/s per core on the Xeon), so
// AVX512-BF16 convolutions take twice as long as float32 ones. oneDNN 2.6 has AMX forward
// convolutions only, so the backward-data pass runs
// as the forward convolution it is (dy against the flipped, transposed kernel), one per stride
// phase when strided (sub-kernels; backward_data_by_phases: 1.8 ms against 4.4 ms in float32 for
// the stride-2 layer of bench_conv's model B), and the weight gradient of a convolution with 16 or more input channels runs on mpt's own AMX kernel
// (conv_amx.cpp); other weight gradients compute in float32 (recast as a forward
// convolution they would run on AMX but re-read dy as an OHxOW kernel for every tap: 14 ms
// against 6 ms in float32 for a [128, 32, 32, 32] layer). float32 compute of 16-bit data goes
// through the batch a few images at a time, so that the float32 copies stay in cache.
// MPT_CPU_BF16_CONV=native|float32 forces one bfloat16 path for every pass (tests, benchmarks):
// oneDNN's bf16 primitives, or float32 compute.
// Grouped convolutions (Keras's groups, DepthwiseConv2D) run on oneDNN's grouped primitives
// (weights [G, Cout/G, Cin/G, kh, kw], Keras's kernel described as hwigo) or, in float64, the
// reference loops; the direct first-layer kernels, the AMX weight gradient and the
// backward-data phases take groups == 1 only.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "backend/cpu/conv_amx.hpp"
#include "backend/cpu/conv_reference.hpp"
#include "backend/cpu/conv_small.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/conv_plans.hpp"
#include "backend/cpu/dnnl_util.hpp"

namespace mpt::cpu {
namespace {

using namespace conv;

enum class Bf16Mode { Auto, Native, Float32 };

Bf16Mode bf16_mode() {
  if (!dnnl_has_bf16()) return Bf16Mode::Float32;  // no bf16 kernels on this CPU (AVX2 and older)
  const char* e = std::getenv("MPT_CPU_BF16_CONV");
  if (e && !std::strcmp(e, "native")) return Bf16Mode::Native;
  if (e && !std::strcmp(e, "float32")) return Bf16Mode::Float32;
  return Bf16Mode::Auto;
}

// ---- float32 staging of 16-bit data -----------------------------------------------------------

const char* at(const Tensor& t, std::int64_t element) {
  return static_cast<const char*>(t.data_ptr()) + element * static_cast<std::int64_t>(itemsize(t.dtype()));
}
char* at(Tensor& t, std::int64_t element) {
  return static_cast<char*>(t.data_ptr()) + element * static_cast<std::int64_t>(itemsize(t.dtype()));
}

/// Images per float32 chunk: input and output copies of about 4 MB, so they stay in cache.
std::int64_t chunk_images(const ConvShape& s) {
  constexpr std::int64_t kChunkBytes = 4 << 20;
  return std::clamp<std::int64_t>(kChunkBytes / (4 * (s.h * s.w * s.cin + s.oh * s.ow * s.cout)), 1, s.n);
}

// ---- which compute each pass uses -----------------------------------------------------------

bool on_amx(const std::string& impl) { return impl.find("amx") != std::string::npos; }
/// True where a bfloat16 primitive beats float32 compute: on AMX, and with oneDNN's AVX512-BF16
/// kernels where vdpbf16ps runs at the FMA rate (bf16_dot_full_rate: AMD Zen 4 and later).
bool bf16_wins(const std::string& impl) {
  return on_amx(impl) || (bf16_dot_full_rate() && impl.find("bf16") != std::string::npos);
}

bool native_forward(const ConvShape& s, const Conv2dGeometry& g, DType d, const DType* bias_dt, Activation act) {
  if (d != bfloat16) return d == float32;
  const Bf16Mode m = bf16_mode();
  if (m != Bf16Mode::Auto) return m == Bf16Mode::Native;
  return bf16_wins(forward_plan(s, g, d, bias_dt, act).impl);
}

/// Backward-data as forward convolutions, one per stride phase: the dx pixels whose padded
/// coordinates are (ry, rx) modulo the strides receive dy through the kernel taps congruent to
/// them, i.e. dy convolved (stride 1) with the flipped sub-kernel of those taps, channels
/// swapped. Phase (ry, rx) is a stride-1 problem whose output rows are that phase's rows of dx,
/// from the first inside the input (y0) on. With stride 1 the one phase is dx itself, with the
/// whole kernel (dilation kept) and the complementary padding.
struct Phase {
  std::int64_t ry, rx, my, mx, y0, x0;  // residues; sub-kernel size (0: no tap reaches it); first row/col
  ConvShape s;
  Conv2dGeometry g;
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a >= 0 ? (a + b - 1) / b : -(-a / b); }

std::vector<Phase> phases(const ConvShape& s, const Conv2dGeometry& g) {
  std::vector<Phase> out;
  for (std::int64_t ry = 0; ry < g.stride_h; ++ry)
    for (std::int64_t rx = 0; rx < g.stride_w; ++rx) {
      Phase p{ry, rx, ry < s.kh ? (s.kh - ry + g.stride_h - 1) / g.stride_h : 0,
              rx < s.kw ? (s.kw - rx + g.stride_w - 1) / g.stride_w : 0,
              std::max<std::int64_t>(0, ceil_div(g.pad_top - ry, g.stride_h)),
              std::max<std::int64_t>(0, ceil_div(g.pad_left - rx, g.stride_w)), {}, {}};
      const std::int64_t qy = std::max<std::int64_t>(0, ceil_div(g.pad_top + s.h - ry, g.stride_h) - p.y0);
      const std::int64_t qx = std::max<std::int64_t>(0, ceil_div(g.pad_left + s.w - rx, g.stride_w) - p.x0);
      p.s = {s.n, s.oh, s.ow, s.cout, qy, qx, s.cin, p.my, p.mx};
      p.g.dilation_h = g.dilation_h, p.g.dilation_w = g.dilation_w;
      const std::int64_t reach_y = (p.my - 1) * g.dilation_h, reach_x = (p.mx - 1) * g.dilation_w;
      p.g.pad_top = reach_y - p.y0, p.g.pad_bottom = qy - s.oh - p.g.pad_top + reach_y;
      p.g.pad_left = reach_x - p.x0, p.g.pad_right = qx - s.ow - p.g.pad_left + reach_x;
      out.push_back(p);
    }
  return out;
}

/// Dilation with strides splits taps across phases unevenly (Keras allows only one of the two);
/// negative padding would mean an output beyond dy's reach, and an empty phase no convolution.
bool phases_possible(const ConvShape& s, const Conv2dGeometry& g) {
  if (g.groups != 1) return false;  // phase_kernel swaps whole channel axes
  if ((g.stride_h > 1 || g.stride_w > 1) && (g.dilation_h != 1 || g.dilation_w != 1)) return false;
  for (const Phase& p : phases(s, g))
    if (p.my && p.mx &&
        (p.g.pad_top < 0 || p.g.pad_bottom < 0 || p.g.pad_left < 0 || p.g.pad_right < 0 || p.s.oh <= 0 || p.s.ow <= 0))
      return false;
  return true;
}

/// The sub-kernel of phase p: [my, mx, cout, cin], flipped, from w [kh, kw, cin, cout].
Tensor phase_kernel(const Tensor& w, const Phase& p, const Conv2dGeometry& g) {
  const Shape& ws = w.shape();
  const std::int64_t kw = ws[1], ci = ws[2], co = ws[3];
  const std::size_t es = itemsize(w.dtype());
  Tensor out = Tensor::empty({p.my, p.mx, co, ci}, w.dtype(), w.device());
  const char* src = static_cast<const char*>(w.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (std::int64_t a = 0; a < p.my; ++a)
    for (std::int64_t b = 0; b < p.mx; ++b) {
      const std::int64_t i = p.ry + g.stride_h * (p.my - 1 - a), j = p.rx + g.stride_w * (p.mx - 1 - b);
      for (std::int64_t c = 0; c < ci; ++c)
        for (std::int64_t o = 0; o < co; ++o)
          std::memcpy(dst + (((a * p.mx + b) * co + o) * ci + c) * es, src + (((i * kw + j) * ci + c) * co + o) * es, es);
    }
  return out;
}

void backward_data_by_phases(const Tensor& w, const Tensor& dy, const ConvShape& s, const Conv2dGeometry& g, Tensor& dx) {
  const std::vector<Phase> all = phases(s, g);
  auto run = [&](const Phase& p, void* out) {
    PreparedWeights pw(phase_kernel(w, p, g));
    run_forward(forward_plan(p.s, p.g, dx.dtype(), nullptr, Activation::Linear), dy.data_ptr(), pw, nullptr, out);
  };
  if (all.size() == 1) return run(all[0], dx.data_ptr());  // stride 1: the phase is dx
  const std::size_t es = itemsize(dx.dtype()), pixel = static_cast<std::size_t>(s.cin) * es;
  for (const Phase& p : all) {
    Tensor part;
    if (p.my && p.mx) {
      part = Tensor::empty({s.n, p.s.oh, p.s.ow, s.cin}, dx.dtype(), dx.device());
      run(p, part.data_ptr());
    }
    // dx rows y = (y0 + qy) * sh + ry - pad_top of this phase (zero where no tap reaches it).
    char* d = static_cast<char*>(dx.data_ptr());
    const char* src = part.defined() ? static_cast<const char*>(part.data_ptr()) : nullptr;
    parallel_for(s.n * p.s.oh, 16, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t u = b; u < e; ++u) {
        const std::int64_t n = u / p.s.oh, y = (p.y0 + u % p.s.oh) * g.stride_h + p.ry - g.pad_top;
        for (std::int64_t qx = 0; qx < p.s.ow; ++qx) {
          const std::int64_t x = (p.x0 + qx) * g.stride_w + p.rx - g.pad_left;
          char* to = d + ((n * s.h + y) * s.w + x) * pixel;
          if (src) std::memcpy(to, src + (u * p.s.ow + qx) * pixel, pixel);
          else std::memset(to, 0, pixel);
        }
      }
    });
  }
}

enum class DataPath { Native, Phases, Staged };

DataPath data_path(const ConvShape& s, const Conv2dGeometry& g, DType d) {
  if (d != bfloat16) return d == float32 ? DataPath::Native : DataPath::Staged;
  const Bf16Mode m = bf16_mode();
  if (m != Bf16Mode::Auto) return m == Bf16Mode::Native ? DataPath::Native : DataPath::Staged;
  if (phases_possible(s, g)) {
    const std::vector<Phase> all = phases(s, g);
    const auto p = std::find_if(all.begin(), all.end(), [](const Phase& q) { return q.my && q.mx; });
    if (p != all.end() && on_amx(forward_plan(p->s, p->g, d, nullptr, Activation::Linear).impl)) return DataPath::Phases;
  }
  return bf16_wins(backward_data_plan(s, g, d).impl) ? DataPath::Native : DataPath::Staged;
}

bool native_weights(const ConvShape& s, const Conv2dGeometry& g, DType d) {
  if (d != bfloat16) return d == float32;
  const Bf16Mode m = bf16_mode();
  if (m != Bf16Mode::Auto) return m == Bf16Mode::Native;
  return bf16_wins(backward_weights_plan(s, g, d).impl);
}

// ---- the passes -------------------------------------------------------------------------------

void forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g, Activation act,
             Tensor& out) {
  ConvShape s = conv_shape(x.shape(), w.shape(), out.shape());
  const DType bias_dt = bias.defined() ? bias.dtype() : x.dtype();
  if (native_forward(s, g, x.dtype(), bias.defined() ? &bias_dt : nullptr, act)) {
    PreparedWeights pw(w);
    ForwardPlan& plan = forward_plan(s, g, x.dtype(), bias.defined() ? &bias_dt : nullptr, act);
    return run_forward(plan, x.data_ptr(), pw, bias.defined() ? bias.data_ptr() : nullptr, out.data_ptr());
  }
  PreparedWeights pw(to_float32(w));
  Tensor b32 = to_float32(bias);
  const std::int64_t images = chunk_images(s), in = s.h * s.w * s.cin, on = s.oh * s.ow * s.cout, n = s.n;
  Tensor xs = Tensor::empty({images * in}, float32, x.device()), ys = Tensor::empty({images * on}, float32, x.device());
  const DType f32 = float32;
  for (std::int64_t n0 = 0; n0 < n; n0 += images) {
    s.n = std::min(images, n - n0);
    convert_n(at(x, n0 * in), x.dtype(), xs.data_ptr(), float32, s.n * in);
    ForwardPlan& plan = forward_plan(s, g, float32, b32.defined() ? &f32 : nullptr, act);
    run_forward(plan, xs.data_ptr(), pw, b32.defined() ? b32.data_ptr() : nullptr, ys.data_ptr());
    convert_n(ys.data_ptr(), float32, at(out, n0 * on), out.dtype(), s.n * on);
  }
}

/// The float32 sums of dw/db for the chunks: the first chunk writes, the others add.
struct WeightGradSum {
  Tensor w, b, part_w, part_b, scratch;
  std::int64_t wsize, bsize;
  WeightGradSum(const ConvShape& s, const Conv2dGeometry& g)
      : wsize(s.kh * s.kw * (s.cin / g.groups) * s.cout), bsize(s.cout) {
    w = Tensor::empty({wsize}, float32, Device::cpu());
    b = Tensor::empty({bsize}, float32, Device::cpu());
  }
  void add(BackwardWeightsPlan& plan, const void* x, const void* dy, bool first) {
    if (first) return run_backward_weights(plan, x, dy, w.data<float>(), b.data<float>(), scratch);
    if (!part_w.defined()) part_w = Tensor::empty({wsize}, float32, Device::cpu()), part_b = Tensor::empty({bsize}, float32, Device::cpu());
    run_backward_weights(plan, x, dy, part_w.data<float>(), part_b.data<float>(), scratch);
    float* aw = w.data<float>();
    const float* pw = part_w.data<float>();
    for (std::int64_t i = 0; i < wsize; ++i) aw[i] += pw[i];
    float* ab = b.data<float>();
    const float* pb = part_b.data<float>();
    for (std::int64_t i = 0; i < bsize; ++i) ab[i] += pb[i];
  }
  void write(Tensor& dw, Tensor& dbias) const {
    if (dw.defined()) convert_n(w.data_ptr(), float32, dw.data_ptr(), dw.dtype(), wsize);
    if (dbias.defined()) convert_n(b.data_ptr(), float32, dbias.data_ptr(), dbias.dtype(), bsize);
  }
};

void backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g, Tensor& dx, Tensor& dw,
              Tensor& dbias) {
  const ConvShape full = conv_shape(x.shape(), w.shape(), dy.shape());
  const DType d = x.dtype();
  const DataPath dp = dx.defined() ? data_path(full, g, d) : DataPath::Native;
  const bool weights = dw.defined() || dbias.defined();
  const bool amx = weights && bf16_mode() == Bf16Mode::Auto && g.groups == 1 && amx_weights_applies(full, d);
  const bool wn = weights && !amx && native_weights(full, g, d);
  if (dx.defined() && dp == DataPath::Native) {
    PreparedWeights pw(w);
    run_backward_data(backward_data_plan(full, g, d), dy.data_ptr(), pw, dx.data_ptr());
  } else if (dx.defined() && dp == DataPath::Phases) {
    backward_data_by_phases(w, dy, full, g, dx);
  }
  if (amx) {
    WeightGradSum sum(full, g);
    amx_conv_backward_weights(x, dy, full, g, sum.w.data<float>(), dbias.defined() ? sum.b.data<float>() : nullptr);
    sum.write(dw, dbias);
  } else if (wn) {
    WeightGradSum sum(full, g);
    sum.add(backward_weights_plan(full, g, d), x.data_ptr(), dy.data_ptr(), true);
    sum.write(dw, dbias);
  }
  const bool staged_data = dx.defined() && dp == DataPath::Staged, staged_weights = weights && !wn && !amx;
  if (!staged_data && !staged_weights) return;
  // float32 chunks; dy is converted once for both passes.
  ConvShape s = full;
  const std::int64_t images = chunk_images(s), in = s.h * s.w * s.cin, on = s.oh * s.ow * s.cout;
  PreparedWeights pw(staged_data ? to_float32(w) : Tensor());
  Tensor xs = staged_weights ? Tensor::empty({images * in}, float32, x.device()) : Tensor();
  Tensor dys = Tensor::empty({images * on}, float32, x.device());
  Tensor dxs = staged_data ? Tensor::empty({images * in}, float32, x.device()) : Tensor();
  std::optional<WeightGradSum> sum;
  if (staged_weights) sum.emplace(full, g);
  for (std::int64_t n0 = 0; n0 < full.n; n0 += images) {
    s.n = std::min(images, full.n - n0);
    convert_n(at(dy, n0 * on), dy.dtype(), dys.data_ptr(), float32, s.n * on);
    if (staged_data) {
      run_backward_data(backward_data_plan(s, g, float32), dys.data_ptr(), pw, dxs.data_ptr());
      convert_n(dxs.data_ptr(), float32, at(dx, n0 * in), dx.dtype(), s.n * in);
    }
    if (staged_weights) {
      convert_n(at(x, n0 * in), x.dtype(), xs.data_ptr(), float32, s.n * in);
      sum->add(backward_weights_plan(s, g, float32), xs.data_ptr(), dys.data_ptr(), n0 == 0);
    }
  }
  if (sum) sum->write(dw, dbias);
}

}  // namespace

void CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,
                        Activation act, Tensor& out) {
  if (out.numel() == 0) return;
  if (x.dtype() == float64) return reference_conv_forward(x, w, bias, g, act, out);
  if (g.groups == 1 && small_conv_applies(x.shape(), w.shape(), x.dtype())) return small_conv_forward(x, w, bias, g, act, out);
  dnnl_call("conv2d", [&] { forward(x, w, bias, g, act, out); });
}

void CpuBackend::conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g, Tensor& dx,
                                 Tensor& dw, Tensor& dbias) {
  if (dy.numel() == 0) {  // an empty batch: zero gradients
    for (Tensor* t : {&dx, &dw, &dbias})
      if (t->defined()) fill(*t, 0.0);
    return;
  }
  if (x.dtype() == float64) {
    if (dx.defined()) reference_conv_backward_data(dy, w, g, dx);
    if (dw.defined() || dbias.defined()) {
      Tensor dwr = dw.defined() ? dw : Tensor::empty(w.shape(), float64, w.device());
      reference_conv_backward_weights(x, dy, g, dwr, dbias);
    }
    return;
  }
  if (g.groups == 1 && small_conv_applies(x.shape(), w.shape(), x.dtype()) && (dw.defined() || dbias.defined())) {
    small_conv_backward_weights(x, dy, g, dw, dbias);
    if (!dx.defined()) return;
    Tensor none;
    return dnnl_call("conv2d backward", [&] { backward(x, w, dy, g, dx, none, none); });
  }
  dnnl_call("conv2d backward", [&] { backward(x, w, dy, g, dx, dw, dbias); });
}

}  // namespace mpt::cpu
