#pragma once
// Direct convolutions for inputs with few channels (the first layer of a CNN), where oneDNN is
// slow (conv_small.cpp). Same semantics as Backend::conv2d / conv2d_backward.
#include "backend/backend.hpp"

namespace mpt::cpu {

/// True when the direct kernels can take a convolution of x [N,H,W,Cin] with w [kh,kw,Cin,Cout]:
/// Cin <= 4 (any kernel size, stride, dilation and padding), dtype float32, bfloat16 or float16.
bool small_conv_supports(const Shape& x, const Shape& w, DType d);
/// True when the backend routes such a convolution to them: small_conv_supports, at the avx512
/// ISA tier only (MPT_CPU_SMALL_CONV=direct|onednn forces a path).
bool small_conv_applies(const Shape& x, const Shape& w, DType d);

/// out = act(conv(x, w) + bias), bias optional; 16-bit outputs rounded once from float32.
void small_conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,
                        Activation act, Tensor& out);

/// dw [kh,kw,Cin,Cout] and dbias [Cout] of the convolution x -> dy, each only when defined;
/// accumulated in float32, written in their own dtypes.
void small_conv_backward_weights(const Tensor& x, const Tensor& dy, const Conv2dGeometry& g, Tensor& dw,
                                 Tensor& dbias);

}  // namespace mpt::cpu
