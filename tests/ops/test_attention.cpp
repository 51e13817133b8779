// ops::dot_product_attention against a float64 reference on every device and dtype, masks
// exact, gradients against finite differences in float64.
#include <array>
#include <cmath>

#include "attention_test_util.hpp"

using namespace mpt;
using namespace mpt::test;  // check_close, check_gradients, for_each_device, random, tolerance

namespace {

using Vec = std::vector<double>;

/// The float64 reference (attention_test_util.hpp) on tensors.
Vec reference(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int>& mask, bool causal,
              double scale) {
  const auto& qs = q.shape();
  return attention_reference(q.to_vector<double>(), k.to_vector<double>(), v.to_vector<double>(), qs[0], qs[1],
                             k.shape()[1], qs[2], qs[3], v.shape()[3], mask, causal, scale);
}


}  // namespace

TEST_CASE("dot_product_attention matches float64 softmax attention in every dtype, causal and masked") {
  struct Case {
    std::int64_t B, Tq, Tk, H, D, Dv;
    bool causal, masked;
  };
  const std::vector<Case> cases = {{2, 5, 5, 3, 8, 8, false, false}, {2, 7, 7, 2, 4, 6, true, false},
                                   {2, 4, 9, 2, 5, 3, false, true},  {3, 6, 6, 1, 16, 16, true, true},
                                   {1, 1, 1, 1, 1, 1, false, false},
                                   // several tiles of the CPU's 64 x 64 blocks, with ragged ends
                                   {1, 70, 150, 2, 20, 17, false, true}, {2, 130, 130, 1, 8, 8, true, false},
                                   {1, 65, 65, 2, 16, 16, true, true}};
  for_each_device([&](Device dev) {
    for (const Case& c : cases)
      for (DType dt : float_dtypes()) {
        Tensor q = random({c.B, c.Tq, c.H, c.D}, dt, dev, 1), k = random({c.B, c.Tk, c.H, c.D}, dt, dev, 2);
        Tensor v = random({c.B, c.Tk, c.H, c.Dv}, dt, dev, 3);
        const std::vector<int> m = c.masked ? padding_mask(c.B, c.Tq, c.Tk) : std::vector<int>{};
        ops::AttentionOptions o{.is_causal = c.causal};
        if (c.masked) o.mask = mask_tensor(m, {c.B, c.Tq, c.Tk}, dev);
        Tensor y = ops::dot_product_attention(q, k, v, o);
        REQUIRE(y.shape() == Shape{c.B, c.Tq, c.H, c.Dv});
        CHECK(y.dtype() == dt);
        const std::string what = to_string(dt) + " B" + std::to_string(c.B) + " Tq" + std::to_string(c.Tq) + " Tk" +
                                 std::to_string(c.Tk) + (c.causal ? " causal" : "") + (c.masked ? " masked" : "");
        // float32 scores carry ~1e-7 relative error per product into exp and then a weighted sum
        // that may cancel: an absolute allowance beside the table's relative one. 16-bit: on a GPU
        // cuDNN's fused forward rounds the probabilities to 16 bits before P·V (as FlashAttention),
        // an absolute error up to one 16-bit rounding of max|v| = 2 (seen on the H100: 1.4e-3 in
        // bfloat16 on an output of -2.7e-3).
        const Tolerance tol = dt == float32    ? Tolerance{1e-4, 2e-5}
                              : dt == bfloat16 ? Tolerance{tolerance(dt).rtol, 2.0 / 256}
                              : dt == float16  ? Tolerance{tolerance(dt).rtol, 2.0 / 2048}
                                               : tolerance(dt);
        check_close(y, reference(q, k, v, m, c.causal, 1 / std::sqrt(double(c.D))), tol, what);
      }
  });
}

TEST_CASE("dot_product_attention: masked keys get probability exactly 0, any mask layout") {
  for_each_device([](Device dev) {
    const std::int64_t B = 2, T = 6, H = 2, D = 4;
    Tensor q = random({B, T, H, D}, float32, dev, 4), k = random({B, T, H, D}, float32, dev, 5);
    Tensor v = random({B, T, H, D}, float32, dev, 6);
    const std::vector<int> m = padding_mask(B, T, T);
    const Tensor mask = mask_tensor(m, {B, T, T}, dev);
    Tensor y = ops::dot_product_attention(q, k, v, {.mask = mask, .is_causal = true});
    // Huge values at every masked or future key change nothing, to the bit.
    auto vv = v.to_vector<float>();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = T - b; j < T; ++j)
        for (std::int64_t e = 0; e < H * D; ++e) vv[((b * T + j) * H) * D + e] = 1e30f;
    Tensor v2 = Tensor::from_vector<float>(vv, {B, T, H, D}, dev);
    Tensor y2 = ops::dot_product_attention(q, k, v2, {.mask = mask, .is_causal = true});
    CHECK(y.to_vector<float>() == y2.to_vector<float>());
    // Query 1 of batch 0 attends to nothing: zeros.
    const auto yv = y.to_vector<float>();
    for (std::int64_t e = 0; e < H * D; ++e) CHECK(yv[1 * H * D + e] == 0.0f);
    // The same mask as [B, 1, Tq, Tk] and as [B, H, Tq, Tk] gives the same bits; a [Tq, Tk] one broadcasts.
    Tensor m4 = mask.reshape({B, 1, T, T});
    CHECK(ops::dot_product_attention(q, k, v, {.mask = m4, .is_causal = true}).to_vector<float>() == y.to_vector<float>());
    CHECK(ops::dot_product_attention(q, k, v, {.mask = ops::broadcast_to(m4, {B, H, T, T}), .is_causal = true})
              .to_vector<float>() == y.to_vector<float>());
    std::vector<int> tri;
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t j = 0; j < T; ++j) tri.push_back(j <= i);
    CHECK(ops::dot_product_attention(q, k, v, {.mask = mask_tensor(tri, {T, T}, dev)}).to_vector<float>() ==
          ops::dot_product_attention(q, k, v, {.is_causal = true}).to_vector<float>());
  });
}

TEST_CASE("dot_product_attention gradients match finite differences in float64") {
  for_each_device([](Device dev) {
    // One tile, and (second) several of the CPU's 64 x 64 tiles with ragged ends.
    for (const std::array<std::int64_t, 6> size : {std::array<std::int64_t, 6>{2, 3, 4, 2, 3, 2}, {1, 66, 67, 1, 2, 2}}) {
      const std::int64_t B = size[0], Tq = size[1], Tk = size[2], H = size[3], D = size[4], Dv = size[5];
      const std::vector<int> m = padding_mask(B, Tq, Tk);
      const Tensor mask = mask_tensor(m, {B, Tq, Tk}, dev);
      for (bool causal : {false, true})
        for (bool masked : {false, true}) {
          ops::AttentionOptions o{.is_causal = causal, .scale = 0.7};
          if (masked) o.mask = mask;
          check_gradients(std::string("attention T") + std::to_string(Tq) + (causal ? " causal" : "") + (masked ? " masked" : ""),
                          [&](const std::vector<Tensor>& in) {
                            Tensor y = ops::dot_product_attention(in[0], in[1], in[2], o);
                            return ops::mul(y, Tensor::random_uniform(y.shape(), 0.5, 1.5, 9, float64, y.device()));
                          },
                          {random({B, Tq, H, D}, float64, dev, 7), random({B, Tk, H, D}, float64, dev, 8),
                           random({B, Tk, H, Dv}, float64, dev, 9)});
        }
    }
    const std::int64_t B = 2, Tq = 3, Tk = 4, H = 2, D = 3, Dv = 2;
    // 16-bit inputs: gradients in the inputs' dtype, close to the float64 ones.
    Tensor q = random({B, Tq, H, D}, bfloat16, dev, 10), k = random({B, Tk, H, D}, bfloat16, dev, 11);
    Tensor v = random({B, Tk, H, Dv}, bfloat16, dev, 12);
    GradientTape tape;
    tape.watch(q), tape.watch(k), tape.watch(v);
    auto g = tape.gradient(ops::sum(ops::cast(ops::dot_product_attention(q, k, v, {.is_causal = true}), float32)), {q, k, v});
    Tensor q64 = q.to(float64), k64 = k.to(float64), v64 = v.to(float64);
    GradientTape tape64;
    tape64.watch(q64), tape64.watch(k64), tape64.watch(v64);
    auto g64 = tape64.gradient(ops::sum(ops::dot_product_attention(q64, k64, v64, {.is_causal = true})), {q64, k64, v64});
    for (int i = 0; i < 3; ++i) {
      CHECK(g[i].dtype() == bfloat16);
      check_close(g[i], g64[i].to_vector<double>(), {3e-2, 2e-2}, "bfloat16 gradient " + std::to_string(i));
    }
  });
}

TEST_CASE("16-bit attention at transformer sizes (on a GPU: cuDNN's fused forward) matches float64, with gradients") {
  // Head dims of 32 and 64 and no explicit mask: on a GPU with cuDNN the forward runs cuDNN's
  // fused flash attention (backend/cuda/attention_fused.cpp) and the backward mpt's kernels from
  // its lse; on the CPU and the test device, mpt's kernels throughout. The same bounds for both.
  for_each_device([](Device dev) {
    struct Case {
      std::int64_t B, Tq, Tk, H, D;
      bool causal;
    };
    for (const Case& c : {Case{2, 64, 64, 4, 64, true}, Case{2, 48, 80, 2, 32, false}, Case{1, 96, 96, 2, 32, true}})
      for (DType dt : {bfloat16, float16}) {
        const std::string what = to_string(dt) + " T" + std::to_string(c.Tq) + "x" + std::to_string(c.Tk) + " D" +
                                 std::to_string(c.D) + (c.causal ? " causal" : "");
        CAPTURE(what);
        Tensor q = random({c.B, c.Tq, c.H, c.D}, dt, dev, 21, -1, 1), k = random({c.B, c.Tk, c.H, c.D}, dt, dev, 22, -1, 1);
        Tensor v = random({c.B, c.Tk, c.H, c.D}, dt, dev, 23, -1, 1);
        Tensor w = Tensor::random_uniform({c.B, c.Tq, c.H, c.D}, 0.5, 1.5, 24, float32, dev);
        GradientTape tape;
        tape.watch(q), tape.watch(k), tape.watch(v);
        Tensor y = ops::dot_product_attention(q, k, v, {.is_causal = c.causal});
        REQUIRE(y.dtype() == dt);
        auto g = tape.gradient(ops::sum(ops::mul(ops::cast(y, float32), w)), {q, k, v});
        // float64 on the same (16-bit rounded) inputs.
        Tensor q64 = q.to(float64), k64 = k.to(float64), v64 = v.to(float64);
        GradientTape tape64;
        tape64.watch(q64), tape64.watch(k64), tape64.watch(v64);
        Tensor y64 = ops::dot_product_attention(q64, k64, v64, {.is_causal = c.causal});
        auto g64 = tape64.gradient(ops::sum(ops::mul(y64, w.to(float64))), {q64, k64, v64});
        // One rounding of the output, plus (cuDNN) the probabilities rounded to 16 bits before P·V.
        const Tolerance fwd = dt == bfloat16 ? Tolerance{2e-2, 5e-3} : Tolerance{4e-3, 1e-3};
        check_close(y, y64.to_vector<double>(), fwd, what + ": forward");
        for (int i = 0; i < 3; ++i) {
          CHECK(g[i].dtype() == dt);
          check_close(g[i], g64[i].to_vector<double>(), {3e-2, 3e-2}, what + ": gradient " + std::to_string(i));
        }
      }
  });
}

TEST_CASE("dot_product_attention refuses what it cannot compute, naming it") {
  Tensor q = Tensor::zeros({2, 3, 2, 4}), k = Tensor::zeros({2, 5, 2, 4}), v = Tensor::zeros({2, 5, 2, 6});
  CHECK_NOTHROW(ops::dot_product_attention(q, k, v));
  CHECK_THROWS_WITH_AS(ops::dot_product_attention(q, Tensor::zeros({2, 5, 2, 3}), v), doctest::Contains("dot_product_attention"), Error);
  CHECK_THROWS_WITH_AS(ops::dot_product_attention(q, k, Tensor::zeros({2, 4, 2, 6})), doctest::Contains("[B, Tk, H, Dv]"), Error);
  CHECK_THROWS_WITH_AS(ops::dot_product_attention(Tensor::zeros({2, 3, 8}), k, v), doctest::Contains("[batch, length, heads, dim]"), Error);
  CHECK_THROWS_WITH_AS(ops::dot_product_attention(q, k, v, {.mask = Tensor::ones({2, 3, 4}, bool_)}),
                       doctest::Contains("does not broadcast"), Error);
  CHECK_THROWS_WITH_AS(ops::dot_product_attention(q, k, v, {.mask = Tensor::ones({2, 3, 5}, float32)}),
                       doctest::Contains("mask must be bool"), Error);
  CHECK_THROWS_AS(ops::dot_product_attention(q.to(float16), k, v), Error);
}
