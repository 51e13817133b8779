#pragma once
// mpt's own GEMM (docs/design.md, "CPU GEMMs"): for 16-bit operands where oneDNN has no native
// 16-bit GEMM, and for float32 ones at the avx2 tier, where it is faster than oneDNN's. bfloat16
// or float16 a and b are widened to float32 while they are packed (float32 ones packed as they
// are), summed in float32 on micro_gemm.hpp's register tiles, and bias, activation and the
// rounding to the output's dtype applied as each block of rows is done. For 16-bit operands it
// replaces the staged path (whole float32 copies of a and b, oneDNN's float32 GEMM into a float32
// temporary, a cast of that).
#include "mpt/tensor.hpp"
#include "backend/common/unary_ops.hpp"

namespace mpt::cpu {

/// A GEMM's sizes: op(a) [batch_a, m, k] times op(b) [batch_b, k, n] (a batch count of 1: shared).
struct GemmShape {
  std::int64_t batch_a, batch_b, m, n, k;
};
/// The sizes of op(a) · op(b) for ops::matmul's operands.
GemmShape gemm_shape(const Tensor& a, const Tensor& b, bool ta, bool tb);

/// Whether a 16-bit GEMM that oneDNN cannot run natively takes packed_gemm: at the avx2 and avx512
/// tiers, for every non-empty shape (measured: docs/design.md); MPT_CPU_GEMM16=packed|staged forces
/// one path for every shape and tier (tests and benchmarks).
bool packed_gemm16_applies(const GemmShape& g);

/// Whether a float32 GEMM takes packed_gemm instead of oneDNN's: at the avx2 tier, for every
/// non-empty shape (measured: docs/design.md); MPT_CPU_GEMM32=packed|onednn forces one path for
/// every shape and tier (tests and benchmarks).
bool packed_gemm32_applies(const GemmShape& g);

/// out = act(op(a) · op(b) + bias), g = gemm_shape(a, b, ta, tb): a [.., m, k] (ta: [.., k, m]), b [.., k, n] (tb: [.., n, k]),
/// batch dimensions as ops::matmul's (one side may be unbatched); a and b of one dtype (float32,
/// bfloat16 or float16); bias [n] of any floating dtype, or undefined; out [.., m, n] of any
/// floating dtype but float64. Each output element is summed over k in order in float32 by one
/// thread, so the bits do not depend on the thread count.
void packed_gemm(const GemmShape& g, const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& bias,
                 Activation act, Tensor& out);

}  // namespace mpt::cpu
