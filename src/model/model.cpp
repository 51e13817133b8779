#include "mpt/model.hpp"

#include <algorithm>
#include <cmath>
#include <future>
#include <map>

#include "mpt/autograd.hpp"
#include "mpt/data/data.hpp"
#include "mpt/log.hpp"
#include "mpt/ops.hpp"

namespace mpt {

Model::Model() : name_("model"), policy_(mixed_precision::global_policy()), seed_(detail::next_seed()) {}

void Model::assign_layer_names() {
  std::map<std::string, int> used;
  for (const auto& l : layers())
    if (l->has_user_name())
      MPT_CHECK(used[l->name()]++ == 0, "model '", name_, "': two layers are named '", l->name(),
                "'; layer names must be unique (they name the checkpoint's groups), as in Keras");
  for (const auto& l : layers()) {
    if (l->has_user_name()) continue;
    std::string base = to_snake_case(l->class_name()), name = base;
    for (int i = 1; used.count(name); ++i) name = base + "_" + std::to_string(i);
    used[name]++;
    if (l->name() != name) l->set_name(name);
  }
}

// ---- variables ----------------------------------------------------------------------------
std::vector<Variable> Model::variables() const {
  std::vector<Variable> out;
  for (const auto& l : layers())
    for (const auto& v : l->variables()) out.push_back(v);
  return out;
}
std::vector<Variable> Model::trainable_variables() const {
  std::vector<Variable> out;
  for (const auto& v : variables())
    if (v.trainable()) out.push_back(v);
  return out;
}
std::vector<Variable> Model::non_trainable_variables() const {
  std::vector<Variable> out;
  for (const auto& v : variables())
    if (!v.trainable()) out.push_back(v);
  return out;
}
std::int64_t Model::count_params() const {
  std::int64_t n = 0;
  for (const auto& v : variables()) n += v.numel();
  return n;
}
std::vector<Tensor> Model::get_weights() const {
  std::vector<Tensor> out;
  for (const auto& v : variables()) out.push_back(v.value().copy());
  return out;
}
void Model::set_weights(const std::vector<Tensor>& w) {
  auto vars = variables();
  MPT_CHECK(w.size() == vars.size(), "set_weights: model '", name_, "' has ", vars.size(), " variables, got ",
            w.size(), " tensors");
  for (std::size_t i = 0; i < w.size(); ++i) {
    MPT_CHECK(w[i].shape() == vars[i].shape(), "set_weights: variable '", vars[i].path(), "' has shape ",
              to_string(vars[i].shape()), ", got ", to_string(w[i].shape()));
    vars[i].assign(w[i].to(vars[i].value().device()));
  }
}

// ---- compile ------------------------------------------------------------------------------
optimizers::Optimizer& Model::optimizer() const {
  MPT_CHECK(optimizer_ != nullptr, "model '", name_, "': not compiled; call compile() first");
  return *optimizer_;
}
mixed_precision::LossScaleOptimizer* Model::loss_scale_optimizer() const {
  return dynamic_cast<mixed_precision::LossScaleOptimizer*>(optimizer_.get());
}
const losses::Loss& Model::loss() const {
  MPT_CHECK(loss_ != nullptr, "model '", name_, "': not compiled; call compile() first");
  return *loss_;
}

void Model::compile(CompileOptions o) {
  MPT_CHECK(!o.loss.empty(), "compile: a loss is required (e.g. .loss = \"sparse_categorical_crossentropy\")");
  loss_ = o.loss.get();
  MPT_CHECK(!o.optimizer.empty(), "compile: the optimizer is empty (\"\" or a null pointer); pass an optimizer ",
            "or one of the names sgd, adam, adamw, rmsprop (Keras's default is rmsprop)");
  optimizer_ = o.optimizer.get();
  if (o.auto_scale_loss && policy_.name() == "mixed_float16" && !loss_scale_optimizer())
    optimizer_ = std::make_shared<mixed_precision::LossScaleOptimizer>(optimizer_);
  metric_args_ = o.metrics;
  metrics_.clear(), val_metrics_.clear();
  metrics_resolved_ = false;
  // The layers that produce the model's outputs: a functional model's output nodes, else the last.
  std::vector<LayerRef> out_layers;
  for (const auto& o : outputs_)
    if (o.node() && o.node()->layer) out_layers.push_back(LayerRef(o.node()->layer));
  if (outputs_.empty() && !layers().empty()) out_layers.push_back(layers().back());
  for (const auto& l : out_layers) {
    // Only under a mixed policy (a pure float16 model keeps what it asked for), as Keras.
    if (!l->ends_in_softmax() || l->dtype_policy().name().rfind("mixed_", 0) != 0) continue;
    mpt::log(LogLevel::info, "compile: final softmax layer '", l->name(), "' runs in float32 (was ",
        l->dtype_policy().name(), ")");
    l->set_dtype_policy(mixed_precision::Policy("float32"));
  }
}

void Model::resolve_metrics(const Tensor& y, const Tensor& y_pred) {
  if (metrics_resolved_) return;
  for (const auto& m : metric_args_) {
    auto metric = m.object() ? m.object() : metrics::get(m.name(), loss_->name(), y.shape(), y_pred.shape());
    metrics_.push_back(metric);
    auto val = metric->clone();
    val->set_name("val_" + metric->name());
    val_metrics_.push_back(val);
  }
  metrics_resolved_ = true;
}

std::map<std::string, double> Model::metric_logs(const std::vector<std::shared_ptr<metrics::Metric>>& ms) const {
  std::map<std::string, double> logs;
  for (const auto& m : ms) logs[m->name()] = m->result();
  return logs;
}

// ---- steps --------------------------------------------------------------------------------
namespace {
/// The float32 island the loss and metrics see.
Tensor as_loss_input(const Tensor& y_pred) {
  return is_half(y_pred.dtype()) ? ops::cast(y_pred, float32) : y_pred;
}

}  // namespace

void Model::check_fit_inputs(const char* where, const Tensor& x, const Tensor& y, std::int64_t batch_size) const {
  MPT_CHECK(x.defined(), where, ": x is undefined");
  MPT_CHECK(x.dim() >= 1, where, ": x must have a batch dimension, got shape ", to_string(x.shape()));
  MPT_CHECK(batch_size > 0, where, ": batch_size must be positive, got ", batch_size);
  check_input(x);
  if (y.defined()) {
    MPT_CHECK(y.dim() >= 1 && y.shape()[0] == x.shape()[0], where, ": x and y have different numbers of samples: x ",
              to_string(x.shape()), ", y ", to_string(y.shape()));
  }
  data::check_finite(where, "x", x);
  data::check_finite(where, "y", y);
}

void Model::finish_step(bool applied) {
  for (const auto& l : layers()) l->finish_step(applied);
}

Device Model::variables_device() const {
  for (const auto& l : layers())
    for (const auto& v : l->variables()) return v.value().device();
  return default_device();
}

void Model::check_targets(const char* where, const Tensor& x, const Tensor& y) {
  if (!y.defined() || x.shape()[0] == 0) return;
  const Device device = variables_device();
  NoGradGuard no_grad;
  // One sample through the model: builds it, resolves the metrics and tells the classes.
  Tensor p = as_loss_input(call(x.slice(0, 1).to(device), false));
  resolve_metrics(y.slice(0, 1), p);
  // The host copy; read once where y is on a device.
  if (loss_->name() == "sparse_categorical_crossentropy" && p.dim() >= 1) data::check_labels(where, y, p.shape().back());
  if (loss_->name() == "binary_crossentropy") data::check_unit_interval(where, y);
}

Model::StepResult Model::train_step(const Tensor& x, const Tensor& y, bool keep_gradients) {
  StepResult r;
  Tensor y_pred;
  std::vector<Tensor> grads;
  std::vector<Variable> vars;
  auto* lso = loss_scale_optimizer();
  {
    GradientTape tape;
    y_pred = as_loss_input(call(x, true));
    vars = trainable_variables();  // after the call: the first one builds the layers
    r.loss = (*loss_)(y, y_pred);
    grads = tape.gradient(lso ? lso->get_scaled_loss(r.loss) : r.loss, vars);
  }
  if (lso) {
    auto unscaled = lso->get_unscaled_gradients(grads);
    auto applied = lso->apply_gradients_checked(unscaled, vars);
    r.applied = applied.applied;
    r.nonfinite_variables = std::move(applied.nonfinite_variables);
    if (keep_gradients) r.gradients = std::move(unscaled);
  } else {
    optimizer_->apply_gradients(grads, vars);
    if (keep_gradients) r.gradients = std::move(grads);
  }
  if (keep_gradients) r.variables = vars;
  finish_step(r.applied);
  r.loss = r.loss.detach();
  NoGradGuard no_grad;
  resolve_metrics(y, y_pred);
  for (auto& m : metrics_) m->update_state(y, y_pred.detach());
  return r;
}

Tensor Model::test_step(const Tensor& x, const Tensor& y, std::vector<std::shared_ptr<metrics::Metric>>& ms) {
  NoGradGuard no_grad;
  Tensor y_pred = as_loss_input(call(x, false));
  Tensor loss = (*loss_)(y, y_pred);
  resolve_metrics(y, y_pred);
  for (auto& m : ms) m->update_state(y, y_pred);
  return loss;
}

// ---- fit / evaluate / predict -------------------------------------------------------------
namespace {

/// Batches of (x, y) on the model's device, in order or by a shuffled order. When the data
/// lives elsewhere (host data, a model on a GPU), the next batch is gathered and copied on a
/// background thread while the current one trains; data already on the device is sliced or
/// gathered in place, synchronously (a helper thread would only take a core from the kernels).
class BatchStager {
 public:
  BatchStager(Tensor x, Tensor y, std::int64_t batch_size, std::vector<std::int64_t> order, Device device)
      : x_(std::move(x)), y_(std::move(y)), batch_size_(batch_size), order_(std::move(order)), device_(device),
        steps_(data::batch_count(x_.shape()[0], batch_size)), ahead_(x_.device() != device) {}

  /// Batch `step`; steps are asked for in order.
  std::pair<Tensor, Tensor> get(std::int64_t step) {
    std::pair<Tensor, Tensor> b = next_step_ == step ? next_.get() : make(step);
    if (ahead_ && step + 1 < steps_) {
      next_ = std::async(std::launch::async, [this, s = step + 1] { return make(s); });
      next_step_ = step + 1;
    }
    return b;
  }
  std::int64_t rows(std::int64_t step) const {
    const std::int64_t begin = step * batch_size_;  // step < steps_: no overflow
    return std::min(x_.shape()[0] - begin, batch_size_);
  }

 private:
  std::pair<Tensor, Tensor> make(std::int64_t step) const {
    const std::int64_t b = step * batch_size_, e = b + rows(step);
    auto pick = [&](const Tensor& t) { return t.defined() ? data::rows_of(t, order_, b, e).to(device_) : Tensor(); };
    return {pick(x_), pick(y_)};
  }

  Tensor x_, y_;
  std::int64_t batch_size_;
  std::vector<std::int64_t> order_;
  Device device_;
  std::int64_t steps_;
  bool ahead_;
  std::future<std::pair<Tensor, Tensor>> next_;
  std::int64_t next_step_ = -1;
};

}  // namespace

History Model::fit(const Tensor& x_all, const Tensor& y_all, FitOptions o) {
  MPT_CHECK(compiled(), "fit: model '", name_, "' is not compiled; call compile() first");
  check_fit_inputs("fit", x_all, y_all, o.batch_size);
  MPT_CHECK(y_all.defined(), "fit: y is required");
  MPT_CHECK(o.epochs >= 0 && o.initial_epoch >= 0, "fit: epochs and initial_epoch must be >= 0");
  MPT_CHECK(o.validation_split >= 0.0 && o.validation_split < 1.0, "fit: validation_split must be in [0, 1), got ",
            o.validation_split);
  Tensor x = x_all, y = y_all, vx, vy;
  if (o.validation_data) {
    vx = o.validation_data->first, vy = o.validation_data->second;
    check_fit_inputs("fit (validation_data)", vx, vy, o.batch_size);
  } else if (o.validation_split > 0) {
    // As Keras: the last fraction of the data, taken before any shuffling.
    const std::int64_t n = x_all.shape()[0];
    const auto split = static_cast<std::int64_t>(std::ceil(static_cast<double>(n) * (1.0 - o.validation_split)));
    MPT_CHECK(split > 0 && split < n, "fit: validation_split ", o.validation_split, " leaves no training or no validation samples out of ", n);
    x = x_all.slice(0, split), y = y_all.slice(0, split);
    vx = x_all.slice(split, n), vy = y_all.slice(split, n);
  }
  const std::int64_t n = x.shape()[0];
  MPT_CHECK(n > 0, "fit: no training samples");
  check_targets("fit", x, y);
  const std::int64_t steps = data::batch_count(n, o.batch_size);

  std::vector<std::shared_ptr<callbacks::Callback>> cbs;
  for (std::size_t i = 0; i < o.callbacks.size(); ++i) {
    MPT_CHECK(o.callbacks[i].get() != nullptr, "fit: callback ", i, " is a null pointer");
    cbs.push_back(o.callbacks[i].get());
  }
  if (o.verbose > 0) cbs.push_back(std::make_shared<callbacks::ProgbarLogger>(o.verbose, steps, o.epochs));
  for (auto& c : cbs) c->set_model(this);

  History history;
  stop_training = false;
  auto* lso = loss_scale_optimizer();
  const std::uint64_t seed = o.seed ? *o.seed : seed_;
  const Device device = variables_device();
  for (auto& c : cbs) c->on_train_begin({});
  Logs logs;
  auto epoch_logs = [&](const metrics::Mean& loss_mean) {
    Logs l = metric_logs(metrics_);
    l["loss"] = loss_mean.result();
    return l;
  };
  for (int epoch = o.initial_epoch; epoch < o.epochs && !stop_training; ++epoch) {
    for (auto& c : cbs) c->on_epoch_begin(epoch, {});
    for (auto& m : metrics_) m->reset_state();
    metrics::Mean loss_mean("loss");
    std::int64_t skipped = 0;
    std::map<std::string, std::int64_t> nonfinite_layers;
    BatchStager batches(x, y, o.batch_size,
                        o.shuffle ? data::permutation(n, seed + static_cast<std::uint64_t>(epoch)) : std::vector<std::int64_t>{},
                        device);
    for (std::int64_t step = 0; step < steps; ++step) {
      auto [xb, yb] = batches.get(step);
      for (auto& c : cbs) c->on_train_batch_begin(step, {});
      bool keep_gradients = false;
      for (auto& c : cbs) keep_gradients = c->wants_gradients(step) || keep_gradients;
      StepResult r = train_step(xb, yb, keep_gradients);
      if (keep_gradients)
        for (auto& c : cbs) c->on_train_batch_gradients(step, r.variables, r.gradients);
      loss_mean.update(r.loss, static_cast<double>(batches.rows(step)));
      skipped += !r.applied;
      if (!r.nonfinite_variables.empty()) {
        // Overflow diagnostics: the layers (a variable "<layer>/<weight>" names its layer).
        std::vector<std::string> step_layers;
        for (const auto& v : r.nonfinite_variables) {
          std::string layer = v.substr(0, v.find('/'));
          if (std::find(step_layers.begin(), step_layers.end(), layer) == step_layers.end()) step_layers.push_back(layer);
        }
        for (const auto& l : step_layers) ++nonfinite_layers[l];
        if (o.verbose > 0) {
          std::string layers_list, vars_list;
          for (const auto& l : step_layers) layers_list += (layers_list.empty() ? "" : ", ") + l;
          for (const auto& v : r.nonfinite_variables) vars_list += (vars_list.empty() ? "" : ", ") + v;
          mpt::log(LogLevel::info, "epoch ", epoch + 1, " step ", step + 1, " skipped: inf/NaN gradients in ",
                   step_layers.size() == 1 ? "layer " : "layers ", layers_list, " (", vars_list,
                   "); loss scale now ", lso ? lso->loss_scale() : 1.0);
        }
      }
      // Loss and metrics stay on the device unless a callback reads this batch's logs (the
      // progress bar when it redraws).
      bool wanted = false;
      for (auto& c : cbs) wanted = c->wants_batch_logs(step) || wanted;
      logs = wanted ? epoch_logs(loss_mean) : Logs{};
      for (auto& c : cbs) c->on_train_batch_end(step, logs);
    }
    logs = epoch_logs(loss_mean);
    if (vx.defined()) {
      auto val = evaluate(vx, vy, {.batch_size = o.batch_size, .verbose = 0});
      for (const auto& [k, v] : val) logs["val_" + k] = v;
    }
    logs["learning_rate"] = optimizer_->learning_rate();
    logs["loss_scale"] = lso ? lso->loss_scale() : 1.0;
    logs["skipped_steps"] = static_cast<double>(skipped);
    epoch_ = epoch + 1;  // callbacks (ModelCheckpoint) save the epochs completed
    for (auto& c : cbs) c->on_epoch_end(epoch, logs);
    for (const auto& [k, v] : logs) history.history[k].push_back(v);
    history.epoch.push_back(epoch);
    history.nonfinite_layers.push_back(std::move(nonfinite_layers));
  }
  for (auto& c : cbs) c->on_train_end(logs);
  return history;
}

std::map<std::string, double> Model::evaluate(const Tensor& x, const Tensor& y, EvaluateOptions o) {
  MPT_CHECK(compiled(), "evaluate: model '", name_, "' is not compiled; call compile() first");
  check_fit_inputs("evaluate", x, y, o.batch_size);
  MPT_CHECK(y.defined(), "evaluate: y is required");
  const std::int64_t n = x.shape()[0];
  MPT_CHECK(n > 0, "evaluate: no samples");
  check_targets("evaluate", x, y);  // metrics resolve here; val metrics are the evaluation copies
  for (auto& m : val_metrics_) m->reset_state();
  metrics::Mean loss_mean("loss");
  BatchStager batches(x, y, o.batch_size, {}, variables_device());
  for (std::int64_t step = 0; step * o.batch_size < n; ++step) {
    auto [xb, yb] = batches.get(step);
    loss_mean.update(test_step(xb, yb, val_metrics_), static_cast<double>(batches.rows(step)));
  }
  std::map<std::string, double> out{{"loss", loss_mean.result()}};
  for (std::size_t i = 0; i < val_metrics_.size(); ++i) out[metrics_[i]->name()] = val_metrics_[i]->result();
  return out;
}

Tensor Model::predict(const Tensor& x, PredictOptions o) {
  check_fit_inputs("predict", x, Tensor(), o.batch_size);
  const std::int64_t n = x.shape()[0];
  MPT_CHECK(n > 0, "predict: no samples in x of shape ", to_string(x.shape()));
  NoGradGuard no_grad;
  std::vector<Tensor> parts;
  BatchStager batches(x, Tensor(), o.batch_size, {}, variables_device());
  for (std::int64_t step = 0; step * o.batch_size < n; ++step) {
    Tensor p = call(batches.get(step).first, false);
    parts.push_back(is_half(p.dtype()) ? p.to(float32) : p);
  }
  // Results go where the inputs came from (host data in, host results out), in one copy.
  return (parts.size() == 1 ? parts[0] : ops::concat(parts, 0)).to(x.device());
}

std::map<std::string, double> Model::train_on_batch(const Tensor& x, const Tensor& y) {
  MPT_CHECK(compiled(), "train_on_batch: model '", name_, "' is not compiled; call compile() first");
  check_fit_inputs("train_on_batch", x, y, 1);
  for (auto& m : metrics_) m->reset_state();
  const Device device = variables_device();
  StepResult r = train_step(x.to(device), y.to(device));
  auto logs = metric_logs(metrics_);
  logs["loss"] = r.loss.item();
  return logs;
}

std::map<std::string, double> Model::test_on_batch(const Tensor& x, const Tensor& y) {
  MPT_CHECK(compiled(), "test_on_batch: model '", name_, "' is not compiled; call compile() first");
  check_fit_inputs("test_on_batch", x, y, 1);
  if (metrics_resolved_)
    for (auto& m : val_metrics_) m->reset_state();
  const Device device = variables_device();
  double loss = test_step(x.to(device), y.to(device), val_metrics_).item();
  std::map<std::string, double> out{{"loss", loss}};
  for (std::size_t i = 0; i < val_metrics_.size(); ++i) out[metrics_[i]->name()] = val_metrics_[i]->result();
  return out;
}

}  // namespace mpt
