// The fused optimizer updates and the loss-scale check on the CPU. The arithmetic runs on
// float32 blocks in kernels cloned for AVX-512 (vector_types.hpp). CMakeLists.txt compiles this
// file with -fno-math-errno, so that sqrt vectorizes, and -ffp-contract=off, so that no clone
// fuses a multiply and an add: every clone gives the same bits as the baseline one and as the
// CUDA kernels' exact:: arithmetic (src/backend/cuda/kernels/optim.hpp).
#include <atomic>
#include <cfloat>
#include <cmath>
#include <vector>

#include "backend/common/adafactor.hpp"
#include "backend/common/loss_scale.hpp"
#include "backend/common/optim_rules.hpp"
#include "mpt/half.hpp"
#include "mpt/optim_ops.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/vector_types.hpp"

namespace mpt::cpu {
namespace {

constexpr std::int64_t kGrain = 1 << 14;

float* slot_ptr(Tensor* t) { return t ? t->data<float>() : nullptr; }

/// o[j] = x[j] * s: unscale_and_check's product.
MPT_KERNEL void mul_block(const float* __restrict x, float* __restrict o, std::int64_t n, float s) {
  for (std::int64_t j = 0; j < n; ++j) o[j] = x[j] * s;
}

/// Runs f(i, m, w, g) over blocks of the variable: w holds var[i, i+m) as float32 (written back
/// after f, then from var into copy, when given, in copy's dtype), g the gradient as float32,
/// times grad_scale when that is not 1.
template <class F>
void update_blocks(Tensor& var, const Tensor& grad, Tensor* copy, double grad_scale, F f) {
  const float gs = static_cast<float>(grad_scale);
  parallel_for(var.numel(), kGrain, [&](std::int64_t b, std::int64_t e) {
    float sw[kBlock], sg[kBlock], ss[kBlock];
    for (std::int64_t i = b; i < e; i += kBlock) {
      const std::int64_t m = std::min(kBlock, e - i);
      const float* g = load<float>(grad, i, m, sg);
      if (gs != 1.0f) {
        isa_call<mul_block>(g, ss, m, gs);
        g = ss;
      }
      // For a float32 variable both calls give its own memory; otherwise both give sw.
      load<float>(var, i, m, sw);
      float* w = store_target<float>(var, i, sw);
      f(i, m, w, g);
      store<float>(var, i, m, w);
      // The copy from the stored result, as cast would convert the updated variable.
      if (copy)
        detail::convert(static_cast<const char*>(var.data_ptr()) + i * itemsize(var.dtype()), var.dtype(),
                        static_cast<char*>(copy->data_ptr()) + i * itemsize(copy->dtype()), copy->dtype(),
                        static_cast<std::size_t>(m));
    }
  });
}

// The kernels: one block of n elements, no branch inside a loop.

MPT_KERNEL void sgd_block(float* __restrict w, const float* __restrict g, std::int64_t n, float lr) {
  for (std::int64_t j = 0; j < n; ++j) w[j] -= g[j] * lr;
}

MPT_KERNEL void sgd_momentum_block(float* __restrict w, const float* __restrict g, float* __restrict mo,
                                          std::int64_t n, float lr, float mu, bool nesterov) {
  if (nesterov) {
    for (std::int64_t j = 0; j < n; ++j) {
      const float mj = mo[j] * mu - g[j] * lr;
      mo[j] = mj;
      w[j] += mj * mu - g[j] * lr;
    }
  } else {
    for (std::int64_t j = 0; j < n; ++j) {
      const float mj = mo[j] * mu - g[j] * lr;
      mo[j] = mj;
      w[j] += mj;
    }
  }
}

/// Adam on one block; vhat null unless amsgrad. AdamW's decay is applied first, as in Keras.
MPT_KERNEL void adam_block(float* __restrict w, const float* __restrict g, float* __restrict m,
                                  float* __restrict v, float* __restrict vhat, std::int64_t n, float a, float c1,
                                  float c2, float eps, float d) {
  if (d != 0.0f)
    for (std::int64_t j = 0; j < n; ++j) w[j] -= w[j] * d;
  if (vhat) {
    for (std::int64_t j = 0; j < n; ++j) {
      const float mj = m[j] + (g[j] - m[j]) * c1;
      const float vj = v[j] + (g[j] * g[j] - v[j]) * c2;
      const float hj = std::max(vhat[j], vj);
      m[j] = mj, v[j] = vj, vhat[j] = hj;
      w[j] -= (mj * a) / (std::sqrt(hj) + eps);
    }
  } else {
    for (std::int64_t j = 0; j < n; ++j) {
      const float mj = m[j] + (g[j] - m[j]) * c1;
      const float vj = v[j] + (g[j] * g[j] - v[j]) * c2;
      m[j] = mj, v[j] = vj;
      w[j] -= (mj * a) / (std::sqrt(vj) + eps);
    }
  }
}

/// RMSprop on one block; avg (centered) and mo (momentum) null when unused.
MPT_KERNEL void rmsprop_block(float* __restrict w, const float* __restrict g, float* __restrict vel,
                                     float* __restrict avg, float* __restrict mo, std::int64_t n, float lr, float r,
                                     float c, float mu, float eps) {
  // inc, staged in the block's own buffer so that each loop stays branch-free.
  float inc[kBlock];
  if (avg) {
    for (std::int64_t j = 0; j < n; ++j) {
      const float vj = r * vel[j] + c * (g[j] * g[j]);
      const float aj = r * avg[j] + c * g[j];
      vel[j] = vj, avg[j] = aj;
      inc[j] = lr * g[j] / std::sqrt(vj - aj * aj + eps);
    }
  } else {
    for (std::int64_t j = 0; j < n; ++j) {
      const float vj = r * vel[j] + c * (g[j] * g[j]);
      vel[j] = vj;
      inc[j] = lr * g[j] / std::sqrt(vj + eps);
    }
  }
  if (mo) {
    for (std::int64_t j = 0; j < n; ++j) {
      const float mj = mu * mo[j] + inc[j];
      mo[j] = mj;
      w[j] -= mj;
    }
  } else {
    for (std::int64_t j = 0; j < n; ++j) w[j] -= inc[j];
  }
}

// The rules of backend/common/optim_rules.hpp over a block (the CUDA kernels call the same
// functions per element): one clone per rule, so that each loop is branch-free and vectorizes.

MPT_KERNEL void nadam_block(float* __restrict w, const float* __restrict g, float* __restrict m,
                                   float* __restrict v, std::int64_t n, const common::RuleHyper h) {
  for (std::int64_t j = 0; j < n; ++j) common::nadam_rule(w[j], g[j], m[j], v[j], h);
}

MPT_KERNEL void adamax_block(float* __restrict w, const float* __restrict g, float* __restrict m,
                                    float* __restrict u, std::int64_t n, const common::RuleHyper h) {
  for (std::int64_t j = 0; j < n; ++j) common::adamax_rule(w[j], g[j], m[j], u[j], h);
}

MPT_KERNEL void adagrad_block(float* __restrict w, const float* __restrict g, float* __restrict acc,
                                     std::int64_t n, const common::RuleHyper h) {
  for (std::int64_t j = 0; j < n; ++j) common::adagrad_rule(w[j], g[j], acc[j], h);
}

MPT_KERNEL void lion_block(float* __restrict w, const float* __restrict g, float* __restrict m,
                                  std::int64_t n, const common::RuleHyper h) {
  for (std::int64_t j = 0; j < n; ++j) common::lion_rule(w[j], g[j], m[j], h);
}

/// True when any x * s is inf or NaN: scale_block's check without its stores.
MPT_KERNEL bool check_block(const float* __restrict x, std::int64_t n, float s) {
  constexpr std::int64_t L = 16;
  float acc[L] = {};
  std::int64_t j = 0;
  for (; j + L <= n; j += L)
    for (std::int64_t l = 0; l < L; ++l) acc[l] += (x[j + l] * s) * 0.0f;
  for (; j < n; ++j) acc[0] += (x[j] * s) * 0.0f;
  float all = 0.0f;
  for (std::int64_t l = 0; l < L; ++l) all += acc[l];
  return all != all;
}

/// o = x * s; true when any product is inf or NaN (inf * 0 and NaN * 0 give NaN). Sixteen
/// partial sums, so that the check vectorizes without reassociating one sum.
MPT_KERNEL bool scale_block(const float* __restrict x, float* __restrict o, std::int64_t n, float s) {
  constexpr std::int64_t L = 16;
  float acc[L] = {};
  std::int64_t j = 0;
  for (; j + L <= n; j += L)
    for (std::int64_t l = 0; l < L; ++l) {
      const float y = x[j + l] * s;
      o[j + l] = y;
      acc[l] += y * 0.0f;
    }
  for (; j < n; ++j) {
    o[j] = x[j] * s;
    acc[0] += o[j] * 0.0f;
  }
  float all = 0.0f;
  for (std::int64_t l = 0; l < L; ++l) all += acc[l];
  return all != all;
}

}  // namespace

void CpuBackend::sgd_update(Tensor& var, const Tensor& grad, Tensor* momentum, double lr,
                            double momentum_coef, bool nesterov, Tensor* copy, double grad_scale) {
  float* pm = slot_ptr(momentum);
  const float l = static_cast<float>(lr), mu = static_cast<float>(momentum_coef);
  update_blocks(var, grad, copy, grad_scale, [&](std::int64_t i, std::int64_t n, float* w, const float* g) {
    if (pm) isa_call<sgd_momentum_block>(w, g, pm + i, n, l, mu, nesterov);
    else isa_call<sgd_block>(w, g, n, l);
  });
}

void CpuBackend::adam_update(Tensor& var, const Tensor& grad, Tensor& m, Tensor& v, Tensor* vhat,
                             double alpha, double beta_1, double beta_2, double epsilon,
                             double decay, Tensor* copy, double grad_scale) {
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  float* ph = slot_ptr(vhat);
  const float a = static_cast<float>(alpha), c1 = static_cast<float>(1 - beta_1),
              c2 = static_cast<float>(1 - beta_2), eps = static_cast<float>(epsilon),
              d = static_cast<float>(decay);
  update_blocks(var, grad, copy, grad_scale, [&](std::int64_t i, std::int64_t n, float* w, const float* g) {
    isa_call<adam_block>(w, g, pm + i, pv + i, ph ? ph + i : nullptr, n, a, c1, c2, eps, d);
  });
}

void CpuBackend::rmsprop_update(Tensor& var, const Tensor& grad, Tensor& velocity,
                                Tensor* average_grad, Tensor* momentum, double lr, double rho,
                                double momentum_coef, double epsilon, Tensor* copy, double grad_scale) {
  float* pv = velocity.data<float>();
  float* pa = slot_ptr(average_grad);
  float* pm = slot_ptr(momentum);
  const float l = static_cast<float>(lr), r = static_cast<float>(rho),
              c = static_cast<float>(1 - rho), mu = static_cast<float>(momentum_coef),
              eps = static_cast<float>(epsilon);
  update_blocks(var, grad, copy, grad_scale, [&](std::int64_t i, std::int64_t n, float* w, const float* g) {
    isa_call<rmsprop_block>(w, g, pv + i, pa ? pa + i : nullptr, pm ? pm + i : nullptr, n, l, r, c, mu, eps);
  });
}

void CpuBackend::rule_update_all(common::RuleKind rule, std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                                 const std::vector<std::vector<Tensor*>>& slots, const common::RuleHyper& h,
                                 const std::vector<Tensor*>& copies, double grad_scale) {
  for (std::size_t i = 0; i < vars.size(); ++i) {
    float* s0 = slots[0][i]->data<float>();
    float* s1 = slots.size() > 1 ? slots[1][i]->data<float>() : nullptr;
    update_blocks(vars[i], grads[i], copies.empty() ? nullptr : copies[i], grad_scale,
                  [&](std::int64_t at, std::int64_t n, float* w, const float* g) {
                    switch (rule) {
                      case common::RuleKind::Nadam: isa_call<nadam_block>(w, g, s0 + at, s1 + at, n, h); break;
                      case common::RuleKind::Adamax: isa_call<adamax_block>(w, g, s0 + at, s1 + at, n, h); break;
                      case common::RuleKind::Adagrad: isa_call<adagrad_block>(w, g, s0 + at, n, h); break;
                      case common::RuleKind::Lion: isa_call<lion_block>(w, g, s0 + at, n, h); break;
                    }
                  });
  }
}

void CpuBackend::adafactor_update(Tensor& var, const Tensor& grad, Tensor* r, Tensor* c, Tensor* v,
                                  const common::AdafactorShape& s, const common::AdafactorHyper& h) {
  // The phases of backend/common/adafactor.hpp in order, each over the threads (rows, columns,
  // chunks and elements are independent: the bits do not depend on the thread count). The
  // columns are summed row by row over a range of columns at once (contiguous reads), each
  // column's additions in the same order as the GPU's one thread per column.
  using namespace common;
  float* w = var.data<float>();
  const float* g = grad.data<float>();
  float* rv = s.factored ? r->data<float>() : v->data<float>();
  float* col = s.factored ? c->data<float>() : nullptr;
  const std::int64_t rows = s.blocks * s.rows;
  const std::int64_t row_grain = std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(1, s.cols));
  const std::int64_t segments = 1 + (s.factored ? s.blocks : 0);
  std::vector<double> wrow(static_cast<std::size_t>(rows)), urow(wrow.size());
  std::vector<double> partial(static_cast<std::size_t>(segments * kSumChunks)), totals(static_cast<std::size_t>(segments + 1));
  parallel_for(rows, row_grain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t q = b; q < e; ++q) adafactor_row(s, h, w, g, rv, wrow.data(), q);
  });
  if (s.factored) {
    const std::int64_t col_grain = std::max<std::int64_t>(64, kGrain / std::max<std::int64_t>(1, s.rows));
    parallel_for(s.blocks * s.cols, col_grain, [&](std::int64_t b, std::int64_t e) {
      std::vector<double> acc;
      for (std::int64_t q0 = b; q0 < e;) {  // the columns of one block at a time
        const std::int64_t l = q0 / s.cols, c0 = q0 % s.cols, m = std::min(e - q0, s.cols - c0);
        acc.assign(static_cast<std::size_t>(m), 0.0);
        const float* gl = g + l * s.rows * s.cols + c0;
        for (std::int64_t rr = 0; rr < s.rows; ++rr)
          for (std::int64_t j = 0; j < m; ++j) acc[j] = adafactor_col_add(acc[j], gl[rr * s.cols + j], h);
        for (std::int64_t j = 0; j < m; ++j) adafactor_col_finish(s, h, col, q0 + j, acc[j]);
        q0 += m;
      }
    });
  }
  // Σ w² (segment 0) and each block's Σ r (segments 1..L), then Σ u² into totals[segments].
  for (int k = 0; k < kSumChunks; ++k) partial[k] = chunk_sum(wrow.data(), rows, k);
  if (s.factored)
    for (std::int64_t l = 0; l < s.blocks; ++l)
      for (int k = 0; k < kSumChunks; ++k) partial[(1 + l) * kSumChunks + k] = chunk_sum(rv + l * s.rows, s.rows, k);
  for (std::int64_t seg = 0; seg < segments; ++seg) totals[seg] = chunks_total(partial.data() + seg * kSumChunks);
  const double* rsum = totals.data() + 1;
  parallel_for(rows, row_grain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t q = b; q < e; ++q) adafactor_u_row(s, g, rv, col, rsum, urow.data(), q);
  });
  for (int k = 0; k < kSumChunks; ++k) partial[k] = chunk_sum(urow.data(), rows, k);
  totals[segments] = chunks_total(partial.data());
  float alpha, denom;
  adafactor_step(s, h, totals[0], totals[segments], alpha, denom);
  parallel_for(rows, row_grain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t q = b; q < e; ++q) {
      const float factor = adafactor_row_factor(s, rv, rsum, q);
      const float* col_q = adafactor_col_of(s, col, q);
      for (std::int64_t j = 0; j < s.cols; ++j) adafactor_apply(s, h, w, g, factor, col_q, alpha, denom, q, j);
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
    float* po = outs[k].defined() ? outs[k].data<float>() : nullptr;  // undefined: check only
    // A check alone of 16-bit values, where no finite one times s can overflow float32: x · s is
    // inf or NaN exactly where x is, so the exponent bits say it (no widening pass; the float16
    // policy's check of every step).
    const double largest = x.dtype() == float16    ? half_bits_to_float(0x7bff)       // the largest finite
                           : x.dtype() == bfloat16 ? bfloat16_bits_to_float(0x7f7f)  // values' bits
                                                   : 0.0;
    if (!po && largest > 0 && std::isfinite(s) && std::abs(static_cast<double>(s)) * largest <= FLT_MAX) {
      if (has_nonfinite(x)) per_tensor[k] = 1.0f, any_tensor = true;
      continue;
    }
    parallel_for(x.numel(), kGrain, [&](std::int64_t b, std::int64_t e) {
      float sx[kBlock];
      bool bad = false;
      for (std::int64_t i = b; i < e; i += kBlock) {
        const std::int64_t m = std::min(kBlock, e - i);
        const float* xi = load<float>(x, i, m, sx);
        bad |= po ? isa_call<scale_block>(xi, po + i, m, s) : isa_call<check_block>(xi, m, s);
      }
      if (bad) any.store(true, std::memory_order_relaxed);
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
