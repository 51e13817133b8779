#pragma once
/// Fused optimizer ops: one pass per variable that updates it and its slots in place, and one
/// pass over all gradients that unscales them and checks them for inf/NaN. Optimizers under
/// optimizers/ are written with these. Nothing here is recorded on a GradientTape.
///
/// The variable may be float32, float16 or bfloat16 (the update is computed in float32 and
/// rounded back); gradients may be any floating dtype; slots must be float32. All tensors
/// share the variable's shape and device.
///
/// `copy` (optional, null when unused) receives the updated variable in the copy's own dtype
/// (float32, float16 or bfloat16), in the same pass and with the same bits as ops::cast of the
/// updated variable: a mixed-precision optimizer writes the float32 master and its 16-bit
/// compute copy at once instead of reading the master again in the next forward pass.
///
/// `grad_scale` multiplies every gradient element (in float32, after widening) before it is
/// used: the LossScaleOptimizer's unscale fused into the update, as PyTorch's fused Adam takes
/// grad_scale. The results have the bits of the update applied to unscale_and_check's output.
///
///   // Adam, step t (Keras's form: alpha = lr * sqrt(1 - b2^t) / (1 - b1^t))
///   mpt::ops::adam_update(w, g, m, v, nullptr, alpha, 0.9, 0.999, 1e-7);
///   auto r = mpt::ops::unscale_and_check(grads, 1.0 / 32768);
///   if (!r.found_nonfinite) apply(r.grads);
#include <cstdint>
#include <vector>

#include "mpt/tensor.hpp"

namespace mpt::ops {

/// SGD. momentum == nullptr: var -= lr * g. Otherwise
///   m = momentum_coef * m - lr * g;  var += m   (nesterov: var += momentum_coef * m - lr * g).
void sgd_update(Tensor& var, const Tensor& grad, Tensor* momentum, double lr, double momentum_coef,
                bool nesterov, Tensor* copy = nullptr, double grad_scale = 1.0);

/// Adam / AdamW, Keras's form:
///   var -= var * decay                      (AdamW's decoupled decay: decay = weight_decay * lr)
///   m += (g - m) * (1 - beta_1);  v += (g^2 - v) * (1 - beta_2)
///   vhat = max(vhat, v) and use vhat for v  (amsgrad, when vhat != nullptr)
///   var -= alpha * m / (sqrt(v) + epsilon)
void adam_update(Tensor& var, const Tensor& grad, Tensor& m, Tensor& v, Tensor* vhat, double alpha,
                 double beta_1, double beta_2, double epsilon, double decay = 0.0, Tensor* copy = nullptr,
                 double grad_scale = 1.0);

/// RMSprop, Keras's form:
///   vel = rho * vel + (1 - rho) * g^2
///   centered (avg != nullptr): avg = rho * avg + (1 - rho) * g;  denom = vel - avg^2 + epsilon
///   otherwise denom = vel + epsilon
///   inc = lr * g / sqrt(denom)
///   momentum slot given: mom = momentum_coef * mom + inc; var -= mom.  Otherwise var -= inc.
void rmsprop_update(Tensor& var, const Tensor& grad, Tensor& velocity, Tensor* average_grad,
                    Tensor* momentum, double lr, double rho, double momentum_coef, double epsilon,
                    Tensor* copy = nullptr, double grad_scale = 1.0);

/// The three updates above for many variables in one call, with the step's hyperparameters
/// shared: entry i updates vars[i] with grads[i] and entry i of each slot list, exactly as the
/// single-variable op would, in the same bits (a CUDA device does it in a few launches for all
/// variables instead of one per variable). Each entry is validated as the single op does (an
/// error names the op and the entry). Required slot lists (Adam's m and v, RMSprop's velocity)
/// have one non-null entry per variable; optional ones, and `copies` (the single ops' `copy`),
/// are empty (unused by every variable) or have one entry per variable, null where unused. All tensors are on one device, and no
/// variable appears twice. Empty lists do nothing.
///
///   std::vector<mpt::Tensor> ws{w1, w2}, gs{g1, g2};
///   mpt::ops::adam_update_all(ws, gs, {&m1, &m2}, {&v1, &v2}, {}, alpha, 0.9, 0.999, 1e-7);
void sgd_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                    const std::vector<Tensor*>& momenta, double lr, double momentum_coef, bool nesterov,
                    const std::vector<Tensor*>& copies = {}, double grad_scale = 1.0);
void adam_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads, const std::vector<Tensor*>& m,
                     const std::vector<Tensor*>& v, const std::vector<Tensor*>& vhat, double alpha, double beta_1,
                     double beta_2, double epsilon, double decay = 0.0, const std::vector<Tensor*>& copies = {},
                     double grad_scale = 1.0);
void rmsprop_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                        const std::vector<Tensor*>& velocity, const std::vector<Tensor*>& average_grad,
                        const std::vector<Tensor*>& momentum, double lr, double rho, double momentum_coef,
                        double epsilon, const std::vector<Tensor*>& copies = {}, double grad_scale = 1.0);

/// The update rules of Nadam, Adamax, Adagrad and Lion, Keras's forms (each defined once, in
/// src/backend/common/optim_rules.hpp, for both backends), fused as the updates above: one pass
/// updates the variable, its float32 slots and the optional copy, with grad_scale and the
/// decoupled weight decay (var -= var * decay first, decay = weight_decay * lr; 0 for none).
///   nadam   (slots momentum, velocity): m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
///           m_hat = u_next m / (1 - u_product_next) + (1 - u_t) g / (1 - u_product);
///           var -= m_hat lr / (sqrt(v / (1 - beta_2_power)) + epsilon)
///   adamax  (slots momentum, norm): m += (g - m)(1 - b1); u = max(b2 u, |g|);
///           var -= lr m / ((1 - beta_1_power)(u + epsilon))
///   adagrad (slot accumulator): acc += g^2; var -= lr g / sqrt(acc + epsilon)
///   lion    (slot momentum): var -= lr sign(b1 m + (1 - b1) g); m = b2 m + (1 - b2) g
enum class UpdateRule { nadam, adamax, adagrad, lion };
/// A step's arguments (the rule takes the ones it names).
struct RuleArgs {
  double lr = 0, beta_1 = 0, beta_2 = 0, epsilon = 0, decay = 0;
  double u_t = 0, u_next = 0, u_product = 0, u_product_next = 0;  ///< Nadam's momentum schedule
  double beta_1_power = 0, beta_2_power = 0;                       ///< beta^t, t counted from 1
};
/// "nadam", "adamax", ...
const char* rule_name(UpdateRule rule);
/// The number of slots the rule updates (2, 2, 1, 1).
int rule_slot_count(UpdateRule rule);
/// One variable: slots[k] is its k-th slot (non-null, float32, the variable's shape and device).
void rule_update(UpdateRule rule, Tensor& var, const Tensor& grad, const std::vector<Tensor*>& slots,
                 const RuleArgs& args, Tensor* copy = nullptr, double grad_scale = 1.0);
/// Many variables (the *_update_all contract above): slots[k][i] is variable i's k-th slot.
void rule_update_all(UpdateRule rule, std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                     const std::vector<std::vector<Tensor*>>& slots, const RuleArgs& args,
                     const std::vector<Tensor*>& copies = {}, double grad_scale = 1.0);

/// Adafactor's update (Keras's form; defined once, in src/backend/common/adafactor.hpp, for both
/// backends). A variable of rank >= 2 keeps its second moment factored as row means r
/// (shape[:-1]) and column means c (shape[:-2] + shape[-1:]), pass v = nullptr; one of rank < 2
/// keeps it whole in v (its shape), pass r = c = nullptr. Slots float32 on the variable's device.
/// With w the variable after the decoupled decay (w -= w * decay, first) and g the gradient:
///   reg = g^2 + epsilon_1;  r = b r + (1 - b) mean(reg, -1);  c = b c + (1 - b) mean(reg, -2)
///   v = (r / mean(r, -1))[..., None] * c[..., None, :]   (rank < 2: v = b v + (1 - b) reg)
///   u = g / sqrt(v);  w -= max(epsilon_2, rms(w)) rho_t u / max(1, rms(u) / clip_threshold)
/// with b = beta_2_t. Means and RMSs are summed in float64 in one fixed order on every device.
struct AdafactorArgs {
  double beta_2_t = 0, epsilon_1 = 1e-30, epsilon_2 = 1e-3, rho_t = 0, clip_threshold = 1, decay = 0;
};
void adafactor_update(Tensor& var, const Tensor& grad, Tensor* r, Tensor* c, Tensor* v, const AdafactorArgs& args);

struct UnscaleResult {
  std::vector<Tensor> grads;     ///< grads[i] * inv_scale in float32 (undefined stays undefined)
  Tensor found_flag;             ///< float32 scalar on the gradients' device: 1 when any is inf/NaN
  Tensor nonfinite_flags;        ///< float32 [grads.size()] on that device: 1 for each gradient that held inf/NaN
  bool found_nonfinite = false;  ///< the flag read back (only by the double overload)
};
/// Multiplies every gradient by inv_scale into new float32 tensors and checks them for inf/NaN
/// in the same pass (the inputs are left untouched). All defined gradients share one device.
/// This overload reads the flag back to the host (found_nonfinite).
UnscaleResult unscale_and_check(const std::vector<Tensor>& grads, double inv_scale);
/// The same with inv_scale a float32 scalar on the gradients' device; the flag stays there
/// (found_flag), nothing is read by the host.
UnscaleResult unscale_and_check(const std::vector<Tensor>& grads, const Tensor& inv_scale);
/// unscale_and_check's flags (found_flag, nonfinite_flags) without writing the unscaled
/// gradients (grads stays empty): the check before an update that takes grad_scale.
UnscaleResult check_unscaled(const std::vector<Tensor>& grads, const Tensor& inv_scale);

/// Keras's dynamic loss-scale rule with hysteresis and bounds.
struct LossScaleRule {
  bool dynamic = true;
  std::int64_t growth_steps = 2000;
  std::int64_t hysteresis = 1;
  double min_scale = 1.0, max_scale = 16777216.0;
};
/// One step of the rule on the device, driven by the flag of unscale_and_check: scale and
/// inv_scale are float32 scalars, counters int64 [2] = (finite steps in a row, overflows in a
/// row), all updated in place on their device.
void update_loss_scale(Tensor& scale, Tensor& inv_scale, Tensor& counters, const Tensor& found,
                       const LossScaleRule& rule);

}  // namespace mpt::ops
