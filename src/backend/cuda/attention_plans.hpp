#pragma once
/// cuDNN's fused scaled dot-product attention (flash attention) forward for 16-bit q, k, v,
/// described through the backend C API as the graph cudnn-frontend's composite SDPA node
/// expands to (frontend 1.32 on cuDNN < 9.21), which cuDNN's fused attention engines recognize:
///
///   S = matmul(Q, Kᵀ) · scale  [-> causal: select(S, -inf, row >= col)]
///   M = max(S), E = exp(S - M), Z = sum(E), Stats = M + log(Z), P = E / Z, O = matmul(P, V)
///
/// and the backward as that node's composite backward expands to with the dP workspace (cuDNN's
/// deterministic algorithm: no atomics, no dQ accumulator):
///
///   Δ = sum(dO · O) · 1 (a float32 buffer), P = exp(matmul(Q, Kᵀ) · scale - Stats) [causal],
///   dV = matmul(Pᵀ, dO), dS = (matmul(dO, Vᵀ) - Δ) · P · scale, dK = matmul(dSᵀ, Q),
///   dQ = matmul(dS, K)
///
/// over mpt's [B, T, H, D] tensors described in place (Q as [b, h, s_q, d] with strides, Kᵀ as
/// [b, h, d, s_kv]), S, M, E, Z and P virtual float32 tensors, Stats the rows' log-sum-exp
/// [b, h, s_q, 1] in float32 (the lse mpt's own backward kernels read). Plans are built for a
/// PlanTarget like the convolutions', so tests/cuda/test_cuda_attention_plans.cpp proves on a
/// machine without a GPU that cuDNN plans these graphs for an H100.
///
///   SdpaKey k{.batch = 16, .heads = 4, .q_len = 256, .kv_len = 256, .head_dim = 64, .value_dim = 64,
///             .dtype = DType::BFloat16, .causal = true};
///   int n = sdpa_plan_count(k, read_file("h100_sm90.json"));
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/cudnn_graph.hpp"
#include "mpt/dtype.hpp"

namespace mpt::cuda::attention {

/// Everything a plan depends on (the scale is a by-value tensor, not part of it).
struct SdpaKey {
  std::int64_t batch = 0, heads = 0, q_len = 0, kv_len = 0, head_dim = 0, value_dim = 0;
  DType dtype = DType::BFloat16;  ///< q, k, v and o: float16 or bfloat16
  bool causal = false;
  std::int64_t alignment = 16;  ///< bytes every data pointer is aligned to
  bool deterministic = true;    ///< only engines cuDNN does not note as nondeterministic
  bool backward = false;        ///< the backward graph (see the head of this file)
  bool operator==(const SdpaKey&) const = default;
};
std::string describe(const SdpaKey& k);
struct SdpaKeyHash {
  std::size_t operator()(const SdpaKey& k) const;
};

/// Uids of the variant pack: q, k, v, o, stats (lse), the scale, -inf and 1 (by value, host
/// floats); the backward's dO, dQ, dK, dV and its float32 row sums of dO·O ([b, h, s_q, 1], a
/// buffer the caller provides).
enum : std::int64_t {
  kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidStats = 5, kUidScale = 6, kUidNegInf = 7,
  kUidDO = 8, kUidDQ = 9, kUidDK = 10, kUidDV = 11, kUidSoftmaxSum = 12, kUidOne = 13, kUidDQAccum = 14
};

/// Whether mpt asks cuDNN at all: 16-bit q, k, v with head dims cuDNN's fused engines take
/// (multiples of 8, at most 256). cuDNN may still have no engine (then own kernels run).
bool sdpa_candidate(const SdpaKey& k);

/// Execution plans for k's forward graph (see the head of this file), at most max_plans (0: all);
/// empty when cuDNN has no engine for it.
std::vector<cudnn::Plan> build_sdpa_plans(const SdpaKey& k, const cudnn::PlanTarget& target, int max_plans);

/// What cuDNN says when asked to plan k's graph on one engine (by global index): SUCCESS, or
/// why not. cuDNN's fused attention engines compile their kernels at run time (NVRTC through the
/// driver), so without a driver a graph they support ends in
/// CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING, after every support check passed,
/// while a graph they do not support ends earlier (GRAPH_PATTERN, DATA_TYPE, ARCH_MISMATCH).
cudnnStatus_t sdpa_engine_status(const SdpaKey& k, const cudnn::PlanTarget& target, std::int64_t engine);

/// Device-less planning: how many execution plans finalize for k on the described device.
int sdpa_plan_count(const SdpaKey& k, const std::string& device_json);

}  // namespace mpt::cuda::attention
