#pragma once
/// Callbacks for fit: EarlyStopping, LambdaCallback, CSVLogger, ModelCheckpoint, TensorBoard,
/// and the progress bar that fit adds by itself for verbose > 0.
///
///   model.fit(x, y, {.epochs = 50, .callbacks = {mpt::callbacks::EarlyStopping(
///                        {.monitor = "val_loss", .patience = 3, .restore_best_weights = true})}});
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "mpt/tensor.hpp"
#include "mpt/variable.hpp"

namespace mpt {
class Model;
using Logs = std::map<std::string, double>;
}  // namespace mpt

namespace mpt::callbacks {

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_begin(const Logs& logs) {}
  virtual void on_train_end(const Logs& logs) {}
  virtual void on_epoch_begin(int epoch, const Logs& logs) {}
  virtual void on_epoch_end(int epoch, Logs& logs) {}
  virtual void on_train_batch_begin(std::int64_t batch, const Logs& logs) {}
  virtual void on_train_batch_end(std::int64_t batch, const Logs& logs) {}
  /// evaluate(), and fit's validation at the end of an epoch (with fit's callbacks), as Keras:
  /// on_test_end gets the results. Batch hooks get empty logs (the running loss stays on the
  /// device).
  virtual void on_test_begin(const Logs& logs) {}
  virtual void on_test_end(const Logs& logs) {}
  virtual void on_test_batch_begin(std::int64_t batch, const Logs& logs) {}
  virtual void on_test_batch_end(std::int64_t batch, const Logs& logs) {}
  /// predict(), with PredictOptions::callbacks.
  virtual void on_predict_begin(const Logs& logs) {}
  virtual void on_predict_end(const Logs& logs) {}
  virtual void on_predict_batch_begin(std::int64_t batch, const Logs& logs) {}
  virtual void on_predict_batch_end(std::int64_t batch, const Logs& logs) {}
  /// Whether on_train_batch_end(batch) will read its logs. fit keeps the loss and metrics on the
  /// device and reads them back only for batches some callback asks for; the others get empty
  /// logs. A callback that never reads batch logs returns false (the built-in ones do).
  virtual bool wants_batch_logs(std::int64_t batch) { return true; }
  /// Whether fit should pass batch `batch`'s gradients to on_train_batch_gradients (asked after
  /// on_train_batch_begin). Keeping them costs no host read; reading them does.
  virtual bool wants_gradients(std::int64_t batch) { return false; }
  /// The gradients the optimizer got (unscaled, float32, on the model's device; inf/NaN where a
  /// LossScaleOptimizer skipped the step), in the order of `variables`. Before on_train_batch_end.
  virtual void on_train_batch_gradients(std::int64_t batch, const std::vector<Variable>& variables,
                                        const std::vector<Tensor>& gradients) {}
  /// Under data parallelism, whether only rank 0 runs this callback (those that print or write
  /// files: the progress bar, ModelCheckpoint, CSVLogger, TensorBoard). The others run on every
  /// rank and see the same, reduced, epoch logs.
  virtual bool chief_only() const { return false; }
  /// Set by fit before on_train_begin.
  void set_model(Model* model) { model_ = model; }
  Model* model() const { return model_; }
  /// Keras's callback params: the fit's epochs, steps per epoch and verbosity (set by fit before
  /// on_train_begin; zeros outside fit).
  struct Params {
    int epochs = 0;
    std::int64_t steps = 0;
    int verbose = 0;
  };
  void set_params(const Params& p) { params_ = p; }
  const Params& params() const { return params_; }

 private:
  Model* model_ = nullptr;
  Params params_;
};

/// A callback argument: an object (moved in) or a shared one.
class CallbackArg {
 public:
  CallbackArg(std::shared_ptr<Callback> c) : ptr_(std::move(c)) {}  // NOLINT
  template <class C>
    requires std::derived_from<C, Callback>
  CallbackArg(std::shared_ptr<C> c) : ptr_(std::move(c)) {}  // NOLINT: a shared TensorBoard, EarlyStopping, ...
  template <class C>
    requires std::derived_from<std::decay_t<C>, Callback>
  CallbackArg(C&& c) : ptr_(std::make_shared<std::decay_t<C>>(std::forward<C>(c))) {}  // NOLINT
  const std::shared_ptr<Callback>& get() const { return ptr_; }

 private:
  std::shared_ptr<Callback> ptr_;
};

struct EarlyStoppingOptions {
  std::string monitor = "val_loss";
  double min_delta = 0.0;
  int patience = 0;
  int verbose = 0;
  std::string mode = "auto";  ///< min, max, or auto (max for accuracy-like names)
  std::optional<double> baseline = std::nullopt;
  bool restore_best_weights = false;
  int start_from_epoch = 0;
};
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions o = {});
  bool wants_batch_logs(std::int64_t) override { return false; }
  void on_train_begin(const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_train_end(const Logs& logs) override;
  int stopped_epoch() const { return stopped_epoch_; }
  int best_epoch() const { return best_epoch_; }

 private:
  bool improved(double value, double reference) const;
  EarlyStoppingOptions o_;
  bool maximize_ = false;
  int wait_ = 0, stopped_epoch_ = 0, best_epoch_ = 0;
  double best_ = 0;
  std::vector<Tensor> best_weights_;
};

struct LambdaCallback : public Callback {
  std::function<void(const Logs&)> train_begin, train_end;
  std::function<void(int, const Logs&)> epoch_begin, epoch_end;
  std::function<void(std::int64_t, const Logs&)> batch_begin, batch_end;

  void on_train_begin(const Logs& l) override { if (train_begin) train_begin(l); }
  void on_train_end(const Logs& l) override { if (train_end) train_end(l); }
  void on_epoch_begin(int e, const Logs& l) override { if (epoch_begin) epoch_begin(e, l); }
  void on_epoch_end(int e, Logs& l) override { if (epoch_end) epoch_end(e, l); }
  bool wants_batch_logs(std::int64_t) override { return static_cast<bool>(batch_end); }
  void on_train_batch_begin(std::int64_t b, const Logs& l) override { if (batch_begin) batch_begin(b, l); }
  void on_train_batch_end(std::int64_t b, const Logs& l) override { if (batch_end) batch_end(b, l); }
};

/// Stops fit after the first batch whose loss is NaN or infinite (a bfloat16 run has no
/// loss-scale guard to skip such steps), printing "Batch N: Invalid loss, terminating training".
class TerminateOnNaN : public Callback {
 public:
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  /// The batch that stopped training, or -1.
  std::int64_t stopped_batch() const { return stopped_batch_; }

 private:
  std::int64_t stopped_batch_ = -1;
};

struct SwapEMAWeightsOptions {
  /// Also keep the averages in the model from each epoch's end to the next epoch's start (so
  /// that ModelCheckpoint and the like see them); fit ends with the averages either way.
  bool swap_on_epoch = false;
};
/// Keras's SwapEMAWeights: evaluation (fit's validation, evaluate, predict with this callback)
/// runs with the optimizer's EMA averages in the model, the training weights swapped back after.
/// The optimizer (a LossScaleOptimizer's inner one) needs use_ema; otherwise the first swap is an
/// mpt::Error saying so.
///
///   model.compile({.optimizer = mpt::optimizers::Adam({.use_ema = true}), .loss = "mse"});
///   model.fit(x, y, {.validation_split = 0.1, .callbacks = {mpt::callbacks::SwapEMAWeights()}});
class SwapEMAWeights : public Callback {
 public:
  explicit SwapEMAWeights(SwapEMAWeightsOptions o = {}) : o_(o) {}
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_test_begin(const Logs& logs) override;
  void on_test_end(const Logs& logs) override;
  void on_predict_begin(const Logs& logs) override;
  void on_predict_end(const Logs& logs) override;
  bool wants_batch_logs(std::int64_t) override { return false; }
  /// Whether the model holds the averages now.
  bool ema_weights_in_model() const { return in_model_; }

 private:
  void swap();
  SwapEMAWeightsOptions o_;
  bool in_model_ = false;
};

struct BackupAndRestoreOptions {
  /// "epoch": back up at each epoch's end; a number: every that many batches (and a resumed
  /// fit starts at the batch after the backup, with the same order and random streams).
  std::variant<std::string, std::int64_t> save_freq = std::string("epoch");
  /// Keep the previous backup too (latest.mpt.h5.bkp): a backup that fails to load falls back to it.
  bool double_checkpoint = false;
  /// Remove the backup when fit completes.
  bool delete_checkpoint = true;
};
/// Keras's BackupAndRestore: a fit that was killed (SIGKILL, a preempted machine) and is started
/// again with the same model, compile and fit arguments goes on from the latest backup and ends
/// with the weights of an uninterrupted run. The backup is an mpt full checkpoint
/// (`<backup_dir>/latest.mpt.h5`: weights, optimizer slots, loss scale, random state, and the
/// epoch and batch it was taken at), written atomically, so a kill mid-write leaves the previous
/// one. The directory belongs to this callback (as in Keras).
///
///   mpt::callbacks::BackupAndRestore backup("/tmp/backup", {.save_freq = std::int64_t{100}});
///   model.fit(x, y, {.epochs = 10, .callbacks = {backup}});   // run again after a crash
class BackupAndRestore : public Callback {
 public:
  explicit BackupAndRestore(std::string backup_dir, BackupAndRestoreOptions o = {});
  void on_train_begin(const Logs& logs) override;
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_train_end(const Logs& logs) override;
  bool wants_batch_logs(std::int64_t) override { return false; }
  /// The backup file.
  const std::string& backup_path() const { return path_; }
  /// Where the latest fit resumed: (epoch, batch), or (-1, 0) when it started afresh.
  std::pair<int, std::int64_t> resumed_from() const { return resumed_; }

 private:
  void save(int epoch, std::int64_t batch);
  bool restore(const std::string& path);
  std::string dir_, path_;
  BackupAndRestoreOptions o_;
  std::int64_t freq_ = 0;  // batches between backups; 0: every epoch
  std::int64_t since_ = 0;
  int epoch_ = 0;
  std::pair<int, std::int64_t> resumed_{-1, 0};
};

/// Keras's LearningRateScheduler: at each epoch's start, the optimizer's rate becomes
/// schedule(epoch, current rate); each epoch's logs get "learning_rate".
class LearningRateScheduler : public Callback {
 public:
  explicit LearningRateScheduler(std::function<double(int epoch, double learning_rate)> schedule, int verbose = 0);
  bool wants_batch_logs(std::int64_t) override { return false; }
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;

 private:
  std::function<double(int, double)> schedule_;
  int verbose_;
};

struct ReduceLROnPlateauOptions {
  std::string monitor = "val_loss";
  double factor = 0.1;  ///< < 1
  int patience = 10;
  int verbose = 0;
  std::string mode = "auto";  ///< min, max, or auto (max when the name holds "acc")
  double min_delta = 1e-4;
  int cooldown = 0;
  double min_lr = 0.0;
};
/// Keras's ReduceLROnPlateau: when `monitor` has not improved by min_delta for `patience`
/// epochs, the rate is multiplied by factor (not below min_lr), then `cooldown` epochs pass
/// before counting again; each epoch's logs get "learning_rate".
class ReduceLROnPlateau : public Callback {
 public:
  explicit ReduceLROnPlateau(ReduceLROnPlateauOptions o = {});
  bool wants_batch_logs(std::int64_t) override { return false; }
  void on_train_begin(const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;

 private:
  ReduceLROnPlateauOptions o_;
  bool maximize_ = false;
  double best_ = 0;
  int wait_ = 0, cooldown_counter_ = 0;
};

struct CSVLoggerOptions {
  char separator = ',';
  bool append = false;
};
/// Writes "epoch,<log keys sorted>" then one row per epoch, as Keras: when the first epoch has no
/// val_ entries (no validation, or validation_freq > 1) each column gets a val_ twin up front,
/// and a value an epoch does not have is written "NA".
class CSVLogger : public Callback {
 public:
  explicit CSVLogger(std::string filename, CSVLoggerOptions o = {});
  bool wants_batch_logs(std::int64_t) override { return false; }
  bool chief_only() const override { return true; }
  void on_train_begin(const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;

 private:
  std::string filename_;
  CSVLoggerOptions o_;
  std::vector<std::string> keys_;
  bool header_written_ = false;
};

struct ModelCheckpointOptions {
  std::string monitor = "val_loss";
  int verbose = 0;
  /// Save only when `monitor` improves on the best value seen (a missing value saves, as Keras).
  bool save_best_only = false;
  /// save_weights (".weights.h5" Keras 3 layout, ".h5" legacy) instead of a full checkpoint.
  bool save_weights_only = false;
  std::string mode = "auto";  ///< min, max, or auto (min for losses, max for accuracy-like names)
  /// "epoch", or save every that many batches.
  std::variant<std::string, std::int64_t> save_freq = std::string("epoch");
  std::optional<double> initial_value_threshold = std::nullopt;  ///< the best value to beat at first
};
/// Saves the model during fit: a full checkpoint (model.save, for load_model and exact resume)
/// or its weights. `filepath` takes {epoch} (1-based), {batch} and any log field, with Python
/// format specs, as Keras:
///
///   mpt::callbacks::ModelCheckpoint("ckpt/model-{epoch:02d}-{val_loss:.2f}.h5",
///                                   {.monitor = "val_loss", .save_best_only = true})
///
/// Every save is atomic (a temporary file renamed over the target).
class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(std::string filepath, ModelCheckpointOptions o = {});
  /// Only for the batches it saves at (save_freq in batches).
  bool wants_batch_logs(std::int64_t batch) override;
  bool chief_only() const override { return true; }
  void on_train_begin(const Logs& logs) override;
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  /// The best monitored value so far (NaN before the first).
  double best() const { return best_; }
  /// The file name for `epoch` (0-based, written 1-based), `batch` (0-based; -1 for none) and logs.
  std::string file_path(int epoch, std::int64_t batch, const Logs& logs) const;

 private:
  void save(int epoch, std::int64_t batch, const Logs& logs);
  std::string filepath_;
  ModelCheckpointOptions o_;
  bool maximize_ = false;
  std::int64_t freq_ = 0;  ///< batches between saves; 0 = every epoch
  std::int64_t batches_since_save_ = 0;
  int current_epoch_ = 0;
  double best_;
};

struct TensorBoardOptions {
  std::string log_dir = "logs";
  /// "epoch" (scalars once per epoch), "batch" (every batch too), or every that many batches.
  std::variant<std::string, std::int64_t> update_freq = std::string("epoch");
  /// Weight and gradient histograms every that many epochs; 0 = none.
  int histogram_freq = 0;
};
namespace detail {
struct TensorBoardWriters;
}
/// Keras's TensorBoard callback: event files TensorBoard reads, in
/// `<log_dir>/train/events.out.tfevents.*.v2` and `<log_dir>/validation/...`:
///
///   model.fit(x, y, {.epochs = 5, .validation_split = 0.1,
///                    .callbacks = {mpt::callbacks::TensorBoard({.log_dir = "logs/run1", .histogram_freq = 1})}});
///   // then: tensorboard --logdir logs
///
/// Per epoch (step = epoch): `epoch_<name>` for every log entry, loss, metrics, `learning_rate`,
/// `loss_scale` and `skipped_steps` under train/, the `val_*` entries under validation/ (without
/// the prefix) with `evaluation_<name>_vs_iterations` (step = optimizer iterations). With
/// update_freq N: `batch_<name>` (running epoch means, and `batch_loss_scale`) every N batches
/// (step = batches since fit began, 1-based); only those batches' logs are read back from the
/// device. Every histogram_freq epochs: `<layer>/<variable>/histogram` for every weight and
/// `<layer>/<variable>/gradient/histogram` for the gradients of that epoch's last batch (30
/// buckets, as TensorFlow). mpt::Error names TensorBoard and the path it cannot write.
class TensorBoard : public Callback {
 public:
  explicit TensorBoard(TensorBoardOptions o = {});
  TensorBoard(TensorBoard&&) noexcept;
  ~TensorBoard() override;
  bool wants_batch_logs(std::int64_t batch) override;
  bool chief_only() const override { return true; }
  bool wants_gradients(std::int64_t batch) override;
  void on_train_begin(const Logs& logs) override;
  void on_train_end(const Logs& logs) override;
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_train_batch_begin(std::int64_t batch, const Logs& logs) override;
  void on_train_batch_gradients(std::int64_t batch, const std::vector<Variable>& variables,
                                const std::vector<Tensor>& gradients) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  /// The event files written so far ("" before fit; validation's before the first val_* log).
  std::string train_event_file() const;
  std::string validation_event_file() const;

 private:
  bool histogram_epoch() const;
  TensorBoardOptions o_;
  std::int64_t freq_ = 0;  ///< batches between batch scalars; 0 = per epoch only
  std::int64_t global_batch_ = 0;
  int epoch_ = 0;
  std::vector<Variable> grad_vars_;
  std::vector<Tensor> grads_;
  std::unique_ptr<detail::TensorBoardWriters> writers_;
};

/// Keras's progress bar: verbose 1 = a live bar with ETA and time per step; 2 = one line per
/// epoch. fit adds it itself.
class ProgbarLogger : public Callback {
 public:
  ProgbarLogger(int verbose, std::int64_t steps, int epochs);
  /// True for the batches it redraws at (at most ten a second, and the last).
  bool wants_batch_logs(std::int64_t batch) override;
  bool chief_only() const override { return true; }
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;

 private:
  void render(std::int64_t current, const Logs& logs, bool final);
  int verbose_;
  std::int64_t steps_;
  int epochs_;
  double start_ = 0, last_render_ = 0;
  bool tty_;
  bool redraw_ = false;  // wants_batch_logs said yes for the coming on_train_batch_end
};

}  // namespace mpt::callbacks
