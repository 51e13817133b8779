// A model used as a layer of another model (Keras's nested models): ModelLayer is the Layer that
// stands for a Model inside another model's graph. It owns the model (shared), runs it, and
// forwards what models ask their layers (variables, trainable flag, penalties, constraints,
// finish_step, random state) to the model's own layers. See docs/design.md, "Nested models".
#include "mpt/model.hpp"

namespace mpt {

namespace {

std::string model_class(const Model& m) { return dynamic_cast<const Sequential*>(&m) ? "Sequential" : "Functional"; }

class ModelLayer final : public Layer {
 public:
  explicit ModelLayer(std::shared_ptr<Model> m)
      : Layer(model_class(*m), m->dtype_policy(),
              // A model's default name ("functional", "sequential") is no user name: the outer
              // model may number it ("functional_1") as it numbers its other layers.
              m->name() == to_snake_case(model_class(*m)) ? std::string() : m->name()),
        model_(std::move(m)) {}

  const std::shared_ptr<Model>& model() const { return model_; }

  void set_name(const std::string& name) override {
    Layer::set_name(name);
    model_->set_name(name);
  }
  bool trainable() const override { return model_->trainable(); }
  void set_trainable(bool on) override {
    Layer::set_trainable(on);
    model_->set_trainable(on);
  }

  /// The model's variables, their paths under this layer's name ("functional/dense/kernel"), so
  /// that they stay distinct from the outer model's own ("dense/kernel"): optimizer slots and
  /// checkpoints key on paths.
  std::vector<Variable> variables() const override {
    std::vector<Variable> out;
    const std::string prefix = name() + "/";
    for (const auto& l : model_->layers()) {
      const bool nested = detail::nested_model(*l) != nullptr;
      for (const auto& v : l->variables()) {
        const std::string path = nested ? prefix + v.path() : prefix + l->name() + "/" + v.name();
        if (v.path() != path) v.set_path(path);
        out.push_back(v);
      }
    }
    return out;
  }

  std::vector<Tensor> losses() const override { return model_->losses(); }
  void clear_activity_losses() override {
    for (const auto& l : model_->layers()) l->clear_activity_losses();
  }
  void apply_constraints() override {
    for (const auto& l : model_->layers()) l->apply_constraints();
  }
  void finish_step(bool applied) override {
    for (const auto& l : model_->layers()) l->finish_step(applied);
  }

  /// The model's layers' random states, one after another.
  std::vector<std::uint64_t> rng_state() const override {
    std::vector<std::uint64_t> out;
    for (const auto& l : model_->layers()) {
      const auto s = l->rng_state();
      out.insert(out.end(), s.begin(), s.end());
    }
    return out;
  }
  void set_rng_state(const std::vector<std::uint64_t>& state) override {
    std::size_t at = 0;
    for (const auto& l : model_->layers()) {
      const std::size_t n = l->rng_state().size();
      if (n == 0) continue;
      if (at + n > state.size()) error("random state of ", state.size(), " values is too short for the model's layers");
      l->set_rng_state(std::vector<std::uint64_t>(state.begin() + static_cast<std::ptrdiff_t>(at),
                                                  state.begin() + static_cast<std::ptrdiff_t>(at + n)));
      at += n;
    }
    if (at != state.size()) error("random state of ", state.size(), " values, the model's layers keep ", at);
  }

  // The model's layers cast their own inputs, each to its policy.
  bool autocast() const override { return false; }
  void build(const Shape&) override {}
  void build_multi(const std::vector<Shape>&) override {}

  Tensor call(const Tensor& x, bool training) override {
    try {
      model_->check_input(x);
    } catch (const Error& e) {
      error("a model used as a layer got an input it does not take: ", e.what());
    }
    return model_->call(x, training);
  }
  Tensor call_multi(const std::vector<Tensor>& xs, bool training) override {
    auto out = model_->call(xs, training);
    if (out.size() != 1) error("has ", out.size(), " outputs; mpt's layers have one");
    return out[0];
  }

 private:
  std::shared_ptr<Model> model_;
};

}  // namespace

std::shared_ptr<Model> detail::nested_model(const Layer& layer) {
  const auto* m = dynamic_cast<const ModelLayer*>(&layer);
  return m ? m->model() : nullptr;
}

std::shared_ptr<Layer> LayerRef::model_layer(std::shared_ptr<Model> model) {
  MPT_CHECK(model != nullptr, "a null model used as a layer");
  if (auto l = model->as_layer_.lock()) return l;
  // Layers have one output: so must a model used as one.
  MPT_CHECK(model->outputs_.size() <= 1, "Model '", model->name(), "': has ", model->outputs_.size(),
            " outputs; a model used as a layer of another must have one (mpt's layers have one output)");
  auto l = std::make_shared<ModelLayer>(model);
  model->as_layer_ = l;
  return l;
}

LayerRef Model::as_layer() {
  std::shared_ptr<Model> self = weak_from_this().lock();
  MPT_CHECK(self != nullptr, "Model '", name_, "': a model used as a layer of another must be owned by a ",
            "std::shared_ptr (std::make_shared<mpt::Sequential>(...), std::make_shared<mpt::Model>(in, out), or ",
            "std::shared_ptr<mpt::Model> base = mpt::load_model(path))");
  return LayerRef(self);
}

void Model::set_trainable(bool on) {
  trainable_ = on;
  for (const auto& l : layers()) l->set_trainable(on);
}

}  // namespace mpt
