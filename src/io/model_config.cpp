// Architecture and compile settings as JSON for full checkpoints and .keras archives, in Keras 3's
// config layout (module / class_name / config; functional models as Keras's layers with
// inbound_nodes): Keras's load_model reads what mpt writes, and mpt reads the config.json Keras
// writes for Sequential and functional models.
#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <set>
#include <typeinfo>

#include "io/checkpoint_access.hpp"
#include "io/model_config.hpp"
#include "io/optimizer_io.hpp"
#include "losses/loss_utils.hpp"

namespace mpt::io {

namespace {

using Access = detail::CheckpointAccess;

Json policy_json(const mixed_precision::Policy& p) {
  return {{"module", "keras"}, {"class_name", "DTypePolicy"}, {"config", {{"name", p.name()}}}, {"registered_name", nullptr}};
}

mixed_precision::Policy policy_from(const Json& v, const std::string& where) {
  if (v.is_string()) return mixed_precision::Policy(v.get<std::string>());
  return mixed_precision::Policy(as_string(at(at(v, "config", where + ", dtype"), "name", where + ", dtype"), where + ", dtype"));
}

/// [null, d0, d1, ...] for a per-example shape.
Json shape_json(const Shape& per_example) {
  Json s = Json::array({nullptr});
  for (auto d : per_example) s.push_back(d);
  return s;
}

/// A batch shape [null, ...] back to the per-example shape; dimensions must be positive.
Shape per_example_shape(const Json& v, const std::string& w) {
  Shape s;
  for (const auto& d : as_array(v, w)) s.push_back(d.is_null() ? -1 : as_int(d, w));
  MPT_CHECK(!s.empty(), w, ": empty input shape");
  s.erase(s.begin());
  return s;
}

/// {"module": "keras.layers", "class_name", "config", "registered_name"} of one layer.
/// `keras_view`: for Keras's config.json (seeds cut to the 31 bits Keras's backends take).
Json layer_json(const Layer& l, bool keras_view) {
  if (const auto inner = detail::nested_model(l)) {
    // A model used as a layer: its own model config, named as the layer, as Keras nests it
    // (an uncompiled model's empty compile_config included).
    Json j = model_config_json(*inner, keras_view);
    j["config"]["name"] = l.name();
    j["config"]["trainable"] = l.trainable();
    j.erase("compile_config");
    if (keras_view) j["compile_config"] = Json::object();
    return j;
  }
  Json c = {{"name", l.name()}, {"trainable", l.trainable()}, {"dtype", policy_json(l.dtype_policy())}};
  const nlohmann::json own = l.config();
  MPT_CHECK(own.is_object() || own.is_null(), "save: layer '", l.name(), "' config() must be a JSON object, got ",
            own.type_name());
  if (own.is_object())
    for (const auto& [k, v] : own.items()) {
      MPT_CHECK(k != "name" && k != "trainable" && k != "dtype", "save: layer '", l.name(), "' config repeats '", k, "'");
      const auto call_keys = l.call_option_keys();
      if (keras_view && std::find(call_keys.begin(), call_keys.end(), k) != call_keys.end())
        continue;  // Keras takes it per call: the node's kwargs carry it (functional_config)
      if (keras_view && k == "seed" && v.is_number_integer())
        c[k] = as_uint(v, "save: layer '" + l.name() + "', seed") % 2147483648ull;
      else
        c[k] = Json(v);
      // An initializer's seed too (mpt/initializers.hpp).
      const nlohmann::json* module = find(v, "module");
      const nlohmann::json* init = keras_view && module && *module == "keras.initializers" ? find(v, "config") : nullptr;
      const nlohmann::json* seed = init ? find(*init, "seed") : nullptr;
      if (seed && seed->is_number_integer())
        c[k]["config"]["seed"] = as_uint(*seed, "save: layer '" + l.name() + "', " + k + ", seed") % 2147483648ull;
    }
  return {{"module", "keras.layers"}, {"class_name", l.class_name()}, {"config", c}, {"registered_name", nullptr}};
}

LayerConfig layer_config_from(const Json& v, const std::string& where) {
  LayerConfig c;
  c.class_name = as_string(at(v, "class_name", where), where + ", class_name");
  const std::string w = where + " (" + c.class_name + ")";
  const Json& cfg = at(v, "config", w);
  MPT_CHECK(cfg.is_object(), w, ": config must be an object");
  c.name = as_string(at(cfg, "name", w), w + ", name");
  if (const Json* t = find(cfg, "trainable")) c.trainable = as_bool(*t, w + ", trainable");
  if (const Json* d = find(cfg, "dtype"); d && !d->is_null()) c.dtype = policy_from(*d, w);
  for (const auto& [k, val] : cfg.items()) {
    if (k == "name" || k == "trainable" || k == "dtype") continue;
    // Initializer objects as saved: the factory reads them (LayerConfig::get_initializer).
    c.config[k] = nlohmann::json(val);
  }
  return c;
}

void check_loss_is_builtin(const losses::Loss& loss) {
  const auto& t = typeid(loss);
  MPT_CHECK(t == typeid(losses::SparseCategoricalCrossentropy) || t == typeid(losses::CategoricalCrossentropy) ||
                t == typeid(losses::BinaryCrossentropy) || t == typeid(losses::MeanSquaredError) ||
                t == typeid(losses::MeanAbsoluteError) || t == typeid(losses::Huber) ||
                t == typeid(losses::KLDivergence) || t == typeid(losses::LogCosh) ||
                t == typeid(losses::CosineSimilarity) || t == typeid(losses::Hinge) ||
                t == typeid(losses::SquaredHinge) || t == typeid(losses::CategoricalHinge) ||
                t == typeid(losses::Poisson) || t == typeid(losses::MeanAbsolutePercentageError) ||
                t == typeid(losses::MeanSquaredLogarithmicError),
            "save: loss '", loss.name(), "' is not a built-in loss that load_model can rebuild; use save_weights");
}

Json loss_json(const losses::Loss& loss) {
  check_loss_is_builtin(loss);
  const losses::CrossentropyOptions* o = nullptr;
  if (auto* l = dynamic_cast<const losses::SparseCategoricalCrossentropy*>(&loss)) o = &l->options();
  if (auto* l = dynamic_cast<const losses::CategoricalCrossentropy*>(&loss)) o = &l->options();
  if (auto* l = dynamic_cast<const losses::BinaryCrossentropy*>(&loss)) o = &l->options();
  Json c = Json::object();
  if (o) c["from_logits"] = o->from_logits, c["label_smoothing"] = o->label_smoothing;
  if (o && o->ignore_class) c["ignore_class"] = *o->ignore_class;
  if (auto* l = dynamic_cast<const losses::Huber*>(&loss)) c["delta"] = l->delta();
  if (auto* l = dynamic_cast<const losses::CosineSimilarity*>(&loss)) c["axis"] = l->axis();
  if (loss.reduction() != losses::Reduction::sum_over_batch_size) c["reduction"] = losses::to_string(loss.reduction());
  return {{"name", loss.name()}, {"config", c}};
}

std::shared_ptr<losses::Loss> loss_from(const Json& v, const std::string& w) {
  if (v.is_string()) return losses::get(v.get<std::string>());  // Keras's compile_config: a name...
  const Json* n = find(v, "name");                               // ... or {"class_name": ..., "config": ...}
  const std::string name = n ? as_string(*n, w + ", loss") : to_snake_case(as_string(at(v, "class_name", w), w + ", loss"));
  const Json& c = at(v, "config", w);
  const Json inert = {{"axis", -1}};
  const std::string who = w + ", loss " + name;
  if (name == "sparse_categorical_crossentropy")
    check_fields(c, {"name", "reduction", "from_logits", "ignore_class", "label_smoothing"}, inert, who);
  else if (name == "categorical_crossentropy" || name == "binary_crossentropy")
    check_fields(c, {"name", "reduction", "from_logits", "label_smoothing"}, inert, who);
  else if (name == "huber" || name == "huber_loss")  // Keras's class name, or mpt's (Keras's default name)
    check_fields(c, {"name", "reduction", "delta"}, inert, who);
  else if (name == "cosine_similarity")
    check_fields(c, {"name", "reduction", "axis"}, Json::object(), who);
  else check_fields(c, {"name", "reduction"}, inert, who);
  // Keras's reduction (null: none, as Keras's standardize_reduction takes it).
  const Json* red = find(c, "reduction");
  const losses::Reduction reduction =
      !red ? losses::Reduction::sum_over_batch_size
      : red->is_null()
          ? losses::Reduction::none
          : losses::detail::named_errors(who, [&] { return losses::reduction_from_string(as_string(*red, who + ", reduction")); });
  auto with_reduction = [&](std::shared_ptr<losses::Loss> l) {
    l->set_reduction(reduction);
    return l;
  };
  if (name == "huber" || name == "huber_loss") {
    const Json* d = find(c, "delta");
    return with_reduction(std::make_shared<losses::Huber>(d && !d->is_null() ? as_double(*d, who + ", delta") : 1.0));
  }
  if (name == "cosine_similarity") {
    const Json* a = find(c, "axis");
    if (a && a->is_array() && a->size() == 1) a = &(*a)[0];  // [1] as Keras's ops take it
    return with_reduction(std::make_shared<losses::CosineSimilarity>(a && !a->is_null() ? as_int(*a, who + ", axis") : -1));
  }
  losses::CrossentropyOptions o;
  if (const Json* f = find(c, "from_logits")) o.from_logits = as_bool(*f, w + ", from_logits");
  if (const Json* s = find(c, "label_smoothing")) o.label_smoothing = as_double(*s, w + ", label_smoothing");
  if (const Json* i = find(c, "ignore_class"); i && !i->is_null()) {
    MPT_CHECK(i->is_number_integer(), w, ", ignore_class: expected an integer or null, got ", i->dump());
    o.ignore_class = i->get<std::int64_t>();
  }
  if (name == "sparse_categorical_crossentropy") return with_reduction(std::make_shared<losses::SparseCategoricalCrossentropy>(o));
  if (name == "categorical_crossentropy") return with_reduction(std::make_shared<losses::CategoricalCrossentropy>(o));
  if (name == "binary_crossentropy") return with_reduction(std::make_shared<losses::BinaryCrossentropy>(o));
  return with_reduction(losses::get(name));
}

// ---- metrics in compile_config ----------------------------------------------------------------

Json nullable(const std::optional<std::int64_t>& v) { return v ? Json(*v) : Json(nullptr); }

/// The class name and Keras config (name, dtype and its arguments) of a built-in metric; none
/// for another class (a metric of the user's). keras_view: Keras's fields only (mpt's
/// SparseCategoricalAccuracy ignore_class, which Keras's has not, is refused).
std::optional<std::pair<std::string, Json>> metric_config(const metrics::Metric& m, bool keras_view) {
  using namespace metrics;
  Json c = {{"name", m.name()}, {"dtype", "float32"}};
  const auto& t = typeid(m);
  if (t == typeid(SparseCategoricalAccuracy)) {
    const auto& ic = static_cast<const SparseCategoricalAccuracy&>(m).ignore_class();
    MPT_CHECK(!ic || !keras_view, "save: metric '", m.name(), "': SparseCategoricalAccuracy with ignore_class ",
              *ic, " has no Keras equivalent (Keras's has no ignore_class); compile with \"accuracy\", which takes ",
              "the SparseCategoricalCrossentropy loss's ignore_class, or save as .h5");
    if (ic) c["ignore_class"] = *ic;
    return std::pair{std::string("SparseCategoricalAccuracy"), c};
  }
  if (t == typeid(CategoricalAccuracy)) return std::pair{std::string("CategoricalAccuracy"), c};
  if (t == typeid(BinaryAccuracy)) {
    c["threshold"] = static_cast<const BinaryAccuracy&>(m).threshold();
    return std::pair{std::string("BinaryAccuracy"), c};
  }
  if (t == typeid(metrics::MeanAbsoluteError)) return std::pair{std::string("MeanAbsoluteError"), c};
  if (t == typeid(metrics::MeanSquaredError)) return std::pair{std::string("MeanSquaredError"), c};
  if (t == typeid(RootMeanSquaredError)) return std::pair{std::string("RootMeanSquaredError"), c};
  if (t == typeid(metrics::Hinge)) return std::pair{std::string("Hinge"), c};
  if (t == typeid(metrics::SquaredHinge)) return std::pair{std::string("SquaredHinge"), c};
  if (t == typeid(metrics::CategoricalHinge)) return std::pair{std::string("CategoricalHinge"), c};
  if (t == typeid(metrics::Poisson)) return std::pair{std::string("Poisson"), c};
  if (t == typeid(metrics::MeanAbsolutePercentageError)) return std::pair{std::string("MeanAbsolutePercentageError"), c};
  if (t == typeid(metrics::MeanSquaredLogarithmicError)) return std::pair{std::string("MeanSquaredLogarithmicError"), c};
  if (t == typeid(metrics::KLDivergence)) return std::pair{std::string("KLDivergence"), c};
  if (t == typeid(metrics::LogCoshError)) return std::pair{std::string("LogCoshError"), c};
  if (t == typeid(metrics::CosineSimilarity)) {  // axis too, which Keras's get_config leaves out (its __init__ takes it)
    c["axis"] = static_cast<const metrics::CosineSimilarity&>(m).axis();
    return std::pair{std::string("CosineSimilarity"), c};
  }
  const losses::CrossentropyOptions* ce = nullptr;
  std::string ce_class;
  if (t == typeid(metrics::BinaryCrossentropy))
    ce = &static_cast<const metrics::BinaryCrossentropy&>(m).options(), ce_class = "BinaryCrossentropy";
  if (t == typeid(metrics::CategoricalCrossentropy))
    ce = &static_cast<const metrics::CategoricalCrossentropy&>(m).options(), ce_class = "CategoricalCrossentropy";
  if (t == typeid(metrics::SparseCategoricalCrossentropy))
    ce = &static_cast<const metrics::SparseCategoricalCrossentropy&>(m).options(), ce_class = "SparseCategoricalCrossentropy";
  if (ce) {
    c["from_logits"] = ce->from_logits;
    if (ce_class == "SparseCategoricalCrossentropy") c["ignore_class"] = nullptr;
    else c["label_smoothing"] = ce->label_smoothing;
    if (ce_class != "BinaryCrossentropy") c["axis"] = -1;
    return std::pair{ce_class, c};
  }
  if (t == typeid(TopKCategoricalAccuracy)) {
    c["k"] = static_cast<const TopKCategoricalAccuracy&>(m).k();
    return std::pair{std::string("TopKCategoricalAccuracy"), c};
  }
  if (t == typeid(SparseTopKCategoricalAccuracy)) {
    const auto& s = static_cast<const SparseTopKCategoricalAccuracy&>(m);
    c["k"] = s.k();
    if (s.from_sorted_ids()) c["from_sorted_ids"] = true;  // Keras writes it only when set
    return std::pair{std::string("SparseTopKCategoricalAccuracy"), c};
  }
  if (t == typeid(Precision) || t == typeid(Recall)) {
    const auto& o = static_cast<const ConfusionMetric&>(m).options();
    c["thresholds"] = !o.thresholds ? Json(nullptr) : o.thresholds->size() == 1 ? Json(o.thresholds->front()) : Json(*o.thresholds);
    c["top_k"] = nullable(o.top_k);
    c["class_id"] = nullable(o.class_id);
    return std::pair{std::string(t == typeid(Precision) ? "Precision" : "Recall"), c};
  }
  if (t == typeid(AUC)) {
    const auto& o = static_cast<const AUC&>(m).options();
    c["num_thresholds"] = o.num_thresholds;
    c["curve"] = o.curve;
    c["summation_method"] = o.summation_method;
    c["multi_label"] = o.multi_label;
    c["num_labels"] = nullable(o.num_labels);
    c["label_weights"] = o.label_weights ? Json(*o.label_weights) : Json(nullptr);
    c["from_logits"] = o.from_logits;
    if (o.thresholds) c["thresholds"] = *o.thresholds;
    return std::pair{std::string("AUC"), c};
  }
  if (t == typeid(F1Score)) {
    const auto& o = static_cast<const F1Score&>(m).options();
    c["average"] = o.average ? Json(*o.average) : Json(nullptr);
    c["threshold"] = o.threshold ? Json(*o.threshold) : Json(nullptr);
    return std::pair{std::string("F1Score"), c};
  }
  return std::nullopt;
}

/// One entry of compile's metric list as Keras's compile_config holds it: a name stays a name; a
/// built-in metric object is written as its name where metrics::get rebuilds the same metric
/// from it (class and arguments), else as Keras's serialized object, its arguments kept. A metric
/// class of the user's is refused.
Json metric_json(const metrics::MetricArg& a, bool keras_view) {
  if (!a.object()) return a.name();
  const metrics::Metric& m = *a.object();
  auto mine = metric_config(m, keras_view);
  MPT_CHECK(mine, "save: metric '", m.name(), "' is not a built-in metric (a metric class of your own), which ",
            "load_model cannot rebuild; compile with a built-in metric (e.g. \"accuracy\", \"mae\", ",
            "metrics::AUC) or use save_weights");
  std::shared_ptr<metrics::Metric> by_name;
  try {
    by_name = metrics::get(m.name());
  } catch (const Error&) {
  }
  const metrics::Metric* r = by_name.get();
  if (r && typeid(*r) == typeid(m)) {
    auto theirs = metric_config(*r, false);
    auto same = metric_config(m, false);
    if (theirs && same && theirs->second == same->second) return m.name();
  }
  return {{"module", "keras.metrics"}, {"class_name", mine->first}, {"config", mine->second}, {"registered_name", nullptr}};
}

/// A compile metric list (compile's `metrics`; weighted_metrics the same way) for compile_config.
Json metrics_json(const std::vector<metrics::MetricArg>& list, bool keras_view) {
  Json out = Json::array();
  for (const auto& a : list) out.push_back(metric_json(a, keras_view));
  return out;
}

Json metric_names(const Model& m, bool keras_view) { return metrics_json(Access::metric_args(m), keras_view); }
/// compile's weighted_metrics: null when there are none (Keras writes null for the default).
Json weighted_metric_names(const Model& m, bool keras_view) {
  const auto& list = Access::weighted_metric_args(m);
  return list.empty() ? Json(nullptr) : metrics_json(list, keras_view);
}

/// A metric entry of a compile_config: a name (compile resolves it, "accuracy" by the loss), a
/// Keras metric function by name ({"class_name": "function", "config": name}) whose mpt metric
/// computes the same, or a serialized metric object of a class mpt has, each field honoured or
/// refused naming it (an mpt::Error naming the metric and the field).
metrics::MetricArg metric_from_json(const Json& v, const std::string& where) {
  using namespace metrics;
  if (v.is_string()) return v.get<std::string>();
  const std::string cls = as_string(at(v, "class_name", where), where + ", class_name");
  if (cls == "function") {  // a metric function: compile wraps it in a mean, named after it
    const std::string fn = as_string(at(v, "config", where), where + ", config");
    static const std::set<std::string> same = {
        "sparse_categorical_accuracy", "categorical_accuracy", "binary_accuracy", "mean_absolute_error",
        "mean_squared_error", "top_k_categorical_accuracy", "sparse_top_k_categorical_accuracy", "hinge",
        "squared_hinge", "categorical_hinge", "poisson", "mean_absolute_percentage_error",
        "mean_squared_logarithmic_error", "kl_divergence", "binary_crossentropy", "categorical_crossentropy",
        "sparse_categorical_crossentropy"};
    MPT_CHECK(same.count(fn), where, ": metric function '", fn, "' is not supported by mpt (supported: ",
              "sparse_categorical_accuracy, categorical_accuracy, binary_accuracy, mean_absolute_error, ",
              "mean_squared_error, top_k_categorical_accuracy, sparse_top_k_categorical_accuracy, hinge, ",
              "squared_hinge, categorical_hinge, poisson, mean_absolute_percentage_error, ",
              "mean_squared_logarithmic_error, kl_divergence, binary_crossentropy, categorical_crossentropy, ",
              "sparse_categorical_crossentropy)");
    return fn;
  }
  const Json& c = at(v, "config", where);
  const Json* n = find(c, "name");
  const std::string name = n && !n->is_null() ? as_string(*n, where + ", name") : to_snake_case(cls);
  const std::string who = where + ", metric " + cls + " '" + name + "'";
  if (const Json* d = find(c, "dtype"); d && !d->is_null()) {
    const Json& dt = d->is_object() ? at(at(*d, "config", who), "name", who) : *d;
    const std::string dtype = as_string(dt, who + ", dtype");
    MPT_CHECK(dtype == "float32" || dtype == "float64", who, ": field dtype = ", d->dump(),
              " is not supported by mpt (metrics compute in float32 and accumulate in float64)");
  }
  auto fields = [&](std::vector<std::string_view> honoured) {
    honoured.push_back("name");
    honoured.push_back("dtype");
    check_fields(c, honoured, Json::object(), who);
  };
  auto opt_int = [&](const char* key) -> std::optional<std::int64_t> {
    const Json* f = find(c, key);
    if (!f || f->is_null()) return std::nullopt;
    return as_int(*f, who + ", " + key);
  };
  auto opt_doubles = [&](const char* key) -> std::optional<std::vector<double>> {
    const Json* f = find(c, key);
    if (!f || f->is_null()) return std::nullopt;
    std::vector<double> out;
    if (f->is_number()) return std::vector<double>{as_double(*f, who + ", " + key)};
    const Json* values = f;  // Keras serializes an array argument as {"class_name": "__tensor__", ...}
    if (f->is_object() && as_string(at(*f, "class_name", who + ", " + key), who + ", " + key) == "__tensor__")
      values = &at(at(*f, "config", who + ", " + key), "value", who + ", " + key);
    for (const auto& x : as_array(*values, who + ", " + key)) out.push_back(as_double(x, who + ", " + key));
    return out;
  };
  auto flag = [&](const char* key, bool fallback) {
    const Json* f = find(c, key);
    return f && !f->is_null() ? as_bool(*f, who + ", " + key) : fallback;
  };
  return losses::detail::named_errors(who, [&]() -> MetricArg {
    if (cls == "SparseCategoricalAccuracy") {
      fields({"ignore_class"});
      return SparseCategoricalAccuracy(name, opt_int("ignore_class"));
    }
    if (cls == "CategoricalAccuracy") return fields({}), CategoricalAccuracy(name);
    if (cls == "MeanAbsoluteError") return fields({}), metrics::MeanAbsoluteError(name);
    if (cls == "MeanSquaredError") return fields({}), metrics::MeanSquaredError(name);
    if (cls == "RootMeanSquaredError") return fields({}), RootMeanSquaredError(name);
    if (cls == "Hinge") return fields({}), metrics::Hinge(name);
    if (cls == "SquaredHinge") return fields({}), metrics::SquaredHinge(name);
    if (cls == "CategoricalHinge") return fields({}), metrics::CategoricalHinge(name);
    if (cls == "Poisson") return fields({}), metrics::Poisson(name);
    if (cls == "MeanAbsolutePercentageError") return fields({}), metrics::MeanAbsolutePercentageError(name);
    if (cls == "MeanSquaredLogarithmicError") return fields({}), metrics::MeanSquaredLogarithmicError(name);
    if (cls == "KLDivergence") return fields({}), metrics::KLDivergence(name);
    if (cls == "LogCoshError") return fields({}), metrics::LogCoshError(name);
    if (cls == "CosineSimilarity") return fields({"axis"}), metrics::CosineSimilarity(name, opt_int("axis").value_or(-1));
    if (cls == "BinaryCrossentropy" || cls == "CategoricalCrossentropy" || cls == "SparseCategoricalCrossentropy") {
      const bool sparse = cls == "SparseCategoricalCrossentropy";
      fields(sparse ? std::vector<std::string_view>{"from_logits", "axis"}
                    : std::vector<std::string_view>{"from_logits", "label_smoothing", "axis"});
      MPT_CHECK(opt_int("axis").value_or(-1) == -1, "field axis = ", opt_int("axis").value_or(-1),
                " is not supported by mpt (only -1: the classes on the last axis)");
      losses::CrossentropyOptions o;
      o.from_logits = flag("from_logits", false);
      if (const Json* f = find(c, "label_smoothing"); f && !f->is_null()) o.label_smoothing = as_double(*f, who + ", label_smoothing");
      if (cls == "BinaryCrossentropy") return metrics::BinaryCrossentropy(name, o);
      if (cls == "CategoricalCrossentropy") return metrics::CategoricalCrossentropy(name, o);
      return metrics::SparseCategoricalCrossentropy(name, o);
    }
    if (cls == "BinaryAccuracy") {
      fields({"threshold"});
      const Json* t = find(c, "threshold");
      return BinaryAccuracy(name, t && !t->is_null() ? as_double(*t, who + ", threshold") : 0.5);
    }
    if (cls == "TopKCategoricalAccuracy") {
      fields({"k"});
      return TopKCategoricalAccuracy(opt_int("k").value_or(5), name);
    }
    if (cls == "SparseTopKCategoricalAccuracy") {
      fields({"k", "from_sorted_ids"});
      return SparseTopKCategoricalAccuracy(opt_int("k").value_or(5), name, flag("from_sorted_ids", false));
    }
    if (cls == "Precision" || cls == "Recall") {
      fields({"thresholds", "top_k", "class_id"});
      PrecisionRecallOptions o{.thresholds = opt_doubles("thresholds"), .top_k = opt_int("top_k"),
                               .class_id = opt_int("class_id"), .name = name};
      if (cls == "Precision") return Precision(o);
      return Recall(o);
    }
    if (cls == "AUC") {
      fields({"num_thresholds", "curve", "summation_method", "multi_label", "num_labels", "label_weights",
              "from_logits", "thresholds"});
      AUCOptions o{.name = name};
      if (auto k = opt_int("num_thresholds")) o.num_thresholds = *k;
      if (const Json* f = find(c, "curve"); f && !f->is_null()) o.curve = as_string(*f, who + ", curve");
      if (const Json* f = find(c, "summation_method"); f && !f->is_null())
        o.summation_method = as_string(*f, who + ", summation_method");
      o.thresholds = opt_doubles("thresholds");
      o.multi_label = flag("multi_label", false);
      o.num_labels = opt_int("num_labels");
      o.label_weights = opt_doubles("label_weights");
      o.from_logits = flag("from_logits", false);
      return AUC(o);
    }
    if (cls == "F1Score") {
      fields({"average", "threshold"});
      F1ScoreOptions o{.name = name};
      if (const Json* f = find(c, "average"); f && !f->is_null()) o.average = as_string(*f, who + ", average");
      if (const Json* f = find(c, "threshold"); f && !f->is_null()) o.threshold = as_double(*f, who + ", threshold");
      return F1Score(o);
    }
    fail("unknown metric class '", cls, "' (mpt has SparseCategoricalAccuracy, CategoricalAccuracy, BinaryAccuracy, ",
         "MeanAbsoluteError, MeanSquaredError, RootMeanSquaredError, TopKCategoricalAccuracy, ",
         "SparseTopKCategoricalAccuracy, Precision, Recall, AUC, F1Score, Hinge, SquaredHinge, CategoricalHinge, ",
         "Poisson, MeanAbsolutePercentageError, MeanSquaredLogarithmicError, KLDivergence, LogCoshError, ",
         "CosineSimilarity, BinaryCrossentropy, CategoricalCrossentropy, SparseCategoricalCrossentropy)");
  });
}

/// compile_config's metric list (`metrics`, and `weighted_metrics` the same way): null or absent
/// gives none.
std::vector<metrics::MetricArg> metrics_from_json(const Json* list, const std::string& where) {
  std::vector<metrics::MetricArg> out;
  if (!list || list->is_null()) return out;
  const Json& a = as_array(*list, where);
  for (std::size_t i = 0; i < a.size(); ++i) out.push_back(metric_from_json(a[i], where + " " + std::to_string(i)));
  return out;
}

namespace {
/// One loss as Keras's compile_config holds it: a name, or Keras's serialized Loss object where
/// the loss has arguments (or a name keras.losses.get does not know).
Json keras_loss_value(const losses::Loss& loss) {
  check_loss_is_builtin(loss);
  Json loss_value = loss.name();
  const losses::CrossentropyOptions* o = nullptr;
  std::string cls;
  if (auto* l = dynamic_cast<const losses::SparseCategoricalCrossentropy*>(&loss)) o = &l->options(), cls = "SparseCategoricalCrossentropy";
  if (auto* l = dynamic_cast<const losses::CategoricalCrossentropy*>(&loss)) o = &l->options(), cls = "CategoricalCrossentropy";
  if (auto* l = dynamic_cast<const losses::BinaryCrossentropy*>(&loss)) o = &l->options(), cls = "BinaryCrossentropy";
  // Another reduction than Keras's default needs the loss as an object (a name takes the default).
  const bool reduced = loss.reduction() != losses::Reduction::sum_over_batch_size;
  if (o && (o->from_logits || o->label_smoothing != 0 || o->ignore_class || reduced)) {
    Json c = {{"from_logits", o->from_logits}};
    if (cls != "SparseCategoricalCrossentropy") c["label_smoothing"] = o->label_smoothing;
    else c["ignore_class"] = o->ignore_class ? Json(*o->ignore_class) : Json(nullptr);
    if (reduced) c["reduction"] = losses::to_string(loss.reduction());
    loss_value = {{"module", "keras.losses"}, {"class_name", cls}, {"config", c}, {"registered_name", nullptr}};
  }
  // Huber, KLDivergence, LogCosh and CosineSimilarity as Keras's Loss objects: their names
  // ("huber_loss", ...) are not all keras.losses.get names. delta and axis are written although
  // Keras's own get_config leaves them out: its from_config takes them. MeanSquaredError and
  // MeanAbsoluteError too where they reduce otherwise than by the mean.
  Json c = {{"name", loss.name()}, {"reduction", losses::to_string(loss.reduction())}};
  if (reduced) {
    const auto& t = typeid(loss);
    if (t == typeid(losses::MeanSquaredError)) cls = "MeanSquaredError";
    if (t == typeid(losses::MeanAbsoluteError)) cls = "MeanAbsoluteError";
    if (t == typeid(losses::Hinge)) cls = "Hinge";
    if (t == typeid(losses::SquaredHinge)) cls = "SquaredHinge";
    if (t == typeid(losses::CategoricalHinge)) cls = "CategoricalHinge";
    if (t == typeid(losses::Poisson)) cls = "Poisson";
    if (t == typeid(losses::MeanAbsolutePercentageError)) cls = "MeanAbsolutePercentageError";
    if (t == typeid(losses::MeanSquaredLogarithmicError)) cls = "MeanSquaredLogarithmicError";
  }
  if (auto* l = dynamic_cast<const losses::Huber*>(&loss)) cls = "Huber", c["delta"] = l->delta();
  if (dynamic_cast<const losses::KLDivergence*>(&loss)) cls = "KLDivergence";
  if (dynamic_cast<const losses::LogCosh*>(&loss)) cls = "LogCosh";
  if (auto* l = dynamic_cast<const losses::CosineSimilarity*>(&loss)) cls = "CosineSimilarity", c["axis"] = l->axis();
  if (!o && !cls.empty())
    loss_value = {{"module", "keras.losses"}, {"class_name", cls}, {"config", c}, {"registered_name", nullptr}};
  return loss_value;
}

/// The per-output part of a compile_config (Keras's loss=[...], loss_weights=[...],
/// metrics=[[...], [...]], weighted_metrics likewise, in output order): loss_of writes one loss,
/// the metric lists are written by metrics_json. One output: compile's own lists, flat.
Json compile_config_of(const Model& m, bool keras_view, const std::function<Json(const losses::Loss&)>& loss_of) {
  const auto& ls = Access::losses(m);
  if (ls.size() == 1)
    return {{"loss", loss_of(*ls[0])}, {"loss_weights", nullptr}, {"metrics", metric_names(m, keras_view)},
            {"weighted_metrics", weighted_metric_names(m, keras_view)}};
  Json loss = Json::array();
  for (const auto& l : ls) loss.push_back(loss_of(*l));
  const auto& w = Access::loss_weights(m);
  const bool weighted = std::any_of(w.begin(), w.end(), [](double x) { return x != 1.0; });
  auto per_output = [&](const std::vector<std::vector<metrics::MetricArg>>& lists) {
    Json out = Json::array();
    bool any = false;
    for (const auto& l : lists) out.push_back(metrics_json(l, keras_view)), any = any || !l.empty();
    return any ? out : Json(nullptr);  // Keras writes null for none
  };
  return {{"loss", loss},
          {"loss_weights", weighted ? Json(w) : Json(nullptr)},
          {"metrics", per_output(Access::output_metric_args(m))},
          {"weighted_metrics", per_output(Access::output_weighted_metric_args(m))}};
}
}  // namespace

/// Keras's compile_config (Keras names only), for config.json.
Json keras_compile_config(const Model& m) {
  Json c = compile_config_of(m, true, keras_loss_value);
  c["optimizer"] = io::optimizer_to_json(m.optimizer(), true);
  c["run_eagerly"] = false;
  c["steps_per_execution"] = 1;
  c["jit_compile"] = false;
  return c;
}

Json sequential_config(const Sequential& s, bool keras_view) {
  const Model& m = s;
  Shape in = s.input_shape();
  auto ls = s.layers();
  if (in.empty() && !ls.empty() && !ls[0]->input_shape().empty())
    in = Shape(ls[0]->input_shape().begin() + 1, ls[0]->input_shape().end());
  MPT_CHECK(!in.empty(), "save: Sequential '", m.name(), "' is not built; build it or call it once first");
  Json layers = Json::array();
  layers.push_back({{"module", "keras.layers"},
                    {"class_name", "InputLayer"},
                    {"config", {{"batch_shape", shape_json(in)}, {"dtype", "float32"}, {"name", "input_layer"}}},
                    {"registered_name", nullptr}});
  for (const auto& l : ls) {
    MPT_CHECK(!keras_view || l->call_argument_names().empty(), "save: Sequential '", m.name(), "': ",
              l->class_name(), " '", l->name(), "' takes several call arguments in Keras, which a Keras Sequential ",
              "cannot pass; build the model with the functional API to save it as .keras");
    Json j = layer_json(*l, keras_view);
    if (!l->input_shape().empty() && !j.contains("build_config"))  // a nested model writes its own
      j["build_config"] = {{"input_shape", shape_json(Shape(l->input_shape().begin() + 1, l->input_shape().end()))}};
    layers.push_back(std::move(j));
  }
  Json c = {{"name", m.name()}, {"trainable", m.trainable()}, {"dtype", policy_json(m.dtype_policy())}, {"layers", layers},
            {"build_input_shape", shape_json(in)}};
  Json out = {{"module", "keras"}, {"class_name", "Sequential"}, {"config", c}};
  if (keras_view) {
    out["registered_name"] = nullptr;
    out["build_config"] = {{"input_shape", shape_json(in)}};
    if (m.compiled()) out["compile_config"] = keras_compile_config(m);
  }
  return out;
}

/// Keras 3's functional config: every layer with its inbound_nodes (each call's arguments as
/// __keras_tensor__ entries whose keras_history is [layer, node index, tensor index]), InputLayers
/// included, then input_layers and output_layers as [name, node index, 0] (a list of them when
/// there are several).
/// A functional model's InputLayer entry, as Keras writes it.
Json input_layer_json(const Shape& per_example_shape, DType dtype, const std::string& name) {
  return {{"module", "keras.layers"},
          {"class_name", "InputLayer"},
          {"config",
           {{"batch_shape", shape_json(per_example_shape)},
            {"dtype", to_string(dtype)},
            {"sparse", false},
            {"ragged", false},
            {"name", name},
            {"optional", false}}},
          {"registered_name", nullptr},
          {"name", name},
          {"inbound_nodes", Json::array()}};
}

/// One functional call as Keras records it: its positional args, its kwargs and the layer's
/// build_config. One input is passed as itself, several as one list (merge layers); layers with
/// named call arguments (MultiHeadAttention) pass their leading inputs positionally, the rest
/// by keyword, build from {"shapes_dict": {"<name>_shape": ...}} (masks excluded, as Keras's
/// build signatures take none), and carry their call_option_keys() as kwargs.
struct NodeJson {
  Json args, kwargs, build_config;
};
NodeJson node_json(const Layer& l, const std::vector<KerasTensor>& inputs, const Json& args, const Json& shapes) {
  const auto names = l.call_argument_names();
  NodeJson out{Json::array(), Json::object(), Json::object()};
  if (names.empty()) {
    out.args = inputs.size() == 1 ? Json::array({args[0]}) : Json::array({args});
    out.build_config = {{"input_shape", inputs.size() == 1 ? shapes[0] : shapes}};
  } else {
    std::vector<DType> dtypes;
    for (const auto& in : inputs) dtypes.push_back(in.dtype());
    const auto of = l.call_arguments_of(dtypes);
    MPT_CHECK(of.size() == inputs.size(), "save: layer '", l.name(), "' names ", of.size(), " of its ", inputs.size(),
              " inputs");
    Json shapes_dict = Json::object();
    bool positional = true;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      positional = positional && i < names.size() && of[i] == names[i];
      if (positional) out.args.push_back(args[i]);
      else out.kwargs[of[i]] = args[i];
      if (of[i].find("mask") == std::string::npos) shapes_dict[of[i] + "_shape"] = shapes[i];
    }
    out.build_config = {{"shapes_dict", shapes_dict}};
  }
  const Json config = l.config();
  for (const auto& k : l.call_option_keys())
    if (config.is_object() && config.contains(k)) out.kwargs[k] = config[k];
  return out;
}

Json functional_config(const Model& m, bool keras_view) {
  const auto& nodes = Access::nodes(m);
  const auto& inputs = Access::inputs(m);
  const auto ls = m.layers();
  std::set<std::string> used;
  for (const auto& l : ls) used.insert(l->name());
  // Where each symbolic tensor comes from: (layer name, node index).
  std::map<const FunctionalNode*, std::pair<std::string, std::size_t>> history;
  Json layers = Json::array();
  for (const auto& in : inputs) {
    const FunctionalNode& n = *in.node();
    if (history.count(&n)) continue;
    std::string name = n.input_name;  // Input names must be unique among the layers, as in Keras
    for (int i = 1; used.count(name); ++i) name = n.input_name + "_" + std::to_string(i);
    used.insert(name);
    history[&n] = {name, 0};
    layers.push_back(input_layer_json(n.input_shape, in.dtype(), name));
  }
  std::map<const Layer*, Json> entries;
  for (const auto& l : ls) {
    Json j = layer_json(*l, keras_view);
    j["name"] = l->name();
    j["inbound_nodes"] = Json::array();
    entries[l.ptr().get()] = std::move(j);
  }
  auto tensor = [&](const KerasTensor& t) {
    auto it = history.find(t.node().get());
    MPT_CHECK(it != history.end(), "save: model '", m.name(), "': a layer call uses a tensor from outside the model");
    return Json{{"class_name", "__keras_tensor__"},
                {"config",
                 {{"shape", shape_json(t.shape())},
                  {"dtype", to_string(t.dtype())},
                  {"keras_history", Json::array({it->second.first, it->second.second, 0})}}}};
  };
  for (const auto& n : nodes) {
    Json& entry = entries.at(n->layer.get());
    Json args = Json::array();
    for (const auto& in : n->inputs) args.push_back(tensor(in));
    Json shapes = Json::array();
    for (const auto& in : n->inputs) shapes.push_back(shape_json(in.shape()));
    const auto [node_args, kwargs, build_config] = node_json(*n->layer, n->inputs, args, shapes);
    // Keras builds a layer from its first call's input shapes (a nested functional model: its own).
    if (entry["inbound_nodes"].empty() && !entry.contains("build_config")) entry["build_config"] = build_config;
    history[n.get()] = {n->layer->name(), entry["inbound_nodes"].size()};
    entry["inbound_nodes"].push_back({{"args", node_args}, {"kwargs", kwargs}});
  }
  for (const auto& l : ls) {  // Keras's key order: build_config before name and inbound_nodes
    Json& e = entries.at(l.ptr().get());
    Json ordered = {{"module", e["module"]}, {"class_name", e["class_name"]}, {"config", e["config"]},
                    {"registered_name", e.contains("registered_name") ? e["registered_name"] : Json(nullptr)}};
    if (e.contains("build_config")) ordered["build_config"] = e["build_config"];
    if (e.contains("compile_config")) ordered["compile_config"] = e["compile_config"];  // a nested model's
    ordered["name"] = e["name"];
    ordered["inbound_nodes"] = e["inbound_nodes"];
    layers.push_back(std::move(ordered));
  }
  auto ref = [&](const KerasTensor& t) {
    const auto& h = history.at(t.node().get());
    return Json::array({h.first, h.second, 0});
  };
  Json ins = Json::array(), outs = Json::array();
  for (const auto& t : inputs) ins.push_back(ref(t));
  for (const auto& t : Access::outputs(m)) outs.push_back(ref(t));
  Json c = {{"name", m.name()}, {"trainable", m.trainable()}};
  if (!keras_view) c["dtype"] = policy_json(m.dtype_policy());
  c["layers"] = layers;
  c["input_layers"] = ins.size() == 1 ? ins[0] : ins;  // one tensor is written bare, as Keras does
  c["output_layers"] = outs.size() == 1 ? outs[0] : outs;
  Json out = {{"module", "keras.src.models.functional"}, {"class_name", "Functional"}, {"config", c},
              {"registered_name", "Functional"}};
  if (keras_view) {
    out["build_config"] = {{"input_shape", nullptr}};
    if (m.compiled()) out["compile_config"] = keras_compile_config(m);
  }
  return out;
}

/// A [name, node index, tensor index] reference, or a list of them.
std::vector<const Json*> tensor_refs(const Json& v, const std::string& w) {
  as_array(v, w);
  if (!v.empty() && v[0].is_string()) return {&v};
  std::vector<const Json*> out;
  for (const auto& r : v) out.push_back(&as_array(r, w));
  return out;
}

/// A layer of a functional config and its calls (inbound nodes) still to make.
struct PendingLayer {
  LayerRef layer;
  std::string name;
  const Json* nodes;
  std::size_t next = 0;
  std::string where;
};
/// The tensor a call argument names, or null while its producer has not been called.
using ReadyTensor = std::function<const KerasTensor*(const Json& arg, const std::string& where)>;

bool is_keras_tensor(const Json& v) {
  const Json* c = v.is_object() ? find(v, "class_name") : nullptr;
  return c && c->is_string() && *c == "__keras_tensor__";
}

/// A node's input tensors in the layer's input order: its one argument (a tensor or a list), or
/// for layers with named call arguments (MultiHeadAttention) the positional arguments and the
/// tensor kwargs by name. Non-tensor kwargs were read into the layer's config
/// (call_options_from); any other kwarg is refused.
std::vector<const Json*> call_tensors(const Layer& layer, const Json& args, const Json* kwargs, const std::string& wn) {
  const auto names = layer.call_argument_names();
  const auto options = layer.call_option_keys();
  std::vector<const Json*> by_name(names.size(), nullptr), out;
  if (kwargs)
    for (const auto& [k, v] : kwargs->items()) {
      const auto it = std::find(names.begin(), names.end(), k);
      if (it != names.end() && is_keras_tensor(v)) {
        by_name[it - names.begin()] = &v;
        continue;
      }
      MPT_CHECK(v.is_null() || k == "training" || std::find(options.begin(), options.end(), k) != options.end(), wn,
                ": call argument ", k, " = ", v.dump(), " is not supported by mpt's ", layer.class_name());
    }
  if (names.empty()) {
    MPT_CHECK(args.size() == 1, wn, ": expected one argument (a tensor or a list of tensors), found ", args.size());
    if (args[0].is_array()) {
      for (const auto& t : args[0]) out.push_back(&t);
    } else {
      out.push_back(&args[0]);
    }
  } else {
    MPT_CHECK(args.size() <= names.size(), wn, ": ", args.size(), " positional arguments, ", layer.class_name(),
              " takes at most ", names.size());
    for (std::size_t i = 0; i < args.size(); ++i) {
      MPT_CHECK(!by_name[i], wn, ": ", names[i], " given both by position and by name");
      by_name[i] = &args[i];
    }
    for (const Json* t : by_name)
      if (t) out.push_back(t);
  }
  MPT_CHECK(!out.empty(), wn, ": an empty list of inputs");
  return out;
}

/// The non-tensor kwargs of a layer's calls (MultiHeadAttention's use_causal_mask), which mpt
/// keeps as layer options: into the layer's config, the same in every call.
void call_options_from(const Json& nodes, LayerConfig& lc, const std::string& w) {
  std::map<std::string, Json> seen;
  for (const auto& node : nodes) {
    const Json* kwargs = node.is_object() ? find(node, "kwargs") : nullptr;
    if (!kwargs || !kwargs->is_object()) continue;
    for (const auto& [k, v] : kwargs->items()) {
      // training: a call-context argument, replaced in every call by the model's own flag (Keras's
      // functional operation_fn), so a recorded value changes nothing.
      if (v.is_null() || is_keras_tensor(v) || k == "training") continue;
      auto [it, fresh] = seen.emplace(k, v);
      MPT_CHECK(fresh || it->second == v, w, ": calls pass ", k, " = ", it->second.dump(), " and ", v.dump(),
                "; mpt keeps it per layer, so every call must pass the same");
      lc.config[k] = v;
    }
  }
}

/// Makes the layers' calls in any order, as Keras's functional_from_config: a call waits until
/// its inputs exist; an error names a call that never can (a cycle or a missing call).
void call_layers(std::vector<PendingLayer>& pending, const ReadyTensor& ready,
                 std::map<std::string, std::vector<KerasTensor>>& produced) {
  for (bool progress = true; progress;) {
    progress = false;
    for (auto& p : pending)
      while (p.next < p.nodes->size()) {
        const std::string wn = p.where + ", inbound node " + std::to_string(p.next);
        const Json& node = (*p.nodes)[p.next];
        const Json& args = as_array(at(node, "args", wn), wn + ", args");
        const auto ts = call_tensors(*p.layer, args, find(node, "kwargs"), wn);
        const bool several = ts.size() > 1 || (args.size() == 1 && args[0].is_array());
        MPT_CHECK(!ts.empty(), wn, ": an empty list of inputs");
        std::vector<KerasTensor> xs;
        for (const Json* t : ts)
          if (const KerasTensor* x = ready(*t, wn)) xs.push_back(*x);
        if (xs.size() != ts.size()) break;  // an input not made yet
        produced[p.name].push_back(several ? p.layer(xs) : p.layer(xs[0]));
        ++p.next;
        progress = true;
      }
  }
  for (const auto& p : pending)
    MPT_CHECK(p.next == p.nodes->size(), p.where, ": inbound node ", p.next,
              " waits on a tensor that no layer call produces (a cycle or a missing call)");
}

bool is_model_class(const std::string& cls) { return cls == "Functional" || cls == "Sequential"; }

/// A model used as a layer, from its nested config (Keras's layer entry of class Functional or
/// Sequential holding the model's own config).
LayerRef nested_from(const Json& e, const std::string& w) {
  std::shared_ptr<Model> m = model_from_config(e, w);
  return LayerRef(m);
}

std::unique_ptr<Model> functional_from(const Json& c, const std::string& name, const std::string& w) {
  std::map<std::string, std::vector<KerasTensor>> produced;  // layer name -> its calls' outputs
  std::set<std::string> names;
  std::vector<PendingLayer> pending;
  const Json& list = as_array(at(c, "layers", w), w + ", layers");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string wi = w + ", layer " + std::to_string(i);
    const Json& e = list[i];
    const std::string& cls = as_string(at(e, "class_name", wi), wi + ", class_name");
    const Json& cfg = at(e, "config", wi);
    const Json* n = find(e, "name");
    const std::string lname = as_string(n ? *n : at(cfg, "name", wi), wi + ", name");
    MPT_CHECK(names.insert(lname).second, wi, ": two layers are named '", lname, "'");
    if (cls == "InputLayer") {
      const Json* shape = find(cfg, "batch_shape");
      if (!shape) shape = &at(cfg, "batch_input_shape", wi);  // Keras 2's key
      DType dtype = float32;
      if (const Json* d = find(cfg, "dtype"); d && !d->is_null())
        dtype = d->is_string() ? dtype_from_string(d->get<std::string>()) : policy_from(*d, wi).variable_dtype();
      produced[lname] = {Input(per_example_shape(*shape, wi + ", batch_shape"), {.dtype = dtype, .name = lname})};
      continue;
    }
    const Json& nodes = as_array(at(e, "inbound_nodes", wi), wi + ", inbound_nodes");
    if (is_model_class(cls)) {  // a model used as a layer
      LayerRef nested = nested_from(e, wi);
      MPT_CHECK(nested->name() == lname, wi, ": name '", lname, "' differs from its config's '", nested->name(), "'");
      pending.push_back({nested, lname, &nodes, 0, wi + " ('" + lname + "')"});
      continue;
    }
    LayerConfig lc = layer_config_from(e, wi);
    MPT_CHECK(lc.name == lname, wi, ": name '", lname, "' differs from its config's '", lc.name, "'");
    call_options_from(nodes, lc, wi + " ('" + lname + "')");
    pending.push_back({layer_from_config(lc), lname, &nodes, 0, wi + " ('" + lname + "')"});
  }
  const ReadyTensor ready = [&](const Json& t, const std::string& wn) -> const KerasTensor* {
    const std::string wt = wn + ", keras_history";
    const Json& h = as_array(at(at(t, "config", wn), "keras_history", wn), wt);
    MPT_CHECK(h.size() == 3, wt, ": expected [layer, node index, tensor index]");
    const std::string& from = as_string(h[0], wt);
    const std::uint64_t node = as_uint(h[1], wt), index = as_uint(h[2], wt);
    MPT_CHECK(names.count(from), wt, ": no layer named '", from, "'");
    MPT_CHECK(index == 0, wt, ": tensor index ", index, " (mpt's layers have one output)");
    auto it = produced.find(from);
    return it != produced.end() && node < it->second.size() ? &it->second[node] : nullptr;
  };
  call_layers(pending, ready, produced);
  auto resolve = [&](const Json& v, const std::string& wr) {
    std::vector<KerasTensor> out;
    for (const Json* r : tensor_refs(v, wr)) {
      MPT_CHECK(r->size() == 3, wr, ": expected [layer, node index, tensor index]");
      const std::string& from = as_string((*r)[0], wr);
      const std::uint64_t node = as_uint((*r)[1], wr);
      MPT_CHECK(as_uint((*r)[2], wr) == 0, wr, ": tensor index must be 0");
      auto it = produced.find(from);
      MPT_CHECK(it != produced.end() && node < it->second.size(), wr, ": layer '", from, "' has no node ", node);
      out.push_back(it->second[node]);
    }
    return out;
  };
  return std::make_unique<Model>(resolve(at(c, "input_layers", w), w + ", input_layers"),
                                 resolve(at(c, "output_layers", w), w + ", output_layers"), name);
}

}  // namespace

Json model_config_json(const Model& m, bool keras_view) {
  if (auto* s = dynamic_cast<const Sequential*>(&m)) return sequential_config(*s, keras_view);
  MPT_CHECK(!Access::inputs(m).empty(), "save: model '", m.name(), "' is neither Sequential nor functional; use save_weights");
  return functional_config(m, keras_view);
}

std::unique_ptr<Model> model_from_config(const Json& v, const std::string& w) {
  const std::string& cls = as_string(at(v, "class_name", w), w + ", class_name");
  const Json& c = at(v, "config", w);
  const std::string name = as_string(at(c, "name", w), w + ", name");
  std::unique_ptr<Model> m;
  if (cls == "Sequential") {
    const Json& layer_list = as_array(at(c, "layers", w), w + ", layers");
    std::vector<LayerRef> layers;
    for (std::size_t i = 0; i < layer_list.size(); ++i) {
      const std::string wi = w + ", layer " + std::to_string(i);
      const Json& e = layer_list[i];
      layers.push_back(is_model_class(as_string(at(e, "class_name", wi), wi + ", class_name"))
                           ? nested_from(e, wi)
                           : layer_from_config(layer_config_from(e, wi)));
    }
    auto s = std::make_unique<Sequential>(layers);
    if (const Json* b = find(c, "build_input_shape"); b && !b->is_null() && s->input_shape().empty()) {
      Shape shape;
      for (const auto& d : as_array(*b, w + ", build_input_shape"))
        shape.push_back(d.is_null() ? 1 : as_int(d, w + ", build_input_shape"));
      s->build(shape);
    }
    m = std::move(s);
  } else if (cls == "Functional") {
    m = functional_from(c, name, w);
  } else {
    fail(w, ": unknown model class '", cls, "' (known: Sequential, Functional)");
  }
  m->set_name(name);
  if (const Json* d = find(c, "dtype"); d && !d->is_null()) Access::policy(*m) = policy_from(*d, w);
  // Keras's model.trainable = False (a frozen base): every layer frozen, whatever its own entry.
  if (const Json* t = find(c, "trainable"); t && !as_bool(*t, w + ", trainable")) m->set_trainable(false);
  return m;
}

Json compile_config_json(const Model& m) {
  Json c = compile_config_of(m, false, loss_json);
  c["optimizer"] = io::optimizer_to_json(m.optimizer());
  if (c["loss_weights"].is_null()) c.erase("loss_weights");  // mpt's own config: written only when set
  return c;
}

namespace {
/// A per-output entry of a compile_config (Keras's loss, loss_weights, metrics, weighted_metrics
/// of a model with several outputs): a list in output order, or a dict by output name (Keras's
/// other spelling). Returns each output's entry (null where a dict leaves an output out).
std::vector<Json> per_output_entries(const Json& v, const Model& m, const std::string& where) {
  const std::size_t outs = m.num_outputs();
  std::vector<Json> out(outs, Json(nullptr));
  if (v.is_array()) {
    MPT_CHECK(v.size() == outs, where, ": model '", m.name(), "' has ", outs, " outputs but the list holds ", v.size(),
              " entries; give one per output, in output order");
    for (std::size_t i = 0; i < outs; ++i) out[i] = v[i];
    return out;
  }
  const std::vector<std::string> names = m.output_names();
  for (const auto& [key, value] : v.items()) {
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) {
      std::string known;
      for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
      fail(where, ": '", key, "' is not an output of model '", m.name(), "' (its outputs: ", known, ")");
    }
    out[static_cast<std::size_t>(it - names.begin())] = value;
  }
  return out;
}

/// A loss entry: one loss (a name, or a serialized Loss object), or per output.
bool is_per_output(const Json& v, const Model& m) {
  if (v.is_array()) return true;
  if (!v.is_object() || v.contains("class_name") || v.contains("config")) return false;
  const std::vector<std::string> names = m.output_names();
  return !v.empty() && std::all_of(v.items().begin(), v.items().end(), [&](const auto& kv) {
    return std::find(names.begin(), names.end(), kv.key()) != names.end();
  });
}

/// compile_config's metrics (or weighted_metrics): with several outputs Keras's per-output forms
/// (a list with an entry per output: a metric, a list of them or null; or a dict by output name);
/// with one, a flat list.
std::vector<std::vector<metrics::MetricArg>> output_metrics_from(const Json* v, const Model& m, const std::string& where) {
  const std::size_t outs = m.num_outputs();
  if (!v || v->is_null()) return std::vector<std::vector<metrics::MetricArg>>(outs);
  if (outs == 1) return {metrics_from_json(v, where)};
  MPT_CHECK(v->is_array() || v->is_object(), where, ": expected a list or a dict by output name, got ", v->dump());
  std::vector<std::vector<metrics::MetricArg>> out;
  const std::vector<Json> entries = per_output_entries(*v, m, where);
  for (std::size_t i = 0; i < outs; ++i) {
    const std::string wi = where + " of output " + std::to_string(i);
    if (entries[i].is_array() || entries[i].is_null()) out.push_back(metrics_from_json(&entries[i], wi));
    else out.push_back({metric_from_json(entries[i], wi)});
  }
  return out;
}
}  // namespace

void compile_from_config(Model& m, const Json& cc, const std::string& where, bool auto_scale_loss) {
  CompileOptions o;
  o.optimizer = optimizer_from_json(at(cc, "optimizer", where), where);
  const Json& loss = at(cc, "loss", where);
  if (is_per_output(loss, m)) {
    std::vector<losses::LossArg> list;
    const std::vector<Json> entries = per_output_entries(loss, m, where + ", loss");
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const std::string wi = where + ", loss of output " + std::to_string(i);
      MPT_CHECK(!entries[i].is_null(), wi, ": none given; mpt trains every output with a loss");
      list.push_back(loss_from(entries[i], wi));
    }
    o.loss = losses::LossArgs(std::move(list));
  } else {
    o.loss = loss_from(loss, where);
  }
  if (const Json* w = find(cc, "loss_weights"); w && !w->is_null()) {
    const std::string ww = where + ", loss_weights";
    if (w->is_number()) {
      MPT_CHECK(m.num_outputs() == 1, ww, ": one number for a model of ", m.num_outputs(), " outputs");
      o.loss_weights = {as_double(*w, ww)};
    } else {
      MPT_CHECK(w->is_array() || w->is_object(), ww, ": expected a list or a dict by output name, got ", w->dump());
      for (const Json& e : per_output_entries(*w, m, ww)) o.loss_weights.push_back(e.is_null() ? 1.0 : as_double(e, ww));
    }
  }
  auto ms = output_metrics_from(find(cc, "metrics"), m, where + ", metrics");
  auto ws = output_metrics_from(find(cc, "weighted_metrics"), m, where + ", weighted_metrics");
  if (m.num_outputs() == 1) {
    o.metrics = std::move(ms[0]), o.weighted_metrics = std::move(ws[0]);
  } else {
    o.output_metrics = std::move(ms), o.output_weighted_metrics = std::move(ws);
  }
  o.auto_scale_loss = auto_scale_loss;
  m.compile(std::move(o));
}

}  // namespace mpt::io
