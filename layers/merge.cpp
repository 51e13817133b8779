#include "config_values.hpp"
#include "mpt/layers/merge.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

std::string shapes_text(const std::vector<Shape>& shapes) {
  std::string s;
  for (const auto& sh : shapes) s += (s.empty() ? "" : ", ") + to_string(sh);
  return s;
}

std::vector<Shape> shapes_of(const std::vector<Tensor>& xs) {
  std::vector<Shape> s;
  for (const auto& x : xs) s.push_back(x.shape());
  return s;
}

class AddLayer : public Layer {
 public:
  explicit AddLayer(LayerOptions o) : Layer("Add", o.dtype, o.name) {}
  void build_multi(const std::vector<Shape>& shapes) override { check(shapes); }
  Tensor call(const Tensor&, bool) override { error("expects a list of at least 2 inputs, got 1"); }
  Tensor call_multi(const std::vector<Tensor>& xs, bool) override {
    check(shapes_of(xs));
    Tensor y = xs[0];
    for (std::size_t i = 1; i < xs.size(); ++i) y = ops::add(y, xs[i]);
    return y;
  }

 private:
  /// Same rank, and each axis equal or 1 (broadcast), as Keras's merge layers.
  void check(const std::vector<Shape>& shapes) const {
    if (shapes.size() < 2) error("expects a list of at least 2 inputs, got ", shapes.size());
    for (const auto& s : shapes) {
      bool ok = s.size() == shapes[0].size();
      for (std::size_t d = 0; ok && d < s.size(); ++d) ok = s[d] == shapes[0][d] || s[d] == 1 || shapes[0][d] == 1;
      if (!ok) error("inputs have incompatible shapes: ", shapes_text(shapes));
    }
  }
};

class ConcatenateLayer : public Layer {
 public:
  explicit ConcatenateLayer(ConcatenateOptions o) : Layer("Concatenate", o.dtype, o.name), axis_(o.axis) {}
  void build_multi(const std::vector<Shape>& shapes) override { check(shapes); }
  Tensor call(const Tensor&, bool) override { error("expects a list of at least 2 inputs, got 1"); }
  Tensor call_multi(const std::vector<Tensor>& xs, bool) override { return ops::concat(xs, check(shapes_of(xs))); }
  nlohmann::json config() const override { return {{"axis", axis_}}; }

 private:
  /// The normalized axis; every other axis must agree.
  std::int64_t check(const std::vector<Shape>& shapes) const {
    if (shapes.size() < 2) error("expects a list of at least 2 inputs, got ", shapes.size());
    const auto rank = static_cast<std::int64_t>(shapes[0].size());
    if (axis_ < -rank || axis_ >= rank) error("axis ", axis_, " is out of range for inputs of shapes ", shapes_text(shapes));
    const std::int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    for (const auto& s : shapes) {
      bool ok = static_cast<std::int64_t>(s.size()) == rank;
      for (std::int64_t d = 0; ok && d < rank; ++d) ok = d == axis || s[d] == shapes[0][d];
      if (!ok) error("inputs must match on every axis but ", axis_, ", got shapes ", shapes_text(shapes));
    }
    return axis;
  }
  std::int64_t axis_;
};

const bool registered = [] {
  register_layer("Add", [](const LayerConfig& c) { return Add({.dtype = c.dtype, .name = c.name}); });
  register_layer("Concatenate", [](const LayerConfig& c) {
    return Concatenate({.axis = c.has("axis") ? c.get_int("axis") : -1, .dtype = c.dtype, .name = c.name});
  });
  return true;
}();

}  // namespace

LayerRef Add(LayerOptions o) { return std::make_shared<AddLayer>(std::move(o)); }
LayerRef Concatenate(ConcatenateOptions o) { return std::make_shared<ConcatenateLayer>(std::move(o)); }

}  // namespace mpt::layers
