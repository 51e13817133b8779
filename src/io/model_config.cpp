// Architecture and compile settings as JSON for full checkpoints and .keras archives, in Keras's
// config layout (module / class_name / config): Keras's load_model reads what mpt writes, and mpt
// reads the config.json Keras writes for Sequential models.
#include <map>
#include <typeinfo>

#include "io/checkpoint_access.hpp"
#include "io/model_config.hpp"
#include "io/optimizer_io.hpp"

namespace mpt::io {

namespace {

using Access = detail::CheckpointAccess;
using json::ObjectWriter;
using json::quote;

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

/// `keras_view`: for Keras's config.json (seeds cut to the 31 bits Keras's backends take).
std::string layer_json(const Layer& l, bool keras_view) {
  ObjectWriter c;
  c.str("name", l.name()).raw("trainable", json::boolean(l.trainable())).raw("dtype", policy_json(l.dtype_policy()));
  for (const auto& [k, v] : l.config()) {
    MPT_CHECK(k != "name" && k != "trainable" && k != "dtype", "save: layer '", l.name(), "' config repeats '", k, "'");
    if (keras_view && k == "seed" && v != "null" && json::is_json(v))
      c.raw(k, json::number(static_cast<std::uint64_t>(json::parse(v, "seed").as_uint("seed") % 2147483648ull)));
    else
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
    // Keras serializes initializers as {"module": "keras.initializers", "class_name": "GlorotUniform", ...}.
    const json::Value* module = val.find("module");
    if (module && module->is_string() && module->text == "keras.initializers" && val.find("class_name"))
      c.config.emplace_back(k, to_snake_case(val.at("class_name", w).as_string(w)));
    else
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
  if (v.is_string()) return losses::get(v.text);  // Keras's compile_config: a name...
  const json::Value* n = v.find("name");           // ... or {"class_name": ..., "config": ...}
  const std::string name = n ? n->as_string(w + ", loss") : to_snake_case(v.at("class_name", w).as_string(w + ", loss"));
  const json::Value& c = v.at("config", w);
  losses::CrossentropyOptions o;
  if (const json::Value* f = c.find("from_logits")) o.from_logits = f->as_bool(w + ", from_logits");
  if (const json::Value* s = c.find("label_smoothing")) o.label_smoothing = s->as_double(w + ", label_smoothing");
  if (name == "sparse_categorical_crossentropy") return std::make_shared<losses::SparseCategoricalCrossentropy>(o);
  if (name == "categorical_crossentropy") return std::make_shared<losses::CategoricalCrossentropy>(o);
  if (name == "binary_crossentropy") return std::make_shared<losses::BinaryCrossentropy>(o);
  return losses::get(name);
}

/// Keras's compile_config (Keras names only), for config.json.
std::string keras_compile_config(const Model& m) {
  const losses::Loss& loss = m.loss();
  check_loss_is_builtin(loss);
  std::string loss_text = quote(loss.name());
  const losses::CrossentropyOptions* o = nullptr;
  std::string cls;
  if (auto* l = dynamic_cast<const losses::SparseCategoricalCrossentropy*>(&loss)) o = &l->options(), cls = "SparseCategoricalCrossentropy";
  if (auto* l = dynamic_cast<const losses::CategoricalCrossentropy*>(&loss)) o = &l->options(), cls = "CategoricalCrossentropy";
  if (auto* l = dynamic_cast<const losses::BinaryCrossentropy*>(&loss)) o = &l->options(), cls = "BinaryCrossentropy";
  if (o && (o->from_logits || o->label_smoothing != 0)) {
    ObjectWriter c;
    c.raw("from_logits", json::boolean(o->from_logits));
    if (cls != "SparseCategoricalCrossentropy") c.raw("label_smoothing", json::number(o->label_smoothing));
    loss_text = ObjectWriter().str("module", "keras.losses").str("class_name", cls).raw("config", c.done()).raw("registered_name", "null").done();
  }
  std::string metrics;
  for (const auto& a : Access::metric_args(m))
    metrics += (metrics.empty() ? "" : ", ") + quote(a.object() ? a.object()->name() : a.name());
  return ObjectWriter()
      .raw("optimizer", io::optimizer_to_json(m.optimizer(), true))
      .raw("loss", loss_text)
      .raw("loss_weights", "null")
      .raw("metrics", "[" + metrics + "]")
      .raw("weighted_metrics", "null")
      .raw("run_eagerly", "false")
      .raw("steps_per_execution", "1")
      .raw("jit_compile", "false")
      .done();
}

}  // namespace

std::string model_config_json(const Model& m, bool keras_view) {
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
    for (const auto& l : ls) add(layer_json(*l, keras_view));
    c.raw("layers", "[" + layers + "]").raw("build_input_shape", shape_json(in));
    ObjectWriter out;
    out.str("module", "keras").str("class_name", "Sequential").raw("config", c.done());
    if (keras_view) {
      out.raw("registered_name", "null").raw("build_config", ObjectWriter().raw("input_shape", shape_json(in)).done());
      if (m.compiled()) out.raw("compile_config", keras_compile_config(m));
    }
    return out.done();
  }
  const auto& nodes = Access::nodes(m);
  const auto& inputs = Access::inputs(m);
  MPT_CHECK(!inputs.empty(), "save: model '", m.name(), "' is neither Sequential nor functional; use save_weights");
  // Functional: each layer once, the inputs, then every call in execution order.
  auto ls = m.layers();
  std::map<const Layer*, std::size_t> layer_index;
  for (std::size_t i = 0; i < ls.size(); ++i) layer_index[ls[i].ptr().get()] = i, add(layer_json(*ls[i], keras_view));
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

void compile_from_config(Model& m, const json::Value& cc, const std::string& where, bool auto_scale_loss) {
  std::vector<metrics::MetricArg> metrics;
  if (const json::Value* ms = cc.find("metrics"); ms && !ms->is_null())
    for (const auto& x : ms->as_array(where + ", metrics"))
      metrics.emplace_back(x.is_string() ? x.text : x.at("config", where).at("name", where).as_string(where));
  m.compile({.optimizer = optimizer_from_json(cc.at("optimizer", where), where),
             .loss = loss_from(cc.at("loss", where), where),
             .metrics = metrics,
             .auto_scale_loss = auto_scale_loss});
}

}  // namespace mpt::io
