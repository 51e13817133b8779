#pragma once
/// Op-level reverse-mode autodiff.
///
/// Ops run while a GradientTape is alive on this thread record a node with their backward
/// when any input requires a gradient (variables do; `tape.watch(x)` makes x do so).
/// Nothing is recorded outside a tape.
///
///   mpt::GradientTape tape;
///   tape.watch(x);
///   auto y = mpt::ops::sum(mpt::ops::square(x));
///   auto dx = tape.gradient(y, {x})[0];      // 2 * x, in x's dtype
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mpt/tensor.hpp"
#include "mpt/variable.hpp"

namespace mpt {
namespace autograd {

/// Where a gradient flowing into an op input goes: the producing node, or a leaf.
struct Edge {
  std::shared_ptr<Node> fn;   ///< producer of the input, or null
  std::uint32_t output_nr = 0;
  std::uint64_t leaf_id = 0;  ///< id of a leaf input that requires grad, else 0
  bool needed() const { return fn != nullptr || leaf_id != 0; }
};

struct TensorMeta {
  Shape shape;
  DType dtype = float32;
  Device device;
};

using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

/// One recorded op: its inputs' edges and a backward that maps output grads to input grads.
/// Backward returns one tensor per input (undefined where no gradient flows).
struct Node {
  std::string name;
  std::vector<Edge> inputs;
  std::vector<TensorMeta> input_meta;
  std::vector<TensorMeta> output_meta;
  BackwardFn backward;  ///< released after use by a non-persistent tape
};

/// True when ops should record (a tape is active and no NoGradGuard is).
bool is_recording();
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);

/// Connects `outputs` to a new node computing their inputs' gradients with `backward`, when
/// recording and any input requires a gradient. Used by every differentiable op.
void record(const char* name, const std::vector<Tensor>& inputs, std::vector<Tensor*> outputs,
            BackwardFn backward);

}  // namespace autograd

/// Suspends recording in its scope (used inside backward functions and inference).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

struct GradientTapeOptions {
  /// A persistent tape allows several gradient() calls; otherwise the recorded graph's saved
  /// tensors are freed as backward uses them and a second call is an error.
  bool persistent = false;
  /// A source leaf reached by one backward edge keeps the floating dtype that op's backward gave
  /// it, instead of being converted to the source's dtype: a float32 variable read in bfloat16
  /// gets a bfloat16 gradient (the same values; two or more contributions are converted and
  /// summed in the source's dtype as usual). For consumers that convert anyway in their own
  /// pass: Model::fit hands such gradients to the fused optimizer ops (mpt/optim_ops.hpp),
  /// which widen them block by block, saving a pass over every gradient.
  bool keep_source_gradient_dtype = false;
};

/// While alive, records differentiable ops on this thread (tapes nest).
class GradientTape {
 public:
  explicit GradientTape(GradientTapeOptions options = {});
  ~GradientTape();
  GradientTape(const GradientTape&) = delete;
  GradientTape& operator=(const GradientTape&) = delete;

  /// Called during gradient() for each source whose gradient is final, as soon as it is (in
  /// the backward pass's order: the last layers first), with the source's index and gradient.
  /// Data parallelism sends gradients to the other ranks while the rest are computed.
  using GradientReady = std::function<void(std::size_t index, const Tensor& gradient)>;

  /// Makes `t` a source gradients can be taken for.
  void watch(Tensor& t);
  /// d(sum of target)/d(source) for each source, each in its source's dtype (but see
  /// GradientTapeOptions::keep_source_gradient_dtype); an undefined
  /// Tensor for a source the target does not depend on.
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Tensor>& sources,
                               const GradientReady& on_ready = nullptr);
  /// The same for variables (their stored tensors); gradients in the variables' dtype.
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Variable>& sources,
                               const GradientReady& on_ready = nullptr) {
    return gradient(target, values_of(sources), on_ready);
  }

 private:
  GradientTapeOptions options_;
  bool used_ = false;
};

}  // namespace mpt
