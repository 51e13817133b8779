#include "mpt/model.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "mpt/autograd.hpp"
#include "mpt/data/data.hpp"
#include "mpt/log.hpp"
#include "mpt/ops.hpp"
#include "data/feeder.hpp"
#include "model/batch_stager.hpp"

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

namespace {
/// Keras's model.layers: a functional model's layers and Inputs (null layer), or the layers.
std::vector<std::pair<LayerRef, const FunctionalNode*>> keras_layer_list(
    const std::vector<std::pair<LayerRef, const FunctionalNode*>>& functional, const std::vector<LayerRef>& layers) {
  if (!functional.empty()) return functional;
  std::vector<std::pair<LayerRef, const FunctionalNode*>> out;
  for (const auto& l : layers) out.emplace_back(l, nullptr);
  return out;
}
std::string entry_name(const std::pair<LayerRef, const FunctionalNode*>& e) {
  return e.first ? e.first->name() : e.second->input_name;
}
[[noreturn]] void input_is_no_layer(const std::string& model, const std::string& input) {
  fail("get_layer: '", input, "' is an Input of model '", model, "': Keras's InputLayer, which mpt keeps as no ",
       "layer; its shape is the model's input shape");
}
}  // namespace

LayerRef Model::get_layer(const std::string& name) const {
  const auto all = keras_layer_list(keras_layers_, layers());
  std::string names;
  for (const auto& e : all) {
    if (entry_name(e) != name) continue;
    if (!e.first) input_is_no_layer(name_, name);
    return e.first;
  }
  for (const auto& e : all) names.append(names.empty() ? "'" : ", '").append(entry_name(e)).append("'");
  fail("get_layer: model '", name_, "' has no layer named '", name, "'; its layers are [", names, "]");
}

LayerRef Model::get_layer(int index) const {
  const auto all = keras_layer_list(keras_layers_, layers());
  const auto n = static_cast<std::int64_t>(all.size());
  const std::int64_t i = index < 0 ? n + index : index;
  MPT_CHECK(i >= 0 && i < n, "get_layer: asked for the layer at index ", index, " but model '", name_, "' has only ", n,
            " layers");
  const auto& e = all[static_cast<std::size_t>(i)];
  if (!e.first) input_is_no_layer(name_, e.second->input_name);
  return e.first;
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
            "or one of the names sgd, adam, adamw, rmsprop, nadam, adamax, adagrad, lion, adafactor (Keras's default "
            "is rmsprop)");
  optimizer_ = o.optimizer.get();
  // An optimizer with a fixed loss_scale_factor is the user's loss scaling: not wrapped again.
  if (o.auto_scale_loss && policy_.name() == "mixed_float16" && !loss_scale_optimizer() &&
      !optimizer_->common_options().loss_scale_factor)
    optimizer_ = std::make_shared<mixed_precision::LossScaleOptimizer>(optimizer_);
  // A built model's variables are checked now (float64 ones), not inside the first step.
  const std::vector<LayerRef> model_layers = layers();  // a copy: one vector to iterate
  if (std::all_of(model_layers.begin(), model_layers.end(), [](const LayerRef& l) { return l->built(); }))
    optimizer_->check_variables(trainable_variables());
  metric_args_ = o.metrics;
  weighted_metric_args_ = o.weighted_metrics;
  distribution_ = o.distribution;
  metrics_.clear(), val_metrics_.clear(), metric_weighted_.clear();
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

const distributed::DataParallel* Model::distribution() const {
  const distributed::DataParallel* s = distribution_ ? &*distribution_ : distributed::current_strategy();
  return s && s->size() > 1 ? s : nullptr;
}

void Model::resolve_metrics(const Tensor& y, const Tensor& y_pred) {
  if (metrics_resolved_) return;
  std::set<std::string> unweighted_names;
  for (std::size_t i = 0; i < metric_args_.size() + weighted_metric_args_.size(); ++i) {
    const bool weighted = i >= metric_args_.size();
    const metrics::MetricArg& m = weighted ? weighted_metric_args_[i - metric_args_.size()] : metric_args_[i];
    auto metric = m.object() ? m.object() : metrics::get(m.name(), loss_->name(), y.shape(), y_pred.shape());
    // An accuracy by name skips the positions the loss ignores (padding tokens).
    auto* sparse_acc = m.object() ? nullptr : dynamic_cast<metrics::SparseCategoricalAccuracy*>(metric.get());
    if (auto* l = dynamic_cast<const losses::SparseCategoricalCrossentropy*>(loss_.get()); l && sparse_acc)
      sparse_acc->set_ignore_class(l->options().ignore_class);
    if (!weighted) unweighted_names.insert(metric->name());
    // Keras's CompileMetrics.result: a weighted metric named as an unweighted one is "weighted_<name>".
    if (weighted && unweighted_names.count(metric->name())) {
      if (m.object()) metric = metric->clone();  // the user's object keeps its name
      metric->set_name("weighted_" + metric->name());
    }
    metrics_.push_back(metric);
    metric_weighted_.push_back(weighted);
    auto val = metric->clone();
    val->set_name("val_" + metric->name());
    val_metrics_.push_back(val);
  }
  metrics_resolved_ = true;
}

void Model::update_metrics(std::vector<std::shared_ptr<metrics::Metric>>& ms, const Tensor& y, const Tensor& y_pred,
                           const Tensor& sample_weight) {
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (metric_weighted_[i] && sample_weight.defined()) ms[i]->update_state(y, y_pred, sample_weight);
    else ms[i]->update_state(y, y_pred);
  }
}

void detail::log_metric(Logs& logs, const std::string& name, const std::vector<double>& values) {
  if (values.size() == 1) {
    logs[name] = values[0];
    return;
  }
  // Several values (Precision/Recall at several thresholds, F1Score per class): Keras logs the
  // array; mpt's logs hold numbers, one entry per value, "name[i]".
  for (std::size_t i = 0; i < values.size(); ++i) logs[name + "[" + std::to_string(i) + "]"] = values[i];
}

std::map<std::string, double> Model::metric_logs(const std::vector<std::shared_ptr<metrics::Metric>>& ms) const {
  std::map<std::string, double> logs;
  for (const auto& m : ms) detail::log_metric(logs, m->name(), m->results());
  return logs;
}

std::vector<std::vector<double>> Model::reduced_results(const distributed::DataParallel* strategy,
                                                        const metrics::Mean& loss_mean,
                                                        const std::vector<std::shared_ptr<metrics::Metric>>& ms) const {
  std::vector<const metrics::Metric*> all{&loss_mean};
  for (const auto& m : ms) all.push_back(m.get());
  std::vector<std::vector<double>> out;
  if (!strategy) {
    for (const auto* m : all) out.push_back(m->results());
    return out;
  }
  // One message for all: each metric's state, summed over the ranks.
  std::vector<double> states;
  std::vector<std::size_t> sizes;
  for (const auto* m : all) {
    auto st = m->reduction_state();
    sizes.push_back(st.size());
    states.insert(states.end(), st.begin(), st.end());
  }
  states = strategy->all_reduce(std::move(states));
  std::size_t at = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto first = states.begin() + static_cast<std::ptrdiff_t>(at);
    out.push_back(all[i]->results_of_state(std::vector<double>(first, first + static_cast<std::ptrdiff_t>(sizes[i]))));
    at += sizes[i];
  }
  return out;
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

void Model::check_sample_weight(const char* where, const char* what, const Tensor& x, const Tensor& w) const {
  if (!w.defined()) return;
  MPT_CHECK(w.dim() >= 1 && w.shape()[0] == x.shape()[0], where, ": ", what, " needs one weight per sample of x ",
            to_string(x.shape()), ", got shape ", to_string(w.shape()));
  MPT_CHECK(is_floating(w.dtype()) || w.dtype() == int32 || w.dtype() == int64 || w.dtype() == uint8, where, ": ", what,
            " must be numeric, got ", to_string(w.dtype()));
  data::check_finite(where, what, w);
}

void Model::finish_step(bool applied) {
  for (const auto& l : layers()) {
    if (applied) l->apply_constraints();  // Keras: after each applied update, on the float32 master
    l->finish_step(applied);
  }
}

std::vector<Tensor> Model::losses() const {
  std::vector<Tensor> out;
  for (const auto& l : layers())
    for (auto& t : l->losses()) out.push_back(std::move(t));
  return out;
}

void Model::clear_activity_losses() const {
  for (const auto& l : layers()) l->clear_activity_losses();
}

Tensor Model::with_regularization(const Tensor& loss) const {
  const auto penalties = losses();
  if (penalties.empty()) return loss;
  Tensor total = loss.dtype() == float32 ? loss : ops::cast(loss, float32);  // the sum in float32
  for (const auto& t : penalties) total = ops::add(total, t);
  return total;
}

Device Model::variables_device() const {
  for (const auto& l : layers())
    for (const auto& v : l->variables()) return v.value().device();
  return default_device();
}

std::int64_t Model::check_targets(const char* where, const Tensor& x, const Tensor& y) {
  if (!y.defined() || x.shape()[0] == 0) return -1;
  const Device device = variables_device();
  NoGradGuard no_grad;
  // One sample through the model: builds it, resolves the metrics and tells the classes.
  Tensor p = as_loss_input(call(x.slice(0, 1).to(device), false));
  resolve_metrics(y.slice(0, 1), p);
  // The host copy; read once where y is on a device.
  std::int64_t classes = -1;
  if (loss_->name() == "sparse_categorical_crossentropy" && p.dim() >= 1) {
    classes = p.shape().back();
    data::check_labels(where, y, classes);
  }
  if (loss_->name() == "binary_crossentropy") data::check_unit_interval(where, y);
  return classes;
}

Model::StepResult Model::default_step(const Tensor& x, const Tensor& y, const Tensor& sample_weight, bool keep_gradients,
                                    const distributed::DataParallel* strategy, double weight) {
  StepResult r;
  Tensor y_pred;
  std::vector<Tensor> grads;
  std::vector<Variable> vars;
  auto* lso = loss_scale_optimizer();
  // Under a strategy, buckets of gradients go to the other ranks while the backward pass still
  // computes the rest (GradientReducer, fed by the tape as each gradient is final).
  std::optional<distributed::GradientReducer> reducer;
  auto start_reducer = [&] {
    std::vector<Shape> shapes;
    for (const auto& v : vars) shapes.push_back(v.shape());
    reducer.emplace(*strategy, std::move(shapes), variables_device());
  };
  if (x.defined()) {
    // Gradients of float32 masters may stay in the compute dtype: the loss-scale check and the
    // fused optimizer updates widen them in their own pass. Not where the gradients are
    // all-reduced (sums in float32) or handed to callbacks.
    GradientTape tape({.keep_source_gradient_dtype = !strategy && !keep_gradients});
    y_pred = as_loss_input(call(x, true));
    vars = trainable_variables();  // after the call: the first one builds the layers
    r.loss = compute_loss(y, y_pred, sample_weight);
    // Under a strategy this rank's share of the global mean is weight·loss: the weight rides on
    // the scalar loss, so the all-reduce is a plain sum with no pass over the gradients.
    const Tensor objective =
        strategy && weight != 1.0 ? ops::mul(r.loss, Tensor::scalar(weight, r.loss.dtype(), r.loss.device())) : r.loss;
    const Tensor target = lso ? lso->get_scaled_loss(objective) : optimizer_->scale_loss(objective);
    if (strategy) {
      start_reducer();
      grads = tape.gradient(target, vars, [&](std::size_t i, const Tensor& g) { reducer->ready(i, g); });
    } else {
      grads = tape.gradient(target, vars);
    }
  } else {
    // A rank with no rows in this global batch (fewer rows than ranks) adds zeros.
    MPT_CHECK(strategy != nullptr, "train_step: no batch");
    vars = trainable_variables();
    for (const auto& v : vars) grads.push_back(Tensor::zeros(v.shape(), float32, v.value().device()));
    if (lso) lso->get_scaled_loss(Tensor::scalar(0.0, float32, variables_device()));
    start_reducer();
  }
  // Σ_r weight_r·g_r: every rank gets the same gradients, so the loss-scale check that follows
  // (an inf or NaN survives the sum) makes one skip decision for all ranks.
  if (strategy) grads = reducer->finish(grads);
  if (lso) {
    // Raw gradients: the LossScaleOptimizer unscales them inside the update where the optimizer
    // can. Only callbacks that want the gradients get unscaled copies made first.
    std::vector<Tensor> unscaled;
    if (keep_gradients) unscaled = lso->get_unscaled_gradients(grads);
    auto applied = lso->apply_gradients(keep_gradients ? unscaled : grads, vars);
    r.applied = applied.applied;
    r.nonfinite_variables = std::move(applied.nonfinite_variables);
    if (keep_gradients) r.gradients = std::move(unscaled);
  } else {
    optimizer_->apply_gradients(grads, vars);
    if (keep_gradients) r.gradients = std::move(grads);
  }
  if (keep_gradients) r.variables = vars;
  clear_activity_losses();  // they hold the step's graph: let it go
  finish_step(r.applied);
  if (!x.defined()) return r;
  r.loss = r.loss.detach();
  NoGradGuard no_grad;
  resolve_metrics(y, y_pred);
  update_metrics(metrics_, y, y_pred.detach(), sample_weight);
  return r;
}

Tensor Model::compute_loss(const Tensor& y, const Tensor& y_pred, const Tensor& sample_weight) const {
  MPT_CHECK(compiled(), "compute_loss: model '", name_, "' is not compiled; call compile() first");
  return with_regularization((*loss_)(y, as_loss_input(y_pred), sample_weight));
}

void Model::update_compiled_metrics(const Tensor& y, const Tensor& y_pred, const Tensor& sample_weight) {
  MPT_CHECK(compiled(), "update_compiled_metrics: model '", name_, "' is not compiled; call compile() first");
  NoGradGuard no_grad;
  const Tensor p = as_loss_input(y_pred).detach();
  resolve_metrics(y, p);
  update_metrics(metrics_, y, p, sample_weight);
}

Tensor Model::train_step(const StepData& d) {
  const StepContext c = step_context_;
  step_context_ = {};
  last_step_ = std::make_shared<StepResult>(default_step(d.x, d.y, d.sample_weight, c.keep_gradients, c.strategy, c.weight));
  return last_step_->loss;
}

Model::StepResult Model::run_train_step(const StepData& data, const StepContext& context) {
  step_context_ = context;
  last_step_.reset();
  Tensor loss = train_step(data);
  step_context_ = {};
  if (last_step_) {  // the default step ran (itself, or called by an override)
    StepResult r = std::move(*last_step_);
    last_step_.reset();
    if (loss.defined()) r.loss = loss.detach();
    return r;
  }
  MPT_CHECK(context.strategy == nullptr, "fit: model '", name_, "' overrides train_step, which data parallelism ",
            "does not support (the default step sums the gradients of the ranks)");
  MPT_CHECK(loss.defined() && loss.numel() == 1, "train_step: model '", name_, "''s override must return the batch's ",
            "loss as one value, got ", loss.defined() ? to_string(loss.shape()) : std::string("an undefined tensor"));
  clear_activity_losses();
  finish_step(true);  // the constraints, as after the default step's update
  StepResult r;
  r.loss = loss.detach().to(float32).to(variables_device()).reshape({});
  return r;
}

Tensor Model::test_step(const Tensor& x, const Tensor& y, const Tensor& sample_weight,
                        std::vector<std::shared_ptr<metrics::Metric>>& ms) {
  NoGradGuard no_grad;
  Tensor y_pred = as_loss_input(call(x, false));
  Tensor loss = with_regularization((*loss_)(y, y_pred, sample_weight));
  resolve_metrics(y, y_pred);
  update_metrics(ms, y, y_pred, sample_weight);
  return loss;
}

// ---- evaluate / predict (fit: fit.cpp) ----------------------------------------------------

namespace {
/// The callbacks of evaluate/predict options, bound to the model (chief-only ones on rank 0).
std::vector<std::shared_ptr<callbacks::Callback>> bound_callbacks(const std::vector<callbacks::CallbackArg>& args,
                                                                  Model* model, const distributed::DataParallel* dp) {
  std::vector<std::shared_ptr<callbacks::Callback>> out;
  for (const auto& a : args) {
    auto c = a.get();
    if (!c || (dp && dp->rank() != 0 && c->chief_only())) continue;
    c->set_model(model);
    out.push_back(std::move(c));
  }
  return out;
}
}  // namespace

std::map<std::string, double> Model::evaluate(const Tensor& x, const Tensor& y, EvaluateOptions o) {
  return evaluate_with(x, y, o, bound_callbacks(o.callbacks, this, distribution()));
}

std::map<std::string, double> Model::evaluate_with(const Tensor& x, const Tensor& y, const EvaluateOptions& o,
                                                   const std::vector<std::shared_ptr<callbacks::Callback>>& cbs) {
  MPT_CHECK(compiled(), "evaluate: model '", name_, "' is not compiled; call compile() first");
  check_fit_inputs("evaluate", x, y, o.batch_size);
  MPT_CHECK(y.defined(), "evaluate: y is required");
  check_sample_weight("evaluate", "sample_weight", x, o.sample_weight);
  const std::int64_t n = x.shape()[0];
  MPT_CHECK(n > 0, "evaluate: no samples");
  check_targets("evaluate", x, y);  // metrics resolve here; val metrics are the evaluation copies
  for (auto& m : val_metrics_) m->reset_state();
  metrics::Mean loss_mean("loss");
  // Under a strategy each rank takes a contiguous share of the rows, and the results add up.
  const distributed::DataParallel* dp = distribution();
  const auto [begin, end] = dp ? dp->shard(n) : std::pair<std::int64_t, std::int64_t>{0, n};
  const std::int64_t batch_size = dp ? std::max<std::int64_t>(1, o.batch_size / dp->size()) : o.batch_size;
  if (end > begin) {
    const Tensor& w = o.sample_weight;
    detail::BatchStager batches(x.slice(begin, end), y.slice(begin, end), w.defined() ? w.slice(begin, end) : w,
                                batch_size, {}, variables_device());
    for (auto& c : cbs) c->on_test_begin({});
    for (std::int64_t step = 0; step * batch_size < end - begin; ++step) {
      for (auto& c : cbs) c->on_test_batch_begin(step, {});
      const detail::StagedBatch b = batches.get(step);
      loss_mean.update(test_step(b.x, b.y, b.w, val_metrics_), static_cast<double>(batches.rows(step)));
      for (auto& c : cbs) c->on_test_batch_end(step, {});
    }
  } else {
    for (auto& c : cbs) c->on_test_begin({});
  }
  const auto values = reduced_results(dp, loss_mean, val_metrics_);
  std::map<std::string, double> out{{"loss", values[0][0]}};
  for (std::size_t i = 0; i < val_metrics_.size(); ++i) detail::log_metric(out, metrics_[i]->name(), values[i + 1]);
  for (auto& c : cbs) c->on_test_end(out);
  return out;
}

Tensor Model::predict(const Tensor& x, PredictOptions o) {
  check_fit_inputs("predict", x, Tensor(), o.batch_size);
  const std::int64_t n = x.shape()[0];
  MPT_CHECK(n > 0, "predict: no samples in x of shape ", to_string(x.shape()));
  NoGradGuard no_grad;
  // Under a strategy each rank predicts a contiguous share, and every rank gets all the rows.
  const distributed::DataParallel* dp = distribution();
  const auto [begin, end] = dp ? dp->shard(n) : std::pair<std::int64_t, std::int64_t>{0, n};
  const std::int64_t batch_size = dp ? std::max<std::int64_t>(1, o.batch_size / dp->size()) : o.batch_size;
  std::vector<Tensor> parts;
  detail::BatchStager batches(end > begin ? x.slice(begin, end) : x.slice(0, 1), Tensor(), Tensor(), batch_size, {},
                              variables_device());
  const auto cbs = bound_callbacks(o.callbacks, this, dp);
  for (auto& c : cbs) c->on_predict_begin({});
  for (std::int64_t step = 0; step * batch_size < std::max<std::int64_t>(end - begin, 1); ++step) {
    for (auto& c : cbs) c->on_predict_batch_begin(step, {});
    Tensor p = call(batches.get(step).x, false);
    parts.push_back(is_half(p.dtype()) ? p.to(float32) : p);
    for (auto& c : cbs) c->on_predict_batch_end(step, {});
  }
  for (auto& c : cbs) c->on_predict_end({});
  Tensor local = parts.size() == 1 ? parts[0] : ops::concat(parts, 0);
  if (end == begin) local = local.slice(0, 0);  // a rank with no rows: the shape, no values
  // Results go where the inputs came from (host data in, host results out), in one copy.
  return dp ? dp->all_gather_rows(local).to(x.device()) : local.to(x.device());
}

// ---- on a Dataset ----------------------------------------------------------------------------

data::Batch Model::prepare_batch(const char* where, data::Batch b, bool need_y, std::int64_t classes,
                                 Device device) const {
  MPT_CHECK(b.x.defined() && b.x.dim() >= 1, where, ": a batch's x must be defined and have a batch dimension, got ",
            b.x.defined() ? to_string(b.x.shape()) : std::string("an undefined tensor"));
  MPT_CHECK(!need_y || b.y.defined(), where, ": a batch has no y");
  check_input(b.x);
  for (const auto* t : {&b.y, &b.sample_weight})
    MPT_CHECK(!t->defined() || (t->dim() >= 1 && t->shape()[0] == b.x.shape()[0]), where, ": a batch's x ",
              to_string(b.x.shape()), " and ", t == &b.y ? "y " : "sample_weight ", to_string(t->shape()),
              " have different numbers of rows");
  // The checks fit(x, y) makes once, here per batch, on the host copy where the batch was made.
  data::check_finite(where, "x", b.x);
  if (need_y) {
    data::check_finite(where, "y", b.y);
    data::check_finite(where, "sample_weight", b.sample_weight);
    if (classes >= 0) data::check_labels(where, b.y, classes);
    if (loss_->name() == "binary_crossentropy") data::check_unit_interval(where, b.y);
  }
  auto to = [&](const Tensor& t) { return t.defined() ? t.to(device) : t; };
  return {to(b.x), need_y ? to(b.y) : Tensor(), need_y ? to(b.sample_weight) : Tensor()};
}

namespace {
/// The batch indices evaluate and predict take: all of a known size, or `steps` (required when
/// the size is unknown; at most the size otherwise).
std::vector<std::int64_t> dataset_indices(const char* where, const data::Dataset& ds, std::optional<std::int64_t> steps) {
  const std::int64_t size = ds.size();
  MPT_CHECK(size >= 0 || size == -1, where, ": the dataset's size() must be >= 0 or -1 (unknown), got ", size);
  MPT_CHECK(size >= 0 || steps, where, ": the dataset's size is unknown (size() = -1); give steps");
  MPT_CHECK(!steps || *steps > 0, where, ": steps must be positive, got ", steps.value_or(0));
  const std::int64_t n = steps ? (size >= 0 ? std::min(*steps, size) : *steps) : size;
  MPT_CHECK(n > 0, where, ": the dataset has no batches");
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i;
  return out;
}
}  // namespace

std::map<std::string, double> Model::evaluate(data::Dataset& ds, EvaluateOptions o) {
  return evaluate_with(ds, o, bound_callbacks(o.callbacks, this, distribution()));
}

std::map<std::string, double> Model::evaluate_with(data::Dataset& ds, const EvaluateOptions& o,
                                                   const std::vector<std::shared_ptr<callbacks::Callback>>& cbs) {
  MPT_CHECK(compiled(), "evaluate: model '", name_, "' is not compiled; call compile() first");
  MPT_CHECK(!distribution(), "evaluate: a Dataset under data parallelism is not supported yet; pass tensors");
  auto indices = dataset_indices("evaluate", ds, o.steps);
  data::Batch first = ds.get(indices[0]);
  MPT_CHECK(first.y.defined(), "evaluate: the dataset's batch ", indices[0], " has no y");
  check_fit_inputs("evaluate", first.x, first.y, 1);
  const std::int64_t classes = check_targets("evaluate", first.x, first.y);
  for (auto& m : val_metrics_) m->reset_state();
  metrics::Mean loss_mean("loss");
  for (auto& c : cbs) c->on_test_begin({});
  {
    const auto n = static_cast<std::int64_t>(indices.size());
    const Device device = variables_device();
    detail::DatasetFeeder feeder(
        ds, std::move(indices), o.workers, o.max_queue_size,
        [&](data::Batch b) { return prepare_batch("evaluate", std::move(b), true, classes, device); }, "evaluate");
    for (std::int64_t step = 0; step < n; ++step) {
      for (auto& c : cbs) c->on_test_batch_begin(step, {});
      const data::Batch b = feeder.next();
      loss_mean.update(test_step(b.x, b.y, b.sample_weight, val_metrics_), static_cast<double>(b.x.shape()[0]));
      for (auto& c : cbs) c->on_test_batch_end(step, {});
    }
  }
  ds.on_epoch_end();
  const auto values = reduced_results(nullptr, loss_mean, val_metrics_);
  std::map<std::string, double> out{{"loss", values[0][0]}};
  for (std::size_t i = 0; i < val_metrics_.size(); ++i) detail::log_metric(out, metrics_[i]->name(), values[i + 1]);
  for (auto& c : cbs) c->on_test_end(out);
  return out;
}

Tensor Model::predict(data::Dataset& ds, PredictOptions o) {
  MPT_CHECK(!distribution(), "predict: a Dataset under data parallelism is not supported yet; pass tensors");
  auto indices = dataset_indices("predict", ds, o.steps);
  const auto n = static_cast<std::int64_t>(indices.size());
  NoGradGuard no_grad;
  std::vector<Tensor> parts;
  const auto cbs = bound_callbacks(o.callbacks, this, nullptr);
  for (auto& c : cbs) c->on_predict_begin({});
  {
    const Device device = variables_device();
    detail::DatasetFeeder feeder(
        ds, std::move(indices), o.workers, o.max_queue_size,
        [&](data::Batch b) { return prepare_batch("predict", std::move(b), false, -1, device); }, "predict");
    for (std::int64_t step = 0; step < n; ++step) {
      for (auto& c : cbs) c->on_predict_batch_begin(step, {});
      Tensor p = call(feeder.next().x, false);
      parts.push_back(is_half(p.dtype()) ? p.to(float32) : p);
      for (auto& c : cbs) c->on_predict_batch_end(step, {});
    }
  }
  ds.on_epoch_end();
  for (auto& c : cbs) c->on_predict_end({});
  return (parts.size() == 1 ? parts[0] : ops::concat(parts, 0)).to(Device::cpu());
}

Tensor Model::predict_on_batch(const Tensor& x) {
  check_fit_inputs("predict_on_batch", x, Tensor(), 1);
  NoGradGuard no_grad;
  Tensor p = call(x.to(variables_device()), false);
  return (is_half(p.dtype()) ? p.to(float32) : p).to(x.device());
}

std::map<std::string, double> Model::train_on_batch(const Tensor& x, const Tensor& y, const Tensor& sample_weight) {
  MPT_CHECK(compiled(), "train_on_batch: model '", name_, "' is not compiled; call compile() first");
  check_fit_inputs("train_on_batch", x, y, 1);
  check_sample_weight("train_on_batch", "sample_weight", x, sample_weight);
  for (auto& m : metrics_) m->reset_state();
  const Device device = variables_device();
  StepResult r = run_train_step({x.to(device), y.to(device), sample_weight.defined() ? sample_weight.to(device) : Tensor()},
                                {});
  auto logs = metric_logs(metrics_);
  logs["loss"] = r.loss.item();
  return logs;
}

std::map<std::string, double> Model::test_on_batch(const Tensor& x, const Tensor& y, const Tensor& sample_weight) {
  MPT_CHECK(compiled(), "test_on_batch: model '", name_, "' is not compiled; call compile() first");
  check_fit_inputs("test_on_batch", x, y, 1);
  check_sample_weight("test_on_batch", "sample_weight", x, sample_weight);
  if (metrics_resolved_)
    for (auto& m : val_metrics_) m->reset_state();
  const Device device = variables_device();
  double loss =
      test_step(x.to(device), y.to(device), sample_weight.defined() ? sample_weight.to(device) : Tensor(), val_metrics_)
          .item();
  std::map<std::string, double> out{{"loss", loss}};
  for (std::size_t i = 0; i < val_metrics_.size(); ++i) detail::log_metric(out, metrics_[i]->name(), val_metrics_[i]->results());
  return out;
}

}  // namespace mpt
