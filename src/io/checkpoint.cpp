// Full checkpoints: Model::save / load_model. The file is Keras 3's weights layout (so Keras can
// load_weights from it) plus root attributes: model_config (Keras-style architecture JSON),
// compile_config (optimizer, loss, metrics) and mpt_state (epoch and random-generator state).
#include <map>
#include <typeinfo>

#include "io/checked_file.hpp"
#include "io/json.hpp"
#include "io/optimizer_io.hpp"
#include "io/weights_io.hpp"

namespace mpt {

namespace detail {
/// Model's private state that checkpoints save and restore.
struct CheckpointAccess {
  static std::uint64_t& seed(Model& m) { return m.seed_; }
  static std::uint64_t seed(const Model& m) { return m.seed_; }
  static int& epoch(Model& m) { return m.epoch_; }
  static mixed_precision::Policy& policy(Model& m) { return m.policy_; }
  static const std::vector<metrics::MetricArg>& metric_args(const Model& m) { return m.metric_args_; }
  static const std::vector<KerasTensor>& inputs(const Model& m) { return m.inputs_; }
  static const std::vector<KerasTensor>& outputs(const Model& m) { return m.outputs_; }
  static const std::vector<std::shared_ptr<FunctionalNode>>& nodes(const Model& m) { return m.nodes_; }
};
}  // namespace detail

namespace {

using Access = detail::CheckpointAccess;
using io::json::ObjectWriter;
using io::json::quote;
namespace json = io::json;

constexpr const char* kFormat = "mpt-checkpoint";
constexpr std::int64_t kFormatVersion = 1;

std::string policy_json(const mixed_precision::Policy& p) {
  return ObjectWriter()
      .str("module", "keras")
      .str("class_name", "DTypePolicy")
      .raw("config", ObjectWriter().str("name", p.name()).done())
      .raw("registered_name", "null")
      .done();
}

mixed_precision::Policy policy_from(const json::Value& v, const std::string& where) {
  if (v.is_string()) return mixed_precision::Policy(v.text);
  return mixed_precision::Policy(v.at("config", where).at("name", where).as_string(where + ", dtype"));
}

std::string shape_json(const Shape& per_example) {
  std::string s = "[null";
  for (auto d : per_example) s += ", " + std::to_string(d);
  return s + "]";
}

std::string layer_json(const Layer& l) {
  ObjectWriter c;
  c.str("name", l.name()).raw("trainable", json::boolean(l.trainable())).raw("dtype", policy_json(l.dtype_policy()));
  for (const auto& [k, v] : l.config()) {
    MPT_CHECK(k != "name" && k != "trainable" && k != "dtype", "save: layer '", l.name(), "' config repeats '", k, "'");
    c.raw(k, json::is_json(v) ? v : quote(v));
  }
  ObjectWriter out;
  out.str("module", "keras.layers").str("class_name", l.class_name()).raw("config", c.done()).raw("registered_name", "null");
  if (!l.input_shape().empty())
    out.raw("build_config", ObjectWriter().raw("input_shape", shape_json(Shape(l.input_shape().begin() + 1, l.input_shape().end()))).done());
  return out.done();
}

LayerConfig layer_config_from(const json::Value& v, const std::string& where) {
  LayerConfig c;
  c.class_name = v.at("class_name", where).as_string(where + ", class_name");
  const std::string w = where + " (" + c.class_name + ")";
  const json::Value& cfg = v.at("config", w);
  MPT_CHECK(cfg.is_object(), w, ": config must be an object");
  c.name = cfg.at("name", w).as_string(w + ", name");
  if (const json::Value* t = cfg.find("trainable")) c.trainable = t->as_bool(w + ", trainable");
  if (const json::Value* d = cfg.find("dtype")) c.dtype = policy_from(*d, w);
  for (const auto& [k, val] : cfg.members) {
    if (k == "name" || k == "trainable" || k == "dtype") continue;
    c.config.emplace_back(k, val.is_string() ? val.text : json::dump(val));
  }
  return c;
}

void check_loss_is_builtin(const losses::Loss& loss) {
  const auto& t = typeid(loss);
  MPT_CHECK(t == typeid(losses::SparseCategoricalCrossentropy) || t == typeid(losses::CategoricalCrossentropy) ||
                t == typeid(losses::BinaryCrossentropy) || t == typeid(losses::MeanSquaredError) ||
                t == typeid(losses::MeanAbsoluteError),
            "save: loss '", loss.name(), "' is not a built-in loss that load_model can rebuild; use save_weights");
}

std::string loss_json(const losses::Loss& loss) {
  check_loss_is_builtin(loss);
  const losses::CrossentropyOptions* o = nullptr;
  if (auto* l = dynamic_cast<const losses::SparseCategoricalCrossentropy*>(&loss)) o = &l->options();
  if (auto* l = dynamic_cast<const losses::CategoricalCrossentropy*>(&loss)) o = &l->options();
  if (auto* l = dynamic_cast<const losses::BinaryCrossentropy*>(&loss)) o = &l->options();
  ObjectWriter c;
  if (o) c.raw("from_logits", json::boolean(o->from_logits)).raw("label_smoothing", json::number(o->label_smoothing));
  return ObjectWriter().str("name", loss.name()).raw("config", c.done()).done();
}

std::shared_ptr<losses::Loss> loss_from(const json::Value& v, const std::string& w) {
  const std::string& name = v.at("name", w).as_string(w + ", loss");
  const json::Value& c = v.at("config", w);
  losses::CrossentropyOptions o;
  if (const json::Value* f = c.find("from_logits")) o.from_logits = f->as_bool(w + ", from_logits");
  if (const json::Value* s = c.find("label_smoothing")) o.label_smoothing = s->as_double(w + ", label_smoothing");
  if (name == "sparse_categorical_crossentropy") return std::make_shared<losses::SparseCategoricalCrossentropy>(o);
  if (name == "categorical_crossentropy") return std::make_shared<losses::CategoricalCrossentropy>(o);
  if (name == "binary_crossentropy") return std::make_shared<losses::BinaryCrossentropy>(o);
  return losses::get(name);
}

std::string model_config_json(const Model& m) {
  ObjectWriter c;
  c.str("name", m.name()).raw("trainable", "true").raw("dtype", policy_json(m.dtype_policy()));
  std::string layers;
  auto add = [&](const std::string& j) { layers += (layers.empty() ? "" : ", ") + j; };
  if (auto* s = dynamic_cast<const Sequential*>(&m)) {
    Shape in = s->input_shape();
    auto ls = s->layers();
    if (in.empty() && !ls.empty() && !ls[0]->input_shape().empty())
      in = Shape(ls[0]->input_shape().begin() + 1, ls[0]->input_shape().end());
    MPT_CHECK(!in.empty(), "save: Sequential '", m.name(), "' is not built; build it or call it once first");
    add(ObjectWriter()
            .str("module", "keras.layers")
            .str("class_name", "InputLayer")
            .raw("config", ObjectWriter().raw("batch_shape", shape_json(in)).str("dtype", "float32").str("name", "input_layer").done())
            .raw("registered_name", "null")
            .done());
    for (const auto& l : ls) add(layer_json(*l));
    c.raw("layers", "[" + layers + "]").raw("build_input_shape", shape_json(in));
    return ObjectWriter().str("module", "keras").str("class_name", "Sequential").raw("config", c.done()).done();
  }
  const auto& nodes = Access::nodes(m);
  const auto& inputs = Access::inputs(m);
  MPT_CHECK(!inputs.empty(), "save: model '", m.name(), "' is neither Sequential nor functional; use save_weights");
  // Functional: each layer once, the inputs, then every call in execution order.
  auto ls = m.layers();
  std::map<const Layer*, std::size_t> layer_index;
  for (std::size_t i = 0; i < ls.size(); ++i) layer_index[ls[i].ptr().get()] = i, add(layer_json(*ls[i]));
  std::map<const FunctionalNode*, std::string> ref;
  std::string ins, calls, outs;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto& n = *inputs[i].node();
    ref[&n] = ObjectWriter().raw("input", json::number(static_cast<std::int64_t>(i))).done();
    ins += (ins.empty() ? "" : ", ") + ObjectWriter()
                                           .str("name", n.input_name)
                                           .raw("batch_shape", shape_json(n.input_shape))
                                           .str("dtype", to_string(inputs[i].dtype()))
                                           .done();
  }
  for (std::size_t j = 0; j < nodes.size(); ++j) {
    std::string args;
    for (const auto& in : nodes[j]->inputs) {
      auto it = ref.find(in.node().get());
      MPT_CHECK(it != ref.end(), "save: model '", m.name(), "': a layer call uses a tensor from outside the model");
      args += (args.empty() ? "" : ", ") + it->second;
    }
    calls += (calls.empty() ? "" : ", ") +
             ObjectWriter().raw("layer", json::number(static_cast<std::int64_t>(layer_index.at(nodes[j]->layer.get())))).raw("inputs", "[" + args + "]").done();
    ref[nodes[j].get()] = ObjectWriter().raw("node", json::number(static_cast<std::int64_t>(j))).done();
  }
  for (const auto& o : Access::outputs(m)) outs += (outs.empty() ? "" : ", ") + ref.at(o.node().get());
  c.raw("layers", "[" + layers + "]").raw("inputs", "[" + ins + "]").raw("calls", "[" + calls + "]").raw("outputs", "[" + outs + "]");
  return ObjectWriter().str("module", "keras").str("class_name", "Functional").raw("config", c.done()).done();
}

std::unique_ptr<Model> model_from_config(const json::Value& v, const std::string& w) {
  const std::string& cls = v.at("class_name", w).as_string(w + ", class_name");
  const json::Value& c = v.at("config", w);
  const std::string name = c.at("name", w).as_string(w + ", name");
  const auto& layer_list = c.at("layers", w).as_array(w + ", layers");
  std::vector<LayerRef> layers;
  for (std::size_t i = 0; i < layer_list.size(); ++i)
    layers.push_back(layer_from_config(layer_config_from(layer_list[i], w + ", layer " + std::to_string(i))));
  std::unique_ptr<Model> m;
  if (cls == "Sequential") {
    auto s = std::make_unique<Sequential>(layers);
    if (const json::Value* b = c.find("build_input_shape"); b && s->input_shape().empty()) {
      Shape shape;
      for (const auto& d : b->as_array(w)) shape.push_back(d.is_null() ? 1 : d.as_int(w));
      s->build(shape);
    }
    m = std::move(s);
  } else if (cls == "Functional") {
    std::vector<KerasTensor> inputs, values;
    for (const auto& in : c.at("inputs", w).as_array(w + ", inputs")) {
      Shape shape;
      for (const auto& d : in.at("batch_shape", w).as_array(w)) shape.push_back(d.is_null() ? -1 : d.as_int(w));
      MPT_CHECK(!shape.empty(), w, ": empty input shape");
      shape.erase(shape.begin());
      inputs.push_back(Input(shape, {.dtype = dtype_from_string(in.at("dtype", w).as_string(w)),
                                     .name = in.at("name", w).as_string(w)}));
    }
    auto resolve = [&](const json::Value& r) {
      if (const json::Value* i = r.find("input")) {
        const auto k = static_cast<std::size_t>(i->as_uint(w));
        MPT_CHECK(k < inputs.size(), w, ": input reference ", k, " out of range");
        return inputs[k];
      }
      const auto k = static_cast<std::size_t>(r.at("node", w).as_uint(w));
      MPT_CHECK(k < values.size(), w, ": call reference ", k, " out of range");
      return values[k];
    };
    for (const auto& call : c.at("calls", w).as_array(w + ", calls")) {
      const auto k = static_cast<std::size_t>(call.at("layer", w).as_uint(w));
      MPT_CHECK(k < layers.size(), w, ": layer reference ", k, " out of range");
      std::vector<KerasTensor> args;
      for (const auto& r : call.at("inputs", w).as_array(w)) args.push_back(resolve(r));
      values.push_back(args.size() == 1 ? layers[k](args[0]) : layers[k](args));
    }
    std::vector<KerasTensor> outputs;
    for (const auto& r : c.at("outputs", w).as_array(w + ", outputs")) outputs.push_back(resolve(r));
    m = std::make_unique<Model>(inputs, outputs, name);
  } else {
    fail(w, ": unknown model class '", cls, "' (known: Sequential, Functional)");
  }
  m->set_name(name);
  if (const json::Value* d = c.find("dtype")) Access::policy(*m) = policy_from(*d, w);
  return m;
}

std::string compile_config_json(const Model& m) {
  std::string metrics;
  for (const auto& a : Access::metric_args(m))
    metrics += (metrics.empty() ? "" : ", ") + quote(a.object() ? a.object()->name() : a.name());
  return ObjectWriter()
      .raw("optimizer", io::optimizer_to_json(m.optimizer()))
      .raw("loss", loss_json(m.loss()))
      .raw("metrics", "[" + metrics + "]")
      .done();
}

std::string state_json(const Model& m) {
  const auto [gseed, gcount] = detail::seed_state();
  ObjectWriter rng;
  for (const auto& l : m.layers()) {
    const auto s = l->rng_state();
    if (s.empty()) continue;
    std::string v;
    for (auto x : s) v += (v.empty() ? "" : ", ") + json::number(x);
    rng.raw(l->name(), "[" + v + "]");
  }
  return ObjectWriter()
      .raw("epoch", json::number(m.epoch()))
      .raw("seed", json::number(Access::seed(m)))
      .raw("global_seed", std::string("[").append(json::number(gseed)).append(", ").append(json::number(gcount)).append("]"))
      .raw("layer_rng", rng.done())
      .done();
}

}  // namespace

void Model::save(const std::string& filepath) const {
  MPT_CHECK(filepath.size() < 6 || filepath.compare(filepath.size() - 6, 6, ".keras") != 0, "save: '", filepath,
            "': this build writes mpt's HDF5 checkpoint, not the .keras zip; name it e.g. 'model.h5'");
  for (const auto& l : layers())
    MPT_CHECK(l->built(), "save: layer '", l->name(), "' of model '", name_,
              "' is not built; build the model (model.build(shape)) or call it once first");
  const std::string model_config = model_config_json(*this);
  const std::string compile_config = compiled() ? compile_config_json(*this) : "";
  const std::string state = state_json(*this);
  io::save_atomically(filepath, kFormat, [&](const std::string& tmp) {
    io::h5::File f = io::h5::File::create(tmp, io::kUserblockSize, filepath);
    io::write_keras3(f, *this, {});
    f.set_attr("mpt_format", kFormat);
    f.set_attr_int("mpt_format_version", kFormatVersion);
    f.set_attr("model_config", model_config);
    if (!compile_config.empty()) f.set_attr("compile_config", compile_config);
    f.set_attr("mpt_state", state);
    f.close();
  });
}

std::unique_ptr<Model> load_model(const std::string& filepath) {
  try {
    std::vector<char> bytes = io::read_verified(filepath);
    io::h5::File f = io::h5::File::open_image(bytes, filepath);
    const std::string w = "file '" + filepath + "'";
    const auto format = f.attr_string("mpt_format");
    MPT_CHECK(format && *format == kFormat && f.has_attr("model_config"), w,
              ": not an mpt full checkpoint (no model_config); weights files load with model.load_weights");
    const auto version = f.attr_int("mpt_format_version").value_or(0);
    MPT_CHECK(version == kFormatVersion, w, ": checkpoint format version ", version, " is not supported (this build reads ",
              kFormatVersion, ")");
    const json::Value model_config = json::parse(*f.attr_string("model_config"), w + ", model_config");
    const auto compile_text = f.attr_string("compile_config");
    const json::Value state = json::parse(f.attr_string("mpt_state").value_or("{}"), w + ", mpt_state");

    std::unique_ptr<Model> m = model_from_config(model_config, w + ", model_config");
    if (compile_text) {
      const std::string cw = w + ", compile_config";
      const json::Value cc = json::parse(*compile_text, cw);
      std::vector<metrics::MetricArg> metrics;
      for (const auto& x : cc.at("metrics", cw).as_array(cw + ", metrics")) metrics.emplace_back(x.as_string(cw));
      m->compile({.optimizer = io::optimizer_from_json(cc.at("optimizer", cw), cw),
                  .loss = loss_from(cc.at("loss", cw), cw),
                  .metrics = metrics,
                  .auto_scale_loss = false});  // the saved optimizer already is what compile made
    }
    io::PendingState pending = io::read_weights(f, *m, io::OptimizerState::Required);

    // Check the whole state before touching the model or the global seed.
    const std::string sw = w + ", mpt_state";
    const int epoch = static_cast<int>(state.at("epoch", sw).as_int(sw + ", epoch"));
    MPT_CHECK(epoch >= 0, sw, ": negative epoch ", epoch);
    const std::uint64_t seed = state.at("seed", sw).as_uint(sw + ", seed");
    const auto& g = state.at("global_seed", sw).as_array(sw + ", global_seed");
    MPT_CHECK(g.size() == 2, sw, ": global_seed needs two numbers");
    const std::uint64_t gseed = g[0].as_uint(sw), gcount = g[1].as_uint(sw);
    std::vector<std::pair<LayerRef, std::vector<std::uint64_t>>> rng;
    if (const json::Value* r = state.find("layer_rng")) {
      for (const auto& [name, values] : r->members) {
        LayerRef layer;
        for (const auto& l : m->layers())
          if (l->name() == name) layer = l;
        MPT_CHECK(static_cast<bool>(layer), sw, ": random state for layer '", name, "', which the model does not have");
        std::vector<std::uint64_t> s;
        for (const auto& x : values.as_array(sw)) s.push_back(x.as_uint(sw));
        MPT_CHECK(s.size() == layer->rng_state().size(), sw, ": layer '", name, "' keeps ", layer->rng_state().size(),
                  " random-state values, the file has ", s.size());
        rng.emplace_back(layer, std::move(s));
      }
    }
    pending.commit(*m);
    Access::epoch(*m) = epoch;
    Access::seed(*m) = seed;
    for (const auto& [layer, s] : rng) layer->set_rng_state(s);
    detail::set_seed_state(gseed, gcount);
    return m;
  } catch (const Error& e) {
    throw Error(std::string("load_model: ") + e.what());
  }
}

}  // namespace mpt
