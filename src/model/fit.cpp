// Model::fit: the epoch loop and its parts (validation split, cross-rank agreement, the
// callbacks a fit runs, overflow diagnostics, epoch logs). The step itself is train_step
// (model.cpp); batches come from BatchStager (batch_stager.hpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "data/feeder.hpp"
#include "model/batch_stager.hpp"
#include "mpt/data/data.hpp"
#include "mpt/log.hpp"
#include "mpt/model.hpp"

namespace mpt {

/// The state of one fit call, shared by its epochs.
struct Model::FitRun {
  explicit FitRun(const FitOptions& options) : o(options) {}
  const FitOptions& o;
  // Training and validation data: one array per input (x) and output (y); w: sample weights or
  // undefined.
  std::vector<Tensor> x, y, vx, vy;
  Tensor w, vw;
  data::Dataset* ds = nullptr;   // or a Dataset (then x, y, w are empty; n is its size, -1: unknown)
  data::Dataset* vds = nullptr;  // validation batches from a Dataset
  std::vector<std::int64_t> classes;  // a Dataset's sparse labels of output i lie in [0, classes[i])
  std::int64_t n = 0;
  std::int64_t batches = 0;  // batches in one pass over x
  std::int64_t steps = 0;    // batches per epoch: steps_per_epoch, else batches
  bool warned_short = false;
  const distributed::DataParallel* dp = nullptr;
  std::vector<std::shared_ptr<callbacks::Callback>> cbs;
  std::uint64_t seed = 0;
  Device device;
  Logs logs;
  History history;
};

namespace {

/// Keras's validation_split: the last fraction of the data (and of the sample weights), taken
/// before any shuffling; or the validation_data given.
struct Split {
  std::vector<Tensor> x, y, vx, vy;
  Tensor w, vw;
};
std::vector<Tensor> rows(const std::vector<Tensor>& ts, std::int64_t begin, std::int64_t end) {
  std::vector<Tensor> out;
  for (const auto& t : ts) out.push_back(t.slice(begin, end));
  return out;
}
Split split_validation(const std::vector<Tensor>& x_all, const std::vector<Tensor>& y_all, const FitOptions& o) {
  Split d;
  d.x = x_all, d.y = y_all, d.w = o.sample_weight;
  if (o.validation_data) {
    d.vx = o.validation_data->first.list(), d.vy = o.validation_data->second.list(), d.vw = o.validation_sample_weight;
  } else if (o.validation_split > 0) {
    const std::int64_t n = x_all[0].shape()[0];
    const auto split = static_cast<std::int64_t>(std::ceil(static_cast<double>(n) * (1.0 - o.validation_split)));
    MPT_CHECK(split > 0 && split < n, "fit: validation_split ", o.validation_split,
              " leaves no training or no validation samples out of ", n);
    d.x = rows(x_all, 0, split), d.y = rows(y_all, 0, split);
    d.vx = rows(x_all, split, n), d.vy = rows(y_all, split, n);
    if (o.sample_weight.defined()) d.w = o.sample_weight.slice(0, split), d.vw = o.sample_weight.slice(split, n);
  }
  return d;
}

/// Keras's epochs over a pass of `batches` batches, `steps` per epoch: an epoch goes on from
/// where the last one stopped and ends early at the end of the data; the next pass (a new
/// shuffle) starts with the next epoch. So epoch e is in pass e / E (E = ceil(batches / steps)
/// epochs per pass), from batch (e % E) * steps. Computed from the epoch alone, so a fit
/// resumed at initial_epoch takes the batches the uninterrupted run took.
struct EpochSpan {
  std::int64_t pass, first, count;
};
EpochSpan epoch_span(std::int64_t epoch, std::int64_t batches, std::int64_t steps) {
  const std::int64_t per_pass = data::batch_count(batches, steps);
  const std::int64_t first = (epoch % per_pass) * steps;
  return {epoch / per_pass, first, std::min(steps, batches - first)};
}

/// Under a strategy: the same model and run on every rank (an mpt::Error on all of them
/// otherwise), rows for every rank in every batch where SyncBatchNorm needs them, then rank 0's
/// weights everywhere.
void agree_across_ranks(const Model& model, const distributed::DataParallel& dp, std::int64_t n,
                        std::int64_t n_val, const FitOptions& o, std::uint64_t seed) {
  std::vector<std::string> lines;
  for (const auto& v : model.variables())
    lines.push_back(v.path() + " " + to_string(v.shape()) + " " + to_string(v.dtype()) +
                    (v.trainable() ? "" : " non-trainable"));
  lines.push_back("policy " + model.dtype_policy().name());
  lines.push_back("optimizer " + model.optimizer().name());
  std::string loss_names;
  for (std::size_t i = 0; i < model.num_outputs(); ++i) loss_names += (i ? ", " : "") + model.loss(i).name();
  lines.push_back("loss " + loss_names);
  lines.push_back("training samples " + std::to_string(n) + ", validation samples " + std::to_string(n_val));
  lines.push_back("batch_size " + std::to_string(o.batch_size) + ", epochs " + std::to_string(o.initial_epoch) + ".." +
                  std::to_string(o.epochs) + ", shuffle " + std::to_string(o.shuffle) + ", seed " +
                  std::to_string(seed));
  lines.push_back("steps_per_epoch " + (o.steps_per_epoch ? std::to_string(*o.steps_per_epoch) : std::string("all")) +
                  ", validation_freq " + std::to_string(o.validation_freq) + ", validation_batch_size " +
                  std::to_string(o.validation_batch_size.value_or(o.batch_size)));
  std::string weights = o.sample_weight.defined() ? "sample_weight" : o.class_weight.empty() ? "none" : "class_weight";
  for (const auto& [c, w] : o.class_weight)
    weights.append(" ").append(std::to_string(c)).append(":").append(std::to_string(w));
  lines.push_back("weights " + weights + (o.validation_sample_weight.defined() ? ", validation sample weights" : ""));
  dp.check_same("models and fit arguments", lines);
  // SyncBatchNorm reduces inside the forward pass: every rank needs rows in every batch.
  MPT_CHECK(!dp.options().sync_batch_norm || n % o.batch_size == 0 || n % o.batch_size >= dp.size(),
            "fit: with sync_batch_norm, the last batch's ", n % o.batch_size, " rows cannot be shared by ", dp.size(),
            " ranks; choose a batch_size that leaves at least one row per rank");
  dp.broadcast_variables(model.variables());
}

/// The callbacks this rank runs: the user's (only the chief runs chief-only ones) and the
/// progress bar on the chief.
std::vector<std::shared_ptr<callbacks::Callback>> fit_callbacks(const FitOptions& o, bool chief, std::int64_t steps) {
  std::vector<std::shared_ptr<callbacks::Callback>> cbs;
  for (std::size_t i = 0; i < o.callbacks.size(); ++i) {
    MPT_CHECK(o.callbacks[i].get() != nullptr, "fit: callback ", i, " is a null pointer");
    if (chief || !o.callbacks[i].get()->chief_only()) cbs.push_back(o.callbacks[i].get());
  }
  if (o.verbose > 0 && chief) cbs.push_back(std::make_shared<callbacks::ProgbarLogger>(o.verbose, steps, o.epochs));
  return cbs;
}

/// Overflow diagnostics of a skipped step: counts the layers with non-finite gradients (a
/// variable "<layer>/<weight>" names its layer) and, when verbose, says which.
void note_overflow(const std::vector<std::string>& nonfinite_variables, int epoch, std::int64_t step, bool verbose,
                   double loss_scale, std::map<std::string, std::int64_t>& nonfinite_layers) {
  std::vector<std::string> step_layers;
  for (const auto& v : nonfinite_variables) {
    std::string layer = v.substr(0, v.find('/'));
    if (std::find(step_layers.begin(), step_layers.end(), layer) == step_layers.end()) step_layers.push_back(layer);
  }
  for (const auto& l : step_layers) ++nonfinite_layers[l];
  if (!verbose) return;
  std::string layers_list, vars_list;
  for (const auto& l : step_layers) layers_list += (layers_list.empty() ? "" : ", ") + l;
  for (const auto& v : nonfinite_variables) vars_list += (vars_list.empty() ? "" : ", ") + v;
  mpt::log(LogLevel::info, "epoch ", epoch + 1, " step ", step + 1, " skipped: inf/NaN gradients in ",
           step_layers.size() == 1 ? "layer " : "layers ", layers_list, " (", vars_list, "); loss scale now ",
           loss_scale);
}

}  // namespace

Tensor Model::class_sample_weights(const Tensor& y, const std::map<std::int64_t, double>& class_weight) const {
  // Keras's class_weight_to_sample_weights: labels [N] or [N, 1], or the argmax of [N, C] rows
  // (not for sparse labels: [N, T] are T labels of each example, no class of it).
  const bool one_hot = y.dim() == 2 && y.shape()[1] > 1;
  MPT_CHECK(y.dim() == 1 || y.dim() == 2, "fit: class_weight needs one class per example, y of shape (N,), (N, 1) or ",
            "one-hot (N, C); got y of shape ", to_string(y.shape()));
  MPT_CHECK(!one_hot || loss_->name() != "sparse_categorical_crossentropy", "fit: class_weight needs one class per ",
            "example; with sparse labels, y of shape (N,) or (N, 1); got y of shape ", to_string(y.shape()));
  const std::int64_t n = y.shape()[0], width = one_hot ? y.shape()[1] : 1;
  const std::vector<double> v = y.to_vector<double>();
  std::vector<float> w(static_cast<std::size_t>(n), 1.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto row = v.begin() + static_cast<std::ptrdiff_t>(i * width);
    double label = one_hot ? static_cast<double>(std::max_element(row, row + width) - row) : *row;
    // Keras rounds labels; a fraction or a negative label is no class (regression targets).
    MPT_CHECK(label >= 0 && label == std::round(label) && label < 9.0e15,
              "fit: class_weight needs class indices in y, got ", label, " at sample ", i, " (y of shape ",
              to_string(y.shape()), ")");
    const auto it = class_weight.find(static_cast<std::int64_t>(label));
    if (it != class_weight.end()) w[static_cast<std::size_t>(i)] = static_cast<float>(it->second);
  }
  return Tensor::from_vector(w, {n}, Device::cpu());
}

Logs Model::epoch_logs(const metrics::Mean& loss_mean, const distributed::DataParallel* strategy) const {
  const auto values = reduced_results(strategy, loss_mean, metrics_);
  Logs l;
  l["loss"] = values[0][0];
  for (std::size_t i = 0; i < metrics_.size(); ++i) detail::log_metric(l, metrics_[i]->name(), values[i + 1]);
  return l;
}

void Model::fit_epoch(FitRun& run, int epoch, std::int64_t first_step) {
  const FitOptions& o = run.o;
  auto* lso = loss_scale_optimizer();
  for (auto& c : run.cbs) c->on_epoch_begin(epoch, {});
  for (auto& m : metrics_) m->reset_state();
  metrics::Mean loss_mean("loss");
  std::int64_t skipped = 0;
  std::map<std::string, std::int64_t> nonfinite_layers;
  // This epoch's batches: [first, first + count) of pass `pass` (one pass per epoch unless
  // steps_per_epoch says otherwise); each pass has its own shuffle.
  const EpochSpan span = epoch_span(epoch, run.batches, run.steps);
  if (span.count < run.steps && !run.warned_short) {
    run.warned_short = true;
    mpt::log(LogLevel::warning, "fit: the data ran out after ", span.count, " of steps_per_epoch ", run.steps,
             " batches in epoch ", epoch + 1, "; the epoch ends there and the next one starts a new pass (as Keras)");
  }
  std::vector<std::int64_t> order;  // of the rows, or of a Dataset's batches
  if (o.shuffle && run.n > 0) order = data::permutation(run.n, run.seed + static_cast<std::uint64_t>(span.pass));
  // A resumed epoch (BackupAndRestore) starts after the batches its backup had taken, in the
  // same order (the permutation depends only on the seed and the pass).
  const std::int64_t start = std::min(first_step, span.count);
  std::optional<detail::BatchStager> stager;
  std::optional<detail::DatasetFeeder> feeder;
  // A Dataset under a strategy of W ranks: global step g takes the pass's positions
  // [g·W, g·W + W), one batch per rank (rank r position g·W + r), so the ranks see disjoint
  // batches covering the pass; a rank past the end of the data takes no rows that step.
  const std::int64_t world = run.dp ? run.dp->size() : 1, rank = run.dp ? run.dp->rank() : 0;
  auto position = [&](std::int64_t step) { return (span.first + step) * world + rank; };
  auto has_batch = [&](std::int64_t step) { return run.n < 0 || position(step) < run.n; };
  if (run.ds) {
    // Its batch indices this epoch, in the pass's order; an endless dataset (n = -1) goes on
    // counting.
    std::vector<std::int64_t> indices;
    for (std::int64_t s = start; s < span.count; ++s) {
      if (!has_batch(s)) continue;
      const std::int64_t p = position(s);
      indices.push_back(order.empty() ? p : order[static_cast<std::size_t>(p)]);
    }
    feeder.emplace(*run.ds, std::move(indices), o.workers, o.max_queue_size,
                   [this, &run](data::Batch b) {
                     return prepare_batch("fit", std::move(b), true, run.classes, run.device);
                   },
                   "fit");
  } else {
    stager.emplace(run.x, run.y, run.w, o.batch_size, std::move(order), run.device, run.dp);
  }
  for (std::int64_t step = start; step < span.count; ++step) {
    const std::int64_t batch = span.first + step;
    detail::StagedBatch b;
    std::int64_t rows = 0;
    double share = 1.0;  // this rank's rows over the global batch's
    if (feeder) {
      if (has_batch(step)) {
        data::Batch d = feeder->next();
        b = {std::move(d.xs), std::move(d.ys), d.sample_weight};
        rows = b.x[0].shape()[0];
      }
      if (run.dp) {  // this rank's share of the global batch's rows
        const double global = run.dp->all_reduce({static_cast<double>(rows)})[0];
        share = global > 0 ? static_cast<double>(rows) / global : 0.0;
      }
    } else {
      b = stager->get(batch, span.first + span.count);
      rows = stager->rows(batch);
      share = static_cast<double>(rows) / static_cast<double>(stager->global_rows(batch));
    }
    for (auto& c : run.cbs) c->on_train_batch_begin(step, {});
    bool keep_gradients = false;
    for (auto& c : run.cbs) keep_gradients = c->wants_gradients(step) || keep_gradients;
    // One input (output): StepData's x (y), as before; several: xs (ys).
    StepData data;
    data.sample_weight = b.w;
    if (b.x.size() == 1) data.x = b.x[0];
    else data.xs = std::move(b.x);
    if (b.y.size() == 1) data.y = b.y[0];
    else data.ys = std::move(b.y);
    StepResult r = run_train_step(data, {keep_gradients, run.dp, share});
    if (keep_gradients)
      for (auto& c : run.cbs) c->on_train_batch_gradients(step, r.variables, r.gradients);
    if (rows > 0) loss_mean.update(r.loss, static_cast<double>(rows));
    skipped += !r.applied;
    if (!r.nonfinite_variables.empty())
      note_overflow(r.nonfinite_variables, epoch, step, o.verbose > 0, lso ? lso->loss_scale() : 1.0, nonfinite_layers);
    // Loss and metrics stay on the device unless a callback reads this batch's logs (the
    // progress bar when it redraws). Batch logs are this rank's; epoch logs are global.
    bool wanted = false;
    for (auto& c : run.cbs) wanted = c->wants_batch_logs(step) || wanted;
    run.logs = wanted ? epoch_logs(loss_mean, nullptr) : Logs{};
    for (auto& c : run.cbs) c->on_train_batch_end(step, run.logs);
    // Keras 3 stops after the batch whose callback set stop_training (then ends the epoch as
    // usual: validation, on_epoch_end). Under data parallelism every rank stops at the same step.
    if (run.dp) stop_training = run.dp->all_reduce({stop_training ? 1.0 : 0.0}, distributed::ReduceOp::max)[0] > 0;
    if (stop_training) break;
  }
  feeder.reset();  // its workers stopped and joined: no get() runs from here on
  if (run.ds) run.ds->on_epoch_end();
  Logs& logs = run.logs;
  logs = epoch_logs(loss_mean, run.dp);
  if ((!run.vx.empty() || run.vds) && (epoch + 1) % o.validation_freq == 0) {  // Keras's _should_eval
    // Keras's fit evaluates with its own callbacks: their on_test_* hooks run here.
    auto val = run.vds ? evaluate_with(*run.vds, {.workers = o.workers, .max_queue_size = o.max_queue_size}, run.cbs)
                       : evaluate_with(run.vx, run.vy,
                                       {.batch_size = o.validation_batch_size.value_or(o.batch_size), .verbose = 0,
                                        .sample_weight = run.vw},
                                       run.cbs);
    for (const auto& [k, v] : val) logs["val_" + k] = v;
  }
  logs["learning_rate"] = optimizer_->learning_rate();
  logs["loss_scale"] = lso ? lso->loss_scale() : 1.0;
  logs["skipped_steps"] = static_cast<double>(skipped);
  epoch_ = epoch + 1;  // callbacks (ModelCheckpoint) save the epochs completed
  for (auto& c : run.cbs) c->on_epoch_end(epoch, logs);
  // A callback that stops on any rank (EarlyStopping sees the same logs everywhere) stops all.
  if (run.dp) stop_training = run.dp->all_reduce({stop_training ? 1.0 : 0.0}, distributed::ReduceOp::max)[0] > 0;
  for (const auto& [k, v] : logs) run.history.history[k].push_back(v);
  run.history.epoch.push_back(epoch);
  run.history.nonfinite_layers.push_back(std::move(nonfinite_layers));
}

namespace {
/// The options every fit checks, whatever its data.
void check_fit_options(const FitOptions& o) {
  MPT_CHECK(o.epochs >= 0 && o.initial_epoch >= 0, "fit: epochs and initial_epoch must be >= 0");
  MPT_CHECK(!o.steps_per_epoch || *o.steps_per_epoch > 0, "fit: steps_per_epoch must be positive, got ",
            o.steps_per_epoch.value_or(0));
  MPT_CHECK(!o.validation_batch_size || *o.validation_batch_size > 0,
            "fit: validation_batch_size must be positive, got ", o.validation_batch_size.value_or(0));
  MPT_CHECK(o.validation_freq > 0, "fit: validation_freq must be a positive number of epochs, got ", o.validation_freq);
  MPT_CHECK(o.workers >= 0, "fit: workers must be >= 0, got ", o.workers);
  MPT_CHECK(o.max_queue_size > 0, "fit: max_queue_size must be positive, got ", o.max_queue_size);
}
}  // namespace

History Model::fit(const Tensor& x, const Tensor& y, FitOptions o) { return fit(Tensors(x), Tensors(y), std::move(o)); }

History Model::fit(const Tensors& x, const Tensors& y, FitOptions o) {
  const std::vector<Tensor>& x_all = x.list();
  const std::vector<Tensor>& y_all = y.list();
  MPT_CHECK(compiled(), "fit: model '", name_, "' is not compiled; call compile() first");
  MPT_CHECK(o.class_weight.empty() || outputs_.size() <= 1,
            "fit: class_weight is only supported for models with a single output; model '", name_, "' has ",
            outputs_.size());
  check_fit_inputs("fit", x_all, y_all, o.batch_size);
  MPT_CHECK(!y_all.empty(), "fit: y is required");
  check_fit_options(o);
  MPT_CHECK(o.validation_split >= 0.0 && o.validation_split < 1.0, "fit: validation_split must be in [0, 1), got ",
            o.validation_split);
  MPT_CHECK(!o.validation_dataset || (!o.validation_data && o.validation_split == 0),
            "fit: validation_dataset cannot be given with validation_data or validation_split");
  if (o.validation_data) {
    check_fit_inputs("fit (validation_data)", o.validation_data->first.list(), o.validation_data->second.list(),
                     o.batch_size);
    MPT_CHECK(!o.validation_data->second.empty(), "fit (validation_data): y is required");
  }
  check_sample_weight("fit", "sample_weight", x_all[0], o.sample_weight);
  MPT_CHECK(!o.validation_sample_weight.defined() || o.validation_data, "fit: validation_sample_weight ",
            to_string(o.validation_sample_weight.shape()), " is given without validation_data");
  if (o.validation_data)
    check_sample_weight("fit", "validation_sample_weight", o.validation_data->first[0], o.validation_sample_weight);
  MPT_CHECK(o.class_weight.empty() || !o.sample_weight.defined(),
            "fit: class_weight and sample_weight cannot be given together (as in Keras); got both");
  for (const auto& [c, w] : o.class_weight) {
    MPT_CHECK(c >= 0, "fit: class_weight has the negative class index ", c, "; classes are indices 0, 1, ...");
    MPT_CHECK(std::isfinite(w), "fit: class_weight of class ", c, " is ", w, "; weights must be finite");
  }
  FitRun run{o};
  Split split = split_validation(x_all, y_all, o);
  run.x = split.x, run.y = split.y, run.w = split.w, run.vx = split.vx, run.vy = split.vy, run.vw = split.vw;
  run.vds = o.validation_dataset;
  run.n = run.x[0].shape()[0];
  MPT_CHECK(run.n > 0, "fit: no training samples");
  check_targets("fit", run.x, run.y);
  if (!o.class_weight.empty()) run.w = class_sample_weights(run.y[0], o.class_weight);
  run.batches = data::batch_count(run.n, o.batch_size);
  run.steps = o.steps_per_epoch.value_or(run.batches);
  run.dp = distribution();
  return run_fit(run);
}

History Model::fit(data::Dataset& ds, FitOptions o) {
  MPT_CHECK(compiled(), "fit: model '", name_, "' is not compiled; call compile() first");
  check_fit_options(o);
  MPT_CHECK(!o.validation_data && o.validation_split == 0,
            "fit: with a Dataset, validation batches come from validation_dataset (validation_data and "
            "validation_split are for tensors)");
  MPT_CHECK(!o.sample_weight.defined() && o.class_weight.empty(),
            "fit: with a Dataset, sample weights come with its batches (Batch::sample_weight), not as sample_weight "
            "or class_weight");
  const std::int64_t size = ds.size();
  MPT_CHECK(size > 0 || size == -1, "fit: the dataset has no batches (size() = ", size, ")");
  MPT_CHECK(size > 0 || o.steps_per_epoch, "fit: the dataset's size is unknown (size() = -1); give steps_per_epoch");
  FitRun run{o};
  run.ds = &ds, run.vds = o.validation_dataset;
  // Batch 0, read once here: builds the model and resolves the metrics (as Keras peeks).
  const data::Batch first = ds.get(0);
  MPT_CHECK(!first.targets().empty(), "fit: the dataset's batch 0 has no y");
  MPT_CHECK(!first.x.defined() || first.xs.empty(), "fit: the dataset's batch 0 gives both x and xs; give x (one ",
            "input) or xs (several)");
  MPT_CHECK(!first.y.defined() || first.ys.empty(), "fit: the dataset's batch 0 gives both y and ys; give y (one ",
            "output) or ys (several)");
  check_fit_inputs("fit (the dataset's batch 0)", first.inputs(), first.targets(), 1);
  check_sample_weight("fit (the dataset's batch 0)", "sample_weight", first.inputs()[0], first.sample_weight);
  run.classes = check_targets("fit (the dataset's batch 0)", first.inputs(), first.targets());
  run.n = size;
  run.dp = distribution();
  // Under a strategy of W ranks a (global) step takes W batches, one per rank.
  const std::int64_t world = run.dp ? run.dp->size() : 1;
  run.batches = size > 0 ? data::batch_count(size, world) : std::numeric_limits<std::int64_t>::max();
  run.steps = o.steps_per_epoch.value_or(run.batches);
  return run_fit(run);
}

History Model::run_fit(FitRun& run) {
  const FitOptions& o = run.o;
  run.seed = o.seed ? *o.seed : seed_;
  run.device = variables_device();
  distributed::detail::ScopedStrategy scoped(run.dp);  // BatchNormalization's sync option sees it
  const bool chief = !run.dp || run.dp->rank() == 0;
  if (run.dp) agree_across_ranks(*this, *run.dp, run.n, run.vx.empty() ? 0 : run.vx[0].shape()[0], o, run.seed);
  run.cbs = fit_callbacks(o, chief, run.steps);
  for (auto& c : run.cbs) c->set_model(this), c->set_params({o.epochs, run.steps, o.verbose});

  stop_training = false;
  if (trainable_variables().empty() && o.epochs > o.initial_epoch)  // Keras warns too
    mpt::log(LogLevel::warning, "fit: model '", name_, "' has no trainable weights: training changes nothing");
  // The optimizer's slots before the first step (Keras builds the optimizer here too): created
  // during the first step instead, they take the memory its temporaries just freed, and the
  // second step's temporaries need new memory (on a GPU, a cudaMalloc after the first step).
  optimizer_->build(trainable_variables());
  try {
    resume_epoch_ = -1, resume_step_ = 0;
    for (auto& c : run.cbs) c->on_train_begin({});
    int first = o.initial_epoch;
    std::int64_t first_step = 0;
    if (resume_epoch_ >= 0) {  // a callback restored a backup: go on from where it was taken
      first = resume_epoch_, first_step = resume_step_;
      resume_epoch_ = -1, resume_step_ = 0;
    }
    for (int epoch = first; epoch < o.epochs && !stop_training; ++epoch) {
      fit_epoch(run, epoch, epoch == first ? first_step : 0);
    }
    // Keras: with use_ema the model ends fit holding the optimizer's averages.
    if (o.epochs > o.initial_epoch) optimizer_->finalize_variable_values(trainable_variables());
    for (auto& c : run.cbs) c->on_train_end(run.logs);
  } catch (const std::exception& e) {
    // The other ranks are waiting in a collective: tell them, so they stop at once.
    if (run.dp) run.dp->communicator().signal_failure(e.what());
    throw;
  }
  return std::move(run.history);
}

}  // namespace mpt
