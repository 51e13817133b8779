#include <atomic>
#include <cmath>

#include "backend/common/loss_scale.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"

namespace mpt::cpu {
namespace {

constexpr std::int64_t kGrain = 1 << 14;

float* slot_ptr(Tensor* t) { return t ? t->data<float>() : nullptr; }

/// Runs f(i, m, w, g) over blocks of the variable: w holds var[i, i+m) as float32 (written back
/// after f), g the gradient as float32.
template <class F>
void update_blocks(Tensor& var, const Tensor& grad, F f) {
  parallel_for(var.numel(), kGrain, [&](std::int64_t b, std::int64_t e) {
    float sw[kBlock], sg[kBlock];
    for (std::int64_t i = b; i < e; i += kBlock) {
      const std::int64_t m = std::min(kBlock, e - i);
      const float* g = load<float>(grad, i, m, sg);
      // For a float32 variable both calls give its own memory; otherwise both give sw.
      load<float>(var, i, m, sw);
      float* w = store_target<float>(var, i, sw);
      f(i, m, w, g);
      store<float>(var, i, m, w);
    }
  });
}

}  // namespace

void CpuBackend::sgd_update(Tensor& var, const Tensor& grad, Tensor* momentum, double lr,
                            double momentum_coef, bool nesterov) {
  float* pm = slot_ptr(momentum);
  const float l = static_cast<float>(lr), mu = static_cast<float>(momentum_coef);
  update_blocks(var, grad, [&](std::int64_t i, std::int64_t n, float* w, const float* g) {
    if (!pm) {
      for (std::int64_t j = 0; j < n; ++j) w[j] -= g[j] * l;
      return;
    }
    float* mm = pm + i;
    for (std::int64_t j = 0; j < n; ++j) {
      mm[j] = mm[j] * mu - g[j] * l;
      w[j] += nesterov ? mm[j] * mu - g[j] * l : mm[j];
    }
  });
}

void CpuBackend::adam_update(Tensor& var, const Tensor& grad, Tensor& m, Tensor& v, Tensor* vhat,
                             double alpha, double beta_1, double beta_2, double epsilon,
                             double decay) {
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  float* ph = slot_ptr(vhat);
  const float a = static_cast<float>(alpha), c1 = static_cast<float>(1 - beta_1),
              c2 = static_cast<float>(1 - beta_2), eps = static_cast<float>(epsilon),
              d = static_cast<float>(decay);
  update_blocks(var, grad, [&](std::int64_t i, std::int64_t n, float* w, const float* g) {
    float* mm = pm + i;
    float* vv = pv + i;
    float* hh = ph ? ph + i : nullptr;
    for (std::int64_t j = 0; j < n; ++j) {
      if (d != 0.0f) w[j] -= w[j] * d;
      mm[j] += (g[j] - mm[j]) * c1;
      vv[j] += (g[j] * g[j] - vv[j]) * c2;
      float second = vv[j];
      if (hh) second = hh[j] = std::max(hh[j], vv[j]);
      w[j] -= (mm[j] * a) / (std::sqrt(second) + eps);
    }
  });
}

void CpuBackend::rmsprop_update(Tensor& var, const Tensor& grad, Tensor& velocity,
                                Tensor* average_grad, Tensor* momentum, double lr, double rho,
                                double momentum_coef, double epsilon) {
  float* pv = velocity.data<float>();
  float* pa = slot_ptr(average_grad);
  float* pm = slot_ptr(momentum);
  const float l = static_cast<float>(lr), r = static_cast<float>(rho),
              c = static_cast<float>(1 - rho), mu = static_cast<float>(momentum_coef),
              eps = static_cast<float>(epsilon);
  update_blocks(var, grad, [&](std::int64_t i, std::int64_t n, float* w, const float* g) {
    float* vv = pv + i;
    for (std::int64_t j = 0; j < n; ++j) {
      vv[j] = r * vv[j] + c * (g[j] * g[j]);
      float denom;
      if (pa) {
        float& avg = pa[i + j];
        avg = r * avg + c * g[j];
        denom = vv[j] - avg * avg + eps;
      } else {
        denom = vv[j] + eps;
      }
      const float inc = l * g[j] / std::sqrt(denom);
      if (pm) {
        float& mo = pm[i + j];
        mo = mu * mo + inc;
        w[j] -= mo;
      } else {
        w[j] -= inc;
      }
    }
  });
}

void CpuBackend::unscale_and_check(const std::vector<Tensor>& grads, const Tensor& inv_scale,
                                   std::vector<Tensor>& outs, Tensor& found, Tensor& flags) {
  bool any_tensor = false;
  const float s = *inv_scale.data<float>();
  float* per_tensor = grads.empty() ? nullptr : flags.data<float>();
  for (std::size_t k = 0; k < grads.size(); ++k) {
    per_tensor[k] = 0.0f;
    if (!grads[k].defined()) continue;
    std::atomic<bool> any{false};
    const Tensor& x = grads[k];
    float* po = outs[k].data<float>();
    parallel_for(x.numel(), kGrain, [&](std::int64_t b, std::int64_t e) {
      float sx[kBlock];
      float acc = 0.0f;
      for (std::int64_t i = b; i < e; i += kBlock) {
        const std::int64_t m = std::min(kBlock, e - i);
        const float* px = load<float>(x, i, m, sx);
        float* o = po + i;
        for (std::int64_t j = 0; j < m; ++j) {
          o[j] = px[j] * s;
          acc += o[j] * 0.0f;  // inf * 0 and NaN give NaN
        }
      }
      if (acc != acc) any.store(true, std::memory_order_relaxed);
    });
    if (any.load()) per_tensor[k] = 1.0f, any_tensor = true;
  }
  *found.data<float>() = any_tensor ? 1.0f : 0.0f;
}

void CpuBackend::update_loss_scale(Tensor& scale, Tensor& inv_scale, Tensor& counters, const Tensor& found,
                                   const ops::LossScaleRule& rule) {
  std::int64_t* c = counters.data<std::int64_t>();
  kernels::loss_scale_step(*scale.data<float>(), *inv_scale.data<float>(), c[0], c[1], *found.data<float>() != 0.0f,
                           rule.dynamic, rule.growth_steps, rule.hysteresis, rule.min_scale, rule.max_scale);
}

}  // namespace mpt::cpu
