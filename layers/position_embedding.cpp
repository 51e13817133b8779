// PositionEmbedding (Keras-Hub's keras_hub.layers.PositionEmbedding): a learned [sequence_length,
// features] table whose first T rows are returned broadcast to the input [batch, T, features];
// the model adds them to its token embeddings.
#include "mpt/layers/core.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

class PositionEmbeddingLayer : public Layer {
 public:
  PositionEmbeddingLayer(std::int64_t sequence_length, PositionEmbeddingOptions o)
      : Layer("PositionEmbedding", o.dtype, o.name), sequence_length_(sequence_length), o_(std::move(o)) {
    if (sequence_length <= 0) error("sequence_length must be positive, got ", sequence_length);
  }
  void build(const Shape& s) override {
    if (s.size() < 2) error("expected an input of rank >= 2 ([batch, ..., sequence, features]), got ", to_string(s));
    embeddings_ = add_weight("embeddings", {sequence_length_, s.back()}, o_.initializer);
  }
  Tensor call(const Tensor& x, bool) override {
    check_input(x, 2, embeddings_.shape()[1]);
    const std::int64_t t = x.shape()[x.dim() - 2];
    if (t > sequence_length_)
      error("the input's sequence axis has ", t, " positions, more than sequence_length ", sequence_length_,
            " (input shape ", to_string(x.shape()), ")");
    return ops::broadcast_to(ops::slice(read(embeddings_), 0, 0, t), x.shape());
  }
  nlohmann::json config() const override {
    return {{"sequence_length", sequence_length_}, {"initializer", o_.initializer}};
  }

 private:
  std::int64_t sequence_length_;
  PositionEmbeddingOptions o_;
  Variable embeddings_;
};

const bool registered = [] {
  register_layer("PositionEmbedding", [](const LayerConfig& c) {
    return PositionEmbedding(c.get_int("sequence_length"),
                             {.initializer = c.get_initializer("initializer", "glorot_uniform"), .dtype = c.dtype, .name = c.name});
  });
  return true;
}();

}  // namespace

LayerRef PositionEmbedding(std::int64_t sequence_length, PositionEmbeddingOptions options) {
  return std::make_shared<PositionEmbeddingLayer>(sequence_length, std::move(options));
}

}  // namespace mpt::layers
