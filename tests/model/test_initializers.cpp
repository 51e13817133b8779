// Keras's initializers with their arguments (mpt/initializers.hpp): each one's statistics
// against Keras's definition (keras/src/initializers), Keras's fans for Dense and Conv2D
// kernels, Orthogonal and Identity, determinism by seed on every device, and the saved form
// both ways (layer configs, load_model's configs, refusals naming class, layer and field).
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "io/model_config.hpp"
#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;
namespace layers = mpt::layers;
namespace init = mpt::initializers;

namespace {

struct Stats {
  double mean = 0, stddev = 0, min = std::numeric_limits<double>::infinity(),
         max = -std::numeric_limits<double>::infinity();
};

std::vector<double> values(const Tensor& t) {
  const auto f = t.to(Device::cpu()).to(float32).to_vector<float>();
  return {f.begin(), f.end()};
}

Stats stats_of(const Tensor& t) {
  Stats s;
  const auto v = values(t);
  for (double x : v) s.mean += x, s.min = std::min(s.min, x), s.max = std::max(s.max, x);
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = std::sqrt(s.stddev / static_cast<double>(v.size()));
  return s;
}

/// Mean and stddev of n samples of a distribution with stddev `sd` agree with (mean, sd) to
/// 5 standard errors (the stddev's standard error is about sd / sqrt(2n)).
void check_moments(const Stats& s, double mean, double sd, double n, const std::string& what) {
  INFO(what, ": mean ", s.mean, " (want ", mean, "), stddev ", s.stddev, " (want ", sd, ")");
  CHECK(std::abs(s.mean - mean) <= 5 * sd / std::sqrt(n) + 1e-12);
  CHECK(std::abs(s.stddev - sd) <= 5 * sd / std::sqrt(2 * n) + 1e-12);
}

/// max |A^T A - gain² I| (columns) or |A A^T - gain² I| (rows) of a [rows, cols] matrix.
double orthogonality_error(const std::vector<double>& a, std::int64_t rows, std::int64_t cols, bool by_columns,
                           double gain) {
  const std::int64_t k = by_columns ? cols : rows, len = by_columns ? rows : cols;
  auto at = [&](std::int64_t vec, std::int64_t i) {
    return by_columns ? a[static_cast<std::size_t>(i * cols + vec)] : a[static_cast<std::size_t>(vec * cols + i)];
  };
  double worst = 0;
  for (std::int64_t p = 0; p < k; ++p)
    for (std::int64_t q = 0; q < k; ++q) {
      double dot = 0;
      for (std::int64_t i = 0; i < len; ++i) dot += at(p, i) * at(q, i);
      worst = std::max(worst, std::abs(dot - (p == q ? gain * gain : 0.0)));
    }
  return worst;
}

init::Axes axes(std::initializer_list<std::int64_t> a) { return std::vector<std::int64_t>(a); }

}  // namespace

TEST_CASE("compute_fans is Keras's for every kernel rank") {
  using P = std::pair<double, double>;
  CHECK(init::compute_fans({}) == P{1, 1});
  CHECK(init::compute_fans({7}) == P{7, 7});
  CHECK(init::compute_fans({3, 5}) == P{3, 5});                       // Dense [in, out]
  CHECK(init::compute_fans({3, 3, 4, 8}) == P{36, 72});               // Conv2D [kh, kw, in, out]
  CHECK(init::compute_fans({8, 2, 4}) == P{16, 32});                  // EinsumDense [in, heads, dim]
  CHECK(init::compute_fans({4, 2, 3}, axes({0}), axes({1, -1})) == P{4, 6});  // with input/output axes
  CHECK(init::compute_fans({4, 2, 3}, axes({0}), std::nullopt) == P{8, 12});  // one of them: ignored, as Keras
  CHECK(contains(error_of([] { init::compute_fans({4, 2}, axes({2}), axes({1})); }), "input_axes 2 is outside"));
}

TEST_CASE("each initializer's statistics are Keras's definition, on every device") {
  for_each_device([](Device device) {
    PolicyDeviceScope scope("float32", device);
    const Shape big = {400, 500};
    const double n = 400.0 * 500.0;
    {
      Stats s = stats_of(init::RandomNormal({.mean = 0.3, .stddev = 0.5, .seed = 1})(big));
      check_moments(s, 0.3, 0.5, n, "RandomNormal");
    }
    {
      Stats s = stats_of(init::RandomUniform({.minval = -0.2, .maxval = 0.6, .seed = 2})(big));
      check_moments(s, 0.2, 0.8 / std::sqrt(12.0), n, "RandomUniform");
      CHECK(s.min >= -0.2);
      CHECK(s.max <= 0.6);
      CHECK(s.min < -0.199);
      CHECK(s.max > 0.599);
    }
    {
      // Keras's truncated normal: within 2 stddev of the mean, stddev 0.8796 · stddev.
      Stats s = stats_of(init::TruncatedNormal({.mean = 1.0, .stddev = 0.5, .seed = 3})(big));
      check_moments(s, 1.0, 0.5 * 0.87962566103423978, n, "TruncatedNormal");
      CHECK(s.min >= 0.0);
      CHECK(s.max <= 2.0);
      CHECK(s.min < 0.01);
      CHECK(s.max > 1.99);
    }
    CHECK(stats_of(init::Zeros()({3, 4})).max == 0.0);
    CHECK(stats_of(init::Ones()({3, 4})).min == 1.0);
    {
      Stats s = stats_of(init::Constant(0.25)({3, 4}));
      CHECK(s.min == 0.25);
      CHECK(s.max == 0.25);
    }
    // VarianceScaling on a Dense kernel [300, 700] and a Conv2D kernel [3, 3, 40, 60]: the
    // variance is scale / fan whatever the distribution.
    struct Kernel {
      Shape shape;
      double fan_in, fan_out;
    };
    for (const Kernel& k : {Kernel{{300, 700}, 300, 700}, Kernel{{3, 3, 40, 60}, 360, 540}}) {
      const double kn = static_cast<double>(k.shape[0] * k.shape[1] * (k.shape.size() > 2 ? k.shape[2] * k.shape[3] : 1));
      for (const char* mode : {"fan_in", "fan_out", "fan_avg"})
        for (const char* dist : {"truncated_normal", "untruncated_normal", "uniform"}) {
          const double fan = std::string(mode) == "fan_in"    ? k.fan_in
                             : std::string(mode) == "fan_out" ? k.fan_out
                                                              : (k.fan_in + k.fan_out) / 2;
          const double sd = std::sqrt(1.5 / fan);
          Stats s = stats_of(init::VarianceScaling({.scale = 1.5, .mode = mode, .distribution = dist, .seed = 4})(k.shape));
          const std::string what = std::string("VarianceScaling ") + mode + " " + dist + " " + to_string(k.shape);
          check_moments(s, 0.0, sd, kn, what);
          INFO(what, ": min ", s.min, " max ", s.max);
          if (std::string(dist) == "uniform") CHECK(std::max(-s.min, s.max) <= std::sqrt(3.0) * sd * (1 + 1e-6));
          if (std::string(dist) == "truncated_normal")
            CHECK(std::max(-s.min, s.max) <= 2 * sd / 0.87962566103423978 * (1 + 1e-6));
        }
    }
    // The named forms are VarianceScaling at Keras's arguments, value for value; names as well.
    struct Form {
      init::Initializer named;
      init::VarianceScalingOptions as;
      const char* name;
    };
    const Shape kernel = {3, 3, 8, 16};
    auto vs = [](double scale, const char* mode, const char* distribution) {
      return init::VarianceScalingOptions{.scale = scale, .mode = mode, .distribution = distribution, .seed = 9};
    };
    for (const Form& f : {Form{init::GlorotNormal({.seed = 9}), vs(1.0, "fan_avg", "truncated_normal"), "glorot_normal"},
                          Form{init::GlorotUniform({.seed = 9}), vs(1.0, "fan_avg", "uniform"), "glorot_uniform"},
                          Form{init::HeNormal({.seed = 9}), vs(2.0, "fan_in", "truncated_normal"), "he_normal"},
                          Form{init::HeUniform({.seed = 9}), vs(2.0, "fan_in", "uniform"), "he_uniform"},
                          Form{init::LecunNormal({.seed = 9}), vs(1.0, "fan_in", "truncated_normal"), "lecun_normal"},
                          Form{init::LecunUniform({.seed = 9}), vs(1.0, "fan_in", "uniform"), "lecun_uniform"}}) {
      INFO(f.name);
      const auto want = values(init::VarianceScaling(f.as)(kernel));
      CHECK(values(f.named(kernel)) == want);
      CHECK(values(initialize(f.name, kernel, float32, 9)) == want);
    }
  });
}

TEST_CASE("Orthogonal is orthogonal to 1e-5 and Identity is gain times the identity, on every device") {
  for_each_device([](Device device) {
    PolicyDeviceScope scope("float32", device);
    // Tall: orthonormal columns; wide: orthonormal rows; a conv kernel flattens to [kh·kw·in, out].
    CHECK(orthogonality_error(values(init::Orthogonal({.seed = 1})({64, 32})), 64, 32, true, 1.0) < 1e-5);
    CHECK(orthogonality_error(values(init::Orthogonal({.seed = 2})({32, 64})), 32, 64, false, 1.0) < 1e-5);
    CHECK(orthogonality_error(values(init::Orthogonal({.gain = 2.0, .seed = 3})({3, 3, 8, 16})), 72, 16, true, 2.0) < 1e-5);
    CHECK(orthogonality_error(values(init::Orthogonal({.seed = 4})({40, 40})), 40, 40, true, 1.0) < 1e-5);
    CHECK(orthogonality_error(values(init::Orthogonal({.seed = 4})({40, 40})), 40, 40, false, 1.0) < 1e-5);
    CHECK(contains(error_of([] { init::Orthogonal()({5}); }), "rank >= 2"));

    const auto eye = values(init::Identity(2.0)({3, 5}));
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 5; ++j) CHECK(eye[i * 5 + j] == (i == j ? 2.0 : 0.0));
    CHECK(values(init::Initializer("identity")({2, 2})) == std::vector<double>{1, 0, 0, 1});
    CHECK(contains(error_of([] { init::Identity()({2, 2, 2}); }), "Identity needs a 2-d shape"));
  });
}

TEST_CASE("a seeded initializer is deterministic: same seed, same values, on every device") {
  std::vector<init::Initializer> seeded = {
      init::RandomNormal({.stddev = 0.3, .seed = 11}), init::RandomUniform({.seed = 11}),
      init::TruncatedNormal({.seed = 11}),             init::VarianceScaling({.scale = 2.0, .seed = 11}),
      init::HeNormal({.seed = 11}),                    init::Orthogonal({.seed = 11})};
  std::vector<std::vector<double>> on_cpu;
  for (const auto& i : seeded) on_cpu.push_back(values(i({6, 10})));
  for_each_device([&](Device device) {
    PolicyDeviceScope scope("float32", device);
    set_random_seed(1);
    for (std::size_t k = 0; k < seeded.size(); ++k) {
      INFO(seeded[k].class_name);
      const auto a = values(seeded[k]({6, 10}));
      CHECK(a == values(seeded[k]({6, 10})));  // the global stream does not enter
      check_close(a, on_cpu[k], {1e-6, 1e-7}, seeded[k].class_name + " on " + device.str() + " vs the CPU");
      init::Initializer other = seeded[k];
      other.seed = 12;
      CHECK(values(other({6, 10})) != a);
      other.seed = std::nullopt;  // unseeded: the global stream, new values each call
      CHECK(values(other({6, 10})) != values(other({6, 10})));
    }
    // In layers: two layers with the same seeded initializer start equal; unseeded ones do not.
    auto dense = [](init::Initializer i) {
      auto l = layers::Dense(8, {.kernel_initializer = std::move(i)});
      l(Tensor::ones({2, 5}));
      return values(l->variables()[0].value());
    };
    CHECK(dense(init::GlorotNormal({.seed = 5})) == dense(init::GlorotNormal({.seed = 5})));
    CHECK(dense(init::GlorotNormal({.seed = 5})) == values(init::GlorotNormal({.seed = 5})({5, 8})));
    CHECK(dense("glorot_normal") != dense("glorot_normal"));
  });
}

TEST_CASE("layers take initializers with arguments and save them as Keras does") {
  auto l = layers::Dense(16, {.kernel_initializer = init::RandomNormal({.stddev = 0.5, .seed = 3}),
                              .bias_initializer = init::Constant(0.1)});
  l(Tensor::ones({2, 4}));
  const auto kernel = l->variables()[0].value();
  check_moments(stats_of(kernel), 0.0, 0.5, 64, "Dense kernel");
  CHECK(values(kernel) == values(init::RandomNormal({.stddev = 0.5, .seed = 3})({4, 16})));
  CHECK(stats_of(l->variables()[1].value()).min == doctest::Approx(0.1));
  const nlohmann::json c = l->config();
  CHECK(c["kernel_initializer"] == nlohmann::json::parse(R"({"module": "keras.initializers", "class_name": "RandomNormal",
      "config": {"seed": 3, "mean": 0.0, "stddev": 0.5}, "registered_name": null})"));
  CHECK(c["bias_initializer"]["class_name"] == "Constant");
  CHECK(c["bias_initializer"]["config"] == nlohmann::json{{"value", 0.1}});
  // Names are Keras's classes at their default arguments.
  const nlohmann::json d = layers::Dense(2)->config();
  CHECK(d["kernel_initializer"] == nlohmann::json::parse(R"({"module": "keras.initializers", "class_name": "GlorotUniform",
      "config": {"seed": null, "input_axes": null, "output_axes": null}, "registered_name": null})"));
  CHECK(d["bias_initializer"]["class_name"] == "Zeros");
  CHECK(layers::Embedding(4, 2)->config()["embeddings_initializer"]["config"] ==
        nlohmann::json::parse(R"({"seed": null, "minval": -0.05, "maxval": 0.05})"));
  // A named form whose arguments were changed saves as the VarianceScaling it is.
  init::Initializer changed = init::HeNormal();
  changed.scale = 3.0;
  CHECK(init::serialize(changed)["class_name"] == "VarianceScaling");
  CHECK(init::serialize(changed)["config"]["scale"] == 3.0);
  CHECK(init::serialize(init::Identity())["config"] == nlohmann::json::object());  // as Keras 3.15
  CHECK(init::serialize(init::Identity(2.0))["config"] == nlohmann::json{{"gain", 2.0}});
  // Names and their errors.
  CHECK(init::Initializer("HeUniform") == init::HeUniform());
  CHECK(init::Initializer("normal") == init::RandomNormal());
  CHECK(init::Initializer("IdentityInitializer") == init::Identity());
  CHECK(contains(error_of([] { layers::Dense(2, {.kernel_initializer = "he_unifrom"}); }),
                 "unknown initializer 'he_unifrom'; valid: zeros"));
  CHECK(contains(error_of([] { init::VarianceScaling({.scale = 0.0}); }), "scale must be > 0"));
  CHECK(contains(error_of([] { init::VarianceScaling({.mode = "fan_sum"}); }), "mode 'fan_sum'"));
  CHECK(contains(error_of([] { init::RandomNormal({.stddev = -1}); }), "stddev must be >= 0"));
}

TEST_CASE("initializers round-trip through configs, and what mpt cannot honour is refused by name") {
  const std::vector<init::Initializer> all = {
      init::Zeros(),
      init::Ones(),
      init::Constant(-0.5),
      init::RandomNormal({.mean = 0.1, .stddev = 0.2, .seed = 1}),
      init::RandomUniform({.minval = -1, .maxval = 2}),
      init::TruncatedNormal({.mean = 0.5, .stddev = 0.05, .seed = 2}),
      init::VarianceScaling({.scale = 0.5, .mode = "fan_out", .distribution = "untruncated_normal", .seed = 3}),
      init::VarianceScaling({.distribution = "uniform", .input_axes = axes({0}), .output_axes = axes({1})}),
      init::GlorotNormal(),
      init::GlorotUniform({.seed = 4}),
      init::HeNormal({.seed = 5}),
      init::HeUniform(),
      init::LecunNormal({.input_axes = axes({0, 1}), .output_axes = axes({2})}),
      init::LecunUniform({.seed = 6}),
      init::Orthogonal({.gain = 1.5, .seed = 7}),
      init::Identity(3.0)};
  for (const auto& i : all) {
    INFO(init::serialize(i).dump());
    CHECK(init::deserialize(init::serialize(i), "test") == i);
    CHECK(init::deserialize(nlohmann::json(init::serialize(i)["class_name"]), "test").class_name == i.class_name);
  }
  // Keras 2's form (no module), its VarianceScaling "normal", and names.
  CHECK(init::deserialize(nlohmann::json::parse(R"({"class_name": "VarianceScaling",
            "config": {"scale": 2.0, "mode": "fan_in", "distribution": "normal", "seed": null}})"), "t") ==
        init::VarianceScaling({.scale = 2.0}));
  CHECK(init::deserialize("he_uniform", "t") == init::HeUniform());

  // Through a model's config, every layer that takes initializers, both views.
  auto ids = mpt::Input({5}, {.dtype = int32, .name = "ids"});
  auto h = layers::Embedding(10, 8, {.embeddings_initializer = init::TruncatedNormal({.stddev = 0.02, .seed = 1}),
                                     .name = "emb"})(ids);
  h = layers::Add({.name = "add"})(
      {h, layers::PositionEmbedding(5, {.initializer = init::RandomNormal({.stddev = 0.01}), .name = "pos"})(h)});
  h = layers::MultiHeadAttention(2, 4, {.kernel_initializer = init::Orthogonal({.seed = 2}),
                                        .bias_initializer = init::Constant(0.01),
                                        .name = "mha"})({h, h});
  h = layers::LayerNormalization({.beta_initializer = init::Constant(0.1), .gamma_initializer = init::Ones(),
                                  .name = "ln"})(h);
  h = layers::Reshape({5, 8, 1}, {.name = "img"})(h);
  h = layers::Conv2D(3, {2, 2}, {.kernel_initializer = init::HeNormal({.seed = (1ull << 40) + 5}),
                                 .bias_initializer = init::RandomUniform({.minval = 0, .maxval = 0.1}),
                                 .name = "conv"})(h);
  h = layers::BatchNormalization({.beta_initializer = "ones", .gamma_initializer = init::Constant(0.5),
                                  .moving_mean_initializer = init::Constant(0.2),
                                  .moving_variance_initializer = init::Constant(2.0), .name = "bn"})(h);
  h = layers::Flatten({.name = "flat"})(h);
  h = layers::Dense(3, {.kernel_initializer = init::Identity(2.0),
                        .bias_initializer = init::VarianceScaling({.scale = 0.1, .mode = "fan_avg"}), .name = "out"})(h);
  Model m(ids, h, "m");
  for (bool keras_view : {false, true}) {
    CAPTURE(keras_view);
    const io::Json saved = io::model_config_json(m, keras_view);
    auto back = io::model_from_config(saved, "test");
    for (const auto& l : m.layers()) {
      INFO(l->name());
      nlohmann::json want = l->config();
      if (keras_view && l->name() == "conv") {  // seeds cut to Keras's 31 bits
        CHECK(want["kernel_initializer"]["config"]["seed"] == (1ull << 40) + 5);
        want["kernel_initializer"]["config"]["seed"] = 5;
      }
      CHECK(back->get_layer(l->name())->config() == want);
    }
  }
  // The BatchNormalization statistics start at their initializers.
  for (const auto& v : m.get_layer("bn")->variables())
    if (contains(v.name(), "moving_variance")) CHECK(stats_of(v.value()).min == 2.0);

  // Refusals name the layer, the field and the class (and the argument).
  auto x = mpt::Input({4}, {.name = "x"});
  Model small(x, layers::Dense(2, {.name = "d"})(x), "s");
  const io::Json good = io::model_config_json(small, true);
  auto error_for = [&](const nlohmann::json& value) {
    io::Json c = good;
    for (auto& l : c["config"]["layers"])
      if (l["class_name"] == "Dense") l["config"]["kernel_initializer"] = io::Json(value);
    return error_of([&] { io::model_from_config(c, "test"); });
  };
  auto obj = [](const std::string& cls, nlohmann::json config) {
    return nlohmann::json{{"module", "keras.initializers"}, {"class_name", cls}, {"config", config},
                          {"registered_name", nullptr}};
  };
  CHECK(error_for(obj("Orthogonal", {{"gain", 2.0}, {"seed", 3}})) == "(no error)");
  CHECK(error_for(nullptr) == "(no error)");  // Keras's add_weight default: GlorotUniform
  std::string e = error_for(obj("VarianceScaling", {{"scale", 1.0}, {"mode", "fan_sum"}}));
  CHECK(contains(e, "Dense 'd'"));
  CHECK(contains(e, "kernel_initializer"));
  CHECK(contains(e, "VarianceScaling"));
  CHECK(contains(e, "mode 'fan_sum'"));
  CHECK(contains(error_for(obj("RandomNormal", {{"stddev", 0.5}, {"dtype", "float16"}})), "RandomNormal: field dtype"));
  CHECK(contains(error_for(obj("HeNormal", {{"seed", {{"class_name", "SeedGenerator"}}}})), "seed = {"));
  CHECK(contains(error_for(obj("HeNormal", {{"seed", -1}})), "non-negative"));
  CHECK(contains(error_for(obj("Constant", {{"value", {{"class_name", "__numpy__"}}}})), "Constant, value"));
  CHECK(contains(error_for("he_unifrom"), "unknown initializer 'he_unifrom'"));
  CHECK(contains(error_for(nlohmann::json{{"module", "my_package"}, {"class_name", "MyInit"}, {"config", {}}}),
                 "from module \"my_package\""));

  // A factory that reads an initializer by name (LayerConfig::get) takes only Keras's defaults.
  LayerConfig lc("Dense", "d", mixed_precision::Policy("float32"), true,
                 {{"units", 2}, {"kernel_initializer", init::serialize(init::HeUniform())}});
  CHECK(lc.get("kernel_initializer") == "he_uniform");
  lc.config["kernel_initializer"] = init::serialize(init::HeUniform({.seed = 1}));
  CHECK(contains(error_of([&] { lc.get("kernel_initializer"); }), "reads this initializer by name"));
}
