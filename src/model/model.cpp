#include "mpt/model.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
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
const losses::Loss& Model::loss(std::size_t output) const {
  MPT_CHECK(loss_ != nullptr, "model '", name_, "': not compiled; call compile() first");
  MPT_CHECK(output < losses_.size(), "loss: model '", name_, "' has ", losses_.size(), " outputs, asked for output ",
            output);
  return *losses_[output];
}

std::vector<std::string> Model::output_names() const {
  std::vector<std::string> out;
  for (const auto& t : outputs_)
    out.push_back(t.node() && t.node()->layer ? t.node()->layer->name() : t.node() ? t.node()->input_name : "output");
  if (outputs_.empty()) out.push_back(layers().empty() ? std::string("output") : layers().back()->name());
  return out;
}

namespace {
/// Keras's rule for compile's metrics of a model with several outputs: a flat list holds one
/// entry per output (output i's metric), or the lists per output are given.
std::vector<std::vector<metrics::MetricArg>> metrics_per_output(const char* what, const std::string& model,
                                                                std::size_t outputs,
                                                                const std::vector<metrics::MetricArg>& flat,
                                                                const std::vector<std::vector<metrics::MetricArg>>& lists) {
  const std::string lists_name = std::string("output_") + what;
  MPT_CHECK(flat.empty() || lists.empty(), "compile: give ", what, " or ", lists_name, ", not both");
  if (!lists.empty()) {
    MPT_CHECK(lists.size() == outputs, "compile: model '", model, "' has ", outputs, " outputs but ", lists_name,
              " holds ", lists.size(), " lists; give one list per output, in output order");
    return lists;
  }
  if (outputs == 1) return {flat};
  if (flat.empty()) return std::vector<std::vector<metrics::MetricArg>>(outputs);
  MPT_CHECK(flat.size() == outputs, "compile: model '", model, "' has ", outputs, " outputs but ", what, " holds ",
            flat.size(), " entries; with several outputs ", what, " holds one metric per output, in output order ",
            "(as Keras), or give ", lists_name, " (a list per output)");
  std::vector<std::vector<metrics::MetricArg>> out;
  for (const auto& m : flat) out.push_back({m});
  return out;
}
}  // namespace

void Model::compile(CompileOptions o) {
  MPT_CHECK(!o.loss.empty(), "compile: a loss is required (e.g. .loss = \"sparse_categorical_crossentropy\")");
  const std::size_t outs = num_outputs();
  losses_.clear();
  if (o.loss.is_list()) {
    MPT_CHECK(o.loss.list().size() == outs, "compile: model '", name_, "' has ", outs, outs == 1 ? " output" : " outputs",
              " but ", o.loss.list().size(), o.loss.list().size() == 1 ? " loss was" : " losses were",
              " given; give one loss per output, in output order, or one loss for every output");
    for (std::size_t i = 0; i < outs; ++i) {
      MPT_CHECK(!o.loss.list()[i].empty(), "compile: the loss of output ", i, " is empty");
      losses_.push_back(o.loss.list()[i].get());
    }
  } else {
    losses_.assign(outs, o.loss.list()[0].get());  // one loss for every output (Keras)
  }
  MPT_CHECK(o.loss_weights.empty() || o.loss_weights.size() == outs, "compile: model '", name_, "' has ", outs,
            outs == 1 ? " output" : " outputs", " but loss_weights holds ", o.loss_weights.size(),
            " weights; give one per output, in output order");
  for (double w : o.loss_weights) MPT_CHECK(std::isfinite(w), "compile: loss_weights holds ", w, "; weights must be finite");
  loss_weights_ = o.loss_weights.empty() ? std::vector<double>(outs, 1.0) : o.loss_weights;
  output_metric_args_ = metrics_per_output("metrics", name_, outs, o.metrics, o.output_metrics);
  output_weighted_metric_args_ =
      metrics_per_output("weighted_metrics", name_, outs, o.weighted_metrics, o.output_weighted_metrics);
  loss_ = losses_[0];
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
  // A single output's, as given (its checkpoint stores them).
  metric_args_ = outs == 1 ? output_metric_args_[0] : o.metrics;
  weighted_metric_args_ = outs == 1 ? output_weighted_metric_args_[0] : o.weighted_metrics;
  distribution_ = o.distribution;
  metrics_.clear(), val_metrics_.clear(), metric_weighted_.clear(), metric_kind_.clear(), metric_output_.clear();
  metrics_resolved_ = false;
  // The layers that produce the model's outputs: a functional model's output nodes, else the last;
  // where one is a model used as a layer, the layers that produce that model's output, and so on
  // down (a fine-tuned base or a head model whose last layer is the softmax).
  std::vector<LayerRef> out_layers;
  std::function<void(const Model&)> collect = [&](const Model& m) {
    std::vector<LayerRef> ends;
    for (const auto& o : m.outputs_)
      if (o.node() && o.node()->layer) ends.push_back(LayerRef(o.node()->layer));
    if (m.outputs_.empty() && !m.layers().empty()) ends.push_back(m.layers().back());
    for (const auto& l : ends) {
      if (const std::shared_ptr<Model> inner = detail::nested_model(*l))
        collect(*inner);
      else
        out_layers.push_back(l);
    }
  };
  collect(*this);
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

void Model::resolve_metrics(const std::vector<Tensor>& y, const std::vector<Tensor>& y_pred) {
  if (metrics_resolved_) return;
  const std::size_t outs = losses_.size();
  const bool multi = outs > 1;
  const std::vector<std::string> names = multi ? output_names() : std::vector<std::string>{};
  auto add = [&](std::shared_ptr<metrics::Metric> metric, int kind, std::size_t output) {
    auto val = metric->clone();
    val->set_name("val_" + metric->name());
    metrics_.push_back(std::move(metric));
    val_metrics_.push_back(std::move(val));
    metric_weighted_.push_back(kind == 1);
    metric_kind_.push_back(kind);
    metric_output_.push_back(output);
  };
  // Several outputs: Keras's per-output loss trackers ("<output>_loss").
  if (multi)
    for (std::size_t o = 0; o < outs; ++o) add(std::make_shared<metrics::Mean>(names[o] + "_loss"), 2, o);
  // Keras's CompileMetrics: every output's metrics, then every output's weighted metrics; with
  // several outputs each named "<output>_<name>".
  std::set<std::string> unweighted_names;
  for (int kind = 0; kind < 2; ++kind) {
    const bool weighted = kind == 1;
    for (std::size_t o = 0; o < outs; ++o) {
      for (const metrics::MetricArg& m : (weighted ? output_weighted_metric_args_ : output_metric_args_)[o]) {
        auto metric = m.object() ? m.object() : metrics::get(m.name(), losses_[o]->name(), y[o].shape(), y_pred[o].shape());
        // An accuracy by name skips the positions the loss ignores (padding tokens).
        auto* sparse_acc = m.object() ? nullptr : dynamic_cast<metrics::SparseCategoricalAccuracy*>(metric.get());
        if (auto* l = dynamic_cast<const losses::SparseCategoricalCrossentropy*>(losses_[o].get()); l && sparse_acc)
          sparse_acc->set_ignore_class(l->options().ignore_class);
        const std::string prefix = multi ? names[o] + "_" : "";
        std::string name = prefix + metric->name();
        if (!weighted) unweighted_names.insert(name);
        // Keras's CompileMetrics.result: a weighted metric named as an unweighted one is "weighted_<name>".
        else if (unweighted_names.count(name)) name = prefix + "weighted_" + metric->name();
        if (name != metric->name()) {
          if (m.object()) metric = metric->clone();  // the user's object keeps its name
          metric->set_name(name);
        }
        add(std::move(metric), kind, o);
      }
    }
  }
  metrics_resolved_ = true;
}

void Model::update_metrics(std::vector<std::shared_ptr<metrics::Metric>>& ms, const std::vector<Tensor>& y,
                           const std::vector<Tensor>& y_pred, const Tensor& sample_weight,
                           const std::vector<Tensor>* per_output_loss) {
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const std::size_t o = metric_output_[i];
    if (metric_kind_[i] == 2) {  // a per-output loss: its mean over the batches' rows (Keras)
      if (per_output_loss)
        static_cast<metrics::Mean&>(*ms[i]).update((*per_output_loss)[o].detach(),
                                                   static_cast<double>(y_pred[0].shape()[0]));
      continue;
    }
    if (metric_weighted_[i] && sample_weight.defined()) ms[i]->update_state(y[o], y_pred[o], sample_weight);
    else ms[i]->update_state(y[o], y_pred[o]);
  }
}

std::map<std::string, double> Model::test_logs(const std::vector<std::vector<double>>& values) const {
  std::map<std::string, double> out{{"loss", values[0][0]}};
  for (std::size_t i = 0; i < val_metrics_.size(); ++i) detail::log_metric(out, metrics_[i]->name(), values[i + 1]);
  return out;
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

namespace {
/// "x" for one array, else "x[i]".
std::string array_name(const char* what, std::size_t i, std::size_t n) {
  return n == 1 ? std::string(what) : std::string(what) + "[" + std::to_string(i) + "]";
}
/// Several inputs against the functional model's Inputs (one input: Model::check_input).
void check_input_shapes(const std::string& model, const std::vector<KerasTensor>& inputs, const std::vector<Tensor>& xs) {
  for (std::size_t i = 0; i < xs.size() && i < inputs.size(); ++i) {
    const Shape& want = inputs[i].node()->input_shape;
    Shape per(xs[i].shape().begin() + (xs[i].dim() > 0 ? 1 : 0), xs[i].shape().end());
    MPT_CHECK(xs[i].dim() > 0 && per == want, "Model '", model, "': input ", i, " should have shape ",
              batch_shape_string(want), ", got ", to_string(xs[i].shape()));
  }
}
}  // namespace

void Model::check_fit_inputs(const char* where, const std::vector<Tensor>& xs, const std::vector<Tensor>& ys,
                             std::int64_t batch_size) const {
  MPT_CHECK(!xs.empty(), where, ": x is undefined");
  const std::size_t ni = num_inputs(), no = num_outputs();
  MPT_CHECK(xs.size() == ni, where, ": model '", name_, "' has ", ni, ni == 1 ? " input" : " inputs", " but ",
            xs.size(), xs.size() == 1 ? " x array was" : " x arrays were", " given (one per input, in input order)");
  for (std::size_t i = 0; i < xs.size(); ++i) {
    MPT_CHECK(xs[i].defined(), where, ": ", array_name("x", i, xs.size()), " is undefined");
    MPT_CHECK(xs[i].dim() >= 1, where, ": ", array_name("x", i, xs.size()), " must have a batch dimension, got shape ",
              to_string(xs[i].shape()));
  }
  MPT_CHECK(batch_size > 0, where, ": batch_size must be positive, got ", batch_size);
  if (xs.size() == 1) check_input(xs[0]);
  else check_input_shapes(name_, inputs_, xs);
  for (std::size_t i = 1; i < xs.size(); ++i)
    MPT_CHECK(xs[i].shape()[0] == xs[0].shape()[0], where, ": x[0] and x[", i,
              "] have different numbers of samples: x[0] ", to_string(xs[0].shape()), ", x[", i, "] ",
              to_string(xs[i].shape()));
  if (!ys.empty()) {
    MPT_CHECK(ys.size() == no, where, ": model '", name_, "' has ", no, no == 1 ? " output" : " outputs", " but ",
              ys.size(), ys.size() == 1 ? " y array was" : " y arrays were",
              " given (one target per output, in output order)");
    for (std::size_t i = 0; i < ys.size(); ++i) {
      const std::string yn = array_name("y", i, ys.size());
      MPT_CHECK(ys[i].defined(), where, ": ", yn, " is undefined");
      MPT_CHECK(ys[i].dim() >= 1 && ys[i].shape()[0] == xs[0].shape()[0], where, ": x and ", yn,
                " have different numbers of samples: x ", to_string(xs[0].shape()), ", ", yn, " ",
                to_string(ys[i].shape()));
    }
  }
  for (std::size_t i = 0; i < xs.size(); ++i) data::check_finite(where, array_name("x", i, xs.size()).c_str(), xs[i]);
  for (std::size_t i = 0; i < ys.size(); ++i) data::check_finite(where, array_name("y", i, ys.size()).c_str(), ys[i]);
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

std::vector<std::int64_t> Model::check_targets(const char* where, const std::vector<Tensor>& xs,
                                               const std::vector<Tensor>& ys) {
  std::vector<std::int64_t> classes(losses_.size(), -1);
  if (ys.empty() || xs[0].shape()[0] == 0) return classes;
  const Device device = variables_device();
  NoGradGuard no_grad;
  // One sample through the model: builds it, resolves the metrics and tells the classes.
  std::vector<Tensor> one, y1;
  for (const auto& x : xs) one.push_back(x.slice(0, 1).to(device));
  for (const auto& y : ys) y1.push_back(y.slice(0, 1));
  std::vector<Tensor> ps = forward(one, false);
  for (auto& p : ps) p = as_loss_input(p);
  resolve_metrics(y1, ps);
  // The host copy; read once where y is on a device.
  for (std::size_t o = 0; o < ys.size() && o < losses_.size(); ++o) {
    if (losses_[o]->name() == "sparse_categorical_crossentropy" && ps[o].dim() >= 1) {
      classes[o] = ps[o].shape().back();
      data::check_labels(where, ys[o], classes[o]);
    }
    if (losses_[o]->name() == "binary_crossentropy") data::check_unit_interval(where, ys[o]);
  }
  return classes;
}

std::vector<Tensor> Model::forward(const std::vector<Tensor>& xs, bool training) {
  if (xs.size() == 1 && num_inputs() == 1 && num_outputs() == 1) return {call(xs[0], training)};
  return call(xs, training);
}

Tensor Model::compiled_loss(const std::vector<Tensor>& y, const std::vector<Tensor>& y_pred, const Tensor& sample_weight,
                            std::vector<Tensor>* per_output) const {
  MPT_CHECK(y.size() == losses_.size() && y_pred.size() == losses_.size(), "compute_loss: model '", name_, "' has ",
            losses_.size(), losses_.size() == 1 ? " output" : " outputs", ", got ", y.size(), " targets and ",
            y_pred.size(), " predictions");
  Tensor total;
  for (std::size_t o = 0; o < losses_.size(); ++o) {
    // (Keras compiles such a loss too, and fails where it differentiates or tracks it.)
    MPT_CHECK(losses_[o]->reduction() != losses::Reduction::none, "compute_loss: model '", name_, "': the loss ",
              losses_[o]->name(), losses_.size() > 1 ? " of output " + std::to_string(o) : std::string(),
              " has reduction \"none\", and the model's loss (fit, evaluate, train_on_batch) is a scalar: use ",
              "sum_over_batch_size (the mean), mean, sum or mean_with_sample_weight, or call the loss yourself");
    Tensor l = (*losses_[o])(y[o], as_loss_input(y_pred[o]), sample_weight);
    if (per_output) per_output->push_back(l);
    if (loss_weights_[o] != 1.0) l = ops::mul(l, Tensor::scalar(loss_weights_[o], l.dtype(), l.device()));
    total = total.defined() ? ops::add(total, l) : l;
  }
  return with_regularization(total);
}

Model::StepResult Model::default_step(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                                      const Tensor& sample_weight, bool keep_gradients,
                                    const distributed::DataParallel* strategy, double weight) {
  StepResult r;
  std::vector<Tensor> y_pred, per_output;
  const bool multi = losses_.size() > 1;
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
  if (!x.empty()) {
    // Gradients of float32 masters may stay in the compute dtype: the loss-scale check and the
    // fused optimizer updates widen them in their own pass. Not where the gradients are
    // all-reduced (sums in float32) or handed to callbacks.
    GradientTape tape({.keep_source_gradient_dtype = !strategy && !keep_gradients});
    y_pred = forward(x, true);
    for (auto& p : y_pred) p = as_loss_input(p);
    vars = trainable_variables();  // after the call: the first one builds the layers
    MPT_CHECK(compiled(), "compute_loss: model '", name_, "' is not compiled; call compile() first");
    const bool share = strategy && weight != 1.0;
    r.loss = compiled_loss(y, y_pred, sample_weight, multi || (share && sums_a_loss()) ? &per_output : nullptr);
    // Under a strategy this rank's share of the global mean is weight·loss: the weight rides on
    // the scalar loss, so the all-reduce is a plain sum with no pass over the gradients. A loss
    // reduced by "sum" is the sum over every rank's examples: its part counts whole (1 / weight
    // first). The loss logged is then the global batch's (fit averages the ranks' by their rows).
    Tensor objective = r.loss;
    if (share) {
      if (sums_a_loss()) r.loss = with_sums_scaled(r.loss, per_output, 1.0 / weight);
      objective = ops::mul(r.loss, Tensor::scalar(weight, r.loss.dtype(), r.loss.device()));
    }
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
  if (x.empty()) return r;
  r.loss = r.loss.detach();
  NoGradGuard no_grad;
  for (auto& p : y_pred) p = p.detach();
  resolve_metrics(y, y_pred);
  update_metrics(metrics_, y, y_pred, sample_weight, multi ? &per_output : nullptr);
  return r;
}

Tensor Model::compute_loss(const Tensor& y, const Tensor& y_pred, const Tensor& sample_weight) const {
  MPT_CHECK(compiled(), "compute_loss: model '", name_, "' is not compiled; call compile() first");
  MPT_CHECK(losses_.size() == 1, "compute_loss: model '", name_, "' has ", losses_.size(),
            " outputs; pass every output's targets and predictions (compute_loss({y1, y2}, {p1, p2}))");
  return compiled_loss({y}, {y_pred}, sample_weight, nullptr);
}

Tensor Model::compute_loss(const Tensors& y, const Tensors& y_pred, const Tensor& sample_weight) const {
  MPT_CHECK(compiled(), "compute_loss: model '", name_, "' is not compiled; call compile() first");
  return compiled_loss(y.list(), y_pred.list(), sample_weight, nullptr);
}

void Model::update_compiled_metrics(const Tensor& y, const Tensor& y_pred, const Tensor& sample_weight) {
  MPT_CHECK(compiled(), "update_compiled_metrics: model '", name_, "' is not compiled; call compile() first");
  MPT_CHECK(losses_.size() == 1, "update_compiled_metrics: model '", name_, "' has ", losses_.size(),
            " outputs; pass every output's targets and predictions");
  update_compiled_metrics(Tensors(y), Tensors(y_pred), sample_weight);
}

void Model::update_compiled_metrics(const Tensors& y, const Tensors& y_pred, const Tensor& sample_weight) {
  MPT_CHECK(compiled(), "update_compiled_metrics: model '", name_, "' is not compiled; call compile() first");
  MPT_CHECK(y.size() == losses_.size() && y_pred.size() == losses_.size(), "update_compiled_metrics: model '", name_,
            "' has ", losses_.size(), losses_.size() == 1 ? " output" : " outputs", ", got ", y.size(),
            " targets and ", y_pred.size(), " predictions");
  NoGradGuard no_grad;
  std::vector<Tensor> ps;
  for (const auto& p : y_pred) ps.push_back(as_loss_input(p).detach());
  resolve_metrics(y.list(), ps);
  std::vector<Tensor> per_output;
  if (losses_.size() > 1)
    for (std::size_t o = 0; o < losses_.size(); ++o) per_output.push_back((*losses_[o])(y[o], ps[o], sample_weight));
  update_metrics(metrics_, y.list(), ps, sample_weight, losses_.size() > 1 ? &per_output : nullptr);
}

Tensor Model::train_step(const StepData& d) {
  const StepContext c = step_context_;
  step_context_ = {};
  last_step_ = std::make_shared<StepResult>(
      default_step(d.inputs(), d.targets(), d.sample_weight, c.keep_gradients, c.strategy, c.weight));
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

Tensor Model::test_step(const std::vector<Tensor>& x, const std::vector<Tensor>& y, const Tensor& sample_weight,
                        std::vector<std::shared_ptr<metrics::Metric>>& ms, double sums_scale) {
  NoGradGuard no_grad;
  std::vector<Tensor> y_pred = forward(x, false), per_output;
  for (auto& p : y_pred) p = as_loss_input(p);
  const bool multi = losses_.size() > 1;
  const bool scaled = sums_scale != 1.0 && sums_a_loss();
  Tensor loss = compiled_loss(y, y_pred, sample_weight, multi || scaled ? &per_output : nullptr);
  if (scaled) loss = with_sums_scaled(loss, per_output, sums_scale);
  resolve_metrics(y, y_pred);
  update_metrics(ms, y, y_pred, sample_weight, multi ? &per_output : nullptr);
  return loss;
}

bool Model::sums_a_loss() const {
  return std::any_of(losses_.begin(), losses_.end(), [](const auto& l) { return l->reduction() == losses::Reduction::sum; });
}

Tensor Model::with_sums_scaled(const Tensor& loss, const std::vector<Tensor>& per_output, double factor) const {
  Tensor out = loss;
  for (std::size_t o = 0; o < losses_.size(); ++o)
    if (losses_[o]->reduction() == losses::Reduction::sum)
      out = ops::add(out, ops::mul(per_output[o], Tensor::scalar((factor - 1.0) * loss_weights_[o], per_output[o].dtype(),
                                                                 per_output[o].device())));
  return out;
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
  return evaluate(Tensors(x), Tensors(y), std::move(o));
}

std::map<std::string, double> Model::evaluate(const Tensors& x, const Tensors& y, EvaluateOptions o) {
  return evaluate_with(x.list(), y.list(), o, bound_callbacks(o.callbacks, this, distribution()));
}

namespace {
/// Rows [begin, end) of every array.
std::vector<Tensor> slice_all(const std::vector<Tensor>& ts, std::int64_t begin, std::int64_t end) {
  std::vector<Tensor> out;
  for (const auto& t : ts) out.push_back(t.slice(begin, end));
  return out;
}
/// Runs f; under a strategy an exception tells the other ranks (waiting in a collective) first.
template <class F>
auto on_all_ranks(const distributed::DataParallel* dp, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    if (dp) dp->communicator().signal_failure(e.what());
    throw;
  }
}
}  // namespace

std::map<std::string, double> Model::evaluate_with(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                                                   const EvaluateOptions& o,
                                                   const std::vector<std::shared_ptr<callbacks::Callback>>& cbs) {
  MPT_CHECK(compiled(), "evaluate: model '", name_, "' is not compiled; call compile() first");
  check_fit_inputs("evaluate", x, y, o.batch_size);
  MPT_CHECK(!y.empty(), "evaluate: y is required");
  check_sample_weight("evaluate", "sample_weight", x[0], o.sample_weight);
  const std::int64_t n = x[0].shape()[0];
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
    detail::BatchStager batches(slice_all(x, begin, end), slice_all(y, begin, end), w.defined() ? w.slice(begin, end) : w,
                                batch_size, {}, variables_device());
    for (auto& c : cbs) c->on_test_begin({});
    for (std::int64_t step = 0; step * batch_size < end - begin; ++step) {
      for (auto& c : cbs) c->on_test_batch_begin(step, {});
      const detail::StagedBatch b = batches.get(step);
      // A rank's batch is 1 / size of the global one: a summed loss counts size times (as
      // Keras's unscale_loss_for_distribution), so the result is one process's.
      loss_mean.update(test_step(b.x, b.y, b.w, val_metrics_, dp ? static_cast<double>(dp->size()) : 1.0),
                       static_cast<double>(batches.rows(step)));
      for (auto& c : cbs) c->on_test_batch_end(step, {});
    }
  } else {
    for (auto& c : cbs) c->on_test_begin({});
  }
  const std::map<std::string, double> out = test_logs(reduced_results(dp, loss_mean, val_metrics_));
  for (auto& c : cbs) c->on_test_end(out);
  return out;
}

Tensor Model::predict(const Tensor& x, PredictOptions o) { return predict(Tensors(x), std::move(o)); }

Tensor Model::predict(const Tensors& x, PredictOptions o) {
  check_fit_inputs("predict", x.list(), {}, o.batch_size);
  MPT_CHECK(num_outputs() == 1, "predict: model '", name_, "' has ", num_outputs(),
            " outputs; predict_outputs returns every one");
  return predict_all("predict", x.list(), o)[0];
}

std::vector<Tensor> Model::predict_outputs(const Tensors& x, PredictOptions o) {
  check_fit_inputs("predict_outputs", x.list(), {}, o.batch_size);
  return predict_all("predict_outputs", x.list(), o);
}

std::vector<Tensor> Model::predict_all(const char* where, const std::vector<Tensor>& x, const PredictOptions& o) {
  const std::int64_t n = x[0].shape()[0];
  MPT_CHECK(n > 0, where, ": no samples in x of shape ", to_string(x[0].shape()));
  NoGradGuard no_grad;
  // Under a strategy each rank predicts a contiguous share, and every rank gets all the rows.
  const distributed::DataParallel* dp = distribution();
  const auto [begin, end] = dp ? dp->shard(n) : std::pair<std::int64_t, std::int64_t>{0, n};
  const std::int64_t batch_size = dp ? std::max<std::int64_t>(1, o.batch_size / dp->size()) : o.batch_size;
  std::vector<std::vector<Tensor>> parts(num_outputs());
  detail::BatchStager batches(end > begin ? slice_all(x, begin, end) : slice_all(x, 0, 1), {}, Tensor(), batch_size, {},
                              variables_device());
  const auto cbs = bound_callbacks(o.callbacks, this, dp);
  for (auto& c : cbs) c->on_predict_begin({});
  for (std::int64_t step = 0; step * batch_size < std::max<std::int64_t>(end - begin, 1); ++step) {
    for (auto& c : cbs) c->on_predict_batch_begin(step, {});
    const std::vector<Tensor> ps = forward(batches.get(step).x, false);
    for (std::size_t i = 0; i < ps.size(); ++i) parts[i].push_back(is_half(ps[i].dtype()) ? ps[i].to(float32) : ps[i]);
    for (auto& c : cbs) c->on_predict_batch_end(step, {});
  }
  for (auto& c : cbs) c->on_predict_end({});
  std::vector<Tensor> out;
  for (const auto& p : parts) {
    Tensor local = p.size() == 1 ? p[0] : ops::concat(p, 0);
    if (end == begin) local = local.slice(0, 0);  // a rank with no rows: the shape, no values
    // Results go where the inputs came from (host data in, host results out), in one copy.
    out.push_back(dp ? dp->all_gather_rows(local).to(x[0].device()) : local.to(x[0].device()));
  }
  return out;
}

// ---- on a Dataset ----------------------------------------------------------------------------

data::Batch Model::prepare_batch(const char* where, data::Batch b, bool need_y, const std::vector<std::int64_t>& classes,
                                 Device device) const {
  MPT_CHECK(!b.x.defined() || b.xs.empty(), where, ": a batch gives both x and xs; give x (one input) or xs (several)");
  MPT_CHECK(!b.y.defined() || b.ys.empty(), where, ": a batch gives both y and ys; give y (one output) or ys (several)");
  std::vector<Tensor> xs = b.inputs(), ys = b.targets();
  const bool x_ok = !xs.empty() && std::all_of(xs.begin(), xs.end(), [](const Tensor& t) { return t.defined() && t.dim() >= 1; });
  MPT_CHECK(x_ok, where, ": a batch's x must be defined and have a batch dimension, got ",
            xs.size() == 1 && xs[0].defined() ? to_string(xs[0].shape()) : xs.size() > 1 ? std::string("an undefined or 0-d xs entry") : std::string("an undefined tensor"));
  MPT_CHECK(xs.size() == num_inputs(), where, ": model '", name_, "' has ", num_inputs(),
            num_inputs() == 1 ? " input" : " inputs", " but a batch has ", xs.size(), " (x or xs)");
  MPT_CHECK(!need_y || !ys.empty(), where, ": a batch has no y");
  MPT_CHECK(!need_y || ys.size() == num_outputs(), where, ": model '", name_, "' has ", num_outputs(),
            num_outputs() == 1 ? " output" : " outputs", " but a batch has ", ys.size(), " targets (y or ys)");
  if (xs.size() == 1) check_input(xs[0]);
  else check_input_shapes(name_, inputs_, xs);
  const Tensor& x0 = xs[0];
  auto check_rows = [&](const Tensor& t, const std::string& what) {
    MPT_CHECK(!t.defined() || (t.dim() >= 1 && t.shape()[0] == x0.shape()[0]), where, ": a batch's x ",
              to_string(x0.shape()), " and ", what, " ", to_string(t.shape()), " have different numbers of rows");
  };
  for (std::size_t i = 1; i < xs.size(); ++i) check_rows(xs[i], "x[" + std::to_string(i) + "]");
  for (std::size_t i = 0; i < ys.size(); ++i) {
    MPT_CHECK(ys[i].defined(), where, ": a batch's ", array_name("y", i, ys.size()), " is undefined");
    check_rows(ys[i], array_name("y", i, ys.size()));
  }
  check_rows(b.sample_weight, "sample_weight");
  // The checks fit(x, y) makes once, here per batch, on the host copy where the batch was made.
  for (std::size_t i = 0; i < xs.size(); ++i) data::check_finite(where, array_name("x", i, xs.size()).c_str(), xs[i]);
  if (need_y) {
    for (std::size_t i = 0; i < ys.size(); ++i) {
      data::check_finite(where, array_name("y", i, ys.size()).c_str(), ys[i]);
      if (i < classes.size() && classes[i] >= 0) data::check_labels(where, ys[i], classes[i]);
      if (losses_[i]->name() == "binary_crossentropy") data::check_unit_interval(where, ys[i]);
    }
    data::check_finite(where, "sample_weight", b.sample_weight);
  }
  auto to = [&](const Tensor& t) { return t.defined() ? t.to(device) : t; };
  data::Batch out;
  for (const auto& t : xs) out.xs.push_back(to(t));
  if (need_y) {
    for (const auto& t : ys) out.ys.push_back(to(t));
    out.sample_weight = to(b.sample_weight);
  }
  return out;
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
/// Under a strategy of W ranks, rank r's share of evaluate's and predict's batches: positions
/// r, r + W, ... (as fit's Dataset sharding).
std::vector<std::int64_t> rank_share(const std::vector<std::int64_t>& all, const distributed::DataParallel* dp) {
  if (!dp) return all;
  std::vector<std::int64_t> out;
  for (std::size_t p = static_cast<std::size_t>(dp->rank()); p < all.size(); p += static_cast<std::size_t>(dp->size()))
    out.push_back(all[p]);
  return out;
}
}  // namespace

std::map<std::string, double> Model::evaluate(data::Dataset& ds, EvaluateOptions o) {
  return evaluate_with(ds, o, bound_callbacks(o.callbacks, this, distribution()));
}

std::map<std::string, double> Model::evaluate_with(data::Dataset& ds, const EvaluateOptions& o,
                                                   const std::vector<std::shared_ptr<callbacks::Callback>>& cbs) {
  MPT_CHECK(compiled(), "evaluate: model '", name_, "' is not compiled; call compile() first");
  const distributed::DataParallel* dp = distribution();
  return on_all_ranks(dp, [&] {
    const std::vector<std::int64_t> all = dataset_indices("evaluate", ds, o.steps);
    // Batch 0 (of this pass), read on every rank: builds the model and resolves the metrics.
    const data::Batch first = ds.get(all[0]);
    MPT_CHECK(!first.targets().empty(), "evaluate: the dataset's batch ", all[0], " has no y");
    check_fit_inputs("evaluate", first.inputs(), first.targets(), 1);
    const std::vector<std::int64_t> classes = check_targets("evaluate", first.inputs(), first.targets());
    for (auto& m : val_metrics_) m->reset_state();
    metrics::Mean loss_mean("loss");
    for (auto& c : cbs) c->on_test_begin({});
    {
      std::vector<std::int64_t> indices = rank_share(all, dp);
      const auto n = static_cast<std::int64_t>(indices.size());
      const Device device = variables_device();
      detail::DatasetFeeder feeder(
          ds, std::move(indices), o.workers, o.max_queue_size,
          [&](data::Batch b) { return prepare_batch("evaluate", std::move(b), true, classes, device); }, "evaluate");
      for (std::int64_t step = 0; step < n; ++step) {
        for (auto& c : cbs) c->on_test_batch_begin(step, {});
        const data::Batch b = feeder.next();
        loss_mean.update(test_step(b.xs, b.ys, b.sample_weight, val_metrics_), static_cast<double>(b.xs[0].shape()[0]));
        for (auto& c : cbs) c->on_test_batch_end(step, {});
      }
    }
    ds.on_epoch_end();
    // Under a strategy: the metrics' states summed over the ranks (loss weighted by rows).
    const std::map<std::string, double> out = test_logs(reduced_results(dp, loss_mean, val_metrics_));
    for (auto& c : cbs) c->on_test_end(out);
    return out;
  });
}

Tensor Model::predict(data::Dataset& ds, PredictOptions o) {
  MPT_CHECK(num_outputs() == 1, "predict: model '", name_, "' has ", num_outputs(),
            " outputs; predict_outputs returns every one");
  return predict_all("predict", ds, o)[0];
}

std::vector<Tensor> Model::predict_outputs(data::Dataset& ds, PredictOptions o) {
  return predict_all("predict_outputs", ds, o);
}

std::vector<Tensor> Model::predict_all(const char* where, data::Dataset& ds, const PredictOptions& o) {
  const distributed::DataParallel* dp = distribution();
  return on_all_ranks(dp, [&] {
    const std::vector<std::int64_t> all = dataset_indices(where, ds, o.steps);
    std::vector<std::int64_t> indices = rank_share(all, dp);
    const auto n = static_cast<std::int64_t>(indices.size());
    NoGradGuard no_grad;
    std::vector<std::vector<Tensor>> parts(num_outputs());
    std::vector<double> rows(dp ? all.size() : 0, 0.0);  // each position's rows (under a strategy)
    const auto cbs = bound_callbacks(o.callbacks, this, dp);
    for (auto& c : cbs) c->on_predict_begin({});
    const Device device = variables_device();
    {
      detail::DatasetFeeder feeder(
          ds, std::move(indices), o.workers, o.max_queue_size,
          [&](data::Batch b) { return prepare_batch(where, std::move(b), false, {}, device); }, where);
      for (std::int64_t step = 0; step < n; ++step) {
        for (auto& c : cbs) c->on_predict_batch_begin(step, {});
        const std::vector<Tensor> ps = forward(feeder.next().xs, false);
        for (std::size_t i = 0; i < ps.size(); ++i)
          parts[i].push_back(is_half(ps[i].dtype()) ? ps[i].to(float32) : ps[i]);
        if (dp) rows[static_cast<std::size_t>(step * dp->size() + dp->rank())] = static_cast<double>(ps[0].shape()[0]);
        for (auto& c : cbs) c->on_predict_batch_end(step, {});
      }
    }
    if (dp && n == 0) {  // no batch here: the outputs' shapes and dtypes, from batch 0, no rows
      const std::vector<Tensor> ps = forward(prepare_batch(where, ds.get(all[0]), false, {}, device).xs, false);
      for (std::size_t i = 0; i < ps.size(); ++i)
        parts[i].push_back((is_half(ps[i].dtype()) ? ps[i].to(float32) : ps[i]).slice(0, 0));
    }
    ds.on_epoch_end();
    for (auto& c : cbs) c->on_predict_end({});
    std::vector<Tensor> out;
    for (const auto& p : parts) out.push_back((p.size() == 1 ? p[0] : ops::concat(p, 0)).to(Device::cpu()));
    if (!dp) return out;
    // Every rank's rows, gathered in rank order (rank r: its positions r, r + W, ...), then put
    // back in the dataset's order.
    rows = dp->all_reduce(std::move(rows));
    const auto world = static_cast<std::size_t>(dp->size());
    std::vector<std::int64_t> offset(rows.size());
    std::int64_t at = 0;
    for (std::size_t r = 0; r < world; ++r)
      for (std::size_t p = r; p < rows.size(); p += world) offset[p] = at, at += static_cast<std::int64_t>(rows[p]);
    for (auto& t : out) {
      const Tensor gathered = dp->all_gather_rows(t);
      std::vector<Tensor> ordered;
      for (std::size_t p = 0; p < rows.size(); ++p)
        ordered.push_back(gathered.slice(offset[p], offset[p] + static_cast<std::int64_t>(rows[p])));
      t = ordered.size() == 1 ? ordered[0] : ops::concat(ordered, 0);
    }
    return out;
  });
}

Tensor Model::predict_on_batch(const Tensor& x) { return predict_on_batch(Tensors(x)); }

Tensor Model::predict_on_batch(const Tensors& x) {
  check_fit_inputs("predict_on_batch", x.list(), {}, 1);
  MPT_CHECK(num_outputs() == 1, "predict_on_batch: model '", name_, "' has ", num_outputs(),
            " outputs; predict_outputs returns every one");
  NoGradGuard no_grad;
  std::vector<Tensor> xs;
  for (const auto& t : x) xs.push_back(t.to(variables_device()));
  Tensor p = forward(xs, false)[0];
  return (is_half(p.dtype()) ? p.to(float32) : p).to(x[0].device());
}

namespace {
std::vector<Tensor> to_device(const std::vector<Tensor>& ts, Device device) {
  std::vector<Tensor> out;
  for (const auto& t : ts) out.push_back(t.to(device));
  return out;
}
}  // namespace

std::map<std::string, double> Model::train_on_batch(const Tensor& x, const Tensor& y, const Tensor& sample_weight) {
  return train_on_batch(Tensors(x), Tensors(y), sample_weight);
}

std::map<std::string, double> Model::train_on_batch(const Tensors& x, const Tensors& y, const Tensor& sample_weight) {
  MPT_CHECK(compiled(), "train_on_batch: model '", name_, "' is not compiled; call compile() first");
  check_fit_inputs("train_on_batch", x.list(), y.list(), 1);
  check_sample_weight("train_on_batch", "sample_weight", x[0], sample_weight);
  for (auto& m : metrics_) m->reset_state();
  const Device device = variables_device();
  StepData d;
  const std::vector<Tensor> xs = to_device(x.list(), device), ys = to_device(y.list(), device);
  if (xs.size() == 1) d.x = xs[0];
  else d.xs = xs;
  if (ys.size() == 1) d.y = ys[0];
  else d.ys = ys;
  d.sample_weight = sample_weight.defined() ? sample_weight.to(device) : Tensor();
  StepResult r = run_train_step(d, {});
  auto logs = metric_logs(metrics_);
  logs["loss"] = r.loss.item();
  return logs;
}

std::map<std::string, double> Model::test_on_batch(const Tensor& x, const Tensor& y, const Tensor& sample_weight) {
  return test_on_batch(Tensors(x), Tensors(y), sample_weight);
}

std::map<std::string, double> Model::test_on_batch(const Tensors& x, const Tensors& y, const Tensor& sample_weight) {
  MPT_CHECK(compiled(), "test_on_batch: model '", name_, "' is not compiled; call compile() first");
  check_fit_inputs("test_on_batch", x.list(), y.list(), 1);
  check_sample_weight("test_on_batch", "sample_weight", x[0], sample_weight);
  if (metrics_resolved_)
    for (auto& m : val_metrics_) m->reset_state();
  const Device device = variables_device();
  double loss = test_step(to_device(x.list(), device), to_device(y.list(), device),
                          sample_weight.defined() ? sample_weight.to(device) : Tensor(), val_metrics_)
                    .item();
  std::map<std::string, double> out{{"loss", loss}};
  for (std::size_t i = 0; i < val_metrics_.size(); ++i) detail::log_metric(out, metrics_[i]->name(), val_metrics_[i]->results());
  return out;
}

}  // namespace mpt
