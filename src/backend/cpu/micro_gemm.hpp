#pragma once
// The register-blocked GEMM tile shared by the CPU's own GEMMs (attention's tiles, packed_gemm.cpp):
// R rows by NV vectors of c held in registers while k products are summed. Written once on the
// lanes of vector_types.hpp, inlined into each caller's tier wrapper (isa_call_native), so every
// width compiles for its own tier. The files that include it compile with contraction
// (CMakeLists.txt): each product and sum is one FMA where the tier has it (every CPU always runs
// the same tier, so its bits do not change from run to run).
#include <cstdint>

#include "backend/cpu/vector_types.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace mpt::cpu {

/// R rows by NV vectors of c (= or +=) a · b over k: a(r, p) = a[r·lda + p] (TransA: a[p·lda + r]),
/// b rows of ldb, c rows of ldc.
template <class C, int B, bool Acc, bool TransA, int R, int NV>
[[gnu::always_inline]] inline void micro_tile(std::int64_t k, const C* __restrict a, std::int64_t lda,
                                              const C* __restrict b, std::int64_t ldb, C* __restrict c,
                                              std::int64_t ldc) {
  using V = typename Lanes<C, B>::V;
  constexpr std::int64_t W = Lanes<C, B>::W;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = Acc ? load_lanes<V>(c + r * ldc + v * W) : V{};
  for (std::int64_t p = 0; p < k; ++p) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load_lanes<V>(b + p * ldb + v * W);
    for (int r = 0; r < R; ++r) {
      // scalar · vector: one broadcast load. (A V made of the scalar first costs a scalar add per
      // use, and the spellings that avoid the add make GCC 12 build the vector lane by lane inside
      // target-attribute functions.)
      const C av = TransA ? a[p * lda + r] : a[r * lda + p];
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store_lanes(c + r * ldc + v * W, acc[r][v]);
}

}  // namespace mpt::cpu

#pragma GCC diagnostic pop
