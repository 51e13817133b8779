#pragma once
// Attention kernel bodies: grid-stride loops over query or key rows around the row bodies of
// backend/common/attention.hpp, which the CPU backend runs too (the tests run these on the host).
#include <cstdint>

#include "backend/common/attention.hpp"
#include "backend/cuda/kernels/launch.hpp"

namespace mpt::kernels {

template <class C>
MPT_HOST_DEVICE void attention_forward_body(const Thread& t, AttentionGeometry g, const C* q, const C* k, const C* v,
                                            const std::uint8_t* mask, C* out, C* lse) {
  const std::int64_t rows = g.batch * g.heads * g.q_len;
  for (std::int64_t r = t.global(); r < rows; r += t.stride())
    common::attention_forward_row(g, q, k, v, mask, out, lse, r);
}

template <class C>
MPT_HOST_DEVICE void attention_delta_body(const Thread& t, AttentionGeometry g, const C* out, const C* dout, C* delta) {
  const std::int64_t rows = g.batch * g.heads * g.q_len;
  for (std::int64_t r = t.global(); r < rows; r += t.stride()) common::attention_delta_row(g, out, dout, delta, r);
}

template <class C>
MPT_HOST_DEVICE void attention_dq_body(const Thread& t, AttentionGeometry g, const C* q, const C* k, const C* v,
                                       const std::uint8_t* mask, const C* lse, const C* delta, const C* dout, C* dq) {
  const std::int64_t rows = g.batch * g.heads * g.q_len;
  for (std::int64_t r = t.global(); r < rows; r += t.stride())
    common::attention_dq_row(g, q, k, v, mask, lse, delta, dout, dq, r);
}

template <class C>
MPT_HOST_DEVICE void attention_dkv_body(const Thread& t, AttentionGeometry g, const C* q, const C* k, const C* v,
                                        const std::uint8_t* mask, const C* lse, const C* delta, const C* dout, C* dk,
                                        C* dv) {
  const std::int64_t rows = g.batch * g.heads * g.kv_len;
  for (std::int64_t r = t.global(); r < rows; r += t.stride())
    common::attention_dkv_row(g, q, k, v, mask, lse, delta, dout, dk, dv, r);
}

}  // namespace mpt::kernels
