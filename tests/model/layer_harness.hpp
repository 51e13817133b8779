#pragma once
// The layer harness every layer goes through (as Keras's run_layer_test): output shape, output
// dtype = compute dtype under each policy, float32 variables under mixed policies, the config
// round trip (layer_from_config of its config(), given the same weights, computes the same
// output: the registration load_model uses), and the gradients w.r.t. input and every variable
// against central finite differences in float64.
#include <functional>

#include "test_util.hpp"

namespace mpt::test {

struct LayerCase {
  std::string what;
  std::function<LayerRef()> make;  ///< a fresh layer under the current global policy
  Shape input_shape;               ///< with batch dimension
  Shape expected_output_shape;
  double lo = -1.5, hi = 1.5;      ///< input range (keep away from kinks)
  bool training = false;
  bool check_grads = true;
  bool check_config = true;  ///< the config round trip (needs the class registered for load_model)
};

inline void run_layer_test(const LayerCase& c) {
  using mixed_precision::Policy;
  const Policy saved = mixed_precision::global_policy();
  for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16", "bfloat16"}) {
    CAPTURE(policy);
    mixed_precision::set_global_policy(policy);
    LayerRef layer = c.make();
    Policy p(policy);
    Tensor x = random(c.input_shape, float32, Device::cpu(), 1, c.lo, c.hi);
    Tensor y = layer(x, {.training = c.training});
    CHECK_MESSAGE(y.shape() == c.expected_output_shape, c.what, ": output shape ", to_string(y.shape()));
    CHECK_MESSAGE(y.dtype() == p.compute_dtype(), c.what, " under ", policy, ": output ", to_string(y.dtype()));
    for (const auto& v : layer->variables())
      CHECK_MESSAGE(v.dtype() == p.variable_dtype(), c.what, ": variable ", v.path(), " is ", to_string(v.dtype()));
    CHECK(layer->output_shape() == y.shape());
    if (!c.training && c.check_config) {
      LayerRef back = layer_from_config(
          {layer->class_name(), layer->name(), p, layer->trainable(), layer->config()});
      back(x);  // build
      auto from = layer->variables(), to = back->variables();
      REQUIRE_MESSAGE(from.size() == to.size(), c.what, ": config round trip changed the variables");
      for (std::size_t i = 0; i < from.size(); ++i) to[i].assign(from[i].value());
      CHECK_MESSAGE(ops::cast(back(x), float64).to_vector<double>() == ops::cast(y, float64).to_vector<double>(),
                    c.what, ": the layer rebuilt from its config computes something else");
    }
    // Gradients reach every trainable variable in its own (float32 under mixed) dtype.
    GradientTape tape;
    Tensor out = layer(x, {.training = c.training});
    auto grads = tape.gradient(ops::sum(ops::cast(out, float32)), layer->trainable_variables());
    auto vars = layer->trainable_variables();
    for (std::size_t i = 0; i < vars.size(); ++i) {
      REQUIRE_MESSAGE(grads[i].defined(), c.what, ": no gradient for ", vars[i].path());
      CHECK(grads[i].dtype() == vars[i].dtype());
    }
  }
  if (c.check_grads) {
    mixed_precision::set_global_policy("float64");
    LayerRef layer = c.make();
    Tensor x = random(c.input_shape, float64, Device::cpu(), 2, c.lo, c.hi);
    layer(x, {.training = c.training});  // build
    auto vars = layer->trainable_variables();
    Tensor weights = Tensor::random_uniform(c.expected_output_shape, 0.5, 1.5, 3, float64, Device::cpu());
    auto objective = [&]() { return ops::sum(ops::mul(layer(x, {.training = c.training}), weights)); };
    std::vector<Tensor> sources{x};
    for (const auto& v : vars) sources.push_back(v.value());
    std::vector<Tensor> analytic;
    {
      GradientTape tape;
      tape.watch(x);
      analytic = tape.gradient(objective(), sources);
    }
    const double eps = 1e-6;
    for (std::size_t k = 0; k < sources.size(); ++k) {
      Tensor target = k == 0 ? x : vars[k - 1].value();
      std::vector<double> values = target.to_vector<double>(), numeric(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) {
        auto eval = [&](double v) {
          auto changed = values;
          changed[i] = v;
          target.assign(Tensor::from_vector(changed, target.shape(), target.device()));
          if (k > 0) vars[k - 1].mark_modified();
          double r = objective().item();
          target.assign(Tensor::from_vector(values, target.shape(), target.device()));
          if (k > 0) vars[k - 1].mark_modified();
          return r;
        };
        numeric[i] = (eval(values[i] + eps) - eval(values[i] - eps)) / (2 * eps);
      }
      REQUIRE_MESSAGE(analytic[k].defined(), c.what, ": no gradient for source ", k);
      check_close(analytic[k], numeric, {1e-5, 1e-7},
                  c.what + (k == 0 ? std::string(": d/dinput") : ": d/d" + vars[k - 1].path()));
    }
  }
  mixed_precision::set_global_policy(saved);
}

}  // namespace mpt::test
