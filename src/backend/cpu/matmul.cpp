// GEMM through oneDNN's matmul primitive (bias and activation fused as post-ops).
// float32 runs natively (at the avx2 tier on packed_gemm.cpp, faster there), bfloat16 where
// bf16_gemm_native (AMX, or AVX512-BF16 at the FMA rate);
// float16 and other bfloat16 take packed_gemm.cpp where it is faster (small and middle shapes at
// the avx2 and avx512 tiers: widened while packed) and else compute in float32 copies and round
// back; float64 (gradient checks only) uses a plain loop.
#include <omp.h>

#include <cmath>
#include <cstdio>

#include "backend/common/unary_ops.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/dnnl_util.hpp"
#include "backend/cpu/packed_gemm.hpp"

namespace mpt::cpu {
namespace {

/// B operands transposed up front when tb and K*N is at most this (elements).
constexpr std::int64_t kSmallTransposed = 1 << 16;

/// Whether a float32 aᵀ·b on oneDNN takes a transposed copy of a first (then a·b): a weight
/// gradient's shape, k (the batch's rows) at least 4m, with m <= n. oneDNN 2.6's float32 GEMM with
/// a transposed A runs 10-17 % below its a·b at the same sizes on an EPYC (Zen 4) at AVX-512
/// (the GPT-mini's 256 x 4096 x 256: 2.74 against 2.34 ms; 256 x 4096 x 1024: 11.6 against 10.1),
/// and the blocked transpose of a [4096, 256] is 0.12 ms; with m > n the copy costs what it saves
/// (1024 x 4096 x 256: 10.8 against 9.7 + 1.0). Its bfloat16 GEMM loses 5-7 % there: not worth a
/// copy at twice the speed.
bool transposed_a_first(const Tensor& a, const Tensor& b, bool ta, bool tb, const GemmShape& g) {
  return a.dtype() == float32 && ta && !tb && a.dim() == 2 && b.dim() == 2 && g.k >= 4 * g.m && g.m <= g.n;
}

PrimitiveCache<dnnl::matmul>& matmul_cache() {
  static PrimitiveCache<dnnl::matmul> cache;
  return cache;
}

/// out = act(op(a) . op(b) + bias) through oneDNN; g is gemm_shape(a, b, ta, tb).
void dnnl_matmul(const GemmShape& g, const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& bias,
                 Activation act, Tensor& out) {
  const std::int64_t bo = std::max(g.batch_a, g.batch_b);
  using dims = dnnl::memory::dims;
  const DType dt = a.dtype(), bias_dt = bias.defined() ? bias.dtype() : dt;
  // oneDNN fixes a primitive's thread partition when it is created (from omp_get_max_threads()),
  // so the thread count is part of the key: after set_num_threads a cached primitive would
  // otherwise keep running on the old count (e.g. 1 thread when 2 are allowed).
  const int nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
  char key[256];
  std::snprintf(key, sizeof key, "%lld,%lld,%lld,%lld,%lld,%d,%d,%d,%d,%d,%d,t%d",
                static_cast<long long>(g.batch_a), static_cast<long long>(g.batch_b),
                static_cast<long long>(g.m), static_cast<long long>(g.n),
                static_cast<long long>(g.k), ta, tb, static_cast<int>(dt),
                bias.defined(), static_cast<int>(bias_dt), static_cast<int>(act), nthr);
  const dims a_dims{g.batch_a, g.m, g.k}, b_dims{g.batch_b, g.k, g.n}, c_dims{bo, g.m, g.n};
  const dims a_strides = ta ? dims{g.m * g.k, 1, g.m} : dims{g.m * g.k, g.k, 1};
  const dims b_strides = tb ? dims{g.k * g.n, 1, g.k} : dims{g.k * g.n, g.n, 1};
  const dims c_strides{g.m * g.n, g.n, 1};
  const auto t = dnnl_type(dt);
  dnnl::memory::desc a_md(a_dims, t, a_strides), b_md(b_dims, t, b_strides),
      c_md(c_dims, t, c_strides);
  dnnl::memory::desc bias_md;
  if (bias.defined()) bias_md = dnnl::memory::desc({1, 1, g.n}, dnnl_type(bias_dt), dims{g.n, g.n, 1});
  dnnl_call("matmul", [&] {
    dnnl::matmul& prim = matmul_cache().get(key, [&] {
      const dnnl::primitive_attr attr = activation_attr(act);
      auto desc = bias.defined() ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md)
                                 : dnnl::matmul::desc(a_md, b_md, c_md);
      return dnnl::matmul(dnnl::matmul::primitive_desc(desc, attr, dnnl_engine()));
    });
    auto& eng = dnnl_engine();
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(a_md, eng, a.data_ptr())},
        {DNNL_ARG_WEIGHTS, dnnl::memory(b_md, eng, b.data_ptr())},
        {DNNL_ARG_DST, dnnl::memory(c_md, eng, out.data_ptr())}};
    if (bias.defined()) args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_md, eng, bias.data_ptr()));
    prim.execute(dnnl_stream(), args);
    dnnl_stream().wait();
  });
}

double activate(Activation act, double v) { return common::activate(act, v); }

void reference_matmul_f64(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& bias,
                          Activation act, Tensor& out) {
  const GemmShape g = gemm_shape(a, b, ta, tb);
  const std::int64_t bo = std::max(g.batch_a, g.batch_b);
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  const double* pbias = bias.defined() ? bias.data<double>() : nullptr;
  double* pc = out.data<double>();
  parallel_for(bo * g.m, 16, [&](std::int64_t s, std::int64_t e) {
    for (std::int64_t u = s; u < e; ++u) {
      std::int64_t bi = u / g.m, i = u % g.m;
      const double* A = pa + (g.batch_a == 1 ? 0 : bi) * g.m * g.k;
      const double* B = pb + (g.batch_b == 1 ? 0 : bi) * g.k * g.n;
      double* C = pc + (bi * g.m + i) * g.n;
      for (std::int64_t j = 0; j < g.n; ++j) C[j] = pbias ? pbias[j] : 0.0;
      for (std::int64_t p = 0; p < g.k; ++p) {
        double av = ta ? A[p * g.m + i] : A[i * g.k + p];
        for (std::int64_t j = 0; j < g.n; ++j) C[j] += av * (tb ? B[j * g.k + p] : B[p * g.n + j]);
      }
      for (std::int64_t j = 0; j < g.n; ++j) C[j] = activate(act, C[j]);
    }
  });
}

}  // namespace

void CpuBackend::matmul(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& bias,
                        Activation act, Tensor& out) {
  if (out.numel() == 0) return;
  if (a.dtype() == float64) return reference_matmul_f64(a, b, ta, tb, bias, act, out);
  // A small transposed B (the last layer's kernel in dx = dz . W^T, K = classes) is transposed
  // into a copy first, for the native and the staged GEMM alike: oneDNN's brgemm is several
  // times slower on it than on B laid out [K, N], and the copy is tiny (g stays the shape:
  // the copy is 2-D like b, so the batch counts do not change either).
  const GemmShape g = gemm_shape(a, b, ta, tb);
  const bool staged = a.dtype() == float16 || (a.dtype() == bfloat16 && !bf16_gemm_native());
  if (staged ? packed_gemm16_applies(g) : a.dtype() == float32 && packed_gemm32_applies(g))
    return packed_gemm(g, a, b, ta, tb, bias, act, out);
  Tensor at = a, bt = b;
  if (!staged && transposed_a_first(a, b, ta, tb, g)) {
    at = Tensor::empty({g.m, g.k}, a.dtype(), a.device());
    transpose(a, {1, 0}, at);
    ta = false;
  }
  if (tb && b.dim() == 2 && g.k * g.n > 0 && g.k * g.n <= kSmallTransposed) {
    bt = Tensor::empty({g.k, g.n}, b.dtype(), b.device());
    transpose(b, {1, 0}, bt);
    tb = false;
  }
  if (staged) {
    Tensor c = Tensor::empty(out.shape(), float32, out.device());
    dnnl_matmul(g, to_float32(a), to_float32(bt), ta, tb, to_float32(bias), act, c);
    cast(c, out);
    return;
  }
  if (g.k == 0) {  // an empty sum
    fill(out, 0.0);
    return;
  }
  dnnl_matmul(g, at, bt, ta, tb, bias, act, out);
}

}  // namespace mpt::cpu
