// Weight regularizers (L1, L2, L1L2 on kernels, biases, embeddings, beta/gamma and activities)
// and constraints (MaxNorm, NonNeg, UnitNorm), against Keras 3 runs recorded by
// tests/interop/record_keras_regularizers.py into tests/data/keras_regularizers.json.
#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

using namespace mpt;
namespace layers = mpt::layers;
namespace R = mpt::regularizers;
namespace C = mpt::constraints;

namespace {

/// The three recorded models, built as the script builds them (same names, so same paths).
std::unique_ptr<Model> build(const std::string& which) {
  if (which == "dense_model") {
    auto x = mpt::Input({6}, {.name = "x"});
    auto h = layers::Dense(5, {.activation = "relu",
                               .kernel_regularizer = R::L2(0.01),
                               .bias_regularizer = R::L2(0.02),
                               .activity_regularizer = R::L1L2(0.001, 0.002),
                               .kernel_constraint = C::MaxNorm(0.8),
                               .bias_constraint = C::NonNeg(),
                               .name = "d1"})(x);
    auto y = layers::Dense(3, {.kernel_regularizer = R::L1L2(0.01, 0.01),
                               .kernel_constraint = C::UnitNorm({0}),
                               .name = "d2"})(h);
    return std::make_unique<Model>(x, y, which);
  }
  if (which == "token_model") {
    auto ids = mpt::Input({5}, {.dtype = int32, .name = "ids"});
    auto h = layers::Embedding(10, 8, {.embeddings_regularizer = R::L2(0.01),
                                       .activity_regularizer = R::L1(0.001),
                                       .embeddings_constraint = C::MaxNorm(1.0, {1}),
                                       .name = "emb"})(ids);
    auto a = layers::MultiHeadAttention(2, 4, {.kernel_regularizer = R::L2(0.001),
                                               .bias_regularizer = R::L2(0.001),
                                               .kernel_constraint = C::MaxNorm(0.9),
                                               .bias_constraint = C::NonNeg(),
                                               .name = "mha"})({h, h});
    h = layers::LayerNormalization({.beta_regularizer = R::L2(0.02),
                                    .gamma_regularizer = R::L1(0.01),
                                    .beta_constraint = C::UnitNorm({0}),
                                    .name = "ln"})(layers::Add({.name = "add"})({h, a}));
    auto y = layers::Dense(3, {.name = "out"})(layers::Flatten({.name = "flat"})(h));
    return std::make_unique<Model>(ids, y, which);
  }
  auto x = mpt::Input({6, 6, 2}, {.name = "x"});
  auto h = layers::Conv2D(3, {3, 3}, {.kernel_regularizer = R::L2(0.01),
                                      .bias_regularizer = R::L1L2(0.0, 0.05),
                                      .activity_regularizer = R::L1(0.001),
                                      .kernel_constraint = C::MaxNorm(1.0, {0, 1, 2}),
                                      .name = "conv"})(x);
  h = layers::BatchNormalization({.beta_regularizer = R::L1(0.01),
                                  .gamma_regularizer = R::L2(0.01),
                                  .beta_constraint = C::MaxNorm(0.5),
                                  .gamma_constraint = C::NonNeg(),
                                  .name = "bn"})(h);
  auto y = layers::Dense(2, {.name = "out"})(layers::GlobalAveragePooling2D({.name = "gap"})(h));
  return std::make_unique<Model>(x, y, which);
}

Tensor tensor_of(const nlohmann::json& j, DType dtype, Device device) {
  Shape shape = j["shape"].get<Shape>();
  return Tensor::from_vector(j["values"].get<std::vector<double>>(), shape).to(dtype).to(device);
}

const nlohmann::json& recorded() {
  static const nlohmann::json j = [] {
    std::ifstream in(test::test_data("keras_regularizers.json"));
    REQUIRE_MESSAGE(in.good(), "missing ", test::test_data("keras_regularizers.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

double rel(double got, double want) { return std::abs(got - want) / std::max(1.0, std::abs(want)); }

}  // namespace

TEST_CASE("regularized and constrained training follows Keras's recorded run step for step") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    for (const auto& c : recorded()["cases"]) {
      const std::string which = c["model"];
      CAPTURE(which);
      auto m = build(which);
      // Keras's initial weights by variable path: every variable gets one, and every one is used.
      std::size_t used = 0;
      for (const auto& v : m->variables()) {
        REQUIRE_MESSAGE(c["initial_weights"].contains(v.path()), "no recorded weights for ", v.path());
        v.assign(tensor_of(c["initial_weights"][v.path()], float32, dev));
        ++used;
      }
      CHECK(used == c["initial_weights"].size());
      const bool ids = which == "token_model";
      const Tensor xs = tensor_of(c["x"], ids ? int32 : float32, dev), ys = tensor_of(c["y"], float32, dev);
      const std::int64_t batches = xs.shape()[0];
      auto x_at = [&](std::int64_t b) { return xs.slice(b, b + 1).reshape(Shape(xs.shape().begin() + 1, xs.shape().end())); };
      auto y_at = [&](std::int64_t b) { return ys.slice(b, b + 1).reshape(Shape(ys.shape().begin() + 1, ys.shape().end())); };
      {
        NoGradGuard no_grad;
        m->call(x_at(0), false);  // the activity penalties of one forward, as Keras's model(x)
        double penalty = 0;
        for (const auto& t : m->losses()) {
          CHECK(t.dtype() == float32);
          penalty += t.item();
        }
        CHECK(rel(penalty, c["initial_penalty"].get<double>()) < 1e-5);
      }
      m->compile({.optimizer = optimizers::SGD({.learning_rate = 0.1}), .loss = "mse"});
      const auto& losses = c["losses"];
      for (std::size_t step = 0; step < losses.size(); ++step) {
        const std::int64_t b = static_cast<std::int64_t>(step) % batches;
        const double loss = m->train_on_batch(x_at(b), y_at(b)).at("loss");
        CHECK_MESSAGE(rel(loss, losses[step].get<double>()) < 2e-5, "step ", step, ": mpt ", loss, ", Keras ",
                      losses[step].get<double>());
      }
      for (const auto& v : m->variables()) {
        const auto want = c["final_weights"][v.path()].get<std::vector<double>>();
        const auto got = v.value().to(float32).to_vector<double>();
        REQUIRE(got.size() == want.size());
        double worst = 0;
        for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, rel(got[i], want[i]));
        CHECK_MESSAGE(worst < 2e-5, v.path(), ": max difference from Keras ", worst);
      }
      const double eval = m->evaluate(x_at(0), y_at(0), {.batch_size = 8}).at("loss");
      CHECK(rel(eval, c["evaluate_loss"].get<double>()) < 2e-5);
    }
  });
}

TEST_CASE("constraints hold after every applied step, and penalties are float32 under mixed policies") {
  test::for_each_device([](Device dev) {
    for (const char* policy : {"mixed_bfloat16", "mixed_float16"}) {
      CAPTURE(policy);
      test::PolicyDeviceScope scope(policy, dev);
      set_random_seed(12);
      auto m = build("dense_model");
      m->compile({.optimizer = optimizers::Adam({.learning_rate = 0.05}), .loss = "mse"});
      Tensor x = Tensor::random_uniform({32, 6}, -2, 2, 3, float32, dev), y = Tensor::random_uniform({32, 3}, -1, 1, 4, float32, dev);
      auto h = m->fit(x, y, {.batch_size = 8, .epochs = 2, .verbose = 0});
      for (double l : h.history.at("loss")) CHECK(std::isfinite(l));
      for (const auto& t : m->losses()) CHECK(t.dtype() == float32);
      for (const auto& v : m->variables()) {
        const auto w = v.value().to(float32).to_vector<double>();
        const Shape s = v.shape();
        if (v.path() == "d1/kernel") {  // MaxNorm(0.8) on each column's norm (axis 0)
          for (std::int64_t j = 0; j < s[1]; ++j) {
            double n = 0;
            for (std::int64_t i = 0; i < s[0]; ++i) n += w[i * s[1] + j] * w[i * s[1] + j];
            CHECK(std::sqrt(n) <= 0.8 + 1e-5);
          }
        }
        if (v.path() == "d1/bias")
          for (double b : w) CHECK(b >= 0.0);  // NonNeg
        if (v.path() == "d2/kernel") {  // UnitNorm(axis 0): every column's norm is 1
          for (std::int64_t j = 0; j < s[1]; ++j) {
            double n = 0;
            for (std::int64_t i = 0; i < s[0]; ++i) n += w[i * s[1] + j] * w[i * s[1] + j];
            CHECK(std::sqrt(n) == doctest::Approx(1.0).epsilon(1e-5));
          }
        }
      }
    }
  });
}

TEST_CASE("regularizers and constraints are saved in Keras's form and load back") {
  auto m = build("token_model");
  auto conv = build("conv_model");
  for (Model* model : {m.get(), conv.get()}) {
    const nlohmann::json cfg = [&] {
      nlohmann::json out;
      for (const auto& l : model->layers()) out[l->name()] = l->config();
      return out;
    }();
    for (const auto& l : model->layers()) {
      LayerRef back = layer_from_config({l->class_name(), l->name(), l->dtype_policy(), true, l->config()});
      CHECK(back->config() == l->config());
    }
    if (model == m.get()) {
      CHECK(cfg["emb"]["embeddings_regularizer"] ==
            nlohmann::json::parse(R"({"module": "keras.regularizers", "class_name": "L2", "config": {"l2": 0.01},
                                      "registered_name": null})"));
      CHECK(cfg["emb"]["embeddings_constraint"]["config"] == nlohmann::json::parse(R"({"max_value": 1.0, "axis": 1})"));
      CHECK(cfg["mha"]["bias_constraint"]["class_name"] == "NonNeg");
    }
  }
  // Bad values are mpt::Errors naming what they got.
  CHECK(test::contains(test::error_of([] { R::L2(-1.0); }), "l2 must be a finite number >= 0, got -1"));
  CHECK(test::contains(test::error_of([] { C::MaxNorm(std::nan("")); }), "max_value"));
  CHECK(test::contains(test::error_of([] { C::UnitNorm({}); }), "at least one axis"));
  auto d = layers::Dense(2, {.kernel_constraint = C::MaxNorm(1.0, {3}), .name = "wide"});
  Tensor x = Tensor::random_uniform({4, 3}, -1, 1, 1);
  (*d)(x);
  CHECK(test::contains(test::error_of([&] { d->apply_constraints(); }), "axis 3 is outside a variable of shape"));
  // A regularizer class mpt does not have is refused naming the field.
  LayerConfig bad{"Dense", "dd", mixed_precision::Policy("float32"), true,
                  {{"units", 2}, {"kernel_regularizer", {{"class_name", "OrthogonalRegularizer"}, {"config", {{"factor", 0.01}}}}}}};
  CHECK(test::contains(test::error_of([&] { layer_from_config(bad); }), "kernel_regularizer"));
}
