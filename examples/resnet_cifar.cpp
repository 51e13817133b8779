// A small ResNet (residual blocks with BatchNormalization and Add) built with the functional
// API and trained on CIFAR-10 binary batches (data_batch_1.bin ... test_batch.bin) when
// --data-dir has them, on generated CIFAR-shaped data otherwise.
//
//   ./resnet_cifar [--data-dir DIR] [--policy mixed_bfloat16] [--epochs 2] [--batch-size 128]
//                  [--train-samples N]
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include <mpt/mpt.hpp>

#include "flags.hpp"

namespace layers = mpt::layers;
using mpt::KerasTensor;

namespace {

KerasTensor conv_bn(const KerasTensor& x, std::int64_t filters, std::int64_t kernel, std::int64_t stride) {
  auto y = layers::Conv2D(filters, {kernel, kernel}, {.strides = stride, .padding = "same", .use_bias = false})(x);
  return layers::BatchNormalization()(y);
}

KerasTensor residual_block(const KerasTensor& x, std::int64_t filters, std::int64_t stride) {
  auto y = layers::Activation("relu")(conv_bn(x, filters, 3, stride));
  y = conv_bn(y, filters, 3, 1);
  auto shortcut = (stride != 1 || x.shape().back() != filters) ? conv_bn(x, filters, 1, stride) : x;
  return layers::Activation("relu")(layers::Add()({y, shortcut}));
}

/// CIFAR-shaped data a ResNet can learn: each class is a smooth random template plus noise.
mpt::datasets::Dataset generated_cifar(std::int64_t n_train, std::int64_t n_test) {
  mpt::Tensor templates = mpt::Tensor::random_uniform({10, 32, 32, 3}, 0.2, 0.8, 7);
  auto make = [&](std::int64_t n, std::uint64_t seed) {
    std::vector<std::int32_t> labels(n);
    for (std::int64_t i = 0; i < n; ++i) labels[i] = static_cast<std::int32_t>((i * 7 + seed) % 10);
    mpt::Tensor y = mpt::Tensor::from_vector(labels, {n});
    mpt::Tensor x = mpt::ops::add(mpt::ops::reshape(mpt::ops::matmul(mpt::ops::one_hot(y, 10),
                                                                     templates.reshape({10, 32 * 32 * 3})),
                                                    {n, 32, 32, 3}),
                                  mpt::Tensor::random_normal({n, 32, 32, 3}, 0, 0.25, seed));
    return std::make_pair(x, y);
  };
  auto [xtr, ytr] = make(n_train, 1);
  auto [xte, yte] = make(n_test, 2);
  return {xtr, ytr, xte, yte};
}

}  // namespace

int main(int argc, char** argv) {
  bool distributed = false;
  std::string policy = "mixed_bfloat16", data_dir;
  int epochs = 2;
  std::int64_t batch_size = 128, train_samples = 5000;
  CLI::App app{"A small ResNet on CIFAR-10 (or generated CIFAR-shaped data) under a global dtype policy"};
  examples::add_policy(app, policy);
  app.add_option("--epochs", epochs, "epochs to train")->check(examples::kPositive)->capture_default_str();
  app.add_option("--batch-size", batch_size, "batch size")->check(examples::kPositive)->capture_default_str();
  app.add_option("--data-dir", data_dir, "folder of CIFAR-10's binary batches (generated data without it)");
  app.add_option("--train-samples", train_samples, "generated training images when there is no --data-dir")
      ->check(examples::kPositive)
      ->capture_default_str();
  examples::add_distributed(app, distributed);
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  examples::start_distributed(distributed);
  const bool chief = mpt::distributed::is_chief();  // rank 0 (or the only process) prints
  try {
    mpt::set_random_seed(1);
    mpt::mixed_precision::set_global_policy(policy);
    mpt::datasets::Dataset data;
    if (!data_dir.empty() && std::filesystem::exists(std::filesystem::path(data_dir) / "data_batch_1.bin")) {
      data = mpt::datasets::cifar10::load(data_dir);
      if (chief) std::printf("CIFAR-10 from %s: %lld train, %lld test images\n", data_dir.c_str(),
                  static_cast<long long>(data.x_train.shape()[0]), static_cast<long long>(data.x_test.shape()[0]));
    } else {
      data = generated_cifar(train_samples, train_samples / 5);
      if (chief) std::printf("no CIFAR-10 binary batches given (--data-dir): generated CIFAR-shaped data, %lld train images\n",
                  static_cast<long long>(train_samples));
    }

    auto in = mpt::Input({32, 32, 3});
    auto x = layers::Activation("relu")(conv_bn(in, 32, 3, 1));
    x = residual_block(x, 32, 1);
    x = residual_block(x, 32, 1);
    x = residual_block(x, 64, 2);
    x = residual_block(x, 64, 1);
    x = layers::GlobalAveragePooling2D()(x);
    auto out = layers::Activation("softmax")(layers::Dense(10)(x));
    mpt::Model model(in, out, "resnet_cifar");
    model.compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-3}),
                   .loss = "sparse_categorical_crossentropy", .metrics = {"accuracy"}});
    if (chief) model.summary();
    model.fit(data.x_train, data.y_train, {.batch_size = batch_size, .epochs = epochs, .validation_split = 0.1});
    auto scores = model.evaluate(data.x_test, data.y_test, {.batch_size = 256});
    if (chief) std::printf("policy %s: test loss %.4f, test accuracy %.4f\n", policy.c_str(), scores["loss"], scores["accuracy"]);
    if (chief) std::printf("test_accuracy=%.4f\n", scores["accuracy"]);
  } catch (const mpt::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
