#include <sstream>

#include "test_util.hpp"

using namespace mpt;
namespace layers = mpt::layers;

namespace {
/// A merge layer written by a user: elementwise sum of its inputs.
class Sum : public Layer {
 public:
  Sum() : Layer("Sum") {}
  Tensor call(const Tensor& x, bool) override { return x; }
  void build_multi(const std::vector<Shape>& shapes) override {
    for (const auto& s : shapes)
      if (s != shapes[0]) error("inputs differ in shape: ", to_string(s), " vs ", to_string(shapes[0]));
  }
  Tensor call_multi(const std::vector<Tensor>& xs, bool) override {
    Tensor acc = xs[0];
    for (std::size_t i = 1; i < xs.size(); ++i) acc = ops::add(acc, xs[i]);
    return acc;
  }
};
LayerRef sum_layer() { return std::make_shared<Sum>(); }
}  // namespace

TEST_CASE("functional model with a residual connection matches the layers applied by hand") {
  set_random_seed(3);
  auto in = mpt::Input({6});
  auto d1 = layers::Dense(6, {.activation = "relu"});
  auto d2 = layers::Dense(6);
  auto h = d1(in);
  auto r = sum_layer()({h, d2(h)});  // residual
  auto out = layers::Dense(3, {.activation = "softmax"})(r);
  Model model(in, out, "residual");
  CHECK(model.layers().size() == 4);
  Tensor x = Tensor::random_normal({5, 6}, 0, 1, 9);
  Tensor y = model(x);
  CHECK(y.shape() == Shape{5, 3});
  auto ls = model.layers();
  Tensor hh = ls[0](x);
  Tensor manual = ls[3](ops::add(hh, ls[1](hh)));
  CHECK(y.to_vector<float>() == manual.to_vector<float>());
  std::ostringstream os;
  model.summary(os);
  CHECK(os.str().find("Connected to") != std::string::npos);
  CHECK(os.str().find("dense[0][0]") != std::string::npos);  // the Sum node's inbound layers
  CHECK(os.str().find("Total params: 105") != std::string::npos);  // 42 + 42 + 21
}

TEST_CASE("a shared layer is one set of weights used twice") {
  set_random_seed(4);
  auto a = mpt::Input({4}, {.name = "a"});
  auto b = mpt::Input({4}, {.name = "b"});
  auto shared = layers::Dense(2);
  auto merged = sum_layer()({shared(a), shared(b)});
  Model model({a, b}, {merged}, "siamese");
  CHECK(model.layers().size() == 2);
  CHECK(model.trainable_variables().size() == 2);
  Tensor xa = Tensor::random_normal({3, 4}, 0, 1, 1), xb = Tensor::random_normal({3, 4}, 0, 1, 2);
  auto outs = model({xa, xb});
  REQUIRE(outs.size() == 1);
  Tensor expect = ops::add(shared(xa), shared(xb));
  CHECK(outs[0].to_vector<float>() == expect.to_vector<float>());
  // The shared kernel's gradient sums both uses: d/dW sum(xa.W + xb.W) = colsum(xa + xb).
  GradientTape tape;
  auto g = tape.gradient(ops::sum(model({xa, xb}, {.training = true})[0]), model.trainable_variables());
  auto colsum = ops::sum(ops::add(xa, xb), {0}).to_vector<double>();
  auto gk = g[0].to_vector<double>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) CHECK(gk[i * 2 + j] == doctest::Approx(colsum[i]).epsilon(1e-5));
  CHECK_THROWS_AS(model(xa), mpt::Error);  // two inputs expected
}

TEST_CASE("functional models compile, fit, evaluate and predict under each policy") {
  Tensor x = Tensor::random_uniform({512, 8}, -1, 1, 5);
  auto xv = x.to_vector<float>();
  std::vector<std::int32_t> yv(512);
  for (int i = 0; i < 512; ++i) yv[i] = xv[i * 8] + xv[i * 8 + 1] > 0;
  Tensor y = Tensor::from_vector(yv, {512});
  for (const char* p : {"float32", "mixed_float16", "mixed_bfloat16"}) {
    CAPTURE(p);
    mixed_precision::set_global_policy(p);
    set_random_seed(6);
    auto in = mpt::Input({8});
    auto h = layers::Dense(16, {.activation = "relu"})(in);
    auto h2 = sum_layer()({h, layers::Dense(16, {.activation = "relu"})(h)});
    auto out = layers::Activation("softmax")(layers::Dense(2)(h2));
    Model model(in, out);
    model.compile({.optimizer = optimizers::Adam({.learning_rate = 0.02}), .loss = "sparse_categorical_crossentropy",
                   .metrics = {"accuracy"}});
    CHECK(model.layers().back()->dtype_policy().name() == "float32");
    History hist = model.fit(x, y, {.batch_size = 32, .epochs = 4, .verbose = 0});
    CHECK(hist.history["loss"].back() < hist.history["loss"].front());
    CHECK(model.evaluate(x, y)["accuracy"] > 0.9);
    CHECK(model.predict(x).dtype() == float32);
    CHECK_THROWS_AS(model.fit(Tensor::zeros({4, 7}), Tensor::zeros({4}, int32), {.verbose = 0}), mpt::Error);
  }
  mixed_precision::set_global_policy("float32");
}

TEST_CASE("functional graph errors") {
  auto a = mpt::Input({4});
  auto b = mpt::Input({4});
  auto y = sum_layer()({layers::Dense(2)(a), layers::Dense(2)(b)});
  CHECK_THROWS_AS(Model(a, y), mpt::Error);  // b is not among the inputs
  CHECK_THROWS_AS(sum_layer()({layers::Dense(2)(a), layers::Dense(3)(a)}), mpt::Error);
}
