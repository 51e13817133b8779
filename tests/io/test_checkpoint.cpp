// Checkpoints: the Keras 3 and legacy Keras 2 HDF5 layouts (checked with the HDF5 C API),
// 16-bit exports, round trips of every core layer and optimizer under every policy, exact
// resume, mismatch errors, crash safety under SIGKILL, and ModelCheckpoint.
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

#include "io/checkpoint_util.hpp"

using namespace mpt;
using mpt::test::error_of;
using mpt::test::contains;
using namespace mpt::test;
namespace layers = mpt::layers;

namespace {

/// Read-only HDF5 access for the layout checks (the test's own, independent of mpt's wrapper).
struct H5 {
  hid_t file;
  explicit H5(const std::string& path) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    REQUIRE_MESSAGE(file >= 0, "HDF5 cannot open ", path);
  }
  ~H5() { H5Fclose(file); }
  bool exists(const std::string& p) const {
    std::string prefix;
    for (std::size_t start = 1; start <= p.size();) {
      std::size_t slash = p.find('/', start);
      prefix = p.substr(0, slash);
      if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
      if (slash == std::string::npos) return true;
      start = slash + 1;
    }
    return true;
  }
  H5O_type_t type(const std::string& p) const {
    H5O_info_t info;
    REQUIRE(H5Oget_info_by_name(file, p.c_str(), &info, H5P_DEFAULT) >= 0);
    return info.type;
  }
  std::size_t count(const std::string& group) const {
    hid_t g = H5Gopen2(file, group.c_str(), H5P_DEFAULT);
    REQUIRE(g >= 0);
    H5G_info_t info;
    H5Gget_info(g, &info);
    H5Gclose(g);
    return info.nlinks;
  }
  Shape shape(const std::string& p) const {
    hid_t d = H5Dopen2(file, p.c_str(), H5P_DEFAULT);
    REQUIRE_MESSAGE(d >= 0, "no dataset ", p);
    hid_t s = H5Dget_space(d);
    int rank = H5Sget_simple_extent_ndims(s);
    std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
    H5Sget_simple_extent_dims(s, dims.data(), nullptr);
    H5Sclose(s), H5Dclose(d);
    return Shape(dims.begin(), dims.end());
  }
  /// HDF5 class and size of a dataset's element type.
  std::pair<H5T_class_t, std::size_t> dtype(const std::string& p) const {
    hid_t d = H5Dopen2(file, p.c_str(), H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    auto r = std::make_pair(H5Tget_class(t), H5Tget_size(t));
    H5Tclose(t), H5Dclose(d);
    return r;
  }
  std::vector<float> floats(const std::string& p) const {
    hid_t d = H5Dopen2(file, p.c_str(), H5P_DEFAULT);
    std::vector<float> v(static_cast<std::size_t>(numel_of(shape(p))));
    REQUIRE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0);
    H5Dclose(d);
    return v;
  }
  std::int64_t integer(const std::string& p) const {
    hid_t d = H5Dopen2(file, p.c_str(), H5P_DEFAULT);
    std::int64_t v = -1;
    REQUIRE(H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v) >= 0);
    H5Dclose(d);
    return v;
  }
  int attr_count(const std::string& p) const {
    H5O_info_t info;
    REQUIRE(H5Oget_info_by_name(file, p.c_str(), &info, H5P_DEFAULT) >= 0);
    return static_cast<int>(info.num_attrs);
  }
  /// A string or list-of-strings attribute (variable-length strings, as h5py writes them).
  std::vector<std::string> strings(const std::string& obj, const std::string& name) const {
    hid_t a = H5Aopen_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE_MESSAGE(a >= 0, "no attribute ", name, " on ", obj);
    hid_t t = H5Aget_type(a), s = H5Aget_space(a);
    const auto n = static_cast<std::size_t>(H5Sget_simple_extent_npoints(s));
    std::vector<std::string> out;
    if (n > 0) {
      REQUIRE(H5Tget_class(t) == H5T_STRING);
      REQUIRE(H5Tis_variable_str(t) > 0);
      std::vector<char*> ptrs(n);
      REQUIRE(H5Aread(a, t, ptrs.data()) >= 0);
      for (char* p : ptrs) out.emplace_back(p);
      H5Dvlen_reclaim(t, s, H5P_DEFAULT, ptrs.data());
    }
    H5Sclose(s), H5Tclose(t), H5Aclose(a);
    return out;
  }
  hsize_t userblock() const {
    hid_t p = H5Fget_create_plist(file);
    hsize_t size = 0;
    H5Pget_userblock(p, &size);
    H5Pclose(p);
    return size;
  }
};

std::unique_ptr<Sequential> trained_mlp(const optimizers::OptimizerArg& opt, std::uint64_t seed = 3) {
  set_random_seed(seed);
  auto m = small_mlp();
  m->compile({.optimizer = opt, .loss = "sparse_categorical_crossentropy"});
  Tensor x, y;
  std::tie(x, y) = quadrant_data(64, 7);
  m->fit(x, y, {.batch_size = 32, .epochs = 1, .verbose = 0});
  return m;
}

}  // namespace

TEST_CASE("save_weights writes Keras 3's .weights.h5 layout") {
  ScratchDir dir("layout");
  auto m = trained_mlp(optimizers::Adam());
  const std::string path = dir / "model.weights.h5";
  m->save_weights(path);
  H5 f(path);
  CHECK(f.userblock() == 512);
  CHECK(f.attr_count("/") == 0);  // Keras writes no root attributes
  for (const char* g : {"/layers", "/layers/dense/vars", "/layers/dropout/vars", "/layers/dense_1/vars",
                        "/layers/activation/vars", "/optimizer/vars", "/vars"}) {
    CAPTURE(g);
    REQUIRE(f.exists(g));
    CHECK(f.type(g) == H5O_TYPE_GROUP);
  }
  CHECK(f.strings("/layers/dense/vars", "name") == std::vector<std::string>{"dense"});
  CHECK(f.strings("/vars", "name") == std::vector<std::string>{"sequential"});
  CHECK(f.strings("/optimizer/vars", "name") == std::vector<std::string>{"adam"});
  CHECK(f.count("/layers") == 4);
  CHECK(f.count("/layers/dense/vars") == 2);
  CHECK(f.count("/layers/dropout/vars") == 0);
  CHECK(f.shape("/layers/dense/vars/0") == Shape{8, 16});
  CHECK(f.shape("/layers/dense/vars/1") == Shape{16});
  CHECK(f.shape("/layers/dense_1/vars/0") == Shape{16, 4});
  CHECK(f.dtype("/layers/dense/vars/0") == std::make_pair(H5T_FLOAT, std::size_t{4}));
  CHECK(f.floats("/layers/dense/vars/0") == m->layers()[0]->variables()[0].value().to_vector<float>());
  // Keras's optimizer order: iteration, learning_rate, then (momentum, velocity) per variable.
  CHECK(f.count("/optimizer/vars") == 2 + 2 * 4);
  CHECK(f.shape("/optimizer/vars/0") == Shape{});
  CHECK(f.integer("/optimizer/vars/0") == 2);
  CHECK(f.dtype("/optimizer/vars/0").first == H5T_INTEGER);
  CHECK(f.floats("/optimizer/vars/1")[0] == doctest::Approx(0.001));
  const Shape want[] = {{8, 16}, {8, 16}, {16}, {16}, {16, 4}, {16, 4}, {4}, {4}};
  for (int i = 0; i < 8; ++i) CHECK(f.shape("/optimizer/vars/" + std::to_string(i + 2)) == want[i]);
  auto slots = m->optimizer().slots_by_path();
  CHECK(f.floats("/optimizer/vars/2") == slots["dense/kernel"]["m"].to_vector<float>());
  CHECK(f.floats("/optimizer/vars/3") == slots["dense/kernel"]["v"].to_vector<float>());
  CHECK(f.floats("/optimizer/vars/9") == slots["dense_1/bias"]["v"].to_vector<float>());
}

TEST_CASE("Keras 3 layout of the other optimizers, LossScaleOptimizer included") {
  ScratchDir dir("layout-opt");
  {
    auto m = trained_mlp(optimizers::RMSprop({.momentum = 0.5, .centered = true}));
    m->save_weights(dir / "r.weights.h5");
    H5 f(dir / "r.weights.h5");
    // velocities, then momentums, then average gradients (each over the 4 variables)
    CHECK(f.count("/optimizer/vars") == 2 + 3 * 4);
    auto slots = m->optimizer().slots_by_path();
    CHECK(f.floats("/optimizer/vars/2") == slots["dense/kernel"]["velocity"].to_vector<float>());
    CHECK(f.floats("/optimizer/vars/6") == slots["dense/kernel"]["momentum"].to_vector<float>());
    CHECK(f.floats("/optimizer/vars/13") == slots["dense_1/bias"]["average_gradient"].to_vector<float>());
  }
  {
    auto m = trained_mlp(optimizers::SGD({.learning_rate = optimizers::schedules::ExponentialDecay(
                                                           {.initial_learning_rate = 0.1, .decay_steps = 10})}));
    m->save_weights(dir / "s.weights.h5");
    H5 f(dir / "s.weights.h5");
    CHECK(f.count("/optimizer/vars") == 1);  // no momentum slots, no learning_rate variable for a schedule
  }
  {
    PolicyScope scope("mixed_float16");
    auto m = trained_mlp(optimizers::SGD({.learning_rate = 0.01, .momentum = 0.9}));
    REQUIRE(m->loss_scale_optimizer() != nullptr);
    m->save_weights(dir / "l.weights.h5");
    H5 f(dir / "l.weights.h5");
    CHECK(f.strings("/optimizer/vars", "name") == std::vector<std::string>{"loss_scale_optimizer"});
    CHECK(f.count("/optimizer/vars") == 4 + 2 + 4);  // its own 4, then the inner optimizer's
    CHECK(f.integer("/optimizer/vars/2") == m->loss_scale_optimizer()->step_counter());
    CHECK(f.floats("/optimizer/vars/3")[0] == static_cast<float>(m->loss_scale_optimizer()->loss_scale()));
    CHECK(f.count("/optimizer/inner_optimizer/vars") == 2 + 4);
    CHECK(f.shape("/optimizer/inner_optimizer/vars/2") == Shape{8, 16});
    CHECK(f.dtype("/layers/dense/vars/0") == std::make_pair(H5T_FLOAT, std::size_t{4}));  // float32 masters
  }
}

TEST_CASE("save_weights writes Keras 2's legacy .h5 layout") {
  ScratchDir dir("legacy");
  auto m = trained_mlp("sgd");
  const std::string path = dir / "model.h5";
  m->save_weights(path);
  H5 f(path);
  CHECK(f.userblock() == 512);
  CHECK(f.strings("/", "layer_names") == std::vector<std::string>{"dense", "dropout", "dense_1", "activation"});
  CHECK(f.strings("/", "backend") == std::vector<std::string>{"tensorflow"});
  CHECK(f.strings("/", "keras_version").size() == 1);
  CHECK(f.strings("/dense", "weight_names") == std::vector<std::string>{"dense/kernel:0", "dense/bias:0"});
  CHECK(f.strings("/dropout", "weight_names").empty());
  CHECK(f.shape("/dense/dense/kernel:0") == Shape{8, 16});
  CHECK(f.shape("/dense/dense/bias:0") == Shape{16});
  CHECK(f.shape("/dense_1/dense_1/kernel:0") == Shape{16, 4});
  CHECK(f.floats("/dense_1/dense_1/bias:0") == m->layers()[2]->variables()[1].value().to_vector<float>());
  CHECK_FALSE(f.exists("/optimizer"));

  set_random_seed(99);
  auto other = small_mlp();
  CHECK_FALSE(same_weights(*m, *other));
  other->load_weights(path);
  CHECK(same_weights(*m, *other));
}

TEST_CASE("float16 and bfloat16 exports for deployment") {
  ScratchDir dir("export");
  auto m = trained_mlp("adam");
  for (DType d : {float16, bfloat16}) {
    CAPTURE(to_string(d));
    for (const std::string name : {"x.weights.h5", "x.h5"}) {
      const std::string path = dir / name;
      m->save_weights(path, {.dtype = d});
      {
        H5 f(path);
        const std::string kernel = name == "x.h5" ? "/dense/dense/kernel:0" : "/layers/dense/vars/0";
        auto [cls, size] = f.dtype(kernel);
        CHECK(size == 2);
        if (d == float16) {
          CHECK(cls == H5T_FLOAT);
        } else {
          CHECK(cls == H5T_OPAQUE);  // the raw bfloat16 bit patterns, as Keras/h5py store them
          hid_t a = H5Aopen_by_name(f.file, kernel.c_str(), "dtype", H5P_DEFAULT, H5P_DEFAULT);
          REQUIRE(a >= 0);
          H5Aclose(a);
          CHECK(f.strings(kernel, "dtype") == std::vector<std::string>{"bfloat16"});
        }
        if (name == "x.weights.h5") CHECK_FALSE(f.exists("/optimizer"));
      }
      set_random_seed(42);
      auto other = small_mlp();
      other->load_weights(path);
      auto wa = m->get_weights(), wb = other->get_weights();
      for (std::size_t i = 0; i < wa.size(); ++i) {
        CHECK(wb[i].dtype() == float32);
        CHECK(bits_of(wb[i]) == bits_of(wa[i].to(d)));  // exactly the rounded values, back in float32
      }
    }
  }
}

TEST_CASE("round trip of every core layer and optimizer under every policy") {
  ScratchDir dir("roundtrip");
  Tensor x, y;
  std::tie(x, y) = quadrant_data(96, 5);
  using Make = std::function<std::shared_ptr<optimizers::Optimizer>()>;
  const std::vector<std::pair<std::string, Make>> opts = {
      {"sgd_momentum", [] { return std::make_shared<optimizers::SGDOptimizer>(optimizers::SGDOptions{.learning_rate = 0.05, .momentum = 0.9, .nesterov = true}); }},
      {"adam", [] { return std::make_shared<optimizers::AdamOptimizer>(optimizers::AdamOptions{.learning_rate = 3e-3, .amsgrad = true}); }},
      {"adamw", [] { return std::make_shared<optimizers::AdamWOptimizer>(optimizers::AdamWOptions{.learning_rate = 2e-3, .weight_decay = 0.01, .clipnorm = 1.0}); }},
      {"adamw_excluding", [] {
         auto o = optimizers::AdamW({.learning_rate = 2e-3, .weight_decay = 0.1});
         o->exclude_from_weight_decay({"bias", "gamma", "beta"});
         return o;
       }},
      {"rmsprop", [] { return std::make_shared<optimizers::RMSpropOptimizer>(optimizers::RMSpropOptions{.momentum = 0.2, .centered = true}); }},
      {"loss_scale", [] {
         return std::make_shared<mixed_precision::LossScaleOptimizer>(
             std::make_shared<optimizers::AdamOptimizer>(),
             mixed_precision::LossScaleOptions{.initial_scale = 1024, .dynamic_growth_steps = 2, .hysteresis = 2});
       }},
  };
  for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
    for (const auto& entry : opts) {  // no structured binding: clang 14 cannot capture one
      const auto& opt_name = entry.first;
      const auto& make = entry.second;
      CAPTURE(policy);
      CAPTURE(opt_name);
      PolicyScope scope(policy);
      set_random_seed(21);
      auto m = all_core_layers_model();
      m->compile({.optimizer = make(), .loss = "sparse_categorical_crossentropy", .metrics = {"accuracy"}});
      m->fit(x, y, {.batch_size = 32, .epochs = 2, .verbose = 0});

      // Weights (and the optimizer, in the Keras 3 layout) into a fresh model.
      for (const std::string name : {"w.weights.h5", "w.h5"}) {
        CAPTURE(name);
        m->save_weights(dir / name);
        set_random_seed(1234);
        auto other = all_core_layers_model();
        other->compile({.optimizer = make(), .loss = "sparse_categorical_crossentropy"});
        CHECK_FALSE(same_weights(*m, *other));
        other->load_weights(dir / name);
        CHECK(same_weights(*m, *other));
        auto* lso_a = m->loss_scale_optimizer();
        auto* lso_b = other->loss_scale_optimizer();
        REQUIRE((lso_a != nullptr) == (lso_b != nullptr));
        optimizers::Optimizer& oa = lso_a ? lso_a->inner_optimizer() : m->optimizer();
        optimizers::Optimizer& ob = lso_b ? lso_b->inner_optimizer() : other->optimizer();
        if (name == "w.weights.h5") {
          CHECK(same_optimizer_state(oa, ob));
          if (lso_a) {
            CHECK(lso_a->loss_scale() == lso_b->loss_scale());
            CHECK(lso_a->step_counter() == lso_b->step_counter());
            CHECK(lso_a->overflow_count() == lso_b->overflow_count());
          }
        } else {
          CHECK(ob.iterations() == 0);  // the legacy layout holds weights only
        }
      }

      // Full checkpoint: architecture, policy, compile settings and state.
      m->save(dir / "full.h5");
      auto r = load_model(dir / "full.h5");
      REQUIRE(r->layers().size() == m->layers().size());
      CHECK(r->name() == m->name());
      CHECK(r->dtype_policy() == m->dtype_policy());
      for (std::size_t i = 0; i < r->layers().size(); ++i) {
        const Layer& a = *m->layers()[i];
        const Layer& b = *r->layers()[i];
        CHECK(a.class_name() == b.class_name());
        CHECK(a.name() == b.name());
        CHECK(a.dtype_policy() == b.dtype_policy());
        CHECK(a.config() == b.config());
        CHECK(a.rng_state() == b.rng_state());
        CHECK(a.trainable() == b.trainable());
      }
      CHECK(same_weights(*m, *r));
      CHECK(r->epoch() == 2);
      CHECK(r->loss().name() == "sparse_categorical_crossentropy");
      CHECK(typeid(r->optimizer()) == typeid(m->optimizer()));
      auto* la = m->loss_scale_optimizer();
      auto* lb = r->loss_scale_optimizer();
      REQUIRE((la != nullptr) == (lb != nullptr));
      if (auto* wa = dynamic_cast<optimizers::AdamWOptimizer*>(la ? &la->inner_optimizer() : &m->optimizer())) {
        auto* wb = dynamic_cast<optimizers::AdamWOptimizer*>(lb ? &lb->inner_optimizer() : &r->optimizer());
        REQUIRE(wb != nullptr);
        CHECK(wb->excluded_from_weight_decay() == wa->excluded_from_weight_decay());  // mpt's checkpoints keep them
      }
      CHECK(same_optimizer_state(la ? la->inner_optimizer() : m->optimizer(), lb ? lb->inner_optimizer() : r->optimizer()));
      if (la) {
        CHECK(la->loss_scale() == lb->loss_scale());
        CHECK(la->step_counter() == lb->step_counter());
        CHECK(la->overflow_count() == lb->overflow_count());
        CHECK(la->options().hysteresis == lb->options().hysteresis);
      }
      CHECK(r->optimizer().learning_rate() == m->optimizer().learning_rate());
      CHECK(bits_of(r->predict(x)) == bits_of(m->predict(x)));
    }
  }
}

TEST_CASE("resuming from a full checkpoint continues bit-identically") {
  ScratchDir dir("resume");
  Tensor x, y;
  std::tie(x, y) = quadrant_data(200, 9);
  Tensor vx, vy;
  std::tie(vx, vy) = quadrant_data(40, 10);
  constexpr int N = 2, M = 2;
  for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
    for (int variant = 0; variant < 2; ++variant) {
      CAPTURE(policy);
      CAPTURE(variant);
      PolicyScope scope(policy);
      auto make_opt = [&]() -> optimizers::OptimizerArg {
        if (variant == 0) return optimizers::Adam({.learning_rate = 5e-3});
        // A loss scale that overflows float16 at first: skipped steps, halvings and hysteresis.
        return mixed_precision::LossScaleOptimizer(
            optimizers::SGD({.learning_rate = optimizers::schedules::ExponentialDecay(
                                 {.initial_learning_rate = 0.05, .decay_steps = 5, .decay_rate = 0.9}),
                             .momentum = 0.9}),
            {.initial_scale = 262144.0, .dynamic_growth_steps = 3, .hysteresis = 2});
      };
      auto run = [&](Model& m, int initial, int epochs) {
        return m.fit(x, y, {.batch_size = 32, .epochs = epochs, .verbose = 0,
                            .validation_data = std::make_pair(vx, vy), .initial_epoch = initial});
      };
      set_random_seed(77);
      auto straight = all_core_layers_model();
      straight->compile({.optimizer = make_opt(), .loss = "sparse_categorical_crossentropy", .metrics = {"accuracy"}});
      History hs = run(*straight, 0, N + M);

      set_random_seed(77);
      auto first = all_core_layers_model();
      first->compile({.optimizer = make_opt(), .loss = "sparse_categorical_crossentropy", .metrics = {"accuracy"}});
      run(*first, 0, N);
      first->save(dir / "ckpt.h5");
      first.reset();
      set_random_seed(5);  // whatever happens in between, the checkpoint restores the seed stream
      Tensor::random_normal({3}, 0, 1, detail::next_seed());
      auto resumed = load_model(dir / "ckpt.h5");
      CHECK(resumed->epoch() == N);
      History hr = run(*resumed, resumed->epoch(), N + M);

      CHECK(same_weights(*straight, *resumed));
      auto* ls = straight->loss_scale_optimizer();
      auto* lr = resumed->loss_scale_optimizer();
      REQUIRE((ls != nullptr) == (lr != nullptr));
      CHECK(same_optimizer_state(ls ? ls->inner_optimizer() : straight->optimizer(),
                                 lr ? lr->inner_optimizer() : resumed->optimizer()));
      if (ls) {
        CHECK(ls->loss_scale() == lr->loss_scale());
        CHECK(ls->step_counter() == lr->step_counter());
        CHECK(ls->overflow_count() == lr->overflow_count());
      }
      REQUIRE(hr.history["loss"].size() == M);
      for (int e = 0; e < M; ++e) {
        CHECK(hr.history["loss"][e] == hs.history["loss"][N + e]);
        CHECK(hr.history["val_loss"][e] == hs.history["val_loss"][N + e]);
        CHECK(hr.history["loss_scale"][e] == hs.history["loss_scale"][N + e]);
      }
      if (variant == 1 && std::string(policy) == "mixed_float16") {
        double skipped = 0;
        for (double s : hs.history["skipped_steps"]) skipped += s;
        CHECK(skipped > 0);  // the loss-scale state really was exercised
      }
    }
  }
}

namespace {
/// A user-defined layer with a config, registered for load_model.
class Scale : public Layer {
 public:
  explicit Scale(double init, std::string name = "") : Layer("Scale", std::nullopt, std::move(name)), init_(init) {}
  void build(const Shape& s) override { w_ = add_weight("w", {s.back()}, "ones"); }
  Tensor call(const Tensor& x, bool) override { return ops::mul(ops::mul(x, read(w_)), Tensor::scalar(init_, x.dtype(), x.device())); }
  nlohmann::json config() const override { return {{"init", init_}}; }

 private:
  double init_;
  Variable w_;
};
}  // namespace

TEST_CASE("custom layers take part through register_layer; uncompiled models save too") {
  ScratchDir dir("custom");
  set_random_seed(3);
  Sequential m({layers::Input({8}), layers::Dense(4), LayerRef(std::make_shared<Scale>(2.0))});
  m.layers()[1]->variables()[0].assign(Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {4}));
  m.save(dir / "c.h5");
  std::string e = error_of([&] { load_model(dir / "c.h5"); });
  CHECK(contains(e, "no factory for layer class 'Scale'"));
  CHECK(contains(e, "register_layer"));
  register_layer("Scale", [](const LayerConfig& c) {
    return LayerRef(std::make_shared<Scale>(c.get_double("init"), c.name));
  });
  auto r = load_model(dir / "c.h5");
  CHECK_FALSE(r->compiled());
  CHECK(r->layers()[1]->class_name() == "Scale");
  CHECK(r->layers()[1]->config() == m.layers()[1]->config());
  CHECK(same_weights(m, *r));
  Tensor x = Tensor::random_uniform({5, 8}, -1, 1, 4);
  CHECK(bits_of(r->predict(x)) == bits_of(m.predict(x)));
}

TEST_CASE("functional models save and load") {
  ScratchDir dir("functional");
  set_random_seed(8);
  auto in = mpt::Input({8}, {.name = "features"});
  auto h = layers::Dense(16, {.activation = "relu"})(in);
  auto shared = layers::Dense(16, {.activation = "tanh"});
  auto a = shared(h);
  auto b = shared(a);  // a layer called twice
  auto out = layers::Activation("softmax")(layers::Dense(4)(b));
  Model m(in, out, "funky");
  m.compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy"});
  Tensor x, y;
  std::tie(x, y) = quadrant_data(64, 1);
  m.fit(x, y, {.batch_size = 16, .epochs = 1, .verbose = 0});
  m.save(dir / "f.h5");
  auto r = load_model(dir / "f.h5");
  CHECK(r->name() == "funky");
  CHECK(r->layers().size() == m.layers().size());
  CHECK(same_weights(m, *r));
  CHECK(bits_of(r->predict(x)) == bits_of(m.predict(x)));
  m.save_weights(dir / "f.weights.h5");
  set_random_seed(9);
  auto in2 = mpt::Input({8});
  auto s2 = layers::Dense(16, {.activation = "tanh"});
  Model m2(in2, layers::Activation("softmax")(layers::Dense(4)(s2(s2(layers::Dense(16, {.activation = "relu"})(in2))))));
  m2.load_weights(dir / "f.weights.h5");
  CHECK(same_weights(m, m2));
}

TEST_CASE(".keras archives hold config.json, metadata.json and the checkpoint") {
  ScratchDir dir("keras-zip");
  PolicyScope scope("mixed_float16");
  Tensor x, y;
  std::tie(x, y) = quadrant_data(96, 5);
  set_random_seed(17);
  auto m = all_core_layers_model();
  m->compile({.optimizer = optimizers::Adam({.learning_rate = 1e-2}), .loss = "sparse_categorical_crossentropy",
              .metrics = {"accuracy"}});
  m->fit(x, y, {.batch_size = 32, .epochs = 2, .verbose = 0});
  const std::string path = dir / "model.keras";
  std::string e = error_of([&] { m->save(path); });
  if (contains(e, "without libzip")) {
    MESSAGE("built without libzip: .keras skipped");
    return;
  }
  REQUIRE(e == "(no error)");
  const auto bytes = read_bytes(path);
  REQUIRE(bytes.size() > 4);
  CHECK(std::string(bytes.data(), 4) == std::string("PK\x03\x04", 4));
  const std::string text(bytes.begin(), bytes.end());
  for (const char* entry : {"config.json", "metadata.json", "model.weights.h5", "\"class_name\":\"Sequential\"",
                            "\"compile_config\""})
    CHECK_MESSAGE(contains(text, entry), entry);
  auto r = load_model(path);
  CHECK(same_weights(*m, *r));
  CHECK(r->epoch() == 2);
  CHECK(same_optimizer_state(m->loss_scale_optimizer()->inner_optimizer(), r->loss_scale_optimizer()->inner_optimizer()));
  // Training continues identically from the archive.
  m->fit(x, y, {.batch_size = 32, .epochs = 3, .verbose = 0, .initial_epoch = 2});
  r->fit(x, y, {.batch_size = 32, .epochs = 3, .verbose = 0, .initial_epoch = r->epoch()});
  CHECK(same_weights(*m, *r));
  // load_weights reads the archive's weights too.
  set_random_seed(18);
  auto w = all_core_layers_model();
  w->load_weights(path);
  r->save(path);  // overwrite atomically
  CHECK(same_weights(*load_model(path), *r));
  for (const auto& f : dir.files()) CHECK_MESSAGE(f.find(".tmp-") == std::string::npos, f);
}

TEST_CASE("image layers: a residual CNN saves, loads and resumes exactly") {
  ScratchDir dir("cnn");
  Tensor x = Tensor::random_uniform({48, 8, 8, 3}, 0, 1, 3);
  std::vector<std::int32_t> labels(48);
  auto xv = x.to_vector<float>();
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = xv[i * 192] > 0.5f ? 1 : 0;
  Tensor y = Tensor::from_vector(labels, {48});
  auto make = [] {
    auto in = mpt::Input({8, 8, 3});
    auto h = layers::Conv2D(8, 3, {.padding = "same", .activation = "relu"})(in);
    auto b = layers::BatchNormalization()(layers::Conv2D(8, 3, {.padding = "same"})(h));
    auto r = layers::Add()({h, b});
    auto p = layers::MaxPooling2D({2, 2})(layers::ZeroPadding2D({1, 1})(r));
    auto out = layers::Dense(2, {.activation = "softmax"})(layers::GlobalAveragePooling2D()(p));
    return std::make_unique<Model>(in, out, "cnn");
  };
  for (const char* policy : {"float32", "mixed_float16"}) {
    CAPTURE(policy);
    PolicyScope scope(policy);
    auto fit = [&](Model& m, int initial, int epochs) {
      m.fit(x, y, {.batch_size = 16, .epochs = epochs, .verbose = 0, .initial_epoch = initial});
    };
    set_random_seed(40);
    auto straight = make();
    straight->compile({.optimizer = optimizers::SGD({.learning_rate = 0.05, .momentum = 0.9}), .loss = "sparse_categorical_crossentropy"});
    fit(*straight, 0, 3);
    set_random_seed(40);
    auto first = make();
    first->compile({.optimizer = optimizers::SGD({.learning_rate = 0.05, .momentum = 0.9}), .loss = "sparse_categorical_crossentropy"});
    fit(*first, 0, 1);
    first->save(dir / "cnn.h5");
    auto resumed = load_model(dir / "cnn.h5");
    CHECK(same_weights(*first, *resumed));  // BatchNormalization's moving statistics included
    CHECK(bits_of(resumed->predict(x)) == bits_of(first->predict(x)));
    fit(*resumed, resumed->epoch(), 3);
    CHECK(same_weights(*straight, *resumed));
  }
}

TEST_CASE("loading checks every layer and shape and never half-loads") {
  ScratchDir dir("mismatch");
  auto m = trained_mlp("adam");
  m->save_weights(dir / "m.weights.h5");
  m->save_weights(dir / "m.h5");
  m->save(dir / "full.h5");

  // dense matches, dense_1 does not: nothing may change.
  set_random_seed(4);
  Sequential wider({layers::Input({8}), layers::Dense(16, {.activation = "relu"}), layers::Dropout(0.1),
                    layers::Dense(5), layers::Activation("softmax")});
  auto before = wider.get_weights();
  for (const std::string name : {"m.weights.h5", "m.h5"}) {
    CAPTURE(name);
    std::string e = error_of([&] { wider.load_weights(dir / name); });
    CHECK(contains(e, dir / name));
    CHECK(contains(e, "dense_1"));
    CHECK(contains(e, "kernel"));
    CHECK(contains(e, "expected shape (16, 5), found (16, 4)"));
    auto after = wider.get_weights();
    for (std::size_t i = 0; i < before.size(); ++i) CHECK(bits_of(after[i]) == bits_of(before[i]));
  }
  // A layer the file lacks, and a file with more layers than the model.
  Sequential deeper({layers::Input({8}), layers::Dense(16), layers::Dense(4), layers::Dense(4)});
  std::string e = error_of([&] { deeper.load_weights(dir / "m.weights.h5"); });
  CHECK(contains(e, "layer 'dense_2'"));
  CHECK(contains(e, "not in the file"));
  e = error_of([&] { deeper.load_weights(dir / "m.h5"); });
  CHECK(contains(e, "holds weights for 2 layers"));
  Sequential shallow({layers::Input({8}), layers::Dense(16)});
  e = error_of([&] { shallow.load_weights(dir / "m.weights.h5"); });
  CHECK(contains(e, "dense_1"));
  // Wrong kinds of files.
  write_bytes(dir / "text.h5", std::vector<char>{'h', 'e', 'l', 'l', 'o'});
  write_bytes(dir / "empty.h5", {});
  for (const std::string name : {"text.h5", "empty.h5", "missing.h5"}) {
    CAPTURE(name);
    e = error_of([&] { m->load_weights(dir / name); });
    CHECK(contains(e, "load_weights"));
    CHECK(contains(e, dir / name));
    e = error_of([&] { load_model(dir / name); });
    CHECK(contains(e, "load_model"));
  }
  CHECK(contains(error_of([&] { m->load_weights(dir.path.string()); }), "not a regular file"));
  CHECK(contains(error_of([&] { load_model(dir / "m.weights.h5"); }), "not an mpt full checkpoint"));
  CHECK(contains(error_of([&] { m->save_weights(dir / "x.bin"); }), ".weights.h5"));
  CHECK(contains(error_of([&] { m->save_weights(dir / "no/such/dir/x.h5"); }), "no/such/dir/x.h5"));
  // A full checkpoint loads into a same-architecture model as weights, too.
  set_random_seed(6);
  auto same = small_mlp();
  same->load_weights(dir / "full.h5");
  CHECK(same_weights(*m, *same));
  // An unbuilt model says so.
  Sequential unbuilt({layers::Dense(16), layers::Dense(4)});
  CHECK(contains(error_of([&] { unbuilt.load_weights(dir / "m.weights.h5"); }), "no variables yet"));
  // No temporary files are left behind by the saves above.
  for (const auto& f : dir.files()) CHECK_MESSAGE(f.find(".tmp-") == std::string::npos, f);
}

TEST_CASE("a save killed at any moment leaves the previous checkpoint loadable") {
  ScratchDir dir("kill");
  set_random_seed(2);
  // ~8.4M float32 weights: a 34 MB file, slow enough to be killed mid-write.
  Sequential big({layers::Input({2048}), layers::Dense(2048), layers::Dense(2048)});
  Sequential restored({layers::Input({2048}), layers::Dense(2048), layers::Dense(2048)});
  const std::string path = dir / "big.weights.h5";
  big.save_weights(path);
  auto in_file = big.get_weights();  // what the checkpoint holds
  for (auto& v : big.variables()) v.assign(ops::add(v.value(), Tensor::scalar(1.0, v.dtype(), v.value().device())));
  auto next = big.get_weights();  // what the next save writes

  const auto t0 = std::chrono::steady_clock::now();
  big.save_weights(dir / "timing.weights.h5");
  const double save_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::filesystem::remove(dir / "timing.weights.h5");
  MESSAGE("one save of 34 MB takes ", save_ms, " ms");

  int killed_mid_save = 0, completed = 0;
  for (int k = 0; k < 12; ++k) {
    const double delay_ms = save_ms * k / 10.0;
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      try {
        big.save_weights(path);
      } catch (...) {
        ::_exit(2);
      }
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(delay_ms * 1000)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const bool was_killed = WIFSIGNALED(status);
    CAPTURE(delay_ms);
    if (!was_killed) CHECK(WEXITSTATUS(status) == 0);
    // Whatever the moment, the file is a whole checkpoint: the old one or the new one.
    restored.load_weights(path);
    auto w = restored.get_weights();
    const bool is_old = bits_of(w[0]) == bits_of(in_file[0]) && bits_of(w[3]) == bits_of(in_file[3]);
    const bool is_new = bits_of(w[0]) == bits_of(next[0]) && bits_of(w[3]) == bits_of(next[3]);
    CHECK((is_old || is_new));
    bool temp_left = false;
    for (const auto& f : dir.files())
      if (f.find(".tmp-") != std::string::npos) {
        temp_left = true;
        std::filesystem::remove(dir / f);
      }
    if (was_killed && is_old && temp_left) ++killed_mid_save;
    if (is_new) {
      ++completed;
      std::swap(in_file, next);  // next round writes the other set over this one
      big.set_weights(next);
    }
  }
  MESSAGE(killed_mid_save, " kills landed mid-save, ", completed, " saves completed");
  CHECK(killed_mid_save > 0);
}

TEST_CASE("ModelCheckpoint names files from {epoch} and logs") {
  ScratchDir dir("mc");
  callbacks::ModelCheckpoint mc(dir / "m-{epoch:02d}-{val_loss:.2f}.weights.h5", {.save_weights_only = true});
  Logs logs{{"loss", 0.5}, {"val_loss", 0.12345}, {"accuracy", 0.875}};
  CHECK(mc.file_path(0, -1, logs) == dir / "m-01-0.12.weights.h5");
  CHECK(mc.file_path(11, -1, logs) == dir / "m-12-0.12.weights.h5");
  auto fmt = [&](const std::string& pattern, int epoch = 2, std::int64_t batch = -1) {
    return callbacks::ModelCheckpoint(pattern).file_path(epoch, batch, logs);
  };
  CHECK(fmt("{epoch}") == "3");
  CHECK(fmt("{epoch:03d}_{batch}", 2, 9) == "003_10");
  CHECK(fmt("{loss}") == "0.5");
  CHECK(fmt("{val_loss:.3e}") == "1.235e-01");
  CHECK(fmt("{accuracy:.1%}") == "87.5%");
  CHECK(fmt("{val_loss:08.4f}") == "000.1235");
  CHECK(fmt("{epoch:>4}|{epoch:<3}|{epoch:^5}") == "   3|3  |  3  ");
  CHECK(fmt("{{literal}}-{epoch}") == "{literal}-3");
  CHECK(fmt("{loss:g}") == "0.5");
  CHECK(contains(error_of([&] { fmt("{val_acc}"); }), "val_acc"));
  CHECK(contains(error_of([&] { fmt("{epoch:q}"); }), "format spec"));
  CHECK(contains(error_of([&] { fmt("{epoch"); }), "unclosed"));
  CHECK(contains(error_of([&] { callbacks::ModelCheckpoint("x.bin", {.save_weights_only = true}); }), ".h5"));
  CHECK(contains(error_of([&] { callbacks::ModelCheckpoint("x.h5", {.save_freq = "batch"}); }), "save_freq"));
  CHECK(contains(error_of([&] { callbacks::ModelCheckpoint("x.h5", {.monitor = "foo", .save_best_only = true}); }),
                 "mode"));
}

TEST_CASE("ModelCheckpoint during fit: every epoch, best only, and every N batches") {
  ScratchDir dir("mcfit");
  Tensor x, y;
  std::tie(x, y) = quadrant_data(128, 3);
  Tensor vx, vy;
  std::tie(vx, vy) = quadrant_data(32, 4);
  set_random_seed(12);
  auto m = small_mlp();
  m->compile({.optimizer = optimizers::Adam({.learning_rate = 0.02}), .loss = "sparse_categorical_crossentropy",
              .metrics = {"accuracy"}});
  auto every = std::make_shared<callbacks::ModelCheckpoint>(dir / "e{epoch:02d}-{val_loss:.4f}.weights.h5",
                                                            callbacks::ModelCheckpointOptions{.save_weights_only = true});
  auto best = std::make_shared<callbacks::ModelCheckpoint>(
      dir / "best.h5", callbacks::ModelCheckpointOptions{.monitor = "val_accuracy", .save_best_only = true});
  auto batches = std::make_shared<callbacks::ModelCheckpoint>(
      dir / "b{epoch}-{batch}.weights.h5", callbacks::ModelCheckpointOptions{.save_weights_only = true, .save_freq = 3});
  std::vector<std::vector<Tensor>> weights_after;
  callbacks::LambdaCallback record;
  record.epoch_end = [&](int, const Logs&) { weights_after.push_back(m->get_weights()); };
  using CallbackPtr = std::shared_ptr<callbacks::Callback>;
  History h = m->fit(x, y, {.batch_size = 32, .epochs = 5, .verbose = 0,
                            .callbacks = {CallbackPtr(every), CallbackPtr(best), CallbackPtr(batches), record},
                            .validation_data = std::make_pair(vx, vy)});
  // One file per epoch, named with its val_loss.
  for (int e = 0; e < 5; ++e) {
    char name[64];
    std::snprintf(name, sizeof name, "e%02d-%.4f.weights.h5", e + 1, h.history["val_loss"][e]);
    CAPTURE(name);
    REQUIRE(std::filesystem::exists(dir / name));
    set_random_seed(100);
    auto check = small_mlp();
    check->load_weights(dir / name);
    auto w = check->get_weights();
    for (std::size_t i = 0; i < w.size(); ++i) CHECK(bits_of(w[i]) == bits_of(weights_after[e][i]));
  }
  // The best file is the full checkpoint of the epoch with the highest val_accuracy (first on ties).
  const auto& acc = h.history["val_accuracy"];
  const int best_epoch = static_cast<int>(std::max_element(acc.begin(), acc.end()) - acc.begin());
  auto r = load_model(dir / "best.h5");
  CHECK(r->epoch() == best_epoch + 1);
  CHECK(best->best() == acc[best_epoch]);
  auto w = r->get_weights();
  for (std::size_t i = 0; i < w.size(); ++i) CHECK(bits_of(w[i]) == bits_of(weights_after[best_epoch][i]));
  // 4 batches per epoch, a save every 3 batches: 20 batches -> 6 saves.
  int batch_files = 0;
  for (const auto& f : dir.files()) batch_files += f.rfind("b", 0) == 0 && f.find(".weights.h5") != std::string::npos;
  CHECK(batch_files == 6);
  CHECK(std::filesystem::exists(dir / "b1-3.weights.h5"));
  CHECK(std::filesystem::exists(dir / "b2-2.weights.h5"));  // 6 batches seen: epoch 2, batch 2
  CHECK(std::filesystem::exists(dir / "b5-2.weights.h5"));  // batch 18
}

TEST_CASE("a loaded loss scale outside [min_scale, max_scale] is refused and leaves the model untouched") {
  // Before, load_weights accepted 1e-45 or 1e30 (issue 14, defect 9); with 1e30 about 80 steps were skipped.
  ScratchDir dir("bad_scale");
  PolicyScope scope("mixed_float16");
  auto m = trained_mlp(optimizers::Adam());
  REQUIRE(m->loss_scale_optimizer() != nullptr);
  m->save_weights(dir / "l.weights.h5");
  for (float bad : {1e30f, 1e-45f}) {
    {  // /optimizer/vars/3 is the dynamic scale
      hid_t f = H5Fopen((dir / "l.weights.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      REQUIRE(f >= 0);
      hid_t d = H5Dopen2(f, "/optimizer/vars/3", H5P_DEFAULT);
      REQUIRE(d >= 0);
      CHECK(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, &bad) >= 0);
      H5Dclose(d);
      H5Fclose(f);
      // Without mpt's header (and its CRC) the file reads as one written by another tool.
      auto bytes = read_bytes(dir / "l.weights.h5");
      std::fill(bytes.begin(), bytes.begin() + 16, '\0');
      write_bytes(dir / "l.weights.h5", bytes);
    }
    auto other = trained_mlp(optimizers::Adam(), 9);
    const auto before = other->get_weights();
    const double scale_before = other->loss_scale_optimizer()->loss_scale();
    std::string e = error_of([&] { other->load_weights(dir / "l.weights.h5"); });
    INFO(e);
    CHECK(contains(e, "loss scale"));
    CHECK(contains(e, "max_scale"));
    CHECK(other->loss_scale_optimizer()->loss_scale() == scale_before);
    const auto after = other->get_weights();
    for (std::size_t i = 0; i < before.size(); ++i) CHECK(bits_of(before[i]) == bits_of(after[i]));
  }
}
