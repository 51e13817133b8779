// Scaled dot-product attention: the row bodies of backend/common/attention.hpp (the CUDA
// kernels' too) on the CPU's threads, one query or key row per call. Nothing of size Tq·Tk is
// ever stored.
#include <vector>

#include "backend/common/attention.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"

namespace mpt::cpu {
void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                           const AttentionGeometry& g, Tensor& out, Tensor& lse) {
  auto run = [&](auto c) {
    using C = decltype(c);
    const C *pq = q.data<C>(), *pk = k.data<C>(), *pv = v.data<C>();
    C *po = out.data<C>(), *pl = lse.data<C>();
    const auto* pm = mask.defined() ? static_cast<const std::uint8_t*>(mask.data_ptr()) : nullptr;
    parallel_for(g.batch * g.heads * g.q_len, 4, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r) common::attention_forward_row(g, pq, pk, pv, pm, po, pl, r);
    });
  };
  // float32 or float64 operands: ops casts 16-bit inputs first.
  if (q.dtype() == float64) run(double{});
  else run(float{});
}

void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    const Tensor& out, const Tensor& lse, const Tensor& dout,
                                    const AttentionGeometry& g, Tensor& dq, Tensor& dk, Tensor& dv) {
  auto run = [&](auto c) {
    using C = decltype(c);
    const C *pq = q.data<C>(), *pk = k.data<C>(), *pv = v.data<C>(), *po = out.data<C>(), *pl = lse.data<C>(),
            *pd = dout.data<C>();
    const auto* pm = mask.defined() ? static_cast<const std::uint8_t*>(mask.data_ptr()) : nullptr;
    const std::int64_t q_rows = g.batch * g.heads * g.q_len, k_rows = g.batch * g.heads * g.kv_len;
    std::vector<C> delta(static_cast<std::size_t>(q_rows));
    parallel_for(q_rows, 64, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r) common::attention_delta_row(g, po, pd, delta.data(), r);
    });
    C* pdq = dq.data<C>();
    parallel_for(q_rows, 4, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r) common::attention_dq_row(g, pq, pk, pv, pm, pl, delta.data(), pd, pdq, r);
    });
    C *pdk = dk.data<C>(), *pdv = dv.data<C>();
    parallel_for(k_rows, 4, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r)
        common::attention_dkv_row(g, pq, pk, pv, pm, pl, delta.data(), pd, pdk, pdv, r);
    });
  };
  if (q.dtype() == float64) run(double{});
  else run(float{});
}

}  // namespace mpt::cpu
