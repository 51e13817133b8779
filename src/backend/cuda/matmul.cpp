// GEMM through cuBLASLt: the plan (matmul_plan.cpp) swaps operands for row-major data and picks
// types and epilogue; here the per-device handle and workspace, the heuristic along the
// fallback chain of choose_plan (the accepted attempt cached per first plan and device) and the
// launch on the device's stream. Activations cuBLASLt cannot fuse the CPU's way run as unary()
// on the result.
#include <algorithm>
#include <array>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/matmul_plan.hpp"
#include "mpt/device.hpp"
#include "mpt/error.hpp"

namespace mpt::cuda {
namespace {

constexpr int kMaxDevices = 16;
/// cuBLASLt's split-K and stream-K kernels use it; 32 MiB covers Hopper's needs (as PyTorch).
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

/// The attempt cuBLASLt accepted for a plan key (see choose_plan), with its algorithm.
struct Chosen {
  MatmulAttempt attempt;
  MatmulPlan plan;
  cublasLtMatmulAlgo_t algo{};
};

MatmulShape shape_of(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  MatmulShape s;
  for (std::size_t i = 0; i + 2 < sa.size(); ++i) s.batch_a *= sa[i];
  for (std::size_t i = 0; i + 2 < sb.size(); ++i) s.batch_b *= sb[i];
  s.m = ta ? sa[sa.size() - 1] : sa[sa.size() - 2];
  s.k = ta ? sa[sa.size() - 2] : sa[sa.size() - 1];
  s.n = tb ? sb[sb.size() - 2] : sb[sb.size() - 1];
  s.transpose_a = ta;
  s.transpose_b = tb;
  return s;
}

class Preference {
 public:
  Preference() { check_cublas(cublasLtMatmulPreferenceCreate(&p_), "matmul: cublasLtMatmulPreferenceCreate"); }
  ~Preference() { (void)cublasLtMatmulPreferenceDestroy(p_); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  template <typename T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, T value, const char* what) {
    check_cublas(cublasLtMatmulPreferenceSetAttribute(p_, attr, &value, sizeof value), what);
  }
  cublasLtMatmulPreference_t get() const { return p_; }

 private:
  cublasLtMatmulPreference_t p_ = nullptr;
};

/// cuBLASLt's best algorithm for the plan within the workspace and the operands' alignment, in
/// `algo` when the outcome is ok(); every refusal (a failed status, no algorithm) is an outcome
/// for choose_plan's fallbacks, not an error.
LtOutcome heuristic(cublasLtHandle_t handle, const MatmulPlan& plan, const void* bias, cublasLtMatmulAlgo_t& algo) {
  LtDescriptors d = make_descriptors(plan, bias);
  Preference pref;
  pref.set<std::uint64_t>(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspaceBytes,
                          "matmul: cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  pref.set<std::uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, plan.align_a,
                          "matmul: cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_A_BYTES)");
  pref.set<std::uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, plan.align_b,
                          "matmul: cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_B_BYTES)");
  pref.set<std::uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, plan.align_d,
                          "matmul: cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_C_BYTES)");
  pref.set<std::uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, plan.align_d,
                          "matmul: cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_D_BYTES)");
  cublasLtMatmulHeuristicResult_t result{};
  LtOutcome outcome;
  outcome.status =
      cublasLtMatmulAlgoGetHeuristic(handle, d.op, d.a, d.b, d.c, d.d, pref.get(), 1, &result, &outcome.found);
  if (outcome.status == CUBLAS_STATUS_SUCCESS && outcome.found > 0) outcome.state = result.state;
  if (outcome.ok()) algo = result.algo;
  return outcome;
}

/// Launch statuses that say this plan cannot run here (another attempt may); the rest are errors.
bool plan_refused(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE ||
         status == CUBLAS_STATUS_ARCH_MISMATCH;
}

std::uintptr_t address_of(const Tensor& t) {
  return t.defined() ? reinterpret_cast<std::uintptr_t>(t.data_ptr()) : 0;
}

}  // namespace

void CudaBackend::matmul(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& bias,
                         Activation act, Tensor& out) {
  if (out.numel() == 0) return;
  const int idx = out.device().index;
  MPT_CHECK(idx >= 0 && idx < kMaxDevices, "matmul: no GPU with index ", idx);
  DeviceGuard g(idx);
  const MatmulShape s = shape_of(a, b, ta, tb);
  const DType dt = a.dtype();
  if (s.k == 0) {  // empty sum: cuBLASLt needs K >= 1
    fill(out, 0.0);
    if (bias.defined()) binary(BinaryOp::Add, out, bias, out);
    if (act != Activation::Linear) unary(act, out, out, common::unary_default_param(act));
    return;
  }
  if (dt == float16 || dt == bfloat16) hint_tensor_core_shape("matmul", static_cast<int>(dt), {s.m, s.n, s.k});

  const MatmulRequest request{.shape = s,
                              .dtype = dt,
                              .has_bias = bias.defined(),
                              .bias_dtype = bias.defined() ? bias.dtype() : dt,
                              .act = act,
                              .allow_tf32 = allow_tf32(),
                              .addresses = {address_of(a), address_of(b), address_of(out), address_of(bias)},
                              .device = idx};
  // An attempt with aligned copies runs on fresh (256-byte aligned) copies of the operands whose
  // address is under 16-byte aligned; the heuristic sees the bias copy too.
  Tensor bias_copy;
  const auto bias_for = [&](const MatmulPlan& p) -> const void* {
    if (!p.epilogue_bias) return nullptr;
    if (p.align_bias >= 16 && needs_aligned_copy(address_of(bias))) {
      if (!bias_copy.defined()) bias_copy = bias.copy();
      return bias_copy.data_ptr();
    }
    return bias.data_ptr();
  };

  static std::mutex mutex;
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};
  static std::array<void*, kMaxDevices> workspaces{};
  static std::unordered_map<std::string, Chosen> chosen;  // "<device>:<plan_key of the first attempt>"
  const std::string key = std::to_string(idx) + ':' + plan_key(plan_attempt(request, first_attempt(request)));
  std::vector<AttemptRecord> history;
  cublasLtHandle_t handle;
  void* workspace;
  // Under the lock: the cache, and the heuristics along the fallback chain from `first`.
  const auto resolve = [&](std::optional<MatmulAttempt> first) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!handles[idx]) check_cublas(cublasLtCreate(&handles[idx]), "matmul: cublasLtCreate");
    if (!workspaces[idx]) workspaces[idx] = allocate(out.device(), kWorkspaceBytes);
    handle = handles[idx];
    workspace = workspaces[idx];
    if (!first) {
      if (auto it = chosen.find(key); it != chosen.end()) return it->second;
      first = first_attempt(request);
    }
    Chosen c;
    const ChosenPlan p = choose_plan(request, *first, history, [&](const MatmulPlan& plan) {
      return heuristic(handle, plan, bias_for(plan), c.algo);
    });
    c.attempt = p.attempt;
    c.plan = p.plan;
    chosen[key] = c;
    return c;
  };

  const float alpha_f = 1.0f, beta_f = 0.0f;
  const double alpha_d = 1.0, beta_d = 0.0;
  const std::int64_t batch = std::max(s.batch_a, s.batch_b);
  const auto bytes = static_cast<std::int64_t>(itemsize(dt));
  // Runs the chosen attempt; the first refused launch status, else CUBLAS_STATUS_SUCCESS.
  const auto run = [&](const Chosen& c) {
    Tensor a_run = a, b_run = b, out_run = out;
    if (c.attempt.aligned_copies) {
      if (needs_aligned_copy(address_of(a))) a_run = a.copy();
      if (needs_aligned_copy(address_of(b))) b_run = b.copy();
      if (needs_aligned_copy(address_of(out))) out_run = Tensor::empty(out.shape(), out.dtype(), out.device());
    }
    const LtDescriptors d = make_descriptors(c.plan, bias_for(c.plan));
    const bool f64 = c.plan.scale_type == CUDA_R_64F;
    const void* alpha = f64 ? static_cast<const void*>(&alpha_d) : &alpha_f;
    const void* beta = f64 ? static_cast<const void*>(&beta_d) : &beta_f;
    const bool looped = c.attempt.batch == BatchMode::Looped;
    const BatchStrides st = looped ? batch_strides(s) : BatchStrides{};
    for (std::int64_t q = 0; q < (looped ? batch : 1); ++q) {
      const char* pa = static_cast<const char*>(a_run.data_ptr()) + q * st.a * bytes;
      const char* pb = static_cast<const char*>(b_run.data_ptr()) + q * st.b * bytes;
      char* po = static_cast<char*>(out_run.data_ptr()) + q * st.out * bytes;
      // cuBLASLt's A is mpt's b and its B is mpt's a (C^T = B^T A^T); C aliases D, unread (beta 0).
      const cublasStatus_t status = cublasLtMatmul(handle, d.op, alpha, pb, d.a, pa, d.b, beta, po, d.c, po, d.d,
                                                   &c.algo, workspace, kWorkspaceBytes, stream(idx));
      if (status != CUBLAS_STATUS_SUCCESS) {
        if (!plan_refused(status)) check_cublas(status, "matmul: cublasLtMatmul");
        return status;
      }
    }
    if (out_run.data_ptr() != out.data_ptr()) copy_on_device(out.device(), out.data_ptr(), out_run.data_ptr(), out.nbytes());
    return CUBLAS_STATUS_SUCCESS;
  };

  Chosen c = resolve(std::nullopt);
  cublasStatus_t status;
  while ((status = run(c)) != CUBLAS_STATUS_SUCCESS) {
    // The heuristic's algorithm was refused at launch: forget it and go on down the chain.
    history.push_back({c.attempt, c.plan.epilogue, LtOutcome{"cublasLtMatmul", status, 1, CUBLAS_STATUS_SUCCESS}});
    {
      std::lock_guard<std::mutex> lock(mutex);
      chosen.erase(key);
    }
    const std::optional<MatmulAttempt> next = next_attempt(request, c.attempt, c.plan);
    if (!next) fail(matmul_failure_message(request, history));
    c = resolve(next);
  }
  const MatmulPlan& plan = c.plan;
  if (plan.add_bias_after) binary(BinaryOp::Add, out, bias, out);
  if (plan.unary_after) unary(plan.post_op, out, out, common::unary_default_param(plan.post_op));
}

}  // namespace mpt::cuda
