#pragma once
// float64 reference convolutions (NHWC, Keras kernels) for gradient checks: plain loops.
#include "backend/backend.hpp"

namespace mpt::cpu {

void reference_conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,
                            Activation act, Tensor& out);
void reference_conv_backward_data(const Tensor& dy, const Tensor& w, const Conv2dGeometry& g, Tensor& dx);
/// dw, and dbias when defined.
void reference_conv_backward_weights(const Tensor& x, const Tensor& dy, const Conv2dGeometry& g, Tensor& dw,
                                     Tensor& dbias);

}  // namespace mpt::cpu
