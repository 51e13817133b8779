#pragma once
// oneDNN convolution plans for the CPU backend: primitives built once per shape, dtype and
// attributes (PrimitiveCache), the Keras-layout kernel reordered into each primitive's layout,
// and their execution on raw NHWC buffers. conv.cpp decides which plans a convolution runs.
#include <string>

#include "backend/backend.hpp"
#include "backend/cpu/dnnl_util.hpp"

namespace mpt::cpu::conv {

using md_t = dnnl::memory::desc;

/// One convolution problem: x [n, h, w, cin] * kernel [kh, kw, cin, cout] -> y [n, oh, ow, cout]
/// (kernel [kh, kw, cin / groups, cout] for a grouped convolution, the geometry's groups).
struct ConvShape {
  std::int64_t n, h, w, cin, oh, ow, cout, kh, kw;
};

inline ConvShape conv_shape(const Shape& x, const Shape& w, const Shape& y) {
  return {x[0], x[1], x[2], x[3], y[1], y[2], y[3], w[0], w[1]};
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
    dnnl::memory prim(in.prim, eng, storage_.data_ptr()), user(in.user, eng, w_.data_ptr());
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
  std::string impl;
};

struct BackwardDataPlan {
  dnnl::convolution_backward_data prim;
  md_t diff_src, diff_dst;
  WeightsIn weights;
  std::string impl;
};

struct BackwardWeightsPlan {
  dnnl::convolution_backward_weights prim;
  md_t src, diff_dst, diff_weights, diff_bias, user_diff_weights;  // f32; user: Keras layout
  dnnl::reorder to_user;
  bool reorder_needed = false;
  std::string impl;
};

ForwardPlan& forward_plan(const ConvShape& s, const Conv2dGeometry& g, DType d, const DType* bias_dt, Activation act);
BackwardDataPlan& backward_data_plan(const ConvShape& s, const Conv2dGeometry& g, DType d);
BackwardWeightsPlan& backward_weights_plan(const ConvShape& s, const Conv2dGeometry& g, DType d);

void run_forward(ForwardPlan& plan, const void* x, PreparedWeights& w, const void* bias, void* y);
void run_backward_data(BackwardDataPlan& plan, const void* dy, PreparedWeights& w, void* dx);
/// Diff weights (float32, Keras layout) and diff bias (float32); `scratch` holds the
/// primitive-layout result when it differs.
void run_backward_weights(BackwardWeightsPlan& plan, const void* x, const void* dy, float* dw, float* dbias,
                          Tensor& scratch);

}  // namespace mpt::cpu::conv
