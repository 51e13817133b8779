#include "mpt/layers/layer.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <regex>

#include "mpt/autograd.hpp"
#include "mpt/ops.hpp"

namespace mpt {

namespace {
std::atomic<std::uint64_t> g_seed{0x5eed};
std::atomic<std::uint64_t> g_seed_counter{0};
}  // namespace

void set_random_seed(std::uint64_t seed) {
  g_seed = seed;
  g_seed_counter = 0;
}

std::uint64_t detail::next_seed() { return g_seed.load() * 1000003ull + g_seed_counter++; }

std::pair<std::uint64_t, std::uint64_t> detail::seed_state() { return {g_seed.load(), g_seed_counter.load()}; }

void detail::set_seed_state(std::uint64_t seed, std::uint64_t counter) {
  g_seed = seed;
  g_seed_counter = counter;
}

std::string batch_shape_string(const Shape& per_example) {
  std::string out = "(None";
  for (auto d : per_example) out += ", " + std::to_string(d);
  return out + ")";
}

std::string to_snake_case(const std::string& s) {
  // Keras's naming.to_snake_case, step for step, so that names and object paths match Keras's.
  static const std::regex non_word(R"(\W+)"), word(R"((.)([A-Z][a-z]+))"), lower_upper(R"(([a-z])([A-Z]))");
  std::string out = std::regex_replace(s, non_word, "");
  out = std::regex_replace(out, word, "$1_$2");
  out = std::regex_replace(out, lower_upper, "$1_$2");
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

Layer::Layer(std::string class_name, std::optional<mixed_precision::Policy> dtype, std::string name)
    : class_name_(std::move(class_name)),
      name_(name.empty() ? to_snake_case(class_name_) : name),
      user_name_(!name.empty()),
      policy_(dtype ? *dtype : mixed_precision::global_policy()) {}

void Layer::set_name(const std::string& name) {
  name_ = name;
  for (auto& v : variables_) v.set_path(name_ + "/" + v.name());
}

void Layer::set_trainable(bool on) {
  trainable_ = on;
  for (std::size_t i = 0; i < variables_.size(); ++i)
    variables_[i].set_trainable(on && (i >= created_trainable_.size() || created_trainable_[i]));
}

Tensor Layer::cast_input(const Tensor& x) const {
  if (!x.defined()) error("undefined input tensor");
  return autocast() && is_floating(x.dtype()) && x.dtype() != compute_dtype() ? ops::cast(x, compute_dtype()) : x;
}

void Layer::check_device(const Tensor& x) const {
  if (!x.defined() || variables_.empty()) return;
  const Device d = variables_.front().value().device();
  if (x.device() != d)
    error("input on ", x.device().str(), " but the layer's variables are on ", d.str(), "; move the input with .to(",
          d.is_cpu() ? std::string("mpt::Device::cpu()") : "the model's device", ")");
}

Tensor Layer::operator()(const Tensor& x_in, CallOptions options) {
  check_device(x_in);
  Tensor x = cast_input(x_in);
  if (!built_) {
    input_shape_ = x.shape();
    build(x.shape());
    built_ = true;
  }
  Tensor y = call(x, options.training);
  output_shape_ = y.shape();
  record_activity(y);
  return y;
}

void Layer::record_activity(const Tensor& y) {
  if (!activity_regularizer_) return;
  Tensor loss = (*activity_regularizer_)(y);
  if (y.dim() > 0 && y.shape()[0] > 0)  // Keras 3: normalized by the batch size
    loss = ops::div(loss, Tensor::scalar(static_cast<double>(y.shape()[0]), float32, loss.device()));
  activity_losses_.push_back(loss);
}

namespace {
bool names_variable(const std::string& variable_name, const std::string& key) {
  return variable_name == key || (variable_name.size() > key.size() &&
                                  variable_name.compare(variable_name.size() - key.size() - 1, std::string::npos,
                                                        "/" + key) == 0);
}
}  // namespace

void Layer::set_rules(const std::string& variable, std::optional<regularizers::Regularizer> r,
                      std::optional<constraints::Constraint> c, const std::string& config_key) {
  std::erase_if(rules_, [&](const Rules& e) { return e.variable == variable; });
  rules_.push_back({variable, config_key.empty() ? variable : config_key, std::move(r), std::move(c)});
}

nlohmann::json Layer::rules_config() const {
  nlohmann::json c = nlohmann::json::object();
  for (const auto& r : rules_) {
    c[r.config_key + "_regularizer"] = regularizers::serialize(r.regularizer);
    c[r.config_key + "_constraint"] = constraints::serialize(r.constraint);
  }
  if (has_activity_rule_) c["activity_regularizer"] = regularizers::serialize(activity_regularizer_);
  return c;
}

void Layer::set_rules_from(const LayerConfig& config) {
  for (auto& r : rules_) {
    r.regularizer = config.get_regularizer(r.config_key + "_regularizer");
    r.constraint = config.get_constraint(r.config_key + "_constraint");
  }
  if (has_activity_rule_) activity_regularizer_ = config.get_regularizer("activity_regularizer");
}

std::vector<Tensor> Layer::losses() const {
  std::vector<Tensor> out;
  for (const auto& v : variables_) {
    if (!v.trainable()) continue;
    for (const auto& r : rules_)
      if (r.regularizer && names_variable(v.name(), r.variable)) out.push_back((*r.regularizer)(v.value()));
  }
  out.insert(out.end(), activity_losses_.begin(), activity_losses_.end());
  return out;
}

void Layer::apply_constraints() {
  NoGradGuard no_grad;
  for (auto& v : variables_) {
    if (!v.trainable()) continue;
    for (const auto& r : rules_)
      if (r.constraint && names_variable(v.name(), r.variable)) v.assign((*r.constraint)(v.value()));
  }
}

Tensor Layer::operator()(const std::vector<Tensor>& xs_in, CallOptions options) {
  if (xs_in.size() == 1) return (*this)(xs_in[0], options);
  std::vector<Tensor> xs;
  std::vector<Shape> shapes;
  for (const auto& x : xs_in) {
    check_device(x);
    xs.push_back(cast_input(x));
    shapes.push_back(xs.back().shape());
  }
  if (!built_) {
    if (!shapes.empty()) input_shape_ = shapes[0];
    build_multi(shapes);
    built_ = true;
  }
  Tensor y = call_multi(xs, options.training);
  output_shape_ = y.shape();
  record_activity(y);
  return y;
}

void Layer::build_multi(const std::vector<Shape>& shapes) { error("takes one input, got ", shapes.size()); }

Tensor Layer::call_multi(const std::vector<Tensor>& xs, bool) { error("takes one input, got ", xs.size()); }

std::vector<Variable> Layer::trainable_variables() const {
  std::vector<Variable> out;
  for (const auto& v : variables())
    if (v.trainable()) out.push_back(v);
  return out;
}

std::vector<Variable> Layer::non_trainable_variables() const {
  std::vector<Variable> out;
  for (const auto& v : variables())
    if (!v.trainable()) out.push_back(v);
  return out;
}

std::int64_t Layer::count_params() const {
  std::int64_t n = 0;
  for (const auto& v : variables()) n += v.numel();
  return n;
}

Variable Layer::add_weight(const std::string& name, const Shape& shape, const initializers::Initializer& initializer,
                           bool trainable) {
  Variable v(initializer(shape, variable_dtype(), detail::next_seed()), name, trainable && trainable_);
  v.set_path(name_ + "/" + name);
  variables_.push_back(v);
  created_trainable_.push_back(trainable);
  return v;
}

void Layer::check_input(const Tensor& x, std::int64_t min_rank, std::int64_t last_dim) const {
  if (x.dim() < min_rank)
    error("expected an input of rank >= ", min_rank, " (batch dimension included), got shape ",
          to_string(x.shape()));
  if (last_dim >= 0 && x.shape().back() != last_dim)
    error("expected the last input dimension to be ", last_dim, ", got input shape ", to_string(x.shape()));
}

}  // namespace mpt
