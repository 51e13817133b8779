#pragma once
/// mpt::Variable: a named, trainable weight (float32 master under mixed policies) that layers
/// read in their compute dtype through a cached cast, invalidated when the optimizer writes it.
///
///   mpt::Variable w(mpt::Tensor::zeros({4, 2}), "kernel");
///   mpt::Tensor w16 = w.read(mpt::bfloat16);   // cast once, reused until w.assign(...)
#include <memory>
#include <string>
#include <vector>

#include "mpt/tensor.hpp"

namespace mpt {

class Variable {
 public:
  Variable() = default;
  Variable(const Tensor& initial, std::string name, bool trainable = true);

  bool defined() const { return state_ != nullptr; }
  /// The stored tensor (the master copy). A leaf that gradients are taken for when trainable.
  const Tensor& value() const;
  /// The value in `dtype`: the stored tensor itself, or a cached cast recorded on the tape so
  /// that the gradient flows back to the stored tensor in its own dtype.
  Tensor read(DType dtype) const;
  /// Overwrites the value (same shape; converted to the variable's dtype), not recorded.
  void assign(const Tensor& value) const;
  /// Call after writing value() in place by other means: drops cached casts.
  void mark_modified() const;
  /// mark_modified() by a writer that also produced the new value cast to cast.dtype() (a fused
  /// optimizer update with a copy, mpt/optim_ops.hpp): read(cast.dtype()) returns it from now on,
  /// without casting again. cast must have the variable's shape and device.
  void mark_modified(const Tensor& cast) const;
  /// The dtype of the latest read() in a dtype other than the variable's own (the variable's own
  /// dtype when there was none): the copy an optimizer writes in its update pass.
  DType last_cast_dtype() const;

  const std::string& name() const;
  /// "layer_name/variable_name" once the variable belongs to a layer.
  const std::string& path() const;
  void set_path(const std::string& path) const;
  bool trainable() const;
  void set_trainable(bool on) const;
  const Shape& shape() const { return value().shape(); }
  DType dtype() const { return value().dtype(); }
  std::int64_t numel() const { return value().numel(); }
  /// Stable identity (the stored tensor's id).
  std::uint64_t id() const { return value().id(); }
  /// Counts assignments; optimizers and caches compare it.
  std::uint64_t version() const;

  operator const Tensor&() const { return value(); }  // NOLINT: a variable is usable as a tensor

 private:
  struct State;
  std::shared_ptr<State> state_;
};

/// The stored tensors of `vars`, e.g. to pass as GradientTape sources.
std::vector<Tensor> values_of(const std::vector<Variable>& vars);

}  // namespace mpt
