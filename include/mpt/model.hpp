#pragma once
/// Models: Sequential (and, later, functional Model), with Keras's compile / fit / evaluate /
/// predict.
///
///   mpt::Sequential model({layers::Input({784}), layers::Dense(10), layers::Activation("softmax")});
///   model.compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-3}),
///                  .loss = "sparse_categorical_crossentropy", .metrics = {"accuracy"}});
///   mpt::History h = model.fit(x, y, {.batch_size = 128, .epochs = 3, .validation_split = 0.1});
///   auto scores = model.evaluate(x_test, y_test);   // {"loss": ..., "accuracy": ...}
///
/// Several inputs and outputs (a functional Model), as Keras's x=[a, b], y=[y1, y2]: every
/// entry point taking x or y also takes mpt::Tensors (a braced list, in the model's input or
/// output order), and a Dataset's batches carry Batch::xs / ys:
///   model.compile({.loss = {"sparse_categorical_crossentropy", "mse"}, .loss_weights = {1.0, 0.5},
///                  .metrics = {"accuracy", "mae"}});               // one metric per output
///   model.fit({image, meta}, {label, box}, {.batch_size = 32});
///   // logs: loss (the weighted total), class_loss, box_loss, class_accuracy, box_mae
///   std::vector<mpt::Tensor> outs = model.predict_outputs({image, meta});
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mpt/callbacks.hpp"
#include "mpt/data/dataset.hpp"
#include "mpt/distributed.hpp"
#include "mpt/functional.hpp"
#include "mpt/layers/layer.hpp"
#include "mpt/losses/losses.hpp"
#include "mpt/metrics/metrics.hpp"
#include "mpt/mixed_precision/loss_scale_optimizer.hpp"
#include "mpt/optimizers/optimizer.hpp"
#include "mpt/tensors.hpp"

namespace mpt {

struct CompileOptions {
  optimizers::OptimizerArg optimizer = "rmsprop";
  /// One loss, for every output; or a list of one per output in output order (Keras's
  /// loss=[...]): .loss = {"sparse_categorical_crossentropy", "mse"}. With several outputs
  /// `loss` (logged "loss") is the sum of loss_weights[i] times output i's loss, each also logged
  /// as "<output layer name>_loss" (unweighted), as Keras 3.
  losses::LossArgs loss;
  /// With one output: its metrics. With several (Keras 3's rule): one entry per output, in
  /// output order (output i's one metric, logged "<output layer name>_<metric name>"); for
  /// several metrics per output use output_metrics.
  std::vector<metrics::MetricArg> metrics;
  /// Keras's weighted_metrics: metrics that take fit's and evaluate's sample weights (class_weight's
  /// too). Logged under their names, or "weighted_<name>" where an unweighted metric has it
  /// ("<output>_weighted_<name>" with several outputs). Several outputs: as `metrics`.
  std::vector<metrics::MetricArg> weighted_metrics;
  /// Under mixed_float16, wrap the optimizer in a LossScaleOptimizer (Keras's default), unless it
  /// has a fixed loss_scale_factor (its own loss scaling).
  bool auto_scale_loss = true;
  /// Data parallelism across processes (mpt::distributed); default: the process-wide strategy
  /// of distributed::set_strategy, if any.
  std::optional<distributed::DataParallel> distribution = std::nullopt;
  /// Several outputs: each output's loss times its weight in the total (Keras's loss_weights,
  /// a list in output order); empty: all 1.
  std::vector<double> loss_weights = {};
  /// Several outputs: a list of metrics per output, in output order (Keras's metrics=[[...],
  /// [...]]; an empty list: none for that output); not with `metrics`.
  std::vector<std::vector<metrics::MetricArg>> output_metrics = {};
  /// The same for weighted_metrics; not with `weighted_metrics`.
  std::vector<std::vector<metrics::MetricArg>> output_weighted_metrics = {};
};

struct FitOptions {
  std::int64_t batch_size = 32;  ///< tensors only: a Dataset's batches are its own
  int epochs = 1;
  int verbose = 1;  ///< 0 silent, 1 progress bar, 2 one line per epoch
  /// With a Dataset: threads that prepare batches ahead (get(), the copy to the model's device)
  /// while the current one trains; 0: get() runs on the training thread, between steps.
  int workers = 0;
  /// With a Dataset and workers: batches prepared ahead, at most (Keras's max_queue_size).
  std::int64_t max_queue_size = 10;
  std::vector<callbacks::CallbackArg> callbacks;
  /// The last fraction of x/y (and sample_weight), before shuffling (as Keras).
  double validation_split = 0.0;
  /// Keras's validation_data=(x_val, y_val): tensors, or lists of them for several inputs or
  /// outputs (std::pair{vx, vy} converts).
  std::optional<std::pair<Tensors, Tensors>> validation_data = std::nullopt;
  /// Validation batches from a Dataset (Keras's validation_data=PyDataset; the caller keeps it
  /// alive), evaluated with the same workers and queue; not with validation_data or _split.
  data::Dataset* validation_dataset = nullptr;
  /// The weights of validation_data's examples: Keras's (x_val, y_val, sample_weight_val).
  Tensor validation_sample_weight = {};
  bool shuffle = true;
  /// Keras's class_weight: class index -> weight. Each example's loss is scaled by its class's
  /// weight (1 for classes not listed); y holds class indices [N] / [N, 1] or one-hot rows
  /// [N, C] (their argmax). Training data only, as Keras; not with sample_weight.
  std::map<std::int64_t, double> class_weight = {};
  /// Keras's sample_weight: [N], each example's loss times its weight (every output's loss); a batch's loss stays
  /// sum(loss * w) / rows ("sum_over_batch_size"). Weights of the loss's per-position shape
  /// ([N, T]) scale each position.
  Tensor sample_weight = {};
  int initial_epoch = 0;
  /// Batches per epoch (default: one pass over x). Fewer: the next epoch goes on from the batch
  /// this one stopped at. An epoch never runs past the end of the data: as Keras, it ends early
  /// there (with a warning), and the next epoch starts the next pass (reshuffled).
  std::optional<std::int64_t> steps_per_epoch = std::nullopt;
  std::optional<std::int64_t> validation_batch_size = std::nullopt;  ///< default: batch_size
  int validation_freq = 1;  ///< validate after every validation_freq-th epoch (epochs 1-based, as Keras)
  std::optional<std::uint64_t> seed = std::nullopt;  ///< shuffle seed (default: from set_random_seed)
};

struct EvaluateOptions {
  std::int64_t batch_size = 32;
  int verbose = 0;
  /// With a Dataset: as FitOptions's workers and max_queue_size; steps: batches to evaluate
  /// (default: all; required for a dataset of unknown size).
  int workers = 0;
  std::int64_t max_queue_size = 10;
  std::optional<std::int64_t> steps = std::nullopt;
  /// [N]: each example's loss times its weight (as fit's sample_weight).
  Tensor sample_weight = {};
  /// Their on_test_* hooks run (Keras's evaluate(callbacks=...)).
  std::vector<callbacks::CallbackArg> callbacks = {};
};

struct PredictOptions {
  std::int64_t batch_size = 32;
  int verbose = 0;
  /// With a Dataset: as EvaluateOptions's.
  int workers = 0;
  std::int64_t max_queue_size = 10;
  std::optional<std::int64_t> steps = std::nullopt;
  /// Their on_predict_* hooks run (Keras's predict(callbacks=...)).
  std::vector<callbacks::CallbackArg> callbacks = {};
};

/// Options of Model::save_weights.
struct SaveWeightsOptions {
  /// Store floating-point weights in this dtype instead of their own (float32 masters):
  /// float16 or bfloat16 for deployment. Such exports leave the optimizer out.
  std::optional<DType> dtype = std::nullopt;
  /// Keras 3 layout only: also store the optimizer's variables, as Keras does.
  bool include_optimizer = true;
};

namespace detail {
struct CheckpointAccess;
/// The model a layer stands for when it is a model used as a layer (Model::as_layer), else null.
std::shared_ptr<Model> nested_model(const Layer& layer);
/// logs[name] = the metric's value; a metric with several values (Precision at several
/// thresholds, F1Score per class) logs "name[0]", "name[1]", ... instead.
void log_metric(Logs& logs, const std::string& name, const std::vector<double>& values);
}

/// Per-epoch logs, as keras.callbacks.History: history["loss"][epoch], "val_loss",
/// "accuracy", "learning_rate", "loss_scale", "skipped_steps", ...
struct History {
  std::map<std::string, std::vector<double>> history;
  std::vector<int> epoch;
  /// Overflow diagnostics, one map per epoch: each layer whose gradients held inf or NaN in a
  /// step the LossScaleOptimizer skipped, with the number of such steps (empty when none).
  std::vector<std::map<std::string, std::int64_t>> nonfinite_layers;
};

/// A model: the functional one (a graph of layer calls from mpt::Input to outputs) and the
/// base of Sequential.
class Model : public std::enable_shared_from_this<Model> {
 public:
  /// A functional model from symbolic inputs to outputs.
  Model(const KerasTensor& inputs, const KerasTensor& outputs, const std::string& name = "functional");
  Model(const std::vector<KerasTensor>& inputs, const std::vector<KerasTensor>& outputs,
        const std::string& name = "functional");
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  /// Runs the model; records on an active tape. Floating outputs keep the last layer's dtype.
  virtual Tensor call(const Tensor& x, bool training);
  /// Several inputs and outputs (functional models).
  virtual std::vector<Tensor> call(const std::vector<Tensor>& xs, bool training);
  std::vector<Tensor> operator()(const std::vector<Tensor>& xs, CallOptions options = {}) {
    return call(xs, options.training);
  }
  Tensor operator()(const Tensor& x, CallOptions options = {}) { return call(x, options.training); }
  /// This model as one layer of another (Keras's nested models, e.g. fine-tuning a loaded base):
  /// called in a functional graph, y = (*base)(x), or given to Sequential({..., base, ...}) (a
  /// std::shared_ptr<Model> converts to a LayerRef). Its variables stay its own (shared with the
  /// outer model); the model must be owned by a std::shared_ptr, have one output, and the layer
  /// is the same object each time it is asked for. Its class_name is "Functional" or "Sequential"
  /// and its name the model's (renaming one renames the other).
  LayerRef as_layer();
  KerasTensor operator()(const KerasTensor& x) { return as_layer()(x); }
  KerasTensor operator()(const std::vector<KerasTensor>& xs) { return as_layer()(xs); }
  /// Keras's model.trainable: false freezes every layer (their variables leave
  /// trainable_variables(), BatchNormalization runs in inference mode); true unfreezes them.
  void set_trainable(bool on);
  bool trainable() const { return trainable_; }
  /// Builds every layer for inputs shaped `input_shape` (batch dimension included or not).
  virtual void build(const Shape& input_shape);
  /// Layers, each once (shared layers included once): a Sequential's as added, a functional
  /// model's in Keras's order (map_graph's, by depth from the inputs), which also names their
  /// weights in Keras files and orders the variables.
  virtual std::vector<LayerRef> layers() const;
  /// Keras's get_layer: the layer of layers() with this name (an mpt::Error listing the names
  /// otherwise), or at this index of Keras's model.layers (negative: from the end, as Python's).
  /// A functional model's Keras list also holds an InputLayer per Input, which mpt has no layer
  /// for: asking for one, by index or name, is an mpt::Error saying so.
  LayerRef get_layer(const std::string& name) const;
  LayerRef get_layer(int index) const;
  /// Checks a whole input tensor against the model's input spec (mpt::Error naming the model).
  virtual void check_input(const Tensor& x) const;

  void compile(CompileOptions options);
  History fit(const Tensor& x, const Tensor& y, FitOptions options = {});
  /// Several inputs and/or outputs (Keras's x=[a, b], y=[y1, y2]), in the model's input and
  /// output order: model.fit({a, b}, {y1, y2}). Every array has the same number of rows (an
  /// mpt::Error naming fit otherwise); shuffling permutes them alike, validation_split takes the
  /// last rows of each. One sample_weight weighs every output's loss.
  History fit(const Tensors& x, const Tensors& y, FitOptions options = {});
  /// fit, evaluate and predict on a Dataset (data/dataset.hpp: Keras's PyDataset): its batches
  /// by index, shuffled per epoch (fit's shuffle and seed) when its size is known, prepared by
  /// options.workers threads. The first batch is also read once up front (the model and metrics
  /// are resolved on it). A fit on a TensorDataset of (x, y) without shuffling gives the weights
  /// fit(x, y) gives. Under data parallelism fit's global step takes one batch per rank (rank
  /// r the pass's position step·W + r): the ranks see disjoint batches covering each epoch, and
  /// train as one process whose batches are those W joined (steps_per_epoch counts global
  /// steps). evaluate and predict on a Dataset shard the same way (rank r batches r, r + W, ...):
  /// evaluate gives every rank the results over the whole dataset, predict every rank all the
  /// rows in the dataset's order.
  History fit(data::Dataset& data, FitOptions options = {});
  std::map<std::string, double> evaluate(const Tensor& x, const Tensor& y, EvaluateOptions options = {});
  /// Several inputs and/or outputs, as fit's.
  std::map<std::string, double> evaluate(const Tensors& x, const Tensors& y, EvaluateOptions options = {});
  std::map<std::string, double> evaluate(data::Dataset& data, EvaluateOptions options = {});
  /// Batched inference; floating outputs returned in float32. A model with one output only
  /// (an mpt::Error points a multi-output model to predict_outputs).
  Tensor predict(const Tensor& x, PredictOptions options = {});
  /// Several inputs (model.predict({a, b})); one output.
  Tensor predict(const Tensors& x, PredictOptions options = {});
  /// The outputs of every batch's x, concatenated, on the CPU.
  Tensor predict(data::Dataset& data, PredictOptions options = {});
  /// Every output of the model, in output order (Keras's predict of a multi-output model): each
  /// as predict's (float32, where x came from; on the CPU from a Dataset).
  std::vector<Tensor> predict_outputs(const Tensors& x, PredictOptions options = {});
  std::vector<Tensor> predict_outputs(data::Dataset& data, PredictOptions options = {});
  /// One forward pass over x as one batch, in inference mode (Keras's predict_on_batch);
  /// floating outputs returned in float32, where x came from. One output (several inputs
  /// allowed).
  Tensor predict_on_batch(const Tensor& x);
  Tensor predict_on_batch(const Tensors& x);
  /// One batch of fit or train_on_batch: x, y and the sample weights (undefined when none).
  /// A model with several inputs gets them in xs (x undefined), one with several outputs its
  /// targets in ys (y undefined); inputs() and targets() give the lists either way (an override
  /// may also build StepData either way).
  struct StepData {
    Tensor x, y, sample_weight;
    std::vector<Tensor> xs = {}, ys = {};
    std::vector<Tensor> inputs() const { return xs.empty() ? Tensors(x).list() : xs; }
    std::vector<Tensor> targets() const { return ys.empty() ? Tensors(y).list() : ys; }
  };
  /// Keras's overridable train_step(data): fit and train_on_batch call it for every batch. The
  /// default is mpt's step: forward, compute_loss, loss scaling, gradients, the optimizer update,
  /// the compiled metrics; it returns the batch's loss. A subclass may override it with its own
  /// step, written with the public API (call(), compute_loss(), a GradientTape, optimizer()'s
  /// apply_gradients, update_compiled_metrics()), and return the batch's loss as a scalar; fit
  /// logs that loss and the compiled metrics, and applies the layers' constraints after it
  /// (finish_step(true)). An override may call Model::train_step(data) for the default. Under
  /// data parallelism fit refuses an override (the default step sums the ranks' gradients).
  ///
  ///   struct Clipped : mpt::Sequential {
  ///     using Sequential::Sequential;
  ///     mpt::Tensor train_step(const StepData& d) override {
  ///       mpt::GradientTape tape;
  ///       mpt::Tensor loss = compute_loss(d.y, call(d.x, true), d.sample_weight);
  ///       auto vars = trainable_variables();
  ///       auto grads = tape.gradient(loss, vars);
  ///       for (auto& g : grads) g = mpt::ops::mul(g, mpt::Tensor::scalar(0.5));  // a custom rule
  ///       optimizer().apply_gradients(grads, vars);
  ///       update_compiled_metrics(d.y, call(d.x, false), d.sample_weight);
  ///       return loss;
  ///     }
  ///   };
  virtual Tensor train_step(const StepData& data);
  /// Keras's compute_loss: the compiled loss of (y, y_pred, sample_weight), in float32, plus the
  /// layers' regularization penalties (losses()).
  Tensor compute_loss(const Tensor& y, const Tensor& y_pred, const Tensor& sample_weight = {}) const;
  /// Several outputs: the weighted sum of every output's loss (targets and predictions in
  /// output order), plus the penalties.
  Tensor compute_loss(const Tensors& y, const Tensors& y_pred, const Tensor& sample_weight = {}) const;
  /// Updates the compiled metrics with a batch, as the default step does (no gradients recorded).
  void update_compiled_metrics(const Tensor& y, const Tensor& y_pred, const Tensor& sample_weight = {});
  /// Several outputs: also the per-output losses ("<output>_loss").
  void update_compiled_metrics(const Tensors& y, const Tensors& y_pred, const Tensor& sample_weight = {});
  /// One training step on one batch; returns the batch's loss and metrics.
  std::map<std::string, double> train_on_batch(const Tensor& x, const Tensor& y, const Tensor& sample_weight = {});
  std::map<std::string, double> train_on_batch(const Tensors& x, const Tensors& y, const Tensor& sample_weight = {});
  std::map<std::string, double> test_on_batch(const Tensor& x, const Tensor& y, const Tensor& sample_weight = {});
  std::map<std::string, double> test_on_batch(const Tensors& x, const Tensors& y, const Tensor& sample_weight = {});
  /// Tells every layer that an optimizer step was applied (or skipped, when a loss-scale overflow
  /// made apply_gradients return false). fit and train_on_batch call it; a custom training loop
  /// calls it after each apply_gradients so BatchNormalization's moving statistics follow only
  /// the applied steps.
  void finish_step(bool applied);
  /// Keras's model.losses: every layer's regularization penalties (weights, and the activity
  /// penalties of the last forward), float32 scalars; fit and evaluate add them to the loss.
  std::vector<Tensor> losses() const;

  std::vector<Variable> variables() const;
  std::vector<Variable> trainable_variables() const;
  std::vector<Variable> non_trainable_variables() const;
  std::int64_t count_params() const;
  /// Copies of every variable's values (float32 masters), in variables() order.
  std::vector<Tensor> get_weights() const;
  void set_weights(const std::vector<Tensor>& weights);

  /// Writes the weights: "*.weights.h5" in Keras 3's layout (with the optimizer's variables when
  /// compiled), any other "*.h5" / "*.hdf5" in Keras 2's legacy layout. Atomic: a temporary file
  /// renamed over `filepath`, so a crash leaves the previous file intact.
  void save_weights(const std::string& filepath, SaveWeightsOptions options = {}) const;
  /// Loads weights saved by mpt or Keras (either layout, told apart by content; 16-bit files
  /// converted back). Every layer and shape is checked first; mpt::Error names the first
  /// mismatch and leaves the model untouched.
  void load_weights(const std::string& filepath);
  /// A full checkpoint: architecture, weights, compile settings, optimizer state, loss-scale
  /// state, epoch and random-generator state. mpt::load_model(filepath) resumes from it.
  void save(const std::string& filepath) const;
  /// Epochs completed by fit (restored by load_model: pass it as fit's initial_epoch).
  int epoch() const { return epoch_; }

  /// Keras's table: layer (type), output shape, params, policy; totals.
  void summary(std::ostream& os) const;
  void summary() const;

  const std::string& name() const { return name_; }
  void set_name(const std::string& name) { name_ = name; }
  const mixed_precision::Policy& dtype_policy() const { return policy_; }
  bool compiled() const { return optimizer_ != nullptr; }
  optimizers::Optimizer& optimizer() const;
  /// The LossScaleOptimizer when the optimizer is one (auto-wrapped or given), else null.
  mixed_precision::LossScaleOptimizer* loss_scale_optimizer() const;
  /// The compiled loss (of output 0 with several outputs).
  const losses::Loss& loss() const;
  /// The compiled loss of output `output`.
  const losses::Loss& loss(std::size_t output) const;
  /// The model's inputs and outputs: a functional model's, else 1.
  std::size_t num_inputs() const { return inputs_.empty() ? 1 : inputs_.size(); }
  std::size_t num_outputs() const { return outputs_.empty() ? 1 : outputs_.size(); }
  /// Keras's output_names: the layers that make each output (an Input's name for an output that
  /// is an Input); a Sequential's last layer.
  std::vector<std::string> output_names() const;
  /// The data-parallel strategy fit/evaluate/predict use: compile's, else the process-wide one;
  /// null when there is none or it has one rank. Under it only rank 0 writes files (save,
  /// save_weights and the chief-only callbacks); the other ranks' calls write nothing.
  const distributed::DataParallel* distribution() const;
  /// Set by a callback to end fit after the current epoch.
  bool stop_training = false;

 protected:
  Model();  // for subclasses (Sequential)
  /// Gives unnamed layers unique Keras-style names ("dense", "dense_1").
  void assign_layer_names();
  /// Clears the layers' activity penalties: each forward records its own (Keras).
  void clear_activity_losses() const;
  /// loss plus every penalty of losses(), summed in float32.
  Tensor with_regularization(const Tensor& loss) const;
  std::string name_;
  mixed_precision::Policy policy_;

 private:
  struct StepResult {
    Tensor loss;  // a scalar on the model's device
    bool applied = true;
    std::vector<std::string> nonfinite_variables;  // of a skipped step (overflow diagnostics)
    // With keep_gradients: the unscaled gradients the optimizer got, and their variables.
    std::vector<Tensor> gradients;
    std::vector<Variable> variables;
  };
  /// One step on this rank's rows (x undefined: none this step); under a strategy the gradients
  /// are summed over the ranks, this rank's weighted by `weight` (its share of the batch's rows).
  /// sample_weight: undefined, or the batch's weights (the loss takes them).
  StepResult default_step(const std::vector<Tensor>& x, const std::vector<Tensor>& y, const Tensor& sample_weight,
                          bool keep_gradients = false,
                          const distributed::DataParallel* strategy = nullptr, double weight = 1.0);
  /// What fit asks of the next default step, and what that step did (null when train_step is
  /// overridden and did not call the default).
  struct StepContext {
    bool keep_gradients = false;
    const distributed::DataParallel* strategy = nullptr;
    double weight = 1.0;
  } step_context_;
  std::shared_ptr<StepResult> last_step_;
  /// train_step(data) with fit's context: the default's full result, or the override's loss.
  StepResult run_train_step(const StepData& data, const StepContext& context);
  /// The results of loss_mean and each of `ms`, over all ranks under a strategy (one message).
  std::vector<std::vector<double>> reduced_results(const distributed::DataParallel* strategy, const metrics::Mean& loss_mean,
                                      const std::vector<std::shared_ptr<metrics::Metric>>& ms) const;
  /// sums_scale: the factor for the parts of losses reduced by "sum" (a rank's share of a batch).
  Tensor test_step(const std::vector<Tensor>& x, const std::vector<Tensor>& y, const Tensor& sample_weight,
                   std::vector<std::shared_ptr<metrics::Metric>>& metrics, double sums_scale = 1.0);
  /// Whether a loss of the model reduces by "sum".
  bool sums_a_loss() const;
  /// loss, with each "sum"-reduced output's part (per_output[o] · its loss weight) counted
  /// `factor` times instead of once.
  Tensor with_sums_scaled(const Tensor& loss, const std::vector<Tensor>& per_output, double factor) const;
  /// The model's outputs for these inputs (call(x) for one input and output, else call(xs)).
  std::vector<Tensor> forward(const std::vector<Tensor>& xs, bool training);
  /// The compiled loss of every output weighted and summed, plus the penalties; each output's
  /// own loss in *per_output when given.
  Tensor compiled_loss(const std::vector<Tensor>& y, const std::vector<Tensor>& y_pred, const Tensor& sample_weight,
                       std::vector<Tensor>* per_output) const;
  /// The predictions of predict / predict_outputs (checks made by the caller).
  std::vector<Tensor> predict_all(const char* where, const std::vector<Tensor>& x, const PredictOptions& o);
  std::vector<Tensor> predict_all(const char* where, data::Dataset& data, const PredictOptions& o);
  /// fit's parts (fit.cpp): the state of one call, one epoch of it, and the logs of the
  /// training loss and metrics (over all ranks under a strategy).
  struct FitRun;
  History run_fit(FitRun& run);
  void fit_epoch(FitRun& run, int epoch, std::int64_t first_step = 0);
  /// evaluate with these callbacks' on_test_* hooks (fit's validation passes fit's callbacks).
  std::map<std::string, double> evaluate_with(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                                              const EvaluateOptions& o,
                                              const std::vector<std::shared_ptr<callbacks::Callback>>& cbs);
  std::map<std::string, double> evaluate_with(data::Dataset& data, const EvaluateOptions& o,
                                              const std::vector<std::shared_ptr<callbacks::Callback>>& cbs);
  /// A Dataset's batch checked (x and y rows, finite values, output i's labels in [0,
  /// classes[i]) when classes[i] >= 0) and copied to `device` (the model's, found by the caller:
  /// the workers run this after get() while the step changes the variables, so it reads nothing
  /// that changes). Returned with its arrays in xs and ys (x and y undefined).
  data::Batch prepare_batch(const char* where, data::Batch b, bool need_y, const std::vector<std::int64_t>& classes,
                            Device device) const;
  Logs epoch_logs(const metrics::Mean& loss_mean, const distributed::DataParallel* strategy) const;
  /// x (and y when given): one array per input (output), every one defined, with a batch
  /// dimension, the same rows, finite values; the inputs of the model's shapes.
  void check_fit_inputs(const char* where, const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                        std::int64_t batch_size) const;
  /// sample_weight (undefined: none): one finite weight per example of x.
  void check_sample_weight(const char* where, const char* what, const Tensor& x, const Tensor& w) const;
  /// Keras's class_weight as sample weights of y's examples (float32 [N], on the host).
  Tensor class_sample_weights(const Tensor& y, const std::map<std::int64_t, double>& class_weight) const;
  /// Where the model's variables are (default_device() before any exists).
  Device variables_device() const;
  /// Once per fit/evaluate: resolves the metrics on one sample and checks sparse labels
  /// against the number of classes, on the host copy of y. Returns that number of classes
  /// (sparse categorical crossentropy), else -1.
  /// Per output: its classes, or -1.
  std::vector<std::int64_t> check_targets(const char* where, const std::vector<Tensor>& x, const std::vector<Tensor>& y);
  void resolve_metrics(const std::vector<Tensor>& y, const std::vector<Tensor>& y_pred);
  /// Updates ms (metrics_ or val_metrics_): the weighted ones with sample_weight when defined;
  /// with several outputs, the per-output loss trackers with per_output_loss (when given) over
  /// `rows` rows.
  void update_metrics(std::vector<std::shared_ptr<metrics::Metric>>& ms, const std::vector<Tensor>& y,
                      const std::vector<Tensor>& y_pred, const Tensor& sample_weight,
                      const std::vector<Tensor>* per_output_loss = nullptr);
  /// The logs of evaluate-like results: "loss" and each of val_metrics_'s under metrics_'s names.
  std::map<std::string, double> test_logs(const std::vector<std::vector<double>>& values) const;
  std::map<std::string, double> metric_logs(const std::vector<std::shared_ptr<metrics::Metric>>& ms) const;

  void summary_functional(std::ostream& os) const;
  // Functional graph: input nodes, output tensors, nodes in execution order.
  std::vector<KerasTensor> inputs_, outputs_;
  std::vector<std::shared_ptr<FunctionalNode>> nodes_;
  std::vector<LayerRef> layer_order_;  // a functional model's layers in Keras's order (map_graph)
  // Keras's Functional.layers: layer_order_ with an entry (null layer) for each Input's InputLayer.
  std::vector<std::pair<LayerRef, const FunctionalNode*>> keras_layers_;
  std::shared_ptr<optimizers::Optimizer> optimizer_;
  std::shared_ptr<losses::Loss> loss_;  // output 0's (losses_[0])
  std::vector<std::shared_ptr<losses::Loss>> losses_;  // one per output
  std::vector<double> loss_weights_;                   // one per output
  std::vector<metrics::MetricArg> metric_args_, weighted_metric_args_;
  // Several outputs: each output's metrics and weighted metrics (compile's, by Keras's rules).
  std::vector<std::vector<metrics::MetricArg>> output_metric_args_, output_weighted_metric_args_;
  // With several outputs first a Mean per output of its loss ("<output>_loss", metric_kind_ 2);
  // then compile's metrics (kind 0), then its weighted_metrics (kind 1); and their val_ copies.
  // metric_output_: the output each reads.
  std::vector<std::shared_ptr<metrics::Metric>> metrics_, val_metrics_;
  std::vector<bool> metric_weighted_;
  std::vector<int> metric_kind_;
  std::vector<std::size_t> metric_output_;
  bool metrics_resolved_ = false;
  std::optional<distributed::DataParallel> distribution_;
  std::uint64_t seed_;
  int epoch_ = 0;
  /// Where the next fit starts when a callback set it in on_train_begin (BackupAndRestore):
  /// epoch and batch within it; -1 for none.
  int resume_epoch_ = -1;
  std::int64_t resume_step_ = 0;
  bool trainable_ = true;
  std::weak_ptr<Layer> as_layer_;  // the layer of as_layer(), while one lives
  friend struct detail::CheckpointAccess;
  friend class LayerRef;  // LayerRef(std::shared_ptr<Model>) makes and caches as_layer_
};

class Sequential : public Model {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<LayerRef> layers);
  explicit Sequential(const std::vector<LayerRef>& layers);
  void add(LayerRef layer);
  /// Removes the last layer.
  void pop();

  Tensor call(const Tensor& x, bool training) override;
  void build(const Shape& input_shape) override;
  std::vector<LayerRef> layers() const override { return layers_; }
  void check_input(const Tensor& x) const override;
  /// Per-example input shape from the Input layer or build(), empty when unknown.
  const Shape& input_shape() const { return input_shape_; }

 private:
  std::vector<LayerRef> layers_;
  Shape input_shape_;
};

/// Keras's load_model arguments.
struct LoadModelOptions {
  /// false: the model comes back uncompiled (no optimizer, loss or metrics are read, so a
  /// compile config mpt cannot rebuild does not stop the load); compile it yourself.
  bool compile = true;
};

/// Rebuilds a model saved with Model::save (or a Keras .keras archive), compiled and with its
/// optimizer, loss-scale, epoch and random-generator state restored, so
/// fit(..., {.initial_epoch = m->epoch()}) continues exactly where the saved run stood.
std::unique_ptr<Model> load_model(const std::string& filepath, LoadModelOptions options = {});

}  // namespace mpt
