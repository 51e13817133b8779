// Model::fit: the epoch loop and its parts (validation split, cross-rank agreement, the
// callbacks a fit runs, overflow diagnostics, epoch logs). The step itself is train_step
// (model.cpp); batches come from BatchStager (batch_stager.hpp).
#include <algorithm>
#include <cmath>

#include "model/batch_stager.hpp"
#include "mpt/data/data.hpp"
#include "mpt/log.hpp"
#include "mpt/model.hpp"

namespace mpt {

/// The state of one fit call, shared by its epochs.
struct Model::FitRun {
  explicit FitRun(const FitOptions& options) : o(options) {}
  const FitOptions& o;
  Tensor x, y, vx, vy;  // training and validation data
  std::int64_t n = 0, steps = 0;
  const distributed::DataParallel* dp = nullptr;
  std::vector<std::shared_ptr<callbacks::Callback>> cbs;
  std::uint64_t seed = 0;
  Device device;
  Logs logs;
  History history;
};

namespace {

/// Keras's validation_split: the last fraction of the data, taken before any shuffling; or the
/// validation_data given.
void split_validation(const Tensor& x_all, const Tensor& y_all, const FitOptions& o, Tensor& x, Tensor& y,
                      Tensor& vx, Tensor& vy) {
  x = x_all, y = y_all;
  if (o.validation_data) {
    vx = o.validation_data->first, vy = o.validation_data->second;
  } else if (o.validation_split > 0) {
    const std::int64_t n = x_all.shape()[0];
    const auto split = static_cast<std::int64_t>(std::ceil(static_cast<double>(n) * (1.0 - o.validation_split)));
    MPT_CHECK(split > 0 && split < n, "fit: validation_split ", o.validation_split,
              " leaves no training or no validation samples out of ", n);
    x = x_all.slice(0, split), y = y_all.slice(0, split);
    vx = x_all.slice(split, n), vy = y_all.slice(split, n);
  }
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
  lines.push_back("loss " + model.loss().name());
  lines.push_back("training samples " + std::to_string(n) + ", validation samples " + std::to_string(n_val));
  lines.push_back("batch_size " + std::to_string(o.batch_size) + ", epochs " + std::to_string(o.initial_epoch) + ".." +
                  std::to_string(o.epochs) + ", shuffle " + std::to_string(o.shuffle) + ", seed " +
                  std::to_string(seed));
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

Logs Model::epoch_logs(const metrics::Mean& loss_mean, const distributed::DataParallel* strategy) const {
  const auto values = reduced_results(strategy, loss_mean, metrics_);
  Logs l;
  l["loss"] = values[0];
  for (std::size_t i = 0; i < metrics_.size(); ++i) l[metrics_[i]->name()] = values[i + 1];
  return l;
}

void Model::fit_epoch(FitRun& run, int epoch) {
  const FitOptions& o = run.o;
  auto* lso = loss_scale_optimizer();
  for (auto& c : run.cbs) c->on_epoch_begin(epoch, {});
  for (auto& m : metrics_) m->reset_state();
  metrics::Mean loss_mean("loss");
  std::int64_t skipped = 0;
  std::map<std::string, std::int64_t> nonfinite_layers;
  detail::BatchStager batches(
      run.x, run.y, o.batch_size,
      o.shuffle ? data::permutation(run.n, run.seed + static_cast<std::uint64_t>(epoch)) : std::vector<std::int64_t>{},
      run.device, run.dp);
  for (std::int64_t step = 0; step < run.steps; ++step) {
    auto [xb, yb] = batches.get(step);
    for (auto& c : run.cbs) c->on_train_batch_begin(step, {});
    bool keep_gradients = false;
    for (auto& c : run.cbs) keep_gradients = c->wants_gradients(step) || keep_gradients;
    const std::int64_t rows = batches.rows(step);
    StepResult r = train_step(xb, yb, keep_gradients, run.dp,
                              static_cast<double>(rows) / static_cast<double>(batches.global_rows(step)));
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
  Logs& logs = run.logs;
  logs = epoch_logs(loss_mean, run.dp);
  if (run.vx.defined()) {
    auto val = evaluate(run.vx, run.vy, {.batch_size = o.batch_size, .verbose = 0});
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

History Model::fit(const Tensor& x_all, const Tensor& y_all, FitOptions o) {
  MPT_CHECK(compiled(), "fit: model '", name_, "' is not compiled; call compile() first");
  check_fit_inputs("fit", x_all, y_all, o.batch_size);
  MPT_CHECK(y_all.defined(), "fit: y is required");
  MPT_CHECK(o.epochs >= 0 && o.initial_epoch >= 0, "fit: epochs and initial_epoch must be >= 0");
  MPT_CHECK(o.validation_split >= 0.0 && o.validation_split < 1.0, "fit: validation_split must be in [0, 1), got ",
            o.validation_split);
  if (o.validation_data) check_fit_inputs("fit (validation_data)", o.validation_data->first, o.validation_data->second,
                                          o.batch_size);
  FitRun run{o};
  split_validation(x_all, y_all, o, run.x, run.y, run.vx, run.vy);
  run.n = run.x.shape()[0];
  MPT_CHECK(run.n > 0, "fit: no training samples");
  check_targets("fit", run.x, run.y);
  run.steps = data::batch_count(run.n, o.batch_size);
  run.dp = distribution();
  run.seed = o.seed ? *o.seed : seed_;
  run.device = variables_device();
  distributed::detail::ScopedStrategy scoped(run.dp);  // BatchNormalization's sync option sees it
  const bool chief = !run.dp || run.dp->rank() == 0;
  if (run.dp) agree_across_ranks(*this, *run.dp, run.n, run.vx.defined() ? run.vx.shape()[0] : 0, o, run.seed);
  run.cbs = fit_callbacks(o, chief, run.steps);
  for (auto& c : run.cbs) c->set_model(this);

  stop_training = false;
  if (trainable_variables().empty() && o.epochs > o.initial_epoch)  // Keras warns too
    mpt::log(LogLevel::warning, "fit: model '", name_, "' has no trainable weights: training changes nothing");
  // The optimizer's slots before the first step (Keras builds the optimizer here too): created
  // during the first step instead, they take the memory its temporaries just freed, and the
  // second step's temporaries need new memory (on a GPU, a cudaMalloc after the first step).
  optimizer_->build(trainable_variables());
  try {
    for (auto& c : run.cbs) c->on_train_begin({});
    for (int epoch = o.initial_epoch; epoch < o.epochs && !stop_training; ++epoch) fit_epoch(run, epoch);
    for (auto& c : run.cbs) c->on_train_end(run.logs);
  } catch (const std::exception& e) {
    // The other ranks are waiting in a collective: tell them, so they stop at once.
    if (run.dp) run.dp->communicator().signal_failure(e.what());
    throw;
  }
  return std::move(run.history);
}

}  // namespace mpt
