// The C++ half of tests/interop/keras_interop.py (run by hand, not by CTest).
//
//   keras_interop_helper export <dir>   trains the interop MLP briefly and writes, into <dir>:
//       mpt.weights.h5 (Keras 3 layout, with Adam's state), mpt_legacy.h5 (Keras 2 layout),
//       mpt_bf16.weights.h5 (bfloat16 export), mpt.keras (full model), inputs.f32 [64, 20],
//       preds.f32 [64, 10],
//       preds_bf16.f32 (predictions of a model loaded back from the bfloat16 export) and
//       preds_step.f32 (predictions after one more Adam step from the saved optimizer state),
//       mpt_residual.keras (a functional residual CNN), inputs_img.f32 [64, 8, 8, 3] and
//       preds_residual.f32 [64, 5]
//   keras_interop_helper optimizers_export <dir>   for each optimizer of optimizer_cases(): trains
//       the MLP one epoch (15 batches), saves mpt_opt_<name>.keras (with the optimizer's
//       variables), then takes one more train_on_batch step and writes opt_inputs.f32,
//       opt_batch_x.f32 [32, 20], opt_batch_y.f32 [32] and preds_opt_<name>.f32 after the step
//   keras_interop_helper import_step <model.keras> <batch_x.f32> <batch_y.f32> <inputs.f32> <preds.f32>
//       rebuilds a compiled MLP saved by Keras with its optimizer state, takes one train_on_batch
//       step on the batch [32, 20] / [32] and writes its predictions
//   keras_interop_helper import <weights file> <inputs.f32> <preds.f32>
//       loads weights written by Keras into the same MLP and writes its predictions
//   keras_interop_helper import_model <model.keras> <inputs.f32> <preds.f32> [dims...]
//       rebuilds a whole model saved by Keras (mpt::load_model) and writes its predictions
//       (inputs of per-example shape dims, [20] by default)
//   keras_interop_helper gpt_export <dir>   a functional token model (Embedding, causal
//       MultiHeadAttention with a mask input, Add, LayerNormalization, Dense) with random weights:
//       mpt_gpt.keras, gpt_ids.f32 [64, 12], gpt_mask.f32 [64, 12, 12] (0/1) and gpt_preds.f32
//       [64, 12, 20]
//   keras_interop_helper gpt_import <model.keras> <ids.f32> <mask.f32> <preds.f32>
//       rebuilds a Keras-saved model of that shape and writes its predictions
//   keras_interop_helper depthwise_export <dir>   a CNN with DepthwiseConv2D and a grouped Conv2D
//       (depthwise_cnn()), trained one epoch: mpt_depthwise.keras, inputs_dw.f32 [64, 8, 8, 4]
//       and preds_dw.f32 [64, 5]
//   keras_interop_helper nested_export <dir>   a model used as a layer (nested()): a frozen
//       functional base (Dense, BatchNormalization, Dense) under a Dense head, random weights, the
//       head trained one epoch: mpt_nested.keras, mpt_nested.weights.h5, inputs_nested.f32
//       [64, 20] and preds_nested.f32 [64, 10]
//   keras_interop_helper nested_import <weights file> <inputs.f32> <preds.f32>   loads Keras's
//       weights into nested() and writes its predictions
//   keras_interop_helper fresh_kernel <model.keras> <kernel.f32>   the first Dense layer made again
//       from its saved config and built: its freshly initialized kernel (keras_config_sweep.py)
//
// .f32 files hold raw little-endian float32 values, row-major.
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>

#include <mpt/mpt.hpp>

namespace layers = mpt::layers;

namespace {

constexpr std::int64_t kSamples = 64, kIn = 20, kOut = 10;

/// The interop MLP; the layer names match the Keras script's.
std::unique_ptr<mpt::Sequential> mlp() {
  return std::make_unique<mpt::Sequential>(std::vector<mpt::LayerRef>{
      layers::Input({kIn}), layers::Dense(64, {.activation = "relu", .name = "dense"}),
      layers::Dense(32, {.activation = "tanh", .name = "dense_1"}), layers::Dense(kOut, {.name = "dense_2"}),
      layers::Activation("softmax", {.name = "activation"})});
}

/// The functional residual CNN: Input -> Conv2D -> BN -> ReLU -> Conv2D -> Add(skip) -> GAP -> Dense.
std::unique_ptr<mpt::Model> residual_cnn() {
  auto in = mpt::Input({8, 8, 3});
  auto x = layers::Conv2D(4, {3, 3}, {.padding = "same"})(in);
  x = layers::BatchNormalization()(x);
  x = layers::ReLU()(x);
  auto y = layers::Conv2D(4, {3, 3}, {.padding = "same"})(x);
  auto out = layers::Dense(5, {.activation = "softmax"})(layers::GlobalAveragePooling2D()(layers::Add()({x, y})));
  return std::make_unique<mpt::Model>(in, out, "residual");
}

/// Input(8, 8, 4) -> DepthwiseConv2D(3, x2, same, relu) -> Conv2D(6, 3, groups 2) -> GAP -> Dense(5);
/// keras_interop.py's depthwise_cnn() builds the same one.
std::unique_ptr<mpt::Model> depthwise_cnn() {
  auto in = mpt::Input({8, 8, 4});
  auto x = layers::DepthwiseConv2D(3, {.padding = "same", .depth_multiplier = 2, .activation = "relu"})(in);
  x = layers::Conv2D(6, 3, {.groups = 2, .activation = "tanh"})(x);
  auto out = layers::Dense(5)(layers::GlobalAveragePooling2D()(x));
  return std::make_unique<mpt::Model>(in, out, "depthwise");
}

constexpr std::int64_t kT = 12, kVocab = 20;

/// The token model; Keras's script builds the same one.
std::unique_ptr<mpt::Model> gpt() {
  auto ids = mpt::Input({kT}, {.dtype = mpt::int32, .name = "ids"});
  auto mask = mpt::Input({kT, kT}, {.dtype = mpt::bool_, .name = "mask"});
  auto h = layers::Embedding(kVocab, 16)(ids);
  auto a = layers::MultiHeadAttention(2, 8, {.use_causal_mask = true})({h, h, mask});
  h = layers::LayerNormalization()(layers::Add()({h, a}));
  return std::make_unique<mpt::Model>(std::vector{ids, mask}, std::vector{layers::Dense(kVocab)(h)}, "gpt");
}

/// out = Add([c(x), b(a(x))]) with user-chosen names: Keras orders its layers a, c, b and keeps
/// their weights at layers/dense, dense_1, dense_2 whatever the names.
std::unique_ptr<mpt::Model> crossed() {
  auto in = mpt::Input({4}, {.name = "features"});
  auto a = layers::Dense(3, {.name = "encoder"})(in);
  auto b = layers::Dense(4, {.name = "decoder"})(a);
  auto c = layers::Dense(4, {.activation = "relu", .name = "skip"})(in);
  return std::make_unique<mpt::Model>(in, layers::Add({.name = "merge"})({c, b}), "crossed");
}

void write_f32(const std::string& path, const mpt::Tensor& t) {
  auto v = t.to(mpt::float32).to_vector<float>();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!out) throw mpt::Error("cannot write " + path);
}

mpt::Tensor read_f32(const std::string& path, const mpt::Shape& shape) {
  std::vector<float> v(static_cast<std::size_t>(mpt::numel_of(shape)));
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!in) throw mpt::Error("cannot read " + std::to_string(v.size()) + " floats from " + path);
  return mpt::Tensor::from_vector(v, shape);
}

/// A padding mask [64, 12, 12]: sample n attends to its first 12 - n % 5 keys (never to none).
mpt::Tensor gpt_mask() {
  std::vector<float> m(static_cast<std::size_t>(kSamples * kT * kT));
  for (std::int64_t n = 0; n < kSamples; ++n)
    for (std::int64_t i = 0; i < kT; ++i)
      for (std::int64_t j = 0; j < kT; ++j) m[(n * kT + i) * kT + j] = j < kT - n % 5 ? 1.f : 0.f;
  return mpt::Tensor::from_vector(m, {kSamples, kT, kT});
}

/// The optimizers keras_interop.py checks step by step (their Keras twins are in the script).
std::vector<std::pair<std::string, std::function<std::shared_ptr<mpt::optimizers::Optimizer>()>>> optimizer_cases() {
  namespace o = mpt::optimizers;
  return {{"nadam", [] { return o::Nadam({.learning_rate = 1e-2, .weight_decay = 0.01}); }},
          {"adamax", [] { return o::Adamax({.learning_rate = 1e-2}); }},
          {"adagrad", [] { return o::Adagrad({.learning_rate = 5e-2, .initial_accumulator_value = 0.2}); }},
          {"lion", [] { return o::Lion({.learning_rate = 1e-3, .weight_decay = 0.1}); }},
          {"adafactor", [] { return o::Adafactor({.learning_rate = 1e-2}); }},
          {"adam_ema_acc", [] {
             return o::Adam({.learning_rate = 1e-2, .use_ema = true, .ema_momentum = 0.9, .gradient_accumulation_steps = 4});
           }},
          {"sgd_wd", [] { return o::SGD({.learning_rate = 0.05, .momentum = 0.9, .weight_decay = 0.01}); }}};
}

std::vector<std::int32_t> labels_of(const mpt::Tensor& x) {
  auto v = x.to_vector<float>();
  std::vector<std::int32_t> y(static_cast<std::size_t>(x.shape()[0]));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>((v[i * kIn] > 0) + 2 * (v[i * kIn + 1] > 0));
  return y;
}

/// Input(20) -> base -> Dense(10), base = functional Input(20) -> Dense(16, relu) ->
/// BatchNormalization -> Dense(8, tanh), as nested() in keras_interop.py.
std::shared_ptr<mpt::Model> nested() {
  auto bin = mpt::Input({kIn});
  auto h = layers::BatchNormalization()(layers::Dense(16, {.activation = "relu"})(bin));
  auto base = std::make_shared<mpt::Model>(bin, layers::Dense(8, {.activation = "tanh"})(h));
  auto in = mpt::Input({kIn});
  return std::make_shared<mpt::Model>(in, layers::Dense(kOut)((*base)(in)), "outer");
}

int run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "import_step" && argc == 7) {
    auto m = mpt::load_model(argv[2]);
    const mpt::Tensor xb = read_f32(argv[3], {32, kIn});
    const mpt::Tensor yb = read_f32(argv[4], {32}).to(mpt::int32);
    m->train_on_batch(xb, yb);
    write_f32(argv[6], m->predict(read_f32(argv[5], {kSamples, kIn})));
    return 0;
  }
  if (mode == "optimizers_export" && argc == 3) {
    const std::string dir = argv[2];
    const mpt::Tensor x = mpt::Tensor::random_normal({480, kIn}, 0, 1, 7);
    const mpt::Tensor y = mpt::Tensor::from_vector(labels_of(x), {480});
    const mpt::Tensor inputs = mpt::Tensor::random_uniform({kSamples, kIn}, -2, 2, 11);
    const mpt::Tensor xb = inputs.slice(0, 32);
    const mpt::Tensor yb = mpt::Tensor::from_vector(labels_of(xb), {32});
    write_f32(dir + "/opt_inputs.f32", inputs);
    write_f32(dir + "/opt_batch_x.f32", xb);
    write_f32(dir + "/opt_batch_y.f32", yb.to(mpt::float32));
    for (const auto& [name, make] : optimizer_cases()) {
      mpt::set_random_seed(2024);
      auto m = mlp();
      m->compile({.optimizer = make(), .loss = "sparse_categorical_crossentropy"});
      m->fit(x, y, {.batch_size = 32, .epochs = 1, .verbose = 0, .shuffle = false});
      m->save(dir + "/mpt_opt_" + name + ".keras");
      m->train_on_batch(xb, yb);
      write_f32(dir + "/preds_opt_" + name + ".f32", m->predict(inputs));
    }
    std::cout << "exported " << optimizer_cases().size() << " optimizers to " << dir << "\n";
    return 0;
  }
  if (mode == "export" && argc == 3) {
    const std::string dir = argv[2];
    mpt::set_random_seed(2024);
    auto m = mlp();
    m->compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-2}), .loss = "sparse_categorical_crossentropy"});
    mpt::Tensor x = mpt::Tensor::random_normal({512, kIn}, 0, 1, 7);
    auto xv = x.to_vector<float>();
    std::vector<std::int32_t> y(512);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>((xv[i * kIn] > 0) + 2 * (xv[i * kIn + 1] > 0));
    m->fit(x, mpt::Tensor::from_vector(y, {512}), {.batch_size = 32, .epochs = 2, .verbose = 0});
    m->save_weights(dir + "/mpt.weights.h5");
    m->save_weights(dir + "/mpt_legacy.h5");
    m->save_weights(dir + "/mpt_bf16.weights.h5", {.dtype = mpt::bfloat16});
    m->save(dir + "/mpt.keras");
    mpt::Tensor inputs = mpt::Tensor::random_uniform({kSamples, kIn}, -2, 2, 11);
    write_f32(dir + "/inputs.f32", inputs);
    write_f32(dir + "/preds.f32", m->predict(inputs));
    auto b = mlp();
    b->load_weights(dir + "/mpt_bf16.weights.h5");
    write_f32(dir + "/preds_bf16.f32", b->predict(inputs));
    // One more Adam step from the saved optimizer state: Keras must land on the same weights.
    auto c = mlp();
    c->compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-2}), .loss = "sparse_categorical_crossentropy"});
    c->load_weights(dir + "/mpt.weights.h5");
    mpt::Tensor xb = inputs.slice(0, 32);
    auto bv = xb.to_vector<float>();
    std::vector<std::int32_t> yb(32);
    for (std::size_t i = 0; i < yb.size(); ++i) yb[i] = static_cast<std::int32_t>((bv[i * kIn] > 0) + 2 * (bv[i * kIn + 1] > 0));
    c->train_on_batch(xb, mpt::Tensor::from_vector(yb, {32}));
    write_f32(dir + "/preds_step.f32", c->predict(inputs));
    // Every core layer type, under mixed_bfloat16, as a .keras archive.
    mpt::mixed_precision::set_global_policy("mixed_bfloat16");
    mpt::Sequential core({layers::Input({8}), layers::Reshape({2, 4}), layers::Flatten(),
                          layers::Dense(16, {.kernel_initializer = "he_uniform", .bias_initializer = "random_normal"}),
                          layers::ReLU(), layers::Dropout(0.25), layers::Dense(12, {.activation = "tanh", .use_bias = false}),
                          layers::Activation("sigmoid"), layers::Dense(4), layers::Softmax()});
    mpt::mixed_precision::set_global_policy("float32");
    core.compile({.optimizer = mpt::optimizers::RMSprop({.momentum = 0.5}), .loss = "sparse_categorical_crossentropy",
                  .metrics = {"accuracy"}});
    core.fit(mpt::Tensor::random_normal({256, 8}, 0, 1, 3), mpt::Tensor::from_vector(std::vector<std::int32_t>(256, 1), {256}),
             {.batch_size = 64, .epochs = 1, .verbose = 0});
    core.save(dir + "/mpt_core.keras");
    mpt::Tensor inputs8 = mpt::Tensor::random_uniform({kSamples, 8}, -2, 2, 12);
    write_f32(dir + "/inputs8.f32", inputs8);
    write_f32(dir + "/preds_core.f32", core.predict(inputs8));
    // A functional residual CNN, trained a little (so BatchNormalization's statistics move).
    auto r = residual_cnn();
    r->compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-2}), .loss = "sparse_categorical_crossentropy"});
    mpt::Tensor ximg = mpt::Tensor::random_normal({128, 8, 8, 3}, 0, 1, 13);
    std::vector<std::int32_t> yimg(128);
    for (std::size_t i = 0; i < yimg.size(); ++i) yimg[i] = static_cast<std::int32_t>(i % 5);
    r->fit(ximg, mpt::Tensor::from_vector(yimg, {128}), {.batch_size = 32, .epochs = 2, .verbose = 0});
    r->save(dir + "/mpt_residual.keras");
    mpt::Tensor inputs_img = mpt::Tensor::random_uniform({kSamples, 8, 8, 3}, -2, 2, 14);
    write_f32(dir + "/inputs_img.f32", inputs_img);
    write_f32(dir + "/preds_residual.f32", r->predict(inputs_img));
    // User-chosen names: Keras finds the weights by object path, in .keras and .weights.h5 alike.
    mpt::set_random_seed(31);
    auto k = crossed();
    k->save(dir + "/mpt_crossed.keras");
    k->save_weights(dir + "/mpt_crossed.weights.h5");
    mpt::Tensor inputs4 = mpt::Tensor::random_uniform({kSamples, 4}, -2, 2, 15);
    write_f32(dir + "/inputs4.f32", inputs4);
    write_f32(dir + "/preds_crossed.f32", k->predict(inputs4));
    std::cout << "exported to " << dir << " (optimizer iterations " << m->optimizer().iterations() << ")\n";
    return 0;
  }
  if (mode == "import" && argc == 5) {
    auto m = mlp();
    m->load_weights(argv[2]);
    write_f32(argv[4], m->predict(read_f32(argv[3], {kSamples, kIn})));
    return 0;
  }
  if (mode == "try_load" && argc >= 6) {
    // keras_config_sweep.py: load a Keras-made .keras and predict, or say why not (exit 3); a
    // loaded model is saved again (<resave>) so the script can compare what mpt kept.
    mpt::Shape shape{kSamples};
    bool ids = false;
    for (int i = 6; i < argc; ++i) {
      if (std::string(argv[i]) == "int") ids = true;
      else shape.push_back(std::stoll(argv[i]));
    }
    std::unique_ptr<mpt::Model> m;
    try {
      m = mpt::load_model(argv[2]);
    } catch (const mpt::Error& e) {
      std::cout << "REFUSED: " << e.what() << "\n";
      return 3;
    }
    mpt::Tensor x = read_f32(argv[3], shape);
    if (ids) x = mpt::ops::cast(x, mpt::int32);
    write_f32(argv[4], m->predict(x));
    m->save(argv[5]);
    return 0;
  }
  if (mode == "fresh_kernel" && argc == 4) {
    // keras_config_sweep.py: the first Dense layer of a .keras model made again from its config
    // (its initializers with their arguments) and built; writes its fresh kernel.
    auto m = mpt::load_model(argv[2], {.compile = false});
    for (const auto& l : m->layers()) {
      if (l->class_name() != "Dense") continue;
      mpt::LayerRef fresh = mpt::layer_from_config(
          mpt::LayerConfig(l->class_name(), l->name(), l->dtype_policy(), l->trainable(), l->config()));
      fresh(mpt::Tensor::zeros({1, l->variables()[0].shape()[0]}));
      write_f32(argv[3], fresh->variables()[0].value());
      return 0;
    }
    std::cout << "no Dense layer in " << argv[2] << "\n";
    return 1;
  }
  if (mode == "crossed_import" && argc == 5) {
    auto m = crossed();
    m->load_weights(argv[2]);
    write_f32(argv[4], m->predict(read_f32(argv[3], {kSamples, 4})));
    return 0;
  }
  if (mode == "import_model" && argc >= 5) {
    mpt::Shape shape{kSamples};
    for (int i = 5; i < argc; ++i) shape.push_back(std::stoll(argv[i]));
    if (shape.size() == 1) shape.push_back(kIn);
    auto m = mpt::load_model(argv[2]);
    std::cout << "loaded " << argv[2] << ": " << m->layers().size() << " layers, "
              << (m->compiled() ? "compiled with " + m->optimizer().name() + ", iterations " +
                                      std::to_string(m->optimizer().iterations())
                                : std::string("not compiled"))
              << "\n";
    write_f32(argv[4], m->predict(read_f32(argv[3], shape)));
    return 0;
  }
  if (mode == "gpt_export" && argc == 3) {
    const std::string dir = argv[2];
    mpt::set_random_seed(7);
    auto m = gpt();
    std::uint64_t seed = 100;
    for (auto& v : m->variables())  // biases and norms away from their zeros and ones
      v.assign(mpt::Tensor::random_uniform(v.shape(), -0.5, 0.5, seed++).to(v.dtype()));
    m->save(dir + "/mpt_gpt.keras");
    mpt::Tensor ids = mpt::Tensor::random_uniform({kSamples, kT}, 0, kVocab, 15);
    ids = mpt::ops::cast(mpt::ops::cast(ids, mpt::int32), mpt::float32);  // whole numbers
    write_f32(dir + "/gpt_ids.f32", ids);
    write_f32(dir + "/gpt_mask.f32", gpt_mask());
    write_f32(dir + "/gpt_preds.f32",
              (*m)({mpt::ops::cast(ids, mpt::int32), mpt::ops::cast(gpt_mask(), mpt::bool_)})[0]);
    return 0;
  }
  if (mode == "depthwise_export" && argc == 3) {
    const std::string dir = argv[2];
    mpt::set_random_seed(17);
    auto m = depthwise_cnn();
    std::uint64_t seed = 200;
    for (auto& v : m->variables())  // biases away from zero
      v.assign(mpt::Tensor::random_uniform(v.shape(), -0.5, 0.5, seed++).to(v.dtype()));
    m->compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-2}), .loss = "mse"});
    m->fit(mpt::Tensor::random_normal({128, 8, 8, 4}, 0, 1, 18), mpt::Tensor::random_normal({128, 5}, 0, 1, 19),
           {.batch_size = 32, .epochs = 1, .verbose = 0});
    m->save(dir + "/mpt_depthwise.keras");
    const mpt::Tensor inputs = mpt::Tensor::random_uniform({kSamples, 8, 8, 4}, -2, 2, 20);
    write_f32(dir + "/inputs_dw.f32", inputs);
    write_f32(dir + "/preds_dw.f32", m->predict(inputs));
    return 0;
  }
  if (mode == "multi_output_export" && argc == 3) {
    // Two outputs compiled with a loss, a weight and metrics each: Keras evaluates mpt's .keras
    // under the same compile settings (multi_output.txt: mpt's evaluate logs, "name value").
    const std::string dir = argv[2];
    mpt::set_random_seed(41);
    auto x = mpt::Input({kIn}, {.name = "x"});
    auto h = layers::Dense(12, {.activation = "relu", .name = "hid"})(x);
    auto cls = layers::Dense(4, {.activation = "softmax", .name = "cls"})(h);
    auto reg = layers::Dense(1, {.name = "reg"})(h);
    mpt::Model m({x}, {cls, reg}, "two_heads");
    m.compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-2}),
               .loss = {"sparse_categorical_crossentropy", "mse"},
               .loss_weights = {0.5, 2.0},
               .output_metrics = {{"accuracy"}, {"mae", "mse"}},
               .output_weighted_metrics = {{}, {"mae"}}});
    const mpt::Tensor inputs = mpt::Tensor::random_normal({kSamples, kIn}, 0, 1, 42);
    const mpt::Tensor y1 = mpt::Tensor::from_vector(labels_of(inputs), {kSamples}).to(mpt::int32);
    const mpt::Tensor y2 = mpt::Tensor::random_normal({kSamples, 1}, 0, 1, 43);
    m.fit(inputs, {y1, y2}, {.batch_size = 16, .epochs = 2, .verbose = 0});
    m.save(dir + "/mpt_two_heads.keras");
    write_f32(dir + "/two_heads_x.f32", inputs);
    write_f32(dir + "/two_heads_y1.f32", y1);
    write_f32(dir + "/two_heads_y2.f32", y2);
    std::ofstream logs(dir + "/two_heads_logs.txt");
    logs.precision(9);
    for (const auto& [k, v] : m.evaluate(inputs, {y1, y2}, {.batch_size = kSamples})) logs << k << " " << v << "\n";
    return 0;
  }
  if (mode == "augment_export" && argc == 3) {
    // The augmentation layers with non-default arguments in front of a small CNN: Keras rebuilds
    // them from the config and, in inference (the random layers the identity), predicts the same.
    const std::string dir = argv[2];
    mpt::set_random_seed(51);
    mpt::Sequential m({layers::Input({8, 8, 3}), layers::Rescaling(0.5, {.offset = -1.0}),
                       layers::RandomFlip("horizontal", {.seed = 3}),
                       layers::RandomTranslation({-0.2, 0.1}, 0.15, {.fill_mode = "constant", .interpolation = "nearest",
                                                                     .seed = 4, .fill_value = 0.5}),
                       layers::RandomZoom(0.2, {.width_factor = mpt::layers::FactorRange(-0.1, 0.3), .fill_mode = "wrap",
                                                .seed = 5}),
                       layers::RandomCrop(8, 8, {.seed = 6}), layers::Conv2D(4, 3, {.activation = "relu"}),
                       layers::Flatten(), layers::Dense(5)});
    m.save(dir + "/mpt_augment.keras");
    const mpt::Tensor inputs = mpt::Tensor::random_uniform({kSamples, 8, 8, 3}, 0, 4, 52);
    write_f32(dir + "/inputs_aug.f32", inputs);
    write_f32(dir + "/preds_aug.f32", m.predict(inputs));
    return 0;
  }
  if (mode == "nested_export" && argc == 3) {
    const std::string dir = argv[2];
    mpt::set_random_seed(31);
    auto m = nested();
    std::uint64_t seed = 300;
    for (auto& v : m->variables()) {  // variances positive, the rest away from zeros and ones
      const bool variance = v.name() == "moving_variance";
      v.assign(mpt::Tensor::random_uniform(v.shape(), variance ? 0.5 : -0.5, variance ? 1.5 : 0.5, seed++));
    }
    auto base = mpt::detail::nested_model(*m->layers()[0]);
    base->set_trainable(false);  // fine-tuning: the head alone trains
    m->compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-2}), .loss = "mse"});
    m->fit(mpt::Tensor::random_normal({128, kIn}, 0, 1, 32), mpt::Tensor::random_normal({128, kOut}, 0, 1, 33),
           {.batch_size = 32, .epochs = 1, .verbose = 0});
    m->save(dir + "/mpt_nested.keras");
    m->save_weights(dir + "/mpt_nested.weights.h5");
    const mpt::Tensor inputs = mpt::Tensor::random_uniform({kSamples, kIn}, -2, 2, 34);
    write_f32(dir + "/inputs_nested.f32", inputs);
    write_f32(dir + "/preds_nested.f32", m->predict(inputs));
    return 0;
  }
  if (mode == "nested_import" && argc == 5) {
    auto m = nested();
    m->load_weights(argv[2]);
    write_f32(argv[4], m->predict(read_f32(argv[3], {kSamples, kIn})));
    return 0;
  }
  if (mode == "gpt_import" && argc == 6) {
    auto m = mpt::load_model(argv[2]);
    mpt::Tensor ids = mpt::ops::cast(read_f32(argv[3], {kSamples, kT}), mpt::int32);
    mpt::Tensor mask = mpt::ops::cast(read_f32(argv[4], {kSamples, kT, kT}), mpt::bool_);
    write_f32(argv[5], (*m)({ids, mask})[0]);
    return 0;
  }
  std::cerr << "usage: keras_interop_helper export <dir>\n"
               "       keras_interop_helper import <weights file> <inputs.f32> <preds.f32>\n"
               "       keras_interop_helper import_model <model.keras or .h5> <inputs.f32> <preds.f32> [dims...]\n"
               "       keras_interop_helper gpt_export <dir>\n"
               "       keras_interop_helper depthwise_export <dir>\n"
               "       keras_interop_helper gpt_import <model.keras> <ids.f32> <mask.f32> <preds.f32>\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "keras_interop_helper: " << e.what() << "\n";
    return 1;
  }
}
