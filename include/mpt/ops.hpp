#pragma once
/// mpt::ops: the functional ops layers and users write models with. Every op validates its
/// inputs (mpt::Error naming the op, shapes, dtypes and devices), dispatches on the device,
/// and records its backward on an active GradientTape. Floating ops work in float32, float16,
/// bfloat16 and float64; 16-bit inputs compute/accumulate in float32 and store 16-bit.
///
///   using namespace mpt;
///   Tensor logits = ops::dense(x, w, b);                    // x.W + b
///   Tensor h = ops::dense(x, w, b, "relu");                  // fused activation
///   Tensor loss = ops::mean(ops::softmax_cross_entropy(logits, labels));
#include <optional>
#include <string>
#include <vector>

#include "mpt/tensor.hpp"

namespace mpt::ops {

// ---- elementwise (broadcasting like numpy; both operands of one dtype and device) ----------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
/// Integer division truncates toward zero; an integer divided by zero gives 0 (NumPy's result).
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
/// min(max(x, 0), 6) (Keras's relu6, MobileNet's ReLU6).
Tensor relu6(const Tensor& x);
/// x where x >= 0, else negative_slope * x (Keras's leaky_relu; its LeakyReLU layer's default
/// slope is 0.3).
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.2);
/// GELU: exact (erf), Keras's activation default; approximate = true is the tanh form
/// (Keras's gelu(approximate=True), PyTorch's gelu(approximate="tanh")).
Tensor gelu(const Tensor& x, bool approximate = false);
Tensor silu(const Tensor& x);
/// By Keras name: linear, exponential, relu, relu6, leaky_relu, sigmoid, tanh, gelu, silu
/// (swish), softmax.
/// Checks an activation name by table lookup (no op runs): mpt::Error listing the valid names.
void check_activation(const std::string& name);
Tensor activation(const Tensor& x, const std::string& name);

// comparisons give bool tensors and no gradient
Tensor equal(const Tensor& a, const Tensor& b);
Tensor not_equal(const Tensor& a, const Tensor& b);
Tensor less(const Tensor& a, const Tensor& b);
Tensor less_equal(const Tensor& a, const Tensor& b);
Tensor greater(const Tensor& a, const Tensor& b);
Tensor greater_equal(const Tensor& a, const Tensor& b);
/// cond ? a : b with broadcasting; cond is bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// ---- reductions (axes may be negative; empty = all axes) ----------------------------------
Tensor sum(const Tensor& x, std::vector<std::int64_t> axes = {}, bool keepdims = false);
Tensor mean(const Tensor& x, std::vector<std::int64_t> axes = {}, bool keepdims = false);
Tensor max(const Tensor& x, std::vector<std::int64_t> axes = {}, bool keepdims = false);
Tensor min(const Tensor& x, std::vector<std::int64_t> axes = {}, bool keepdims = false);
/// Index of the maximum along `axis` (int64; the axis is removed).
Tensor argmax(const Tensor& x, std::int64_t axis = -1);
/// Sums x down to `shape` (the inverse of broadcasting; used by gradients).
Tensor sum_to(const Tensor& x, const Shape& shape);
Tensor broadcast_to(const Tensor& x, const Shape& shape);

// ---- linear algebra ----------------------------------------------------------------------
/// a [..., M, K] . b [..., K, N] (or transposed operands); batch dims equal or absent in one.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
/// act(x . w + b): x [..., in], w [in, units], b [units] or undefined. One fused op.
Tensor dense(const Tensor& x, const Tensor& w, const Tensor& b = {},
             const std::string& activation = "linear");

// ---- nn ----------------------------------------------------------------------------------
Tensor softmax(const Tensor& x, std::int64_t axis = -1);
Tensor log_softmax(const Tensor& x, std::int64_t axis = -1);

struct CrossEntropyOptions {
  /// true: `x` holds logits; false: probabilities (normalised and clipped as in Keras).
  bool from_logits = true;
};
/// Per-example cross-entropy, float32 (float64 for float64 input), shape x.shape()[:-1].
/// labels: integer class ids (sparse) shaped like the result, or a float distribution
/// (one-hot) shaped like x. One fused op; its gradient is softmax(x) - labels.
Tensor softmax_cross_entropy(const Tensor& x, const Tensor& labels, CrossEntropyOptions options = {});

// ---- dtype and shape ---------------------------------------------------------------------
/// Gradient flows back in x's dtype.
Tensor cast(const Tensor& x, DType dtype);
Tensor reshape(const Tensor& x, const Shape& shape);
/// Permutes axes (default: reverse them).
Tensor transpose(const Tensor& x, std::vector<std::int64_t> perm = {});
Tensor concat(const std::vector<Tensor>& xs, std::int64_t axis = 0);
/// Rows x[indices[k]] along the first axis, in one backend call; indices int64 [K] on x's device
/// and in range (not checked on the device: the host checks its index lists before upload).
/// A data op: not recorded on a tape.
Tensor gather_rows(const Tensor& x, const Tensor& indices);
/// Rows of `table` [rows, ...] by `ids` (any shape; integers, or integral floats, which are
/// truncated as Keras casts them), each in [0, rows): [ids..., ...] in `dtype` (default: the
/// table's). Keras's Embedding lookup (ops.take(table, ids, axis=0)), PyTorch's F.embedding.
/// Differentiable in the table: its gradient is the output gradient's rows added at their ids
/// in float32 (float64 for a float64 table), repeated ids summed in order, the same bits on
/// every device. Out-of-range ids are an mpt::Error (one host read of their min and max).
Tensor embedding(const Tensor& ids, const Tensor& table, std::optional<DType> dtype = std::nullopt);
/// Elements [begin, end) along `axis` (a copy).
Tensor slice(const Tensor& x, std::int64_t axis, std::int64_t begin, std::int64_t end);
/// indices (integer) -> [..., depth] in `dtype`; out-of-range indices give zero rows.
Tensor one_hot(const Tensor& indices, std::int64_t depth, DType dtype = float32);

/// True when any element is inf or NaN.
bool has_nonfinite(const Tensor& x);

}  // namespace mpt::ops
