// Attention forward and backward through cuDNN's fused flash attention (attention_plans.cpp
// builds the graphs) for 16-bit q, k, v: one plan per problem and GPU, cached like the convolutions' (an empty
// entry where cuDNN has no engine, so the question is asked once), run on the device's compute
// stream. Explicit masks, float32 and float64 and head dims cuDNN's engines do not take stay on
// the own kernels of attention.cu.
#include <array>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "backend/cuda/attention_plans.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "mpt/device.hpp"
#include "mpt/log.hpp"

namespace mpt::cuda {
namespace {

using attention::SdpaKey;
using attention::SdpaKeyHash;
constexpr int kMaxDevices = 16;

/// Per device: the plan of each problem; an empty Plan when cuDNN has none. Guarded by
/// cudnn::mutex().
std::array<std::unordered_map<SdpaKey, cudnn::Plan, SdpaKeyHash>, kMaxDevices>& plans() {
  static auto* p = new std::array<std::unordered_map<SdpaKey, cudnn::Plan, SdpaKeyHash>, kMaxDevices>;
  return *p;  // never destroyed: plans outlive static destructors
}

const cudnn::Plan* plan_for(const SdpaKey& k, int idx) {
  std::lock_guard<std::mutex> lock(cudnn::mutex());
  cudnnHandle_t h = cudnn::handle_locked(idx);
  MPT_CHECK(idx < kMaxDevices, "dot_product_attention: no GPU with index ", idx);
  auto& cache = plans()[idx];
  auto it = cache.find(k);
  if (it == cache.end()) {
    std::vector<cudnn::Plan> built = attention::build_sdpa_plans(k, cudnn::PlanTarget{h, nullptr}, 1);
    if (built.empty())
      mpt::log(LogLevel::info, "dot_product_attention: cuDNN ", cudnn::version_string(cudnn::runtime_version()),
               " has no fused engine for ", attention::describe(k), " on GPU ", idx, "; mpt's kernels run it");
    else
      mpt::log(LogLevel::info, "dot_product_attention: cuDNN engine ", built.front().engine, " for ",
               attention::describe(k), " on GPU ", idx, " (workspace ", built.front().workspace, " bytes)");
    it = cache.emplace(k, built.empty() ? cudnn::Plan{} : std::move(built.front())).first;
  }
  return it->second.plan ? &it->second : nullptr;
}

}  // namespace

bool CudaBackend::fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                  const AttentionGeometry& g, Tensor& out, Tensor& lse) {
  if (mask.defined() || out.numel() == 0) return false;  // masks: mpt's kernels
  SdpaKey key{.batch = g.batch, .heads = g.heads, .q_len = g.q_len, .kv_len = g.kv_len, .head_dim = g.head_dim,
              .value_dim = g.value_dim, .dtype = q.dtype(), .causal = g.causal,
              .alignment = cudnn::alignment_of({q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                                lse.data_ptr()}),
              .deterministic = cudnn_deterministic()};
  if (!attention::sdpa_candidate(key)) return false;
  const int idx = out.device().index;
  const cudnn::Plan* plan = plan_for(key, idx);
  if (!plan) return false;
  DeviceGuard guard(idx);
  float scale = static_cast<float>(g.scale), neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<std::int64_t> uids{attention::kUidQ, attention::kUidK, attention::kUidV, attention::kUidO,
                                 attention::kUidStats, attention::kUidScale};
  std::vector<void*> ptrs{const_cast<void*>(q.data_ptr()), const_cast<void*>(k.data_ptr()),
                          const_cast<void*>(v.data_ptr()), out.data_ptr(), lse.data_ptr(), &scale};
  if (g.causal) uids.push_back(attention::kUidNegInf), ptrs.push_back(&neg_inf);
  cudnn::execute(*plan, idx, uids, ptrs, out.device(), "dot_product_attention");
  return true;
}

bool CudaBackend::fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                           const Tensor& out, const Tensor& lse, const Tensor& dout,
                                           const AttentionGeometry& g, Tensor& dq, Tensor& dk, Tensor& dv) {
  if (mask.defined() || dq.numel() == 0) return false;  // masks: mpt's kernels
  SdpaKey key{.batch = g.batch, .heads = g.heads, .q_len = g.q_len, .kv_len = g.kv_len, .head_dim = g.head_dim,
              .value_dim = g.value_dim, .dtype = q.dtype(), .causal = g.causal,
              .alignment = cudnn::alignment_of({q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                                lse.data_ptr(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                                dv.data_ptr()}),
              .deterministic = cudnn_deterministic(), .backward = true};
  if (!attention::sdpa_candidate(key)) return false;
  const int idx = dq.device().index;
  const cudnn::Plan* plan = plan_for(key, idx);
  if (!plan) return false;
  DeviceGuard guard(idx);
  // Δ = rowsum(dO · O) in float32, and (the nondeterministic graph) dQ's float32 accumulator,
  // zeroed: buffers of the graph the caller provides.
  Tensor delta = Tensor::empty({g.batch * g.heads * g.q_len}, float32, dq.device());
  Tensor dq_acc = key.deterministic ? Tensor() : Tensor::zeros({g.batch * g.heads * g.q_len * g.head_dim}, float32,
                                                               dq.device());
  float scale = static_cast<float>(g.scale), one = 1.0f, neg_inf = -std::numeric_limits<float>::infinity();
  auto in = [](const Tensor& t) { return const_cast<void*>(t.data_ptr()); };
  std::vector<std::int64_t> uids{attention::kUidQ,  attention::kUidK,  attention::kUidV,  attention::kUidO,
                                 attention::kUidDO, attention::kUidStats, attention::kUidDQ, attention::kUidDK,
                                 attention::kUidDV, attention::kUidSoftmaxSum, attention::kUidScale,
                                 attention::kUidOne};
  std::vector<void*> ptrs{in(q),          in(k),          in(v),          in(out),          in(dout),
                          in(lse),        dq.data_ptr(),  dk.data_ptr(),  dv.data_ptr(),    delta.data_ptr(),
                          &scale,         &one};
  if (g.causal) uids.push_back(attention::kUidNegInf), ptrs.push_back(&neg_inf);
  if (dq_acc.defined()) uids.push_back(attention::kUidDQAccum), ptrs.push_back(dq_acc.data_ptr());
  cudnn::execute(*plan, idx, uids, ptrs, dq.device(), "dot_product_attention backward");
  return true;
}

}  // namespace mpt::cuda
