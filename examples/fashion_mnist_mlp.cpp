// Model A on Fashion-MNIST: Input 28x28x1 -> Flatten -> Dense 512 relu -> Dense 512 relu ->
// Dense 10 -> softmax, Adam 1e-3, batch 128, under a global dtype policy.
//
//   ./fashion_mnist_mlp [--policy mixed_float16|mixed_bfloat16|float32] [--epochs 3] [--batch-size 128]
//                       [--seed 1]
#include <cstdio>
#include <iostream>
#include <string>

#include <mpt/mpt.hpp>

#include "flags.hpp"

namespace layers = mpt::layers;

int main(int argc, char** argv) {
  bool distributed = false;
  std::string policy = "mixed_float16";
  int epochs = 3;
  std::int64_t batch_size = 128;
  std::uint64_t seed = 1;
  CLI::App app{"Model A (an MLP) on Fashion-MNIST under a global dtype policy"};
  examples::add_policy(app, policy);
  app.add_option("--epochs", epochs, "epochs to train")->check(examples::kPositive)->capture_default_str();
  app.add_option("--batch-size", batch_size, "batch size")->check(examples::kPositive)->capture_default_str();
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  examples::add_distributed(app, distributed);
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  examples::start_distributed(distributed);
  const bool chief = mpt::distributed::is_chief();  // rank 0 (or the only process) prints
  try {
    mpt::set_random_seed(seed);
    mpt::mixed_precision::set_global_policy(policy);
    auto data = mpt::datasets::fashion_mnist::load();

    mpt::Sequential model({
        layers::Input({28, 28, 1}),
        layers::Flatten(),
        layers::Dense(512, {.activation = "relu"}),
        layers::Dense(512, {.activation = "relu"}),
        layers::Dense(10),
        layers::Activation("softmax"),
    });
    model.compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-3}),
                   .loss = "sparse_categorical_crossentropy",
                   .metrics = {"accuracy"}});
    if (chief) model.summary();
    mpt::History h = model.fit(data.x_train, data.y_train, {.batch_size = batch_size, .epochs = epochs});
    auto scores = model.evaluate(data.x_test, data.y_test, {.batch_size = 512});
    if (chief) std::printf("policy %s: test loss %.4f, test accuracy %.4f, final loss scale %g\n", policy.c_str(),
                scores["loss"], scores["accuracy"], h.history["loss_scale"].back());
    if (chief) std::printf("test_accuracy=%.4f\n", scores["accuracy"]);
  } catch (const mpt::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
