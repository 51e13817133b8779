// Convolutional, pooling, normalization and merge layers: the layer harness (shapes, dtypes under
// every policy, float64 gradients), Keras configs, errors that name the layer, BatchNormalization's
// moving statistics following only applied optimizer steps, and a small CNN that learns.
#include <set>

#include "layer_harness.hpp"

using namespace mpt;
using mpt::test::error_of;
namespace layers = mpt::layers;
using test::LayerCase;
using test::run_layer_test;
using mixed_precision::Policy;

namespace {

struct PolicyScope {
  explicit PolicyScope(const char* p) : saved(mixed_precision::global_policy()) { mixed_precision::set_global_policy(p); }
  ~PolicyScope() { mixed_precision::set_global_policy(saved); }
  mixed_precision::Policy saved;
};

#define CHECK_ERROR_HAS(expr, ...)                                                            \
  do {                                                                                        \
    const std::string msg_ = error_of([&] { (void)(expr); });                                 \
    for (const char* part_ : {__VA_ARGS__})                                                   \
      CHECK_MESSAGE(msg_.find(part_) != std::string::npos, "\"", msg_, "\" lacks \"", part_, "\""); \
  } while (0)

nlohmann::json config_of(const LayerRef& l) { return l->config(); }
nlohmann::json pair(std::int64_t a, std::int64_t b) { return nlohmann::json::array({a, b}); }

}  // namespace

TEST_CASE("convolution and pooling layers through the layer harness") {
  const std::vector<LayerCase> cases = {
      {"Conv2D valid", [] { return layers::Conv2D(4, {3, 3}); }, {2, 5, 6, 3}, {2, 3, 4, 4}},
      {"Conv2D same strides 2 tanh",
       [] { return layers::Conv2D(3, {3, 3}, {.strides = 2, .padding = "same", .activation = "tanh"}); },
       {2, 5, 6, 2},
       {2, 3, 3, 3}},
      {"Conv2D dilation 2 same, no bias",
       [] { return layers::Conv2D(3, 3, {.padding = "same", .dilation_rate = 2, .use_bias = false}); },
       {1, 6, 5, 2},
       {1, 6, 5, 3}},
      {"Conv2D 3x2 strides (2, 1) relu",
       [] {
         return layers::Conv2D(2, {3, 2}, {.strides = {2, 1}, .activation = "relu", .bias_initializer = "ones"});
       },
       {2, 7, 5, 2},
       {2, 3, 4, 2}},
      {"Conv2D 1x1 sigmoid he_normal",
       [] { return layers::Conv2D(5, 1, {.activation = "sigmoid", .kernel_initializer = "he_normal"}); },
       {2, 3, 3, 4},
       {2, 3, 3, 5}},
      {"Conv2D groups 2", [] { return layers::Conv2D(6, 3, {.groups = 2}); }, {2, 5, 6, 4}, {2, 3, 4, 6}},
      {"Conv2D groups 3 same strides 2 tanh, no bias",
       [] { return layers::Conv2D(3, {3, 2}, {.strides = 2, .padding = "same", .groups = 3, .activation = "tanh", .use_bias = false}); },
       {2, 5, 6, 3},
       {2, 3, 3, 3}},
      {"DepthwiseConv2D", [] { return layers::DepthwiseConv2D(3); }, {2, 5, 6, 3}, {2, 3, 4, 3}},
      {"DepthwiseConv2D multiplier 2 same strides 2 tanh",
       [] {
         return layers::DepthwiseConv2D(3, {.strides = 2, .padding = "same", .depth_multiplier = 2, .activation = "tanh",
                                            .bias_initializer = "ones"});
       },
       {2, 5, 6, 2},
       {2, 3, 3, 4}},
      {"DepthwiseConv2D 3x2 dilation 2 same, no bias",
       [] { return layers::DepthwiseConv2D({3, 2}, {.padding = "same", .dilation_rate = 2, .use_bias = false}); },
       {1, 6, 5, 4},
       {1, 6, 5, 4}},
      {"MaxPooling2D", [] { return layers::MaxPooling2D({2, 2}); }, {2, 5, 6, 3}, {2, 2, 3, 3}},
      {"MaxPooling2D same 3x3/2", [] { return layers::MaxPooling2D(3, {.strides = 2, .padding = "same"}); }, {2, 5, 6, 2}, {2, 3, 3, 2}},
      {"AveragePooling2D", [] { return layers::AveragePooling2D({2, 2}); }, {2, 4, 6, 3}, {2, 2, 3, 3}},
      {"AveragePooling2D same 3x3/1", [] { return layers::AveragePooling2D(3, {.strides = 1, .padding = "same"}); }, {1, 4, 5, 2}, {1, 4, 5, 2}},
      {"GlobalAveragePooling2D", [] { return layers::GlobalAveragePooling2D(); }, {2, 3, 4, 5}, {2, 5}},
      {"GlobalAveragePooling2D keepdims", [] { return layers::GlobalAveragePooling2D({.keepdims = true}); }, {2, 3, 4, 5}, {2, 1, 1, 5}},
      {"ZeroPadding2D 1", [] { return layers::ZeroPadding2D(); }, {2, 3, 4, 2}, {2, 5, 6, 2}},
      {"ZeroPadding2D (h, w)", [] { return layers::ZeroPadding2D({2, 1}); }, {1, 3, 4, 2}, {1, 7, 6, 2}},
      {"ZeroPadding2D ((t, b), (l, r))", [] { return layers::ZeroPadding2D({{1, 0}, {0, 2}}); }, {1, 3, 4, 2}, {1, 4, 6, 2}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    run_layer_test(c);
  }
}

TEST_CASE("normalization layers through the layer harness") {
  const std::vector<LayerCase> cases = {
      {"BatchNormalization training", [] { return layers::BatchNormalization(); }, {4, 3, 2, 3}, {4, 3, 2, 3}, -1.5, 1.5, true},
      {"BatchNormalization inference", [] { return layers::BatchNormalization(); }, {4, 3, 2, 3}, {4, 3, 2, 3}},
      {"BatchNormalization 2-d, no center", [] { return layers::BatchNormalization({.center = false}); }, {6, 4}, {6, 4}, -1.5, 1.5, true},
      {"BatchNormalization no scale", [] { return layers::BatchNormalization({.scale = false, .beta_initializer = "ones"}); },
       {5, 2, 3}, {5, 2, 3}, -1.5, 1.5, true},
      {"LayerNormalization", [] { return layers::LayerNormalization(); }, {3, 4, 5}, {3, 4, 5}},
      {"LayerNormalization no center", [] { return layers::LayerNormalization({.center = false, .gamma_initializer = "he_uniform"}); },
       {3, 6}, {3, 6}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    run_layer_test(c);
  }
}

TEST_CASE("normalization layers keep float32 statistics and variables under mixed policies") {
  for (const char* p : {"mixed_float16", "mixed_bfloat16"}) {
    PolicyScope scope(p);
    auto bn = layers::BatchNormalization();
    Tensor x = Tensor::random_uniform({8, 4, 4, 3}, 100, 101, 1);  // far from zero: 16-bit sums would lose it
    Tensor y = bn(x, {.training = true});
    CHECK(y.dtype() == Policy(p).compute_dtype());
    for (const auto& v : bn->variables()) CHECK(v.dtype() == float32);
    CHECK(bn->variables().size() == 4);
    CHECK(bn->trainable_variables().size() == 2);
    CHECK(bn->non_trainable_variables()[0].path() == "batch_normalization/moving_mean");
    // Normalized output: per-channel mean ~0, std ~1 despite the offset of 100.
    auto yv = y.to_vector<double>();
    for (int c = 0; c < 3; ++c) {
      double m = 0, s = 0;
      for (std::size_t i = c; i < yv.size(); i += 3) m += yv[i];
      m /= static_cast<double>(yv.size() / 3);
      for (std::size_t i = c; i < yv.size(); i += 3) s += (yv[i] - m) * (yv[i] - m);
      s = std::sqrt(s / static_cast<double>(yv.size() / 3));
      CHECK(std::abs(m) < 0.02);
      CHECK(s == doctest::Approx(1.0).epsilon(0.02));
    }
  }
}

TEST_CASE("Add and Concatenate merge inputs and differentiate") {
  for (const char* p : {"float32", "mixed_bfloat16", "float64"}) {
    PolicyScope scope(p);
    auto add = layers::Add();
    auto cat = layers::Concatenate();
    Tensor a = Tensor::random_uniform({2, 3, 3, 4}, -1, 1, 1), b = Tensor::random_uniform({2, 3, 3, 4}, -1, 1, 2);
    Tensor c = Tensor::random_uniform({2, 3, 3, 2}, -1, 1, 3);
    Tensor s = add({a, b, a});
    CHECK(s.dtype() == Policy(p).compute_dtype());
    auto av = a.to(s.dtype()).to_vector<double>(), bv = b.to(s.dtype()).to_vector<double>();
    for (std::size_t i = 0; i < av.size(); ++i) av[i] = 2 * av[i] + bv[i];
    test::check_close(s, av, test::tolerance(s.dtype()), "Add");
    Tensor j = cat({a, c});
    CHECK(j.shape() == Shape{2, 3, 3, 6});
    CHECK(layers::Concatenate({.axis = 1})({a, a}).shape() == Shape{2, 6, 3, 4});
    CHECK(layers::Add()({a, Tensor::ones({1, 1, 1, 4})}).shape() == Shape{2, 3, 3, 4});  // size-1 axes broadcast
  }
  PolicyScope scope("float64");
  auto add = layers::Add();
  auto cat = layers::Concatenate({.axis = -1});
  test::check_gradients("Add", [&](const std::vector<Tensor>& in) { return ops::square(add(in)); },
                        {test::random({2, 3}, float64, Device::cpu(), 4), test::random({2, 3}, float64, Device::cpu(), 5)});
  test::check_gradients("Concatenate", [&](const std::vector<Tensor>& in) { return ops::square(cat(in)); },
                        {test::random({2, 3}, float64, Device::cpu(), 6), test::random({2, 1}, float64, Device::cpu(), 7)});
}

TEST_CASE("layer configs are Keras's") {
  PolicyScope scope("mixed_bfloat16");
  auto conv = config_of(layers::Conv2D(32, {3, 3}, {.strides = 2, .padding = "same", .activation = "relu", .use_bias = false}));
  CHECK(conv["filters"] == 32);
  CHECK(conv["kernel_size"] == pair(3, 3));
  CHECK(conv["strides"] == pair(2, 2));
  CHECK(conv["padding"] == "same");
  CHECK(conv["dilation_rate"] == pair(1, 1));
  CHECK(conv["data_format"] == "channels_last");
  CHECK(conv["activation"] == "relu");
  CHECK(conv["use_bias"] == false);
  CHECK(conv["kernel_initializer"]["class_name"] == "GlorotUniform");
  CHECK(conv["bias_initializer"]["class_name"] == "Zeros");
  auto pool = config_of(layers::MaxPooling2D({3, 3}));
  CHECK(pool["pool_size"] == pair(3, 3));
  CHECK(pool["strides"] == pair(3, 3));  // None means the pool size
  CHECK(pool["padding"] == "valid");
  auto bn = config_of(layers::BatchNormalization({.momentum = 0.9}));
  CHECK(bn["axis"] == -1);
  CHECK(bn["momentum"] == 0.9);
  CHECK(bn["epsilon"] == 0.001);
  CHECK(bn["center"] == true);
  CHECK(bn["scale"] == true);
  CHECK(bn["moving_variance_initializer"]["class_name"] == "Ones");
  auto ln = config_of(layers::LayerNormalization());
  CHECK(ln["epsilon"] == 0.001);
  CHECK(config_of(layers::ZeroPadding2D({{1, 2}, {3, 4}}))["padding"] == nlohmann::json::array({pair(1, 2), pair(3, 4)}));
  CHECK(config_of(layers::GlobalAveragePooling2D())["keepdims"] == false);
  CHECK(config_of(layers::Concatenate({.axis = 1}))["axis"] == 1);
  // Rebuilt from their configs (what load_model does).
  for (LayerRef l : {layers::Conv2D(8, {3, 1}, {.strides = {2, 1}, .padding = "same", .dilation_rate = 1, .activation = "tanh"}),
                     layers::AveragePooling2D({2, 3}, {.strides = 1}), layers::BatchNormalization({.momentum = 0.8, .center = false}),
                     layers::LayerNormalization({.epsilon = 1e-5}), layers::ZeroPadding2D({{1, 2}, {3, 4}}), layers::Add(),
                     layers::Concatenate({.axis = 2}), layers::GlobalAveragePooling2D({.keepdims = true}), layers::MaxPooling2D()}) {
    LayerConfig c{l->class_name(), l->name(), l->dtype_policy(), true, l->config()};
    LayerRef back = layer_from_config(c);
    CHECK(back->class_name() == l->class_name());
    CHECK(back->config() == l->config());
  }
}

TEST_CASE("DepthwiseConv2D convolves each channel with its own depth_multiplier filters, as Keras") {
  PolicyScope scope("float64");
  const std::int64_t C = 3, M = 2;
  auto dw = layers::DepthwiseConv2D({2, 3}, {.depth_multiplier = M, .bias_initializer = "random_uniform"});
  Tensor x = Tensor::random_uniform({2, 4, 5, C}, -1, 1, 1, float64);
  Tensor y = dw(x);
  REQUIRE(y.shape() == Shape{2, 3, 3, C * M});
  auto vars = dw->variables();
  REQUIRE(vars.size() == 2);
  CHECK(vars[0].path() == "depthwise_conv2d/kernel");  // Keras 3's name
  CHECK(vars[0].shape() == Shape{2, 3, C, M});         // and shape
  CHECK(vars[1].shape() == Shape{C * M});
  const auto xv = x.to_vector<double>(), k = vars[0].value().to_vector<double>(), b = vars[1].value().to_vector<double>();
  std::vector<double> want;
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t oy = 0; oy < 3; ++oy)
      for (std::int64_t ox = 0; ox < 3; ++ox)
        for (std::int64_t c = 0; c < C; ++c)
          for (std::int64_t m = 0; m < M; ++m) {  // output channel c * M + m, from input channel c only
            double acc = b[c * M + m];
            for (std::int64_t i = 0; i < 2; ++i)
              for (std::int64_t j = 0; j < 3; ++j)
                acc += xv[((n * 4 + oy + i) * 5 + ox + j) * C + c] * k[((i * 3 + j) * C + c) * M + m];
            want.push_back(acc);
          }
  test::check_close(y, want, {1e-12, 1e-12}, "DepthwiseConv2D against per-channel loops");
  // A grouped Conv2D: its kernel [kh, kw, 1, C * M] is the depthwise one in the same order.
  auto grouped = layers::Conv2D(C * M, {2, 3}, {.groups = C});
  grouped(x);
  grouped->variables()[0].assign(ops::reshape(vars[0].value(), {2, 3, 1, C * M}));
  grouped->variables()[1].assign(vars[1].value());
  CHECK(grouped->variables()[0].shape() == Shape{2, 3, 1, C * M});
  test::check_close(grouped(x), want, {1e-12, 1e-12}, "Conv2D(groups = C) with the depthwise kernel");
  // Glorot's fans are Keras's for [kh, kw, C, M]: limit sqrt(6 / ((C + M) * kh * kw)).
  PolicyScope f32("float32");
  auto big = layers::DepthwiseConv2D(3, {.depth_multiplier = 4});
  big(Tensor::zeros({1, 3, 3, 64}));
  double lim = 0;
  for (double v : big->variables()[0].value().to_vector<double>()) lim = std::max(lim, std::abs(v));
  CHECK(lim <= std::sqrt(6.0 / ((64 + 4) * 9)) + 1e-7);
  CHECK(lim > 0.9 * std::sqrt(6.0 / ((64 + 4) * 9)));
}

TEST_CASE("grouped Conv2D and DepthwiseConv2D: configs, rules and load_model registration as Keras's") {
  PolicyScope scope("float32");
  auto conv = config_of(layers::Conv2D(8, 3, {.groups = 4}));
  CHECK(conv["groups"] == 4);
  auto d = config_of(layers::DepthwiseConv2D({3, 1}, {.strides = 2, .padding = "same", .depth_multiplier = 3,
                                                      .dilation_rate = 1, .activation = "relu", .use_bias = false,
                                                      .depthwise_initializer = "he_normal",
                                                      .depthwise_regularizer = regularizers::L2(0.01),
                                                      .depthwise_constraint = constraints::MaxNorm(1.5)}));
  // Keras 3.15's DepthwiseConv2D.get_config keys, and no others.
  std::set<std::string> keys;
  for (auto it = d.begin(); it != d.end(); ++it) keys.insert(it.key());
  CHECK(keys == std::set<std::string>{"depth_multiplier", "kernel_size", "strides", "padding", "data_format",
                                      "dilation_rate", "activation", "use_bias", "depthwise_initializer",
                                      "bias_initializer", "depthwise_regularizer", "bias_regularizer",
                                      "activity_regularizer", "depthwise_constraint", "bias_constraint"});
  CHECK(d["depth_multiplier"] == 3);
  CHECK(d["kernel_size"] == pair(3, 1));
  CHECK(d["strides"] == pair(2, 2));
  CHECK(d["data_format"] == "channels_last");
  CHECK(d["depthwise_initializer"]["class_name"] == "HeNormal");
  CHECK(d["depthwise_regularizer"]["class_name"] == "L2");
  CHECK(d["depthwise_constraint"]["class_name"] == "MaxNorm");
  CHECK(d["bias_regularizer"].is_null());
  for (LayerRef l : {layers::Conv2D(6, {3, 1}, {.groups = 3, .kernel_regularizer = regularizers::L1(0.1)}),
                     layers::DepthwiseConv2D(3, {.depth_multiplier = 2, .depthwise_regularizer = regularizers::L2(0.5),
                                                 .depthwise_constraint = constraints::NonNeg()})}) {
    LayerConfig c{l->class_name(), l->name(), l->dtype_policy(), true, l->config()};
    LayerRef back = layer_from_config(c);
    CHECK(back->class_name() == l->class_name());
    CHECK(back->config() == l->config());
  }
  // The depthwise regularizer and constraint act on the kernel: a loss, and a projection.
  auto dw = layers::DepthwiseConv2D(2, {.depthwise_regularizer = regularizers::L2(0.5),
                                        .depthwise_constraint = constraints::NonNeg()});
  dw(Tensor::ones({1, 3, 3, 2}));
  auto k = dw->variables()[0];
  k.assign(Tensor::full(k.shape(), -1.0));
  auto losses = dw->losses();
  REQUIRE(losses.size() == 1);
  CHECK(losses[0].item() == doctest::Approx(0.5 * 8));
  dw->apply_constraints();
  for (double v : k.value().to_vector<double>()) CHECK(v == 0.0);
  // A Keras config with fields mpt does not have is refused naming them.
  nlohmann::json keras_cfg = config_of(layers::DepthwiseConv2D(3));
  keras_cfg["data_format"] = "channels_first";
  CHECK_ERROR_HAS(layer_from_config({"DepthwiseConv2D", "dw", Policy("float32"), true, keras_cfg}), "DepthwiseConv2D",
                  "data_format", "channels_first");
}

TEST_CASE("bad configurations and inputs raise mpt::Error naming the layer") {
  PolicyScope scope("float32");
  CHECK_ERROR_HAS(layers::Conv2D(8, {5, 5})(Tensor::zeros({1, 4, 4, 3})), "Conv2D 'conv2d'", "[5, 5]", "4x4", "valid",
                  "(1, 4, 4, 3)");
  CHECK_ERROR_HAS(layers::Conv2D(8, 3, {.dilation_rate = 2})(Tensor::zeros({1, 4, 4, 3})), "Conv2D", "dilated to [5, 5]");
  CHECK(layers::Conv2D(8, {5, 5}, {.padding = "same"})(Tensor::zeros({1, 4, 4, 3})).shape() == Shape{1, 4, 4, 8});
  CHECK_ERROR_HAS(layers::Conv2D(8, 3)(Tensor::zeros({4, 4, 3})), "Conv2D 'conv2d'", "rank 4", "(4, 4, 3)");
  auto conv = layers::Conv2D(8, 3);
  conv(Tensor::zeros({1, 5, 5, 3}));
  CHECK_ERROR_HAS(conv(Tensor::zeros({1, 5, 5, 4})), "Conv2D 'conv2d'", "3 input channels", "(1, 5, 5, 4)");
  CHECK_ERROR_HAS(layers::Conv2D(0, 3), "Conv2D", "filters");
  CHECK_ERROR_HAS(layers::Conv2D(4, 3, {.padding = "causal"}), "Conv2D", "causal");
  CHECK_ERROR_HAS(layers::Conv2D(4, 3, {.activation = "swishy"}), "swishy");
  CHECK_ERROR_HAS(layers::Conv2D(5, 3, {.groups = 2}), "Conv2D 'conv2d'", "filters = 5", "groups = 2");
  CHECK_ERROR_HAS(layers::Conv2D(4, 3, {.groups = 0}), "Conv2D", "groups", "got 0");
  CHECK_ERROR_HAS(layers::Conv2D(6, 3, {.groups = 3})(Tensor::zeros({1, 5, 5, 4})), "Conv2D 'conv2d'", "4 channels",
                  "groups = 3", "(1, 5, 5, 4)");
  auto grouped = layers::Conv2D(4, 3, {.groups = 2});
  grouped(Tensor::zeros({1, 5, 5, 4}));
  CHECK_ERROR_HAS(grouped(Tensor::zeros({1, 5, 5, 6})), "Conv2D 'conv2d'", "4 input channels", "(1, 5, 5, 6)");
  CHECK_ERROR_HAS(layers::DepthwiseConv2D(3, {.depth_multiplier = 0}), "DepthwiseConv2D 'depthwise_conv2d'",
                  "depth_multiplier", "0");
  CHECK_ERROR_HAS(layers::DepthwiseConv2D(3, {.padding = "causal"}), "DepthwiseConv2D", "causal");
  CHECK_ERROR_HAS(layers::DepthwiseConv2D(5)(Tensor::zeros({1, 4, 4, 3})), "DepthwiseConv2D", "[5, 5]", "4x4");
  auto dw = layers::DepthwiseConv2D(3);
  dw(Tensor::zeros({1, 5, 5, 3}));
  CHECK_ERROR_HAS(dw(Tensor::zeros({1, 5, 5, 2})), "DepthwiseConv2D 'depthwise_conv2d'", "3 input channels",
                  "(1, 5, 5, 2)");
  CHECK_ERROR_HAS(layers::MaxPooling2D(3)(Tensor::zeros({1, 2, 2, 1})), "MaxPooling2D 'max_pooling2d'", "[3, 3]", "2x2");
  CHECK_ERROR_HAS(layers::AveragePooling2D()(Tensor::zeros({2, 4})), "AveragePooling2D", "rank 4", "(2, 4)");
  CHECK_ERROR_HAS(layers::GlobalAveragePooling2D()(Tensor::zeros({2, 4, 4})), "GlobalAveragePooling2D", "(2, 4, 4)");
  CHECK_ERROR_HAS(layers::Add({.name = "merge"})({Tensor::zeros({2, 4, 4, 32}), Tensor::zeros({2, 4, 4, 64})}), "Add 'merge'",
                  "(2, 4, 4, 32)", "(2, 4, 4, 64)");
  CHECK_ERROR_HAS(layers::Add()(Tensor::zeros({2, 3})), "Add", "at least 2 inputs");
  CHECK_ERROR_HAS(layers::Concatenate()({Tensor::zeros({2, 3}), Tensor::zeros({3, 3})}), "Concatenate", "(2, 3)", "(3, 3)");
  CHECK_ERROR_HAS(layers::BatchNormalization({.axis = 1})(Tensor::zeros({2, 3, 4})), "BatchNormalization", "axis 1");
  CHECK_ERROR_HAS(layers::BatchNormalization()(Tensor::zeros({4})), "BatchNormalization", "rank >= 2");
  auto bn = layers::BatchNormalization();
  bn(Tensor::zeros({2, 3}));
  CHECK_ERROR_HAS(bn(Tensor::zeros({2, 5})), "BatchNormalization 'batch_normalization'", "(2, 5)");
  CHECK_ERROR_HAS(layers::BatchNormalization({.momentum = 1.5}), "momentum");
  CHECK_ERROR_HAS(layers::ZeroPadding2D(-1), "ZeroPadding2D", "padding");
}

namespace {
/// Sequential({Input, BatchNormalization}): the BN input is the data itself.
std::unique_ptr<Sequential> bn_model(double momentum) {
  return std::make_unique<Sequential>(
      std::initializer_list<LayerRef>{layers::Input({4, 4, 3}), layers::BatchNormalization({.momentum = momentum})});
}

std::vector<double> values(const Variable& v) { return v.value().to_vector<double>(); }

Variable var(Model& m, const std::string& path) {
  for (const auto& v : m.variables())
    if (v.path() == path) return v;
  FAIL("no variable ", path);
  return {};
}
}  // namespace

TEST_CASE("BatchNormalization moves its statistics as Keras 3 does, once the step is applied") {
  PolicyScope scope("float32");
  const double momentum = 0.9;
  auto m = bn_model(momentum);
  m->compile({.optimizer = optimizers::SGD({.learning_rate = 0.1}), .loss = "mse"});
  Tensor x = Tensor::random_uniform({6, 4, 4, 3}, -1, 3, 1), y = Tensor::random_uniform({6, 4, 4, 3}, -1, 1, 2);
  auto xv = x.to_vector<double>();
  std::vector<double> mean(3, 0), var_b(3, 0);
  const double n = 6 * 16;
  for (std::size_t i = 0; i < xv.size(); ++i) mean[i % 3] += xv[i] / n;
  for (std::size_t i = 0; i < xv.size(); ++i) var_b[i % 3] += (xv[i] - mean[i % 3]) * (xv[i] - mean[i % 3]) / n;
  const auto gamma0 = values(var(*m, "batch_normalization/gamma"));
  m->train_on_batch(x, y);
  auto mm = values(var(*m, "batch_normalization/moving_mean")), mv = values(var(*m, "batch_normalization/moving_variance"));
  for (int c = 0; c < 3; ++c) {
    // moving = moving * momentum + batch * (1 - momentum); the biased batch variance (Keras 3)
    CHECK(mm[c] == doctest::Approx(0.0 * momentum + mean[c] * (1 - momentum)).epsilon(1e-5));
    CHECK(mv[c] == doctest::Approx(1.0 * momentum + var_b[c] * (1 - momentum)).epsilon(1e-5));
  }
  CHECK(values(var(*m, "batch_normalization/gamma")) != gamma0);
  // Inference uses the moving statistics.
  Tensor p = m->predict(x.slice(0, 1));
  auto pv = p.to_vector<double>();
  auto g = values(var(*m, "batch_normalization/gamma")), b = values(var(*m, "batch_normalization/beta"));
  for (int i = 0; i < 3; ++i)
    CHECK(pv[i] == doctest::Approx((xv[i] - mm[i]) / std::sqrt(mv[i] + 1e-3) * g[i] + b[i]).epsilon(1e-4));
}

TEST_CASE("a skipped loss-scale step leaves BatchNormalization's statistics and weights untouched") {
  PolicyScope scope("mixed_float16");
  auto m = bn_model(0.99);
  // Scale 2^24: the float16 gradients of this loss overflow, so the step is skipped.
  m->compile({.optimizer = mixed_precision::LossScaleOptimizer(optimizers::SGD({.learning_rate = 0.1}),
                                                               {.initial_scale = 16777216.0}),
              .loss = "mse"});
  Tensor x = Tensor::random_uniform({4, 4, 4, 3}, -1, 3, 3), y = Tensor::full({4, 4, 4, 3}, 1000.0);
  auto before = m->get_weights();
  m->train_on_batch(x, y);
  REQUIRE(m->loss_scale_optimizer() != nullptr);
  CHECK(m->loss_scale_optimizer()->skipped_steps() == 1);
  auto after = m->get_weights();
  REQUIRE(before.size() == 4);
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(after[i].to_vector<float>() == before[i].to_vector<float>());
  // The next call does not commit the dropped statistics either.
  m->predict(x);
  CHECK(values(var(*m, "batch_normalization/moving_mean")) == before[2].to_vector<double>());
  // Once the scale is back down, a step applies and the statistics move.
  Tensor y_small = Tensor::random_uniform({4, 4, 4, 3}, -1, 1, 4);
  for (int i = 0; i < 40 && m->loss_scale_optimizer()->iterations() == 0; ++i) m->train_on_batch(x, y_small);
  REQUIRE(m->loss_scale_optimizer()->iterations() == 1);
  CHECK(values(var(*m, "batch_normalization/moving_mean")) != before[2].to_vector<double>());
}

TEST_CASE("custom loops: finish_step(false) drops the statistics, a new call without it commits them") {
  PolicyScope scope("float32");
  auto m = bn_model(0.5);
  m->build({4, 4, 3});
  mixed_precision::LossScaleOptimizer opt(optimizers::SGD({.learning_rate = 0.1}), {.initial_scale = 1.0});
  Tensor x = Tensor::random_uniform({2, 4, 4, 3}, 1, 2, 5);
  auto mean_of = [&] { return values(var(*m, "batch_normalization/moving_mean")); };
  const auto zero = mean_of();
  auto step = [&](bool poison) {
    GradientTape tape;
    Tensor loss = ops::mean(ops::square((*m)(x, {.training = true})));
    auto grads = opt.get_unscaled_gradients(tape.gradient(opt.get_scaled_loss(loss), m->trainable_variables()));
    if (poison) grads[0] = ops::mul(grads[0], Tensor::scalar(INFINITY));
    auto r = opt.apply_gradients_checked(grads, m->trainable_variables());
    m->finish_step(r.applied);
    return r.applied;
  };
  CHECK_FALSE(step(true));
  CHECK(mean_of() == zero);
  CHECK(step(false));
  const auto once = mean_of();
  CHECK(once != zero);
  CHECK(once[0] == doctest::Approx(0.5 * 1.5).epsilon(0.05));  // half way to a batch mean of ~1.5
  // A loop that never calls finish_step: the pending statistics are committed by the next call.
  { GradientTape tape; (*m)(x, {.training = true}); }
  CHECK(mean_of() == once);
  (*m)(x);
  CHECK(mean_of()[0] == doctest::Approx(0.75 * 1.5).epsilon(0.05));
}

namespace {
/// 10 classes: a bright 3x3 patch at one of 10 places on a noisy 16x16 image.
std::pair<Tensor, Tensor> patches(std::int64_t n, std::uint64_t seed) {
  auto noise = Tensor::random_uniform({n, 16, 16, 1}, 0, 0.3, seed).to_vector<float>();
  auto cls = Tensor::random_uniform({n}, 0, 10, seed + 1).to_vector<float>();
  std::vector<std::int32_t> labels(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const int k = std::min(9, static_cast<int>(cls[i]));
    labels[i] = k;
    const int r = 2 + (k / 5) * 7, c = 1 + (k % 5) * 3;
    for (int dy = 0; dy < 3; ++dy)
      for (int dx = 0; dx < 3; ++dx) noise[((i * 16 + r + dy) * 16) + c + dx] += 0.7f;
  }
  return {Tensor::from_vector(noise, {n, 16, 16, 1}), Tensor::from_vector(labels, {n})};
}
}  // namespace

TEST_CASE("a Sequential CNN (model C) learns a synthetic image task under each policy") {
  auto [x, y] = patches(640, 7);
  for (const char* p : {"float32", "mixed_float16", "mixed_bfloat16"}) {
    CAPTURE(p);
    PolicyScope scope(p);
    set_random_seed(3);
    Sequential model({layers::Input({16, 16, 1}), layers::Conv2D(32, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}),
                      layers::Conv2D(64, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}), layers::Flatten(),
                      layers::Dense(128, {.activation = "relu"}), layers::Dense(10), layers::Activation("softmax")});
    model.compile({.optimizer = optimizers::Adam({.learning_rate = 2e-3}), .loss = "sparse_categorical_crossentropy",
                   .metrics = {"accuracy"}});
    CHECK(model.count_params() == (9 * 32 + 32) + (9 * 32 * 64 + 64) + (2 * 2 * 64 * 128 + 128) + (128 * 10 + 10));
    auto h = model.fit(x, y, {.batch_size = 64, .epochs = 4, .verbose = 0});
    const auto& loss = h.history["loss"];
    CHECK(loss.back() < 0.5 * loss.front());
    auto scores = model.evaluate(x, y, {.batch_size = 128});
    CHECK(scores["accuracy"] > 0.6);  // chance: 0.1
    CHECK(model.predict(x.slice(0, 4)).dtype() == float32);
  }
}
