#include <filesystem>

#include "callbacks/tensorboard/event_file.hpp"
#include "mpt/callbacks.hpp"
#include "mpt/model.hpp"

namespace mpt::callbacks {

namespace detail {
struct TensorBoardWriters {
  std::unique_ptr<tensorboard::EventFileWriter> train, validation;
};
}  // namespace detail

TensorBoard::TensorBoard(TensorBoardOptions o) : o_(std::move(o)), writers_(std::make_unique<detail::TensorBoardWriters>()) {
  MPT_CHECK(!o_.log_dir.empty(), "TensorBoard: log_dir is empty");
  MPT_CHECK(o_.histogram_freq >= 0, "TensorBoard: histogram_freq must be >= 0, got ", o_.histogram_freq);
  if (const auto* s = std::get_if<std::string>(&o_.update_freq)) {
    MPT_CHECK(*s == "epoch" || *s == "batch", "TensorBoard: update_freq must be \"epoch\", \"batch\" or a number of batches, got '",
              *s, "'");
    freq_ = *s == "batch" ? 1 : 0;
  } else {
    freq_ = std::get<std::int64_t>(o_.update_freq);
    MPT_CHECK(freq_ > 0, "TensorBoard: update_freq must be a positive number of batches, got ", freq_);
  }
}
TensorBoard::TensorBoard(TensorBoard&&) noexcept = default;
TensorBoard::~TensorBoard() = default;

std::string TensorBoard::train_event_file() const { return writers_->train ? writers_->train->path() : ""; }
std::string TensorBoard::validation_event_file() const {
  return writers_->validation ? writers_->validation->path() : "";
}

bool TensorBoard::histogram_epoch() const { return o_.histogram_freq > 0 && epoch_ % o_.histogram_freq == 0; }

void TensorBoard::on_train_begin(const Logs&) {
  // As Keras: batch steps count from the start of each fit; the files stay open across fits.
  global_batch_ = 0;
  if (!writers_->train)
    writers_->train = std::make_unique<tensorboard::EventFileWriter>((std::filesystem::path(o_.log_dir) / "train").string(),
                                                                     "TensorBoard");
}

void TensorBoard::on_train_end(const Logs&) {
  grads_.clear(), grad_vars_.clear();
  if (writers_->train) writers_->train->flush();
  if (writers_->validation) writers_->validation->flush();
}

void TensorBoard::on_epoch_begin(int epoch, const Logs&) {
  epoch_ = epoch;
  grads_.clear(), grad_vars_.clear();
}

void TensorBoard::on_train_batch_begin(std::int64_t, const Logs&) { ++global_batch_; }

bool TensorBoard::wants_batch_logs(std::int64_t) { return freq_ > 0 && global_batch_ % freq_ == 0; }

bool TensorBoard::wants_gradients(std::int64_t) { return histogram_epoch(); }

void TensorBoard::on_train_batch_gradients(std::int64_t, const std::vector<Variable>& variables,
                                           const std::vector<Tensor>& gradients) {
  // Handles only: the last batch's are read at the end of the epoch.
  grad_vars_ = variables, grads_ = gradients;
}

void TensorBoard::on_train_batch_end(std::int64_t, const Logs& logs) {
  if (freq_ == 0 || global_batch_ % freq_ != 0 || logs.empty() || !writers_->train) return;
  for (const auto& [k, v] : logs) writers_->train->add_scalar("batch_" + k, v, global_batch_);
  if (const auto* lso = model() ? model()->loss_scale_optimizer() : nullptr)
    writers_->train->add_scalar("batch_loss_scale", lso->loss_scale(), global_batch_);  // host state
}

void TensorBoard::on_epoch_end(int epoch, Logs& logs) {
  if (!writers_->train) on_train_begin({});
  auto& train = *writers_->train;
  for (const auto& [k, v] : logs)
    if (k.rfind("val_", 0) != 0) train.add_scalar("epoch_" + k, v, epoch);
  for (const auto& [k, v] : logs) {
    if (k.rfind("val_", 0) != 0) continue;
    if (!writers_->validation)
      writers_->validation = std::make_unique<tensorboard::EventFileWriter>(
          (std::filesystem::path(o_.log_dir) / "validation").string(), "TensorBoard");
    const std::string name = k.substr(4);
    writers_->validation->add_scalar("epoch_" + name, v, epoch);
    if (model() && model()->compiled())
      writers_->validation->add_scalar("evaluation_" + name + "_vs_iterations", v, model()->optimizer().iterations());
  }
  if (histogram_epoch() && model()) {
    for (const auto& var : model()->variables())
      train.add_histogram(var.path() + "/histogram", tensorboard::histogram(var.value().to_vector<double>()), epoch);
    for (std::size_t i = 0; i < grads_.size() && i < grad_vars_.size(); ++i)
      if (grads_[i].defined())
        train.add_histogram(grad_vars_[i].path() + "/gradient/histogram",
                            tensorboard::histogram(grads_[i].to_vector<double>()), epoch);
  }
  grads_.clear(), grad_vars_.clear();
  train.flush();
  if (writers_->validation) writers_->validation->flush();
}

}  // namespace mpt::callbacks
