// Model::save_weights / load_weights: Keras 3's .weights.h5 layout and Keras 2's legacy .h5.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>

#include "io/checked_file.hpp"
#include "io/optimizer_io.hpp"
#include "io/weights_h5.hpp"

#include "mpt/log.hpp"

namespace mpt {

namespace io {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Tensor export_value(const Variable& v, std::optional<DType> dtype) {
  const Tensor& t = v.value();
  return dtype && is_floating(t.dtype()) && t.dtype() != *dtype ? t.to(*dtype) : t;
}

/// One entry of Keras's optimizer variable list: what it holds and its shape.
struct OptEntry {
  /// Derived: a value Keras stores that mpt derives (Nadam's u_product, Adafactor's full
  /// velocity of a factored variable, its placeholder scalars): written, not read back.
  enum Kind { Iterations, LearningRate, StepCounter, DynamicScale, Slot, Derived } kind;
  Shape shape;
  std::string var_path, slot;
};

std::vector<OptEntry> optimizer_entries(const optimizers::Optimizer& opt, const std::vector<Variable>& trainable) {
  std::vector<OptEntry> out{{OptEntry::Iterations, {}, "", ""}};
  if (has_learning_rate_variable(opt)) out.push_back({OptEntry::LearningRate, {}, "", ""});
  for (const auto& group : slot_layout(opt))
    for (const auto& v : trainable)
      for (const auto& name : group) {
        const KerasSlot k = keras_slot(opt, v, name);
        out.push_back({k.derived ? OptEntry::Derived : OptEntry::Slot, k.shape, v.path(), name});
      }
  for (const auto& name : trailing_variables(opt)) out.push_back({OptEntry::Derived, {}, "", name});
  return out;
}

/// Keras's LossScaleOptimizer list: its own four variables, then the inner optimizer's.
std::vector<OptEntry> model_optimizer_entries(const Model& model) {
  auto trainable = model.trainable_variables();
  if (auto* lso = model.loss_scale_optimizer()) {
    std::vector<OptEntry> out{{OptEntry::Iterations, {}, "", ""},
                              {OptEntry::LearningRate, {}, "", ""},
                              {OptEntry::StepCounter, {}, "", ""},
                              {OptEntry::DynamicScale, {}, "", ""}};
    for (auto& e : optimizer_entries(lso->inner_optimizer(), trainable)) out.push_back(e);
    return out;
  }
  return optimizer_entries(model.optimizer(), trainable);
}

void write_optimizer_entries(const h5::Group& g, const std::vector<OptEntry>& entries, std::size_t first,
                             const Model& model) {
  auto* lso = model.loss_scale_optimizer();
  optimizers::Optimizer& opt = lso ? lso->inner_optimizer() : model.optimizer();
  const auto slots = opt.slots_by_path();
  for (std::size_t i = first; i < entries.size(); ++i) {
    const OptEntry& e = entries[i];
    Tensor t;
    switch (e.kind) {
      case OptEntry::Iterations: t = Tensor::scalar(static_cast<double>(opt.raw_iterations()), int64, Device::cpu()); break;
      case OptEntry::LearningRate: t = Tensor::scalar(opt.learning_rate(), float32, Device::cpu()); break;
      case OptEntry::StepCounter: t = Tensor::scalar(static_cast<double>(lso->step_counter()), int64, Device::cpu()); break;
      case OptEntry::DynamicScale: t = Tensor::scalar(lso->loss_scale(), float32, Device::cpu()); break;
      case OptEntry::Slot: {
        auto p = slots.find(e.var_path);
        if (p != slots.end()) {
          auto s = p->second.find(e.slot);
          if (s != p->second.end()) t = s->second;
        }
        if (!t.defined()) t = Tensor::zeros(e.shape, float32, Device::cpu());  // not stepped yet: Keras's zeros
        break;
      }
      case OptEntry::Derived: t = derived_value(opt, e.slot, e.shape); break;
    }
    g.write(std::to_string(i - first), t);
  }
}

std::string normalized(std::string name) {
  std::string out;
  for (char c : name)
    if (c != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  while (!out.empty() && std::isdigit(static_cast<unsigned char>(out.back()))) out.pop_back();
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out.empty() ? "none" : out;
}

/// Reads `name` from g for variable v: shape and kind checked, converted to v's dtype and device.
Tensor read_for(const h5::Group& g, const std::string& name, const Variable& v, const Layer& layer,
                const std::string& file_layer) {
  const h5::DatasetInfo info = g.info(name);
  const std::string who = "file '" + g.file_name() + "', layer '" + layer.name() + "' (" + layer.class_name() +
                          (file_layer != layer.name() ? ", '" + file_layer + "' in the file" : "") + "), variable '" +
                          v.name() + "' (" + g.path() + "/" + name + ")";
  MPT_CHECK(info.shape == v.shape(), who, ": expected shape ", to_string(v.shape()), ", found ", to_string(info.shape));
  MPT_CHECK(is_floating(info.dtype) == is_floating(v.dtype()), who, ": expected ", to_string(v.dtype()),
            " values, found ", to_string(info.dtype));
  Tensor t = g.read(name);
  if (t.dtype() != v.dtype()) t = t.to(v.dtype());
  return t.to(v.value().device());
}

void read_optimizer(const h5::File& f, const Model& model, PendingState& st, bool required) {
  const bool present = f.has_group("optimizer") && f.group("optimizer").has_group("vars");
  MPT_CHECK(present || !required || !model.compiled(), "file '", f.file_name(), "': the optimizer state is missing");
  if (!model.compiled() || !present) return;
  h5::Group og = f.group("optimizer");
  h5::Group vg = og.group("vars");
  const auto entries = model_optimizer_entries(model);
  const std::size_t found = vg.children().size();
  const std::string opt_name = model.optimizer().name();
  const auto file_name = vg.attr_string("name");
  if (found != entries.size() || (file_name && normalized(*file_name) != normalized(opt_name))) {
    MPT_CHECK(!required, "file '", f.file_name(), "': the optimizer state (", found, " variables",
              file_name ? " of '" + *file_name + "'" : std::string(), ") does not match optimizer '", opt_name,
              "' (", entries.size(), " variables)");
    // As Keras: a different optimizer's state is skipped with a warning, the weights still load.
    mpt::log(LogLevel::warning, "load_weights: skipping the optimizer state in '", f.file_name(), "': the model's optimizer '",
        opt_name, "' has ", entries.size(), " variables, the file's",
        (file_name ? " '" + *file_name + "'" : std::string()), " has ", found);
    return;
  }
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string key = std::to_string(i);
    const OptEntry& e = entries[i];
    const std::string who = vg.where(key);
    MPT_CHECK(vg.has_dataset(key), who, ": missing optimizer variable");
    const h5::DatasetInfo info = vg.info(key);
    MPT_CHECK(info.shape == e.shape, who, ": expected shape ", to_string(e.shape), ", found ", to_string(info.shape),
              e.kind == OptEntry::Slot ? " (slot '" + e.slot + "' of '" + e.var_path + "')" : std::string());
    Tensor t = vg.read(key);
    switch (e.kind) {
      case OptEntry::Iterations: {
        const double it = t.item();
        MPT_CHECK(it >= 0 && it < 9.0e15, who, ": bad iteration count ", it);
        st.iterations = static_cast<std::int64_t>(it);
        break;
      }
      case OptEntry::LearningRate: break;  // mpt keeps the rate in the optimizer's options
      case OptEntry::StepCounter: {
        const double s = t.item();
        MPT_CHECK(s >= 0 && s < 9.0e15, who, ": bad loss-scale step counter ", s);
        st.step_counter = static_cast<std::int64_t>(s);
        break;
      }
      case OptEntry::DynamicScale:
        st.loss_scale = t.item();
        MPT_CHECK(st.loss_scale > 0 && std::isfinite(st.loss_scale), who, ": bad loss scale ", st.loss_scale);
        st.has_loss_scale = true;
        break;
      case OptEntry::Slot:
        MPT_CHECK(is_floating(t.dtype()), who, ": optimizer slots must be floating-point");
        st.slots.emplace_back(e.var_path, e.slot, t.to(float32));
        break;
      case OptEntry::Derived: break;  // mpt derives it from the slots and the step count
    }
  }
  if (auto overflow = vg.attr_int("mpt_overflow_count")) {
    MPT_CHECK(*overflow >= 0 && *overflow < (1 << 30), vg.where(), ": bad mpt_overflow_count ", *overflow);
    st.overflow_count = static_cast<int>(*overflow);
  }
  st.has_optimizer = true;
}

}  // namespace

std::vector<std::string> object_paths(const std::vector<LayerRef>& layers) {
  std::map<std::string, int> used;
  std::vector<std::string> out;
  for (const auto& l : layers) {
    std::string cls = l->class_name();
    if (const auto gt = cls.rfind('>'); gt != std::string::npos) cls = cls.substr(gt + 1);  // "package>Class"
    std::string path = to_snake_case(cls);
    auto [it, fresh] = used.emplace(path, 0);
    if (!fresh) path.append(1, '_').append(std::to_string(++it->second));
    out.push_back(path);
  }
  return out;
}

namespace {

/// A layer's variables by the Keras 3 sub-object that holds them ("" for the layer's own), each
/// group's indices in variable order.
std::map<std::string, std::vector<std::size_t>> variable_groups(const Layer& layer) {
  std::map<std::string, std::vector<std::size_t>> groups;
  const std::size_t n = layer.variables().size();
  for (std::size_t i = 0; i < n; ++i) groups[layer.variable_group(i)].push_back(i);
  return groups;
}

/// The variables of `layers` from the group `lg` ("layers", or a nested model's
/// "layers/<model>/layers"); `top`: the model's own list, where mpt's older by-name keys are
/// still read.
void read_layers(const h5::File& f, const h5::Group& lg, const std::vector<LayerRef>& layers, PendingState& st,
                 bool top) {
  std::vector<std::string> file_layers = lg.children();
  std::vector<std::string> used;
  const auto paths = object_paths(layers);
  const std::string at = top ? std::string("layers") : lg.path();
  // Keras finds a layer's group by its object path; mpt files written before mpt followed
  // Keras there keyed it by layer name, which is read back when the paths are not all present.
  bool by_path = true, by_name = top;
  for (std::size_t i = 0; i < layers.size(); ++i)
    if (!layers[i]->variables().empty()) {
      by_path = by_path && lg.has_group(paths[i]);
      by_name = by_name && lg.has_group(layers[i]->name());
    }
  for (std::size_t li = 0; li < layers.size(); ++li) {
    const Layer* layer = layers[li].ptr().get();
    const auto vars = layer->variables();
    if (vars.empty()) continue;
    const std::string name = by_path || !by_name ? paths[li] : layer->name();
    MPT_CHECK(lg.has_group(name), "file '", f.file_name(), "': layer '", layer->name(), "' (", layer->class_name(),
              ", ", vars.size(), " variables) is not in the file: Keras keeps it at ", at, "/", name,
              " (its class and position among the model's layers); the file has layers: ", join(file_layers));
    h5::Group layer_group = lg.group(name);
    if (const auto inner = detail::nested_model(*layer)) {  // a model used as a layer: its own layers/
      MPT_CHECK(layer_group.has_group("layers"), layer_group.where("layers"), ": missing; layer '", layer->name(),
                "' is a model (", layer->class_name(), ") whose layers Keras keeps there");
      read_layers(f, layer_group.group("layers"), inner->layers(), st, false);
      used.push_back(name);
      continue;
    }
    for (const auto& [group, indices] : variable_groups(*layer)) {
      MPT_CHECK(group.empty() || layer_group.has_group(group), layer_group.where(group), ": missing; layer '", name,
                "' (", layer->class_name(), ") keeps ", indices.size(), " variables there");
      std::optional<h5::Group> sub;
      if (!group.empty()) sub.emplace(layer_group.group(group));
      const h5::Group& owner = sub ? *sub : layer_group;
      MPT_CHECK(owner.has_group("vars"), owner.where("vars"), ": missing; layer '", name, "' (", layer->class_name(),
                ") keeps ", indices.size(), " variables there");
      h5::Group vg = owner.group("vars");
      const std::size_t n = vg.children().size();
      MPT_CHECK(n == indices.size(), "file '", f.file_name(), "': layer '", name, "' (", layer->class_name(), ") has ",
                indices.size(), " variables in ", vg.path(), ", the file has ", n);
      for (std::size_t j = 0; j < indices.size(); ++j) {
        const std::string key = std::to_string(j);
        const Variable& v = vars[indices[j]];
        MPT_CHECK(vg.has_dataset(key), vg.where(key), ": missing variable ", j, " ('", v.name(), "') of layer '", name,
                  "'");
        st.weights.emplace_back(v, read_for(vg, key, v, *layer, "layers/" + name));
      }
    }
    used.push_back(name);
  }
  for (const auto& name : file_layers) {
    if (std::find(used.begin(), used.end(), name) != used.end() || !lg.has_group(name)) continue;
    h5::Group g = lg.group(name);
    const std::size_t n = g.has_group("vars") ? g.group("vars").children().size() : 0;
    MPT_CHECK(n == 0, "file '", f.file_name(), "': holds ", n, " variables at ", at, "/", name,
              ", which the model does not have (or has without variables); the model's layers: ", [&] {
                std::vector<std::string> names;
                for (std::size_t i = 0; i < layers.size(); ++i)
                  names.push_back(layers[i]->name() + " (" + at + "/" + paths[i] + ")");
                return join(names);
              }());
  }
}

PendingState read_keras3(const h5::File& f, const Model& model, OptimizerState optimizer) {
  PendingState st;
  read_layers(f, f.group("layers"), model.layers(), st, true);
  if (optimizer != OptimizerState::Ignore) read_optimizer(f, model, st, optimizer == OptimizerState::Required);
  return st;
}

PendingState read_legacy(const h5::File& f, const Model& model) {
  PendingState st;
  const h5::Group* root = &f;
  std::optional<h5::Group> nested;
  if (!f.has_attr("layer_names") && f.has_group("model_weights")) {  // a Keras full-model .h5
    nested.emplace(f.group("model_weights"));
    root = &*nested;
  }
  auto layer_names = root->attr_strings("layer_names");
  MPT_CHECK(layer_names.has_value(), "file '", f.file_name(),
            "': not a Keras weights file (neither a /layers group as Keras 3 writes nor a layer_names attribute "
            "as Keras 2 writes)");
  std::vector<std::string> file_layers;
  std::vector<std::vector<std::string>> file_weights;
  for (const auto& name : *layer_names) {
    MPT_CHECK(root->has_group(name), root->where(name), ": layer group listed in layer_names is missing");
    auto wn = root->group(name).attr_strings("weight_names").value_or(std::vector<std::string>{});
    if (wn.empty()) continue;
    file_layers.push_back(name);
    file_weights.push_back(wn);
  }
  std::vector<LayerRef> model_layers;
  std::vector<std::string> model_names;
  for (const auto& l : model.layers()) {
    MPT_CHECK(!detail::nested_model(*l), "file '", f.file_name(), "': a Keras 2 (legacy .h5) weights file; model '",
              model.name(), "' holds a model as a layer ('", l->name(), "'), which mpt reads from Keras 3's ",
              ".weights.h5 layout only");
    if (!l->variables().empty()) model_layers.push_back(l), model_names.push_back(l->name());
  }
  MPT_CHECK(file_layers.size() == model_layers.size(), "file '", f.file_name(), "': holds weights for ",
            file_layers.size(), " layers (", join(file_layers), "), the model has ", model_layers.size(),
            " layers with weights (", join(model_names), ")");
  for (std::size_t k = 0; k < model_layers.size(); ++k) {
    const Layer& layer = *model_layers[k];
    const auto vars = layer.variables();
    h5::Group g = root->group(file_layers[k]);
    MPT_CHECK(file_weights[k].size() == vars.size(), "file '", f.file_name(), "': layer '", file_layers[k],
              "' has ", file_weights[k].size(), " weights, the model's layer '", layer.name(), "' (",
              layer.class_name(), ") has ", vars.size());
    for (std::size_t i = 0; i < vars.size(); ++i) {
      MPT_CHECK(g.has_dataset(file_weights[k][i]), g.where(file_weights[k][i]),
                ": dataset listed in weight_names is missing");
      st.weights.emplace_back(vars[i], read_for(g, file_weights[k][i], vars[i], layer, file_layers[k]));
    }
  }
  return st;
}

}  // namespace

namespace {
/// parent/layers/<object path>/vars/<i> for each of `layers`; a model used as a layer gets its
/// own layers/ group inside its one (layers/functional/layers/dense/vars/0), as Keras writes it.
void write_layers(const h5::Group& parent, const std::vector<LayerRef>& layers, const SaveWeightsOptions& o) {
  {
    h5::Group lg = parent.create_group("layers");
    const auto paths = object_paths(layers);
    for (std::size_t li = 0; li < layers.size(); ++li) {
      const LayerRef& layer = layers[li];
      MPT_CHECK(!paths[li].empty(), "save_weights: layer class '", layer->class_name(),
                "' gives no Keras object path");
      h5::Group layer_group = lg.create_group(paths[li]);
      if (const auto inner = detail::nested_model(*layer)) {
        write_layers(layer_group, inner->layers(), o);
        layer_group.create_group("vars").set_attr("name", layer->name());
        continue;
      }
      const auto vars = layer->variables();
      auto groups = variable_groups(*layer);
      groups.try_emplace("");  // every layer has its own vars group, as Keras writes it
      for (const auto& [group, indices] : groups) {
        std::optional<h5::Group> sub;
        if (!group.empty()) sub.emplace(layer_group.create_group(group));
        h5::Group vg = (sub ? *sub : layer_group).create_group("vars");
        vg.set_attr("name", group.empty() ? layer->name() : group);
        for (std::size_t j = 0; j < indices.size(); ++j)
          vg.write(std::to_string(j), export_value(vars[indices[j]], o.dtype));
      }
    }
  }
}
}  // namespace

void write_keras3(const h5::Group& root, const Model& model, const SaveWeightsOptions& o) {
  write_layers(root, model.layers(), o);
  if (o.include_optimizer && !o.dtype && model.compiled()) {
    h5::Group og = root.create_group("optimizer");
    const auto entries = model_optimizer_entries(model);
    h5::Group vg = og.create_group("vars");
    vg.set_attr("name", model.optimizer().name());
    write_optimizer_entries(vg, entries, 0, model);
    if (auto* lso = model.loss_scale_optimizer()) {
      vg.set_attr_int("mpt_overflow_count", lso->overflow_count());  // mpt's hysteresis; Keras ignores it
      h5::Group ig = og.create_group("inner_optimizer").create_group("vars");
      ig.set_attr("name", lso->inner_optimizer().name());
      write_optimizer_entries(ig, entries, 4, model);
    }
  }
  root.create_group("vars").set_attr("name", model.name());
}

void write_legacy(const h5::Group& root, const Model& model, std::optional<DType> dtype) {
  std::vector<std::string> names;
  for (const auto& layer : model.layers()) {
    MPT_CHECK(!detail::nested_model(*layer), "save_weights: model '", model.name(), "' holds a model as a layer ('",
              layer->name(), "'); save it in Keras 3's layout (a .weights.h5 file name), not the legacy .h5");
    names.push_back(layer->name());
  }
  root.set_attr("layer_names", names, false);
  // The layout is TensorFlow's (kernels [in, out], channels-last); Keras 2 readers only convert
  // for backend "theano" or keras_version "1".
  root.set_attr("backend", "tensorflow", false);
  root.set_attr("keras_version", "2.15.0", false);
  root.set_attr("mpt_version", "0.1.0", false);
  auto layers = model.layers();
  std::sort(layers.begin(), layers.end(), [](const LayerRef& a, const LayerRef& b) { return a->name() < b->name(); });
  for (const auto& layer : layers) {
    MPT_CHECK(layer->name().find('/') == std::string::npos && !layer->name().empty(), "save_weights: layer name '",
              layer->name(), "' cannot be an HDF5 group name");
    h5::Group g = root.create_group(layer->name());
    const auto vars = layer->variables();
    if (vars.empty()) {
      g.set_empty_attr("weight_names");
      continue;
    }
    std::vector<std::string> weight_names;
    h5::Group inner = g.create_group(layer->name());
    for (const auto& v : vars) {
      weight_names.push_back(layer->name() + "/" + v.name() + ":0");
      inner.write(v.name() + ":0", export_value(v, dtype));
    }
    g.set_attr("weight_names", weight_names, false);
  }
}

PendingState read_weights(const h5::File& f, const Model& model, OptimizerState optimizer) {
  if (f.has_group("layers")) return read_keras3(f, model, optimizer);
  return read_legacy(f, model);
}

void PendingState::commit(Model& model) const {
  // The loss-scale state first: it is the one part still checked here (against the optimizer's
  // bounds), so a bad one leaves the model untouched.
  auto* lso = has_optimizer ? model.loss_scale_optimizer() : nullptr;
  if (lso && has_loss_scale) lso->set_state(loss_scale, step_counter, overflow_count);
  for (const auto& [v, t] : weights) v.assign(t);
  if (!has_optimizer) return;
  optimizers::Optimizer& opt = lso ? lso->inner_optimizer() : model.optimizer();
  opt.set_raw_iterations(iterations);  // Keras's _iterations: accumulation calls included
  for (const auto& [path, slot, t] : slots) opt.set_slot(path, slot, t);
}

}  // namespace io

void Model::save_weights(const std::string& filepath, SaveWeightsOptions o) const {
  MPT_CHECK(!o.dtype || is_floating(*o.dtype), "save_weights: dtype must be a floating-point type (float16, "
                                               "bfloat16, float32, float64), got ", to_string(*o.dtype));
  const bool keras3 = io::ends_with(filepath, ".weights.h5");
  MPT_CHECK(keras3 || io::ends_with(filepath, ".h5") || io::ends_with(filepath, ".hdf5"), "save_weights: '", filepath,
            "': the file name must end in .weights.h5 (Keras 3 layout) or .h5 / .hdf5 (legacy Keras 2 layout)");
  if (const auto* dp = distribution(); dp && dp->rank() != 0) return;  // rank 0 alone writes
  io::save_atomically(filepath, keras3 ? "keras3-weights" : "legacy-keras2-weights", [&](const std::string& tmp) {
    io::h5::File f = io::h5::File::create(tmp, io::kUserblockSize, filepath);
    if (keras3) io::write_keras3(f, *this, o);
    else io::write_legacy(f, *this, o.dtype);
    f.close();
  });
}

void Model::load_weights(const std::string& filepath) {
  try {
    MPT_CHECK(!variables().empty(), "model '", name_,
              "' has no variables yet; build it (model.build(shape)) or call it once before loading '", filepath, "'");
    std::vector<char> bytes = io::read_verified(filepath);
    io::PendingState st;
    io::parse_guarded(bytes, filepath, [&] {
      io::h5::File f = io::h5::File::open_image(bytes, filepath);
      st = io::read_weights(f, *this, io::OptimizerState::IfMatching);
    });
    st.commit(*this);
  } catch (const Error& e) {
    throw Error(std::string("load_weights: ") + e.what());
  }
}

}  // namespace mpt
