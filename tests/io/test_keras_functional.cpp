// Functional models in .keras archives: Keras 3's functional config (layers with inbound_nodes,
// input_layers, output_layers) in config.json, and the same graph rebuilt by load_model.
#include <nlohmann/json.hpp>

#include "io/checkpoint_util.hpp"
#include "io/keras_zip.hpp"
#include "io/model_config.hpp"

using namespace mpt;
using namespace mpt::test;
namespace layers = mpt::layers;

namespace {

/// The config.json of a .keras archive, parsed; null when mpt was built without libzip.
nlohmann::json config_json(const std::string& path) {
  const auto bytes = read_bytes(path);
  const auto entry = io::zip_entry(bytes, "config.json", path);
  return nlohmann::json::parse(entry.begin(), entry.end());
}

/// Saves `m` as .keras; false (and a message) when this build has no libzip.
bool save_keras(const Model& m, const std::string& path) {
  const std::string e = error_of([&] { m.save(path); });
  if (contains(e, "without libzip")) {
    MESSAGE("built without libzip: .keras skipped");
    return false;
  }
  REQUIRE(e == "(no error)");
  return true;
}

const nlohmann::json* layer_named(const nlohmann::json& config, const std::string& name) {
  for (const auto& l : config["config"]["layers"])
    if (l["name"] == name) return &l;
  return nullptr;
}

/// [layer, node, tensor] of one argument tensor of a node.
nlohmann::json history(const nlohmann::json& tensor) {
  CHECK(tensor["class_name"] == "__keras_tensor__");
  return tensor["config"]["keras_history"];
}

}  // namespace

TEST_CASE("a functional residual CNN saves Keras 3's functional config and loads back identically") {
  ScratchDir dir("keras-functional");
  set_random_seed(21);
  auto in = mpt::Input({8, 8, 3}, {.name = "image"});
  auto x = layers::Conv2D(4, {3, 3}, {.padding = "same"})(in);
  x = layers::BatchNormalization()(x);
  x = layers::ReLU()(x);
  auto y = layers::Conv2D(4, {3, 3}, {.padding = "same"})(x);
  auto sum = layers::Add()({x, y});
  auto out = layers::Dense(5, {.activation = "softmax"})(layers::GlobalAveragePooling2D()(sum));
  Model m(in, out, "residual");
  m.compile({.optimizer = optimizers::Adam({.learning_rate = 1e-2}), .loss = "sparse_categorical_crossentropy"});
  Tensor xs = Tensor::random_uniform({16, 8, 8, 3}, -1, 1, 5);
  m.fit(xs, Tensor::from_vector(std::vector<std::int32_t>(16, 2), {16}), {.batch_size = 8, .epochs = 1, .verbose = 0});
  const std::string path = dir / "residual.keras";
  if (!save_keras(m, path)) return;

  const nlohmann::json c = config_json(path);
  CHECK(c["class_name"] == "Functional");
  CHECK(c["config"]["name"] == "residual");
  CHECK(c["config"]["input_layers"] == nlohmann::json::parse(R"(["image", 0, 0])"));  // bare, as Keras writes one
  CHECK(c["config"]["output_layers"] == nlohmann::json::parse(R"(["dense", 0, 0])"));
  REQUIRE(c["config"]["layers"].size() == 8);  // the InputLayer and seven layers
  const nlohmann::json* input = layer_named(c, "image");
  REQUIRE(input != nullptr);
  CHECK((*input)["class_name"] == "InputLayer");
  CHECK((*input)["config"]["batch_shape"] == nlohmann::json::parse("[null, 8, 8, 3]"));
  CHECK((*input)["inbound_nodes"].empty());
  for (const auto& l : c["config"]["layers"]) {
    CAPTURE(l["name"]);
    CHECK(l.contains("inbound_nodes"));
    CHECK(l["config"]["name"] == l["name"]);
  }
  const nlohmann::json* conv = layer_named(c, "conv2d");
  REQUIRE(conv != nullptr);
  REQUIRE((*conv)["inbound_nodes"].size() == 1);
  const auto& arg = (*conv)["inbound_nodes"][0]["args"][0];
  CHECK(history(arg) == nlohmann::json::parse(R"(["image", 0, 0])"));
  CHECK(arg["config"]["shape"] == nlohmann::json::parse("[null, 8, 8, 3]"));
  CHECK(arg["config"]["dtype"] == "float32");
  // The merge takes one list argument: the skip (re_lu) and the second convolution.
  const nlohmann::json* add = layer_named(c, "add");
  REQUIRE(add != nullptr);
  const auto& add_args = (*add)["inbound_nodes"][0]["args"];
  REQUIRE(add_args.size() == 1);
  REQUIRE(add_args[0].size() == 2);
  CHECK(history(add_args[0][0]) == nlohmann::json::parse(R"(["re_lu", 0, 0])"));
  CHECK(history(add_args[0][1]) == nlohmann::json::parse(R"(["conv2d_1", 0, 0])"));
  CHECK((*add)["build_config"]["input_shape"] == nlohmann::json::parse("[[null, 8, 8, 4], [null, 8, 8, 4]]"));

  auto r = load_model(path);
  CHECK(r->name() == "residual");
  REQUIRE(r->layers().size() == m.layers().size());
  for (std::size_t i = 0; i < r->layers().size(); ++i) {
    CHECK(r->layers()[i]->name() == m.layers()[i]->name());
    CHECK(r->layers()[i]->config() == m.layers()[i]->config());
  }
  CHECK(same_weights(m, *r));
  Tensor probe = Tensor::random_uniform({6, 8, 8, 3}, -2, 2, 9);
  CHECK(bits_of(r->predict(probe)) == bits_of(m.predict(probe)));
}

TEST_CASE("shared layers, several inputs and outputs and Concatenate survive a .keras round trip") {
  ScratchDir dir("keras-functional-graph");
  set_random_seed(22);
  auto a = mpt::Input({6}, {.name = "a"});
  auto b = mpt::Input({6}, {.name = "b"});
  auto shared = layers::Dense(6, {.activation = "tanh", .name = "shared"});
  auto ha = shared(a), hb = shared(b), hh = shared(ha);  // three calls: nodes 0, 1, 2
  auto cat = layers::Concatenate()({hh, hb});
  auto out1 = layers::Dense(3, {.activation = "softmax", .name = "head"})(cat);
  auto out2 = layers::Add()({ha, hb});
  Model m({a, b}, {out1, out2}, "two_heads");
  const std::string path = dir / "graph.keras";
  if (!save_keras(m, path)) return;

  const nlohmann::json c = config_json(path);
  CHECK(c["config"]["input_layers"] == nlohmann::json::parse(R"([["a", 0, 0], ["b", 0, 0]])"));
  CHECK(c["config"]["output_layers"] == nlohmann::json::parse(R"([["head", 0, 0], ["add", 0, 0]])"));
  const nlohmann::json* s = layer_named(c, "shared");
  REQUIRE(s != nullptr);
  REQUIRE((*s)["inbound_nodes"].size() == 3);
  // Node indices follow the model's execution order; what matters is that they agree.
  auto source = [&](std::size_t node) { return history((*s)["inbound_nodes"][node]["args"][0]); };
  int from_a = -1, from_b = -1, from_shared = -1;
  for (int k = 0; k < 3; ++k) {
    const auto h = source(static_cast<std::size_t>(k));
    if (h[0] == "a") from_a = k;
    if (h[0] == "b") from_b = k;
    if (h[0] == "shared") from_shared = k;
  }
  REQUIRE((from_a >= 0 && from_b >= 0 && from_shared >= 0));
  CHECK(source(static_cast<std::size_t>(from_shared)) == nlohmann::json::array({"shared", from_a, 0}));  // shared(ha)
  const nlohmann::json* concat = layer_named(c, "concatenate");
  REQUIRE(concat != nullptr);
  CHECK(history((*concat)["inbound_nodes"][0]["args"][0][0]) == nlohmann::json::array({"shared", from_shared, 0}));
  CHECK(history((*concat)["inbound_nodes"][0]["args"][0][1]) == nlohmann::json::array({"shared", from_b, 0}));

  auto r = load_model(path);
  REQUIRE(r->layers().size() == m.layers().size());
  CHECK(r->trainable_variables().size() == m.trainable_variables().size());  // "shared" is one layer
  CHECK(same_weights(m, *r));
  Tensor xa = Tensor::random_uniform({4, 6}, -1, 1, 1), xb = Tensor::random_uniform({4, 6}, -1, 1, 2);
  auto want = m.call({xa, xb}, false), got = r->call({xa, xb}, false);
  REQUIRE(got.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) CHECK(bits_of(got[i]) == bits_of(want[i]));
}

TEST_CASE("damaged functional configs give mpt::Error naming the key") {
  set_random_seed(23);
  auto in = mpt::Input({4}, {.name = "x"});
  auto h = layers::Dense(4, {.name = "d"})(in);
  Model m(in, layers::Add()({in, h}), "m");
  const io::Json good = io::model_config_json(m);
  auto error_for = [&](auto&& damage) {
    io::Json c = good;
    damage(c["config"]);
    return error_of([&] { io::model_from_config(c, "test"); });
  };
  CHECK(contains(error_for([](io::Json& c) { c["layers"][1].erase("inbound_nodes"); }), "missing 'inbound_nodes'"));
  CHECK(contains(error_for([](io::Json& c) { c["layers"][1]["inbound_nodes"][0]["args"][0]["config"]["keras_history"][0] = "nope"; }),
                 "no layer named 'nope'"));
  CHECK(contains(error_for([](io::Json& c) { c["layers"][1]["inbound_nodes"][0]["args"][0]["config"]["keras_history"][0] = "add"; }),
                 "waits on a tensor"));  // a cycle: d <- add <- d
  CHECK(contains(error_for([](io::Json& c) { c["output_layers"][1] = 7; }), "has no node 7"));
  CHECK(contains(error_for([](io::Json& c) { c["layers"][1]["config"]["units"] = "four"; }), "'units': expected an integer"));
  // Valid JSON text that is not a model, and malformed text: clear errors, no crash.
  CHECK(contains(error_of([] { io::parse_json("{\"a\": [1, 2", "cfg.json"); }), "cfg.json: malformed JSON"));
  CHECK(contains(error_of([] { io::parse_json(std::string(1000, '[') + std::string(1000, ']'), "deep"); }), "deeper than 64"));
  CHECK(contains(error_of([] { io::model_from_config(io::Json::array(), "test"); }), "test: expected an object"));
}
