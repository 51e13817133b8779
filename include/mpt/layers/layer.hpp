#pragma once
/// The Layer base: lazy build from the first input shape, the dtype policy (floating inputs
/// cast to the compute dtype, variables stored in the variable dtype and read in the compute
/// dtype), variables, names and shape errors that name the layer. A user-defined layer
/// overrides build and call only:
///
///   class Scale : public mpt::Layer {
///    public:
///     Scale() : Layer("Scale") {}
///     void build(const mpt::Shape& input_shape) override {
///       w_ = add_weight("w", {input_shape.back()}, "ones");
///     }
///     mpt::Tensor call(const mpt::Tensor& x, bool training) override {
///       return mpt::ops::mul(x, read(w_));
///     }
///    private:
///     mpt::Variable w_;
///   };
///   model.add(std::make_shared<Scale>());
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mpt/functional.hpp"
#include "mpt/initializers.hpp"
#include "mpt/mixed_precision/policy.hpp"
#include "mpt/regularizers.hpp"
#include "mpt/tensor.hpp"
#include "mpt/variable.hpp"

namespace mpt {

struct CallOptions {
  bool training = false;
};

/// Sets the seed every later initializer and Dropout draws from (keras.utils.set_random_seed).
void set_random_seed(std::uint64_t seed);
namespace detail {
std::uint64_t next_seed();
/// The global seed stream (seed, draws so far), kept by full checkpoints.
std::pair<std::uint64_t, std::uint64_t> seed_state();
void set_seed_state(std::uint64_t seed, std::uint64_t counter);
}  // namespace detail

/// Initial values by Keras initializer name (initializers::Initializer(name) at Keras's default
/// arguments, drawn from stream `seed` unless the name is not random); see mpt/initializers.hpp.
Tensor initialize(const std::string& initializer, const Shape& shape, DType dtype, std::uint64_t seed);

struct LayerConfig;
class Model;

class Layer {
 public:
  /// class_name: "Dense", ...; dtype: a policy (name or Policy) overriding the global one.
  explicit Layer(std::string class_name, std::optional<mixed_precision::Policy> dtype = std::nullopt,
                 std::string name = "");
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  /// Builds on the first call, casts floating inputs to the compute dtype, then call().
  Tensor operator()(const Tensor& x, CallOptions options = {});
  /// Several inputs (merge layers override call_multi).
  Tensor operator()(const std::vector<Tensor>& xs, CallOptions options = {});

  /// input_shape includes the batch dimension (the first input's).
  virtual void build(const Shape& input_shape) {}
  virtual Tensor call(const Tensor& x, bool training) = 0;
  /// Merge layers (Add, Concatenate) take several inputs; others reject them.
  virtual void build_multi(const std::vector<Shape>& input_shapes);
  virtual Tensor call_multi(const std::vector<Tensor>& xs, bool training);
  /// Whether this layer ends in a softmax (compile forces such a final layer to float32).
  virtual bool ends_in_softmax() const { return false; }
  /// Whether floating inputs are cast to the compute dtype before call (Keras's `autocast`);
  /// false for layers whose floating inputs are not activations (Embedding's ids: a bfloat16
  /// cast would round ids above 256).
  virtual bool autocast() const { return true; }
  /// Runs after each optimizer step (Model::train_step, or Model::finish_step in a custom loop);
  /// `applied` is false when the step was skipped (a loss-scale overflow). BatchNormalization
  /// commits the moving statistics of its last training call here, or drops them.
  virtual void finish_step(bool applied) {}
  /// Keras config entries for summaries and checkpoints, as a JSON object:
  ///   return {{"units", units_}, {"activation", "relu"}, {"kernel_size", {3, 3}}};
  /// load_model hands them back unchanged (LayerConfig::config) to the factory registered for
  /// class_name() (see register_layer). name, trainable and dtype are written by mpt.
  virtual nlohmann::json config() const { return nlohmann::json::object(); }
  /// Random-generator state a full checkpoint keeps besides variables (Dropout: its call count).
  virtual std::vector<std::uint64_t> rng_state() const { return {}; }
  virtual void set_rng_state(const std::vector<std::uint64_t>& state) {}

  // How Keras files record this layer beyond config() (the defaults fit single-object layers
  // called on one tensor or one list of tensors).
  /// config() keys Keras passes per call rather than to the constructor (MultiHeadAttention's
  /// use_causal_mask): a .keras config.json carries them in each functional node's kwargs.
  virtual std::vector<std::string> call_option_keys() const { return {}; }
  /// Keras's names of the tensor arguments of call, in mpt's input order, for layers whose
  /// inputs Keras passes as separate arguments (MultiHeadAttention: query, value, key,
  /// attention_mask); empty: one tensor or one list.
  virtual std::vector<std::string> call_argument_names() const { return {}; }
  /// Which of call_argument_names() each input of a call with these dtypes is.
  virtual std::vector<std::string> call_arguments_of(const std::vector<DType>& input_dtypes) const { return {}; }
  /// The sub-object of this layer that holds variable i in Keras 3 weights files
  /// (layers/<layer>/<group>/vars/<n>); "" for the layer's own vars (layers/<layer>/vars/<n>).
  virtual std::string variable_group(std::size_t i) const { return ""; }

  const std::string& name() const { return name_; }
  /// Virtual (as the ones below marked so) for a model used as a layer (Model::as_layer), which
  /// forwards them to its own layers.
  virtual void set_name(const std::string& name);
  /// True when the name was given by the user (models do not rename such layers).
  bool has_user_name() const { return user_name_; }
  const std::string& class_name() const { return class_name_; }
  const mixed_precision::Policy& dtype_policy() const { return policy_; }
  void set_dtype_policy(const mixed_precision::Policy& policy) { policy_ = policy; }
  DType compute_dtype() const { return policy_.compute_dtype(); }
  DType variable_dtype() const { return policy_.variable_dtype(); }
  bool built() const { return built_; }
  virtual bool trainable() const { return trainable_; }
  /// Keras's layer.trainable: false freezes the variables created trainable; true unfreezes them
  /// (those created non-trainable, BatchNormalization's moving statistics, stay so).
  virtual void set_trainable(bool on);

  virtual std::vector<Variable> variables() const { return variables_; }
  std::vector<Variable> trainable_variables() const;
  std::vector<Variable> non_trainable_variables() const;
  std::int64_t count_params() const;
  /// Keras's layer.losses: the penalties of this layer's regularized trainable variables and
  /// the activity penalties of its calls since the model's current forward began (float32
  /// scalars).
  virtual std::vector<Tensor> losses() const;
  /// Forgets the activity penalties (a model does so before each forward, as Keras).
  virtual void clear_activity_losses() { activity_losses_.clear(); }
  /// Applies the variables' constraints (MaxNorm, ...); models run it after each applied step.
  virtual void apply_constraints();
  /// Keras's <variable>_regularizer / <variable>_constraint (and activity_regularizer) entries of
  /// the rules this layer declares (set_rules), null where none is set: config() adds them.
  nlohmann::json rules_config() const;
  /// Reads those entries back from a saved config into the declared rules (layer_from_config
  /// does it for every layer, so factories need not).
  void set_rules_from(const LayerConfig& config);
  /// Output shape of the last call, batch dimension included (empty before any call).
  const Shape& output_shape() const { return output_shape_; }
  const Shape& input_shape() const { return input_shape_; }

 protected:
  /// Creates a variable in the variable dtype, named "<layer>/<name>".
  /// `initializer`: a name ("ones") or any initializers::Initializer; unseeded ones draw from
  /// the global seed stream (which every add_weight advances by one).
  Variable add_weight(const std::string& name, const Shape& shape, const initializers::Initializer& initializer,
                      bool trainable = true);
  /// Declares Keras's regularizer and constraint of the variables named `variable` or
  /// ".../<variable>" ("kernel" also covers MultiHeadAttention's "query/kernel", ...); nullopt:
  /// none, still saved (as Keras's null) and read back. Their config entries are
  /// <config_key>_regularizer / _constraint, config_key defaulting to the variable's name
  /// (DepthwiseConv2D's kernel: "depthwise").
  void set_rules(const std::string& variable, std::optional<regularizers::Regularizer> r,
                 std::optional<constraints::Constraint> c, const std::string& config_key = "");
  /// Declares the activity regularizer: a penalty on each call's output, divided by its batch
  /// size (Keras 3).
  void set_activity_regularizer(std::optional<regularizers::Regularizer> r) {
    activity_regularizer_ = std::move(r);
    has_activity_rule_ = true;
  }
  /// The activity penalty of a tensor the call computes besides its output (a sublayer's
  /// output, as MultiHeadAttention's projections), when the layer has an activity regularizer.
  void add_activity(const Tensor& y) { record_activity(y); }
  /// A variable in the compute dtype (cached cast; gradient flows back in float32).
  Tensor read(const Variable& v) const { return v.read(compute_dtype()); }
  /// Throws mpt::Error "<Class> '<name>': <message>".
  template <class... Args>
  [[noreturn]] void error(const Args&... args) const {
    fail(class_name_, " '", name_, "': ", args...);
  }
  /// Checks the input rank and (when >= 0) the last dimension, naming this layer.
  void check_input(const Tensor& x, std::int64_t min_rank, std::int64_t last_dim = -1) const;

 private:
  Tensor cast_input(const Tensor& x) const;
  /// The activity penalty of an output, when the layer has an activity regularizer.
  void record_activity(const Tensor& y);
  /// mpt::Error naming both devices when x is not on the device of the layer's variables.
  void check_device(const Tensor& x) const;
  std::string class_name_, name_;
  bool user_name_ = false;
  struct Rules {
    std::string variable, config_key;
    std::optional<regularizers::Regularizer> regularizer;
    std::optional<constraints::Constraint> constraint;
  };
  std::vector<Rules> rules_;
  std::optional<regularizers::Regularizer> activity_regularizer_;
  bool has_activity_rule_ = false;
  std::vector<Tensor> activity_losses_;
  mixed_precision::Policy policy_;
  bool built_ = false, trainable_ = true;
  std::vector<bool> created_trainable_;  // per variable of variables_: add_weight's `trainable`
  std::vector<Variable> variables_;
  Shape input_shape_, output_shape_;
};

/// A shared handle to a layer: what layers::Dense(...) returns and models hold. Calling it
/// calls the layer; copies share the layer (as Python references do).
class LayerRef {
 public:
  LayerRef() = default;
  template <class L>
    requires std::derived_from<L, Layer>
  LayerRef(std::shared_ptr<L> layer) : ptr_(std::move(layer)) {}  // NOLINT
  /// A model as a layer of another model (Model::as_layer): Sequential({..., base, ...}).
  template <class M>
    requires(std::derived_from<M, Model> && !std::derived_from<M, Layer>)
  LayerRef(std::shared_ptr<M> model) : ptr_(model_layer(std::move(model))) {}  // NOLINT
  Tensor operator()(const Tensor& x, CallOptions options = {}) const { return (*ptr_)(x, options); }
  Tensor operator()(const std::vector<Tensor>& xs, CallOptions options = {}) const { return (*ptr_)(xs, options); }
  /// Functional API: records this layer's call on symbolic inputs.
  KerasTensor operator()(const KerasTensor& x) const;
  KerasTensor operator()(const std::vector<KerasTensor>& xs) const;
  KerasTensor operator()(std::initializer_list<KerasTensor> xs) const { return (*this)(std::vector<KerasTensor>(xs)); }
  Layer* operator->() const { return ptr_.get(); }
  Layer& operator*() const { return *ptr_; }
  const std::shared_ptr<Layer>& ptr() const { return ptr_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  static std::shared_ptr<Layer> model_layer(std::shared_ptr<Model> model);  // model.hpp's Model::as_layer
  std::shared_ptr<Layer> ptr_;
};

/// What load_model knows about a saved layer: its class, name, policy, trainable flag and the
/// config() object it was saved with (the rest of Keras's layer config, Keras's initializer
/// objects as saved: read them with get_initializer). The getters raise mpt::Error naming the
/// layer and the key.
struct LayerConfig {
  LayerConfig() = default;
  LayerConfig(std::string class_name, std::string name, mixed_precision::Policy dtype, bool trainable = true,
              nlohmann::json config = nlohmann::json::object())
      : class_name(std::move(class_name)),
        name(std::move(name)),
        dtype(std::move(dtype)),
        trainable(trainable),
        config(std::move(config)) {}

  std::string class_name;
  std::string name;
  mixed_precision::Policy dtype;
  bool trainable = true;
  nlohmann::json config = nlohmann::json::object();

  /// Whether `key` is present and not null.
  bool has(const std::string& key) const;
  /// The entry `key`; mpt::Error when absent.
  const nlohmann::json& at(const std::string& key) const;
  /// A string entry ("relu"). An initializer object reads as its name when it has Keras's
  /// default arguments and no seed, and is refused otherwise (get_initializer reads them all).
  std::string get(const std::string& key) const;
  std::string get(const std::string& key, const std::string& fallback) const;
  std::int64_t get_int(const std::string& key) const;
  std::uint64_t get_uint(const std::string& key) const;
  double get_double(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  /// [2, 3] or [null, 8] (null read as -1); also the text "(None, 8)" of older configs.
  Shape get_shape(const std::string& key) const;
  /// A list or a single number, e.g. kernel_size 3 or [3, 3].
  std::vector<std::int64_t> get_ints(const std::string& key) const;
  /// A Keras initializer entry (a name or Keras's object, with its arguments); absent:
  /// `fallback`; null: GlorotUniform, as Keras's add_weight takes initializer=None. An argument
  /// mpt cannot honour is an mpt::Error naming the layer, the field and the class.
  initializers::Initializer get_initializer(const std::string& key, const initializers::Initializer& fallback) const;
  /// A Keras regularizer / constraint entry (absent or null: none).
  std::optional<regularizers::Regularizer> get_regularizer(const std::string& key) const;
  std::optional<constraints::Constraint> get_constraint(const std::string& key) const;
  /// For a Keras field mpt supports only at one value: absent, null or `supported` passes;
  /// anything else is an mpt::Error naming the class, the layer, the field and the value.
  void expect(const std::string& key, const nlohmann::json& supported) const;
  /// The entries no getter, has() or expect() has looked at, whose values are not null:
  /// layer_from_config refuses a layer whose factory left any (nothing loads silently).
  std::vector<std::string> unread() const;

 private:
  mutable std::set<std::string> read_;
};

/// Rebuilds a layer of one class from its saved config (a public factory call).
using LayerFactory = std::function<LayerRef(const LayerConfig&)>;
/// Tells load_model how to rebuild layers of `class_name`. mpt registers its own layers; a
/// layer file registers its classes at load time:
///
///   static const bool registered = (mpt::register_layer("Scale", [](const mpt::LayerConfig& c) {
///     return mpt::LayerRef(std::make_shared<Scale>());
///   }), true);
void register_layer(const std::string& class_name, LayerFactory factory);
/// A new layer from its config: the registered factory, then name, trainable flag and policy
/// applied; mpt::Error naming the class when none is registered.
LayerRef layer_from_config(const LayerConfig& config);

/// "(None, 28, 28, 1)" for a per-example shape {28, 28, 1}.
std::string batch_shape_string(const Shape& per_example);

/// "Dense" -> "dense", "BatchNormalization" -> "batch_normalization".
std::string to_snake_case(const std::string& class_name);

}  // namespace mpt
