#pragma once
// The op list every backend implements (CPU now; CUDA mirrors it file for file), and the memory
// a device's tensors live in. Ops in src/ops validate shapes, dtypes and devices once and
// allocate outputs; kernels here only compute. Tensors handed in are contiguous and on the
// backend's device. Host code outside a backend never dereferences device memory: the test
// device (tests/device) faults when it does.
#include <cstdint>
#include <vector>

#include "mpt/memory.hpp"
#include "mpt/tensor.hpp"
#include "backend/common/attention.hpp"   // AttentionGeometry
#include "backend/common/binary_ops.hpp"  // BinaryOp: the table of binary ops
#include "backend/common/image_transform.hpp"  // ImageTransform: ops::affine_transform, ops::resize
#include "backend/common/adafactor.hpp"     // AdafactorShape, AdafactorHyper: mpt::ops::adafactor_update
#include "backend/common/optim_rules.hpp"  // RuleKind, RuleHyper: the update rules of mpt::ops::rule_update
#include "backend/common/unary_ops.hpp"   // UnaryOp, Activation: the table of unary ops and activations

namespace mpt {
namespace ops {
struct LossScaleRule;  // mpt/optim_ops.hpp: the parameters update_loss_scale takes (backends implementing it include that header)
}  // namespace ops

enum class ReduceOp : std::uint8_t { Sum, Mean, Max, Min };

/// Geometry of a 2-D convolution over NHWC activations with [kh, kw, Cin / groups, Cout]
/// kernels: explicit (possibly asymmetric) zero padding, strides, dilation (1 = dense) and
/// groups (output channel block g of Cout / groups sees input block g of Cin / groups).
struct Conv2dGeometry {
  std::int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  std::int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  std::int64_t groups = 1;
};
/// Max pooling, or average pooling that leaves padding out of the average (Keras 'same').
enum class PoolKind : std::uint8_t { Max, Avg };
struct Pool2dGeometry {
  PoolKind kind = PoolKind::Max;
  std::int64_t pool_h = 2, pool_w = 2, stride_h = 2, stride_w = 2;
  std::int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- memory (memory.cpp) ----------------------------------------------------------------
  /// Raw memory of at least nbytes on `device` (one of this backend's devices); never returns
  /// null. Unless caches_memory(), the caching allocator in src/core/memory.cpp sits on top.
  virtual void* allocate(Device device, std::size_t nbytes) = 0;
  virtual void deallocate(Device device, void* ptr) = 0;
  /// Copies between `device` and the host, or within `device`. copy_to_host returns once the
  /// bytes are on the host (after the work queued before it).
  virtual void copy_from_host(Device device, void* dst, const void* host_src, std::size_t n) = 0;
  virtual void copy_to_host(Device device, void* host_dst, const void* src, std::size_t n) = 0;
  virtual void copy_on_device(Device device, void* dst, const void* src, std::size_t n) = 0;
  /// True when allocate/deallocate are a caching allocator of the backend's own (CUDA: stream
  /// ordered, with splitting); src/core/memory.cpp then calls them per tensor and asks the
  /// backend for the statistics below instead of keeping size classes itself.
  virtual bool caches_memory() const { return false; }
  virtual MemoryStats memory_stats(Device device) { return {}; }
  virtual void reset_peak_memory(Device device) {}
  virtual void empty_cache(Device device) {}

  virtual void fill(Tensor& out, double value) = 0;
  /// out[i] = start + i * step.
  virtual void arange(Tensor& out, double start, double step) = 0;
  /// Converts x into out (same shape, any dtypes).
  virtual void cast(const Tensor& x, Tensor& out) = 0;
  /// Copies `rows` rows of `row_bytes` bytes within `device`: dst + r*dst_pitch <- src + r*src_pitch.
  virtual void copy2d(Device device, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                      std::size_t row_bytes, std::size_t rows) = 0;

  /// out = op(x) with the op's parameter (common::unary_default_param for activations).
  virtual void unary(UnaryOp op, const Tensor& x, Tensor& out, double param) = 0;
  /// dx = dy * f'(x); kernels use x or the forward output y, whichever is cheaper.
  virtual void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy,
                              Tensor& dx, double param) = 0;
  /// Broadcasting binary op; out has the broadcast shape (bool for comparisons).
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) = 0;
  /// out = cond ? a : b, all broadcast to out's shape.
  virtual void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) = 0;

  /// Reduces one axis; out has that axis of size 1 and may have another float dtype.
  virtual void reduce(ReduceOp op, const Tensor& x, std::int64_t axis, Tensor& out) = 0;
  /// Index of the maximum along `axis` (int64, axis kept with size 1).
  virtual void argmax(const Tensor& x, std::int64_t axis, Tensor& out) = 0;

  /// out = act(op(a) . op(b) + bias) where op transposes the last two axes when asked.
  /// a: [batch.., M, K], b: [batch.. or none, K, N]; bias: undefined or [N]. act is any
  /// activation with its default parameter (ops pass only those whose gradient reads the
  /// output); a backend without a native epilogue for it applies unary() to out.
  virtual void matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
                      const Tensor& bias, Activation act, Tensor& out) = 0;

  /// Scaled dot-product attention (common/attention.hpp) on float32 or float64 q [B,Tq,H,D],
  /// k [B,Tk,H,D], v [B,Tk,H,Dv] and an optional uint8/bool mask [B, mask_heads, Tq, Tk]:
  /// out [B,Tq,H,Dv] and the rows' log-sum-exp lse [B,H,Tq], both in q's dtype.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                         const AttentionGeometry& g, Tensor& out, Tensor& lse) = 0;
  /// The forward on 16-bit q, k, v (same dtype) where the backend has a fused engine for this
  /// problem (CUDA: cuDNN's flash attention, no mask; CPU: the tiled kernels widening while they
  /// pack): writes out (q's dtype) and lse (float32, the same [B,H,Tq] log-sum-exp attention()
  /// gives) and returns true; false (nothing written) tells the caller to compute in float32
  /// through attention().
  virtual bool fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                               const AttentionGeometry& g, Tensor& out, Tensor& lse) {
    return false;
  }
  /// The backward of a fused_attention call on its 16-bit q, k, v, out, dout (q's dtype), its
  /// mask and float32 lse: writes dq, dk, dv (q's dtype) and returns true where the backend has
  /// a fused engine (CUDA: cuDNN's; CPU: the tiled kernels); false (nothing written): the caller
  /// runs attention_backward in float32.
  virtual bool fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                        const Tensor& out,
                                        const Tensor& lse, const Tensor& dout, const AttentionGeometry& g,
                                        Tensor& dq, Tensor& dk, Tensor& dv) {
    return false;
  }
  /// Its gradients dq, dk, dv (q's dtype and shapes) from the forward's out and lse and dout.
  virtual void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout,
                                  const AttentionGeometry& g, Tensor& dq, Tensor& dk, Tensor& dv) = 0;

  /// Softmax or log-softmax along `axis`, computed in float32 (float64 for float64).
  virtual void softmax(const Tensor& x, std::int64_t axis, bool log, Tensor& out) = 0;
  virtual void softmax_backward(const Tensor& y, const Tensor& dy, std::int64_t axis, bool log,
                                Tensor& dx) = 0;
  /// Per-row cross-entropy of x [N, C] against int labels [N] or float targets [N, C].
  /// from_logits=false: x holds probabilities (normalised, clipped to [eps, 1-eps]).
  virtual void cross_entropy(const Tensor& x, const Tensor& labels, bool from_logits,
                             Tensor& loss) = 0;
  /// dx = d(loss)/dx scaled per row by dloss [N].
  virtual void cross_entropy_backward(const Tensor& x, const Tensor& labels, bool from_logits,
                                      const Tensor& dloss, Tensor& dx) = 0;

  virtual void transpose(const Tensor& x, const std::vector<std::int64_t>& perm, Tensor& out) = 0;
  /// out[..., indices[i], ...] = 1 (out pre-shaped [..., depth], zero-filled by the kernel).
  virtual void one_hot(const Tensor& indices, Tensor& out) = 0;
  /// True when any element of x is inf or NaN (a host read: data checks, not training steps).
  virtual bool has_nonfinite(const Tensor& x) = 0;

  // ---- random numbers, gathers and padding (random.cpp, gather.cpp) ------------------------
  /// out[i] = element i of the Philox-4x32-10 stream (seed, offset) (backend/common/philox.hpp):
  /// uniform in (a, b), or normal with mean a and stddev b; computed in float64, stored in
  /// out's dtype. Every backend gives the same bits.
  enum class Distribution : std::uint8_t { Uniform, Normal };
  virtual void random(Distribution dist, double a, double b, std::uint64_t seed,
                      std::uint64_t offset, Tensor& out) = 0;
  /// out[k] = x[indices[k]] along the first axis; indices int64 [K] on this device, in range.
  virtual void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) = 0;
  /// out[indices[k]] += src[k], row by row: src [K, ...] any floating dtype, indices int64 [K]
  /// in range, out [V, ...] float32 (float64 for float64 src) accumulating in its own dtype.
  /// Per element, k ascending on every device: repeated indices sum deterministically, to the
  /// same bits everywhere (the embedding gradient).
  virtual void scatter_add_rows(const Tensor& src, const Tensor& indices, Tensor& out) = 0;
  /// out[i + offset] = x[i] where that lands inside out, zeros elsewhere of out (offsets per
  /// axis, negative ones crop): zero padding and its gradient.
  virtual void pad(const Tensor& x, const std::vector<std::int64_t>& offset, Tensor& out) = 0;
  /// Resampling of images [B, H, W, C] (floating) into out [B, H', W', C]: out pixel (y, x) of
  /// image b samples its image at the coordinates transform row b (8 values, float32, float64
  /// for float64 images; [B, 8]) gives it, as common/image_transform.hpp defines.
  virtual void affine_transform(const Tensor& images, const Tensor& transform, const common::ImageTransform& how,
                                Tensor& out) = 0;

  // Fused optimizer updates (formulas in mpt/optim_ops.hpp): var (float32 or 16-bit) and the
  // float32 slots are updated in place in one pass; optional slots are null when unused. copy
  // (null when unused) receives the updated var in its own dtype, as cast would round it;
  // grad_scale multiplies each widened gradient element first (1: nothing to multiply).
  virtual void sgd_update(Tensor& var, const Tensor& grad, Tensor* momentum, double lr,
                          double momentum_coef, bool nesterov, Tensor* copy, double grad_scale) = 0;
  virtual void adam_update(Tensor& var, const Tensor& grad, Tensor& m, Tensor& v, Tensor* vhat,
                           double alpha, double beta_1, double beta_2, double epsilon,
                           double decay, Tensor* copy, double grad_scale) = 0;
  virtual void rmsprop_update(Tensor& var, const Tensor& grad, Tensor& velocity,
                              Tensor* average_grad, Tensor* momentum, double lr, double rho,
                              double momentum_coef, double epsilon, Tensor* copy,
                              double grad_scale) = 0;
  /// The same updates for many variables at once (mpt/optim_ops.hpp's *_update_all): entry i
  /// updates vars[i] with grads[i] and slot lists' entry i; a slot list (and copies) is either
  /// empty (unused by every variable) or one entry per variable (null where unused). All on this
  /// backend's device, no variable twice, hyperparameters shared. The defaults call the
  /// per-tensor methods in order (the CPU and the test device keep them); CUDA packs many
  /// variables into each launch.
  virtual void sgd_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                              const std::vector<Tensor*>& momenta, double lr, double momentum_coef,
                              bool nesterov, const std::vector<Tensor*>& copies, double grad_scale);
  virtual void adam_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                               const std::vector<Tensor*>& m, const std::vector<Tensor*>& v,
                               const std::vector<Tensor*>& vhat, double alpha, double beta_1,
                               double beta_2, double epsilon, double decay,
                               const std::vector<Tensor*>& copies, double grad_scale);
  virtual void rmsprop_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                                  const std::vector<Tensor*>& velocity,
                                  const std::vector<Tensor*>& average_grad,
                                  const std::vector<Tensor*>& momentum, double lr, double rho,
                                  double momentum_coef, double epsilon,
                                  const std::vector<Tensor*>& copies, double grad_scale);
  /// mpt::ops::rule_update_all (one variable: a list of one): entry i updates vars[i] with
  /// grads[i] and slots[k][i] (rule_slots(rule) lists, every entry non-null) by the rule of
  /// backend/common/optim_rules.hpp with the step's constants h; copies as above.
  virtual void rule_update_all(common::RuleKind rule, std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                               const std::vector<std::vector<Tensor*>>& slots, const common::RuleHyper& h,
                               const std::vector<Tensor*>& copies, double grad_scale) = 0;
  /// mpt::ops::adafactor_update on a float32 variable and gradient seen as s (the phases of
  /// backend/common/adafactor.hpp): r and c updated when s.factored, else v; the others null.
  virtual void adafactor_update(Tensor& var, const Tensor& grad, Tensor* r, Tensor* c, Tensor* v,
                                const common::AdafactorShape& s, const common::AdafactorHyper& h) = 0;
  /// out[i] = grads[i] * inv_scale (outs float32, pre-allocated, or undefined to only check;
  /// undefined grads skipped;
  /// inv_scale a float32 scalar on this device); found (float32 scalar) = 1 when any element
  /// of any out is inf or NaN, else 0; flags (float32 [grads.size()]) = 1 for each gradient that
  /// held one, in the same pass (the overflow diagnostics). Nothing is read by the host.
  virtual void unscale_and_check(const std::vector<Tensor>& grads, const Tensor& inv_scale,
                                 std::vector<Tensor>& outs, Tensor& found, Tensor& flags) = 0;
  /// One step of the loss-scale rule on the device (backend/common/loss_scale.hpp): scale and
  /// inv_scale float32 scalars, counters int64 [2] = (good steps, overflows in a row), found
  /// the flag unscale_and_check wrote.
  virtual void update_loss_scale(Tensor& scale, Tensor& inv_scale, Tensor& counters,
                                 const Tensor& found, const ops::LossScaleRule& rule) = 0;

  // Convolution, pooling and normalization (conv.cpp, pool.cpp, batch_norm.cpp, layer_norm.cpp).
  // Activations are NHWC; outputs are pre-shaped by the ops (see mpt/nn_ops.hpp).
  /// out [N,OH,OW,Cout] = act(conv(x [N,H,W,Cin], w [kh,kw,Cin/groups,Cout]) + bias [Cout] or
  /// undefined); act as in matmul.
  virtual void conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,
                      Activation act, Tensor& out) = 0;
  /// Gradients of conv2d for the output gradient dy [N,OH,OW,Cout], each computed only when
  /// defined: dx [N,H,W,Cin]; dw [kh,kw,Cin/groups,Cout] (dw's dtype, accumulated in float32); dbias
  /// [Cout] = sum of dy over N, OH, OW. One call, so a backend can share work (conversions of dy).
  virtual void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                               const Conv2dGeometry& g, Tensor& dx, Tensor& dw, Tensor& dbias) = 0;
  /// out [N,OH,OW,C] pooled from x [N,H,W,C]. With training set, max pooling may leave in
  /// `workspace` (a tensor the backend allocates) what its backward needs.
  virtual void pool2d(const Tensor& x, const Pool2dGeometry& g, bool training, Tensor& out,
                      Tensor& workspace) = 0;
  /// dx of pool2d from dy; x and y are the forward's input and output.
  virtual void pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& dy,
                               const Tensor& workspace, const Pool2dGeometry& g, Tensor& dx) = 0;
  /// Per-channel mean and biased variance of x viewed as [rows, C]; mean/var [C] are float32
  /// (float64 for float64 x), accumulated in float32 blocks and float64 totals.
  virtual void batch_norm_stats(const Tensor& x, Tensor& mean, Tensor& var) = 0;
  /// y = act((x - mean) / sqrt(var + eps) * gamma + beta) over x [rows, C]; gamma/beta/mean/var
  /// are [C] float32 (float64 for float64), gamma/beta undefined meaning 1/0; act Linear or Relu.
  virtual void batch_norm(const Tensor& x, const Tensor& mean, const Tensor& var,
                                  const Tensor& gamma, const Tensor& beta, double eps,
                                  Activation act, Tensor& y) = 0;
  /// dx, and when defined dgamma/dbeta [C], for dy. batch_stats: mean/var were computed from x
  /// (training), so dx includes their gradient. A fused Relu is recomputed from x, gamma, beta.
  virtual void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean,
                                   const Tensor& var, const Tensor& gamma, const Tensor& beta,
                                   double eps, bool batch_stats, Activation act, Tensor& dx,
                                   Tensor& dgamma, Tensor& dbeta) = 0;
  /// y = (x - mean) / sqrt(var + eps) * gamma + beta over each row of x [rows, D]; saves the
  /// per-row mean and 1/sqrt(var + eps) ([rows], float32; float64 for float64).
  virtual void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                          Tensor& y, Tensor& mean, Tensor& rstd) = 0;
  virtual void layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& gamma, Tensor& dx,
                                   Tensor& dgamma, Tensor& dbeta) = 0;
};

namespace detail {
/// The backend of a device; mpt::Error when that backend is not built.
Backend& backend(Device device);
bool has_backend(DeviceType type);
/// A Device's tensors live in host memory that host code may read directly (the CPU).
inline bool host_addressable(Device device) { return device.is_cpu(); }
/// Backends register themselves at static-initialisation time.
void register_backend(DeviceType type, Backend* backend);
}  // namespace detail

}  // namespace mpt
