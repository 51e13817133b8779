// Keras's weight regularizers (L1, L2, L1L2) and constraints (MaxNorm, NonNeg, UnitNorm): the
// arithmetic of keras/src/regularizers and keras/src/constraints, in mpt::ops, and their saved form.
#include "mpt/regularizers.hpp"

#include <cmath>

#include "core/json_util.hpp"
#include "mpt/ops.hpp"

namespace mpt::regularizers {

namespace {

Tensor scalar_like(double v, const Tensor& x) { return Tensor::scalar(v, x.dtype(), x.device()); }

double factor(double v, const char* what) {
  MPT_CHECK(std::isfinite(v) && v >= 0, "regularizers: ", what, " must be a finite number >= 0, got ", v);
  return v;
}

}  // namespace

Tensor Regularizer::operator()(const Tensor& x_in) const {
  const Tensor x = x_in.dtype() == float32 ? x_in : ops::cast(x_in, float32);
  Tensor out = Tensor::scalar(0.0, float32, x.device());
  if (l1 != 0.0) out = ops::add(out, ops::mul(scalar_like(l1, x), ops::sum(ops::abs(x))));
  if (l2 != 0.0) out = ops::add(out, ops::mul(scalar_like(l2, x), ops::sum(ops::square(x))));
  return out;
}

Regularizer L1(double l1) { return {"L1", factor(l1, "l1"), 0.0}; }
Regularizer L2(double l2) { return {"L2", 0.0, factor(l2, "l2")}; }
Regularizer L1L2(double l1, double l2) { return {"L1L2", factor(l1, "l1"), factor(l2, "l2")}; }

nlohmann::json serialize(const std::optional<Regularizer>& r) {
  if (!r) return nullptr;
  nlohmann::json c = nlohmann::json::object();
  if (r->class_name != "L2") c["l1"] = r->l1;
  if (r->class_name != "L1") c["l2"] = r->l2;
  return {{"module", "keras.regularizers"}, {"class_name", r->class_name}, {"config", c}, {"registered_name", nullptr}};
}

std::optional<Regularizer> deserialize(const nlohmann::json& v, const std::string& where) {
  if (v.is_null()) return std::nullopt;
  // Keras also accepts a bare name ("l2"): the class at its default factor.
  if (v.is_string()) {
    const std::string n = v.get<std::string>();
    if (n == "l1" || n == "L1") return L1();
    if (n == "l2" || n == "L2") return L2();
    if (n == "l1_l2" || n == "L1L2") return L1L2();
    fail(where, ": regularizer '", n, "' is not supported (L1, L2, L1L2)");
  }
  const std::string cls = io::as_string(io::at(v, "class_name", where), where + ", class_name");
  const nlohmann::json* c = io::find(v, "config");
  const nlohmann::json cfg = c && c->is_object() ? *c : nlohmann::json::object();
  auto number = [&](const char* key, double fallback) {
    const nlohmann::json* x = io::find(cfg, key);
    return x && !x->is_null() ? io::as_double(*x, where + ", " + key) : fallback;
  };
  const std::string who = where + " (" + cls + ")";
  if (cls == "L1") {
    io::check_fields(cfg, {"l1"}, nlohmann::json::object(), who);
    return L1(number("l1", 0.01));
  }
  if (cls == "L2") {
    io::check_fields(cfg, {"l2"}, nlohmann::json::object(), who);
    return L2(number("l2", 0.01));
  }
  if (cls == "L1L2") {
    io::check_fields(cfg, {"l1", "l2"}, nlohmann::json::object(), who);
    return L1L2(number("l1", 0.0), number("l2", 0.0));
  }
  fail(where, ": regularizer class '", cls, "' is not supported (L1, L2, L1L2)");
}

}  // namespace mpt::regularizers

namespace mpt::constraints {

namespace {

constexpr double kEpsilon = 1e-7;  // Keras's backend.epsilon()

Tensor norms(const Tensor& w, const std::vector<std::int64_t>& axis) {
  return ops::sqrt(ops::sum(ops::square(w), axis, true));
}

std::vector<std::int64_t> checked_axes(std::vector<std::int64_t> axis) {
  MPT_CHECK(!axis.empty(), "constraints: axis must name at least one axis");
  return axis;
}

}  // namespace

Tensor Constraint::operator()(const Tensor& w) const {
  auto s = [&](double v) { return Tensor::scalar(v, w.dtype(), w.device()); };
  for (auto a : axis)
    MPT_CHECK(a >= -w.dim() && a < w.dim(), "constraints: ", class_name, " axis ", a, " is outside a variable of shape ",
              to_string(w.shape()));
  if (class_name == "NonNeg") return ops::mul(w, ops::cast(ops::greater_equal(w, s(0.0)), w.dtype()));
  const Tensor n = norms(w, axis);
  if (class_name == "UnitNorm") return ops::div(w, ops::add(s(kEpsilon), n));
  // MaxNorm: w · clip(norms, 0, max_value) / (epsilon + norms)
  const Tensor desired = ops::minimum(ops::maximum(n, s(0.0)), s(max_value));
  return ops::mul(w, ops::div(desired, ops::add(s(kEpsilon), n)));
}

Constraint MaxNorm(double max_value, std::vector<std::int64_t> axis) {
  MPT_CHECK(std::isfinite(max_value) && max_value >= 0, "constraints: MaxNorm max_value must be a finite number >= 0, got ",
            max_value);
  return {"MaxNorm", max_value, checked_axes(std::move(axis))};
}
Constraint NonNeg() { return {"NonNeg", 0.0, {0}}; }
Constraint UnitNorm(std::vector<std::int64_t> axis) { return {"UnitNorm", 0.0, checked_axes(std::move(axis))}; }

nlohmann::json serialize(const std::optional<Constraint>& c) {
  if (!c) return nullptr;
  nlohmann::json cfg = nlohmann::json::object();
  const nlohmann::json axis = c->axis.size() == 1 ? nlohmann::json(c->axis[0]) : nlohmann::json(c->axis);
  if (c->class_name == "MaxNorm") cfg = {{"max_value", c->max_value}, {"axis", axis}};
  if (c->class_name == "UnitNorm") cfg = {{"axis", axis}};
  return {{"module", "keras.constraints"}, {"class_name", c->class_name}, {"config", cfg}, {"registered_name", nullptr}};
}

std::optional<Constraint> deserialize(const nlohmann::json& v, const std::string& where) {
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) {
    const std::string n = v.get<std::string>();
    if (n == "max_norm" || n == "MaxNorm") return MaxNorm();
    if (n == "non_neg" || n == "NonNeg") return NonNeg();
    if (n == "unit_norm" || n == "UnitNorm") return UnitNorm();
    fail(where, ": constraint '", n, "' is not supported (MaxNorm, NonNeg, UnitNorm)");
  }
  const std::string cls = io::as_string(io::at(v, "class_name", where), where + ", class_name");
  const nlohmann::json* c = io::find(v, "config");
  const nlohmann::json cfg = c && c->is_object() ? *c : nlohmann::json::object();
  const std::string who = where + " (" + cls + ")";
  auto axes = [&] {
    const nlohmann::json* a = io::find(cfg, "axis");
    if (!a || a->is_null()) return std::vector<std::int64_t>{0};
    if (a->is_number()) return std::vector<std::int64_t>{io::as_int(*a, where + ", axis")};
    std::vector<std::int64_t> out;
    for (const auto& x : io::as_array(*a, where + ", axis")) out.push_back(io::as_int(x, where + ", axis"));
    return out;
  };
  if (cls == "MaxNorm") {
    io::check_fields(cfg, {"max_value", "axis"}, nlohmann::json::object(), who);
    const nlohmann::json* m = io::find(cfg, "max_value");
    return MaxNorm(m && !m->is_null() ? io::as_double(*m, where + ", max_value") : 2.0, axes());
  }
  if (cls == "NonNeg") {
    io::check_fields(cfg, {}, nlohmann::json::object(), who);
    return NonNeg();
  }
  if (cls == "UnitNorm") {
    io::check_fields(cfg, {"axis"}, nlohmann::json::object(), who);
    return UnitNorm(axes());
  }
  fail(where, ": constraint class '", cls, "' is not supported (MaxNorm, NonNeg, UnitNorm)");
}

}  // namespace mpt::constraints
