#pragma once
// Weight gradients of bfloat16 convolutions on AMX tiles (conv_amx.cpp); oneDNN 2.6 has no AMX
// kernel for this pass.
#include "backend/cpu/conv_plans.hpp"
#include "backend/cpu/dnnl_util.hpp"

namespace mpt::cpu {

/// True when amx_conv_backward_weights takes this convolution: AMX on (amx_enabled), bfloat16,
/// at least 16 input channels.
inline bool amx_weights_applies(const conv::ConvShape& s, DType d) {
  return d == bfloat16 && s.cin >= 16 && amx_enabled();
}

/// dw [kh, kw, cin, cout] (float32, overwritten) and, where db is not null, db [cout] (float32,
/// overwritten) of the convolution x [n, h, w, cin] -> dy [n, oh, ow, cout], both bfloat16.
void amx_conv_backward_weights(const Tensor& x, const Tensor& dy, const conv::ConvShape& s, const Conv2dGeometry& g,
                               float* dw, float* db);

}  // namespace mpt::cpu
