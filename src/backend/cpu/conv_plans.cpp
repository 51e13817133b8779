#include "backend/cpu/conv_plans.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <unordered_map>

namespace mpt::cpu::conv {
namespace {

using tag = dnnl::memory::format_tag;
using dims = dnnl::memory::dims;

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
  if (g.groups == 1) {
    d.weights_any = md_t({s.cout, s.cin, s.kh, s.kw}, weights_t, tag::any);
    d.user_weights = md_t({s.cout, s.cin, s.kh, s.kw}, weights_t, tag::hwio);
  } else {
    // Grouped: oneDNN's [G, Cout/G, Cin/G, kh, kw] weights; Keras's [kh, kw, Cin/G, Cout] with
    // Cout = (G, Cout/G) is hwigo.
    const dims w = {g.groups, s.cout / g.groups, s.cin / g.groups, s.kh, s.kw};
    d.weights_any = md_t(w, weights_t, tag::any);
    d.user_weights = md_t(w, weights_t, tag::hwigo);
  }
  // A stride only matters between output pixels: with one output row (column) any stride from
  // the padded extent up gives it. oneDNN refuses strides past int range (a 'same' convolution
  // with stride 2^62 has one pixel: defect 7 of the hardening issue), so those are clamped there.
  auto stride = [](std::int64_t st, std::int64_t out, std::int64_t padded) { return out == 1 ? std::min(st, padded) : st; };
  d.strides = {stride(g.stride_h, s.oh, s.h + g.pad_top + g.pad_bottom),
               stride(g.stride_w, s.ow, s.w + g.pad_left + g.pad_right)};
  d.dilates = {g.dilation_h - 1, g.dilation_w - 1};  // oneDNN counts the gaps
  d.pad_l = {g.pad_top, g.pad_left};
  d.pad_r = {g.pad_bottom, g.pad_right};
  return d;
}

std::string conv_key(const char* kind, const ConvShape& s, const Conv2dGeometry& g, DType d, int a, int b) {
  // oneDNN fixes a primitive's thread partition when it is created: the thread count is part of the key.
  const int nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
  char key[352];
  std::snprintf(key, sizeof key, "%s|%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld|%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,g%lld|%d,%d,%d,t%d",
                kind, (long long)s.n, (long long)s.h, (long long)s.w, (long long)s.cin, (long long)s.oh,
                (long long)s.ow, (long long)s.cout, (long long)s.kh, (long long)s.kw, (long long)g.stride_h,
                (long long)g.stride_w, (long long)g.dilation_h, (long long)g.dilation_w, (long long)g.pad_top,
                (long long)g.pad_bottom, (long long)g.pad_left, (long long)g.pad_right, (long long)g.groups,
                static_cast<int>(d), a, b,
                nthr);
  return key;
}

dnnl::convolution_forward::primitive_desc forward_pd(const ConvDescs& d, const md_t& bias, Activation act) {
  const dnnl::primitive_attr attr = activation_attr(act);
  const auto prop = dnnl::prop_kind::forward_training;
  const auto alg = dnnl::algorithm::convolution_direct;
  auto desc = bias.is_zero() ? dnnl::convolution_forward::desc(prop, alg, d.src, d.weights_any, d.dst, d.strides,
                                                               d.dilates, d.pad_l, d.pad_r)
                             : dnnl::convolution_forward::desc(prop, alg, d.src, d.weights_any, bias, d.dst, d.strides,
                                                               d.dilates, d.pad_l, d.pad_r);
  return dnnl::convolution_forward::primitive_desc(desc, attr, dnnl_engine());
}

}  // namespace

ForwardPlan& forward_plan(const ConvShape& s, const Conv2dGeometry& g, DType d, const DType* bias_dt, Activation act) {
  static PrimitiveCache<ForwardPlan> cache;
  const std::string key = conv_key("fwd", s, g, d, bias_dt ? 1 + static_cast<int>(*bias_dt) : 0, static_cast<int>(act));
  return cache.get(key, [&] {
    ConvDescs cd = conv_descs(s, g, dnnl_type(d), dnnl_type(d));
    ForwardPlan p;
    if (bias_dt) p.bias = md_t({s.cout}, dnnl_type(*bias_dt), tag::x);
    auto pd = forward_pd(cd, p.bias, act);
    p.prim = dnnl::convolution_forward(pd);
    p.src = cd.src, p.dst = cd.dst;
    p.weights.init(cd.user_weights, pd.weights_desc());
    p.impl = pd.impl_info_str();
    return p;
  });
}

BackwardDataPlan& backward_data_plan(const ConvShape& s, const Conv2dGeometry& g, DType d) {
  static PrimitiveCache<BackwardDataPlan> cache;
  return cache.get(conv_key("bwd_data", s, g, d, 0, 0), [&] {
    ConvDescs cd = conv_descs(s, g, dnnl_type(d), dnnl_type(d));
    auto hint = forward_pd(cd, md_t(), Activation::Linear);
    dnnl::convolution_backward_data::desc desc(dnnl::algorithm::convolution_direct, cd.src, cd.weights_any, cd.dst,
                                               cd.strides, cd.dilates, cd.pad_l, cd.pad_r);
    dnnl::convolution_backward_data::primitive_desc pd(desc, dnnl_engine(), hint);
    BackwardDataPlan p;
    p.prim = dnnl::convolution_backward_data(pd);
    p.diff_src = cd.src, p.diff_dst = cd.dst;
    p.weights.init(cd.user_weights, pd.weights_desc());
    p.impl = pd.impl_info_str();
    return p;
  });
}

BackwardWeightsPlan& backward_weights_plan(const ConvShape& s, const Conv2dGeometry& g, DType d) {
  static PrimitiveCache<BackwardWeightsPlan> cache;
  return cache.get(conv_key("bwd_weights", s, g, d, 0, 0), [&] {
    const auto t = dnnl_type(d), f32 = dnnl::memory::data_type::f32;
    ConvDescs cd = conv_descs(s, g, t, f32);
    BackwardWeightsPlan p;
    p.diff_bias = md_t({s.cout}, f32, tag::x);
    auto hint = forward_pd(conv_descs(s, g, t, t), md_t({s.cout}, t, tag::x), Activation::Linear);
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
    p.impl = pd.impl_info_str();
    return p;
  });
}

void run_forward(ForwardPlan& plan, const void* x, PreparedWeights& w, const void* bias, void* y) {
  auto& eng = dnnl_engine();
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(plan.src, eng, const_cast<void*>(x))},
                                             {DNNL_ARG_WEIGHTS, w.get(plan.weights)},
                                             {DNNL_ARG_DST, dnnl::memory(plan.dst, eng, y)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(plan.bias, eng, const_cast<void*>(bias)));
  plan.prim.execute(dnnl_stream(), args);
  dnnl_stream().wait();
}

void run_backward_data(BackwardDataPlan& plan, const void* dy, PreparedWeights& w, void* dx) {
  auto& eng = dnnl_engine();
  plan.prim.execute(dnnl_stream(), {{DNNL_ARG_DIFF_DST, dnnl::memory(plan.diff_dst, eng, const_cast<void*>(dy))},
                                    {DNNL_ARG_WEIGHTS, w.get(plan.weights)},
                                    {DNNL_ARG_DIFF_SRC, dnnl::memory(plan.diff_src, eng, dx)}});
  dnnl_stream().wait();
}

/// Diff weights (float32, Keras layout) and diff bias (float32); `scratch` holds the
/// primitive-layout result when it differs.
void run_backward_weights(BackwardWeightsPlan& plan, const void* x, const void* dy, float* dw, float* dbias,
                          Tensor& scratch) {
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


}  // namespace mpt::cpu::conv
