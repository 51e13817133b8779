#include "backend/cuda/conv_plans.hpp"

#include <cstdio>
#include <functional>
#include <initializer_list>

#include "backend/cuda/cuda_check.hpp"
#include "mpt/error.hpp"
#include "mpt/log.hpp"

namespace mpt::cuda::conv {
bool cudnn_pointwise(Activation act, cudnnPointwiseMode_t& mode) {
  switch (act) {
    case UnaryOp::Relu: mode = CUDNN_POINTWISE_RELU_FWD; return true;
    case UnaryOp::Sigmoid: mode = CUDNN_POINTWISE_SIGMOID_FWD; return true;
    case UnaryOp::Tanh: mode = CUDNN_POINTWISE_TANH_FWD; return true;
    // The others run as unary() after the graph: cuDNN's GELU/ELU/SWISH modes round differently
    // from the shared formulas and its clipped/leaky ReLU attributes are not set here.
    case UnaryOp::Linear: case UnaryOp::Neg: case UnaryOp::Exp: case UnaryOp::Log: case UnaryOp::Sqrt:
    case UnaryOp::Square: case UnaryOp::Abs: case UnaryOp::Sign: case UnaryOp::Relu6: case UnaryOp::LeakyRelu:
    case UnaryOp::Gelu: case UnaryOp::GeluTanh: case UnaryOp::Silu:
      return false;
  }
  return false;
}

namespace {

using namespace cudnn;

std::string what(const char* op, const char* step) { return std::string(op) + ": " + step; }

cudnnDataType_t data_type(DType d, const char* op) {
  switch (d) {
    case DType::Float32: return CUDNN_DATA_FLOAT;
    case DType::Float16: return CUDNN_DATA_HALF;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    case DType::Float64: return CUDNN_DATA_DOUBLE;
    default: fail(op, ": cuDNN convolutions take float32, float16, bfloat16 or float64, got ", to_string(d));
  }
}

/// A 4-d tensor in cuDNN's logical [N, C, H, W] order with the given strides.
Descriptor tensor(std::int64_t uid, cudnnDataType_t type, std::initializer_list<std::int64_t> dims,
                  std::initializer_list<std::int64_t> strides, bool is_virtual, std::int64_t alignment,
                  const char* op) {
  return cudnn::tensor({uid, type, dims, strides, is_virtual, alignment}, op);
}

/// An NHWC activation [n, h, w, c] as cuDNN's [N, C, H, W] with channels-last strides.
Descriptor nhwc(std::int64_t uid, cudnnDataType_t type, std::int64_t n, std::int64_t h, std::int64_t w,
                std::int64_t c, bool is_virtual, std::int64_t alignment, const char* op) {
  return tensor(uid, type, {n, c, h, w}, {h * w * c, 1, w * c, c}, is_virtual, alignment, op);
}

/// The filter as cuDNN's [K = cout, C = cin / groups, R = kh, S = kw], stored KRSC ([cout, kh,
/// kw, cin / groups] contiguous), the NHWC filter layout cuDNN's kernels read; a C smaller than
/// x's channels makes the convolution grouped (cudnn-frontend and PyTorch's v8 path describe
/// groups the same way, with no group count anywhere). Not mpt's [kh, kw, cin, cout]
/// storage described by its strides: cuDNN 9.19 finalizes plans for that description and then, on
/// an H100, computes as if the filter were KRSC (every convolution wrong, seen 2026-11-26), so
/// conv.cpp always passes a KRSC copy.
Descriptor filter(const ConvKey& k, cudnnDataType_t type, std::int64_t alignment, const char* op) {
  const std::int64_t c = k.cin / k.groups;
  return tensor(kUidW, type, {k.cout, c, k.kh, k.kw}, {k.kh * k.kw * c, 1, k.kw * c, c}, false, alignment, op);
}

Descriptor pointwise_op(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor* b, const Descriptor& y,
                        const char* op) {
  return pointwise({mode}, x, b, y, op);
}

cudnnPointwiseMode_t pointwise_mode(Activation act, const char* op) {
  cudnnPointwiseMode_t mode{};
  MPT_CHECK(cudnn_pointwise(act, mode), op, ": no fused cuDNN pointwise mode for ", common::unary_name(act));
  return mode;
}

/// The cuDNN convolution descriptor of a key (Keras's convolution is a cross-correlation).
Descriptor convolution_descriptor(const ConvKey& k, cudnnDataType_t comp, const char* op) {
  Descriptor conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, what(op, "convolution descriptor").c_str());
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  set(conv.get(), CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, op, "convolution compute type");
  set(conv.get(), CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, op, "convolution mode");
  set_i64(conv.get(), CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, {2}, op, "convolution spatial dims");
  set_i64(conv.get(), CUDNN_ATTR_CONVOLUTION_DILATIONS, {k.dilation_h, k.dilation_w}, op, "convolution dilations");
  set_i64(conv.get(), CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {k.stride_h, k.stride_w}, op, "convolution strides");
  set_i64(conv.get(), CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {k.pad_top, k.pad_left}, op, "convolution pre-paddings");
  set_i64(conv.get(), CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {k.pad_bottom, k.pad_right}, op,
          "convolution post-paddings");
  finalize(conv, op, "convolution finalize");
  return conv;
}

/// The attributes of one of the three convolution operations: its activation-like, filter-like
/// and output-like tensors (fprop x, w, y; dgrad dx, w, dy; wgrad x, dw, dy).
struct ConvOperation {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  const char* name;
};
constexpr ConvOperation kFprop{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                               "fprop"};
constexpr ConvOperation kDgrad{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                               "dgrad"};
constexpr ConvOperation kWgrad{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                               CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                               "wgrad"};

/// One convolution operation over x, w and y with alpha 1 and beta 0 (outputs are overwritten),
/// in the compute type (double for float64 keys).
Descriptor conv_operation(const ConvOperation& t, const Descriptor& x, const Descriptor& w, const Descriptor& y,
                          const Descriptor& conv, bool dbl, const char* op) {
  const std::string n = t.name;
  const float one_f = 1.f, zero_f = 0.f;
  const double one_d = 1.0, zero_d = 0.0;
  const cudnnBackendAttributeType_t st = dbl ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  Descriptor d(t.type, what(op, (n + " operation").c_str()).c_str());
  set_desc(d.get(), t.x, x, op, (n + " x").c_str());
  set_desc(d.get(), t.w, w, op, (n + " w").c_str());
  set_desc(d.get(), t.y, y, op, (n + " y").c_str());
  set_desc(d.get(), t.conv, conv, op, (n + " convolution").c_str());
  set(d.get(), t.alpha, st, 1, dbl ? static_cast<const void*>(&one_d) : &one_f, op, (n + " alpha").c_str());
  set(d.get(), t.beta, st, 1, dbl ? static_cast<const void*>(&zero_d) : &zero_f, op, (n + " beta").c_str());
  finalize(d, op, (n + " finalize").c_str());
  return d;
}

/// Builds k's operation graph into out; false when cuDNN supports no such graph at all.
bool build_graph(const ConvKey& k, const PlanTarget& target, ConvGraph& out, const char* op) {
  const cudnnDataType_t io = data_type(k.dtype, op);
  const bool dbl = k.dtype == DType::Float64;
  const std::int64_t a = k.alignment;
  auto keep = [&](Descriptor d) -> const Descriptor& { return out.keep(std::move(d)); };
  const Descriptor& cd = keep(convolution_descriptor(k, dbl ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT, op));
  auto y_tensor = [&] { return nhwc(kUidY, io, k.n, k.oh, k.ow, k.cout, false, a, op); };

  std::vector<cudnnBackendDescriptor_t> ops;
  const Descriptor& x = keep(nhwc(kUidX, io, k.n, k.h, k.w, k.cin, false, a, op));
  if (k.pass == ConvPass::Forward) {
    // conv -> (+ bias) -> (activation), the intermediates virtual float32 tensors.
    const bool epilogue = k.bias || k.act != Activation::Linear;
    constexpr std::int64_t kConvOut = 101, kBiasOut = 102;
    const Descriptor& w = keep(filter(k, io, a, op));
    const Descriptor& y = keep(epilogue ? nhwc(kConvOut, CUDNN_DATA_FLOAT, k.n, k.oh, k.ow, k.cout, true, a, op)
                                        : y_tensor());
    ops.push_back(keep(conv_operation(kFprop, x, w, y, cd, dbl, op)).get());
    const Descriptor* last = &y;
    if (k.bias) {
      const Descriptor& b = keep(tensor(kUidBias, data_type(k.bias_dtype, op), {1, k.cout, 1, 1},
                                        {k.cout, 1, k.cout, k.cout}, false, a, op));
      const bool more = k.act != Activation::Linear;
      const Descriptor& s = keep(more ? nhwc(kBiasOut, CUDNN_DATA_FLOAT, k.n, k.oh, k.ow, k.cout, true, a, op)
                                      : y_tensor());
      ops.push_back(keep(pointwise_op(CUDNN_POINTWISE_ADD, *last, &b, s, op)).get());
      last = &s;
    }
    if (k.act != Activation::Linear) {
      const Descriptor& out_y = keep(y_tensor());
      ops.push_back(keep(pointwise_op(pointwise_mode(k.act, op), *last, nullptr, out_y, op)).get());
    }
  } else if (k.pass == ConvPass::BackwardData) {
    const Descriptor& w = keep(filter(k, io, a, op));
    const Descriptor& dy = keep(y_tensor());
    ops.push_back(keep(conv_operation(kDgrad, x, w, dy, cd, dbl, op)).get());
  } else {
    const Descriptor& dw = keep(filter(k, data_type(k.dw_dtype, op), a, op));
    const Descriptor& dy = keep(y_tensor());
    ops.push_back(keep(conv_operation(kWgrad, x, dw, dy, cd, dbl, op)).get());
  }

  return finalize_graph(out, ops, target, op);
}

/// Whether an engine's numerics fit mpt's contract for k: float32 accumulation; float32 data
/// in full float32 unless TF32 is allowed; deterministic unless k allows otherwise.
bool acceptable(const EngineInfo& e, const ConvKey& k) {
  if (e.has(CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)) return false;
  if (k.deterministic && e.has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) return false;
  const bool strict_f32 = k.dtype == DType::Float32 && !k.allow_tf32;
  return !(strict_f32 && (e.has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE) || e.has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)));
}

}  // namespace

const char* pass_name(ConvPass p) {
  switch (p) {
    case ConvPass::Forward: return "fprop";
    case ConvPass::BackwardData: return "dgrad";
    case ConvPass::BackwardFilter: return "wgrad";
  }
  return "?";
}

ConvKey conv_key(ConvPass pass, const Shape& x, const Shape& w, const Shape& y, const Conv2dGeometry& g, DType dtype) {
  ConvKey k;
  k.pass = pass;
  k.n = x[0], k.h = x[1], k.w = x[2], k.cin = x[3];
  k.oh = y[1], k.ow = y[2], k.cout = y[3];
  k.kh = w[0], k.kw = w[1];
  k.stride_h = g.stride_h, k.stride_w = g.stride_w, k.dilation_h = g.dilation_h, k.dilation_w = g.dilation_w;
  k.pad_top = g.pad_top, k.pad_bottom = g.pad_bottom, k.pad_left = g.pad_left, k.pad_right = g.pad_right;
  k.groups = g.groups;
  k.dtype = dtype;
  k.dw_dtype = dtype;
  k.bias_dtype = dtype;
  return k;
}

std::string describe(const ConvKey& k) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "%s %s x[%lld,%lld,%lld,%lld] w[%lld,%lld,%lld,%lld] y[%lld,%lld,%lld,%lld] s%lld,%lld d%lld,%lld "
                "p%lld,%lld,%lld,%lld",
                pass_name(k.pass), to_string(k.dtype).c_str(), (long long)k.n, (long long)k.h, (long long)k.w,
                (long long)k.cin, (long long)k.kh, (long long)k.kw, (long long)(k.cin / k.groups), (long long)k.cout,
                (long long)k.n, (long long)k.oh, (long long)k.ow, (long long)k.cout,
                (long long)k.stride_h, (long long)k.stride_w, (long long)k.dilation_h, (long long)k.dilation_w,
                (long long)k.pad_top, (long long)k.pad_bottom, (long long)k.pad_left, (long long)k.pad_right);
  std::string s = buf;
  if (k.groups != 1) s.append(" groups ").append(std::to_string(k.groups));
  if (k.pass == ConvPass::BackwardFilter && k.dw_dtype != k.dtype) s += " dw " + to_string(k.dw_dtype);
  if (k.bias) s += " +bias";
  if (k.act != Activation::Linear) s += std::string(" ") + common::unary_name(k.act);
  if (k.allow_tf32) s += " tf32";
  if (!k.deterministic) s += " nondeterministic";
  return s;
}

std::size_t hash_of(const ConvKey& k) {
  std::size_t h = 0;
  auto mix = [&](std::int64_t v) { h ^= std::hash<std::int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (std::int64_t v : {k.n, k.h, k.w, k.cin, k.oh, k.ow, k.cout, k.kh, k.kw, k.stride_h, k.stride_w, k.dilation_h,
                         k.dilation_w, k.pad_top, k.pad_bottom, k.pad_left, k.pad_right, k.groups, k.alignment})
    mix(v);
  mix(static_cast<std::int64_t>(k.pass) | static_cast<std::int64_t>(k.dtype) << 4 |
      static_cast<std::int64_t>(k.dw_dtype) << 8 | static_cast<std::int64_t>(k.bias_dtype) << 12 |
      static_cast<std::int64_t>(k.act) << 16 | std::int64_t{k.bias} << 20 |
      std::int64_t{k.allow_tf32} << 22 | std::int64_t{k.deterministic} << 23);
  return h;
}

std::vector<ConvPlan> build_plans(const ConvKey& k, const PlanTarget& target, int max_plans, const char* op) {
  MPT_CHECK((target.handle != nullptr) != (target.device_prop != nullptr), op,
            ": cuDNN plans need either a handle or a device description");
  (void)runtime_version();  // logs once when the runtime is older than the headers
  auto g = std::make_shared<ConvGraph>();
  g->device_prop = target.device_prop;
  if (!build_graph(k, target, *g, op)) return {};
  return plans_for(g, target, max_plans, [&](const EngineInfo& e) { return acceptable(e, k); }, op);
}

int plan_count(const ConvKey& k, const std::string& device_json) {
  return static_cast<int>(build_plans(k, PlanTarget{nullptr, device_properties(device_json)}, 0).size());
}

}  // namespace mpt::cuda::conv
