#include "backend/cuda/conv_plans.hpp"

#include <cstdio>
#include <deque>
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

std::string what(const char* op, const char* step) { return std::string(op) + ": " + step; }

/// cuDNN reports "this engine / graph is not supported here" in the 3000s; anything else from a
/// finalize is a malformed description (a bug), reported as an error.
bool not_supported(cudnnStatus_t s) { return CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_NOT_SUPPORTED; }

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         std::int64_t count, const void* values, const char* op, const char* step) {
  check_cudnn(cudnnBackendSetAttribute(d, name, type, count, values), what(op, step).c_str());
}
void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, const Descriptor& v, const char* op,
              const char* step) {
  cudnnBackendDescriptor_t p = v.get();
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p, op, step);
}
void set_i64(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, std::initializer_list<std::int64_t> v,
             const char* op, const char* step) {
  set(d, name, CUDNN_TYPE_INT64, static_cast<std::int64_t>(v.size()), v.begin(), op, step);
}
void finalize(const Descriptor& d, const char* op, const char* step) {
  check_cudnn(cudnnBackendFinalize(d.get()), what(op, step).c_str());
}

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
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what(op, "tensor descriptor").c_str());
  set(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, op, "tensor data type");
  set_i64(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, dims, op, "tensor dimensions");
  set_i64(t.get(), CUDNN_ATTR_TENSOR_STRIDES, strides, op, "tensor strides");
  set_i64(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, {uid}, op, "tensor uid");
  set_i64(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, {alignment}, op, "tensor alignment");
  const bool v = is_virtual;
  set(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, op, "tensor is_virtual");
  finalize(t, op, "tensor finalize");
  return t;
}

/// An NHWC activation [n, h, w, c] as cuDNN's [N, C, H, W] with channels-last strides.
Descriptor nhwc(std::int64_t uid, cudnnDataType_t type, std::int64_t n, std::int64_t h, std::int64_t w,
                std::int64_t c, bool is_virtual, std::int64_t alignment, const char* op) {
  return tensor(uid, type, {n, c, h, w}, {h * w * c, 1, w * c, c}, is_virtual, alignment, op);
}

/// The filter as cuDNN's [K = cout, C = cin, R = kh, S = kw], stored KRSC ([cout, kh, kw, cin]
/// contiguous), the NHWC filter layout cuDNN's kernels read. Not mpt's [kh, kw, cin, cout]
/// storage described by its strides: cuDNN 9.19 finalizes plans for that description and then, on
/// an H100, computes as if the filter were KRSC (every convolution wrong, seen 2026-11-26), so
/// conv.cpp always passes a KRSC copy.
Descriptor filter(const ConvKey& k, cudnnDataType_t type, std::int64_t alignment, const char* op) {
  return tensor(kUidW, type, {k.cout, k.cin, k.kh, k.kw}, {k.kh * k.kw * k.cin, 1, k.kw * k.cin, k.cin}, false,
                alignment, op);
}

Descriptor pointwise_op(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor* b, const Descriptor& y,
                        const char* op) {
  Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what(op, "pointwise descriptor").c_str());
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  set(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, op, "pointwise mode");
  set(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, op, "pointwise precision");
  finalize(pw, op, "pointwise finalize");
  Descriptor o(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what(op, "pointwise operation").c_str());
  set_desc(o.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, op, "pointwise descriptor");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, op, "pointwise x");
  if (b) set_desc(o.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b, op, "pointwise b");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, op, "pointwise y");
  finalize(o, op, "pointwise operation finalize");
  return o;
}

cudnnPointwiseMode_t pointwise_mode(Activation act, const char* op) {
  cudnnPointwiseMode_t mode{};
  MPT_CHECK(cudnn_pointwise(act, mode), op, ": no fused cuDNN pointwise mode for ", common::unary_name(act));
  return mode;
}

}  // namespace

struct ConvGraph {
  std::shared_ptr<const Descriptor> device_prop;  // what the graph is planned for, when no handle
  std::deque<Descriptor> parts;  // tensors, convolution, operations (a deque: references stay valid)
  Descriptor graph;
  ConvGraph() = default;
  ConvGraph(const ConvGraph&) = delete;
  ConvGraph& operator=(const ConvGraph&) = delete;
  ~ConvGraph() {  // each descriptor before the ones it refers to
    graph = Descriptor();
    while (!parts.empty()) parts.pop_back();
  }
};

namespace {

/// Builds k's operation graph into out; false when cuDNN supports no such graph at all.
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

bool build_graph(const ConvKey& k, const PlanTarget& target, ConvGraph& out, const char* op) {
  const cudnnDataType_t io = data_type(k.dtype, op);
  const bool dbl = k.dtype == DType::Float64;
  const std::int64_t a = k.alignment;
  auto keep = [&](Descriptor d) -> const Descriptor& {
    out.parts.push_back(std::move(d));
    return out.parts.back();
  };
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

  out.graph = Descriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what(op, "operation graph").c_str());
  set(out.graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
      static_cast<std::int64_t>(ops.size()), ops.data(), op, "operation graph ops");
  if (target.handle)
    set(out.graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle, op,
        "operation graph handle");
  const cudnnStatus_t s = cudnnBackendFinalize(out.graph.get());
  if (not_supported(s)) return false;
  check_cudnn(s, what(op, "operation graph finalize").c_str());
  return true;
}

/// Engine configurations cuDNN's heuristic `mode` proposes for the graph, best first.
std::vector<Descriptor> engine_configs(const ConvGraph& g, const PlanTarget& target, cudnnBackendHeurMode_t mode,
                                       const char* op) {
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what(op, "engine heuristics").c_str());
  set_desc(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g.graph, op, "heuristics graph");
  set(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, op, "heuristics mode");
  if (target.device_prop)
    set_desc(heur.get(), CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, *target.device_prop, op, "heuristics device properties");
  const cudnnStatus_t s = cudnnBackendFinalize(heur.get());
  if (not_supported(s)) return {};
  check_cudnn(s, what(op, "heuristics finalize").c_str());
  std::int64_t count = 0;
  check_cudnn(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                       &count, nullptr),
              what(op, "heuristics result count").c_str());
  std::vector<Descriptor> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, what(op, "engine config").c_str());
    raw.push_back(cfgs.back().get());
  }
  if (count == 0) return cfgs;
  std::int64_t got = 0;
  check_cudnn(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       count, &got, raw.data()),
              what(op, "heuristics results").c_str());
  cfgs.resize(static_cast<std::size_t>(got));
  return cfgs;
}

/// The engine behind a configuration: its global index and whether its numerics fit mpt's
/// contract (float32 accumulation; float32 data in full float32 unless TF32 is allowed;
/// deterministic unless k allows otherwise).
struct EngineInfo {
  std::int64_t index = -1;
  bool acceptable = true;
};

EngineInfo engine_info(const Descriptor& cfg, const ConvKey& k, const char* op) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, what(op, "engine descriptor").c_str());
  cudnnBackendDescriptor_t e = engine.get();
  std::int64_t n = 0;
  check_cudnn(cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e),
              what(op, "engine of config").c_str());
  EngineInfo info;
  check_cudnn(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &info.index),
              what(op, "engine index").c_str());
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  std::int64_t count = 0;
  check_cudnn(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                       CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes),
              what(op, "engine numerical notes").c_str());
  const bool strict_f32 = k.dtype == DType::Float32 && !k.allow_tf32;
  for (std::int64_t i = 0; i < count; ++i) {
    if (notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) info.acceptable = false;
    if (k.deterministic && notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) info.acceptable = false;
    if (strict_f32 && (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
                       notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS))
      info.acceptable = false;
  }
  return info;
}

/// mpt::Error naming the runtime when it has no device descriptions.
void require_device_descriptions() {
  const std::size_t v = runtime_version();
  MPT_CHECK(v >= kDevicePropVersion, "conv2d: device descriptions (CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR) need cuDNN >= ",
            version_string(kDevicePropVersion), ", the cuDNN loaded at run time is ", version_string(v));
}

}  // namespace

std::size_t runtime_version() {
  static const std::size_t version = [] {
    const std::size_t v = cudnnGetVersion();
    if (v < CUDNN_VERSION)
      mpt::log(LogLevel::warning, "cuDNN: the library loaded at run time is ", version_string(v),
               ", older than the cuDNN ", version_string(CUDNN_VERSION),
               " mpt was built against: engines and features added since are unavailable");
    return v;
  }();
  return version;
}

std::string version_string(std::size_t v) {
  return mpt::detail::cat(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

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
                (long long)k.cin, (long long)k.kh, (long long)k.kw, (long long)k.cin, (long long)k.cout,
                (long long)k.n, (long long)k.oh, (long long)k.ow, (long long)k.cout,
                (long long)k.stride_h, (long long)k.stride_w, (long long)k.dilation_h, (long long)k.dilation_w,
                (long long)k.pad_top, (long long)k.pad_bottom, (long long)k.pad_left, (long long)k.pad_right);
  std::string s = buf;
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
                         k.dilation_w, k.pad_top, k.pad_bottom, k.pad_left, k.pad_right, k.alignment})
    mix(v);
  mix(static_cast<std::int64_t>(k.pass) | static_cast<std::int64_t>(k.dtype) << 4 |
      static_cast<std::int64_t>(k.dw_dtype) << 8 | static_cast<std::int64_t>(k.bias_dtype) << 12 |
      static_cast<std::int64_t>(k.act) << 16 | std::int64_t{k.bias} << 20 |
      std::int64_t{k.allow_tf32} << 22 | std::int64_t{k.deterministic} << 23);
  return h;
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type, const char* what) {
  check_cudnn(cudnnBackendCreateDescriptor(type, &d_), what);
}

Descriptor::~Descriptor() {
  if (d_) (void)cudnnBackendDestroyDescriptor(d_);
}

Descriptor& Descriptor::operator=(Descriptor&& o) noexcept {
  if (this != &o) {
    if (d_) (void)cudnnBackendDestroyDescriptor(d_);
    d_ = o.d_;
    o.d_ = nullptr;
  }
  return *this;
}

std::shared_ptr<const Descriptor> device_properties(const std::string& json) {
  const char* op = "conv2d";
  require_device_descriptions();
  auto d = std::make_shared<Descriptor>(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "conv2d: device properties descriptor");
  set(d->get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, static_cast<std::int64_t>(json.size()),
      json.data(), op, "device properties JSON");
  finalize(*d, op, "device properties from JSON");
  return d;
}

std::string serialize_device_properties(cudnnHandle_t handle) {
  const char* op = "conv2d";
  require_device_descriptions();
  Descriptor d(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "conv2d: device properties descriptor");
  set(d.get(), CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, op, "device properties handle");
  finalize(d, op, "device properties of handle");
  std::int64_t size = 0;
  check_cudnn(cudnnBackendGetAttribute(d.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &size,
                                       nullptr),
              "conv2d: device properties JSON size");
  std::string json(static_cast<std::size_t>(size), '\0');
  std::int64_t written = 0;
  check_cudnn(cudnnBackendGetAttribute(d.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, size,
                                       &written, json.data()),
              "conv2d: device properties JSON");
  json.resize(static_cast<std::size_t>(written));
  while (!json.empty() && json.back() == '\0') json.pop_back();
  return json;
}

std::vector<ConvPlan> build_plans(const ConvKey& k, const PlanTarget& target, int max_plans, const char* op) {
  MPT_CHECK((target.handle != nullptr) != (target.device_prop != nullptr), op,
            ": cuDNN plans need either a handle or a device description");
  (void)runtime_version();  // logs once when the runtime is older than the headers
  auto g = std::make_shared<ConvGraph>();
  g->device_prop = target.device_prop;
  std::vector<ConvPlan> plans;
  if (!build_graph(k, target, *g, op)) return plans;
  // Mode A ranks the engines for this problem; the fallback list adds engines A leaves out.
  std::vector<std::int64_t> planned;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (Descriptor& cfg : engine_configs(*g, target, mode, op)) {
      const EngineInfo info = engine_info(cfg, k, op);
      if (!info.acceptable) continue;
      bool seen = false;
      for (std::int64_t e : planned) seen = seen || e == info.index;
      if (seen) continue;  // each engine once (its best-ranked configuration that finalizes)
      ConvPlan p;
      p.engine = info.index;
      p.plan = Descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, what(op, "execution plan").c_str());
      set_desc(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg, op, "plan engine config");
      if (target.handle)
        set(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle, op, "plan handle");
      else
        set_desc(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, *target.device_prop, op, "plan device properties");
      // An engine that cannot run this problem on this device fails here: try the next one.
      if (cudnnBackendFinalize(p.plan.get()) != CUDNN_STATUS_SUCCESS) continue;
      planned.push_back(info.index);
      p.graph = g;
      p.config = std::move(cfg);
      std::int64_t n = 0;
      check_cudnn(cudnnBackendGetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                           &n, &p.workspace),
                  what(op, "plan workspace size").c_str());
      plans.push_back(std::move(p));
      if (max_plans > 0 && static_cast<int>(plans.size()) >= max_plans) return plans;
    }
  }
  return plans;
}

int plan_count(const ConvKey& k, const std::string& device_json) {
  return static_cast<int>(build_plans(k, PlanTarget{nullptr, device_properties(device_json)}, 0).size());
}

}  // namespace mpt::cuda::conv
