#include "backend/cuda/attention_plans.hpp"

#include <cstdio>
#include <functional>

#include "backend/cuda/cuda_check.hpp"
#include "mpt/error.hpp"

namespace mpt::cuda::attention {
namespace {

using namespace cudnn;
constexpr const char* kOp = "dot_product_attention";

cudnnDataType_t io_type(DType d) {
  MPT_CHECK(d == DType::BFloat16 || d == DType::Float16, kOp, ": cuDNN's fused attention takes float16 or bfloat16, got ",
            to_string(d));
  return d == DType::BFloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

Descriptor matmul_op(const Descriptor& a, const Descriptor& b, const Descriptor& c, Graph& g) {
  Descriptor mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "dot_product_attention: matmul descriptor");
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  set(mm.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, kOp, "matmul compute type");
  finalize(mm, kOp, "matmul finalize");
  const Descriptor& kept = g.keep(std::move(mm));
  Descriptor o(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "dot_product_attention: matmul operation");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, kOp, "matmul a");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, kOp, "matmul b");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, kOp, "matmul c");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, kept, kOp, "matmul descriptor");
  finalize(o, kOp, "matmul operation finalize");
  return o;
}

Descriptor reduction_op(cudnnReduceTensorOp_t mode, const Descriptor& x, const Descriptor& y, Graph& g) {
  Descriptor r(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "dot_product_attention: reduction descriptor");
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  set(r.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, kOp, "reduction operator");
  set(r.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, kOp, "reduction compute type");
  finalize(r, kOp, "reduction finalize");
  const Descriptor& kept = g.keep(std::move(r));
  Descriptor o(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "dot_product_attention: reduction operation");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, kOp, "reduction x");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, kOp, "reduction y");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, kept, kOp, "reduction descriptor");
  finalize(o, kOp, "reduction operation finalize");
  return o;
}

Descriptor reshape_op(const Descriptor& x, const Descriptor& y) {
  Descriptor o(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "dot_product_attention: reshape operation");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, kOp, "reshape x");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, kOp, "reshape y");
  finalize(o, kOp, "reshape operation finalize");
  return o;
}

bool build_backward_graph(const SdpaKey& k, const PlanTarget& target, Graph& g);

/// k's forward graph into g; false when cuDNN supports no such graph.
bool build_graph(const SdpaKey& k, const PlanTarget& target, Graph& g) {
  if (k.backward) return build_backward_graph(k, target, g);
  const cudnnDataType_t io = io_type(k.dtype), f32 = CUDNN_DATA_FLOAT;
  const std::int64_t b = k.batch, h = k.heads, sq = k.q_len, skv = k.kv_len, d = k.head_dim, dv = k.value_dim,
                     a = k.alignment;
  std::int64_t next_virtual = 100;
  auto t = [&](TensorSpec s) -> const Descriptor& { return g.keep(tensor(s, kOp)); };
  // [b, h, s, *] scores and row statistics, virtual float32.
  auto scores = [&](cudnnDataType_t type = CUDNN_DATA_FLOAT) -> const Descriptor& {
    return t({next_virtual++, type, {b, h, sq, skv}, {h * sq * skv, sq * skv, skv, 1}, true, a});
  };
  auto rows = [&](bool is_virtual, std::int64_t uid) -> const Descriptor& {
    return t({is_virtual ? next_virtual++ : uid, f32, {b, h, sq, 1}, {h * sq, sq, 1, 1}, is_virtual, a});
  };
  // mpt's [B, T, H, D] tensors in place: Q [b, h, sq, d], Kᵀ [b, h, d, skv], V [b, h, skv, dv].
  const Descriptor& q = t({kUidQ, io, {b, h, sq, d}, {sq * h * d, d, h * d, 1}, false, a});
  const Descriptor& kt = t({kUidK, io, {b, h, d, skv}, {skv * h * d, d, 1, h * d}, false, a});
  const Descriptor& v = t({kUidV, io, {b, h, skv, dv}, {skv * h * dv, dv, h * dv, 1}, false, a});
  const Descriptor& o = t({kUidO, io, {b, h, sq, dv}, {sq * h * dv, dv, h * dv, 1}, false, a});
  const Descriptor& scale = t({kUidScale, f32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, 16, true});

  std::vector<cudnnBackendDescriptor_t> ops;
  auto add = [&](Descriptor op) { ops.push_back(g.keep(std::move(op)).get()); };
  const Descriptor& s1 = scores();
  add(matmul_op(q, kt, s1, g));
  const Descriptor* s = &scores();
  add(pointwise({CUDNN_POINTWISE_MUL}, s1, &scale, *s, kOp));
  if (k.causal) {  // keep S where row >= col, else -inf (top-left aligned, as Keras and PyTorch)
    const Descriptor& row = scores(CUDNN_DATA_INT32);
    const Descriptor& col = scores(CUDNN_DATA_INT32);
    add(pointwise({CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2}, *s, nullptr, row, kOp));
    add(pointwise({CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3}, *s, nullptr, col, kOp));
    const Descriptor& keep = scores(CUDNN_DATA_BOOLEAN);
    add(pointwise({CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN}, row, &col, keep, kOp));
    const Descriptor& neg_inf = t({kUidNegInf, f32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, 16, true});
    const Descriptor& masked = scores();
    add(pointwise({CUDNN_POINTWISE_BINARY_SELECT}, *s, &neg_inf, masked, kOp, &keep));
    s = &masked;
  }
  // The softmax with its statistics, as cudnn-frontend's composite softmax node.
  const Descriptor& m = rows(true, 0);
  add(reduction_op(CUDNN_REDUCE_TENSOR_MAX, *s, m, g));
  const Descriptor& centered = scores();
  add(pointwise({CUDNN_POINTWISE_SUB}, *s, &m, centered, kOp));
  const Descriptor& e = scores();
  add(pointwise({CUDNN_POINTWISE_EXP}, centered, nullptr, e, kOp));
  const Descriptor& z = rows(true, 0);
  add(reduction_op(CUDNN_REDUCE_TENSOR_ADD, e, z, g));
  const Descriptor& log_z = rows(true, 0);
  add(pointwise({CUDNN_POINTWISE_LOG}, z, nullptr, log_z, kOp));
  const Descriptor& stats = rows(false, kUidStats);
  add(pointwise({CUDNN_POINTWISE_ADD}, m, &log_z, stats, kOp));
  const Descriptor& p = scores(io);  // the second matmul's operands share one type (cuDNN's rule)
  add(pointwise({CUDNN_POINTWISE_DIV}, e, &z, p, kOp));
  add(matmul_op(p, v, o, g));
  return finalize_graph(g, ops, target, kOp);
}

/// k's backward graph into g (cudnn-frontend 1.32's composite SDPA backward on cuDNN 9.x with
/// the dP workspace: h_q = h_k = h_v, no bias, dropout or padding).
bool build_backward_graph(const SdpaKey& k, const PlanTarget& target, Graph& g) {
  const cudnnDataType_t io = io_type(k.dtype), f32 = CUDNN_DATA_FLOAT;
  const std::int64_t b = k.batch, h = k.heads, sq = k.q_len, skv = k.kv_len, d = k.head_dim, dv = k.value_dim,
                     a = k.alignment;
  std::int64_t next_virtual = 100;
  auto t = [&](TensorSpec s) -> const Descriptor& { return g.keep(tensor(s, kOp)); };
  auto scores = [&](cudnnDataType_t type = CUDNN_DATA_FLOAT) -> const Descriptor& {
    return t({next_virtual++, type, {b, h, sq, skv}, {h * sq * skv, sq * skv, skv, 1}, true, a});
  };
  auto transposed = [&](cudnnDataType_t type) -> const Descriptor& {  // [b, h, skv, sq] of the scores
    return t({next_virtual++, type, {b, h, skv, sq}, {h * sq * skv, sq * skv, 1, skv}, true, a});
  };
  auto scalar = [&](std::int64_t uid) -> const Descriptor& {
    return t({uid, f32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, 16, true});
  };
  // mpt's [B, T, H, D] tensors in place.
  auto bshd = [&](std::int64_t uid, std::int64_t s, std::int64_t e) -> const Descriptor& {
    return t({uid, io, {b, h, s, e}, {s * h * e, e, h * e, 1}, false, a});
  };
  const Descriptor& q = bshd(kUidQ, sq, d);
  const Descriptor& kt = t({kUidK, io, {b, h, d, skv}, {skv * h * d, d, 1, h * d}, false, a});
  const Descriptor& vt = t({kUidV, io, {b, h, dv, skv}, {skv * h * dv, dv, 1, h * dv}, false, a});
  const Descriptor& o = bshd(kUidO, sq, dv);
  const Descriptor& d_o = bshd(kUidDO, sq, dv);
  const Descriptor& dq = bshd(kUidDQ, sq, d);
  const Descriptor& dk = bshd(kUidDK, skv, d);
  const Descriptor& dvt = bshd(kUidDV, skv, dv);
  const Descriptor& stats = t({kUidStats, f32, {b, h, sq, 1}, {h * sq, sq, 1, 1}, false, a});
  const Descriptor& scale = scalar(kUidScale);
  const Descriptor& one = scalar(kUidOne);

  std::vector<cudnnBackendDescriptor_t> ops;
  auto add = [&](Descriptor op) { ops.push_back(g.keep(std::move(op)).get()); };
  // Δ = sum over the value dim of dO · O, in a float32 buffer.
  const Descriptor& prod = t({next_virtual++, f32, {b, h, sq, dv}, {h * sq * dv, sq * dv, h * dv, 1}, true, a});
  add(pointwise({CUDNN_POINTWISE_MUL}, d_o, &o, prod, kOp));
  const Descriptor& row_sum = t({next_virtual++, f32, {b, h, sq, 1}, {h * sq, sq, 1, 1}, true, a});
  add(reduction_op(CUDNN_REDUCE_TENSOR_ADD, prod, row_sum, g));
  const Descriptor& delta = t({kUidSoftmaxSum, f32, {b, h, sq, 1}, {h * sq, sq, 1, 1}, false, a});
  add(pointwise({CUDNN_POINTWISE_MUL}, row_sum, &one, delta, kOp));
  // P = exp(S · scale - Stats), masked.
  const Descriptor& s1 = scores();
  add(matmul_op(q, kt, s1, g));
  const Descriptor& s2 = scores();
  add(pointwise({CUDNN_POINTWISE_MUL}, s1, &scale, s2, kOp));
  const Descriptor* s = &scores();
  add(pointwise({CUDNN_POINTWISE_SUB}, s2, &stats, *s, kOp));
  if (k.causal) {
    const Descriptor& row = scores(CUDNN_DATA_INT32);
    const Descriptor& col = scores(CUDNN_DATA_INT32);
    add(pointwise({CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2}, *s, nullptr, row, kOp));
    add(pointwise({CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3}, *s, nullptr, col, kOp));
    const Descriptor& keep = scores(CUDNN_DATA_BOOLEAN);
    add(pointwise({CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN}, row, &col, keep, kOp));
    const Descriptor& neg_inf = scalar(kUidNegInf);
    const Descriptor& masked = scores();
    add(pointwise({CUDNN_POINTWISE_BINARY_SELECT}, *s, &neg_inf, masked, kOp, &keep));
    s = &masked;
  }
  const Descriptor& p = scores();
  add(pointwise({CUDNN_POINTWISE_EXP}, *s, nullptr, p, kOp));
  // dV = Pᵀ · dO.
  const Descriptor& pt = transposed(io);
  add(reshape_op(p, pt));
  add(matmul_op(pt, d_o, dvt, g));
  // dS = (dO · Vᵀ - Δ) · P · scale.
  const Descriptor& dp = scores();
  add(matmul_op(d_o, vt, dp, g));
  const Descriptor& dp_centered = scores();
  add(pointwise({CUDNN_POINTWISE_SUB}, dp, &delta, dp_centered, kOp));
  const Descriptor& ds_unscaled = scores();
  add(pointwise({CUDNN_POINTWISE_MUL}, dp_centered, &p, ds_unscaled, kOp));
  const Descriptor& ds = scores();
  add(pointwise({CUDNN_POINTWISE_MUL}, ds_unscaled, &scale, ds, kOp));
  // dK = dSᵀ · Q, dQ = dS · K.
  const Descriptor& dst = transposed(io);
  add(reshape_op(ds, dst));
  add(matmul_op(dst, q, dk, g));
  // K back from Kᵀ, virtual float32 (as cudnn-frontend types it: the engine refuses a 16-bit one).
  const Descriptor& kk = t({next_virtual++, f32, {b, h, skv, d}, {skv * h * d, d, h * d, 1}, true, a});
  add(reshape_op(kt, kk));
  if (k.deterministic) {
    add(matmul_op(ds, kk, dq, g));
  } else {  // dQ accumulated in a float32 buffer (zeroed before each run), then cast
    const Descriptor& acc = t({kUidDQAccum, f32, {b, h, sq, d}, {h * sq * d, sq * d, d, 1}, false, a});
    add(matmul_op(ds, kk, acc, g));
    add(pointwise({CUDNN_POINTWISE_IDENTITY}, acc, nullptr, dq, kOp));
  }
  return finalize_graph(g, ops, target, kOp);
}

}  // namespace

std::string describe(const SdpaKey& k) {
  char buf[240];
  std::snprintf(buf, sizeof buf, "sdpa%s %s q[%lld,%lld,%lld,%lld] kv_len %lld value_dim %lld%s align %lld",
                k.backward ? " backward" : "", to_string(k.dtype).c_str(), (long long)k.batch, (long long)k.q_len, (long long)k.heads,
                (long long)k.head_dim, (long long)k.kv_len, (long long)k.value_dim, k.causal ? " causal" : "",
                (long long)k.alignment);
  return buf;
}

std::size_t SdpaKeyHash::operator()(const SdpaKey& k) const {
  std::size_t h = 0;
  auto mix = [&](std::int64_t v) { h ^= std::hash<std::int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (std::int64_t v : {k.batch, k.heads, k.q_len, k.kv_len, k.head_dim, k.value_dim, k.alignment}) mix(v);
  mix(static_cast<std::int64_t>(k.dtype) | std::int64_t{k.causal} << 8 | std::int64_t{k.deterministic} << 9 |
      std::int64_t{k.backward} << 10);
  return h;
}

bool sdpa_candidate(const SdpaKey& k) {
  const bool half = k.dtype == DType::BFloat16 || k.dtype == DType::Float16;
  return half && k.batch > 0 && k.heads > 0 && k.q_len > 0 && k.kv_len > 0 && k.head_dim % 8 == 0 &&
         k.value_dim % 8 == 0 && k.head_dim > 0 && k.value_dim > 0 && k.head_dim <= 256 && k.value_dim <= 256;
}

std::vector<Plan> build_sdpa_plans(const SdpaKey& k, const PlanTarget& target, int max_plans) {
  MPT_CHECK((target.handle != nullptr) != (target.device_prop != nullptr), kOp,
            ": cuDNN plans need either a handle or a device description");
  (void)runtime_version();
  auto g = std::make_shared<Graph>();
  g->device_prop = target.device_prop;
  if (!build_graph(k, target, *g)) return {};
  return plans_for(
      g, target, max_plans,
      [&](const EngineInfo& e) { return !(k.deterministic && e.has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)); }, kOp);
}

cudnnStatus_t sdpa_engine_status(const SdpaKey& k, const PlanTarget& target, std::int64_t engine) {
  auto g = std::make_shared<Graph>();
  g->device_prop = target.device_prop;
  if (!build_graph(k, target, *g)) return CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN;
  Descriptor e(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "dot_product_attention: engine");
  set_desc(e.get(), CUDNN_ATTR_ENGINE_OPERATION_GRAPH, g->graph, kOp, "engine graph");
  set_i64(e.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, {engine}, kOp, "engine index");
  if (target.device_prop) set_desc(e.get(), CUDNN_ATTR_ENGINE_DEVICEPROP, *target.device_prop, kOp, "engine device");
  if (cudnnStatus_t s = cudnnBackendFinalize(e.get()); s != CUDNN_STATUS_SUCCESS) return s;
  // The engine's kernel configurations (its KERNEL_CFG knob; the backward engines take none by
  // default), each tried until one plans or stops only at the missing driver.
  std::int64_t lo = -1, hi = -1;
  {
    std::vector<Descriptor> infos;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
      infos.emplace_back(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR, "dot_product_attention: knob info");
      raw.push_back(infos.back().get());
    }
    std::int64_t n = 0;
    check_cudnn(cudnnBackendGetAttribute(e.get(), CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                         static_cast<std::int64_t>(raw.size()), &n, raw.data()),
                "dot_product_attention: engine knob info");
    for (std::int64_t i = 0; i < n; ++i) {
      cudnnBackendKnobType_t type{};
      std::int64_t count = 0, mn = 0, mx = 0;
      check_cudnn(cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &count, &type),
                  "dot_product_attention: knob type");
      if (type != CUDNN_KNOB_TYPE_KERNEL_CFG) continue;
      check_cudnn(cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, 1, &count, &mn),
                  "dot_product_attention: knob minimum");
      check_cudnn(cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, 1, &count, &mx),
                  "dot_product_attention: knob maximum");
      lo = mn, hi = mx;
    }
  }
  cudnnStatus_t best = CUDNN_STATUS_NOT_SUPPORTED;
  for (std::int64_t cfg_value = lo; cfg_value <= hi; ++cfg_value) {
    Descriptor cfg(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "dot_product_attention: engine config");
    set_desc(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, e, kOp, "engine config engine");
    Descriptor knob(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, "dot_product_attention: knob choice");
    if (cfg_value >= 0) {
      const cudnnBackendKnobType_t type = CUDNN_KNOB_TYPE_KERNEL_CFG;
      set(knob.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type, kOp, "knob type");
      set_i64(knob.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, {cfg_value}, kOp, "knob value");
      finalize(knob, kOp, "knob finalize");
      set_desc(cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, knob, kOp, "engine config knobs");
    }
    cudnnStatus_t s = cudnnBackendFinalize(cfg.get());
    if (s == CUDNN_STATUS_SUCCESS) {
      Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "dot_product_attention: plan");
      set_desc(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg, kOp, "plan engine config");
      if (target.handle)
        set(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle, kOp, "plan handle");
      else
        set_desc(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, *target.device_prop, kOp, "plan device properties");
      s = cudnnBackendFinalize(plan.get());
    }
    if (s == CUDNN_STATUS_SUCCESS) return s;
    if (s == CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING || best == CUDNN_STATUS_NOT_SUPPORTED) best = s;
  }
  return best;
}

int sdpa_plan_count(const SdpaKey& k, const std::string& device_json) {
  return static_cast<int>(build_sdpa_plans(k, PlanTarget{nullptr, device_properties(device_json)}, 0).size());
}

}  // namespace mpt::cuda::attention
