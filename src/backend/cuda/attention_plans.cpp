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

/// Tensors and operations of one SDPA graph, kept alive by g: mpt's [B, T, H, D] tensors in
/// place, the virtual score and row tensors, by-value scalars, and the operations in order.
struct SdpaGraph {
  SdpaGraph(const SdpaKey& key, Graph& graph) : k(key), g(graph) {}
  const SdpaKey& k;
  Graph& g;
  const cudnnDataType_t io = io_type(k.dtype);
  const std::int64_t b = k.batch, h = k.heads, sq = k.q_len, skv = k.kv_len, a = k.alignment;
  std::int64_t next_virtual = 100;
  std::vector<cudnnBackendDescriptor_t> ops;

  const Descriptor& t(const TensorSpec& s) { return g.keep(tensor(s, kOp)); }
  void add(Descriptor op) { ops.push_back(g.keep(std::move(op)).get()); }
  /// [b, h, s, e] stored as mpt's [B, T, H, D] (transposed: [b, h, e, s], the same memory).
  const Descriptor& bshd(std::int64_t uid, std::int64_t s, std::int64_t e, bool transposed = false) {
    if (transposed) return t({uid, io, {b, h, e, s}, {s * h * e, e, 1, h * e}, false, a});
    return t({uid, io, {b, h, s, e}, {s * h * e, e, h * e, 1}, false, a});
  }
  /// Virtual [b, h, sq, skv] scores (float32 unless told).
  const Descriptor& scores(cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return t({next_virtual++, type, {b, h, sq, skv}, {h * sq * skv, sq * skv, skv, 1}, true, a});
  }
  /// The scores' [b, h, skv, sq] transpose (a RESHAPE's output).
  const Descriptor& transposed(cudnnDataType_t type) {
    return t({next_virtual++, type, {b, h, skv, sq}, {h * sq * skv, sq * skv, 1, skv}, true, a});
  }
  /// Float32 [b, h, sq, 1] per-row values: virtual, or the buffer of `uid`.
  const Descriptor& rows(std::int64_t uid = 0) {
    const bool v = uid == 0;
    return t({v ? next_virtual++ : uid, CUDNN_DATA_FLOAT, {b, h, sq, 1}, {h * sq, sq, 1, 1}, v, a});
  }
  const Descriptor& scalar(std::int64_t uid) {
    return t({uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, 16, true});
  }
  /// s where row >= col, else -inf (top-left aligned, as Keras and PyTorch), as
  /// cudnn-frontend's diagonal band mask: GEN_INDEX, CMP_GE, BINARY_SELECT.
  const Descriptor& causal(const Descriptor& s) {
    const Descriptor& row = scores(CUDNN_DATA_INT32);
    const Descriptor& col = scores(CUDNN_DATA_INT32);
    add(pointwise({CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2}, s, nullptr, row, kOp));
    add(pointwise({CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3}, s, nullptr, col, kOp));
    const Descriptor& keep = scores(CUDNN_DATA_BOOLEAN);
    add(pointwise({CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN}, row, &col, keep, kOp));
    const Descriptor& masked = scores();
    add(pointwise({CUDNN_POINTWISE_BINARY_SELECT}, s, &scalar(kUidNegInf), masked, kOp, &keep));
    return masked;
  }
  /// y = mode(x[, b]) into a new virtual tensor made by `out`.
  template <class Out>
  const Descriptor& op(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor* b, Out out) {
    const Descriptor& y = out();
    add(pointwise({mode}, x, b, y, kOp));
    return y;
  }
};

/// k's forward graph into g.
bool build_forward_graph(const SdpaKey& k, const PlanTarget& target, Graph& g) {
  SdpaGraph G(k, g);
  auto scores = [&] { return std::cref(G.scores()); };
  auto rows = [&] { return std::cref(G.rows()); };
  const Descriptor& q = G.bshd(kUidQ, k.q_len, k.head_dim);
  const Descriptor& kt = G.bshd(kUidK, k.kv_len, k.head_dim, true);
  const Descriptor& v = G.bshd(kUidV, k.kv_len, k.value_dim);
  const Descriptor& o = G.bshd(kUidO, k.q_len, k.value_dim);
  const Descriptor& s1 = G.scores();
  G.add(matmul_op(q, kt, s1, g));
  const Descriptor* s = &G.op(CUDNN_POINTWISE_MUL, s1, &G.scalar(kUidScale), scores);
  if (k.causal) s = &G.causal(*s);
  // The softmax with its statistics, as cudnn-frontend's composite softmax node.
  const Descriptor& m = G.rows();
  G.add(reduction_op(CUDNN_REDUCE_TENSOR_MAX, *s, m, g));
  const Descriptor& e = G.op(CUDNN_POINTWISE_EXP, G.op(CUDNN_POINTWISE_SUB, *s, &m, scores), nullptr, scores);
  const Descriptor& z = G.rows();
  G.add(reduction_op(CUDNN_REDUCE_TENSOR_ADD, e, z, g));
  const Descriptor& log_z = G.op(CUDNN_POINTWISE_LOG, z, nullptr, rows);
  G.op(CUDNN_POINTWISE_ADD, m, &log_z, [&] { return std::cref(G.rows(kUidStats)); });
  // The second matmul's operands share one type (cuDNN's rule): P in the inputs' 16-bit type.
  const Descriptor& p = G.op(CUDNN_POINTWISE_DIV, e, &z, [&] { return std::cref(G.scores(G.io)); });
  G.add(matmul_op(p, v, o, g));
  return finalize_graph(g, G.ops, target, kOp);
}

/// k's backward graph into g (cudnn-frontend 1.32's composite SDPA backward on cuDNN 9.x:
/// h_q = h_k = h_v, no bias, dropout or padding).
bool build_backward_graph(const SdpaKey& k, const PlanTarget& target, Graph& g) {
  SdpaGraph G(k, g);
  auto scores = [&] { return std::cref(G.scores()); };
  const std::int64_t d = k.head_dim, dv = k.value_dim, sq = k.q_len, skv = k.kv_len;
  const Descriptor& q = G.bshd(kUidQ, sq, d);
  const Descriptor& kt = G.bshd(kUidK, skv, d, true);
  const Descriptor& vt = G.bshd(kUidV, skv, dv, true);
  const Descriptor& o = G.bshd(kUidO, sq, dv);
  const Descriptor& d_o = G.bshd(kUidDO, sq, dv);
  const Descriptor& scale = G.scalar(kUidScale);
  // Δ = Σ over the value dim of dO · O, into a float32 buffer.
  const Descriptor& prod = G.op(CUDNN_POINTWISE_MUL, d_o, &o, [&] {
    return std::cref(G.t({G.next_virtual++, CUDNN_DATA_FLOAT, {G.b, G.h, sq, dv}, {G.h * sq * dv, sq * dv, G.h * dv, 1},
                          true, G.a}));
  });
  const Descriptor& row_sum = G.rows();
  G.add(reduction_op(CUDNN_REDUCE_TENSOR_ADD, prod, row_sum, g));
  const Descriptor& delta = G.op(CUDNN_POINTWISE_MUL, row_sum, &G.scalar(kUidOne),
                                 [&] { return std::cref(G.rows(kUidSoftmaxSum)); });
  // P = exp(S · scale - Stats), masked.
  const Descriptor& s1 = G.scores();
  G.add(matmul_op(q, kt, s1, g));
  const Descriptor& s2 = G.op(CUDNN_POINTWISE_MUL, s1, &scale, scores);
  const Descriptor* s = &G.op(CUDNN_POINTWISE_SUB, s2, &G.rows(kUidStats), scores);
  if (k.causal) s = &G.causal(*s);
  const Descriptor& p = G.op(CUDNN_POINTWISE_EXP, *s, nullptr, scores);
  // dV = Pᵀ · dO.
  const Descriptor& pt = G.transposed(G.io);
  G.add(reshape_op(p, pt));
  G.add(matmul_op(pt, d_o, G.bshd(kUidDV, skv, dv), g));
  // dS = (dO · Vᵀ - Δ) · P · scale.
  const Descriptor& dp = G.scores();
  G.add(matmul_op(d_o, vt, dp, g));
  const Descriptor& ds = G.op(CUDNN_POINTWISE_MUL,
                              G.op(CUDNN_POINTWISE_MUL, G.op(CUDNN_POINTWISE_SUB, dp, &delta, scores), &p, scores),
                              &scale, scores);
  // dK = dSᵀ · Q.
  const Descriptor& dst = G.transposed(G.io);
  G.add(reshape_op(ds, dst));
  G.add(matmul_op(dst, q, G.bshd(kUidDK, skv, d), g));
  // dQ = dS · K, K back from Kᵀ as a virtual float32 (as cudnn-frontend types it: cuDNN does
  // not take a 16-bit one as a fused attention graph).
  const Descriptor& kk = G.t({G.next_virtual++, CUDNN_DATA_FLOAT, {G.b, G.h, skv, d}, {skv * G.h * d, d, G.h * d, 1},
                              true, G.a});
  G.add(reshape_op(kt, kk));
  const Descriptor& dq = G.bshd(kUidDQ, sq, d);
  if (k.deterministic) {
    G.add(matmul_op(ds, kk, dq, g));
  } else {  // dQ accumulated in a float32 buffer (zeroed before each run), then cast
    const Descriptor& acc = G.t({kUidDQAccum, CUDNN_DATA_FLOAT, {G.b, G.h, sq, d}, {G.h * sq * d, sq * d, d, 1},
                                 false, G.a});
    G.add(matmul_op(ds, kk, acc, g));
    G.add(pointwise({CUDNN_POINTWISE_IDENTITY}, acc, nullptr, dq, kOp));
  }
  return finalize_graph(g, G.ops, target, kOp);
}

/// k's graph into g; false when cuDNN supports no such graph.
bool build_graph(const SdpaKey& k, const PlanTarget& target, Graph& g) {
  return k.backward ? build_backward_graph(k, target, g) : build_forward_graph(k, target, g);
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
