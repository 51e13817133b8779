// Embedding: integer ids -> rows of a learned table (Keras's keras.layers.Embedding).
#include "config_values.hpp"
#include "mpt/layers/core.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

class EmbeddingLayer : public Layer {
 public:
  EmbeddingLayer(std::int64_t input_dim, std::int64_t output_dim, EmbeddingOptions o)
      : Layer("Embedding", o.dtype, o.name), input_dim_(input_dim), output_dim_(output_dim), o_(std::move(o)) {
    if (input_dim <= 0 || output_dim <= 0)
      error("input_dim and output_dim must be positive, got ", input_dim, " and ", output_dim);
    if (o_.mask_zero)
      error("mask_zero=true is not supported: mpt propagates no masks, so id 0 would still be attended to and "
            "counted; give padding its own id and a loss ignore_class instead");
    set_activity_regularizer(o_.activity_regularizer);
    set_rules("embeddings", o_.embeddings_regularizer, o_.embeddings_constraint);
  }
  // Ids stay as they come: a 16-bit cast would round ids above 256 (bfloat16) or 2048 (float16).
  bool autocast() const override { return false; }
  void build(const Shape&) override {
    embeddings_ = add_weight("embeddings", {input_dim_, output_dim_}, o_.embeddings_initializer);
  }
  Tensor call(const Tensor& ids, bool) override {
    // The float32 table itself, not a 16-bit copy: rows are cast after the lookup, and the
    // gradient is accumulated in float32 by the op.
    try {
      return ops::embedding(ids, embeddings_.value(), compute_dtype());
    } catch (const Error& e) {
      error(e.what());
    }
  }
  nlohmann::json config() const override {
    nlohmann::json c = {{"input_dim", input_dim_},
                        {"output_dim", output_dim_},
                        {"embeddings_initializer", o_.embeddings_initializer},
                        {"mask_zero", o_.mask_zero}};
    c.update(rules_config());
    return c;
  }

 private:
  std::int64_t input_dim_, output_dim_;
  EmbeddingOptions o_;
  Variable embeddings_;
};

const bool registered = [] {
  register_layer("Embedding", [](const LayerConfig& c) {
    c.has("input_length");  // Keras 2's, for shape inference only
    return Embedding(c.get_int("input_dim"), c.get_int("output_dim"),
                     {.embeddings_initializer = c.get_initializer("embeddings_initializer", "uniform"),
                      .mask_zero = c.has("mask_zero") && c.get_bool("mask_zero"),
                      .dtype = c.dtype,
                      .name = c.name});
  });
  return true;
}();

}  // namespace

LayerRef Embedding(std::int64_t input_dim, std::int64_t output_dim, EmbeddingOptions options) {
  return std::make_shared<EmbeddingLayer>(input_dim, output_dim, std::move(options));
}

}  // namespace mpt::layers
