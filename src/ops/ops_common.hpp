#pragma once
// Validation helpers shared by the ops: every message names the op and what it received.
#include <string>

#include "backend/backend.hpp"
#include "mpt/autograd.hpp"
#include "mpt/ops.hpp"

namespace mpt::ops::detail {

/// "float16 (2, 3) on cpu"
std::string describe(const Tensor& t);
void check_defined(const char* op, const Tensor& t, const char* what = "input");
/// Same device and dtype for both.
void check_compatible(const char* op, const Tensor& a, const Tensor& b);
void check_floating(const char* op, const Tensor& t);
Shape broadcast_shape(const char* op, const Shape& a, const Shape& b);
std::int64_t normalize_axis(const char* op, std::int64_t axis, std::int64_t ndim);
inline Backend& backend_of(const Tensor& t) { return mpt::detail::backend(t.device()); }
/// The activation of a Keras name (the table in backend/common/unary_ops.hpp); an error naming
/// `op` and listing the valid names otherwise. "softmax" is not elementwise: layers handle it.
Activation activation_from_name(const char* op, const std::string& name);
/// out = act(z) and its backward, with the activation's default parameter.
void apply_activation(Activation act, const Tensor& z, Tensor& out);
void activation_backward(Activation act, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);

}  // namespace mpt::ops::detail
