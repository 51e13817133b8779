#include "io/optimizer_io.hpp"

#include <set>
#include <typeinfo>

#include "mpt/mixed_precision/loss_scale_optimizer.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::io {

namespace {

using namespace optimizers;
using mixed_precision::LossScaleOptimizer;
using json::number;
using json::ObjectWriter;

template <class T>
const T* exactly(const Optimizer& o) {
  return typeid(o) == typeid(T) ? static_cast<const T*>(&o) : nullptr;
}

std::string optional_number(const std::optional<double>& v) { return v ? number(*v) : "null"; }

std::string schedule_to_json(const LearningRate& lr, const std::string& optimizer) {
  if (!lr.is_schedule()) return number(lr.at(0));
  const schedules::LearningRateSchedule* s = lr.schedule();
  ObjectWriter c;
  if (auto* e = dynamic_cast<const schedules::ExponentialDecay*>(s)) {
    const auto& o = e->options();
    c.raw("initial_learning_rate", number(o.initial_learning_rate))
        .raw("decay_steps", number(o.decay_steps))
        .raw("decay_rate", number(o.decay_rate))
        .raw("staircase", json::boolean(o.staircase));
  } else if (auto* p = dynamic_cast<const schedules::PiecewiseConstantDecay*>(s)) {
    std::string b, v;
    for (auto x : p->boundaries()) b += (b.empty() ? "" : ", ") + number(x);
    for (auto x : p->values()) v += (v.empty() ? "" : ", ") + number(x);
    c.raw("boundaries", "[" + b + "]").raw("values", "[" + v + "]");
  } else if (auto* k = dynamic_cast<const schedules::CosineDecay*>(s)) {
    const auto& o = k->options();
    c.raw("initial_learning_rate", number(o.initial_learning_rate))
        .raw("decay_steps", number(o.decay_steps))
        .raw("alpha", number(o.alpha))
        .raw("warmup_steps", number(o.warmup_steps))
        .raw("warmup_target", o.warmup_target < 0 ? "null" : number(o.warmup_target));
  } else {
    fail("save: optimizer '", optimizer, "' uses learning-rate schedule '", s->name(),
         "', which checkpoints cannot rebuild; use save_weights, or ExponentialDecay, "
         "PiecewiseConstantDecay or CosineDecay");
  }
  c.str("name", s->name());
  return ObjectWriter()
      .str("module", "keras.optimizers.schedules")
      .str("class_name", s->name())
      .raw("config", c.done())
      .raw("registered_name", "null")
      .done();
}

LearningRate schedule_from_json(const json::Value& v, const std::string& where) {
  if (v.is_number()) return LearningRate(v.as_double(where));
  const std::string w = where + ", learning_rate";
  const std::string& cls = v.at("class_name", w).as_string(w);
  const json::Value& c = v.at("config", w);
  if (cls == "ExponentialDecay")
    return schedules::ExponentialDecay({.initial_learning_rate = c.at("initial_learning_rate", w).as_double(w),
                                        .decay_steps = c.at("decay_steps", w).as_int(w),
                                        .decay_rate = c.at("decay_rate", w).as_double(w),
                                        .staircase = c.at("staircase", w).as_bool(w)});
  if (cls == "PiecewiseConstantDecay") {
    std::vector<std::int64_t> b;
    std::vector<double> vals;
    for (const auto& x : c.at("boundaries", w).as_array(w)) b.push_back(x.as_int(w));
    for (const auto& x : c.at("values", w).as_array(w)) vals.push_back(x.as_double(w));
    return schedules::PiecewiseConstantDecay(b, vals);
  }
  if (cls == "CosineDecay") {
    const json::Value& t = c.at("warmup_target", w);
    return schedules::CosineDecay({.initial_learning_rate = c.at("initial_learning_rate", w).as_double(w),
                                   .decay_steps = c.at("decay_steps", w).as_int(w),
                                   .alpha = c.at("alpha", w).as_double(w),
                                   .warmup_steps = c.at("warmup_steps", w).as_int(w),
                                   .warmup_target = t.is_null() ? -1.0 : t.as_double(w)});
  }
  fail(w, ": unknown schedule '", cls, "'");
}

template <class Options>
void common(ObjectWriter& c, const Options& o, const std::string& name) {
  c.str("name", name)
      .raw("learning_rate", schedule_to_json(o.learning_rate, name))
      .raw("clipnorm", optional_number(o.clipnorm))
      .raw("global_clipnorm", optional_number(o.global_clipnorm))
      .raw("clipvalue", optional_number(o.clipvalue));
}

std::optional<double> optional_double(const json::Value& c, const char* key, const std::string& w) {
  const json::Value* v = c.find(key);
  if (!v || v->is_null()) return std::nullopt;
  return v->as_double(w + ", " + key);
}

double get_double(const json::Value& c, const char* key, double fallback, const std::string& w) {
  const json::Value* v = c.find(key);
  return v ? v->as_double(w + ", " + key) : fallback;
}

bool get_bool(const json::Value& c, const char* key, bool fallback, const std::string& w) {
  const json::Value* v = c.find(key);
  return v ? v->as_bool(w + ", " + key) : fallback;
}

template <class Options>
void read_common(Options& o, const json::Value& c, const std::string& w) {
  if (const json::Value* lr = c.find("learning_rate")) o.learning_rate = schedule_from_json(*lr, w);
  o.clipnorm = optional_double(c, "clipnorm", w);
  o.clipvalue = optional_double(c, "clipvalue", w);
  o.global_clipnorm = optional_double(c, "global_clipnorm", w);
}

}  // namespace

std::vector<std::vector<std::string>> slot_layout(const Optimizer& opt) {
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
  std::set<std::string> names;
  for (const auto& [path, slots] : opt.slots_by_path())
    for (const auto& [name, t] : slots) names.insert(name);
  if (names.empty()) return {};
  return {std::vector<std::string>(names.begin(), names.end())};
}

bool has_learning_rate_variable(const Optimizer& opt) {
  if (auto* s = exactly<SGDOptimizer>(opt)) return !s->options().learning_rate.is_schedule();
  if (auto* a = exactly<AdamOptimizer>(opt)) return !a->options().learning_rate.is_schedule();
  if (auto* a = exactly<AdamWOptimizer>(opt)) return !a->options().learning_rate.is_schedule();
  if (auto* r = exactly<RMSpropOptimizer>(opt)) return !r->options().learning_rate.is_schedule();
  return true;
}

std::string optimizer_to_json(const Optimizer& opt, bool keras_only) {
  ObjectWriter c;
  std::string cls;
  if (auto* s = exactly<SGDOptimizer>(opt)) {
    cls = "SGD";
    common(c, s->options(), opt.name());
    c.raw("momentum", number(s->options().momentum)).raw("nesterov", json::boolean(s->options().nesterov));
  } else if (auto* a = exactly<AdamOptimizer>(opt)) {
    cls = "Adam";
    const auto& o = a->options();
    common(c, o, opt.name());
    c.raw("beta_1", number(o.beta_1)).raw("beta_2", number(o.beta_2)).raw("epsilon", number(o.epsilon));
    c.raw("amsgrad", json::boolean(o.amsgrad));
  } else if (auto* w = exactly<AdamWOptimizer>(opt)) {
    cls = "AdamW";
    const auto& o = w->options();
    common(c, o, opt.name());
    c.raw("weight_decay", number(o.weight_decay)).raw("beta_1", number(o.beta_1)).raw("beta_2", number(o.beta_2));
    c.raw("epsilon", number(o.epsilon)).raw("amsgrad", json::boolean(o.amsgrad));
  } else if (auto* r = exactly<RMSpropOptimizer>(opt)) {
    cls = "RMSprop";
    const auto& o = r->options();
    common(c, o, opt.name());
    c.raw("rho", number(o.rho)).raw("momentum", number(o.momentum)).raw("epsilon", number(o.epsilon));
    c.raw("centered", json::boolean(o.centered));
  } else if (auto* l = exactly<LossScaleOptimizer>(opt)) {
    cls = "LossScaleOptimizer";
    const auto& o = l->options();
    auto& inner = const_cast<LossScaleOptimizer*>(l)->inner_optimizer();
    c.str("name", opt.name())
        .raw("inner_optimizer", optimizer_to_json(inner, keras_only))
        .raw("initial_scale", number(o.initial_scale))
        .raw("dynamic_growth_steps", number(o.dynamic_growth_steps));
    if (!keras_only)
      c.raw("dynamic", json::boolean(o.dynamic))
          .raw("hysteresis", number(o.hysteresis))
          .raw("min_scale", number(o.min_scale))
          .raw("max_scale", number(o.max_scale));
  } else {
    fail("save: optimizer '", opt.name(), "' is not one mpt can rebuild (SGD, Adam, AdamW, RMSprop, "
         "LossScaleOptimizer); save its weights with save_weights instead");
  }
  return ObjectWriter()
      .str("module", "keras.optimizers")
      .str("class_name", cls)
      .raw("config", c.done())
      .raw("registered_name", "null")
      .done();
}

/// The options Adam and AdamW share.
template <class O>
void read_adam(O& o, const json::Value& c, const std::string& w) {
  read_common(o, c, w);
  o.beta_1 = get_double(c, "beta_1", o.beta_1, w);
  o.beta_2 = get_double(c, "beta_2", o.beta_2, w);
  o.epsilon = get_double(c, "epsilon", o.epsilon, w);
  o.amsgrad = get_bool(c, "amsgrad", o.amsgrad, w);
}

std::shared_ptr<Optimizer> optimizer_from_json(const json::Value& v, const std::string& where) {
  const std::string& cls = v.at("class_name", where).as_string(where + ", class_name");
  const std::string w = where + ", optimizer " + cls;
  const json::Value& c = v.at("config", w);
  if (cls == "SGD") {
    SGDOptions o;
    read_common(o, c, w);
    o.momentum = get_double(c, "momentum", o.momentum, w);
    o.nesterov = get_bool(c, "nesterov", o.nesterov, w);
    return std::make_shared<SGDOptimizer>(o);
  }
  if (cls == "Adam") {
    AdamOptions o;
    read_adam(o, c, w);
    return std::make_shared<AdamOptimizer>(o);
  }
  if (cls == "AdamW") {
    AdamWOptions o;
    read_adam(o, c, w);
    o.weight_decay = get_double(c, "weight_decay", o.weight_decay, w);
    return std::make_shared<AdamWOptimizer>(o);
  }
  if (cls == "RMSprop") {
    RMSpropOptions o;
    read_common(o, c, w);
    o.rho = get_double(c, "rho", o.rho, w);
    o.momentum = get_double(c, "momentum", o.momentum, w);
    o.epsilon = get_double(c, "epsilon", o.epsilon, w);
    o.centered = get_bool(c, "centered", o.centered, w);
    return std::make_shared<RMSpropOptimizer>(o);
  }
  if (cls == "LossScaleOptimizer") {
    mixed_precision::LossScaleOptions o;
    o.initial_scale = get_double(c, "initial_scale", o.initial_scale, w);
    if (const json::Value* g = c.find("dynamic_growth_steps")) o.dynamic_growth_steps = g->as_int(w);
    o.dynamic = get_bool(c, "dynamic", o.dynamic, w);
    if (const json::Value* h = c.find("hysteresis")) o.hysteresis = static_cast<int>(h->as_int(w));
    o.min_scale = get_double(c, "min_scale", o.min_scale, w);
    o.max_scale = get_double(c, "max_scale", o.max_scale, w);
    return std::make_shared<LossScaleOptimizer>(optimizer_from_json(c.at("inner_optimizer", w), w), o);
  }
  fail(w, ": unknown optimizer class (known: SGD, Adam, AdamW, RMSprop, LossScaleOptimizer)");
}

}  // namespace mpt::io
