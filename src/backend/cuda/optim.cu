// Fused optimizer updates, the multi-tensor unscale-and-check and the loss-scale step on the GPU
// (the CUDA twin of src/backend/cpu/optim.cpp; arithmetic in kernels/optim.hpp). Nothing here
// reads device memory from the host: the loss scale and the overflow flag stay on the device.
#include <vector>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/optim.hpp"
#include "mpt/optim_ops.hpp"
#include "mpt/error.hpp"

namespace mpt::cuda {
namespace {

namespace k = mpt::kernels;

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;        // grid-stride loops cover the rest
constexpr unsigned kUnscaleThreads = 256;
constexpr std::int64_t kUnscaleChunk = 16384;  // elements per block of unscale_and_check
constexpr unsigned kUpdateThreads = 256;
constexpr std::int64_t kUpdateChunk = 16384;  // elements per block of the *_update_all launches

template <class V, class G>
__global__ void sgd_kernel(V* var, const G* grad, float* momentum, float lr, float mu, bool nesterov,
                           std::int64_t n, k::CopyOut copy, float gs) {
  k::sgd_body(k::this_thread(), var, grad, momentum, lr, mu, nesterov, n, copy, gs);
}

template <class V, class G>
__global__ void adam_kernel(V* var, const G* grad, float* m, float* v, float* vhat, float alpha, float c1, float c2,
                            float eps, float decay, std::int64_t n, k::CopyOut copy, float gs) {
  k::adam_body(k::this_thread(), var, grad, m, v, vhat, alpha, c1, c2, eps, decay, n, copy, gs);
}

template <class V, class G>
__global__ void rmsprop_kernel(V* var, const G* grad, float* velocity, float* average_grad, float* momentum,
                               float lr, float rho, float c, float mu, float eps, std::int64_t n, k::CopyOut copy,
                               float gs) {
  k::rmsprop_body(k::this_thread(), var, grad, velocity, average_grad, momentum, lr, rho, c, mu, eps, n, copy, gs);
}

template <k::UpdateKind K>
__global__ void update_multi_kernel(const k::UpdateArgs a) {
  k::update_multi_body<K>(k::this_thread(), a);
}

__global__ void unscale_kernel(const k::UnscaleArgs a) { k::unscale_body(k::this_thread(), a); }

__global__ void loss_scale_kernel(float* scale, float* inv_scale, std::int64_t* counters, const float* found,
                                  bool dynamic, std::int64_t growth_steps, std::int64_t hysteresis, double min_scale,
                                  double max_scale) {
  k::loss_scale_body(k::this_thread(), scale, inv_scale, counters, found, dynamic, growth_steps, hysteresis,
                     min_scale, max_scale);
}

__global__ void adafactor_rows_kernel(common::AdafactorShape s, common::AdafactorHyper h, const float* w,
                                      const float* g, float* r_or_v, double* wrow) {
  k::adafactor_rows_body(k::this_thread(), s, h, w, g, r_or_v, wrow);
}
__global__ void adafactor_cols_kernel(common::AdafactorShape s, common::AdafactorHyper h, const float* g, float* col) {
  k::adafactor_cols_body(k::this_thread(), s, h, g, col);
}
template <class T>
__global__ void chunk_sums_kernel(const T* x, std::int64_t seg_len, std::int64_t segments, double* partial) {
  k::chunk_sums_body(k::this_thread(), x, seg_len, segments, partial);
}
__global__ void chunk_totals_kernel(const double* partial, std::int64_t segments, double* totals) {
  k::chunk_totals_body(k::this_thread(), partial, segments, totals);
}
__global__ void adafactor_u_rows_kernel(common::AdafactorShape s, const float* g, const float* r_or_v,
                                        const float* col, const double* rsum, double* urow) {
  k::adafactor_u_rows_body(k::this_thread(), s, g, r_or_v, col, rsum, urow);
}
__global__ void adafactor_apply_kernel(common::AdafactorShape s, common::AdafactorHyper h, float* w, const float* g,
                                       const float* r_or_v, const float* col, const double* totals) {
  k::adafactor_apply_body(k::this_thread(), s, h, w, g, r_or_v, col, totals);
}

float* slot_ptr(Tensor* t) { return t ? t->data<float>() : nullptr; }

/// Calls f(V*, const G*) with var's and grad's storage types.
template <class F>
void with_var_and_grad(Tensor& var, const Tensor& grad, const char* op, F&& f) {
  k::dispatch_float(var.dtype(), op, [&](auto vt) {
    using V = typename decltype(vt)::type;
    k::dispatch_float(grad.dtype(), op, [&](auto gt) {
      using G = typename decltype(gt)::type;
      f(static_cast<V*>(var.data_ptr()), static_cast<const G*>(grad.data_ptr()));
    });
  });
}

k::GradType grad_type(DType d, const char* op = "unscale_and_check") {
  switch (d) {
    case DType::Float32: return k::GradType::F32;
    case DType::Float64: return k::GradType::F64;
    case DType::Float16: return k::GradType::F16;
    case DType::BFloat16: return k::GradType::BF16;
    default: break;
  }
  fail(op, ": expected a floating dtype, got ", to_string(d));
}

/// Entry i of an optional slot list (empty: unused by every variable) as a device pointer.
float* slot_at(const std::vector<Tensor*>& slots, std::size_t i) { return slots.empty() ? nullptr : slot_ptr(slots[i]); }

/// The optional copy of an updated variable as the kernels take it.
k::CopyOut copy_out(const Tensor* copy, const char* op) {
  return copy ? k::CopyOut{copy->data_ptr(), grad_type(copy->dtype(), op)} : k::CopyOut{};
}

/// Packs every variable of a list op with its slots and launches update_multi_kernel<K> for each
/// UpdateArgs: a few launches for all variables.
template <k::UpdateKind K>
void launch_updates(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                    std::initializer_list<const std::vector<Tensor*>*> slots, const std::vector<Tensor*>& copies,
                    const k::UpdateHyper& h, const char* op) {
  if (vars.empty()) return;
  std::vector<k::UpdateTensor> items;
  items.reserve(vars.size());
  for (std::size_t i = 0; i < vars.size(); ++i) {
    k::UpdateTensor it{vars[i].data_ptr(), grads[i].data_ptr(), {nullptr, nullptr, nullptr}, vars[i].numel(),
                       grad_type(vars[i].dtype(), op), grad_type(grads[i].dtype(), op),
                       copy_out(copies.empty() ? nullptr : copies[i], op)};
    int s = 0;
    for (const std::vector<Tensor*>* l : slots) it.slot[s++] = slot_at(*l, i);
    items.push_back(it);
  }
  DeviceGuard g(vars[0].device().index);
  cudaStream_t s = stream(g.index());
  k::pack_updates(items.data(), static_cast<std::int32_t>(items.size()), h, kUpdateChunk,
                  [&](const k::UpdateArgs& a, unsigned blocks) {
                    update_multi_kernel<K><<<blocks, kUpdateThreads, 0, s>>>(a);
                    check_launch(op);
                  });
}

}  // namespace

void CudaBackend::sgd_update(Tensor& var, const Tensor& grad, Tensor* momentum, double lr, double momentum_coef,
                             bool nesterov, Tensor* copy, double grad_scale) {
  const std::int64_t n = var.numel();
  if (n == 0) return;
  DeviceGuard g(var.device().index);
  float* pm = slot_ptr(momentum);
  const float l = static_cast<float>(lr), mu = static_cast<float>(momentum_coef);
  with_var_and_grad(var, grad, "sgd_update", [&](auto* w, const auto* gr) {
    sgd_kernel<<<k::blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream(g.index())>>>(w, gr, pm, l, mu,
                                                                                          nesterov, n,
                                                                                          copy_out(copy, "sgd_update"),
                                                                                          static_cast<float>(grad_scale));
  });
  check_launch("sgd_update");
}

void CudaBackend::adam_update(Tensor& var, const Tensor& grad, Tensor& m, Tensor& v, Tensor* vhat, double alpha,
                              double beta_1, double beta_2, double epsilon, double decay, Tensor* copy,
                              double grad_scale) {
  const std::int64_t n = var.numel();
  if (n == 0) return;
  DeviceGuard g(var.device().index);
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  float* ph = slot_ptr(vhat);
  // The CPU's float32 constants, rounded from the same doubles.
  const float a = static_cast<float>(alpha), c1 = static_cast<float>(1 - beta_1), c2 = static_cast<float>(1 - beta_2),
              eps = static_cast<float>(epsilon), d = static_cast<float>(decay);
  with_var_and_grad(var, grad, "adam_update", [&](auto* w, const auto* gr) {
    adam_kernel<<<k::blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream(g.index())>>>(w, gr, pm, pv, ph, a, c1,
                                                                                           c2, eps, d, n,
                                                                                           copy_out(copy, "adam_update"),
                                                                                           static_cast<float>(grad_scale));
  });
  check_launch("adam_update");
}

void CudaBackend::rmsprop_update(Tensor& var, const Tensor& grad, Tensor& velocity, Tensor* average_grad,
                                 Tensor* momentum, double lr, double rho, double momentum_coef, double epsilon,
                                 Tensor* copy, double grad_scale) {
  const std::int64_t n = var.numel();
  if (n == 0) return;
  DeviceGuard g(var.device().index);
  float* pv = velocity.data<float>();
  float* pa = slot_ptr(average_grad);
  float* pm = slot_ptr(momentum);
  const float l = static_cast<float>(lr), r = static_cast<float>(rho), c = static_cast<float>(1 - rho),
              mu = static_cast<float>(momentum_coef), eps = static_cast<float>(epsilon);
  with_var_and_grad(var, grad, "rmsprop_update", [&](auto* w, const auto* gr) {
    rmsprop_kernel<<<k::blocks_for(n, kThreads, kMaxBlocks), kThreads, 0, stream(g.index())>>>(w, gr, pv, pa, pm, l,
                                                                                              r, c, mu, eps, n,
                                                                                              copy_out(copy, "rmsprop_update"),
                                                                                              static_cast<float>(grad_scale));
  });
  check_launch("rmsprop_update");
}

// The list updates: the float32 constants rounded from the same doubles as the single updates above.

void CudaBackend::sgd_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                                 const std::vector<Tensor*>& momenta, double lr, double momentum_coef, bool nesterov,
                                 const std::vector<Tensor*>& copies, double grad_scale) {
  k::UpdateHyper h;
  h.lr = static_cast<float>(lr), h.mu = static_cast<float>(momentum_coef), h.nesterov = nesterov;
  h.grad_scale = static_cast<float>(grad_scale);
  launch_updates<k::UpdateKind::Sgd>(vars, grads, {&momenta}, copies, h, "sgd_update_all");
}

void CudaBackend::adam_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                                  const std::vector<Tensor*>& m, const std::vector<Tensor*>& v,
                                  const std::vector<Tensor*>& vhat, double alpha, double beta_1, double beta_2,
                                  double epsilon, double decay, const std::vector<Tensor*>& copies,
                                  double grad_scale) {
  k::UpdateHyper h;
  h.grad_scale = static_cast<float>(grad_scale);
  h.alpha = static_cast<float>(alpha), h.c1 = static_cast<float>(1 - beta_1), h.c2 = static_cast<float>(1 - beta_2),
  h.eps = static_cast<float>(epsilon), h.decay = static_cast<float>(decay);
  launch_updates<k::UpdateKind::Adam>(vars, grads, {&m, &v, &vhat}, copies, h, "adam_update_all");
}

void CudaBackend::rmsprop_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                                     const std::vector<Tensor*>& velocity, const std::vector<Tensor*>& average_grad,
                                     const std::vector<Tensor*>& momentum, double lr, double rho, double momentum_coef,
                                     double epsilon, const std::vector<Tensor*>& copies, double grad_scale) {
  k::UpdateHyper h;
  h.grad_scale = static_cast<float>(grad_scale);
  h.lr = static_cast<float>(lr), h.rho = static_cast<float>(rho), h.c = static_cast<float>(1 - rho),
  h.mu = static_cast<float>(momentum_coef), h.eps = static_cast<float>(epsilon);
  launch_updates<k::UpdateKind::Rmsprop>(vars, grads, {&velocity, &average_grad, &momentum}, copies, h,
                                         "rmsprop_update_all");
}

void CudaBackend::rule_update_all(common::RuleKind rule, std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                                  const std::vector<std::vector<Tensor*>>& slots, const common::RuleHyper& h,
                                  const std::vector<Tensor*>& copies, double grad_scale) {
  k::UpdateHyper uh;
  uh.grad_scale = static_cast<float>(grad_scale);
  uh.rule = h;
  static const std::vector<Tensor*> none;
  const std::vector<Tensor*>& second = slots.size() > 1 ? slots[1] : none;
  switch (rule) {
    case common::RuleKind::Nadam:
      launch_updates<k::UpdateKind::Nadam>(vars, grads, {&slots[0], &second}, copies, uh, "nadam_update_all");
      break;
    case common::RuleKind::Adamax:
      launch_updates<k::UpdateKind::Adamax>(vars, grads, {&slots[0], &second}, copies, uh, "adamax_update_all");
      break;
    case common::RuleKind::Adagrad:
      launch_updates<k::UpdateKind::Adagrad>(vars, grads, {&slots[0], &second}, copies, uh, "adagrad_update_all");
      break;
    case common::RuleKind::Lion:
      launch_updates<k::UpdateKind::Lion>(vars, grads, {&slots[0], &second}, copies, uh, "lion_update_all");
      break;
  }
}

void CudaBackend::adafactor_update(Tensor& var, const Tensor& grad, Tensor* r, Tensor* c, Tensor* v,
                                   const common::AdafactorShape& s, const common::AdafactorHyper& h) {
  // The phases of backend/common/adafactor.hpp, one launch each, in stream order; the float64
  // scratch: wrow, urow [L·R], partial [segments · kSumChunks], totals [segments + 1].
  DeviceGuard guard(var.device().index);
  const cudaStream_t st = stream(guard.index());
  constexpr std::int64_t K = common::kSumChunks;
  const std::int64_t rows = s.blocks * s.rows, n = s.size();
  const std::int64_t segments = 1 + (s.factored ? s.blocks : 0);
  Tensor scratch = Tensor::empty({2 * rows + segments * K + segments + 1}, float64, var.device());
  double* wrow = scratch.data<double>();
  double* urow = wrow + rows;
  double* partial = urow + rows;
  double* totals = partial + segments * K;
  float* w = var.data<float>();
  const float* g = grad.data<float>();
  float* rv = s.factored ? r->data<float>() : v->data<float>();
  float* col = s.factored ? c->data<float>() : nullptr;
  const auto grid = [](std::int64_t m) { return k::blocks_for(m, kThreads, kMaxBlocks); };
  adafactor_rows_kernel<<<grid(rows), kThreads, 0, st>>>(s, h, w, g, rv, wrow);
  check_launch("adafactor_update (rows)");
  if (s.factored) {
    adafactor_cols_kernel<<<grid(s.blocks * s.cols), kThreads, 0, st>>>(s, h, g, col);
    check_launch("adafactor_update (columns)");
  }
  chunk_sums_kernel<double><<<grid(K), kThreads, 0, st>>>(wrow, rows, 1, partial);
  if (s.factored) chunk_sums_kernel<float><<<grid(s.blocks * K), kThreads, 0, st>>>(rv, s.rows, s.blocks, partial + K);
  chunk_totals_kernel<<<grid(segments), kThreads, 0, st>>>(partial, segments, totals);
  check_launch("adafactor_update (sums)");
  adafactor_u_rows_kernel<<<grid(rows), kThreads, 0, st>>>(s, g, rv, col, totals + 1, urow);
  check_launch("adafactor_update (u rows)");
  chunk_sums_kernel<double><<<grid(K), kThreads, 0, st>>>(urow, rows, 1, partial);
  chunk_totals_kernel<<<1, 1, 0, st>>>(partial, 1, totals + segments);
  check_launch("adafactor_update (u sums)");
  adafactor_apply_kernel<<<grid(n), kThreads, 0, st>>>(s, h, w, g, rv, col, totals);
  check_launch("adafactor_update");
}

void CudaBackend::unscale_and_check(const std::vector<Tensor>& grads, const Tensor& inv_scale,
                                    std::vector<Tensor>& outs, Tensor& found, Tensor& flags) {
  DeviceGuard g(found.device().index);
  cudaStream_t s = stream(g.index());
  float* flag = found.data<float>();
  float* per_tensor = grads.empty() ? nullptr : flags.data<float>();
  check_cuda(cudaMemsetAsync(flag, 0, sizeof(float), s), "unscale_and_check");
  if (per_tensor) check_cuda(cudaMemsetAsync(per_tensor, 0, grads.size() * sizeof(float), s), "unscale_and_check");
  std::vector<k::UnscaleItem> items;
  items.reserve(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) {
      items.push_back({nullptr, nullptr, 0, k::GradType::F32});  // skipped; keeps the indices
      continue;
    }
    float* out = outs[i].defined() ? outs[i].data<float>() : nullptr;  // undefined: check only
    items.push_back({grads[i].data_ptr(), out, grads[i].numel(), grad_type(grads[i].dtype())});
  }
  k::pack_unscale(items.data(), static_cast<std::int32_t>(items.size()), inv_scale.data<float>(), flag, per_tensor,
                  kUnscaleChunk, [&](const k::UnscaleArgs& a, unsigned blocks) {
                    unscale_kernel<<<blocks, kUnscaleThreads, 0, s>>>(a);
                    check_launch("unscale_and_check");
                  });
}

void CudaBackend::update_loss_scale(Tensor& scale, Tensor& inv_scale, Tensor& counters, const Tensor& found,
                                    const ops::LossScaleRule& rule) {
  DeviceGuard g(scale.device().index);
  loss_scale_kernel<<<1, 1, 0, stream(g.index())>>>(scale.data<float>(), inv_scale.data<float>(),
                                                    counters.data<std::int64_t>(), found.data<float>(), rule.dynamic,
                                                    rule.growth_steps, rule.hysteresis, rule.min_scale,
                                                    rule.max_scale);
  check_launch("update_loss_scale");
}

}  // namespace mpt::cuda
