// MultiHeadAttention: the layer harness (shapes, policies, config, float64 finite differences),
// a float64 reference of Keras's computation from the layer's own weights on every device, the
// dropout path against the fused one, masks, and the functional .keras round trip with a mask
// input and a causal call.
#include <cmath>
#include <filesystem>

#include "attention_test_util.hpp"
#include "layer_harness.hpp"
#include "mpt/layers/attention.hpp"

using namespace mpt;
using namespace mpt::test;
namespace layers = mpt::layers;

namespace {

using Vec = std::vector<double>;

/// Keras's MultiHeadAttention in float64 from the layer's variables (kernels [d, H, K], biases
/// [H, K], output kernel [H, V, out]): x [B, T, d] inputs, mask [B, Tq, Tk] (empty: none). The
/// query, key and value projections too, when asked for.
Vec reference(const LayerRef& layer, const Tensor& query, const Tensor& value, const Tensor& key,
              const std::vector<int>& mask, bool causal, std::vector<Vec>* projections = nullptr) {
  auto vars = layer->variables();
  REQUIRE(vars.size() == 8);
  auto host = [](const Variable& v) { return v.value().to_vector<double>(); };
  const Vec qx = query.to_vector<double>(), vx = value.to_vector<double>(), kx = key.to_vector<double>();
  const std::int64_t B = query.shape()[0], Tq = query.shape()[1], Tk = key.shape()[1];
  const std::int64_t H = vars[0].shape()[1], K = vars[0].shape()[2], V = vars[4].shape()[2], out_dim = vars[6].shape()[2];
  // proj[b, t, h, e] = sum_c x[b, t, c] w[c, h, e] + bias[h, e]
  auto project = [&](const Vec& x, std::int64_t T, const Variable& w, const Variable& bias) {
    const Vec wv = host(w), bv = host(bias);
    const std::int64_t d = w.shape()[0], E = w.shape()[2];
    Vec p(static_cast<std::size_t>(B * T * H * E));
    for (std::int64_t bt = 0; bt < B * T; ++bt)
      for (std::int64_t he = 0; he < H * E; ++he) {
        double s = bv[he];
        for (std::int64_t c = 0; c < d; ++c) s += x[bt * d + c] * wv[c * H * E + he];
        p[bt * H * E + he] = s;
      }
    return p;
  };
  const Vec q = project(qx, Tq, vars[0], vars[1]), k = project(kx, Tk, vars[2], vars[3]),
            v = project(vx, Tk, vars[4], vars[5]);
  if (projections) *projections = {q, k, v};
  const Vec o = attention_reference(q, k, v, B, Tq, Tk, H, K, V, mask, causal, 1 / std::sqrt(double(K)));
  const Vec wo = host(vars[6]), bo = host(vars[7]);
  Vec y(static_cast<std::size_t>(B * Tq * out_dim));
  for (std::int64_t bt = 0; bt < B * Tq; ++bt)
    for (std::int64_t n = 0; n < out_dim; ++n) {
      double s = bo[n];
      for (std::int64_t he = 0; he < H * V; ++he) s += o[bt * H * V + he] * wo[he * out_dim + n];
      y[bt * out_dim + n] = s;
    }
  return y;
}

/// Non-zero biases, so the reference checks that they are added where Keras adds them.
void randomize_biases(const LayerRef& layer) {
  std::uint64_t seed = 40;
  for (auto& v : layer->variables())
    if (v.shape().size() <= 2 && v.name().find("bias") != std::string::npos)
      v.assign(Tensor::random_uniform(v.shape(), -0.5, 0.5, seed++, v.dtype(), v.value().device()));
}

}  // namespace

TEST_CASE("MultiHeadAttention through the layer harness (self-attention on one input)") {
  const std::vector<LayerCase> cases = {
      {"MHA 2 heads", [] { return layers::MultiHeadAttention(2, 3); }, {2, 4, 5}, {2, 4, 5}},
      {"MHA causal", [] { return layers::MultiHeadAttention(2, 3, {.use_causal_mask = true}); }, {2, 4, 5}, {2, 4, 5}},
      {"MHA value_dim output_shape no bias",
       [] { return layers::MultiHeadAttention(3, 2, {.value_dim = 4, .use_bias = false, .output_shape = 6}); },
       {2, 3, 5}, {2, 3, 6}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    run_layer_test(c);
  }
}

TEST_CASE("MultiHeadAttention computes Keras's attention from its weights: key, value, mask, causal") {
  mixed_precision::set_global_policy("float32");
  for_each_device([](Device dev) {
    PolicyDeviceScope scope("float32", dev);  // the layer's variables on dev
    const std::int64_t B = 2, Tq = 3, Tk = 5;
    Tensor query = random({B, Tq, 6}, float32, dev, 1), value = random({B, Tk, 4}, float32, dev, 2),
           key = random({B, Tk, 4}, float32, dev, 3);  // key = value must fit the layer too
    const auto m = padding_mask(B, Tq, Tk);
    Tensor mask = mask_tensor(m, {B, Tq, Tk}, dev);
    for (bool causal : {false, true}) {
      CAPTURE(causal);
      auto mha = layers::MultiHeadAttention(2, 3, {.value_dim = 2, .use_causal_mask = causal});
      Tensor y = mha({query, value, key, mask});
      randomize_biases(mha);
      y = mha({query, value, key, mask});
      CHECK(y.shape() == Shape{B, Tq, 6});
      CHECK(y.device() == dev);
      check_close(y, reference(mha, query, value, key, m, causal), {2e-5, 1e-6}, "query, value, key, mask");
      check_close(mha({query, value}), reference(mha, query, value, value, {}, causal), {2e-5, 1e-6},
                  "query, value (key = value)");
      check_close(mha({query, value, mask}), reference(mha, query, value, value, m, causal), {2e-5, 1e-6},
                  "query, value, mask");
      // An integer mask attends where it is nonzero, as Keras casts it to bool.
      std::vector<std::int32_t> mi(m.begin(), m.end());
      for (auto& e : mi) e *= 3;
      Tensor int_mask = Tensor::from_vector(mi, {B, Tq, Tk}, dev);
      check_close(mha({query, value, int_mask}), reference(mha, query, value, value, m, causal), {2e-5, 1e-6},
                  "int32 mask");
    }
  });
}

TEST_CASE("MultiHeadAttention with dropout: training goes through explicit probabilities, the same attention") {
  mixed_precision::set_global_policy("float32");
  for_each_device([](Device dev) {
    PolicyDeviceScope scope("float32", dev);
    const std::int64_t B = 2, Tq = 4, Tk = 4;
    Tensor x = random({B, Tq, 6}, float32, dev, 5);
    const auto m = padding_mask(B, Tq, Tk);
    Tensor mask = mask_tensor(m, {B, Tq, Tk}, dev);
    // A rate so small that no probability is dropped: the explicit path must equal the fused one.
    auto mha = layers::MultiHeadAttention(2, 3, {.dropout = 1e-12, .use_causal_mask = true, .seed = 3});
    Tensor fused = mha({x, x, mask});
    randomize_biases(mha);
    fused = mha({x, x, mask});
    Tensor explicit_path = mha({x, x, mask}, {.training = true});
    check_close(explicit_path, fused.to_vector<double>(), {1e-5, 1e-6}, "explicit probabilities vs fused");
    // A real rate drops probabilities in training only, reproducibly from the seed and call count.
    auto drop = layers::MultiHeadAttention(2, 3, {.dropout = 0.5, .seed = 11});
    Tensor inference = drop({x, x});
    Tensor a = drop({x, x}, {.training = true}), b = drop({x, x}, {.training = true});
    CHECK(a.to_vector<float>() != inference.to_vector<float>());
    CHECK(a.to_vector<float>() != b.to_vector<float>());
    drop->set_rng_state({1});
    CHECK(drop({x, x}, {.training = true}).to_vector<float>() == b.to_vector<float>());
    CHECK(drop({x, x}).to_vector<float>() == inference.to_vector<float>());
  });
}

TEST_CASE("MultiHeadAttention gradients with a key and a mask match finite differences in float64") {
  mixed_precision::set_global_policy("float64");
  const std::int64_t B = 2, Tq = 3, Tk = 4;
  const auto m = padding_mask(B, Tq, Tk);
  for (double dropout : {0.0, 1e-12}) {  // the fused op, and the explicit probabilities (training)
    CAPTURE(dropout);
    auto mha = layers::MultiHeadAttention(2, 2, {.dropout = dropout, .use_causal_mask = true, .seed = 1});
    Tensor mask = mask_tensor(m, {B, Tq, Tk}, Device::cpu());
    check_gradients("mha", [&](const std::vector<Tensor>& in) { return mha({in[0], in[1], in[2], mask}, {.training = true}); },
                    {random({B, Tq, 3}, float64, Device::cpu(), 7), random({B, Tk, 2}, float64, Device::cpu(), 8),
                     random({B, Tk, 3}, float64, Device::cpu(), 9)});
  }
  mixed_precision::set_global_policy("float32");
}

TEST_CASE("MultiHeadAttention's activity_regularizer: on the query, key, value and output projections, by the batch") {
  // Keras hands it to its four EinsumDense sublayers: each output's l1·Σ|x| + l2·Σx², over the batch size.
  for_each_device([](Device dev) {
    PolicyDeviceScope scope("float64", dev);
    const std::int64_t B = 3, Tq = 4, Tk = 5;
    const Tensor query = random({B, Tq, 6}, float64, dev, 7), value = random({B, Tk, 4}, float64, dev, 8);
    const double l1 = 0.01, l2 = 0.003;
    auto mha = layers::MultiHeadAttention(2, 3, {.value_dim = 2, .activity_regularizer = regularizers::L1L2(l1, l2)});
    mha({query, value});
    randomize_biases(mha);
    mha->clear_activity_losses();  // (a model clears them at each forward)
    const Tensor y = mha({query, value});
    std::vector<Vec> proj;
    const Vec want_y = reference(mha, query, value, value, {}, false, &proj);
    proj.push_back(want_y);
    double want = 0;
    for (const Vec& p : proj)
      for (double e : p) want += (l1 * std::abs(e) + l2 * e * e) / double(B);
    const auto ls = mha->losses();
    REQUIRE(ls.size() == 4);  // one per projection (no kernel or bias regularizer here)
    double got = 0;
    for (const auto& l : ls) got += l.item();
    CHECK(got == doctest::Approx(want).epsilon(1e-6));  // penalties are summed in float32
    // Its gradient reaches the query (central differences of step 1e-3: the float32 penalty's
    // rounding is ~3e-5 of a slope there), and the config keeps it.
    check_gradients("activity penalty", [&](const std::vector<Tensor>& in) {
      mha->clear_activity_losses();
      mha({in[0], value});
      Tensor total;
      for (const auto& l : mha->losses()) total = total.defined() ? ops::add(total, l) : l;
      return ops::cast(total, float64);
    }, {query}, 1e-3, {2e-2, 1e-4});
    const nlohmann::json c = mha->config();
    REQUIRE(c.contains("activity_regularizer"));
    CHECK(c.at("activity_regularizer").at("class_name") == "L1L2");
    LayerRef back = layer_from_config({"MultiHeadAttention", "m", mixed_precision::Policy("float64"), true, c});
    back({query, value});
    CHECK(back->losses().size() == 4);
  });
}

TEST_CASE("MultiHeadAttention refuses what it cannot compute, naming itself") {
  mixed_precision::set_global_policy("float32");
  CHECK_THROWS_WITH_AS(layers::MultiHeadAttention(0, 3), doctest::Contains("num_heads"), Error);
  CHECK_THROWS_WITH_AS(layers::MultiHeadAttention(2, 3, {.dropout = 1.0}), doctest::Contains("dropout"), Error);
  auto mha = layers::MultiHeadAttention(2, 3, {.name = "att"});
  Tensor x = Tensor::ones({2, 4, 5});
  CHECK_THROWS_WITH_AS(mha(Tensor::ones({2, 5})), doctest::Contains("MultiHeadAttention 'att'"), Error);
  CHECK_THROWS_WITH_AS(mha({x, x, Tensor::ones({2, 4, 3}, bool_)}), doctest::Contains("[batch, Tq, Tk]"), Error);
  CHECK_THROWS_WITH_AS(mha({x, Tensor::ones({3, 4, 5})}), doctest::Contains("agree on batch"), Error);
  mha({x, x});
  CHECK_THROWS_WITH_AS(mha({Tensor::ones({2, 4, 6}), x}), doctest::Contains("built for 5"), Error);
  for (const auto& entry : std::vector<std::pair<std::string, nlohmann::json>>{
           {"use_gate", true}, {"attention_axes", {2}}}) {
    const std::string& key = entry.first;  // no structured binding: clang 14 (the sanitizer build) refuses them in doctest macros
    const nlohmann::json& value = entry.second;
    CAPTURE(key);
    nlohmann::json c = {{"num_heads", 2}, {"key_dim", 3}, {key, value}};
    CHECK_THROWS_WITH_AS(layer_from_config({"MultiHeadAttention", "m", mixed_precision::Policy("float32"), true, c}),
                         doctest::Contains(key.c_str()), Error);
  }
}

TEST_CASE("A functional model with a mask input and causal MultiHeadAttention saves and loads (.keras and mpt's)") {
  mixed_precision::set_global_policy("float32");
  auto x = Input({5, 8});
  auto mask = Input({5, 5}, {.dtype = bool_, .name = "mask"});
  auto h = layers::MultiHeadAttention(2, 4, {.use_causal_mask = true})({x, x, mask});
  auto y = layers::Dense(3)(layers::LayerNormalization()(layers::Add()({x, h})));
  Model model({x, mask}, {y});
  Tensor xs = random({3, 5, 8}, float32, Device::cpu(), 4);
  const auto m = padding_mask(3, 5, 5);
  Tensor ms = mask_tensor(m, {3, 5, 5}, Device::cpu());
  randomize_biases(model.layers()[0]->class_name() == "MultiHeadAttention" ? model.layers()[0] : model.layers()[1]);
  const auto expected = model({xs, ms})[0].to_vector<float>();
  const auto dir = std::filesystem::temp_directory_path() / "mpt_test_mha";
  std::filesystem::create_directories(dir);
  for (const char* file : {"m.keras", "m.h5"}) {
    CAPTURE(file);
    const std::string path = (dir / file).string();
    model.save(path);
    auto back = load_model(path);
    CHECK((*back)({xs, ms})[0].to_vector<float>() == expected);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("A token model (Embedding, causal MultiHeadAttention, Dense) trains with ignore_class; accuracy skips padding") {
  for_each_device([](Device dev) {
    PolicyDeviceScope scope("mixed_bfloat16", dev);
    set_random_seed(5);
    const std::int64_t N = 16, T = 6, V = 5, pad = 0;
    // Predict the previous token; the first position and a padded tail are ignored.
    std::vector<std::int32_t> ids(N * T), next(N * T);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t t = 0; t < T; ++t) {
        const bool padded = t >= T - n % 3;
        ids[n * T + t] = padded ? pad : 1 + static_cast<std::int32_t>((n * 7 + t * 3) % (V - 1));
        next[n * T + t] = padded || t == 0 ? pad : ids[n * T + t - 1];
      }
    Tensor x = Tensor::from_vector(ids, {N, T}, dev), y = Tensor::from_vector(next, {N, T}, dev);
    auto in = Input({T}, {.dtype = int32});
    auto h = layers::Embedding(V, 8)(in);
    h = layers::Add()({h, layers::MultiHeadAttention(2, 4, {.use_causal_mask = true})({h, h})});
    Model model(in, layers::Dense(V)(layers::LayerNormalization()(h)));
    model.compile({.optimizer = "adam",
                   .loss = losses::SparseCategoricalCrossentropy({.from_logits = true, .ignore_class = pad}),
                   .metrics = {"accuracy"}});
    auto before = model.evaluate(x, y, {.verbose = 0});
    model.fit(x, y, {.batch_size = 8, .epochs = 30, .verbose = 0});
    auto after = model.evaluate(x, y, {.verbose = 0});
    CHECK(after.at("loss") < 0.5 * before.at("loss"));
    // The accuracy counts only the positions whose label is not padding.
    Tensor logits = model.predict(x);
    const auto p = logits.to_vector<float>();
    double right = 0, counted = 0;
    for (std::int64_t i = 0; i < N * T; ++i) {
      if (next[i] == pad) continue;
      const auto* row = &p[i * V];
      right += std::max_element(row, row + V) - row == next[i];
      ++counted;
    }
    CHECK(after.at("accuracy") == doctest::Approx(right / counted).epsilon(1e-6));
  });
}
