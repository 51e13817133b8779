// 2-D convolution: oneDNN primitives over NHWC activations, with the Keras [kh, kw, Cin, Cout]
// kernel reordered into the layout the primitive prefers. float32 runs natively; float16 (and
// bfloat16, see below) computes in float32 with 16-bit storage; float64 uses reference loops
// (gradient checks).
//
// bfloat16 runs natively (bf16 operands, f32 accumulation) only where oneDNN may use AMX. With
// AVX512-BF16 alone, vdpbf16ps issues at half the rate of float32 FMAs on this CPU (measured:
// 101 vs 216 GFLOP/s per core), so oneDNN's native bf16 convolutions take twice as long as the
// float32 ones and converting to float32 wins. MPT_CPU_BF16_CONV=native|float32 overrides.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/dnnl_util.hpp"

namespace mpt::cpu {
namespace {

using dims = dnnl::memory::dims;
using tag = dnnl::memory::format_tag;
using md_t = dnnl::memory::desc;

struct ConvShape {
  std::int64_t n, h, w, cin, oh, ow, cout, kh, kw;
};

ConvShape conv_shape(const Shape& x, const Shape& w, const Shape& y) {
  return {x[0], x[1], x[2], x[3], y[1], y[2], y[3], w[0], w[1]};
}

bool bf16_native() {
  if (const char* e = std::getenv("MPT_CPU_BF16_CONV")) {
    if (!std::strcmp(e, "native")) return true;
    if (!std::strcmp(e, "float32")) return false;
  }
  static const bool amx = [] {
    dnnl_engine();  // fixes the ISA ceiling first
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto amx_bits = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
    return (isa & amx_bits) == amx_bits;
  }();
  return amx;
}

/// Whether a 16-bit conv computes in float32 (converted operands) rather than natively.
bool via_float32(DType d) { return d == float16 || (d == bfloat16 && !bf16_native()); }

dnnl::algorithm eltwise_of(Activation act) {
  switch (act) {
    case Activation::Relu: return dnnl::algorithm::eltwise_relu;
    case Activation::Sigmoid: return dnnl::algorithm::eltwise_logistic;
    case Activation::Tanh: return dnnl::algorithm::eltwise_tanh;
    default: return dnnl::algorithm::undef;
  }
}

/// The oneDNN view of one convolution problem (shapes in oneDNN's N, C, H, W order).
struct ConvDescs {
  md_t src, dst, weights_any, user_weights;
  dims strides, dilates, pad_l, pad_r;
};

ConvDescs conv_descs(const ConvShape& s, const Conv2dGeometry& g, dnnl::memory::data_type t,
                     dnnl::memory::data_type weights_t) {
  ConvDescs d;
  d.src = md_t({s.n, s.cin, s.h, s.w}, t, tag::nhwc);
  d.dst = md_t({s.n, s.cout, s.oh, s.ow}, t, tag::nhwc);
  d.weights_any = md_t({s.cout, s.cin, s.kh, s.kw}, weights_t, tag::any);
  d.user_weights = md_t({s.cout, s.cin, s.kh, s.kw}, weights_t, tag::hwio);
  d.strides = {g.stride_h, g.stride_w};
  d.dilates = {g.dilation_h - 1, g.dilation_w - 1};  // oneDNN counts the gaps
  d.pad_l = {g.pad_top, g.pad_left};
  d.pad_r = {g.pad_bottom, g.pad_right};
  return d;
}

std::string conv_key(const char* kind, const ConvShape& s, const Conv2dGeometry& g, DType d, int a, int b) {
  const int nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
  char key[320];
  std::snprintf(key, sizeof key, "%s|%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld|%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld|%d,%d,%d,t%d",
                kind, (long long)s.n, (long long)s.h, (long long)s.w, (long long)s.cin, (long long)s.oh,
                (long long)s.ow, (long long)s.cout, (long long)s.kh, (long long)s.kw, (long long)g.stride_h,
                (long long)g.stride_w, (long long)g.dilation_h, (long long)g.dilation_w, (long long)g.pad_top,
                (long long)g.pad_bottom, (long long)g.pad_left, (long long)g.pad_right, static_cast<int>(d), a, b,
                nthr);
  return key;
}

dnnl::convolution_forward::primitive_desc forward_pd(const ConvDescs& d, const md_t& bias, Activation act,
                                                     dnnl::prop_kind prop) {
  dnnl::primitive_attr attr;
  if (act != Activation::Linear) {
    dnnl::post_ops po;
    po.append_eltwise(1.f, eltwise_of(act), 0.f, 0.f);
    attr.set_post_ops(po);
  }
  auto desc = bias.is_zero()
                  ? dnnl::convolution_forward::desc(prop, dnnl::algorithm::convolution_direct, d.src, d.weights_any,
                                                    d.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
                  : dnnl::convolution_forward::desc(prop, dnnl::algorithm::convolution_direct, d.src, d.weights_any,
                                                    bias, d.dst, d.strides, d.dilates, d.pad_l, d.pad_r);
  return dnnl::convolution_forward::primitive_desc(desc, attr, dnnl_engine());
}

/// A Keras-layout -> primitive-layout reorder of the weights (none when the layouts agree).
struct WeightsIn {
  md_t user, prim;
  dnnl::reorder reorder;
  bool needed = false;
  void init(const md_t& user_md, const md_t& prim_md) {
    user = user_md, prim = prim_md;
    needed = user != prim;
    if (needed) reorder = dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), user, dnnl_engine(), prim));
  }
};

/// The weights of one call, reordered at most once for all the chunks whose primitives want the
/// same layout.
class PreparedWeights {
 public:
  explicit PreparedWeights(const Tensor& w) : w_(w) {}
  dnnl::memory get(const WeightsIn& in) {
    auto& eng = dnnl_engine();
    if (!in.needed) return dnnl::memory(in.user, eng, w_.data_ptr());
    if (storage_.defined() && desc_ == in.prim) return dnnl::memory(in.prim, eng, storage_.data_ptr());
    storage_ = Tensor::empty({static_cast<std::int64_t>(in.prim.get_size())}, uint8, w_.device());
    desc_ = in.prim;
    dnnl::memory prim(in.prim, eng, storage_.data_ptr());
    dnnl::memory user(in.user, eng, w_.data_ptr());
    in.reorder.execute(dnnl_stream(), user, prim);
    return prim;
  }

 private:
  Tensor w_, storage_;
  md_t desc_;
};

struct ForwardPlan {
  dnnl::convolution_forward prim;
  md_t src, dst, bias;
  WeightsIn weights;
};

struct BackwardDataPlan {
  dnnl::convolution_backward_data prim;
  md_t diff_src, diff_dst;
  WeightsIn weights;
};

struct BackwardWeightsPlan {
  dnnl::convolution_backward_weights prim;
  md_t src, diff_dst, diff_weights, diff_bias, user_diff_weights;  // f32; user: Keras layout
  dnnl::reorder to_user;
  bool reorder_needed = false;
};

PrimitiveCache<ForwardPlan>& forward_cache() {
  static PrimitiveCache<ForwardPlan> c;
  return c;
}
PrimitiveCache<BackwardDataPlan>& backward_data_cache() {
  static PrimitiveCache<BackwardDataPlan> c;
  return c;
}
PrimitiveCache<BackwardWeightsPlan>& backward_weights_cache() {
  static PrimitiveCache<BackwardWeightsPlan> c;
  return c;
}

void run_forward(const ConvShape& s, const Conv2dGeometry& g, DType d, const void* x, PreparedWeights& w,
                 const void* bias, DType bias_dt, Activation act, void* y) {
  const auto t = dnnl_type(d);
  const std::string key = conv_key("fwd", s, g, d, bias ? 1 + static_cast<int>(bias_dt) : 0, static_cast<int>(act));
  ForwardPlan& plan = forward_cache().get(key, [&] {
    ConvDescs cd = conv_descs(s, g, t, t);
    ForwardPlan p;
    if (bias) p.bias = md_t({s.cout}, dnnl_type(bias_dt), tag::x);
    auto pd = forward_pd(cd, p.bias, act, dnnl::prop_kind::forward_training);
    p.prim = dnnl::convolution_forward(pd);
    p.src = cd.src, p.dst = cd.dst;
    p.weights.init(cd.user_weights, pd.weights_desc());
    return p;
  });
  auto& eng = dnnl_engine();
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(plan.src, eng, const_cast<void*>(x))},
                                             {DNNL_ARG_WEIGHTS, w.get(plan.weights)},
                                             {DNNL_ARG_DST, dnnl::memory(plan.dst, eng, y)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(plan.bias, eng, const_cast<void*>(bias)));
  plan.prim.execute(dnnl_stream(), args);
  dnnl_stream().wait();
}

void run_backward_data(const ConvShape& s, const Conv2dGeometry& g, DType d, const void* dy, PreparedWeights& w,
                       void* dx) {
  const auto t = dnnl_type(d);
  BackwardDataPlan& plan = backward_data_cache().get(conv_key("bwd_data", s, g, d, 0, 0), [&] {
    ConvDescs cd = conv_descs(s, g, t, t);
    auto hint = forward_pd(cd, md_t(), Activation::Linear, dnnl::prop_kind::forward_training);
    dnnl::convolution_backward_data::desc desc(dnnl::algorithm::convolution_direct, cd.src, cd.weights_any, cd.dst,
                                               cd.strides, cd.dilates, cd.pad_l, cd.pad_r);
    dnnl::convolution_backward_data::primitive_desc pd(desc, dnnl_engine(), hint);
    BackwardDataPlan p;
    p.prim = dnnl::convolution_backward_data(pd);
    p.diff_src = cd.src, p.diff_dst = cd.dst;
    p.weights.init(cd.user_weights, pd.weights_desc());
    return p;
  });
  auto& eng = dnnl_engine();
  plan.prim.execute(dnnl_stream(), {{DNNL_ARG_DIFF_DST, dnnl::memory(plan.diff_dst, eng, const_cast<void*>(dy))},
                                    {DNNL_ARG_WEIGHTS, w.get(plan.weights)},
                                    {DNNL_ARG_DIFF_SRC, dnnl::memory(plan.diff_src, eng, dx)}});
  dnnl_stream().wait();
}

/// Diff weights (float32, Keras layout) and diff bias (float32) of one chunk; `scratch` holds
/// the primitive-layout result when it differs.
void run_backward_weights(const ConvShape& s, const Conv2dGeometry& g, DType d, const void* x, const void* dy,
                          float* dw, float* dbias, Tensor& scratch) {
  const auto t = dnnl_type(d);
  const auto f32 = dnnl::memory::data_type::f32;
  BackwardWeightsPlan& plan = backward_weights_cache().get(conv_key("bwd_weights", s, g, d, 0, 0), [&] {
    ConvDescs cd = conv_descs(s, g, t, f32);
    BackwardWeightsPlan p;
    p.diff_bias = md_t({s.cout}, f32, tag::x);
    auto hint = forward_pd(conv_descs(s, g, t, t), md_t({s.cout}, t, tag::x), Activation::Linear,
                           dnnl::prop_kind::forward_training);
    dnnl::convolution_backward_weights::desc desc(dnnl::algorithm::convolution_direct, cd.src, cd.weights_any,
                                                  p.diff_bias, cd.dst, cd.strides, cd.dilates, cd.pad_l, cd.pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(desc, dnnl_engine(), hint);
    p.prim = dnnl::convolution_backward_weights(pd);
    p.src = cd.src, p.diff_dst = cd.dst;
    p.diff_weights = pd.diff_weights_desc();
    p.user_diff_weights = cd.user_weights;
    p.reorder_needed = p.diff_weights != p.user_diff_weights;
    if (p.reorder_needed)
      p.to_user = dnnl::reorder(
          dnnl::reorder::primitive_desc(dnnl_engine(), p.diff_weights, dnnl_engine(), p.user_diff_weights));
    return p;
  });
  auto& eng = dnnl_engine();
  dnnl::memory user_dw(plan.user_diff_weights, eng, dw);
  dnnl::memory prim_dw = user_dw;
  if (plan.reorder_needed) {
    const auto bytes = static_cast<std::int64_t>(plan.diff_weights.get_size());
    if (!scratch.defined() || scratch.numel() < bytes) scratch = Tensor::empty({bytes}, uint8, Device::cpu());
    prim_dw = dnnl::memory(plan.diff_weights, eng, scratch.data_ptr());
  }
  plan.prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, dnnl::memory(plan.src, eng, const_cast<void*>(x))},
                                    {DNNL_ARG_DIFF_DST, dnnl::memory(plan.diff_dst, eng, const_cast<void*>(dy))},
                                    {DNNL_ARG_DIFF_WEIGHTS, prim_dw},
                                    {DNNL_ARG_DIFF_BIAS, dnnl::memory(plan.diff_bias, eng, dbias)}});
  if (plan.reorder_needed) plan.to_user.execute(dnnl_stream(), prim_dw, user_dw);
  dnnl_stream().wait();
}

/// Converts n elements in parallel (16-bit <-> float32 staging of the chunks).
void convert_n(const void* src, DType sd, void* dst, DType dd, std::int64_t n) {
  const std::size_t si = itemsize(sd), di = itemsize(dd);
  parallel_for(n, 1 << 14, [&](std::int64_t b, std::int64_t e) {
    detail::convert(static_cast<const char*>(src) + b * si, sd, static_cast<char*>(dst) + b * di, dd,
                    static_cast<std::size_t>(e - b));
  });
}

Tensor to_float32(const Tensor& t) {
  if (!t.defined() || t.dtype() == float32) return t;
  Tensor f = Tensor::empty(t.shape(), float32, t.device());
  convert_n(t.data_ptr(), t.dtype(), f.data_ptr(), float32, t.numel());
  return f;
}

/// How a call is split over the batch. 16-bit data computed in float32 goes through float32
/// copies of a few images at a time, small enough to stay in cache, so that memory traffic stays
/// 16-bit; native dtypes run the whole batch at once.
struct Chunks {
  DType compute;         // the primitives' dtype
  bool staged;           // 16-bit data staged through float32 chunks
  std::int64_t images;   // per chunk
  std::int64_t in_size, out_size;  // elements per image of x and y
};

Chunks chunks_of(const ConvShape& s, DType d) {
  Chunks c;
  c.staged = via_float32(d);
  c.compute = c.staged ? float32 : d;
  c.in_size = s.h * s.w * s.cin, c.out_size = s.oh * s.ow * s.cout;
  constexpr std::int64_t kChunkBytes = 4 << 20;
  c.images = c.staged ? std::clamp<std::int64_t>(kChunkBytes / (4 * (c.in_size + c.out_size)), 1, s.n) : s.n;
  return c;
}

const char* at(const Tensor& t, std::int64_t element) {
  return static_cast<const char*>(t.data_ptr()) + element * static_cast<std::int64_t>(itemsize(t.dtype()));
}
char* at(Tensor& t, std::int64_t element) {
  return static_cast<char*>(t.data_ptr()) + element * static_cast<std::int64_t>(itemsize(t.dtype()));
}

void dnnl_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g, Activation act,
                  Tensor& out) {
  ConvShape s = conv_shape(x.shape(), w.shape(), out.shape());
  const Chunks c = chunks_of(s, x.dtype());
  dnnl_call("conv2d", [&] {
    if (!c.staged) {
      PreparedWeights pw(w);
      return run_forward(s, g, c.compute, x.data_ptr(), pw, bias.defined() ? bias.data_ptr() : nullptr,
                         bias.defined() ? bias.dtype() : c.compute, act, out.data_ptr());
    }
    PreparedWeights pw(to_float32(w));
    Tensor b32 = to_float32(bias);
    Tensor xs = Tensor::empty({c.images * c.in_size}, float32, x.device());
    Tensor ys = Tensor::empty({c.images * c.out_size}, float32, x.device());
    const std::int64_t n = s.n;
    for (std::int64_t n0 = 0; n0 < n; n0 += c.images) {
      s.n = std::min(c.images, n - n0);
      convert_n(at(x, n0 * c.in_size), x.dtype(), xs.data_ptr(), float32, s.n * c.in_size);
      run_forward(s, g, float32, xs.data_ptr(), pw, b32.defined() ? b32.data_ptr() : nullptr, float32, act, ys.data_ptr());
      convert_n(ys.data_ptr(), float32, at(out, n0 * c.out_size), out.dtype(), s.n * c.out_size);
    }
  });
}

void dnnl_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g, Tensor& dx, Tensor& dw,
                   Tensor& dbias) {
  ConvShape s = conv_shape(x.shape(), w.shape(), dy.shape());
  const Chunks c = chunks_of(s, x.dtype());
  const bool weights = dw.defined() || dbias.defined();
  const std::int64_t wsize = s.kh * s.kw * s.cin * s.cout;
  dnnl_call("conv2d backward", [&] {
    PreparedWeights pw(c.staged ? to_float32(w) : w);
    // float32 sums over the chunks (Keras layout); a float32 dw of a single chunk is written in place
    const bool direct = c.images == s.n && dw.defined() && dw.dtype() == float32;
    Tensor acc_w = direct ? dw : Tensor::empty({wsize}, float32, x.device());
    Tensor acc_b = dbias.defined() && dbias.dtype() == float32 ? dbias : Tensor::empty({s.cout}, float32, x.device());
    Tensor part_w, part_b, scratch;
    if (weights && c.images < s.n) {
      part_w = Tensor::empty({wsize}, float32, x.device());
      part_b = Tensor::empty({s.cout}, float32, x.device());
    }
    Tensor xs, dys, dxs;
    if (c.staged) {
      xs = Tensor::empty({c.images * c.in_size}, float32, x.device());
      dys = Tensor::empty({c.images * c.out_size}, float32, x.device());
      if (dx.defined()) dxs = Tensor::empty({c.images * c.in_size}, float32, x.device());
    }
    const std::int64_t n = s.n;
    for (std::int64_t n0 = 0; n0 < n; n0 += c.images) {
      s.n = std::min(c.images, n - n0);
      const void* pdy = at(dy, n0 * c.out_size);
      if (c.staged) {
        convert_n(pdy, dy.dtype(), dys.data_ptr(), float32, s.n * c.out_size);
        pdy = dys.data_ptr();
      }
      if (dx.defined()) {
        void* pdx = c.staged ? dxs.data_ptr() : static_cast<void*>(at(dx, n0 * c.in_size));
        run_backward_data(s, g, c.compute, pdy, pw, pdx);
        if (c.staged) convert_n(pdx, float32, at(dx, n0 * c.in_size), dx.dtype(), s.n * c.in_size);
      }
      if (!weights) continue;
      const void* px = at(x, n0 * c.in_size);
      if (c.staged) {
        convert_n(px, x.dtype(), xs.data_ptr(), float32, s.n * c.in_size);
        px = xs.data_ptr();
      }
      const bool first = n0 == 0;
      run_backward_weights(s, g, c.compute, px, pdy, (first ? acc_w : part_w).data<float>(),
                           (first ? acc_b : part_b).data<float>(), scratch);
      if (!first) {
        float* aw = acc_w.data<float>();
        const float* pwv = part_w.data<float>();
        for (std::int64_t i = 0; i < wsize; ++i) aw[i] += pwv[i];
        float* ab = acc_b.data<float>();
        const float* pb = part_b.data<float>();
        for (std::int64_t i = 0; i < s.cout; ++i) ab[i] += pb[i];
      }
    }
    if (dw.defined() && acc_w.data_ptr() != dw.data_ptr()) convert_n(acc_w.data_ptr(), float32, dw.data_ptr(), dw.dtype(), wsize);
    if (dbias.defined() && acc_b.data_ptr() != dbias.data_ptr())
      convert_n(acc_b.data_ptr(), float32, dbias.data_ptr(), dbias.dtype(), s.cout);
  });
}

// ---- float64 reference loops ----------------------------------------------------------------

double activate(Activation act, double v) {
  switch (act) {
    case Activation::Relu: return v > 0 ? v : 0;
    case Activation::Sigmoid: return 1 / (1 + std::exp(-v));
    case Activation::Tanh: return std::tanh(v);
    default: return v;
  }
}

/// Calls f(input row, input col, kernel row, kernel col) for each tap of output (oy, ox) that
/// falls inside the input.
template <class F>
void for_taps(const ConvShape& s, const Conv2dGeometry& g, std::int64_t oy, std::int64_t ox, F&& f) {
  for (std::int64_t i = 0; i < s.kh; ++i) {
    const std::int64_t iy = oy * g.stride_h - g.pad_top + i * g.dilation_h;
    if (iy < 0 || iy >= s.h) continue;
    for (std::int64_t j = 0; j < s.kw; ++j) {
      const std::int64_t ix = ox * g.stride_w - g.pad_left + j * g.dilation_w;
      if (ix >= 0 && ix < s.w) f(iy, ix, i, j);
    }
  }
}

void reference_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g, Activation act,
                       Tensor& out) {
  const ConvShape s = conv_shape(x.shape(), w.shape(), out.shape());
  const double* X = x.data<double>();
  const double* W = w.data<double>();
  const double* B = bias.defined() ? bias.data<double>() : nullptr;
  double* Y = out.data<double>();
  parallel_for(s.n * s.oh, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t u = b; u < e; ++u) {
      const std::int64_t n = u / s.oh, oy = u % s.oh;
      for (std::int64_t ox = 0; ox < s.ow; ++ox) {
        double* o = Y + ((n * s.oh + oy) * s.ow + ox) * s.cout;
        for (std::int64_t co = 0; co < s.cout; ++co) o[co] = B ? B[co] : 0.0;
        for_taps(s, g, oy, ox, [&](std::int64_t iy, std::int64_t ix, std::int64_t i, std::int64_t j) {
          const double* xp = X + ((n * s.h + iy) * s.w + ix) * s.cin;
          const double* wp = W + (i * s.kw + j) * s.cin * s.cout;
          for (std::int64_t ci = 0; ci < s.cin; ++ci)
            for (std::int64_t co = 0; co < s.cout; ++co) o[co] += xp[ci] * wp[ci * s.cout + co];
        });
        for (std::int64_t co = 0; co < s.cout; ++co) o[co] = activate(act, o[co]);
      }
    }
  });
}

void reference_backward_data(const Tensor& dy, const Tensor& w, const Conv2dGeometry& g, Tensor& dx) {
  const ConvShape s = conv_shape(dx.shape(), w.shape(), dy.shape());
  const double* DY = dy.data<double>();
  const double* W = w.data<double>();
  double* DX = dx.data<double>();
  std::fill(DX, DX + dx.numel(), 0.0);
  parallel_for(s.n, 1, [&](std::int64_t b, std::int64_t e) {  // images scatter independently
    for (std::int64_t n = b; n < e; ++n)
      for (std::int64_t oy = 0; oy < s.oh; ++oy)
        for (std::int64_t ox = 0; ox < s.ow; ++ox) {
          const double* d = DY + ((n * s.oh + oy) * s.ow + ox) * s.cout;
          for_taps(s, g, oy, ox, [&](std::int64_t iy, std::int64_t ix, std::int64_t i, std::int64_t j) {
            double* xp = DX + ((n * s.h + iy) * s.w + ix) * s.cin;
            const double* wp = W + (i * s.kw + j) * s.cin * s.cout;
            for (std::int64_t ci = 0; ci < s.cin; ++ci) {
              double acc = 0;
              for (std::int64_t co = 0; co < s.cout; ++co) acc += d[co] * wp[ci * s.cout + co];
              xp[ci] += acc;
            }
          });
        }
  });
}

void reference_backward_weights(const Tensor& x, const Tensor& dy, const Conv2dGeometry& g, Tensor& dw,
                                Tensor& dbias) {
  const ConvShape s = conv_shape(x.shape(), dw.shape(), dy.shape());
  const double* X = x.data<double>();
  const double* DY = dy.data<double>();
  double* DW = dw.data<double>();
  parallel_for(s.kh * s.kw * s.cin, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t u = b; u < e; ++u) {
      const std::int64_t i = u / (s.kw * s.cin), j = (u / s.cin) % s.kw, ci = u % s.cin;
      double* o = DW + u * s.cout;
      std::fill(o, o + s.cout, 0.0);
      for (std::int64_t n = 0; n < s.n; ++n)
        for (std::int64_t oy = 0; oy < s.oh; ++oy) {
          const std::int64_t iy = oy * g.stride_h - g.pad_top + i * g.dilation_h;
          if (iy < 0 || iy >= s.h) continue;
          for (std::int64_t ox = 0; ox < s.ow; ++ox) {
            const std::int64_t ix = ox * g.stride_w - g.pad_left + j * g.dilation_w;
            if (ix < 0 || ix >= s.w) continue;
            const double xv = X[((n * s.h + iy) * s.w + ix) * s.cin + ci];
            const double* d = DY + ((n * s.oh + oy) * s.ow + ox) * s.cout;
            for (std::int64_t co = 0; co < s.cout; ++co) o[co] += xv * d[co];
          }
        }
    }
  });
  if (dbias.defined()) {
    double* DB = dbias.data<double>();
    std::fill(DB, DB + s.cout, 0.0);
    for (std::int64_t r = 0; r < s.n * s.oh * s.ow; ++r)
      for (std::int64_t co = 0; co < s.cout; ++co) DB[co] += DY[r * s.cout + co];
  }
}

}  // namespace

void CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,
                        Activation act, Tensor& out) {
  if (out.numel() == 0) return;
  if (x.dtype() == float64) return reference_forward(x, w, bias, g, act, out);
  dnnl_forward(x, w, bias, g, act, out);
}

void CpuBackend::conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g, Tensor& dx,
                                 Tensor& dw, Tensor& dbias) {
  if (dy.numel() == 0) {  // an empty batch: zero gradients
    for (Tensor* t : {&dx, &dw, &dbias})
      if (t->defined()) fill(*t, 0.0);
    return;
  }
  if (x.dtype() == float64) {
    if (dx.defined()) reference_backward_data(dy, w, g, dx);
    if (dw.defined() || dbias.defined()) {
      Tensor dwr = dw.defined() ? dw : Tensor::empty(w.shape(), float64, w.device());
      reference_backward_weights(x, dy, g, dwr, dbias);
    }
    return;
  }
  dnnl_backward(x, w, dy, g, dx, dw, dbias);
}

}  // namespace mpt::cpu
