// Class name -> factory, for load_model. Core layers are registered here through their public
// factories; other layer files call register_layer themselves.
#include <map>
#include <mutex>

#include "core/json_util.hpp"
#include "mpt/layers/core.hpp"

namespace mpt {

namespace {

std::string where(const LayerConfig& c) { return "layer config of " + c.class_name + " '" + c.name + "'"; }

std::map<std::string, LayerFactory> core_layers() {
  std::map<std::string, LayerFactory> m;
  m["InputLayer"] = [](const LayerConfig& c) {
    c.expect("sparse", false);
    c.expect("ragged", false);
    c.expect("optional", false);
    Shape s = c.get_shape("batch_shape");
    if (!s.empty()) s.erase(s.begin());  // the batch dimension
    return layers::Input(s, {.name = c.name});
  };
  m["Dense"] = [](const LayerConfig& c) {
    return layers::Dense(c.get_int("units"), {.activation = c.get("activation", "linear"),
                                              .use_bias = c.has("use_bias") ? c.get_bool("use_bias") : true,
                                              .kernel_initializer = c.get_initializer("kernel_initializer", "glorot_uniform"),
                                              .bias_initializer = c.get_initializer("bias_initializer", "zeros"),
                                              .dtype = c.dtype,
                                              .name = c.name});
  };
  m["Activation"] = [](const LayerConfig& c) {
    return layers::Activation(c.get("activation"), {.dtype = c.dtype, .name = c.name});
  };
  m["Softmax"] = [](const LayerConfig& c) {
    return layers::Softmax({.axis = c.has("axis") ? c.get_int("axis") : -1, .dtype = c.dtype, .name = c.name});
  };
  m["Flatten"] = [](const LayerConfig& c) {
    c.expect("data_format", "channels_last");
    return layers::Flatten({.dtype = c.dtype, .name = c.name});
  };
  m["Reshape"] = [](const LayerConfig& c) {
    return layers::Reshape(c.get_shape("target_shape"), {.dtype = c.dtype, .name = c.name});
  };
  m["Dropout"] = [](const LayerConfig& c) {
    std::optional<std::uint64_t> seed;
    if (c.has("seed")) seed = c.get_uint("seed");
    return layers::Dropout(c.get_double("rate"), {.seed = seed, .dtype = c.dtype, .name = c.name});
  };
  return m;
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, LayerFactory>& registry() {
  static std::map<std::string, LayerFactory> r = core_layers();
  return r;
}

std::string where(const LayerConfig& c, const std::string& key) { return where(c) + ", '" + key + "'"; }

}  // namespace

bool LayerConfig::has(const std::string& key) const {
  read_.insert(key);
  const nlohmann::json* v = io::find(config, key);
  return v && !v->is_null();
}

const nlohmann::json& LayerConfig::at(const std::string& key) const {
  read_.insert(key);
  const nlohmann::json* v = io::find(config, key);
  MPT_CHECK(v != nullptr, where(*this), ": missing entry '", key, "'");
  return *v;
}

std::string LayerConfig::get(const std::string& key) const {
  const nlohmann::json& v = at(key);
  const nlohmann::json* module = io::find(v, "module");
  if (module && module->is_string() && *module == "keras.initializers") {
    // A factory reading an initializer by name: only Keras's default arguments say it all.
    const initializers::Initializer init = initializers::deserialize(v, where(*this, key));
    const std::string name = to_snake_case(init.class_name);
    MPT_CHECK(init == initializers::Initializer(name), where(*this, key), ": initializer ", init.class_name, " with ",
              init.get_config().dump(), " is not supported by mpt's ", class_name,
              " (it reads this initializer by name: Keras's default arguments, no seed)");
    return name;
  }
  return io::as_string(v, where(*this, key));
}

initializers::Initializer LayerConfig::get_initializer(const std::string& key,
                                                       const initializers::Initializer& fallback) const {
  read_.insert(key);
  const nlohmann::json* v = io::find(config, key);
  if (!v) return fallback;
  if (v->is_null()) return initializers::GlorotUniform();  // Keras's add_weight(initializer=None)
  return initializers::deserialize(*v, where(*this, key));
}

std::string LayerConfig::get(const std::string& key, const std::string& fallback) const {
  return has(key) ? get(key) : fallback;
}

std::int64_t LayerConfig::get_int(const std::string& key) const { return io::as_int(at(key), where(*this, key)); }

std::uint64_t LayerConfig::get_uint(const std::string& key) const { return io::as_uint(at(key), where(*this, key)); }

double LayerConfig::get_double(const std::string& key) const { return io::as_double(at(key), where(*this, key)); }

bool LayerConfig::get_bool(const std::string& key) const { return io::as_bool(at(key), where(*this, key)); }

Shape LayerConfig::get_shape(const std::string& key) const {
  const std::string w = where(*this, key);
  nlohmann::json v = at(key);
  if (v.is_string()) {  // Python-style tuples as older configs print them: (None, 28, 28, 1)
    std::string text = v.get<std::string>();
    for (auto& ch : text) ch = ch == '(' ? '[' : ch == ')' ? ']' : ch;
    for (std::size_t p; (p = text.find("None")) != std::string::npos;) text.replace(p, 4, "null");
    v = nlohmann::json(io::parse_json(text, w));
  }
  Shape s;
  for (const auto& d : io::as_array(v, w)) s.push_back(d.is_null() ? -1 : io::as_int(d, w));
  return s;
}

std::vector<std::int64_t> LayerConfig::get_ints(const std::string& key) const {
  const nlohmann::json& v = at(key);
  if (v.is_number()) return {io::as_int(v, where(*this, key))};
  return get_shape(key);
}

std::optional<regularizers::Regularizer> LayerConfig::get_regularizer(const std::string& key) const {
  return has(key) ? regularizers::deserialize(at(key), where(*this, key)) : std::nullopt;
}

std::optional<constraints::Constraint> LayerConfig::get_constraint(const std::string& key) const {
  return has(key) ? constraints::deserialize(at(key), where(*this, key)) : std::nullopt;
}

void LayerConfig::expect(const std::string& key, const nlohmann::json& supported) const {
  if (!has(key)) return;
  const nlohmann::json& v = at(key);
  MPT_CHECK(v == supported, class_name, " '", name, "': ", key, " = ", v.dump(), " is not supported by mpt's ",
            class_name, " (only ", supported.dump(), ")");
}

std::vector<std::string> LayerConfig::unread() const {
  std::vector<std::string> out;
  if (config.is_object())
    for (const auto& [k, v] : config.items())
      if (!v.is_null() && !read_.count(k)) out.push_back(k);
  return out;
}

void register_layer(const std::string& class_name, LayerFactory factory) {
  MPT_CHECK(!class_name.empty() && factory, "register_layer: needs a class name and a factory");
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[class_name] = std::move(factory);
}

LayerRef layer_from_config(const LayerConfig& c) {
  LayerFactory factory;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(c.class_name);
    if (it == registry().end()) {
      std::string known;
      for (const auto& [k, f] : registry()) known += (known.empty() ? "" : ", ") + k;
      fail("load_model: no factory for layer class '", c.class_name, "' (layer '", c.name,
           "'); register one with mpt::register_layer. Registered: ", known);
    }
    factory = it->second;
  }
  LayerRef layer = factory(c);
  MPT_CHECK(static_cast<bool>(layer), "load_model: the factory for '", c.class_name, "' returned no layer");
  layer->set_rules_from(c);  // the regularizers and constraints the layer declares
  // As Keras's from_config, which passes every field to the constructor: a field the factory
  // never looked at would be dropped, so the layer would compute something else.
  if (const auto left = c.unread(); !left.empty()) {
    std::string fields;
    for (const auto& k : left) fields += (fields.empty() ? "" : ", ") + k + " = " + c.config[k].dump();
    fail(c.class_name, " '", c.name, "': config field", left.size() > 1 ? "s " : " ", fields,
         left.size() > 1 ? " are" : " is", " not supported by mpt's ", c.class_name,
         " (loading would drop ", left.size() > 1 ? "them" : "it", " and compute something else)");
  }
  if (layer->name() != c.name) layer->set_name(c.name);
  if (!(layer->dtype_policy() == c.dtype)) layer->set_dtype_policy(c.dtype);
  if (!c.trainable) layer->set_trainable(false);
  return layer;
}

}  // namespace mpt
