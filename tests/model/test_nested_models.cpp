// A model used as a layer of another (Keras's nested models, fine-tuning a loaded base): the same
// values as the flat model with the same weights, gradients into the inner weights, freezing
// (trainable = false) through fit, save / load both formats, summary and errors.
#include <algorithm>
#include <bit>
#include <sstream>

#include "io/checkpoint_util.hpp"
#include "test_util.hpp"

using namespace mpt;
namespace layers = mpt::layers;
using test::error_of;

namespace {

/// Input(4) -> Dense(8, relu) -> Dense(3): the base to fine-tune.
std::shared_ptr<Model> functional_base() {
  auto in = mpt::Input({4});
  auto h = layers::Dense(8, {.activation = "relu"})(in);
  return std::make_shared<Model>(in, layers::Dense(3)(h), "base");
}

std::shared_ptr<Sequential> sequential_base() {
  return std::make_shared<Sequential>(std::vector<LayerRef>{layers::Input({4}), layers::Dense(8, {.activation = "relu"}),
                                                            layers::Dense(3)});
}

/// Input -> base -> Dense(2), functional.
std::shared_ptr<Model> functional_outer(const std::shared_ptr<Model>& base) {
  auto in = mpt::Input({4});
  auto y = (*base)(in);
  return std::make_shared<Model>(in, layers::Dense(2)(y), "outer");
}

/// The flat model: the base's layers then the head, with the nested model's weights.
std::unique_ptr<Sequential> flat_copy(const Model& nested) {
  auto flat = std::make_unique<Sequential>(std::vector<LayerRef>{
      layers::Input({4}), layers::Dense(8, {.activation = "relu"}), layers::Dense(3), layers::Dense(2)});
  flat->set_weights(nested.get_weights());
  return flat;
}

std::vector<double> host(const Tensor& t) { return t.to(Device::cpu()).to(float32).to_vector<double>(); }

bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (host(a[i]) != host(b[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("a nested model computes what the flat model with the same weights does") {
  test::for_each_device([](Device dev) {
    for (const char* policy : {"float32", "mixed_bfloat16"}) {
      CAPTURE(policy);
      test::PolicyDeviceScope scope(policy, dev);
      set_random_seed(11);
      const Tensor x = Tensor::random_uniform({6, 4}, -1, 1, 2, float32, dev);
      for (int kind = 0; kind < 4; ++kind) {
        CAPTURE(kind);
        std::shared_ptr<Model> base = kind % 2 ? std::shared_ptr<Model>(sequential_base()) : functional_base();
        std::shared_ptr<Model> outer =
            kind < 2 ? functional_outer(base)
                     : std::shared_ptr<Model>(std::make_shared<Sequential>(
                           std::vector<LayerRef>{layers::Input({4}), base, layers::Dense(2)}));
        // The nested model is one layer; its variables come first, then the head's.
        REQUIRE(outer->layers().size() == 2);
        CHECK(outer->layers()[0]->class_name() == (kind % 2 ? "Sequential" : "Functional"));
        CHECK(detail::nested_model(*outer->layers()[0]) == base);
        CHECK(outer->variables().size() == 6);
        CHECK(outer->trainable_variables().size() == 6);
        CHECK(outer->count_params() == 4 * 8 + 8 + 8 * 3 + 3 + 3 * 2 + 2);
        // Distinct paths: the base's under its layer name.
        CHECK(outer->variables()[0].path() == outer->layers()[0]->name() + "/dense/kernel");
        CHECK(outer->variables()[4].path() == "dense/kernel");
        auto flat = flat_copy(*outer);
        const Tensor got = outer->predict(x), want = flat->predict(x);
        CHECK(host(got) == host(want));  // the same operations in the same order
        // Training mode and the base alone agree too.
        CHECK(host((*outer)(x, {.training = true})) == host((*flat)(x, {.training = true})));
        CHECK(host(base->predict(x)) == host(flat->layers()[1]((flat->layers()[0])(x))));
      }
    }
  });
}

TEST_CASE("compile forces the softmax that ends a nested model to float32 under mixed policies") {
  // Input(4) -> Dense(8, relu) -> head, the head a model ending in a softmax (an Activation, a
  // Softmax layer or a Dense with softmax), nested one or two models deep: compile switches that
  // softmax to float32, so the probabilities are not rounded to 16 bits, and equals the flat model.
  test::for_each_device([](Device dev) {
    for (const char* policy : {"mixed_bfloat16", "mixed_float16"}) {
      CAPTURE(policy);
      test::PolicyDeviceScope scope(policy, dev);
      const Tensor x = Tensor::random_uniform({16, 4}, -2, 2, 3, float32, dev);
      for (int kind = 0; kind < 3; ++kind) {
        for (int depth = 1; depth <= 2; ++depth) {
          CAPTURE(kind);
          CAPTURE(depth);
          set_random_seed(17);
          auto final_softmax = [&]() -> LayerRef {
            return kind == 0 ? LayerRef(layers::Activation("softmax")) : LayerRef(layers::Softmax());
          };
          std::shared_ptr<Model> head;
          LayerRef last;
          if (kind < 2) {
            last = final_softmax();
            head = std::make_shared<Sequential>(std::vector<LayerRef>{layers::Input({8}), layers::Dense(5), last});
          } else {  // functional, its output a Dense with softmax
            auto in = mpt::Input({8});
            last = layers::Dense(5, {.activation = "softmax"});
            head = std::make_shared<Model>(in, last(in), "head");
          }
          std::shared_ptr<Model> inner = head;
          if (depth == 2) {
            auto in = mpt::Input({8});
            inner = std::make_shared<Model>(in, (*head)(in), "middle");
          }
          Sequential outer({layers::Input({4}), layers::Dense(8, {.activation = "relu"}), inner});
          REQUIRE(last->dtype_policy().name() == policy);
          outer.compile({.optimizer = "sgd", .loss = "categorical_crossentropy"});
          CHECK(last->dtype_policy().name() == "float32");
          CHECK(outer.layers()[0]->dtype_policy().name() == policy);  // only the softmax switches
          const Tensor got = outer.predict(x);
          CHECK(got.dtype() == float32);
          // Float32 probabilities: some carry bits below a 16-bit mantissa (float16 keeps 10 bits).
          const std::vector<float> p = got.to(Device::cpu()).to_vector<float>();
          CHECK(std::any_of(p.begin(), p.end(), [](float v) { return (std::bit_cast<std::uint32_t>(v) & 0x1fffu) != 0; }));
          // The flat model with the same weights, its own softmax forced by compile: the same bits.
          Sequential flat({layers::Input({4}), layers::Dense(8, {.activation = "relu"}),
                           kind < 2 ? layers::Dense(5) : layers::Dense(5, {.activation = "softmax"})});
          if (kind < 2) flat.add(final_softmax());
          flat.compile({.optimizer = "sgd", .loss = "categorical_crossentropy"});
          flat.set_weights(outer.get_weights());
          CHECK(host(flat.predict(x)) == host(got));
        }
      }
    }
  });
}

TEST_CASE("gradients reach the nested model's weights (float64 finite differences)") {
  test::PolicyDeviceScope scope("float64", Device::cpu());
  set_random_seed(5);
  auto base = functional_base();
  auto outer = functional_outer(base);
  const Tensor x = Tensor::random_uniform({3, 4}, -1, 1, 7, float64);
  auto vars = outer->trainable_variables();
  REQUIRE(vars.size() == 6);
  auto loss = [&] { return ops::sum(ops::square((*outer)(x, {.training = true}))); };
  std::vector<Tensor> analytic;
  {
    GradientTape tape;
    analytic = tape.gradient(loss(), vars);
  }
  const double eps = 1e-6;
  for (std::size_t k = 0; k < vars.size(); ++k) {
    CAPTURE(vars[k].path());
    REQUIRE(analytic[k].defined());
    CHECK(analytic[k].dtype() == float64);
    const std::vector<double> values = vars[k].value().to_vector<double>();
    std::vector<double> numeric(values.size());
    NoGradGuard no_grad;
    for (std::size_t i = 0; i < values.size(); ++i) {
      auto at = [&](double v) {
        std::vector<double> changed = values;
        changed[i] = v;
        vars[k].assign(Tensor::from_vector(changed, vars[k].shape()));
        return loss().item();
      };
      numeric[i] = (at(values[i] + eps) - at(values[i] - eps)) / (2 * eps);
    }
    vars[k].assign(Tensor::from_vector(values, vars[k].shape()));
    test::check_close(analytic[k], numeric, test::kGradTolerance, "d loss / d " + vars[k].path());
  }
}

TEST_CASE("a frozen nested model stays bit-identical through fit while the head trains") {
  test::for_each_device([](Device dev) {
    for (const char* policy : {"float32", "mixed_bfloat16"}) {
      CAPTURE(policy);
      test::PolicyDeviceScope scope(policy, dev);
      set_random_seed(21);
      // A base with BatchNormalization: frozen, it runs in inference mode (Keras 3) and keeps
      // its moving statistics.
      auto in = mpt::Input({4});
      auto h = layers::BatchNormalization()(layers::Dense(8, {.activation = "relu"})(in));
      std::shared_ptr<Model> base = std::make_shared<Model>(in, layers::Dense(3)(h), "base");
      auto outer = std::make_shared<Sequential>(std::vector<LayerRef>{layers::Input({4}), base, layers::Dense(2)});
      const Tensor x = Tensor::random_uniform({64, 4}, -1, 1, 3, float32, dev);
      const Tensor y = Tensor::random_uniform({64, 2}, -1, 1, 4, float32, dev);

      base->set_trainable(false);  // Keras's base_model.trainable = False
      CHECK_FALSE(base->trainable());
      CHECK_FALSE(outer->layers()[0]->trainable());
      CHECK(base->trainable_variables().empty());
      REQUIRE(outer->trainable_variables().size() == 2);  // the head's kernel and bias
      CHECK(outer->trainable_variables()[0].path() == "dense/kernel");
      CHECK(outer->non_trainable_variables().size() == 8);
      // In inference mode inside: training=true gives the inference output.
      CHECK(host((*outer)(x, {.training = true})) == host((*outer)(x, {.training = false})));
      outer->compile({.optimizer = optimizers::Adam({.learning_rate = 0.01}), .loss = "mse"});
      const auto inner_before = base->get_weights();
      const auto head_before = outer->layers()[1]->variables();
      const std::vector<double> head_kernel = host(head_before[0].value());
      auto hist = outer->fit(x, y, {.batch_size = 16, .epochs = 3, .verbose = 0});
      CHECK(hist.history["loss"].back() < hist.history["loss"].front());
      CHECK(same_bits(base->get_weights(), inner_before));
      CHECK(host(head_before[0].value()) != head_kernel);

      // trainable = true again: compile sees every variable (BatchNormalization's moving
      // statistics stay non-trainable), and fit moves the base.
      base->set_trainable(true);
      CHECK(outer->trainable_variables().size() == 2 + 6);
      CHECK(outer->non_trainable_variables().size() == 2);
      outer->compile({.optimizer = optimizers::Adam({.learning_rate = 0.01}), .loss = "mse"});
      outer->fit(x, y, {.batch_size = 16, .epochs = 1, .verbose = 0});
      CHECK_FALSE(same_bits(base->get_weights(), inner_before));
    }
  });
}

TEST_CASE("nested models save and load: .keras and .weights.h5") {
  test::ScratchDir dir("nested");
  set_random_seed(8);
  const Tensor x = Tensor::random_uniform({5, 4}, -1, 1, 9);
  for (int kind = 0; kind < 2; ++kind) {
    CAPTURE(kind);
    std::shared_ptr<Model> base = kind ? std::shared_ptr<Model>(sequential_base()) : functional_base();
    auto outer = functional_outer(base);
    base->set_trainable(false);
    outer->compile({.optimizer = "adam", .loss = "mse"});
    outer->fit(x, Tensor::zeros({5, 2}), {.batch_size = 5, .epochs = 2, .verbose = 0});
    const Tensor want = outer->predict(x);

    const std::string keras = dir / std::string("nested").append(std::to_string(kind)).append(".keras");
    outer->save(keras);
    std::shared_ptr<Model> loaded = load_model(keras);
    REQUIRE(loaded->layers().size() == 2);
    auto inner = detail::nested_model(*loaded->layers()[0]);
    REQUIRE(inner != nullptr);
    CHECK(loaded->layers()[0]->class_name() == (kind ? "Sequential" : "Functional"));
    CHECK_FALSE(inner->trainable());
    CHECK(loaded->trainable_variables().size() == 2);
    CHECK(host(loaded->predict(x)) == host(want));
    CHECK(same_bits(loaded->get_weights(), outer->get_weights()));
    // The optimizer state came back too: one more step gives the same weights.
    outer->train_on_batch(x, Tensor::ones({5, 2}));
    loaded->train_on_batch(x, Tensor::ones({5, 2}));
    CHECK(same_bits(loaded->get_weights(), outer->get_weights()));

    // Its base alone, unfrozen, still works as a model of its own.
    inner->set_trainable(true);
    CHECK(inner->trainable_variables().size() == 4);

    const std::string weights = dir / std::string("nested").append(std::to_string(kind)).append(".weights.h5");
    outer->save_weights(weights);
    set_random_seed(99);
    auto fresh_base = kind ? std::shared_ptr<Model>(sequential_base()) : functional_base();
    auto fresh = functional_outer(fresh_base);
    CHECK_FALSE(same_bits(fresh->get_weights(), outer->get_weights()));
    fresh->load_weights(weights);
    CHECK(same_bits(fresh->get_weights(), outer->get_weights()));
    // The legacy Keras 2 layout has no nested groups: refused by name.
    CHECK(test::contains(error_of([&] { outer->save_weights(dir / "legacy.h5"); }), "Keras 3's layout"));
  }
}

TEST_CASE("summary prints a nested model as one layer") {
  auto base = functional_base();
  auto outer = functional_outer(base);
  base->set_trainable(false);
  std::ostringstream os;
  outer->summary(os);
  const std::string s = os.str();
  CAPTURE(s);
  CHECK(test::contains(s, "base (Functional)"));
  CHECK(test::contains(s, "(None, 3)"));
  CHECK(test::contains(s, "67"));  // the base's parameters in its one row
  CHECK_FALSE(test::contains(s, "dense_1"));
  CHECK(test::contains(s, "Non-trainable params: 67"));
  std::ostringstream seq;
  Sequential({layers::Input({4}), sequential_base(), layers::Dense(2)}).summary(seq);
  CHECK(test::contains(seq.str(), "sequential (Sequential)"));
}

TEST_CASE("nested model errors name the model and what it got") {
  // Not owned by a shared_ptr: no layer can hold it.
  auto in = mpt::Input({4});
  Model on_stack(in, layers::Dense(3)(in), "on_stack");
  CHECK(test::contains(error_of([&] { (void)on_stack(mpt::Input({4})); }), "std::shared_ptr"));
  // An input the base does not take.
  auto base = functional_base();
  const std::string wrong = error_of([&] { (void)(*base)(mpt::Input({5})); });
  CHECK(test::contains(wrong, "Functional 'base'"));
  CHECK(test::contains(wrong, "(None, 4)"));
  // A model in itself.
  auto seq = std::make_shared<Sequential>(std::vector<LayerRef>{layers::Input({4}), layers::Dense(4)});
  CHECK(test::contains(error_of([&] { seq->add(seq); }), "cannot be a layer of itself"));
  // Several outputs.
  auto a = mpt::Input({4});
  auto two = std::make_shared<Model>(std::vector<KerasTensor>{a},
                                     std::vector<KerasTensor>{layers::Dense(2)(a), layers::Dense(3)(a)}, "two");
  CHECK(test::contains(error_of([&] { (void)two->as_layer(); }), "2 outputs"));
  // The same model twice in one Sequential.
  auto once = functional_base();
  CHECK(test::contains(error_of([&] { Sequential({layers::Input({4}), once, once}); }), "already in the model"));
}
