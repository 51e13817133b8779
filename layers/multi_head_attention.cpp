// MultiHeadAttention (Keras's keras.layers.MultiHeadAttention): query/key/value projections with
// Keras's EinsumDense kernel layout, ops::dot_product_attention per head, and the output
// projection back to the query's features.
#include <cmath>

#include "config_values.hpp"
#include "mpt/layers/attention.hpp"
#include "mpt/nn_ops.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

/// The four projections, in Keras's build order, with their Keras 3 weights-file groups.
enum Proj : std::size_t { kQuery, kKey, kValue, kOutput, kProjections };
constexpr const char* kProjName[kProjections] = {"query", "key", "value", "attention_output"};
constexpr const char* kProjGroup[kProjections] = {"query_dense", "key_dense", "value_dense", "output_dense"};

class MultiHeadAttentionLayer : public Layer {
 public:
  MultiHeadAttentionLayer(std::int64_t num_heads, std::int64_t key_dim, MultiHeadAttentionOptions o)
      : Layer("MultiHeadAttention", o.dtype, o.name),
        heads_(num_heads),
        key_dim_(key_dim),
        value_dim_(o.value_dim.value_or(key_dim)),
        seed_(o.seed ? *o.seed : mpt::detail::next_seed()),
        o_(std::move(o)) {
    if (heads_ <= 0 || key_dim_ <= 0 || value_dim_ <= 0)
      error("num_heads, key_dim and value_dim must be positive, got ", heads_, ", ", key_dim_, " and ", value_dim_);
    if (!(o_.dropout >= 0.0 && o_.dropout < 1.0)) error("dropout must be in [0, 1), got ", o_.dropout);
    if (o_.output_shape && *o_.output_shape <= 0) error("output_shape must be positive, got ", *o_.output_shape);
    set_rules("kernel", o_.kernel_regularizer, o_.kernel_constraint);
    set_rules("bias", o_.bias_regularizer, o_.bias_constraint);
    // Layer records it on the call's output (the output projection's); attend() adds the
    // query, key and value projections'.
    set_activity_regularizer(o_.activity_regularizer);
  }

  // One input x is self-attention: {x, x}.
  Tensor call(const Tensor& x, bool training) override { return attend(x, x, x, Tensor(), training); }
  void build_multi(const std::vector<Shape>& shapes) override {
    if (shapes.size() < 2 || shapes.size() > 4)
      error("expects {query, value}, {query, value, key} or either with an attention mask, got ", shapes.size(),
            " inputs");
  }
  Tensor call_multi(const std::vector<Tensor>& xs, bool training) override {
    std::vector<Tensor> ts(xs);
    Tensor mask;
    if (!is_floating(ts.back().dtype())) {
      mask = ts.back();
      ts.pop_back();
    }
    for (std::size_t i = 0; i < ts.size(); ++i)
      if (!is_floating(ts[i].dtype()))
        error("input ", i, " has dtype ", to_string(ts[i].dtype()),
              "; only the last input (the attention mask) may be non-floating");
    if (ts.size() < 2 || ts.size() > 3)
      error("expects {query, value} or {query, value, key} before the mask, got ", ts.size(), " floating inputs");
    return attend(ts[0], ts[1], ts.size() == 3 ? ts[2] : ts[1], mask, training);
  }

  nlohmann::json config() const override {
    nlohmann::json c = {{"num_heads", heads_},
            {"key_dim", key_dim_},
            {"value_dim", value_dim_},
            {"dropout", o_.dropout},
            {"use_bias", o_.use_bias},
            {"output_shape", o_.output_shape ? nlohmann::json(*o_.output_shape) : nlohmann::json(nullptr)},
            {"attention_axes", nlohmann::json::array({1})},
            {"kernel_initializer", o_.kernel_initializer},
            {"bias_initializer", o_.bias_initializer},
            {"seed", seed_},
            {"use_causal_mask", o_.use_causal_mask}};
    c.update(rules_config());
    return c;
  }
  std::vector<std::string> call_option_keys() const override { return {"use_causal_mask"}; }
  std::vector<std::string> call_argument_names() const override {
    return {"query", "value", "key", "attention_mask"};
  }
  std::vector<std::string> call_arguments_of(const std::vector<DType>& dtypes) const override {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < dtypes.size(); ++i)
      out.push_back(!is_floating(dtypes[i]) ? "attention_mask" : i < 3 ? call_argument_names()[i] : "?");
    return out;
  }
  std::string variable_group(std::size_t i) const override {
    return i < vars_.size() ? kProjGroup[vars_[i]] : "";
  }
  std::vector<std::uint64_t> rng_state() const override { return {calls_}; }
  void set_rng_state(const std::vector<std::uint64_t>& s) override {
    if (s.size() != 1) error("expected 1 random-state value, got ", s.size());
    calls_ = s[0];
  }

 private:
  void check_rank3(const Tensor& t, const char* what) const {
    if (t.dim() != 3)
      error("expected the ", what, " as [batch, sequence, features], got shape ", to_string(t.shape()));
  }

  /// Creates the projections' weights on the first call (Keras's build(query, value, key)).
  void ensure_weights(std::int64_t dq, std::int64_t dk, std::int64_t dv) {
    if (!kernel_[kQuery].defined()) {
      const std::int64_t out_dim = o_.output_shape.value_or(dq);
      const std::int64_t in[3] = {dq, dk, dv}, per_head[3] = {key_dim_, key_dim_, value_dim_};
      for (std::size_t p = kQuery; p <= kValue; ++p) {
        add(p, "kernel", {in[p], heads_, per_head[p]}, o_.kernel_initializer, kernel_[p]);
        if (o_.use_bias) add(p, "bias", {heads_, per_head[p]}, o_.bias_initializer, bias_[p]);
      }
      add(kOutput, "kernel", {heads_, value_dim_, out_dim}, o_.kernel_initializer, kernel_[kOutput]);
      if (o_.use_bias) add(kOutput, "bias", {out_dim}, o_.bias_initializer, bias_[kOutput]);
    }
    const std::int64_t want[3] = {dq, dk, dv};
    for (std::size_t p = kQuery; p <= kValue; ++p)
      if (kernel_[p].shape()[0] != want[p])
        error("the ", kProjName[p], " has ", want[p], " features; the layer was built for ", kernel_[p].shape()[0]);
  }
  void add(std::size_t p, const char* what, const Shape& shape, const initializers::Initializer& init, Variable& v) {
    v = add_weight(std::string(kProjName[p]) + "/" + what, shape, init);
    vars_.push_back(p);
  }

  /// x [B, T, d] through projection p: [B, T, heads, per_head].
  Tensor project(const Tensor& x, std::size_t p) const {
    const Shape& k = kernel_[p].shape();
    Tensor w = ops::reshape(read(kernel_[p]), {k[0], k[1] * k[2]});
    Tensor b = o_.use_bias ? ops::reshape(read(bias_[p]), {k[1] * k[2]}) : Tensor();
    return ops::reshape(ops::dense(x, w, b), {x.shape()[0], x.shape()[1], k[1], k[2]});
  }

  Tensor attend(const Tensor& query, const Tensor& value, const Tensor& key, const Tensor& mask, bool training) {
    check_rank3(query, "query");
    check_rank3(value, "value");
    check_rank3(key, "key");
    if (key.shape()[0] != value.shape()[0] || key.shape()[1] != value.shape()[1])
      error("key ", to_string(key.shape()), " and value ", to_string(value.shape()),
            " must agree on batch and sequence");
    if (query.shape()[0] != value.shape()[0])
      error("query ", to_string(query.shape()), " and value ", to_string(value.shape()), " must agree on batch");
    const std::int64_t batch = query.shape()[0], tq = query.shape()[1], tk = key.shape()[1];
    if (mask.defined() && (mask.dim() != 3 || mask.shape()[0] != batch || mask.shape()[1] != tq ||
                           mask.shape()[2] != tk))
      error("the attention mask must be [batch, Tq, Tk] = [", batch, ", ", tq, ", ", tk, "], got ",
            to_string(mask.shape()));
    ensure_weights(query.shape()[2], key.shape()[2], value.shape()[2]);
    Tensor q = project(query, kQuery), k = project(key, kKey), v = project(value, kValue);
    for (const Tensor* t : {&q, &k, &v}) add_activity(*t);
    const double scale = 1.0 / std::sqrt(static_cast<double>(key_dim_));
    Tensor bool_mask = mask.defined() && mask.dtype() != bool_
                           ? ops::not_equal(mask, Tensor::scalar(0, mask.dtype(), mask.device()))
                           : mask;
    Tensor o = training && o_.dropout > 0.0 ? attend_with_dropout(q, k, v, bool_mask, scale)
                                            : ops::dot_product_attention(
                                                  q, k, v, {.mask = bool_mask, .is_causal = o_.use_causal_mask,
                                                            .scale = scale});
    // [B, Tq, heads, value_dim] -> [B, Tq, out] through attention_output/kernel [heads, value_dim, out].
    const Shape& ko = kernel_[kOutput].shape();
    Tensor w = ops::reshape(read(kernel_[kOutput]), {ko[0] * ko[1], ko[2]});
    return ops::dense(ops::reshape(o, {batch, tq, ko[0] * ko[1]}), w,
                      o_.use_bias ? read(bias_[kOutput]) : Tensor());
  }

  /// Dropout on the probabilities needs them: scores [B, heads, Tq, Tk] and softmax in float32
  /// (float64 for float64), masked positions exactly 0 (a row with none attends to nothing).
  Tensor attend_with_dropout(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double scale) {
    const DType c = q.dtype() == float64 ? float64 : float32;
    const Device dev = q.device();
    Tensor qh = ops::transpose(ops::cast(q, c), {0, 2, 1, 3}), kh = ops::transpose(ops::cast(k, c), {0, 2, 1, 3});
    Tensor s = ops::mul(ops::matmul(qh, kh, false, true), Tensor::scalar(scale, c, dev));
    const std::int64_t batch = q.shape()[0], tq = q.shape()[1], tk = k.shape()[1];
    Tensor keep;  // bool [B, 1, Tq, Tk] or [Tq, Tk]
    if (mask.defined()) keep = ops::reshape(mask, {batch, 1, tq, tk});
    if (o_.use_causal_mask) {
      Tensor causal = ops::greater_equal(ops::reshape(Tensor::arange(0, double(tq), 1, int64, dev), {tq, 1}),
                                         ops::reshape(Tensor::arange(0, double(tk), 1, int64, dev), {1, tk}));
      keep = keep.defined() ? ops::where(keep, causal, Tensor::scalar(0, bool_, dev)) : causal;
    }
    Tensor p;
    if (keep.defined()) {
      Tensor zero = Tensor::scalar(0.0, c, dev);
      p = ops::where(keep, ops::softmax(ops::where(keep, s, Tensor::scalar(-1e30, c, dev))), zero);
    } else {
      p = ops::softmax(s);
    }
    Tensor u = Tensor::random_uniform(p.shape(), 0.0, 1.0, seed_, float32, dev, calls_++);
    p = ops::where(ops::greater_equal(u, Tensor::scalar(o_.dropout, float32, dev)),
                   ops::mul(p, Tensor::scalar(1.0 / (1.0 - o_.dropout), c, dev)), Tensor::scalar(0.0, c, dev));
    Tensor vh = ops::transpose(v, {0, 2, 1, 3});
    Tensor o = ops::matmul(ops::cast(p, v.dtype()), vh);  // [B, heads, Tq, value_dim]
    return ops::transpose(o, {0, 2, 1, 3});
  }

  std::int64_t heads_, key_dim_, value_dim_;
  std::uint64_t seed_;
  MultiHeadAttentionOptions o_;
  Variable kernel_[kProjections], bias_[kProjections];
  std::vector<std::size_t> vars_;  ///< each variable's projection, in order
  std::uint64_t calls_ = 0;
};

const bool registered = [] {
  register_layer("MultiHeadAttention", [](const LayerConfig& c) {
    // Keras options mpt does not implement are refused rather than dropped.
    if (c.has("attention_axes")) {
      const auto axes = c.get_ints("attention_axes");
      if (axes != std::vector<std::int64_t>{1} && axes != std::vector<std::int64_t>{-2})
        fail("MultiHeadAttention '", c.name, "': attention_axes ", c.at("attention_axes").dump(),
             " is not supported (only the sequence axis of [batch, T, features] inputs)");
    }
    c.expect("use_gate", false);
    c.expect("sliding_window", nullptr);
    if (c.has("output_shape") && c.at("output_shape").is_array() && c.at("output_shape").size() != 1)
      fail("MultiHeadAttention '", c.name, "': output_shape ", c.at("output_shape").dump(),
           " is not supported (one output dimension)");
    MultiHeadAttentionOptions o{.dropout = c.has("dropout") ? c.get_double("dropout") : 0.0,
                                .use_bias = !c.has("use_bias") || c.get_bool("use_bias"),
                                .use_causal_mask = c.has("use_causal_mask") && c.get_bool("use_causal_mask"),
                                .kernel_initializer = c.get_initializer("kernel_initializer", "glorot_uniform"),
                                .bias_initializer = c.get_initializer("bias_initializer", "zeros"),
                                .dtype = c.dtype,
                                .name = c.name};
    if (c.has("value_dim")) o.value_dim = c.get_int("value_dim");
    if (c.has("output_shape")) o.output_shape = detail::one_axis(c, "output_shape");
    if (c.has("seed")) o.seed = c.get_uint("seed");
    return MultiHeadAttention(c.get_int("num_heads"), c.get_int("key_dim"), std::move(o));
  });
  return true;
}();

}  // namespace

LayerRef MultiHeadAttention(std::int64_t num_heads, std::int64_t key_dim, MultiHeadAttentionOptions options) {
  return std::make_shared<MultiHeadAttentionLayer>(num_heads, key_dim, std::move(options));
}

}  // namespace mpt::layers
