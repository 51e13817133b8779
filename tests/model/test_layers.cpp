#include "layer_harness.hpp"

using namespace mpt;
namespace layers = mpt::layers;
using test::LayerCase;
using test::run_layer_test;

TEST_CASE("core layers through the layer harness") {
  const std::vector<LayerCase> cases = {
      {"Dense linear", [] { return layers::Dense(5); }, {4, 3}, {4, 5}},
      {"Dense relu", [] { return layers::Dense(5, {.activation = "relu", .bias_initializer = "ones"}); }, {4, 3}, {4, 5}},
      {"Dense tanh no bias", [] { return layers::Dense(2, {.activation = "tanh", .use_bias = false}); }, {3, 2, 3}, {3, 2, 2}},
      {"Dense gelu he_normal", [] { return layers::Dense(4, {.activation = "gelu", .kernel_initializer = "he_normal"}); }, {3, 5}, {3, 4}},
      {"Dense softmax", [] { return layers::Dense(4, {.activation = "softmax"}); }, {3, 5}, {3, 4}},
      {"Activation sigmoid", [] { return layers::Activation("sigmoid"); }, {3, 4}, {3, 4}},
      {"Activation silu", [] { return layers::Activation("silu"); }, {3, 4}, {3, 4}},
      {"Softmax", [] { return layers::Softmax(); }, {3, 4}, {3, 4}},
      {"Softmax axis 1", [] { return layers::Softmax({.axis = 1}); }, {2, 3, 4}, {2, 3, 4}},
      {"ReLU", [] { return layers::ReLU(); }, {3, 4}, {3, 4}, 0.1, 2},
      {"ReLU max_value 6", [] { return layers::ReLU({.max_value = 6}); }, {3, 4}, {3, 4}, -3, 8},
      {"ReLU max 2.5 slope 0.1 threshold 0.5",
       [] { return layers::ReLU({.max_value = 2.5, .negative_slope = 0.1, .threshold = 0.5}); }, {3, 4}, {3, 4}, -2, 4},
      {"LeakyReLU", [] { return layers::LeakyReLU(); }, {3, 4}, {3, 4}},
      {"LeakyReLU 0.05", [] { return layers::LeakyReLU({.negative_slope = 0.05}); }, {3, 4}, {3, 4}},
      {"Activation relu6", [] { return layers::Activation("relu6"); }, {3, 4}, {3, 4}, -3, 8},
      {"Dense leaky_relu", [] { return layers::Dense(3, {.activation = "leaky_relu"}); }, {4, 5}, {4, 3}},
      {"RMSNormalization", [] { return layers::RMSNormalization(); }, {3, 5}, {3, 5}},
      {"RMSNormalization 3-d eps", [] { return layers::RMSNormalization({.epsilon = 1e-3}); }, {2, 3, 4}, {2, 3, 4}},
      {"Flatten", [] { return layers::Flatten(); }, {2, 3, 4, 1}, {2, 12}},
      {"Reshape", [] { return layers::Reshape({4, -1}); }, {2, 3, 4}, {2, 4, 3}},
      {"Dropout inference", [] { return layers::Dropout(0.5); }, {3, 4}, {3, 4}},
      // A new mask per call defeats finite differences; its gradient is checked directly below.
      {"Dropout training", [] { return layers::Dropout(0.3, {.seed = 7}); }, {8, 8}, {8, 8}, -1.5, 1.5, true, false},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    run_layer_test(c);
  }
}

TEST_CASE("LeakyReLU is Keras's: slope 0.3 by default, negative slopes refused, alpha read from Keras 2") {
  mixed_precision::set_global_policy("float32");
  Tensor x = Tensor::from_vector<float>({-2, -0.5f, 0, 3}, {4});
  CHECK(layers::LeakyReLU()(x).to_vector<float>() == std::vector<float>{-0.6f, -0.15f, 0, 3});
  CHECK(layers::LeakyReLU()->config() == nlohmann::json{{"negative_slope", 0.3}});
  CHECK_THROWS_WITH_AS(layers::LeakyReLU({.negative_slope = -1}), doctest::Contains("negative_slope"), mpt::Error);
  LayerRef k2 = layer_from_config({"LeakyReLU", "lr", mixed_precision::Policy("float32"), true, {{"alpha", 0.1}}});
  CHECK(k2(x).to_vector<float>()[0] == doctest::Approx(-0.2));
}

TEST_CASE("ReLU is Keras's: max_value, negative_slope and threshold honoured, saved and loaded (was a plain ReLU)") {
  mixed_precision::set_global_policy("float32");
  Tensor x = Tensor::from_vector<float>({-2, -0.5f, 0.3f, 0.5f, 1, 3, 7}, {7});
  auto near = [](const std::vector<float>& a, const std::vector<double>& b) {
    bool ok = a.size() == b.size();
    for (std::size_t i = 0; ok && i < a.size(); ++i) ok = std::fabs(a[i] - b[i]) <= 1e-6 * (1 + std::fabs(b[i]));
    return ok;
  };
  CHECK(near(layers::ReLU()(x).to_vector<float>(), {0, 0, 0.3, 0.5, 1, 3, 7}));
  CHECK(near(layers::ReLU({.max_value = 6})(x).to_vector<float>(), {0, 0, 0.3, 0.5, 1, 3, 6}));
  // keras.layers.ReLU(max_value=2.5, negative_slope=0.1, threshold=0.5): x (x > 0.5), clipped to
  // [0, 2.5], minus 0.1 relu(0.5 - x).
  LayerRef odd = layers::ReLU({.max_value = 2.5, .negative_slope = 0.1, .threshold = 0.5});
  CHECK(near(odd(x).to_vector<float>(), {-0.25, -0.1, -0.02, 0, 1, 2.5, 2.5}));
  CHECK(near(layers::ReLU({.negative_slope = 0.2})(x).to_vector<float>(), {-0.4, -0.1, 0.3, 0.5, 1, 3, 7}));
  CHECK(odd->config() == nlohmann::json{{"max_value", 2.5}, {"negative_slope", 0.1}, {"threshold", 0.5}});
  CHECK(layers::ReLU()->config() == nlohmann::json{{"max_value", nullptr}, {"negative_slope", 0.0}, {"threshold", 0.0}});
  // A Keras config (MobileNet's ReLU6) loads as what it is.
  LayerRef relu6 = layer_from_config({"ReLU", "re_lu", mixed_precision::Policy("float32"), true,
                                      {{"max_value", 6.0}, {"negative_slope", 0.0}, {"threshold", 0.0}}});
  CHECK(near(relu6(x).to_vector<float>(), {0, 0, 0.3, 0.5, 1, 3, 6}));
  LayerRef back = layer_from_config({"ReLU", "r", mixed_precision::Policy("float32"), true, odd->config()});
  CHECK(back(x).to_vector<float>() == odd(x).to_vector<float>());
  CHECK_THROWS_WITH_AS(layers::ReLU({.max_value = -1}), doctest::Contains("max_value"), mpt::Error);
  CHECK_THROWS_WITH_AS(layers::ReLU({.negative_slope = -0.1}), doctest::Contains("negative_slope"), mpt::Error);
  CHECK_THROWS_WITH_AS(layers::ReLU({.threshold = -1}), doctest::Contains("threshold"), mpt::Error);
}

TEST_CASE("RMSNormalization is Keras's: x / sqrt(mean(x^2) + eps) * scale") {
  mixed_precision::set_global_policy("float32");
  auto l = layers::RMSNormalization();
  Tensor x = Tensor::from_vector<float>({1, -2, 3, 0.5f, 0.5f, 0.5f}, {2, 3});
  auto y = l(x).to_vector<double>();
  const double r0 = std::sqrt((1 + 4 + 9) / 3.0 + 1e-6), r1 = std::sqrt(0.25 + 1e-6);
  const std::vector<double> want = {1 / r0, -2 / r0, 3 / r0, 0.5 / r1, 0.5 / r1, 0.5 / r1};
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(y[i] == doctest::Approx(want[i]).epsilon(1e-6));
  REQUIRE(l->variables().size() == 1);
  CHECK(l->variables()[0].path().ends_with("/scale"));
}

TEST_CASE("Embedding: ids to rows under every policy, float32 table and gradient, config round trip") {
  test::for_each_device([&](Device dev) {
    for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16", "bfloat16"}) {
      CAPTURE(policy);
      test::PolicyDeviceScope scope(policy, dev);  // the layer's variables on dev
      const mixed_precision::Policy p(policy);
      auto e = layers::Embedding(1000, 8);
      // Float ids as a model's Input gives them; 999 would round to 1000 in bfloat16 if cast.
      Tensor ids = Tensor::from_vector<float>({999, 0, 257, 999}, {2, 2}).to(dev);
      Tensor y = e(ids);
      REQUIRE(y.shape() == Shape{2, 2, 8});
      CHECK(y.dtype() == p.compute_dtype());
      auto vars = e->variables();
      REQUIRE(vars.size() == 1);
      CHECK(vars[0].path().ends_with("/embeddings"));
      CHECK(vars[0].dtype() == p.variable_dtype());
      const auto table = vars[0].value().to(p.compute_dtype()).to_vector<double>(), yv = y.to_vector<double>();
      for (std::size_t j = 0; j < 8; ++j) {
        CHECK(yv[j] == table[999 * 8 + j]);
        CHECK(yv[8 + j] == table[j]);
        CHECK(yv[16 + j] == table[257 * 8 + j]);
      }
      GradientTape tape;
      Tensor out = e(ids);
      auto g = tape.gradient(ops::sum(ops::cast(out, float32)), e->trainable_variables());
      REQUIRE(g[0].defined());
      CHECK(g[0].dtype() == p.variable_dtype());
      const auto gv = g[0].to_vector<double>();
      CHECK(gv[999 * 8] == 2.0);  // id 999 used twice
      CHECK(gv[257 * 8] == 1.0);
      CHECK(gv[5 * 8] == 0.0);
      // The config rebuilds the same layer.
      LayerRef back = layer_from_config({"Embedding", "embedding", p, true, e->config()});
      back(ids);
      back->variables()[0].assign(vars[0].value());
      CHECK(back(ids).to_vector<double>() == yv);
    }
  });
  CHECK_THROWS_WITH_AS(layers::Embedding(10, 4, {.mask_zero = true}), doctest::Contains("mask_zero"), mpt::Error);
  CHECK_THROWS_WITH_AS(layers::Embedding(0, 4), doctest::Contains("input_dim"), mpt::Error);
  auto e = layers::Embedding(10, 4);
  CHECK_THROWS_WITH_AS(e(Tensor::from_vector<float>({3, 10}, {2})), doctest::Contains("Embedding '"), mpt::Error);
}

TEST_CASE("PositionEmbedding returns its first T rows broadcast to the input; the gradient sums the batch") {
  test::for_each_device([&](Device dev) {
    for (const char* policy : {"float32", "mixed_bfloat16"}) {
      CAPTURE(policy);
      test::PolicyDeviceScope scope(policy, dev);
      const mixed_precision::Policy p(policy);
      auto pe = layers::PositionEmbedding(6);
      Tensor x = Tensor::zeros({2, 4, 3}, float32, dev);
      Tensor y = pe(x);
      REQUIRE(y.shape() == Shape{2, 4, 3});
      CHECK(y.dtype() == p.compute_dtype());
      auto vars = pe->variables();
      REQUIRE(vars.size() == 1);
      CHECK(vars[0].shape() == Shape{6, 3});
      CHECK(vars[0].dtype() == p.variable_dtype());
      const auto table = vars[0].value().to(p.compute_dtype()).to_vector<double>(), yv = y.to_vector<double>();
      for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t i = 0; i < 12; ++i) CHECK(yv[b * 12 + i] == table[i]);
      GradientTape tape;
      auto g = tape.gradient(ops::sum(ops::cast(pe(x), float32)), pe->trainable_variables())[0];
      const auto gv = g.to_vector<double>();
      for (std::size_t i = 0; i < 18; ++i) CHECK(gv[i] == (i < 12 ? 2.0 : 0.0));  // rows 4, 5 unused
      LayerRef back = layer_from_config({"PositionEmbedding", "pe", p, true, pe->config()});
      back(x);
      back->variables()[0].assign(vars[0].value());
      CHECK(back(x).to_vector<double>() == yv);
      CHECK_THROWS_WITH_AS(pe(Tensor::zeros({1, 7, 3}, float32, dev)), doctest::Contains("sequence_length 6"),
                           mpt::Error);
    }
  });
}

TEST_CASE("Dense computes x.W + b with its variables") {
  mixed_precision::set_global_policy("float32");
  auto d = layers::Dense(2, {.activation = "relu"});
  Tensor x = Tensor::from_vector<float>({1, -2, 3, 0.5f, 1, -1}, {2, 3});
  Tensor y = d(x);
  auto vars = d->variables();
  REQUIRE(vars.size() == 2);
  CHECK(vars[0].path() == "dense/kernel");
  CHECK(vars[1].path() == "dense/bias");
  auto w = vars[0].value().to_vector<double>(), xv = x.to_vector<double>();
  auto yv = y.to_vector<double>();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      double z = 0;
      for (int k = 0; k < 3; ++k) z += xv[i * 3 + k] * w[k * 2 + j];
      CHECK(yv[i * 2 + j] == doctest::Approx(std::max(z, 0.0)).epsilon(1e-5));
    }
  CHECK(d->count_params() == 3 * 2 + 2);
  // A second call with a different feature size is an error that names the layer.
  try {
    d(Tensor::zeros({2, 4}));
    FAIL("expected mpt::Error");
  } catch (const mpt::Error& e) {
    CHECK(std::string(e.what()).find("Dense 'dense'") != std::string::npos);
    CHECK(std::string(e.what()).find("(2, 4)") != std::string::npos);
  }
}

TEST_CASE("policies: casts, variable reads and overrides") {
  using mixed_precision::Policy;
  CHECK(Policy("mixed_float16").compute_dtype() == float16);
  CHECK(Policy("mixed_float16").variable_dtype() == float32);
  CHECK(Policy("mixed_bfloat16").compute_dtype() == bfloat16);
  CHECK(Policy("bfloat16").variable_dtype() == bfloat16);
  CHECK(Policy().name() == "float32");
  try {
    Policy bad("mixed_float8");
    FAIL("expected mpt::Error");
  } catch (const mpt::Error& e) {
    std::string m = e.what();
    CHECK(m.find("mixed_float8") != std::string::npos);
    CHECK(m.find("mixed_bfloat16") != std::string::npos);  // lists the valid names
  }
  mixed_precision::set_global_policy("mixed_bfloat16");
  CHECK(mixed_precision::global_policy().name() == "mixed_bfloat16");
  auto d = layers::Dense(3);
  auto d32 = layers::Dense(3, {.dtype = "float32"});
  auto dp = layers::Dense(3, {.dtype = Policy("mixed_float16")});
  mixed_precision::set_global_policy("float32");
  CHECK(d->dtype_policy().name() == "mixed_bfloat16");
  CHECK(d32->dtype_policy().name() == "float32");
  CHECK(dp->compute_dtype() == float16);
  Tensor x = Tensor::ones({2, 4});
  CHECK(d(x).dtype() == bfloat16);       // float input cast to the compute dtype
  CHECK(d32(x.to(bfloat16)).dtype() == float32);
  // Integer inputs are not cast.
  auto flat = layers::Flatten({.dtype = "mixed_float16"});
  CHECK(flat(Tensor::zeros({2, 3}, int32)).dtype() == int32);
  // The cached cast is reused until the variable is written.
  auto v = d->variables()[0];
  Tensor r1 = v.read(bfloat16), r2 = v.read(bfloat16);
  CHECK(r1.data_ptr() == r2.data_ptr());
  v.assign(Tensor::ones(v.shape()));
  Tensor r3 = v.read(bfloat16);
  CHECK(r3.data_ptr() != r1.data_ptr());
  CHECK(r3.to_vector<float>()[0] == 1.0f);
}

TEST_CASE("a user-defined layer overrides build and call only") {
  class Scale : public Layer {
   public:
    Scale() : Layer("Scale") {}
    void build(const Shape& s) override { w_ = add_weight("w", {s.back()}, "ones"); }
    Tensor call(const Tensor& x, bool) override { return ops::mul(x, read(w_)); }

   private:
    Variable w_;
  };
  test::LayerCase c{"Scale", [] { return LayerRef(std::make_shared<Scale>()); }, {3, 4}, {3, 4}};
  c.check_config = false;  // not registered: load_model could not rebuild it
  run_layer_test(c);
  mixed_precision::set_global_policy("mixed_float16");
  LayerRef s = std::make_shared<Scale>();
  CHECK(s->name() == "scale");
  Tensor y = s(Tensor::ones({2, 4}));
  CHECK(y.dtype() == float16);
  CHECK(s->variables()[0].dtype() == float32);
  mixed_precision::set_global_policy("float32");
}

TEST_CASE("Dropout is seeded, scales, and is inactive in inference") {
  auto d = layers::Dropout(0.25, {.seed = 3});
  Tensor x = Tensor::ones({100, 100});
  CHECK(d(x).to_vector<float>() == x.to_vector<float>());
  auto y = d(x, {.training = true}).to_vector<float>();
  std::size_t zeros = 0;
  for (float v : y) {
    CHECK((v == 0.0f || v == doctest::Approx(1 / 0.75)));
    zeros += v == 0.0f;
  }
  CHECK(zeros > 2200);
  CHECK(zeros < 2800);
  auto d2 = layers::Dropout(0.25, {.seed = 3});
  CHECK(d2(x, {.training = true}).to_vector<float>() == y);  // same seed, same first mask
  CHECK(d2(x, {.training = true}).to_vector<float>() != y);  // a new mask per call
  CHECK_THROWS_AS(layers::Dropout(1.0), mpt::Error);
  // The gradient is the mask scaled by 1/(1-rate): g = y / x for the same call.
  Tensor xr = Tensor::random_uniform({20, 20}, 0.5, 1.5, 4);
  GradientTape tape;
  tape.watch(xr);
  Tensor yr = d(xr, {.training = true});
  auto g = tape.gradient(ops::sum(yr), {xr})[0].to_vector<double>();
  auto yv = yr.to_vector<double>(), xv = xr.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(yv[i] / xv[i]).epsilon(1e-5));
}
