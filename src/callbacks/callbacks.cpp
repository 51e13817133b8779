#include "mpt/callbacks.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>

#include "io/checked_file.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_access.hpp"
#include "mpt/log.hpp"
#include "mpt/model.hpp"

namespace mpt::callbacks {

// ---- EarlyStopping ------------------------------------------------------------------------
EarlyStopping::EarlyStopping(EarlyStoppingOptions o) : o_(std::move(o)) {
  MPT_CHECK(o_.mode == "auto" || o_.mode == "min" || o_.mode == "max", "EarlyStopping: mode must be auto, min or max, got '",
            o_.mode, "'");
  maximize_ = o_.mode == "max" ||
              (o_.mode == "auto" && (o_.monitor.find("acc") != std::string::npos || o_.monitor.find("auc") != std::string::npos));
}

void TerminateOnNaN::on_train_batch_end(std::int64_t batch, const Logs& logs) {
  const auto it = logs.find("loss");
  if (it == logs.end() || std::isfinite(it->second)) return;
  std::cout << "Batch " << batch << ": Invalid loss, terminating training" << std::endl;
  stopped_batch_ = batch;
  model()->stop_training = true;
}

namespace {
/// The optimizer that keeps the averages: a LossScaleOptimizer's inner one, else the model's.
optimizers::Optimizer& ema_optimizer(Model& m) {
  MPT_CHECK(m.compiled(), "SwapEMAWeights: model '", m.name(), "' is not compiled");
  auto* lso = m.loss_scale_optimizer();
  return lso ? lso->inner_optimizer() : m.optimizer();
}
}  // namespace

void SwapEMAWeights::swap() {
  MPT_CHECK(model() != nullptr, "SwapEMAWeights: not attached to a model (pass it to fit, evaluate or predict)");
  ema_optimizer(*model()).swap_ema_weights(model()->trainable_variables());
  in_model_ = !in_model_;
}

void SwapEMAWeights::on_epoch_begin(int, const Logs&) {
  if (o_.swap_on_epoch && in_model_) swap();
}

void SwapEMAWeights::on_epoch_end(int epoch, Logs&) {
  if (!o_.swap_on_epoch || in_model_) return;
  swap();
  // Keras: at the last epoch the averages take the (swapped-in) EMA values, so that fit's
  // finalize_variable_values, which installs the averages, leaves the EMA weights in the model.
  if (epoch == params().epochs - 1) ema_optimizer(*model()).set_ema_from_variables(model()->trainable_variables());
}

void SwapEMAWeights::on_test_begin(const Logs&) {
  if (!in_model_) swap();
}

void SwapEMAWeights::on_test_end(const Logs&) {
  if (in_model_) swap();
}

void SwapEMAWeights::on_predict_begin(const Logs&) {
  if (!in_model_) swap();
}

void SwapEMAWeights::on_predict_end(const Logs&) {
  if (in_model_) swap();
}

BackupAndRestore::BackupAndRestore(std::string backup_dir, BackupAndRestoreOptions o)
    : dir_(std::move(backup_dir)), o_(std::move(o)) {
  MPT_CHECK(!dir_.empty(), "BackupAndRestore: empty backup_dir");
  if (const auto* f = std::get_if<std::int64_t>(&o_.save_freq)) {
    MPT_CHECK(*f > 0, "BackupAndRestore: save_freq must be \"epoch\" or a positive number of batches, got ", *f);
    freq_ = *f;
  } else {
    const std::string& name = std::get<std::string>(o_.save_freq);
    MPT_CHECK(name == "epoch", "BackupAndRestore: save_freq must be \"epoch\" or a positive number of batches, got \"",
              name, "\"");
  }
  path_ = (std::filesystem::path(dir_) / "latest.mpt.h5").string();
}

bool BackupAndRestore::restore(const std::string& path) {
  if (!std::filesystem::exists(path)) return false;
  const io::Json state = io::restore_checkpoint(*model(), path);
  const io::Json* b = io::find(state, "backup");
  MPT_CHECK(b != nullptr, "BackupAndRestore: '", path, "' is a checkpoint without a backup position");
  const int epoch = static_cast<int>(io::as_int(io::at(*b, "epoch", path), path + ", backup epoch"));
  const std::int64_t batch = io::as_int(io::at(*b, "batch", path), path + ", backup batch");
  MPT_CHECK(epoch >= 0 && batch >= 0, "BackupAndRestore: '", path, "' has a bad position (epoch ", epoch, ", batch ",
            batch, ")");
  mpt::detail::CheckpointAccess::set_resume_point(*model(), epoch, batch);
  resumed_ = {epoch, batch};
  return true;
}

void BackupAndRestore::on_train_begin(const Logs&) {
  MPT_CHECK(model() != nullptr && model()->compiled(), "BackupAndRestore: the model must be compiled");
  resumed_ = {-1, 0};
  since_ = 0;
  const std::string prev = path_ + ".bkp";
  try {
    restore(path_);
  } catch (const Error& e) {
    // As Keras: a backup that does not load falls back to the previous one when there is one.
    if (!o_.double_checkpoint || !std::filesystem::exists(prev)) throw;
    mpt::log(LogLevel::warning, "BackupAndRestore: ", e.what(), "; restoring the previous backup '", prev, "'");
    restore(prev);
  }
}

void BackupAndRestore::on_epoch_begin(int epoch, const Logs&) { epoch_ = epoch; }

void BackupAndRestore::save(int epoch, std::int64_t batch) {
  if (const auto* dp = model()->distribution(); dp && dp->rank() != 0) return;  // rank 0 writes for all
  std::filesystem::create_directories(dir_);
  if (o_.double_checkpoint && std::filesystem::exists(path_)) std::filesystem::copy_file(
      path_, path_ + ".bkp", std::filesystem::copy_options::overwrite_existing);
  io::save_checkpoint(*model(), path_, io::Json{{"backup", {{"epoch", epoch}, {"batch", batch}}}});
}

void BackupAndRestore::on_train_batch_end(std::int64_t batch, const Logs&) {
  if (freq_ == 0 || ++since_ < freq_) return;
  since_ = 0;
  save(epoch_, batch + 1);  // the next fit starts after this batch
}

void BackupAndRestore::on_epoch_end(int epoch, Logs&) {
  if (freq_ == 0) save(epoch + 1, 0);
}

void BackupAndRestore::on_train_end(const Logs&) {
  if (!o_.delete_checkpoint) return;
  std::error_code ec;
  std::filesystem::remove(path_, ec);
  std::filesystem::remove(path_ + ".bkp", ec);
}

LearningRateScheduler::LearningRateScheduler(std::function<double(int, double)> schedule, int verbose)
    : schedule_(std::move(schedule)), verbose_(verbose) {
  MPT_CHECK(static_cast<bool>(schedule_), "LearningRateScheduler: needs a schedule function");
}

void LearningRateScheduler::on_epoch_begin(int epoch, const Logs&) {
  auto& opt = model()->optimizer();
  const double lr = schedule_(epoch, opt.learning_rate());
  MPT_CHECK(std::isfinite(lr), "LearningRateScheduler: the schedule gave ", lr, " for epoch ", epoch,
            " (it must give a finite number)");
  opt.set_learning_rate(lr);
  if (verbose_ > 0)
    std::cout << "\nEpoch " << epoch + 1 << ": LearningRateScheduler setting learning rate to " << lr << "." << std::endl;
}

void LearningRateScheduler::on_epoch_end(int, Logs& logs) { logs["learning_rate"] = model()->optimizer().learning_rate(); }

ReduceLROnPlateau::ReduceLROnPlateau(ReduceLROnPlateauOptions o) : o_(std::move(o)) {
  MPT_CHECK(o_.factor < 1.0 && o_.factor >= 0.0, "ReduceLROnPlateau: factor must be in [0, 1), got ", o_.factor);
  MPT_CHECK(o_.mode == "auto" || o_.mode == "min" || o_.mode == "max",
            "ReduceLROnPlateau: mode must be auto, min or max, got '", o_.mode, "'");
  MPT_CHECK(o_.patience >= 0 && o_.cooldown >= 0, "ReduceLROnPlateau: patience and cooldown must be >= 0, got ",
            o_.patience, " and ", o_.cooldown);
  maximize_ = o_.mode == "max" || (o_.mode == "auto" && o_.monitor.find("acc") != std::string::npos);
}

void ReduceLROnPlateau::on_train_begin(const Logs&) {
  best_ = maximize_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  wait_ = 0, cooldown_counter_ = 0;
}

void ReduceLROnPlateau::on_epoch_end(int epoch, Logs& logs) {
  // keras.callbacks.ReduceLROnPlateau.on_epoch_end, step for step.
  auto& opt = model()->optimizer();
  logs["learning_rate"] = opt.learning_rate();
  const auto it = logs.find(o_.monitor);
  if (it == logs.end()) {
    std::string keys;
    for (const auto& [k, v] : logs) keys += (keys.empty() ? "" : ", ") + k;
    mpt::log(LogLevel::warning, "ReduceLROnPlateau: learning rate reduction is conditioned on metric '", o_.monitor,
             "', which is not available; available metrics are: ", keys);
    return;
  }
  const double current = it->second;
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    wait_ = 0;
  }
  const bool better = maximize_ ? current > best_ + o_.min_delta : current < best_ - o_.min_delta;
  if (better) {
    best_ = current;
    wait_ = 0;
  } else if (cooldown_counter_ <= 0 && ++wait_ >= o_.patience) {
    const double old_lr = opt.learning_rate();
    // Keras compares its float32 rate variable with np.float32(min_lr).
    if (static_cast<float>(old_lr) > static_cast<float>(o_.min_lr)) {
      const double new_lr = std::max(old_lr * o_.factor, o_.min_lr);
      opt.set_learning_rate(new_lr);
      if (o_.verbose > 0)
        std::cout << "\nEpoch " << epoch + 1 << ": ReduceLROnPlateau reducing learning rate to " << new_lr << "."
                  << std::endl;
      cooldown_counter_ = o_.cooldown;
      wait_ = 0;
    }
  }
}

bool EarlyStopping::improved(double value, double reference) const {
  return maximize_ ? value - o_.min_delta > reference : value + o_.min_delta < reference;
}

void EarlyStopping::on_train_begin(const Logs&) {
  wait_ = 0, stopped_epoch_ = 0, best_epoch_ = 0;
  best_ = o_.baseline ? *o_.baseline : (maximize_ ? -std::numeric_limits<double>::infinity()
                                                  : std::numeric_limits<double>::infinity());
  best_weights_.clear();
}

void EarlyStopping::on_epoch_end(int epoch, Logs& logs) {
  auto it = logs.find(o_.monitor);
  if (it == logs.end()) {
    // An epoch that did not validate (fit's validation_freq) has no val_ logs: Keras skips it.
    bool validated = false;
    for (const auto& kv : logs) validated = validated || kv.first.rfind("val_", 0) == 0;
    if (o_.monitor.rfind("val_", 0) == 0 && !validated) {
      mpt::log(LogLevel::warning, "EarlyStopping: conditioned on '", o_.monitor, "', which epoch ", epoch + 1,
               " did not log (no validation this epoch); skipped");
      return;
    }
    std::string keys;
    for (const auto& [k, v] : logs) keys += (keys.empty() ? "" : ", ") + k;
    fail("EarlyStopping: monitored metric '", o_.monitor, "' is not in the logs (available: ", keys, ")");
  }
  if (epoch < o_.start_from_epoch) return;
  const double value = it->second;
  if (o_.restore_best_weights && best_weights_.empty()) best_weights_ = model()->get_weights();
  ++wait_;
  if (improved(value, best_)) {
    best_ = value, best_epoch_ = epoch;
    if (o_.restore_best_weights) best_weights_ = model()->get_weights();
    if (!o_.baseline || improved(value, *o_.baseline)) wait_ = 0;
    return;
  }
  if (wait_ >= o_.patience && epoch > 0) {
    stopped_epoch_ = epoch;
    model()->stop_training = true;
  }
}

void EarlyStopping::on_train_end(const Logs&) {
  if (stopped_epoch_ > 0 && o_.verbose > 0) std::cout << "Epoch " << stopped_epoch_ + 1 << ": early stopping\n";
  if (o_.restore_best_weights && !best_weights_.empty()) {
    if (o_.verbose > 0) std::cout << "Restoring model weights from the end of the best epoch: " << best_epoch_ + 1 << ".\n";
    model()->set_weights(best_weights_);
  }
}

// ---- CSVLogger ----------------------------------------------------------------------------
CSVLogger::CSVLogger(std::string filename, CSVLoggerOptions o) : filename_(std::move(filename)), o_(o) {}

namespace {
/// Appends text to path whole or not at all: a failed or short write (a full disk, a file-size
/// limit) is cut back to the file's previous end and reported with the OS's reason.
void append_whole(const std::string& path, const std::string& text, bool truncate_first) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (truncate_first ? O_TRUNC : O_APPEND), 0666);
  MPT_CHECK(fd >= 0, "CSVLogger: cannot write '", path, "': ", std::strerror(errno));
  struct stat st {};
  const off_t before = ::fstat(fd, &st) == 0 ? st.st_size : -1;
  std::size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  const bool cut = err != 0 && done > 0 && (before < 0 || ::ftruncate(fd, before) != 0);
  if (::close(fd) != 0 && err == 0) err = errno;
  MPT_CHECK(err == 0, "CSVLogger: writing '", path, "' failed: ", std::strerror(err),
            cut ? " (the file ends in a partial row)" : "");
}
}  // namespace

void CSVLogger::on_train_begin(const Logs&) {
  io::check_writable_file("CSVLogger", filename_);  // a FIFO would block the first write
  header_written_ = false;
  if (o_.append) {
    std::ifstream in(filename_);
    header_written_ = in.good() && in.peek() != std::ifstream::traits_type::eof();
  } else {
    append_whole(filename_, "", true);
  }
}

void CSVLogger::on_epoch_end(int epoch, Logs& logs) {
  if (keys_.empty()) {
    for (const auto& [k, v] : logs) keys_.push_back(k);  // sorted (a std::map), as Keras sorts them
    // Keras: without val_ entries in the first epoch (none, or validation_freq > 1), the columns
    // get a val_ twin each up front, "NA" until an epoch validates.
    const bool has_val = std::any_of(keys_.begin(), keys_.end(), [](const std::string& k) { return k.rfind("val_", 0) == 0; });
    if (!has_val) {
      const std::size_t n = keys_.size();
      for (std::size_t i = 0; i < n; ++i) keys_.push_back("val_" + keys_[i]);
    }
  }
  std::ostringstream out;
  if (!header_written_) {
    out << "epoch";
    for (const auto& k : keys_) out << o_.separator << k;
    out << "\n";
  }
  out << epoch;
  out.precision(17);
  for (const auto& k : keys_) {
    auto it = logs.find(k);
    out << o_.separator;
    if (it != logs.end()) out << it->second;
    else out << "NA";  // as Keras
  }
  out << "\n";
  append_whole(filename_, out.str(), false);
  header_written_ = true;
}

}  // namespace mpt::callbacks
