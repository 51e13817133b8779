// The CUDA attention kernel bodies (kernels/attention.hpp), run on the host through emulate,
// against the row bodies of backend/common/attention.hpp run on the host row by row, bit for bit
// (the same definition, any launch geometry, the row vectors in memory or in registers of any
// length that holds them), and both against the CPU backend's tiled attention and
// attention_backward (the same arithmetic summed in another order) within the dtype's
// tolerance.
#include <cstring>

#include "backend/backend.hpp"
#include "backend/cuda/kernels/attention.hpp"
#include "kernel_test_util.hpp"

using namespace mpt;
using namespace mpt::kernels;
using namespace mpt::test;

namespace {

template <class C>
bool same_bits(const Vec<C>& got, const Vec<C>& want) {
  return got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size() * sizeof(C)) == 0;
}

template <class C>
void check_near(const Vec<C>& got, const Tensor& want, DType d) {
  std::vector<double> g(got.begin(), got.end());
  check_close(g, want.to_vector<double>(), tolerance(d), "CPU backend's tiled attention");
}

/// The kernel bodies with register length N, launched two ways, give the row bodies' bits.
template <int N, class C>
void check_bodies(const AttentionGeometry& gm, const Vec<C>& qv, const Vec<C>& kv, const Vec<C>& vv,
                  const Vec<C>& dov, const std::uint8_t* pm, const Vec<C>& ro, const Vec<C>& rl, const Vec<C>& rq,
                  const Vec<C>& rk, const Vec<C>& rv) {
  for (unsigned block : {1u, 32u}) {
    Vec<C> o(ro.size()), l(rl.size());
    emulate(Dim{2, 1, 1}, Dim{block, 1, 1},
            [&](const Thread& t) { attention_forward_body<N>(t, gm, qv.data(), kv.data(), vv.data(), pm, o.data(), l.data()); });
    INFO("attention ", sizeof(C) == 8 ? "float64" : "float32", pm ? " masked" : "", gm.causal ? " causal" : "",
         " lanes ", N, " block ", block);
    CHECK(same_bits(o, ro));
    CHECK(same_bits(l, rl));
    Vec<C> delta(l.size()), gq(qv.size()), gk(kv.size()), gv(vv.size());
    emulate(Dim{2, 1, 1}, Dim{block, 1, 1}, [&](const Thread& t) { attention_delta_body<N>(t, gm, o.data(), dov.data(), delta.data()); });
    emulate(Dim{2, 1, 1}, Dim{block, 1, 1}, [&](const Thread& t) {
      attention_dq_body<N>(t, gm, qv.data(), kv.data(), vv.data(), pm, l.data(), delta.data(), dov.data(), gq.data());
    });
    emulate(Dim{2, 1, 1}, Dim{block, 1, 1}, [&](const Thread& t) {
      attention_dkv_body<N>(t, gm, qv.data(), kv.data(), vv.data(), pm, l.data(), delta.data(), dov.data(), gk.data(),
                         gv.data());
    });
    CHECK(same_bits(gq, rq));
    CHECK(same_bits(gk, rk));
    CHECK(same_bits(gv, rv));
    // dk and dv one at a time (the GPU's two kernels): the same bits.
    Vec<C> gk1(kv.size()), gv1(vv.size());
    emulate(Dim{2, 1, 1}, Dim{block, 1, 1}, [&](const Thread& t) {
      attention_dkv_body<N, C, true, false>(t, gm, qv.data(), kv.data(), vv.data(), pm, l.data(), delta.data(),
                                            dov.data(), gk1.data(), gv1.data());
    });
    emulate(Dim{2, 1, 1}, Dim{block, 1, 1}, [&](const Thread& t) {
      attention_dkv_body<N, C, false, true>(t, gm, qv.data(), kv.data(), vv.data(), pm, l.data(), delta.data(),
                                            dov.data(), gk1.data(), gv1.data());
    });
    CHECK(same_bits(gk1, rk));
    CHECK(same_bits(gv1, rv));
  }
}


template <class C>
void check(const AttentionGeometry& g, bool masked) {
  const DType d = dtype_of_storage<C>();
  Tensor q = Tensor::random_uniform({g.batch, g.q_len, g.heads, g.head_dim}, -2, 2, 1, d, Device::cpu());
  Tensor k = Tensor::random_uniform({g.batch, g.kv_len, g.heads, g.head_dim}, -2, 2, 2, d, Device::cpu());
  Tensor v = Tensor::random_uniform({g.batch, g.kv_len, g.heads, g.value_dim}, -2, 2, 3, d, Device::cpu());
  Tensor dout = Tensor::random_uniform({g.batch, g.q_len, g.heads, g.value_dim}, -1, 1, 4, d, Device::cpu());
  Vec<std::uint8_t> mask;
  for (std::int64_t b = 0; b < g.batch; ++b)
    for (std::int64_t i = 0; i < g.q_len; ++i)
      for (std::int64_t j = 0; j < g.kv_len; ++j) mask.push_back((i + 2 * j + b) % 3 != 0 && !(b == 0 && i == 0));
  AttentionGeometry gm = g;
  gm.mask_heads = masked ? 1 : 0;
  Tensor mt = masked ? Tensor::from_host(mask.data(), mask.size(), bool_, {g.batch, 1, g.q_len, g.kv_len}, Device::cpu())
                     : Tensor();
  const std::uint8_t* pm = masked ? mask.data() : nullptr;
  Tensor out = Tensor::empty({g.batch, g.q_len, g.heads, g.value_dim}, d, Device::cpu());
  Tensor lse = Tensor::empty({g.batch, g.heads, g.q_len}, d, Device::cpu());
  cpu().attention(q, k, v, mt, gm, out, lse);
  Tensor dq = Tensor::empty(q.shape(), d, Device::cpu()), dk = Tensor::empty(k.shape(), d, Device::cpu());
  Tensor dv = Tensor::empty(v.shape(), d, Device::cpu());
  cpu().attention_backward(q, k, v, mt, out, lse, dout, gm, dq, dk, dv);

  const Vec<C> qv = tensor_values<C>(q), kv = tensor_values<C>(k), vv = tensor_values<C>(v), dov = tensor_values<C>(dout);
  // The row bodies on the host, one row at a time.
  const std::int64_t q_rows = g.batch * g.heads * g.q_len, k_rows = g.batch * g.heads * g.kv_len;
  Vec<C> ro(static_cast<std::size_t>(out.numel())), rl(static_cast<std::size_t>(lse.numel())), rdelta(rl.size());
  Vec<C> rq(qv.size()), rk(kv.size()), rv(vv.size());
  for (std::int64_t r = 0; r < q_rows; ++r)
    common::attention_forward_row<0>(gm, qv.data(), kv.data(), vv.data(), pm, ro.data(), rl.data(), r);
  for (std::int64_t r = 0; r < q_rows; ++r) common::attention_delta_row<0>(gm, ro.data(), dov.data(), rdelta.data(), r);
  for (std::int64_t r = 0; r < q_rows; ++r)
    common::attention_dq_row<0>(gm, qv.data(), kv.data(), vv.data(), pm, rl.data(), rdelta.data(), dov.data(), rq.data(), r);
  for (std::int64_t r = 0; r < k_rows; ++r)
    common::attention_dkv_row<0>(gm, qv.data(), kv.data(), vv.data(), pm, rl.data(), rdelta.data(), dov.data(), rk.data(),
                              rv.data(), r);
  check_near(ro, out, d);
  check_near(rl, lse, d);
  check_near(rq, dq, d);
  check_near(rk, dk, d);
  check_near(rv, dv, d);
  check_bodies<0>(gm, qv, kv, vv, dov, pm, ro, rl, rq, rk, rv);
  check_bodies<8>(gm, qv, kv, vv, dov, pm, ro, rl, rq, rk, rv);
  check_bodies<16>(gm, qv, kv, vv, dov, pm, ro, rl, rq, rk, rv);
}

}  // namespace

TEST_CASE("cuda attention bodies give the row bodies' bits and the CPU's values, forward and backward, masked and causal") {
  for (bool causal : {false, true})
    for (bool masked : {false, true})
      for (std::int64_t kv_len : {5, 3, 7}) {  // causal with fewer or more keys than queries too
        AttentionGeometry g;
        g.batch = 2, g.q_len = 5, g.kv_len = kv_len, g.heads = 3, g.head_dim = 4, g.value_dim = 6;
        g.scale = 0.5, g.causal = causal;
        check<float>(g, masked);
        check<double>(g, masked);
      }
}

TEST_CASE("cuda attention kernels hold float32 rows in registers up to 128 lanes, else (and float64) in memory") {
  AttentionGeometry g;
  g.head_dim = 4, g.value_dim = 6;
  CHECK(attention_lanes(g, false) == 32);
  CHECK(attention_lanes(g, true) == 0);
  g.head_dim = 64, g.value_dim = 33;
  CHECK(attention_lanes(g, false) == 64);
  g.value_dim = 100;
  CHECK(attention_lanes(g, false) == 128);
  g.head_dim = 129;
  CHECK(attention_lanes(g, false) == 0);
}
