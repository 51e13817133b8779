// Full checkpoints: Model::save / load_model. The file is Keras 3's weights layout (so Keras can
// load_weights from it) plus root attributes: model_config (Keras-style architecture JSON),
// compile_config (optimizer, loss, metrics) and mpt_state (epoch and random-generator state).
// A ".keras" name wraps the same file in Keras's zip with config.json and metadata.json.
#include <ctime>
#include <optional>

#include "io/checked_file.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_access.hpp"
#include "core/json_util.hpp"
#include "io/keras_zip.hpp"
#include "io/model_config.hpp"
#include "io/weights_h5.hpp"

namespace mpt {

namespace {

using Access = detail::CheckpointAccess;
using io::Json;

constexpr const char* kFormat = "mpt-checkpoint";
constexpr std::int64_t kFormatVersion = 1;

Json state_json(const Model& m) {
  const auto [gseed, gcount] = detail::seed_state();
  Json rng = Json::object();
  for (const auto& l : m.layers()) {
    const auto s = l->rng_state();
    if (!s.empty()) rng[l->name()] = s;
  }
  return {{"epoch", m.epoch()},
          {"seed", Access::seed(m)},
          {"global_seed", Json::array({gseed, gcount})},
          {"layer_rng", rng}};
}

}  // namespace

void io::save_checkpoint(const Model& model, const std::string& filepath, const Json& extra_state) {
  const Model& m = model;
  const std::string& name_ = m.name();
  const bool keras_zip = filepath.size() >= 6 && filepath.compare(filepath.size() - 6, 6, ".keras") == 0;
  for (const auto& l : m.layers())
    MPT_CHECK(l->built(), "save: layer '", l->name(), "' of model '", name_,
              "' is not built; build the model (model.build(shape)) or call it once first");
  // Data parallelism: every rank holds the same model; rank 0 alone writes.
  if (const auto* dp = m.distribution(); dp && dp->rank() != 0) return;
  const std::string where = "save: model '" + name_ + "'";
  const io::Json config_json = io::model_config_json(m);
  io::check_json_finite(config_json, where + ", the model config");  // refused here, not a file that fails to load
  const std::string model_config = io::dump_json(config_json, where);
  const std::string compile_config = m.compiled() ? io::dump_json(io::compile_config_json(m), where) : "";
  Json state_object = state_json(m);
  if (extra_state.is_object())
    for (const auto& [k, v] : extra_state.items()) state_object[k] = v;
  const std::string state = io::dump_json(state_object, where);
  auto write = [&](const std::string& tmp) {
    io::h5::File f = io::h5::File::create(tmp, io::kUserblockSize, filepath);
    io::write_keras3(f, m, {});
    f.set_attr("mpt_format", kFormat);
    f.set_attr_int("mpt_format_version", kFormatVersion);
    f.set_attr("model_config", model_config);
    if (!compile_config.empty()) f.set_attr("compile_config", compile_config);
    f.set_attr("mpt_state", state);
    f.close();
  };
  if (!keras_zip) return io::save_atomically(filepath, kFormat, write);
  // .keras: Keras's zip of config.json, metadata.json and model.weights.h5 (the same checkpoint).
  auto bytes = [](const std::string& s) { return std::vector<char>(s.begin(), s.end()); };
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&now, &tm);
  std::strftime(date, sizeof date, "%Y-%m-%d@%H:%M:%S", &tm);
  const std::string metadata = io::dump_json(
      Json{{"keras_version", "3.15.1"}, {"date_saved", date}, {"mpt_version", "0.1.0"}, {"mpt_format", kFormat}}, where);
  std::vector<char> zip = io::make_zip({{"metadata.json", bytes(metadata)},
                                        {"config.json", bytes(io::dump_json(io::model_config_json(m, true), where))},
                                        {"model.weights.h5", io::stamped_image(filepath, kFormat, write)}},
                                       filepath);
  io::write_atomically(filepath, zip);
}

void Model::save(const std::string& filepath) const { io::save_checkpoint(*this, filepath, Json::object()); }

namespace {
/// Checks the whole mpt_state (epoch, seeds, layers' random streams) against the model before
/// touching it or the global seed, then commits the weights and the state.
void apply_state(Model& m, const Json& state, const std::string& w, io::PendingState& pending) {
  // Check the whole state before touching the model or the global seed.
  const std::string sw = w + ", mpt_state";
  const std::int64_t epoch64 = io::as_int(io::at(state, "epoch", sw), sw + ", epoch");
  MPT_CHECK(epoch64 >= 0 && epoch64 < (std::int64_t{1} << 31), sw, ": epoch ", epoch64, " is out of range");
  const int epoch = static_cast<int>(epoch64);
  const std::uint64_t seed = io::as_uint(io::at(state, "seed", sw), sw + ", seed");
  const Json& g = io::as_array(io::at(state, "global_seed", sw), sw + ", global_seed");
  MPT_CHECK(g.size() == 2, sw, ": global_seed needs two numbers");
  const std::uint64_t gseed = io::as_uint(g[0], sw + ", global_seed"), gcount = io::as_uint(g[1], sw + ", global_seed");
  std::vector<std::pair<LayerRef, std::vector<std::uint64_t>>> rng;
  if (const Json* r = io::find(state, "layer_rng"); r && r->is_object()) {
    for (const auto& [name, values] : r->items()) {
      LayerRef layer;
      for (const auto& l : m.layers())
        if (l->name() == name) layer = l;
      MPT_CHECK(static_cast<bool>(layer), sw, ": random state for layer '", name, "', which the model does not have");
      std::vector<std::uint64_t> s;
      for (const auto& x : io::as_array(values, sw + ", layer_rng")) s.push_back(io::as_uint(x, sw + ", layer_rng"));
      MPT_CHECK(s.size() == layer->rng_state().size(), sw, ": layer '", name, "' keeps ", layer->rng_state().size(),
                " random-state values, the file has ", s.size());
      rng.emplace_back(layer, std::move(s));
    }
  }
  pending.commit(m);
  Access::epoch(m) = epoch;
  Access::seed(m) = seed;
  for (const auto& [layer, s] : rng) layer->set_rng_state(s);
  detail::set_seed_state(gseed, gcount);
}

std::unique_ptr<Model> load_from(const std::vector<char>& bytes, const std::string& keras_config,
                                 const std::string& filepath, bool compile) {
  io::h5::File f = io::h5::File::open_image(bytes, filepath);
  const std::string w = "file '" + filepath + "'";
  const auto format = f.attr_string("mpt_format");
  const bool mpt_file = format && *format == kFormat && f.has_attr("model_config");
  MPT_CHECK(mpt_file || !keras_config.empty(), w,
            ": not an mpt full checkpoint or .keras archive (no model_config); weights files load with "
            "model.load_weights");
  Json model_config, state;
  std::optional<Json> compile_config;
  if (mpt_file) {
    const auto version = f.attr_int("mpt_format_version").value_or(0);
    MPT_CHECK(version == kFormatVersion, w, ": checkpoint format version ", version,
              " is not supported (this build reads ", kFormatVersion, ")");
    model_config = io::parse_json(*f.attr_string("model_config"), w + ", model_config");
    if (auto text = f.attr_string("compile_config")) compile_config = io::parse_json(*text, w + ", compile_config");
    state = io::parse_json(f.attr_string("mpt_state").value_or("{}"), w + ", mpt_state");
  } else {  // a .keras archive written by Keras: its config.json, no mpt state
    model_config = io::parse_json(keras_config, w + ", config.json");
    // Keras writes {} (or null) for a model that was never compiled.
    if (const Json* cc = io::find(model_config, "compile_config"); cc && !cc->is_null() && !cc->empty())
      compile_config = *cc;
  }

  std::unique_ptr<Model> m = io::model_from_config(model_config, w + ", model_config");
  // mpt saved the optimizer compile made (no second wrapping); Keras saved compile's argument.
  if (compile_config && compile) io::compile_from_config(*m, *compile_config, w + ", compile_config", !mpt_file);
  io::PendingState pending = io::read_weights(f, *m,
                                              !compile   ? io::OptimizerState::Ignore
                                              : mpt_file ? io::OptimizerState::Required
                                                         : io::OptimizerState::IfMatching);
  if (!mpt_file) {
    pending.commit(*m);
    return m;
  }

  apply_state(*m, state, w, pending);
  return m;
}
}  // namespace

Json io::restore_checkpoint(Model& model, const std::string& filepath) {
  const std::string w = "file '" + filepath + "'";
  Json state;
  std::vector<char> bytes = io::read_verified(filepath);
  io::parse_guarded(bytes, filepath, [&] {
    io::h5::File f = io::h5::File::open_image(bytes, filepath);
    const auto format = f.attr_string("mpt_format");
    MPT_CHECK(format && *format == kFormat && f.has_attr("mpt_state"), w, ": not an mpt full checkpoint");
    const auto version = f.attr_int("mpt_format_version").value_or(0);
    MPT_CHECK(version == kFormatVersion, w, ": checkpoint format version ", version,
              " is not supported (this build reads ", kFormatVersion, ")");
    state = io::parse_json(f.attr_string("mpt_state").value_or("{}"), w + ", mpt_state");
    io::PendingState pending = io::read_weights(
        f, model, model.compiled() ? io::OptimizerState::Required : io::OptimizerState::Ignore);
    apply_state(model, state, w, pending);
  });
  return state;
}

std::unique_ptr<Model> load_model(const std::string& filepath, LoadModelOptions options) {
  try {
    std::string keras_config;
    std::vector<char> bytes = io::read_verified(filepath, &keras_config);
    std::unique_ptr<Model> m;
    io::parse_guarded(bytes, filepath, [&] { m = load_from(bytes, keras_config, filepath, options.compile); });
    return m;
  } catch (const Error& e) {
    throw Error(std::string("load_model: ") + e.what());
  } catch (const nlohmann::json::exception& e) {  // every JSON read names its key; this is a safety net
    throw Error("load_model: file '" + filepath + "': bad JSON config (" + e.what() + ")");
  }
}

}  // namespace mpt
