// Model C on Fashion-MNIST: Conv2D 32 3x3 relu -> MaxPool 2 -> Conv2D 64 3x3 relu -> MaxPool 2 ->
// Flatten -> Dense 128 relu -> Dense 10 -> softmax; Adam 1e-3, batch 128, under a global policy.
// Writes a checkpoint of the trained model (--checkpoint, default fashion_cnn.weights.h5; "" for
// none); --tensorboard DIR logs the run for TensorBoard (scalars every 20 batches and per epoch,
// weight and gradient histograms per epoch), --csv-log PATH keeps History in a CSV file.
// It trains on the default device (a GPU where there is one; MPT_DEVICE=cpu|cuda:N chooses) and
// says which; on a GPU it also prints the device memory the training took: the peak, and how
// many blocks came from cudaMalloc after the first step (0 when the caching allocator served
// every later step, as it should).
//
//   ./fashion_mnist_cnn [--policy mixed_float16|mixed_bfloat16|float32] [--epochs 3] [--batch-size 128]
//                       [--seed 1] [--checkpoint PATH] [--validation-split 0.1] [--tensorboard DIR]
//                       [--csv-log PATH] [--augment none|crop|shift|shift_zoom]
//                       [--validate-on-test] [--cosine-decay]
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

#include "flags.hpp"

namespace layers = mpt::layers;

namespace {

/// The device allocator's new segments (a cudaMalloc each) once the first step has run and at
/// each epoch's end, with the steps before which the later ones happened.
class ReservationLog {
 public:
  explicit ReservationLog(mpt::Device device) : device_(device) {}

  std::shared_ptr<mpt::callbacks::LambdaCallback> callback() {
    auto cb = std::make_shared<mpt::callbacks::LambdaCallback>();
    cb->epoch_begin = [this](int e, const mpt::Logs&) { epoch_ = e; };
    cb->batch_begin = [this](std::int64_t batch, const mpt::Logs&) {
      const std::size_t now = count();
      if (batch == 1 && !first_step_seen_) first_step_seen_ = true, after_first_step_ = now;
      else if (first_step_seen_ && now > last_)
        where_ += " +" + std::to_string(now - last_) + " in epoch " + std::to_string(epoch_ + 1) + " step " +
                  std::to_string(batch);
      last_ = now;
    };
    cb->epoch_end = [this](int e, const mpt::Logs&) {
      const std::size_t now = count();
      if (now > last_) where_ += " +" + std::to_string(now - last_) + " in epoch " + std::to_string(e + 1) + "'s last step";
      last_ = now;
      at_epoch_end_.push_back(now);
    };
    return cb;
  }

  /// "device memory: peak ... MiB; N cudaMalloc in the first step, M after it (per epoch: ...)".
  void report() const {
    if (!first_step_seen_ || at_epoch_end_.empty()) return;
    std::string per_epoch;
    for (std::size_t e = 0; e < at_epoch_end_.size(); ++e)
      per_epoch += (e ? ", " : "") + std::to_string(at_epoch_end_[e] - (e ? at_epoch_end_[e - 1] : after_first_step_));
    std::printf("device memory: peak %.1f MiB; %zu cudaMalloc in the first step, %zu after it (per epoch: %s)%s\n",
                static_cast<double>(mpt::memory_stats(device_).peak_bytes) / (1 << 20), after_first_step_,
                at_epoch_end_.back() - after_first_step_, per_epoch.c_str(), where_.empty() ? "" : (":" + where_).c_str());
  }

 private:
  std::size_t count() const {
    const mpt::MemoryStats m = mpt::memory_stats(device_);
    return m.allocations - m.cache_hits;
  }

  mpt::Device device_;
  std::size_t after_first_step_ = 0, last_ = 0;
  std::vector<std::size_t> at_epoch_end_;
  std::string where_;  // the steps before which later reservations happened
  bool first_step_seen_ = false;
  int epoch_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  bool distributed = false, validate_on_test = false, cosine_decay = false;
  std::string augment = "none";
  std::string policy = "mixed_float16", checkpoint = "fashion_cnn.weights.h5", tensorboard, csv_log;
  double validation_split = 0.0;
  int epochs = 3;
  std::int64_t batch_size = 128;
  std::uint64_t seed = 1;
  CLI::App app{"Model C (a small CNN) on Fashion-MNIST under a global dtype policy"};
  examples::add_policy(app, policy);
  app.add_option("--epochs", epochs, "epochs to train")->check(examples::kPositive)->capture_default_str();
  app.add_option("--batch-size", batch_size, "batch size")->check(examples::kPositive)->capture_default_str();
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--checkpoint", checkpoint, "weights file written after training (\"\" for none)")
      ->capture_default_str();
  app.add_option("--validation-split", validation_split, "fraction of the training data held out")
      ->check(examples::kFraction)
      ->capture_default_str();
  app.add_flag("--cosine-decay", cosine_decay,
               "Adam's learning rate 1e-3 decayed to 0 along a cosine over the run's steps (Keras's CosineDecay)");
  app.add_flag("--validate-on-test", validate_on_test,
               "evaluate on the test set after every epoch (Keras's validation_data=(x_test, y_test)): logged as val_*");
  app.add_option("--tensorboard", tensorboard, "TensorBoard log directory (none by default)");
  app.add_option("--csv-log", csv_log, "CSV file of the History (none by default)");
  app.add_option("--augment", augment,
                 "augmentation layers, active in training only: none; crop (RandomCrop(28, 28) of the image padded by "
                 "2 pixels: shifts of up to 2 pixels); shift (RandomTranslation(0.1, 0.1), nearest pixel); "
                 "shift_zoom (RandomTranslation(0.1, 0.1) and RandomZoom(0.1), bilinear)")
      ->check(CLI::IsMember({"none", "crop", "shift", "shift_zoom"}))
      ->capture_default_str();
  examples::add_distributed(app, distributed);
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  examples::start_distributed(distributed);
  const bool chief = mpt::distributed::is_chief();  // rank 0 (or the only process) prints
  try {
    mpt::set_random_seed(seed);
    mpt::mixed_precision::set_global_policy(policy);
    auto data = mpt::datasets::fashion_mnist::load();

    std::vector<mpt::LayerRef> stack{layers::Input({28, 28, 1})};
    // Augmentation, training only; black (0, the images' background) where a shift uncovers.
    if (augment == "crop") stack.push_back(layers::RandomCrop(28, 28, {.seed = seed + 100, .padding = 2}));
    if (augment == "shift")
      stack.push_back(layers::RandomTranslation(
          0.1, 0.1, {.fill_mode = "constant", .interpolation = "nearest", .seed = seed + 100}));
    if (augment == "shift_zoom") {
      stack.push_back(layers::RandomTranslation(0.1, 0.1, {.fill_mode = "constant", .seed = seed + 100}));
      stack.push_back(layers::RandomZoom(0.1, {.fill_mode = "constant", .seed = seed + 200}));
    }
    for (auto& l : std::vector<mpt::LayerRef>{
        layers::Conv2D(32, {3, 3}, {.activation = "relu"}),
        layers::MaxPooling2D({2, 2}),
        layers::Conv2D(64, {3, 3}, {.activation = "relu"}),
        layers::MaxPooling2D({2, 2}),
        layers::Flatten(),
        layers::Dense(128, {.activation = "relu"}),
        layers::Dense(10),
        layers::Activation("softmax"),
    })
      stack.push_back(l);
    mpt::Sequential model(stack);
    mpt::optimizers::LearningRate learning_rate = 1e-3;
    if (cosine_decay) {  // over the run's steps of the global batch
      namespace schedules = mpt::optimizers::schedules;
      const auto rows = static_cast<std::int64_t>(static_cast<double>(data.x_train.shape()[0]) * (1.0 - validation_split));
      std::shared_ptr<schedules::LearningRateSchedule> cosine = std::make_shared<schedules::CosineDecay>(
          schedules::CosineDecayOptions{.initial_learning_rate = 1e-3,
                                        .decay_steps = epochs * ((rows + batch_size - 1) / batch_size)});
      learning_rate = cosine;
    }
    model.compile({.optimizer = mpt::optimizers::Adam({.learning_rate = learning_rate}),
                   .loss = "sparse_categorical_crossentropy",
                   .metrics = {"accuracy"}});
    if (chief) model.summary();
    std::vector<mpt::callbacks::CallbackArg> callbacks;
    if (!tensorboard.empty())
      callbacks.emplace_back(mpt::callbacks::TensorBoard({.log_dir = tensorboard, .update_freq = 20, .histogram_freq = 1}));
    if (!csv_log.empty()) callbacks.emplace_back(mpt::callbacks::CSVLogger(csv_log));
    const mpt::Device device = mpt::default_device();  // where the model was built
    ReservationLog reservations(device);
    if (!device.is_cpu()) {
      mpt::reset_peak_memory(device);
      callbacks.emplace_back(reservations.callback());
    }
    mpt::History h = model.fit(data.x_train, data.y_train,
                               {.batch_size = batch_size, .epochs = epochs, .callbacks = callbacks,
                                .validation_split = validation_split,
                                .validation_data = validate_on_test ? std::optional<std::pair<mpt::Tensors, mpt::Tensors>>(
                                                                          std::pair{data.x_test, data.y_test})
                                                                    : std::nullopt});
    if (chief) std::printf("trained on %s\n", device.str().c_str());
    if (chief) reservations.report();
    auto scores = model.evaluate(data.x_test, data.y_test, {.batch_size = 512});
    if (!checkpoint.empty()) {
      model.save_weights(checkpoint);
      if (chief) std::printf("checkpoint written: %s (load with model.load_weights(\"%s\"))\n", checkpoint.c_str(),
                  checkpoint.c_str());
    }
    if (chief) std::printf("policy %s: test loss %.4f, test accuracy %.4f, final loss scale %g\n", policy.c_str(),
                scores["loss"], scores["accuracy"], h.history["loss_scale"].back());
    if (!tensorboard.empty()) std::printf("TensorBoard logs: %s (tensorboard --logdir %s)\n", tensorboard.c_str(), tensorboard.c_str());
    if (chief) std::printf("test_accuracy=%.4f\n", scores["accuracy"]);
  } catch (const mpt::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
