#include "io/optimizer_io.hpp"

#include <cmath>
#include <set>
#include <typeinfo>

#include "mpt/mixed_precision/loss_scale_optimizer.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::io {

namespace {

using namespace optimizers;
using mixed_precision::LossScaleOptimizer;

template <class T>
const T* exactly(const Optimizer& o) {
  return typeid(o) == typeid(T) ? static_cast<const T*>(&o) : nullptr;
}

/// A finite double, or null (JSON has no inf or NaN).
Json number(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

Json optional_number(const std::optional<double>& v) { return v ? number(*v) : Json(nullptr); }

Json schedule_to_json(const LearningRate& lr, const std::string& optimizer) {
  if (!lr.is_schedule()) return number(lr.at(0));
  const schedules::LearningRateSchedule* s = lr.schedule();
  Json c = Json::object();
  if (auto* e = dynamic_cast<const schedules::ExponentialDecay*>(s)) {
    const auto& o = e->options();
    c["initial_learning_rate"] = number(o.initial_learning_rate);
    c["decay_steps"] = o.decay_steps;
    c["decay_rate"] = number(o.decay_rate);
    c["staircase"] = o.staircase;
  } else if (auto* p = dynamic_cast<const schedules::PiecewiseConstantDecay*>(s)) {
    Json b = Json::array(), v = Json::array();
    for (auto x : p->boundaries()) b.push_back(x);
    for (auto x : p->values()) v.push_back(number(x));
    c["boundaries"] = b;
    c["values"] = v;
  } else if (auto* k = dynamic_cast<const schedules::CosineDecay*>(s)) {
    const auto& o = k->options();
    c["initial_learning_rate"] = number(o.initial_learning_rate);
    c["decay_steps"] = o.decay_steps;
    c["alpha"] = number(o.alpha);
    c["warmup_steps"] = o.warmup_steps;
    c["warmup_target"] = o.warmup_target < 0 ? Json(nullptr) : number(o.warmup_target);
  } else if (auto* pd = dynamic_cast<const schedules::PolynomialDecay*>(s)) {
    const auto& o = pd->options();
    c["initial_learning_rate"] = number(o.initial_learning_rate);
    c["decay_steps"] = o.decay_steps;
    c["end_learning_rate"] = number(o.end_learning_rate);
    c["power"] = number(o.power);
    c["cycle"] = o.cycle;
  } else if (auto* it = dynamic_cast<const schedules::InverseTimeDecay*>(s)) {
    const auto& o = it->options();
    c["initial_learning_rate"] = number(o.initial_learning_rate);
    c["decay_steps"] = o.decay_steps;
    c["decay_rate"] = number(o.decay_rate);
    c["staircase"] = o.staircase;
  } else if (auto* r = dynamic_cast<const schedules::CosineDecayRestarts*>(s)) {
    const auto& o = r->options();
    c["initial_learning_rate"] = number(o.initial_learning_rate);
    c["first_decay_steps"] = o.first_decay_steps;
    c["t_mul"] = number(o.t_mul);
    c["m_mul"] = number(o.m_mul);
    c["alpha"] = number(o.alpha);
  } else {
    fail("save: optimizer '", optimizer, "' uses learning-rate schedule '", s->name(),
         "', which checkpoints cannot rebuild; use save_weights, or one of Keras's schedules");
  }
  c["name"] = s->name();
  return Json{{"module", "keras.optimizers.schedules"},
              {"class_name", s->name()},
              {"config", c},
              {"registered_name", nullptr}};
}

/// The number at `key` of `c`, named "<w>, <key>" in errors.
double num(const Json& c, const char* key, const std::string& w) { return as_double(at(c, key, w), w + ", " + key); }
std::int64_t integer(const Json& c, const char* key, const std::string& w) { return as_int(at(c, key, w), w + ", " + key); }

LearningRate schedule_from_json(const Json& v, const std::string& where) {
  if (v.is_number()) return LearningRate(as_double(v, where + ", learning_rate"));
  const std::string w = where + ", learning_rate";
  const std::string& cls = as_string(at(v, "class_name", w), w + ", class_name");
  const Json& c = at(v, "config", w);
  const std::string who = w + " (" + cls + ")";
  if (cls == "ExponentialDecay") {
    check_fields(c, {"name", "initial_learning_rate", "decay_steps", "decay_rate", "staircase"}, Json::object(), who);
    return schedules::ExponentialDecay({.initial_learning_rate = num(c, "initial_learning_rate", w),
                                        .decay_steps = integer(c, "decay_steps", w),
                                        .decay_rate = num(c, "decay_rate", w),
                                        .staircase = as_bool(at(c, "staircase", w), w + ", staircase")});
  }
  if (cls == "PiecewiseConstantDecay") {
    check_fields(c, {"name", "boundaries", "values"}, Json::object(), who);
    std::vector<std::int64_t> b;
    std::vector<double> vals;
    for (const auto& x : as_array(at(c, "boundaries", w), w + ", boundaries")) b.push_back(as_int(x, w + ", boundaries"));
    for (const auto& x : as_array(at(c, "values", w), w + ", values")) vals.push_back(as_double(x, w + ", values"));
    return schedules::PiecewiseConstantDecay(b, vals);
  }
  if (cls == "CosineDecay") {
    check_fields(c, {"name", "initial_learning_rate", "decay_steps", "alpha", "warmup_target", "warmup_steps"},
                 Json::object(), who);
    const Json& t = at(c, "warmup_target", w);
    return schedules::CosineDecay({.initial_learning_rate = num(c, "initial_learning_rate", w),
                                   .decay_steps = integer(c, "decay_steps", w),
                                   .alpha = num(c, "alpha", w),
                                   .warmup_steps = integer(c, "warmup_steps", w),
                                   .warmup_target = t.is_null() ? -1.0 : as_double(t, w + ", warmup_target")});
  }
  if (cls == "PolynomialDecay") {
    check_fields(c, {"name", "initial_learning_rate", "decay_steps", "end_learning_rate", "power", "cycle"},
                 Json::object(), who);
    schedules::PolynomialDecayOptions o{.initial_learning_rate = num(c, "initial_learning_rate", w),
                                        .decay_steps = integer(c, "decay_steps", w)};
    if (find(c, "end_learning_rate")) o.end_learning_rate = num(c, "end_learning_rate", w);
    if (find(c, "power")) o.power = num(c, "power", w);
    if (const Json* cy = find(c, "cycle")) o.cycle = as_bool(*cy, w + ", cycle");
    return schedules::PolynomialDecay(o);
  }
  if (cls == "InverseTimeDecay") {
    check_fields(c, {"name", "initial_learning_rate", "decay_steps", "decay_rate", "staircase"}, Json::object(), who);
    schedules::InverseTimeDecayOptions o{.initial_learning_rate = num(c, "initial_learning_rate", w),
                                         .decay_steps = integer(c, "decay_steps", w),
                                         .decay_rate = num(c, "decay_rate", w)};
    if (const Json* st = find(c, "staircase")) o.staircase = as_bool(*st, w + ", staircase");
    return schedules::InverseTimeDecay(o);
  }
  if (cls == "CosineDecayRestarts") {
    check_fields(c, {"name", "initial_learning_rate", "first_decay_steps", "t_mul", "m_mul", "alpha"}, Json::object(),
                 who);
    schedules::CosineDecayRestartsOptions o{.initial_learning_rate = num(c, "initial_learning_rate", w),
                                            .first_decay_steps = integer(c, "first_decay_steps", w)};
    if (find(c, "t_mul")) o.t_mul = num(c, "t_mul", w);
    if (find(c, "m_mul")) o.m_mul = num(c, "m_mul", w);
    if (find(c, "alpha")) o.alpha = num(c, "alpha", w);
    return schedules::CosineDecayRestarts(o);
  }
  fail(w, ": unknown schedule '", cls, "'");
}

Json optional_number(double v) { return number(v); }  // AdamW's weight_decay

template <class T>
Json optional_int(const std::optional<T>& v) { return v ? Json(*v) : Json(nullptr); }

/// Keras's base get_config entries.
template <class Options>
void common(Json& c, const Options& o, const std::string& name) {
  c["name"] = name;
  c["learning_rate"] = schedule_to_json(o.learning_rate, name);
  c["weight_decay"] = optional_number(o.weight_decay);
  c["clipnorm"] = optional_number(o.clipnorm);
  c["global_clipnorm"] = optional_number(o.global_clipnorm);
  c["clipvalue"] = optional_number(o.clipvalue);
  c["use_ema"] = o.use_ema;
  c["ema_momentum"] = number(o.ema_momentum);
  c["ema_overwrite_frequency"] = optional_int(o.ema_overwrite_frequency);
  c["loss_scale_factor"] = optional_number(o.loss_scale_factor);
  c["gradient_accumulation_steps"] = optional_int(o.gradient_accumulation_steps);
}

std::optional<double> optional_double(const Json& c, const char* key, const std::string& w) {
  const Json* v = find(c, key);
  if (!v || v->is_null()) return std::nullopt;
  return as_double(*v, w + ", " + key);
}

double get_double(const Json& c, const char* key, double fallback, const std::string& w) {
  const Json* v = find(c, key);
  return v ? as_double(*v, w + ", " + key) : fallback;
}

bool get_bool(const Json& c, const char* key, bool fallback, const std::string& w) {
  const Json* v = find(c, key);
  return v ? as_bool(*v, w + ", " + key) : fallback;
}

/// Checks an optimizer config's fields: Keras's base arguments mpt honours, `own` (the class's),
/// and the base arguments mpt does not implement yet, which pass only at values that change
/// nothing (use_ema false, weight_decay 0, ...).
void check_optimizer_fields(const Json& c, std::initializer_list<std::string_view> own, const std::string& w) {
  std::vector<std::string_view> honoured{"name", "learning_rate", "clipnorm", "global_clipnorm", "clipvalue",
                                         "weight_decay", "use_ema", "ema_momentum", "ema_overwrite_frequency",
                                         "loss_scale_factor", "gradient_accumulation_steps",
                                         "exclude_from_weight_decay"};  // mpt's checkpoints (with_exclusions)
  honoured.insert(honoured.end(), own.begin(), own.end());
  const Json inert = {{"is_legacy_optimizer", false}};
  check_fields(c, honoured, inert, w);
}

std::optional<std::int64_t> optional_int64(const Json& c, const char* key, const std::string& w) {
  const Json* v = find(c, key);
  if (!v || v->is_null()) return std::nullopt;
  return as_int(*v, w + ", " + key);
}

template <class Options>
void read_common(Options& o, const Json& c, const std::string& w) {
  if (const Json* lr = find(c, "learning_rate")) o.learning_rate = schedule_from_json(*lr, w);
  o.clipnorm = optional_double(c, "clipnorm", w);
  o.clipvalue = optional_double(c, "clipvalue", w);
  o.global_clipnorm = optional_double(c, "global_clipnorm", w);
  if constexpr (std::is_same_v<decltype(o.weight_decay), double>) {
    o.weight_decay = get_double(c, "weight_decay", o.weight_decay, w);  // AdamW's own argument
  } else {
    o.weight_decay = optional_double(c, "weight_decay", w);
  }
  o.use_ema = get_bool(c, "use_ema", o.use_ema, w);
  o.ema_momentum = get_double(c, "ema_momentum", o.ema_momentum, w);
  o.ema_overwrite_frequency = optional_int64(c, "ema_overwrite_frequency", w);
  o.gradient_accumulation_steps = optional_int64(c, "gradient_accumulation_steps", w);
  o.loss_scale_factor = optional_double(c, "loss_scale_factor", w);
}

}  // namespace

namespace {
/// The optimizer's own slot groups (after the base class's EMA and accumulation ones).
std::vector<std::vector<std::string>> own_slot_layout(const Optimizer& opt) {
  if (auto* s = exactly<SGDOptimizer>(opt)) return s->options().momentum != 0 ? std::vector<std::vector<std::string>>{{"momentum"}} : std::vector<std::vector<std::string>>{};
  if (auto* a = exactly<AdamOptimizer>(opt)) {
    std::vector<std::vector<std::string>> l{{"m", "v"}};
    if (a->options().amsgrad) l.push_back({"vhat"});
    return l;
  }
  if (auto* a = exactly<AdamWOptimizer>(opt)) {
    std::vector<std::vector<std::string>> l{{"m", "v"}};
    if (a->options().amsgrad) l.push_back({"vhat"});
    return l;
  }
  if (auto* r = exactly<RMSpropOptimizer>(opt)) {
    std::vector<std::vector<std::string>> l{{"velocity"}};
    if (r->options().momentum > 0) l.push_back({"momentum"});
    if (r->options().centered) l.push_back({"average_gradient"});
    return l;
  }
  if (exactly<NadamOptimizer>(opt)) return {{"momentum", "velocity"}};
  if (exactly<AdamaxOptimizer>(opt)) return {{"momentum", "norm"}};
  if (exactly<AdagradOptimizer>(opt)) return {{"accumulator"}};
  if (exactly<LionOptimizer>(opt)) return {{"momentum"}};
  if (exactly<AdafactorOptimizer>(opt)) return {{"r", "c", "velocity"}};
  std::set<std::string> names;
  for (const auto& [path, slots] : opt.slots_by_path())
    for (const auto& [name, t] : slots)
      if (name != "average" && name != "gradient_accumulator") names.insert(name);
  if (names.empty()) return {};
  return {std::vector<std::string>(names.begin(), names.end())};
}
}  // namespace

std::vector<std::vector<std::string>> slot_layout(const Optimizer& opt) {
  // Keras's base build() makes the EMA averages, then the gradient accumulators, before the
  // optimizer's own variables.
  std::vector<std::vector<std::string>> out;
  if (opt.common_options().use_ema) out.push_back({"average"});
  if (opt.accumulation_steps() > 1) out.push_back({"gradient_accumulator"});
  for (auto& g : own_slot_layout(opt)) out.push_back(std::move(g));
  return out;
}

KerasSlot keras_slot(const Optimizer& opt, const Variable& v, const std::string& name) {
  if (exactly<AdafactorOptimizer>(opt) && (name == "r" || name == "c" || name == "velocity")) {
    const Shape& s = v.shape();
    if (s.size() < 2) return name == "velocity" ? KerasSlot{s, false} : KerasSlot{{}, true};  // Keras's 0 placeholders
    if (name == "velocity") return {s, true};  // Keras reassigns it from r and c before each use
    Shape f = s;
    if (name == "r") f.pop_back();
    else f.erase(f.end() - 2);
    return {f, false};
  }
  return {v.shape(), false};
}

std::vector<std::string> trailing_variables(const Optimizer& opt) {
  if (exactly<NadamOptimizer>(opt)) return {"u_product"};
  return {};
}

Tensor derived_value(const Optimizer& opt, const std::string& name, const Shape& shape) {
  if (auto* n = exactly<NadamOptimizer>(opt); n && name == "u_product")
    return Tensor::scalar(n->u_product(), float32, Device::cpu());
  return Tensor::zeros(shape, float32, Device::cpu());
}

bool has_learning_rate_variable(const Optimizer& opt) {
  if (exactly<LossScaleOptimizer>(opt)) return true;
  return !opt.common_options().learning_rate.is_schedule();
}

Json optimizer_to_json(const Optimizer& opt, bool keras_only) {
  Json c = Json::object();
  std::string cls;
  if (auto* s = exactly<SGDOptimizer>(opt)) {
    cls = "SGD";
    common(c, s->options(), opt.name());
    c["momentum"] = number(s->options().momentum);
    c["nesterov"] = s->options().nesterov;
  } else if (auto* a = exactly<AdamOptimizer>(opt)) {
    cls = "Adam";
    const auto& o = a->options();
    common(c, o, opt.name());
    c["beta_1"] = number(o.beta_1), c["beta_2"] = number(o.beta_2), c["epsilon"] = number(o.epsilon);
    c["amsgrad"] = o.amsgrad;
  } else if (auto* w = exactly<AdamWOptimizer>(opt)) {
    cls = "AdamW";
    const auto& o = w->options();
    common(c, o, opt.name());
    c["beta_1"] = number(o.beta_1), c["beta_2"] = number(o.beta_2);
    c["epsilon"] = number(o.epsilon), c["amsgrad"] = o.amsgrad;
  } else if (auto* r = exactly<RMSpropOptimizer>(opt)) {
    cls = "RMSprop";
    const auto& o = r->options();
    common(c, o, opt.name());
    c["rho"] = number(o.rho), c["momentum"] = number(o.momentum), c["epsilon"] = number(o.epsilon);
    c["centered"] = o.centered;
  } else if (auto* n = exactly<NadamOptimizer>(opt)) {
    cls = "Nadam";
    const auto& o = n->options();
    common(c, o, opt.name());
    c["beta_1"] = number(o.beta_1), c["beta_2"] = number(o.beta_2), c["epsilon"] = number(o.epsilon);
  } else if (auto* x = exactly<AdamaxOptimizer>(opt)) {
    cls = "Adamax";
    const auto& o = x->options();
    common(c, o, opt.name());
    c["beta_1"] = number(o.beta_1), c["beta_2"] = number(o.beta_2), c["epsilon"] = number(o.epsilon);
  } else if (auto* ag = exactly<AdagradOptimizer>(opt)) {
    cls = "Adagrad";
    const auto& o = ag->options();
    common(c, o, opt.name());
    c["initial_accumulator_value"] = number(o.initial_accumulator_value), c["epsilon"] = number(o.epsilon);
  } else if (auto* li = exactly<LionOptimizer>(opt)) {
    cls = "Lion";
    const auto& o = li->options();
    common(c, o, opt.name());
    c["beta_1"] = number(o.beta_1), c["beta_2"] = number(o.beta_2);
  } else if (auto* af = exactly<AdafactorOptimizer>(opt)) {
    cls = "Adafactor";
    const auto& o = af->options();
    common(c, o, opt.name());
    c["beta_2_decay"] = number(o.beta_2_decay), c["epsilon_1"] = number(o.epsilon_1);
    c["epsilon_2"] = number(o.epsilon_2), c["clip_threshold"] = number(o.clip_threshold);
    c["relative_step"] = o.relative_step;
  } else if (auto* l = exactly<LossScaleOptimizer>(opt)) {
    cls = "LossScaleOptimizer";
    const auto& o = l->options();
    auto& inner = const_cast<LossScaleOptimizer*>(l)->inner_optimizer();
    c["name"] = opt.name();
    c["inner_optimizer"] = optimizer_to_json(inner, keras_only);
    c["initial_scale"] = number(o.initial_scale);
    c["dynamic_growth_steps"] = o.dynamic_growth_steps;
    if (!keras_only) {
      c["dynamic"] = o.dynamic;
      c["hysteresis"] = o.hysteresis;
      c["min_scale"] = number(o.min_scale);
      c["max_scale"] = number(o.max_scale);
    }
  } else {
    fail("save: optimizer '", opt.name(), "' is not one mpt can rebuild (SGD, Adam, AdamW, RMSprop, Nadam, Adamax, "
         "Adagrad, Lion, Adafactor, LossScaleOptimizer); save its weights with save_weights instead");
  }
  // Keras keeps exclude_from_weight_decay out of get_config (its optimizers would refuse the
  // key): mpt's own checkpoints carry it, so that a resume decays the same variables.
  if (!keras_only && !opt.excluded_from_weight_decay().empty() && !exactly<LossScaleOptimizer>(opt)) {
    Json names = Json::array();
    for (const auto& n : opt.excluded_from_weight_decay()) names.push_back(n);
    c["exclude_from_weight_decay"] = names;
  }
  return Json{{"module", "keras.optimizers"}, {"class_name", cls}, {"config", c}, {"registered_name", nullptr}};
}

/// The options Adam and AdamW share.
template <class O>
void read_adam(O& o, const Json& c, const std::string& w) {
  read_common(o, c, w);
  o.beta_1 = get_double(c, "beta_1", o.beta_1, w);
  o.beta_2 = get_double(c, "beta_2", o.beta_2, w);
  o.epsilon = get_double(c, "epsilon", o.epsilon, w);
  o.amsgrad = get_bool(c, "amsgrad", o.amsgrad, w);
}

namespace {
/// mpt's checkpoints carry exclude_from_weight_decay (Keras's configs do not).
std::shared_ptr<Optimizer> with_exclusions(std::shared_ptr<Optimizer> opt, const Json& c, const std::string& w) {
  if (const Json* ex = find(c, "exclude_from_weight_decay")) {
    std::vector<std::string> names;
    for (const auto& n : as_array(*ex, w + ", exclude_from_weight_decay"))
      names.push_back(as_string(n, w + ", exclude_from_weight_decay"));
    opt->exclude_from_weight_decay(names);
  }
  return opt;
}
}  // namespace

std::shared_ptr<Optimizer> optimizer_from_json(const Json& v, const std::string& where) {
  const std::string& cls = as_string(at(v, "class_name", where), where + ", class_name");
  const std::string w = where + ", optimizer " + cls;
  const Json& c = at(v, "config", w);
  if (cls == "SGD") {
    check_optimizer_fields(c, {"momentum", "nesterov"}, w);
    SGDOptions o;
    read_common(o, c, w);
    o.momentum = get_double(c, "momentum", o.momentum, w);
    o.nesterov = get_bool(c, "nesterov", o.nesterov, w);
    return with_exclusions(std::make_shared<SGDOptimizer>(o), c, w);
  }
  if (cls == "Adam") {
    check_optimizer_fields(c, {"beta_1", "beta_2", "epsilon", "amsgrad"}, w);
    AdamOptions o;
    read_adam(o, c, w);
    return with_exclusions(std::make_shared<AdamOptimizer>(o), c, w);
  }
  if (cls == "AdamW") {
    check_optimizer_fields(c, {"beta_1", "beta_2", "epsilon", "amsgrad"}, w);
    AdamWOptions o;
    read_adam(o, c, w);
    return with_exclusions(std::make_shared<AdamWOptimizer>(o), c, w);
  }
  if (cls == "Nadam" || cls == "Adamax") {
    check_optimizer_fields(c, {"beta_1", "beta_2", "epsilon"}, w);
    auto read = [&](auto o) {
      read_common(o, c, w);
      o.beta_1 = get_double(c, "beta_1", o.beta_1, w);
      o.beta_2 = get_double(c, "beta_2", o.beta_2, w);
      o.epsilon = get_double(c, "epsilon", o.epsilon, w);
      return o;
    };
    if (cls == "Nadam") return with_exclusions(std::make_shared<NadamOptimizer>(read(NadamOptions{})), c, w);
    return with_exclusions(std::make_shared<AdamaxOptimizer>(read(AdamaxOptions{})), c, w);
  }
  if (cls == "Adagrad") {
    check_optimizer_fields(c, {"initial_accumulator_value", "epsilon"}, w);
    AdagradOptions o;
    read_common(o, c, w);
    o.initial_accumulator_value = get_double(c, "initial_accumulator_value", o.initial_accumulator_value, w);
    o.epsilon = get_double(c, "epsilon", o.epsilon, w);
    return with_exclusions(std::make_shared<AdagradOptimizer>(o), c, w);
  }
  if (cls == "Lion") {
    check_optimizer_fields(c, {"beta_1", "beta_2"}, w);
    LionOptions o;
    read_common(o, c, w);
    o.beta_1 = get_double(c, "beta_1", o.beta_1, w);
    o.beta_2 = get_double(c, "beta_2", o.beta_2, w);
    return with_exclusions(std::make_shared<LionOptimizer>(o), c, w);
  }
  if (cls == "Adafactor") {
    check_optimizer_fields(c, {"beta_2_decay", "epsilon_1", "epsilon_2", "clip_threshold", "relative_step"}, w);
    AdafactorOptions o;
    read_common(o, c, w);
    o.beta_2_decay = get_double(c, "beta_2_decay", o.beta_2_decay, w);
    o.epsilon_1 = get_double(c, "epsilon_1", o.epsilon_1, w);
    o.epsilon_2 = get_double(c, "epsilon_2", o.epsilon_2, w);
    o.clip_threshold = get_double(c, "clip_threshold", o.clip_threshold, w);
    o.relative_step = get_bool(c, "relative_step", o.relative_step, w);
    return with_exclusions(std::make_shared<AdafactorOptimizer>(o), c, w);
  }
  if (cls == "RMSprop") {
    check_optimizer_fields(c, {"rho", "momentum", "epsilon", "centered"}, w);
    RMSpropOptions o;
    read_common(o, c, w);
    o.rho = get_double(c, "rho", o.rho, w);
    o.momentum = get_double(c, "momentum", o.momentum, w);
    o.epsilon = get_double(c, "epsilon", o.epsilon, w);
    o.centered = get_bool(c, "centered", o.centered, w);
    return with_exclusions(std::make_shared<RMSpropOptimizer>(o), c, w);
  }
  if (cls == "LossScaleOptimizer") {
    check_fields(c, {"name", "inner_optimizer", "initial_scale", "dynamic_growth_steps", "dynamic", "hysteresis",
                     "min_scale", "max_scale"},
                 Json::object(), w);
    mixed_precision::LossScaleOptions o;
    o.initial_scale = get_double(c, "initial_scale", o.initial_scale, w);
    if (const Json* g = find(c, "dynamic_growth_steps")) o.dynamic_growth_steps = as_int(*g, w + ", dynamic_growth_steps");
    o.dynamic = get_bool(c, "dynamic", o.dynamic, w);
    if (const Json* h = find(c, "hysteresis")) {
      const std::int64_t n = as_int(*h, w + ", hysteresis");
      MPT_CHECK(n >= 0 && n < (1 << 30), w, ", hysteresis: out of range: ", n);
      o.hysteresis = static_cast<int>(n);
    }
    o.min_scale = get_double(c, "min_scale", o.min_scale, w);
    o.max_scale = get_double(c, "max_scale", o.max_scale, w);
    return std::make_shared<LossScaleOptimizer>(optimizer_from_json(at(c, "inner_optimizer", w), w), o);
  }
  fail(w, ": unknown optimizer class (known: SGD, Adam, AdamW, RMSprop, Nadam, Adamax, Adagrad, Lion, Adafactor, "
       "LossScaleOptimizer)");
}

}  // namespace mpt::io
