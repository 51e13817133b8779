// GEMM through cuBLASLt: the plan (matmul_plan.cpp) swaps operands for row-major data and picks
// types and epilogue; here the per-device handle and workspace, the heuristic (cached per plan
// and device) and the launch on the device's stream. Activations cuBLASLt cannot fuse the CPU's
// way run as unary() on the result.
#include <algorithm>
#include <array>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/matmul_plan.hpp"
#include "mpt/device.hpp"
#include "mpt/error.hpp"

namespace mpt::cuda {
namespace {

constexpr int kMaxDevices = 16;
/// cuBLASLt's split-K and stream-K kernels use it; 32 MiB covers Hopper's needs (as PyTorch).
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

struct Algo {
  bool fused = true;  ///< false: the fused epilogue had no algorithm, the plain GEMM runs
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

/// cuBLASLt's best algorithm for the plan within the workspace and the operands' alignment;
/// false when it has none (NOT_SUPPORTED), any other failure throws.
bool heuristic(cublasLtHandle_t handle, const MatmulPlan& plan, const void* bias, cublasLtMatmulAlgo_t& algo) {
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
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, d.op, d.a, d.b, d.c, d.d, pref.get(), 1, &result, &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  check_cublas(status, "matmul: cublasLtMatmulAlgoGetHeuristic");
  if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS) return false;
  algo = result.algo;
  return true;
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
    if (act != Activation::Linear) unary(unary_of(act), out, out);
    return;
  }
  if (dt == float16 || dt == bfloat16) hint_tensor_core_shape("matmul", static_cast<int>(dt), {s.m, s.n, s.k});

  PlanOptions options{.allow_tf32 = allow_tf32(),
                      .fuse_epilogue = true,
                      .bias_dtype_matches = !bias.defined() || bias.dtype() == out.dtype()};
  const MatmulAddresses addresses{reinterpret_cast<std::uintptr_t>(a.data_ptr()),
                                  reinterpret_cast<std::uintptr_t>(b.data_ptr()),
                                  reinterpret_cast<std::uintptr_t>(out.data_ptr()),
                                  bias.defined() ? reinterpret_cast<std::uintptr_t>(bias.data_ptr()) : 0};
  const void* bias_ptr = bias.defined() ? bias.data_ptr() : nullptr;
  MatmulPlan plan = plan_matmul(s, dt, bias.defined(), act, options, addresses);

  static std::mutex mutex;
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};
  static std::array<void*, kMaxDevices> workspaces{};
  static std::unordered_map<std::string, Algo> algos;  // "<device>:<plan_key>"
  cublasLtHandle_t handle;
  void* workspace;
  Algo algo;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!handles[idx]) check_cublas(cublasLtCreate(&handles[idx]), "matmul: cublasLtCreate");
    if (!workspaces[idx]) workspaces[idx] = allocate(out.device(), kWorkspaceBytes);
    handle = handles[idx];
    workspace = workspaces[idx];
    const std::string key = std::to_string(idx) + ':' + plan_key(plan);
    auto it = algos.find(key);
    if (it == algos.end()) {
      bool ok = heuristic(handle, plan, bias_ptr, algo.algo);
      if (!ok && plan.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {  // e.g. an epilogue float64 lacks
        algo.fused = false;
        options.fuse_epilogue = false;
        ok = heuristic(handle, plan_matmul(s, dt, bias.defined(), act, options, addresses), nullptr, algo.algo);
      }
      MPT_CHECK(ok, "matmul: cuBLASLt has no algorithm for ", to_string(dt), " M=", s.m, " N=", s.n, " K=", s.k,
                " batch=", std::max(s.batch_a, s.batch_b), " on cuda:", idx);
      it = algos.emplace(key, algo).first;
    }
    algo = it->second;
  }
  if (!algo.fused) {
    options.fuse_epilogue = false;
    plan = plan_matmul(s, dt, bias.defined(), act, options, addresses);
  }

  const LtDescriptors d = make_descriptors(plan, bias_ptr);
  const float alpha_f = 1.0f, beta_f = 0.0f;
  const double alpha_d = 1.0, beta_d = 0.0;
  const bool f64 = plan.scale_type == CUDA_R_64F;
  const void* alpha = f64 ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = f64 ? static_cast<const void*>(&beta_d) : &beta_f;
  // cuBLASLt's A is mpt's b and its B is mpt's a (C^T = B^T A^T); C aliases D, unread (beta 0).
  check_cublas(cublasLtMatmul(handle, d.op, alpha, b.data_ptr(), d.a, a.data_ptr(), d.b, beta, out.data_ptr(),
                              d.c, out.data_ptr(), d.d, &algo.algo, workspace, kWorkspaceBytes, stream(idx)),
               "matmul: cublasLtMatmul");
  if (plan.add_bias_after) binary(BinaryOp::Add, out, bias, out);
  if (plan.unary_after) unary(plan.post_op, out, out);
}

}  // namespace mpt::cuda
