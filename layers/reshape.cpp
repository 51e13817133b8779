#include <algorithm>

#include "mpt/layers/core.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

class FlattenLayer : public Layer {
 public:
  explicit FlattenLayer(LayerOptions o) : Layer("Flatten", o.dtype, o.name) {}
  Tensor call(const Tensor& x, bool) override {
    check_input(x, 1);
    std::int64_t per = 1;
    for (std::int64_t i = 1; i < x.dim(); ++i) per *= x.shape()[i];
    return ops::reshape(x, {x.shape()[0], per});
  }
};

class ReshapeLayer : public Layer {
 public:
  ReshapeLayer(Shape target, LayerOptions o) : Layer("Reshape", o.dtype, o.name), target_(std::move(target)) {
    Shape known_dims;
    for (auto d : target_) {
      if (d != -1) known_dims.push_back(d);
      else if (has_infer_) error("target_shape ", batch_shape_string(target_), " has more than one -1");
      else has_infer_ = true;
    }
    for (auto d : known_dims)
      if (d < 0) error("target_shape ", batch_shape_string(target_), " has a negative dimension");
    known_ = numel_of(known_dims);  // an mpt::Error when the product overflows
  }
  Tensor call(const Tensor& x, bool) override {
    check_input(x, 1);
    Shape s{x.shape()[0]};
    s.insert(s.end(), target_.begin(), target_.end());
    const std::int64_t known = known_, per = x.numel() / std::max<std::int64_t>(x.shape()[0], 1);
    const bool has_infer = has_infer_;
    if ((has_infer && (known == 0 || per % known != 0)) || (!has_infer && known != per))
      error("cannot reshape input of shape ", to_string(x.shape()), " to ", batch_shape_string(target_));
    return ops::reshape(x, s);
  }
  nlohmann::json config() const override { return {{"target_shape", target_}}; }

 private:
  Shape target_;
  std::int64_t known_ = 1;  // product of the dimensions other than -1
  bool has_infer_ = false;
};

}  // namespace

LayerRef Flatten(LayerOptions o) { return std::make_shared<FlattenLayer>(std::move(o)); }
LayerRef Reshape(const Shape& target, LayerOptions o) { return std::make_shared<ReshapeLayer>(target, std::move(o)); }

}  // namespace mpt::layers
