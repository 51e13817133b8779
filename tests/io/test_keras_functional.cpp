// Functional models in .keras archives: Keras 3's functional config (layers with inbound_nodes,
// input_layers, output_layers) in config.json, and the same graph rebuilt by load_model;
// Keras's object paths and layer order in weights files, load_model(compile = false), and
// configs that load nothing silently (every field honoured or refused naming it).
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "io/checkpoint_util.hpp"
#include "io/hdf5_file.hpp"
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

namespace {

/// out = Add([c(in), b(a(in))]): Keras lists its layers a, c, b, add (map_graph: by depth from
/// the outputs, ties in first-visit order), while a depth-first call order gives c, a, b.
std::unique_ptr<Model> crossed(const std::string& a, const std::string& b, const std::string& c) {
  auto in = mpt::Input({4}, {.name = "x"});
  auto ya = layers::Dense(3, {.name = a})(in);
  auto yb = layers::Dense(4, {.name = b})(ya);
  auto yc = layers::Dense(4, {.activation = "relu", .name = c})(in);
  return std::make_unique<Model>(in, layers::Add()({yc, yb}), "crossed");
}

std::vector<std::string> names_of(const Model& m) {
  std::vector<std::string> out;
  for (const auto& l : m.layers()) out.push_back(l->name());
  return out;
}

std::vector<std::string> groups_in(const std::string& path) {
  const auto bytes = read_bytes(path);
  io::h5::File f = io::h5::File::open_image(bytes, path);
  return f.group("layers").children();
}

}  // namespace

TEST_CASE("a functional model lists its layers in Keras's order (map_graph), not its call order") {
  auto mp = crossed("a", "b", "c");
  const Model& m = *mp;
  CHECK(names_of(m) == std::vector<std::string>{"a", "c", "b", "add"});
  // The trainable variables, hence the optimizer slots Keras lists, follow the same order.
  std::vector<std::string> vars;
  for (const auto& v : m.trainable_variables()) vars.push_back(v.path());
  CHECK(vars == std::vector<std::string>{"a/kernel", "a/bias", "c/kernel", "c/bias", "b/kernel", "b/bias"});
}

TEST_CASE("weights files keep layers at Keras's object paths, so any names load") {
  for_each_device([](Device dev) {
    PolicyDeviceScope scope("float32", dev);
    ScratchDir dir("keras-paths");
    set_random_seed(3);
    auto saved_p = crossed("first", "second", "third");
    Model& saved = *saved_p;
    const std::string path = dir / "m.weights.h5";
    saved.save_weights(path);
    // Keras's paths: class in snake_case, numbered by position in model.layers(); names play no part.
    CHECK(groups_in(path) == std::vector<std::string>{"add", "dense", "dense_1", "dense_2"});

    set_random_seed(4);
    auto other_p = crossed("p", "q", "r");  // other names, other initial values
    Model& other = *other_p;
    REQUIRE(!same_weights(saved, other));
    other.load_weights(path);
    CHECK(same_weights(saved, other));
    Tensor x = Tensor::random_uniform({5, 4}, -1, 1, 8, float32, dev);
    CHECK(bits_of(other.predict(x)) == bits_of(saved.predict(x)));

    // A model whose layers differ at a path is refused naming the path, not loaded crosswise.
    auto in = mpt::Input({4});
    auto h = layers::Dense(3)(in);
    Model wrong(in, layers::Dense(5)(h), "wrong");
    const std::string e = error_of([&] { wrong.load_weights(path); });
    CHECK(contains(e, "layers/dense_1"));
    CHECK_MESSAGE(contains(e, "expected shape (3, 5), found (4, 4)"), e);
  });
}

TEST_CASE("weights files written by layer name (mpt before object paths) still load") {
  ScratchDir dir("keras-paths-old");
  set_random_seed(5);
  auto saved_p = crossed("first", "second", "third");
  const Model& saved = *saved_p;
  const std::string path = dir / "old.weights.h5";
  {
    io::h5::File f = io::h5::File::create(path, 0, path);
    io::h5::Group lg = f.create_group("layers");
    for (const auto& l : saved.layers()) {
      io::h5::Group vg = lg.create_group(l->name()).create_group("vars");
      const auto vars = l->variables();
      for (std::size_t i = 0; i < vars.size(); ++i) vg.write(std::to_string(i), vars[i].value());
    }
    f.create_group("vars");
    f.close();
  }
  set_random_seed(6);
  auto other_p = crossed("first", "second", "third");
  Model& other = *other_p;
  REQUIRE(!same_weights(saved, other));
  other.load_weights(path);
  CHECK(same_weights(saved, other));
}

TEST_CASE("load_model(path, {.compile = false}) gives the uncompiled model with its weights") {
  ScratchDir dir("keras-nocompile");
  set_random_seed(7);
  auto mp = crossed("a", "b", "c");
  Model& m = *mp;
  m.compile({.optimizer = optimizers::Adam(), .loss = "mse"});
  Tensor x = Tensor::random_uniform({6, 4}, -1, 1, 9);
  m.fit(x, Tensor::random_uniform({6, 4}, -1, 1, 10), {.batch_size = 3, .epochs = 1, .verbose = 0});
  for (const std::string name : {"m.h5", "m.keras"}) {
    CAPTURE(name);
    const std::string path = dir / name;
    const std::string e = error_of([&] { m.save(path); });
    if (contains(e, "without libzip")) continue;
    REQUIRE(e == "(no error)");
    auto loaded = load_model(path, {.compile = false});
    CHECK(!loaded->compiled());
    CHECK(same_weights(m, *loaded));
    CHECK(bits_of(loaded->predict(x)) == bits_of(m.predict(x)));
    CHECK(load_model(path)->compiled());
  }
  // A Keras-written archive (config.json and Keras's weights layout) whose compile config mpt
  // cannot rebuild stops load_model, and not load_model without compile.
  const std::string keras = dir / "m.keras";
  if (!std::filesystem::exists(keras)) return;
  const auto zip = read_bytes(keras);
  auto cfg = nlohmann::json::parse(io::zip_entry(zip, "config.json", keras));
  cfg["compile_config"]["loss"] = "my_custom_loss";
  const std::string text = cfg.dump();
  m.save_weights(dir / "plain.weights.h5");
  const std::string edited = dir / "custom_loss.keras";
  write_bytes(edited, io::make_zip({{"metadata.json", io::zip_entry(zip, "metadata.json", keras)},
                                    {"config.json", std::vector<char>(text.begin(), text.end())},
                                    {"model.weights.h5", read_bytes(dir / "plain.weights.h5")}},
                                   edited));
  CHECK(contains(error_of([&] { load_model(edited); }), "my_custom_loss"));
  auto loaded = load_model(edited, {.compile = false});
  CHECK(bits_of(loaded->predict(x)) == bits_of(m.predict(x)));
}

TEST_CASE("configs load nothing silently: every field is honoured or refused naming it") {
  auto in = mpt::Input({6, 6, 2}, {.name = "x"});
  auto h = layers::Conv2D(4, {3, 3}, {.name = "conv"})(in);
  h = layers::BatchNormalization({.name = "bn"})(h);
  h = layers::LayerNormalization({.name = "ln"})(h);
  h = layers::Flatten({.name = "flat"})(h);
  Model m(in, layers::Dense(3, {.name = "d"})(h), "m");
  const io::Json good = io::model_config_json(m, true);
  auto layer_index = [&](const std::string& name) {
    const auto& ls = good["config"]["layers"];
    for (std::size_t i = 0; i < ls.size(); ++i)
      if (ls[i]["name"] == name) return i;
    FAIL("no layer ", name);
    return std::size_t{0};
  };
  auto error_for = [&](const std::string& layer, const std::string& key, const io::Json& value) {
    io::Json c = good;
    c["config"]["layers"][layer_index(layer)]["config"][key] = value;
    return error_of([&] { io::model_from_config(c, "test"); });
  };
  CHECK(error_of([&] { io::model_from_config(good, "test"); }) == "(no error)");
  const io::Json l2 = {{"module", "keras.regularizers"}, {"class_name", "L2"}, {"config", {{"l2", 0.01}}}};
  CHECK(error_for("d", "kernel_regularizer", l2) == "(no error)");  // honoured (test_regularizers)
  const io::Json orthogonal = {{"module", "keras.regularizers"}, {"class_name", "OrthogonalRegularizer"},
                               {"config", {{"factor", 0.01}, {"mode", "rows"}}}};
  std::string e = error_for("d", "kernel_regularizer", orthogonal);
  CHECK(contains(e, "Dense 'd'"));
  CHECK(contains(e, "kernel_regularizer"));
  CHECK(contains(e, "not supported"));
  CHECK(contains(error_for("d", "kernel_constraint", {{"class_name", "MinMaxNorm"}, {"config", io::Json::object()}}),
                 "constraint class 'MinMaxNorm' is not supported"));
  CHECK(contains(error_for("d", "lora_rank", 4), "lora_rank = 4"));
  CHECK(error_for("conv", "groups", 2) == "(no error)");  // honoured (test_conv_layers, test_conv_ops)
  CHECK(contains(error_for("conv", "groups", 3), "groups = 3"));  // 4 filters in 3 groups: Keras's ValueError too
  CHECK(contains(error_for("conv", "data_format", "channels_first"), "data_format = \"channels_first\""));
  CHECK(contains(error_for("bn", "renorm", true), "renorm = true"));
  CHECK(contains(error_for("bn", "synchronized", true), "synchronized = true"));
  CHECK(contains(error_for("ln", "axis", io::Json::array({1, 2, 3})), "axis = [1,2,3]"));
  CHECK(contains(error_for("ln", "rms_scaling", true), "rms_scaling = true"));
  CHECK(contains(error_for("flat", "data_format", "channels_first"), "Flatten 'flat'"));
  // Fields at values that change nothing pass: nulls, Keras's defaults, a one-element axis list.
  CHECK(error_for("d", "kernel_regularizer", nullptr) == "(no error)");
  CHECK(error_for("conv", "groups", 1) == "(no error)");
  CHECK(error_for("ln", "axis", io::Json::array({-1})) == "(no error)");
  // Initializers load with their arguments (test_initializers); what mpt cannot honour is
  // refused naming the layer, the field and the class.
  auto init = [](const std::string& cls, io::Json config) {
    return io::Json{{"module", "keras.initializers"}, {"class_name", cls}, {"config", config}};
  };
  CHECK(error_for("d", "kernel_initializer", init("RandomNormal", {{"mean", 0.0}, {"stddev", 0.5}, {"seed", 3}})) ==
        "(no error)");
  e = error_for("d", "kernel_initializer", init("RandomNormal", {{"stddev", 0.5}, {"spread", 2}}));
  CHECK(contains(e, "Dense 'd'"));
  CHECK(contains(e, "kernel_initializer"));
  CHECK(contains(e, "RandomNormal"));
  CHECK(contains(e, "spread = 2"));
  CHECK(contains(error_for("conv", "bias_initializer", init("STFT", {{"side", "real"}})), "'STFT' is not supported"));
}

TEST_CASE("optimizer, schedule and loss configs load nothing silently") {
  auto in = mpt::Input({3}, {.name = "x"});
  Model m(in, layers::Dense(2)(in), "m");
  m.compile({.optimizer = optimizers::Adam(), .loss = "mse"});
  const io::Json good = io::compile_config_json(m);
  auto error_for = [&](auto&& damage) {
    io::Json cc = good;
    damage(cc);
    Model fresh(in, layers::Dense(2)(in), "fresh");
    return error_of([&] { io::compile_from_config(fresh, cc, "test", false); });
  };
  CHECK(error_for([](io::Json&) {}) == "(no error)");
  // The base arguments mpt honours load (their effect: tests/optimizers/test_keras_optimizers.cpp);
  // out of range they are refused by name, as are fields mpt does not know.
  CHECK(error_for([](io::Json& c) {
          c["optimizer"]["config"]["use_ema"] = true;
          c["optimizer"]["config"]["weight_decay"] = 0.01;
          c["optimizer"]["config"]["gradient_accumulation_steps"] = 4;
        }) == "(no error)");
  CHECK(contains(error_for([](io::Json& c) { c["optimizer"]["config"]["gradient_accumulation_steps"] = 1; }),
                 "gradient_accumulation_steps must be an integer >= 2"));
  CHECK(contains(error_for([](io::Json& c) { c["optimizer"]["config"]["weight_decay"] = -1.0; }), "weight_decay"));
  CHECK(error_for([](io::Json& c) { c["optimizer"]["config"]["loss_scale_factor"] = 8.0; }) == "(no error)");
  CHECK(contains(error_for([](io::Json& c) { c["optimizer"]["config"]["momentum_decay"] = 8.0; }),
                 "momentum_decay = 8.0"));
  // Values that change nothing pass.
  CHECK(error_for([](io::Json& c) {
          c["optimizer"]["config"]["use_ema"] = false;
          c["optimizer"]["config"]["ema_momentum"] = 0.5;
          c["optimizer"]["config"]["weight_decay"] = 0.0;
        }) == "(no error)");
  CHECK(contains(error_for([](io::Json& c) {
                   c["optimizer"]["config"]["learning_rate"] = {
                       {"class_name", "ExponentialDecay"},
                       {"config",
                        {{"initial_learning_rate", 0.1}, {"decay_steps", 10}, {"decay_rate", 0.9}, {"staircase", false},
                         {"cycle", true}}}};
                 }),
                 "cycle = true"));
  CHECK(error_for([](io::Json& c) {
          c["loss"] = {{"class_name", "MeanSquaredError"}, {"config", {{"reduction", "sum"}}}};
        }) == "(no error)");
  CHECK(contains(error_for([](io::Json& c) {
                   c["loss"] = {{"class_name", "MeanSquaredError"}, {"config", {{"reduction", "auto"}}}};
                 }),
                 "loss reduction 'auto' is not one of"));
  CHECK(contains(error_for([](io::Json& c) {
                   c["loss"] = {{"class_name", "MeanSquaredError"}, {"config", {{"reduction", 3}}}};
                 }),
                 "reduction"));
  CHECK(error_for([](io::Json& c) {
          c["loss"] = {{"class_name", "MeanSquaredError"}, {"config", {{"reduction", "sum_over_batch_size"}}}};
        }) == "(no error)");
}

TEST_CASE("Huber, KLDivergence, LogCosh and CosineSimilarity survive save and load_model with their options") {
  ScratchDir dir("keras-new-losses");
  auto in = mpt::Input({3}, {.name = "x"});
  Model m(in, layers::Dense(4, {.activation = "softmax"})(in), "m");
  Tensor x = Tensor::random_uniform({5, 3}, -1, 1, 3);
  Tensor y = Tensor::random_uniform({5, 4}, 0.05, 0.95, 4);
  struct Case {
    std::string cls;
    losses::LossArg loss;
    nlohmann::json keras_config;  // what config.json's compile_config carries
  };
  const std::vector<Case> cases = {
      {"Huber", losses::Huber(2.5), {{"name", "huber_loss"}, {"reduction", "sum_over_batch_size"}, {"delta", 2.5}}},
      {"KLDivergence", losses::KLDivergence(), {{"name", "kl_divergence"}, {"reduction", "sum_over_batch_size"}}},
      {"LogCosh", losses::LogCosh(), {{"name", "log_cosh"}, {"reduction", "sum_over_batch_size"}}},
      {"CosineSimilarity", losses::CosineSimilarity(0),
       {{"name", "cosine_similarity"}, {"reduction", "sum_over_batch_size"}, {"axis", 0}}},
      {"Huber", "huber", {{"name", "huber_loss"}, {"reduction", "sum_over_batch_size"}, {"delta", 1.0}}},
  };
  auto same_options = [](const losses::Loss& a, const losses::Loss& b) {
    if (typeid(a) != typeid(b)) return false;
    if (auto* h = dynamic_cast<const losses::Huber*>(&a)) return h->delta() == dynamic_cast<const losses::Huber&>(b).delta();
    if (auto* c = dynamic_cast<const losses::CosineSimilarity*>(&a))
      return c->axis() == dynamic_cast<const losses::CosineSimilarity&>(b).axis();
    return true;
  };
  for (const auto& c : cases) {
    CAPTURE(c.cls);
    m.compile({.optimizer = optimizers::SGD(), .loss = c.loss});
    const double want = m.evaluate(x, y, {.verbose = 0}).at("loss");
    for (const std::string name : {"m.keras", "m.h5"}) {
      CAPTURE(name);
      const std::string path = dir / name;
      const std::string e = error_of([&] { m.save(path); });
      if (contains(e, "without libzip")) continue;
      REQUIRE(e == "(no error)");
      if (name == "m.keras") {
        const auto loss = config_json(path)["compile_config"]["loss"];
        CHECK(loss["class_name"] == c.cls);
        CHECK(loss["module"] == "keras.losses");
        CHECK(loss["config"] == c.keras_config);
      }
      auto loaded = load_model(path);
      REQUIRE(loaded->compiled());
      CHECK(same_options(loaded->loss(), m.loss()));
      CHECK(loaded->loss().name() == m.loss().name());
      CHECK(loaded->evaluate(x, y, {.verbose = 0}).at("loss") == doctest::Approx(want).epsilon(1e-6));
    }
  }
  // Keras's own files: get_config writes neither delta nor axis (they load as Keras reloads them,
  // at the defaults); written by hand, or by mpt, they are honoured, as is every loss's reduction.
  m.compile({.optimizer = optimizers::SGD(), .loss = "mse"});
  const io::Json good = io::compile_config_json(m);
  auto load = [&](const io::Json& loss, const std::function<void(const losses::Loss&)>& check) {
    io::Json cc = good;
    cc["loss"] = loss;
    Model fresh(in, layers::Dense(4)(in), "fresh");
    const std::string e = error_of([&] { io::compile_from_config(fresh, cc, "test", false); });
    if (e == "(no error)") check(fresh.loss());
    return e;
  };
  auto keras_loss = [](const std::string& cls, io::Json config) {
    return io::Json{{"module", "keras.losses"}, {"class_name", cls}, {"config", config}, {"registered_name", nullptr}};
  };
  const io::Json plain = {{"name", "huber_loss"}, {"reduction", "sum_over_batch_size"}};
  auto delta_is = [](double d) {
    return [d](const losses::Loss& l) {
      REQUIRE(dynamic_cast<const losses::Huber*>(&l));
      CHECK(dynamic_cast<const losses::Huber&>(l).delta() == d);
    };
  };
  auto axis_is = [](std::int64_t a) {
    return [a](const losses::Loss& l) {
      REQUIRE(dynamic_cast<const losses::CosineSimilarity*>(&l));
      CHECK(dynamic_cast<const losses::CosineSimilarity&>(l).axis() == a);
    };
  };
  CHECK(load(keras_loss("Huber", plain), delta_is(1.0)) == "(no error)");
  CHECK(load(keras_loss("Huber", {{"name", "h"}, {"delta", 0.25}}), delta_is(0.25)) == "(no error)");
  CHECK(load("huber", delta_is(1.0)) == "(no error)");
  CHECK(load(keras_loss("CosineSimilarity", {{"name", "cosine_similarity"}}), axis_is(-1)) == "(no error)");
  CHECK(load(keras_loss("CosineSimilarity", {{"axis", 1}}), axis_is(1)) == "(no error)");
  CHECK(load(keras_loss("CosineSimilarity", {{"axis", io::Json::array({0})}}), axis_is(0)) == "(no error)");
  auto is_kld = [](const losses::Loss& l) { CHECK(dynamic_cast<const losses::KLDivergence*>(&l)); };
  auto is_log_cosh = [](const losses::Loss& l) { CHECK(dynamic_cast<const losses::LogCosh*>(&l)); };
  CHECK(load(keras_loss("KLDivergence", {{"name", "kl_divergence"}, {"reduction", "sum_over_batch_size"}}), is_kld) ==
        "(no error)");
  for (const char* n : {"kld", "KLD", "kl_divergence"}) CHECK(load(n, is_kld) == "(no error)");
  CHECK(load(keras_loss("LogCosh", {{"name", "log_cosh"}}), is_log_cosh) == "(no error)");
  CHECK(load("log_cosh", is_log_cosh) == "(no error)");
  // Keras's reductions load (null is Keras's None: no reduction); others are refused by name.
  auto reduces = [](losses::Reduction r) { return [r](const losses::Loss& l) { CHECK(l.reduction() == r); }; };
  auto none = [](const losses::Loss&) {};
  for (const char* cls : {"Huber", "KLDivergence", "LogCosh", "CosineSimilarity", "MeanSquaredError",
                          "MeanAbsoluteError", "SparseCategoricalCrossentropy", "CategoricalCrossentropy",
                          "BinaryCrossentropy", "Hinge", "SquaredHinge", "CategoricalHinge", "Poisson",
                          "MeanAbsolutePercentageError", "MeanSquaredLogarithmicError"}) {
    CAPTURE(cls);
    CHECK(load(keras_loss(cls, {{"reduction", "sum"}}), reduces(losses::Reduction::sum)) == "(no error)");
    CHECK(load(keras_loss(cls, {{"reduction", "mean_with_sample_weight"}}),
               reduces(losses::Reduction::mean_with_sample_weight)) == "(no error)");
    CHECK(load(keras_loss(cls, {{"reduction", "mean"}}), reduces(losses::Reduction::mean)) == "(no error)");
    CHECK(load(keras_loss(cls, {{"name", "x"}}), reduces(losses::Reduction::sum_over_batch_size)) == "(no error)");
    // "none" (and null, Keras's None) load: fit refuses it (tests/losses/test_losses.cpp).
    CHECK(load(keras_loss(cls, {{"reduction", "none"}}), reduces(losses::Reduction::none)) == "(no error)");
    CHECK(load(keras_loss(cls, {{"reduction", nullptr}}), reduces(losses::Reduction::none)) == "(no error)");
    CHECK(contains(load(keras_loss(cls, {{"reduction", "weighted"}}), none), "loss reduction 'weighted' is not one of"));
    if (std::string(cls).find("Crossentropy") == std::string::npos)
      CHECK(contains(load(keras_loss(cls, {{"from_logits", true}}), none), "from_logits = true"));
  }
  CHECK(contains(load(keras_loss("Huber", {{"delta", -1.0}}), none), "delta"));
  CHECK(contains(load(keras_loss("Huber", {{"delta", "big"}}), none), "delta"));
  CHECK(contains(load(keras_loss("CosineSimilarity", {{"axis", io::Json::array({0, 1})}}), none), "axis"));
  CHECK(contains(load(keras_loss("KLDivergence", {{"axis", 0}}), none), "axis = 0"));
}

namespace {
std::set<std::string> keys_of(const std::map<std::string, double>& logs) {
  std::set<std::string> out;
  for (const auto& kv : logs) out.insert(kv.first);
  return out;
}

/// One input, two outputs: "cls" (softmax over 3 classes) and "reg" (one value).
std::unique_ptr<Model> cls_reg_model() {
  auto x = mpt::Input({4}, {.name = "x"});
  auto h = layers::Dense(6, {.activation = "relu", .name = "hid"})(x);
  auto cls = layers::Dense(3, {.activation = "softmax", .name = "cls"})(h);
  auto reg = layers::Dense(1, {.name = "reg"})(h);
  return std::make_unique<Model>(std::vector<KerasTensor>{x}, std::vector<KerasTensor>{cls, reg}, "cls_reg");
}

/// A .keras archive as Keras writes it: its config.json with compile_config replaced by `cc`, and
/// a plain weights file (mpt's .keras checkpoint also holds its own compile settings, which
/// load_model reads first).
std::string with_compile_config(const std::string& keras, const std::string& weights, const nlohmann::json& cc,
                                const std::string& out) {
  const auto zip = read_bytes(keras);
  auto cfg = nlohmann::json::parse(io::zip_entry(zip, "config.json", keras));
  cfg["compile_config"] = cc;
  const std::string text = cfg.dump();
  write_bytes(out, io::make_zip({{"metadata.json", io::zip_entry(zip, "metadata.json", keras)},
                                 {"config.json", std::vector<char>(text.begin(), text.end())},
                                 {"model.weights.h5", read_bytes(weights)}},
                                out));
  return out;
}
}  // namespace

TEST_CASE("a compiled two-output model keeps its per-output losses, loss_weights and metrics through save") {
  for_each_device([](Device dev) {
    ScratchDir dir("keras-two-outputs");
    set_random_seed(31);
    auto m = cls_reg_model();
    m->compile({.optimizer = "sgd",
                .loss = {"sparse_categorical_crossentropy", "mse"},
                .loss_weights = {0.5, 2.0},
                .output_metrics = {{"accuracy"}, {"mae", "mse"}},
                .output_weighted_metrics = {{}, {"mae"}}});
    const Tensor x = Tensor::random_normal({20, 4}, 0, 1, 3, float32, dev);
    std::vector<std::int32_t> labels;
    for (int i = 0; i < 20; ++i) labels.push_back(i % 3);
    const Tensor y1 = Tensor::from_vector(labels, {20}, dev), y2 = Tensor::random_normal({20, 1}, 0, 1, 4, float32, dev);
    m->fit(x, {y1, y2}, {.batch_size = 5, .epochs = 1, .verbose = 0});
    const auto want = m->evaluate(x, {y1, y2});
    CHECK(want.size() == 7);  // loss, cls_loss, reg_loss, cls_accuracy, reg_mae, reg_mse, reg_weighted_mae
    auto same_logs = [&](Model& r) {
      const auto got = r.evaluate(x, {y1, y2});
      REQUIRE(got.size() == want.size());
      for (const auto& kv : want) {  // (clang: no structured binding inside CAPTURE's lambda)
        const std::string& k = kv.first;
        CAPTURE(k);
        REQUIRE(got.count(k) == 1);
        CHECK(got.at(k) == doctest::Approx(kv.second).epsilon(1e-6));
      }
    };
    // mpt's own checkpoint (.h5): the settings as compiled.
    m->save(dir / "two.h5");
    same_logs(*load_model(dir / "two.h5"));
    const std::string keras = dir / "two.keras";
    if (!save_keras(*m, keras)) return;
    // Keras's compile_config: lists in output order, as Keras's compile(loss=[...], ...) takes them.
    const nlohmann::json cc = config_json(keras)["compile_config"];
    CHECK(cc["loss"] == nlohmann::json::parse(R"(["sparse_categorical_crossentropy", "mean_squared_error"])"));
    CHECK(cc["loss_weights"] == nlohmann::json::parse("[0.5, 2.0]"));
    CHECK(cc["metrics"] == nlohmann::json::parse(R"([["accuracy"], ["mae", "mse"]])"));
    CHECK(cc["weighted_metrics"] == nlohmann::json::parse(R"([[], ["mae"]])"));
    same_logs(*load_model(keras));
    const std::string weights = dir / "plain.weights.h5";
    m->save_weights(weights);
    same_logs(*load_model(with_compile_config(keras, weights, cc, dir / "as_keras.keras")));  // config.json's settings

    // Keras's other spellings: dicts by output name, a flat metric list (one per output), no
    // weighted metrics.
    nlohmann::json by_name = cc;
    by_name["loss"] = {{"reg", "mse"}, {"cls", "sparse_categorical_crossentropy"}};
    by_name["loss_weights"] = {{"reg", 2.0}, {"cls", 0.5}};
    by_name["metrics"] = nlohmann::json::parse(R"(["accuracy", "mae"])");
    by_name["weighted_metrics"] = nullptr;
    auto r = load_model(with_compile_config(keras, weights, by_name, dir / "by_name.keras"));
    const auto e = r->evaluate(x, {y1, y2});
    CHECK(keys_of(e) == std::set<std::string>{"loss", "cls_loss", "reg_loss", "cls_accuracy", "reg_mae"});
    CHECK(e.at("loss") == doctest::Approx(want.at("loss")).epsilon(1e-6));
    CHECK(e.at("reg_mae") == doctest::Approx(want.at("reg_mae")).epsilon(1e-6));
    by_name["metrics"] = {{"reg", nlohmann::json::array({"mse"})}};  // cls: none
    CHECK(keys_of(load_model(with_compile_config(keras, weights, by_name, dir / "reg_only.keras"))->evaluate(x, {y1, y2})) ==
          std::set<std::string>{"loss", "cls_loss", "reg_loss", "reg_mse"});

    // Per-output entries that do not fit the model: mpt::Errors naming the entry.
    auto error_with = [&](const char* key, const nlohmann::json& value) {
      nlohmann::json bad = cc;
      bad[key] = value;
      return error_of([&] { load_model(with_compile_config(keras, weights, bad, dir / "bad.keras")); });
    };
    auto check_error = [](const std::string& e, const char* want) { CHECK_MESSAGE(contains(e, want), e); };
    check_error(error_with("loss", nlohmann::json::array({"mse", "mse", "mse"})), "has 2 outputs but the list holds 3");
    check_error(error_with("loss", {{"cls", "mse"}}), "loss of output 1: none given");
    check_error(error_with("loss_weights", {{"box", 1.0}}), "'box' is not an output of model 'cls_reg' (its outputs: cls, reg)");
    check_error(error_with("metrics", nlohmann::json::array({"mae"})), "has 2 outputs but the list holds 1");
    check_error(error_with("loss_weights", 2.0), "one number for a model of 2 outputs");
  });
}
