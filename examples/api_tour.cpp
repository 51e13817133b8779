// API.md's "A whole program" (with model A, the MLP, in place of the CNN) and "A custom
// training loop", as written there.
//
//   ./api_tour [--epochs 5]
#include <cstdio>
#include <string>

#include <mpt/mpt.hpp>

#include "flags.hpp"
namespace layers = mpt::layers;

int main(int argc, char** argv) {
  int epochs = 5;
  CLI::App app{"API.md's whole program and custom training loop"};
  app.add_option("--epochs", epochs, "epochs to train")->check(examples::kPositive)->capture_default_str();
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  mpt::mixed_precision::set_global_policy("mixed_float16");   // or "mixed_bfloat16", "float32"

  auto data = mpt::datasets::fashion_mnist::load();   // Debian package dataset-fashion-mnist
  // data.x_train: float32 [60000,28,28,1] in [0,1]; data.y_train: int32 [60000]; same for *_test

  mpt::Sequential model({
      layers::Input({28, 28, 1}),
      layers::Flatten(),
      layers::Dense(512, {.activation = "relu"}),
      layers::Dense(512, {.activation = "relu"}),
      layers::Dense(10),
      layers::Activation("softmax"),        // compile() forces this one to float32
  });
  model.summary();                          // Keras-style table: layer, output shape, params, policy

  model.compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-3}),
                 .loss = "sparse_categorical_crossentropy",
                 .metrics = {"accuracy"}});
  mpt::History history = model.fit(data.x_train, data.y_train,
                                   {.batch_size = 128, .epochs = epochs, .validation_split = 0.1});
  auto scores = model.evaluate(data.x_test, data.y_test);   // {"loss": ..., "accuracy": ...}
  mpt::Tensor probs = model.predict(data.x_test);           // float32 [10000,10]
  model.save_weights("fashion.weights.h5");
  std::printf("fit: test accuracy %.4f, probs %s %s, loss scale %g\n", scores["accuracy"],
              mpt::to_string(probs.shape()).c_str(), mpt::to_string(probs.dtype()).c_str(),
              history.history["loss_scale"].back());

  // A custom training loop, one more epoch on the same model.
  auto x_train = data.x_train, y_train = data.y_train;
  mpt::mixed_precision::LossScaleOptimizer opt(mpt::optimizers::Adam());
  mpt::losses::SparseCategoricalCrossentropy loss_fn;
  for (auto [x, y] : mpt::data::batches(x_train, y_train, {.batch_size = 128, .shuffle = true})) {
    mpt::GradientTape tape;
    mpt::Tensor y_pred = model(x, {.training = true});
    mpt::Tensor loss = loss_fn(y, y_pred);
    auto grads = tape.gradient(opt.get_scaled_loss(loss), model.trainable_variables());
    opt.apply_gradients(opt.get_unscaled_gradients(grads), model.trainable_variables());
  }
  auto after = model.evaluate(data.x_test, data.y_test);
  std::printf("custom loop: %lld steps, loss scale %g, test accuracy %.4f\n",
              static_cast<long long>(opt.iterations()), opt.loss_scale(), after["accuracy"]);
}
