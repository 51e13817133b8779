#include <fstream>
#include <sstream>

#include "test_util.hpp"

using namespace mpt;
namespace layers = mpt::layers;

namespace {
struct PolicyScope {
  explicit PolicyScope(const std::string& p) { mixed_precision::set_global_policy(p); }
  ~PolicyScope() { mixed_precision::set_global_policy("float32"); }
};

/// A 4-class problem: class = quadrant of the first two of 8 features (noise elsewhere).
std::pair<Tensor, Tensor> quadrants(std::int64_t n, std::uint64_t seed) {
  Tensor x = Tensor::random_uniform({n, 8}, -1, 1, seed);
  auto xv = x.to_vector<float>();
  std::vector<std::int32_t> y(n);
  for (std::int64_t i = 0; i < n; ++i) y[i] = (xv[i * 8] > 0 ? 1 : 0) + (xv[i * 8 + 1] > 0 ? 2 : 0);
  return {x, Tensor::from_vector(y, {n})};
}

std::unique_ptr<Sequential> small_model() {
  auto m = std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      layers::Input({8}), layers::Dense(32, {.activation = "relu"}), layers::Dense(4), layers::Activation("softmax")});
  return m;
}
}  // namespace

TEST_CASE("Sequential names layers like Keras and prints a summary") {
  Sequential m({layers::Input({28, 28, 1}), layers::Flatten(), layers::Dense(16, {.activation = "relu"}),
                layers::Dense(16, {.name = "hidden"}), layers::Dense(10), layers::Activation("softmax")});
  auto ls = m.layers();
  REQUIRE(ls.size() == 5);
  CHECK(ls[0]->name() == "flatten");
  CHECK(ls[1]->name() == "dense");
  CHECK(ls[2]->name() == "hidden");
  CHECK(ls[3]->name() == "dense_1");
  CHECK(ls[4]->name() == "activation");
  m.build({28, 28, 1});
  std::ostringstream os;
  m.summary(os);
  std::string s = os.str();
  CHECK(s.find("Model: \"sequential\"") != std::string::npos);
  CHECK(s.find("dense_1 (Dense)") != std::string::npos);
  CHECK(s.find("(None, 784)") != std::string::npos);
  CHECK(s.find("12,560") != std::string::npos);  // 784*16 + 16
  CHECK(s.find("Policy") != std::string::npos);
  CHECK(s.find("Total params: 13,002") != std::string::npos);  // 12560 + 272 + 170
  CHECK(m.count_params() == 13002);
}

TEST_CASE("compile forces a final softmax to float32 under mixed policies") {
  for (const char* p : {"mixed_float16", "mixed_bfloat16"}) {
    PolicyScope scope(p);
    for (int kind = 0; kind < 3; ++kind) {
      Sequential m({layers::Input({8}), layers::Dense(6), layers::Dense(4, {.activation = kind == 2 ? "softmax" : "linear"})});
      if (kind == 0) m.add(layers::Activation("softmax"));
      if (kind == 1) m.add(layers::Softmax());
      m.compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy"});
      CHECK(m.layers().back()->dtype_policy().name() == "float32");
      CHECK(m.layers().front()->dtype_policy().name() == p);
      Tensor out = m.predict(Tensor::ones({3, 8}));
      CHECK(out.dtype() == float32);
      CHECK(m(Tensor::ones({3, 8})).dtype() == float32);
    }
    // Only mixed_float16 wraps the optimizer in a LossScaleOptimizer.
    Sequential m({layers::Input({8}), layers::Dense(4)});
    m.compile({.optimizer = "sgd", .loss = "mse"});
    CHECK((m.loss_scale_optimizer() != nullptr) == (std::string(p) == "mixed_float16"));
    m.compile({.optimizer = "sgd", .loss = "mse", .auto_scale_loss = false});
    CHECK(m.loss_scale_optimizer() == nullptr);
  }
}

TEST_CASE("fit converges on a small synthetic task under all three policies") {
  Tensor x, y;
  std::tie(x, y) = quadrants(2048, 1);
  Tensor xt, yt;
  std::tie(xt, yt) = quadrants(512, 2);
  for (const char* p : {"float32", "mixed_float16", "mixed_bfloat16"}) {
    CAPTURE(p);
    PolicyScope scope(p);
    set_random_seed(5);
    auto m = small_model();
    m->compile({.optimizer = optimizers::Adam({.learning_rate = 0.01}), .loss = "sparse_categorical_crossentropy",
                .metrics = {"accuracy"}});
    History h = m->fit(x, y, {.batch_size = 64, .epochs = 5, .verbose = 0, .validation_split = 0.1});
    REQUIRE(h.history["loss"].size() == 5);
    CHECK(h.history["loss"].back() < h.history["loss"].front());
    CHECK(h.history.count("val_loss") == 1);
    CHECK(h.history.count("val_accuracy") == 1);
    CHECK(h.history.count("learning_rate") == 1);
    CHECK(h.history.count("loss_scale") == 1);
    CHECK(h.history.count("skipped_steps") == 1);
    CHECK(h.history["accuracy"].back() > 0.9);
    auto scores = m->evaluate(xt, yt);
    CHECK(scores["accuracy"] > 0.9);
    for (const auto& v : m->trainable_variables()) CHECK(v.dtype() == float32);
    Tensor probs = m->predict(xt, {.batch_size = 100});
    CHECK(probs.shape() == Shape{512, 4});
    CHECK(probs.dtype() == float32);
  }
}

TEST_CASE("a custom training loop and fit give the same weights") {
  Tensor x, y;
  std::tie(x, y) = quadrants(512, 3);
  for (const char* p : {"float32", "mixed_float16"}) {
    CAPTURE(p);
    PolicyScope scope(p);
    set_random_seed(11);
    auto a = small_model();
    a->compile({.optimizer = optimizers::Adam(), .loss = "sparse_categorical_crossentropy"});
    a->fit(x, y, {.batch_size = 128, .epochs = 2, .verbose = 0, .shuffle = false});

    set_random_seed(11);
    auto b = small_model();
    b->compile({.optimizer = "sgd", .loss = "sparse_categorical_crossentropy"});  // forces the softmax to float32
    b->build({8});
    std::shared_ptr<optimizers::Optimizer> opt = std::make_shared<optimizers::AdamOptimizer>();
    if (std::string(p) == "mixed_float16") opt = std::make_shared<mixed_precision::LossScaleOptimizer>(opt);
    losses::SparseCategoricalCrossentropy loss_fn;
    auto* lso = dynamic_cast<mixed_precision::LossScaleOptimizer*>(opt.get());
    for (int epoch = 0; epoch < 2; ++epoch)
      for (auto [xb, yb] : data::batches(x, y, {.batch_size = 128})) {
        GradientTape tape;
        Tensor pred = (*b)(xb, {.training = true});
        Tensor loss = loss_fn(yb, pred);
        if (lso) {
          auto grads = tape.gradient(lso->get_scaled_loss(loss), b->trainable_variables());
          lso->apply_gradients(lso->get_unscaled_gradients(grads), b->trainable_variables());
        } else {
          opt->apply_gradients(tape.gradient(loss, b->trainable_variables()), b->trainable_variables());
        }
      }
    auto wa = a->get_weights(), wb = b->get_weights();
    REQUIRE(wa.size() == wb.size());
    for (std::size_t i = 0; i < wa.size(); ++i) CHECK(wa[i].to_vector<float>() == wb[i].to_vector<float>());
    CHECK(a->optimizer().iterations() == 8);
  }
}

TEST_CASE("train_on_batch, test_on_batch and calling the model") {
  Tensor x, y;
  std::tie(x, y) = quadrants(64, 4);
  set_random_seed(1);
  auto m = small_model();
  m->compile({.optimizer = "sgd", .loss = "sparse_categorical_crossentropy", .metrics = {"accuracy"}});
  auto before = m->test_on_batch(x, y);
  CHECK(before.count("loss") == 1);
  CHECK(before.count("accuracy") == 1);
  double first = m->train_on_batch(x, y)["loss"];
  for (int i = 0; i < 30; ++i) m->train_on_batch(x, y);
  CHECK(m->test_on_batch(x, y)["loss"] < first);
  CHECK(m->optimizer().iterations() == 31);
  // Outside a tape nothing is recorded.
  CHECK_FALSE((*m)(x).requires_grad());
}

TEST_CASE("callbacks: EarlyStopping, LambdaCallback, CSVLogger") {
  Tensor x, y;
  std::tie(x, y) = quadrants(256, 5);
  set_random_seed(2);
  auto m = small_model();
  m->compile({.optimizer = optimizers::SGD({.learning_rate = 0.0}), .loss = "sparse_categorical_crossentropy"});
  int epochs_seen = 0, batches_seen = 0;
  callbacks::LambdaCallback counter;
  counter.epoch_end = [&](int, const Logs&) { ++epochs_seen; };
  counter.batch_end = [&](std::int64_t, const Logs&) { ++batches_seen; };
  const std::string csv = "test_model_log.csv";
  // A zero learning rate never improves val_loss: patience 2 stops after epoch 3.
  History h = m->fit(x, y, {.batch_size = 64, .epochs = 20, .verbose = 0,
                            .callbacks = {callbacks::EarlyStopping({.monitor = "val_loss", .patience = 2}), counter,
                                          callbacks::CSVLogger(csv)},
                            .validation_split = 0.25});
  CHECK(epochs_seen == 3);
  CHECK(batches_seen == 3 * 3);
  CHECK(h.epoch.size() == 3);
  std::ifstream in(csv);
  std::string header, line;
  std::getline(in, header);
  CHECK(header.rfind("epoch,", 0) == 0);
  CHECK(header.find("val_loss") != std::string::npos);
  int rows = 0;
  while (std::getline(in, line)) ++rows;
  CHECK(rows == 3);
  std::remove(csv.c_str());
  // Keras's columns when the first epoch did not validate (validation_freq 2): val_ twins, "NA".
  m->fit(x, y, {.batch_size = 64, .epochs = 2, .verbose = 0, .callbacks = {callbacks::CSVLogger(csv)},
                .validation_split = 0.25, .validation_freq = 2});
  std::ifstream in2(csv);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in2, l);) lines.push_back(l);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == "epoch,learning_rate,loss,loss_scale,skipped_steps,val_learning_rate,val_loss,val_loss_scale,"
                    "val_skipped_steps");
  CHECK(lines[1].find(",NA,") != std::string::npos);
  CHECK(lines[2].find(",NA,") != std::string::npos);  // val_learning_rate is never logged
  CHECK(lines[2].substr(lines[2].size() - 3) == ",NA");
  std::remove(csv.c_str());
  CHECK_THROWS_AS(m->fit(x, y, {.epochs = 1, .verbose = 0, .callbacks = {callbacks::EarlyStopping({.monitor = "val_nope"})},
                                .validation_split = 0.25}),
                  mpt::Error);
}

TEST_CASE("EarlyStopping restores the best weights") {
  Tensor x, y;
  std::tie(x, y) = quadrants(256, 6);
  set_random_seed(3);
  auto m = small_model();
  m->compile({.optimizer = optimizers::SGD({.learning_rate = 0.5}), .loss = "sparse_categorical_crossentropy"});
  History h = m->fit(x, y, {.batch_size = 32, .epochs = 6, .verbose = 0,
                            .callbacks = {callbacks::EarlyStopping({.monitor = "loss", .patience = 10, .restore_best_weights = true})}});
  // After restoring, the model's loss on the training data is that of the best epoch's end state.
  auto& losses = h.history["loss"];
  CHECK(std::min_element(losses.begin(), losses.end()) != losses.end());
  CHECK(m->evaluate(x, y)["loss"] <= losses.front());
}

TEST_CASE("bad inputs raise mpt::Error with a clear message") {
  Tensor x, y;
  std::tie(x, y) = quadrants(64, 7);
  auto m = small_model();
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      FAIL("expected mpt::Error containing '", needle, "'");
    } catch (const mpt::Error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos, std::string(e.what()), " lacks ", needle);
    }
  };
  expect_error([&] { m->fit(x, y); }, "not compiled");
  m->compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy", .metrics = {"accuracy"}});
  expect_error([&] { m->fit(Tensor::zeros({64, 7}), y, {.verbose = 0}); }, "(64, 7)");             // wrong input shape
  expect_error([&] { m->fit(x, y.slice(0, 60), {.verbose = 0}); }, "different numbers of samples"); // x/y mismatch
  expect_error([&] { m->fit(x, y, {.batch_size = 0, .verbose = 0}); }, "batch_size");
  expect_error([&] { m->fit(x, ops::add(y, Tensor::scalar(3, int32)), {.verbose = 0}); }, "out of range");  // labels
  Tensor nan_x = x.copy();
  nan_x.data<float>()[77] = std::nanf("");
  expect_error([&] { m->fit(nan_x, y, {.verbose = 0}); }, "NaN");
  expect_error([&] { m->evaluate(nan_x, y); }, "NaN");
  expect_error([&] { m->compile({.optimizer = "adamx", .loss = "mse"}); }, "adamx");
  expect_error([&] { m->compile({.optimizer = "adam", .loss = "msx"}); }, "msx");
  expect_error([&] {
    m->compile({.optimizer = "adam", .loss = "mse", .metrics = {"acuracy"}});
    m->fit(x, ops::one_hot(y, 4), {.verbose = 0});
  }, "acuracy");
  expect_error([&] { layers::Dense(0); }, "units");
  expect_error([&] { layers::Activation("softmaxx"); }, "softmaxx");
  expect_error([&] { m->fit(x, y, {.verbose = 0, .validation_split = 1.5}); }, "validation_split");
}

TEST_CASE("fit with a batch larger than the data, up to INT64_MAX, trains one step per epoch") {
  // (n + batch_size - 1) / batch_size overflowed: zero steps ran and History had no loss (issue 14, defect 6).
  for (std::int64_t bs : {std::int64_t{1000}, INT64_MAX}) {
    set_random_seed(2);
    auto m = small_model();
    m->compile({.optimizer = "sgd", .loss = "sparse_categorical_crossentropy", .metrics = {"accuracy"}});
    Tensor x, y;
    std::tie(x, y) = quadrants(40, 3);
    auto h = m->fit(x, y, {.batch_size = bs, .epochs = 2, .verbose = 0});
    REQUIRE(h.history.count("loss"));
    CHECK(h.history["loss"].size() == 2);
    CHECK(m->optimizer().iterations() == 2);
    CHECK(m->evaluate(x, y, {.batch_size = bs}).count("accuracy"));
    CHECK(m->predict(x, {.batch_size = bs}).shape() == Shape{40, 4});
    CHECK(data::batches(x, y, {.batch_size = bs}).size() == 1);
  }
}
