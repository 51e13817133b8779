#include "config_values.hpp"
#include "mpt/autograd.hpp"
#include "mpt/distributed.hpp"
#include "mpt/layers/normalization.hpp"
#include "mpt/mixed_precision/loss_scale_optimizer.hpp"
#include "mpt/nn_ops.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {


class BatchNormalizationLayer : public Layer {
 public:
  explicit BatchNormalizationLayer(BatchNormalizationOptions o) : Layer("BatchNormalization", o.dtype, o.name), o_(std::move(o)) {
    if (!(o_.momentum >= 0.0 && o_.momentum <= 1.0)) error("momentum must be in [0, 1], got ", o_.momentum);
    if (!(o_.epsilon > 0.0)) error("epsilon must be positive, got ", o_.epsilon);
    set_rules("beta", o_.beta_regularizer, o_.beta_constraint);
    set_rules("gamma", o_.gamma_regularizer, o_.gamma_constraint);
  }

  void build(const Shape& s) override {
    if (s.size() < 2) error("expected an input of rank >= 2 (batch, ..., channels), got shape ", to_string(s));
    const auto rank = static_cast<std::int64_t>(s.size());
    if (o_.axis != -1 && o_.axis != rank - 1)
      error("axis ", o_.axis, " is not supported: mpt normalizes the last (channels) axis, axis -1, of input shape ",
            to_string(s));
    const Shape c{s.back()};
    if (o_.scale) gamma_ = add_weight("gamma", c, o_.gamma_initializer);
    if (o_.center) beta_ = add_weight("beta", c, o_.beta_initializer);
    moving_mean_ = add_weight("moving_mean", c, o_.moving_mean_initializer, false);
    moving_variance_ = add_weight("moving_variance", c, o_.moving_variance_initializer, false);
  }

  Tensor call(const Tensor& x, bool training) override {
    check_input(x, 2, moving_mean_.shape()[0]);
    // A custom loop that never calls finish_step still moves the statistics, once per call,
    // unless a LossScaleOptimizer skipped a step since they were computed.
    if (mixed_precision::skipped_steps_total() == skips_at_call_) commit();
    pending_mean_ = pending_variance_ = Tensor();
    // float32 statistics and normalization under every policy (float64 for float64 inputs).
    const DType pd = x.dtype() == float64 ? float64 : float32;
    Tensor gamma = o_.scale ? gamma_.read(pd) : Tensor(), beta = o_.center ? beta_.read(pd) : Tensor();
    if (!(training && trainable()))
      return ops::batch_norm(x, gamma, beta, moving_mean_.read(pd), moving_variance_.read(pd), {.epsilon = o_.epsilon}).y;
    const distributed::DataParallel* dp = distributed::current_strategy();
    auto r = dp && dp->size() > 1 && dp->options().sync_batch_norm
                 ? synced_batch_norm(*dp, x, gamma, beta)
                 : ops::batch_norm(x, gamma, beta, {}, {}, {.training = true, .epsilon = o_.epsilon});
    // Keras: moving = moving * momentum + batch * (1 - momentum), with the biased batch variance.
    NoGradGuard no_grad;
    skips_at_call_ = mixed_precision::skipped_steps_total();
    pending_mean_ = moving_mean_.value().to(pd) * o_.momentum + r.mean * (1.0 - o_.momentum);
    pending_variance_ = moving_variance_.value().to(pd) * o_.momentum + r.variance * (1.0 - o_.momentum);
    return r.y;
  }

  void finish_step(bool applied) override {
    if (applied) commit();
    pending_mean_ = pending_variance_ = Tensor();
  }

  nlohmann::json config() const override {
    nlohmann::json c = {{"axis", o_.axis},
            {"momentum", o_.momentum},
            {"epsilon", o_.epsilon},
            {"center", o_.center},
            {"scale", o_.scale},
            {"beta_initializer", o_.beta_initializer},
            {"gamma_initializer", o_.gamma_initializer},
            {"moving_mean_initializer", o_.moving_mean_initializer},
            {"moving_variance_initializer", o_.moving_variance_initializer}};
    c.update(rules_config());
    return c;
  }

 private:
  /// SyncBatchNorm: statistics over every rank's rows (two all-reduces of per-channel sums, each
  /// differentiable, so the backward pass reduces the gradients' sums too), in float32.
  ops::BatchNormResult synced_batch_norm(const distributed::DataParallel& dp, const Tensor& x, const Tensor& gamma,
                                         const Tensor& beta) {
    const std::int64_t channels = x.shape().back();
    const Tensor x2 = ops::cast(x, float32).reshape({-1, channels});
    const double rows = dp.all_reduce({static_cast<double>(x2.shape()[0])})[0];
    const Tensor inv_rows = Tensor::scalar(1.0 / rows, float32, x.device());
    const Tensor mean = ops::mul(distributed::all_reduce_sum(ops::sum(x2, {0})), inv_rows);
    const Tensor centered = ops::sub(x2, mean);
    const Tensor variance = ops::mul(distributed::all_reduce_sum(ops::sum(ops::square(centered), {0})), inv_rows);
    const Tensor inv_std = ops::div(Tensor::scalar(1.0, float32, x.device()),
                                    ops::sqrt(ops::add(variance, Tensor::scalar(o_.epsilon, float32, x.device()))));
    Tensor y = ops::mul(centered, inv_std);
    if (gamma.defined()) y = ops::mul(y, ops::cast(gamma, float32));
    if (beta.defined()) y = ops::add(y, ops::cast(beta, float32));
    ops::BatchNormResult r;
    r.y = ops::cast(y.reshape(x.shape()), x.dtype());
    const DType pd = x.dtype() == float64 ? float64 : float32;  // the statistics' dtype, as ops::batch_norm
    r.mean = mean.detach().to(pd);
    r.variance = variance.detach().to(pd);
    return r;
  }

  void commit() {
    if (!pending_mean_.defined()) return;
    moving_mean_.assign(pending_mean_);
    moving_variance_.assign(pending_variance_);
    pending_mean_ = pending_variance_ = Tensor();
  }

  BatchNormalizationOptions o_;
  Variable gamma_, beta_, moving_mean_, moving_variance_;
  Tensor pending_mean_, pending_variance_;  // from the last training call, until its step is settled
  std::uint64_t skips_at_call_ = 0;          // skipped_steps_total() when they were computed
};

const bool registered = [] {
  register_layer("BatchNormalization", [](const LayerConfig& c) {
    BatchNormalizationOptions o{.dtype = c.dtype, .name = c.name};
    if (c.has("axis")) o.axis = detail::one_axis(c, "axis");
    c.expect("synchronized", false);  // one device per process: nothing to synchronize
    c.expect("renorm", false);
    c.has("renorm_momentum");  // used by renorm only
    if (c.has("momentum")) o.momentum = c.get_double("momentum");
    if (c.has("epsilon")) o.epsilon = c.get_double("epsilon");
    if (c.has("center")) o.center = c.get_bool("center");
    if (c.has("scale")) o.scale = c.get_bool("scale");
    o.beta_initializer = c.get_initializer("beta_initializer", o.beta_initializer);
    o.gamma_initializer = c.get_initializer("gamma_initializer", o.gamma_initializer);
    o.moving_mean_initializer = c.get_initializer("moving_mean_initializer", o.moving_mean_initializer);
    o.moving_variance_initializer = c.get_initializer("moving_variance_initializer", o.moving_variance_initializer);
    return BatchNormalization(std::move(o));
  });
  return true;
}();

}  // namespace

LayerRef BatchNormalization(BatchNormalizationOptions o) { return std::make_shared<BatchNormalizationLayer>(std::move(o)); }

}  // namespace mpt::layers
