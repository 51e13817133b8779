#pragma once
// Attention kernel bodies: grid-stride loops over query or key rows around the row bodies of
// backend/common/attention.hpp (the tests run these on the host). N: the row vectors' register
// length (0: in memory), as the row bodies take it.
#include <cstdint>

#include "backend/common/attention.hpp"
#include "backend/cuda/kernels/launch.hpp"

namespace mpt::kernels {

template <int N, class C>
MPT_HOST_DEVICE void attention_forward_body(const Thread& t, AttentionGeometry g, const C* q, const C* k, const C* v,
                                            const std::uint8_t* mask, C* out, C* lse) {
  const std::int64_t rows = g.batch * g.heads * g.q_len;
  for (std::int64_t r = t.global(); r < rows; r += t.stride())
    common::attention_forward_row<N>(g, q, k, v, mask, out, lse, r);
}

template <int N, class C>
MPT_HOST_DEVICE void attention_delta_body(const Thread& t, AttentionGeometry g, const C* out, const C* dout, C* delta) {
  const std::int64_t rows = g.batch * g.heads * g.q_len;
  for (std::int64_t r = t.global(); r < rows; r += t.stride()) common::attention_delta_row<N>(g, out, dout, delta, r);
}

template <int N, class C>
MPT_HOST_DEVICE void attention_dq_body(const Thread& t, AttentionGeometry g, const C* q, const C* k, const C* v,
                                       const std::uint8_t* mask, const C* lse, const C* delta, const C* dout, C* dq) {
  const std::int64_t rows = g.batch * g.heads * g.q_len;
  for (std::int64_t r = t.global(); r < rows; r += t.stride())
    common::attention_dq_row<N>(g, q, k, v, mask, lse, delta, dout, dq, r);
}

template <int N, class C, bool kDk = true, bool kDv = true>
MPT_HOST_DEVICE void attention_dkv_body(const Thread& t, AttentionGeometry g, const C* q, const C* k, const C* v,
                                        const std::uint8_t* mask, const C* lse, const C* delta, const C* dout, C* dk,
                                        C* dv) {
  const std::int64_t rows = g.batch * g.heads * g.kv_len;
  for (std::int64_t r = t.global(); r < rows; r += t.stride())
    common::attention_dkv_row<N, C, kDk, kDv>(g, q, k, v, mask, lse, delta, dout, dk, dv, r);
}

/// The register length the kernels use for a problem: in float32 the smallest of 32, 64 and 128
/// that holds its head and value dims, else 0 (the rows stay in memory, as always in float64,
/// whose rows would spill and which only tests run on a GPU).
inline int attention_lanes(const AttentionGeometry& g, bool double_precision) {
  const std::int64_t n = g.head_dim > g.value_dim ? g.head_dim : g.value_dim;
  if (double_precision) return 0;
  for (int lanes : {32, 64, 128})
    if (n <= lanes) return lanes;
  return 0;
}

}  // namespace mpt::kernels
