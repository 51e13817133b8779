// The optimizers against Keras 3: 20-step trajectories of every optimizer with weight decay,
// EMA, gradient accumulation and clipping, recorded by tests/interop/record_keras_optimizers.py
// (tests/data/keras_optimizers.json), on every device; the optimizers built from Keras's own
// configs. Then what the trajectories cannot show: accumulation equals one step of the whole
// batch, a LossScaleOptimizer makes one skip-or-apply decision per accumulation window, the new
// optimizers train under every policy, SwapEMAWeights, and the optimizers' errors.
#include <cmath>
#include <fstream>

#include <mpt/optim_ops.hpp>
#include <nlohmann/json.hpp>

#include "io/optimizer_io.hpp"
#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;
namespace opt = mpt::optimizers;
namespace layers = mpt::layers;

namespace {

const nlohmann::json& recorded() {
  static const nlohmann::json j = [] {
    std::ifstream in(test::test_data("keras_optimizers.json"));
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return j;
}

std::vector<float> floats(const nlohmann::json& j) { return j.get<std::vector<float>>(); }

/// |a - b| <= 1e-6 |b| (+ 1e-7 for values near 0), element by element.
void check_relative(const Tensor& got, const std::vector<float>& want, const std::string& what) {
  const std::vector<float> g = got.to(Device::cpu()).to(float32).to_vector<float>();
  REQUIRE(g.size() == want.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double err = std::abs(static_cast<double>(g[i]) - want[i]) / (std::abs(static_cast<double>(want[i])) + 0.1);
    if (err > worst) worst = err, at = i;
  }
  INFO(what, ": element ", at, " is ", g[at], ", Keras ", want[at]);
  CHECK(worst <= 1e-6);
}

/// The recorded gradient of call t: 0.5 * (w - target) + noise[t], in float32 as the script.
Tensor gradient(const Variable& v, const std::string& name, int t, Device dev) {
  const auto& r = recorded();
  const std::vector<float> w = v.value().to(Device::cpu()).to_vector<float>();
  const std::vector<float> target = floats(r["target"][name]), noise = floats(r["noise"][t][name]);
  std::vector<float> g(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    const float d = w[i] - target[i];
    const float h = 0.5f * d;
    g[i] = h + noise[i];
  }
  return Tensor::from_vector(g, v.shape()).to(dev);
}

}  // namespace

TEST_CASE("every optimizer follows Keras's 20-step trajectory (decay, EMA, accumulation, clipping) to 1e-6") {
  for_each_device([](Device dev) {
    const auto& r = recorded();
    const int steps = r["steps"].get<int>();
    for (auto it = r["cases"].begin(); it != r["cases"].end(); ++it) {
      const std::string name = it.key();
      const nlohmann::json& c = it.value();
      CAPTURE(name);
      // Built from the config Keras wrote: every field read (and the reader refuses none).
      auto o = io::optimizer_from_json({{"class_name", c["class_name"]}, {"config", c["config"]}}, name);
      if (c.contains("extra")) o->exclude_from_weight_decay(c["extra"]["exclude"].get<std::vector<std::string>>());
      Variable kernel(Tensor::from_vector(floats(r["init"]["kernel"]), {4, 3}).to(dev), "kernel");
      Variable bias(Tensor::from_vector(floats(r["init"]["bias"]), {3}).to(dev), "bias");
      kernel.set_path("dense/kernel");
      bias.set_path("dense/bias");
      const std::vector<Variable> vars{kernel, bias};
      o->build(vars);
      for (int t = 0; t < steps; ++t) {
        CAPTURE(t);
        o->apply_gradients({gradient(kernel, "kernel", t, dev), gradient(bias, "bias", t, dev)}, vars);
        const auto& want = c["steps"][t];
        check_relative(kernel.value(), floats(want["kernel"]), name + " kernel");
        check_relative(bias.value(), floats(want["bias"]), name + " bias");
        CHECK(o->iterations() == want["iterations"].get<std::int64_t>());
      }
      if (c.contains("finalized")) {
        o->finalize_variable_values(vars);
        check_relative(kernel.value(), floats(c["finalized"]["kernel"]), name + " finalized kernel");
        check_relative(bias.value(), floats(c["finalized"]["bias"]), name + " finalized bias");
      }
      // The config mpt writes is Keras's (the fields Keras wrote, with their values).
      const auto mine = io::optimizer_to_json(*o, true)["config"];
      for (auto f = c["config"].begin(); f != c["config"].end(); ++f) {
        const std::string k = f.key();
        const nlohmann::json& v = f.value();
        if (k == "name") continue;  // Keras numbers its auto names (nadam_1, ...)
        CAPTURE(k);
        REQUIRE(mine.contains(k));
        if (v.is_number_float()) CHECK(mine[k].get<double>() == doctest::Approx(v.get<double>()).epsilon(1e-7));
        else CHECK(mine[k] == v);
      }
    }
  });
}
