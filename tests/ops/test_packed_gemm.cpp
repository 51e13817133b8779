// The CPU backend's packed 16-bit GEMM (src/backend/cpu/packed_gemm.cpp) against float64 sums of
// the same (rounded) inputs: bfloat16, float16 and float32 operands, every transpose, sizes that
// leave partial tiles, cross its row, column and k blocks (144, 512, 512) and fill none of them,
// batches on either side, bias of either width, fused activations, outputs of another dtype, k = 0;
// the bits independent of the thread count; and ops::matmul, which routes 16-bit GEMMs of small
// shapes to it at the avx2 and avx512 tiers, on every device. Run at every ISA tier (the _avx2
// and _baseline CTest entries).

#include <algorithm>
#include <cmath>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/common/unary_ops.hpp"
#include "backend/cpu/packed_gemm.hpp"
#include "core/cpu_isa.hpp"
#include "mpt/half.hpp"
#include "test_util.hpp"

using namespace mpt;
using mpt::test::for_each_device;
using mpt::test::random;

namespace {

struct Case {
  std::int64_t ba, bb, m, n, k;
  bool ta, tb;
};

/// The unit roundoff of a dtype's values (what one rounding into it may lose, relatively).
double unit(DType d) {
  if (d == bfloat16) return std::ldexp(1.0, -8);
  if (d == float16) return std::ldexp(1.0, -11);
  return std::ldexp(1.0, -24);
}

/// act(op(a)·op(b) + bias) in float64 on the values as stored, with |terms| summed beside it.
void reference(const Case& c, const Tensor& a, const Tensor& b, const Tensor& bias, Activation act,
               std::vector<double>& out, std::vector<double>& mag) {
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  const auto biasv = bias.defined() ? bias.to_vector<double>() : std::vector<double>{};
  const std::int64_t bo = std::max(c.ba, c.bb);
  out.assign(static_cast<std::size_t>(bo * c.m * c.n), 0.0);
  mag = out;
  for (std::int64_t t = 0; t < bo; ++t) {
    const double* A = av.data() + (c.ba == 1 ? 0 : t) * c.m * c.k;
    const double* B = bv.data() + (c.bb == 1 ? 0 : t) * c.k * c.n;
    for (std::int64_t i = 0; i < c.m; ++i)
      for (std::int64_t j = 0; j < c.n; ++j) {
        double s = biasv.empty() ? 0.0 : biasv[j], g = std::abs(s);
        for (std::int64_t p = 0; p < c.k; ++p) {
          const double x = (c.ta ? A[p * c.m + i] : A[i * c.k + p]) * (c.tb ? B[j * c.k + p] : B[p * c.n + j]);
          s += x, g += std::abs(x);
        }
        const std::size_t o = static_cast<std::size_t>((t * c.m + i) * c.n + j);
        out[o] = common::activate(act, s);
        mag[o] = g;
      }
  }
}

Shape operand(std::int64_t batch, std::int64_t rows, std::int64_t cols, bool transposed) {
  Shape s = transposed ? Shape{cols, rows} : Shape{rows, cols};
  if (batch > 1) s.insert(s.begin(), batch);
  return s;
}

std::string describe(const Case& c, DType in, DType out, DType bias, Activation act) {
  return "batch " + std::to_string(c.ba) + "x" + std::to_string(c.bb) + " m" + std::to_string(c.m) + " n" +
         std::to_string(c.n) + " k" + std::to_string(c.k) + (c.ta ? " ta" : "") + (c.tb ? " tb" : "") + " " +
         to_string(in) + " -> " + to_string(out) + " bias " + (bias == float64 ? "none" : to_string(bias)) + " " +
         common::unary_name(act);
}

/// One GEMM through packed_gemm, checked against the float64 reference.
void check_case(const Case& c, DType in, DType out_dt, DType bias_dt, Activation act, std::uint64_t seed) {
  const std::string what = describe(c, in, out_dt, bias_dt, act);
  CAPTURE(what);
  const Tensor a = random(operand(c.ba, c.m, c.k, c.ta), in, Device::cpu(), seed);
  const Tensor b = random(operand(c.bb, c.k, c.n, c.tb), in, Device::cpu(), seed + 1);
  const Tensor bias = bias_dt == float64 ? Tensor() : random({c.n}, bias_dt, Device::cpu(), seed + 2);
  Shape os{c.m, c.n};
  if (std::max(c.ba, c.bb) > 1) os.insert(os.begin(), std::max(c.ba, c.bb));
  Tensor out = Tensor::full(os, 12345.0, out_dt, Device::cpu());  // every element must be written
  const cpu::GemmShape g = cpu::gemm_shape(a, b, c.ta, c.tb);
  cpu::packed_gemm(g, a, b, c.ta, c.tb, bias, act, out);
  std::vector<double> ref, mag;
  reference(c, a, b, bias, act, ref, mag);
  const auto got = out.to_vector<double>();
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    // float32 sums over k (each step may round: k·2⁻²⁴ of the terms' magnitudes), the activation in
    // float32 (a few ulp of the result), then one rounding into the output's dtype.
    const double tol = (static_cast<double>(c.k) + 4) * unit(float32) * (mag[i] + 1) +
                       unit(out_dt) * std::abs(ref[i]) + 1e-30;
    if (!(std::abs(got[i] - ref[i]) <= tol) && bad++ == 0) first = i;
  }
  CHECK_MESSAGE(bad == 0, bad, " of ", got.size(), " elements wrong; first at ", first, ": got ",
                bad ? got[first] : 0.0, ", float64 reference ", bad ? ref[first] : 0.0);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c{
      {1, 1, 1, 1, 1, false, false},        {1, 1, 7, 33, 5, false, false},
      {1, 1, 13, 17, 513, false, true},     {1, 1, 150, 290, 40, true, false},
      {1, 1, 6, 16, 1030, true, true},      {1, 1, 145, 257, 3, false, false},
      {1, 1, 40, 300, 600, false, false},   {1, 1, 300, 40, 70, true, true},
      {2, 2, 9, 21, 30, false, true},       {3, 1, 20, 35, 17, true, false},
      {1, 2, 5, 40, 9, false, false},       {1, 1, 20, 1100, 30, false, false},
      {1, 1, 10, 1100, 600, true, true},    {1, 1, 2500, 20, 600, false, false}};
  return c;
}

}  // namespace

TEST_CASE("packed GEMM: bfloat16, float16 and float32 operands against float64 sums, every layout") {
  std::uint64_t seed = 100;
  for (const DType in : {bfloat16, float16, float32})
    for (const Case& c : cases()) check_case(c, in, in, float64, UnaryOp::Linear, seed += 3);
}

TEST_CASE("packed GEMM: bias of either width, fused activations, another output dtype, k = 0") {
  std::uint64_t seed = 500;
  const Case c{1, 1, 31, 45, 70, false, true};
  for (const DType in : {bfloat16, float16})
    for (const Activation act : {UnaryOp::Linear, UnaryOp::Relu, UnaryOp::Gelu, UnaryOp::Sigmoid}) {
      check_case(c, in, in, float32, act, seed += 3);
      check_case(c, in, in, in, act, seed += 3);
      check_case(c, in, float32, in, act, seed += 3);
    }
  // k = 0: an empty sum, so out = act(bias) exactly rounded.
  check_case({1, 1, 8, 20, 0, false, false}, bfloat16, bfloat16, float32, UnaryOp::Relu, seed += 3);
  check_case({1, 1, 8, 20, 0, true, true}, float16, float32, float16, UnaryOp::Linear, seed += 3);
}

TEST_CASE("packed GEMM: every finite 16-bit value widened exactly, through each operand's packing") {
  // Every finite float16 and bfloat16 bit pattern (subnormals, ±0, the largest) as one operand, an
  // identity as the other, into float32: out is the operand itself, exactly, whichever operand
  // carries the values and whether it is transposed (the four packing loops, their whole vectors,
  // transposes and edges; the tier's VCVTPH2PS for float16 above the baseline).
  constexpr std::int64_t K = 64;
  for (const DType in : {float16, bfloat16}) {
    std::vector<std::uint16_t> bits;
    for (std::uint32_t h = 0; h < 0x10000u; ++h) {
      const std::uint32_t exp = in == float16 ? (h >> 10) & 0x1fu : (h >> 7) & 0xffu;
      if (exp != (in == float16 ? 0x1fu : 0xffu)) bits.push_back(static_cast<std::uint16_t>(h));
    }
    const std::int64_t rows = (static_cast<std::int64_t>(bits.size()) + K - 1) / K;
    bits.resize(static_cast<std::size_t>(rows * K), 0);
    auto value = [&](std::int64_t i) {
      const std::uint16_t h = bits[static_cast<std::size_t>(i)];
      return in == float16 ? half_bits_to_float(h) : bfloat16_bits_to_float(h);
    };
    std::vector<std::uint16_t> one(K * K, 0);
    for (std::int64_t i = 0; i < K; ++i) one[static_cast<std::size_t>(i * K + i)] = in == float16 ? 0x3c00 : 0x3f80;
    const Tensor eye = Tensor::from_host(one.data(), one.size(), in, {K, K}, Device::cpu());
    for (int side = 0; side < 2; ++side)
      for (const bool t : {false, true}) {
        CAPTURE(to_string(in));
        CAPTURE(side);
        CAPTURE(t);
        // side 0: a = the values ([rows, K], or [K, rows] read as aᵀ); side 1: b = them ([K, rows],
        // or [rows, K] read as bᵀ). out[i][j] is the value at values[at(i, j)].
        const bool as_rows = side == 0 ? !t : t;
        const Tensor x = Tensor::from_host(bits.data(), bits.size(), in, as_rows ? Shape{rows, K} : Shape{K, rows},
                                           Device::cpu());
        const Tensor& a = side == 0 ? x : eye;
        const Tensor& b = side == 0 ? eye : x;
        const bool ta = side == 0 && t, tb = side == 1 && t;
        const cpu::GemmShape g = cpu::gemm_shape(a, b, ta, tb);
        Tensor out = Tensor::empty({g.m, g.n}, float32, Device::cpu());
        cpu::packed_gemm(g, a, b, ta, tb, Tensor(), UnaryOp::Linear, out);
        const auto got = out.to_vector<float>();
        std::int64_t bad = 0, first = -1;
        for (std::int64_t i = 0; i < g.m; ++i)
          for (std::int64_t j = 0; j < g.n; ++j) {
            // op(x)[i][j] = x's element (i, j) as laid out, or (j, i) when read transposed.
            const std::int64_t r = side == 0 ? i : j, c = side == 0 ? j : i;  // (row, column) of the values' matrix
            const std::int64_t at = as_rows ? r * K + c : c * rows + r;
            if (got[static_cast<std::size_t>(i * g.n + j)] != value(at) && bad++ == 0) first = at;
          }
        CHECK_MESSAGE(bad == 0, bad, " values wrong; first the bits ", first < 0 ? 0 : bits[static_cast<std::size_t>(first)]);
      }
  }
}

TEST_CASE("packed GEMM: float32 sums rounded to 16 bits as the bulk conversion rounds them") {
  // float32 values (random bit patterns of every finite exponent, a quarter of them exact ties of
  // bfloat16, others that round up to inf) times an identity, into bfloat16 and float16: each
  // output is the bulk conversion of its value, bit for bit (the rows' whole vectors and tails).
  constexpr std::int64_t M = 61, K = 45;
  std::vector<float> v(static_cast<std::size_t>(M * K));
  std::uint64_t state = 12345;
  for (std::size_t i = 0; i < v.size(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::uint32_t bits = static_cast<std::uint32_t>(state >> 32);
    if (((bits >> 23) & 0xffu) == 0xffu || (bits & 0x7fffffffu) == 0) bits ^= 0x40000000u;  // finite, nonzero
    if (i % 4 == 1) bits = (bits & 0xffff0000u) | 0x8000u;      // a tie: to the even neighbour
    if (i % 16 == 2) bits = (bits & 0x80000000u) | 0x7f7fff00u;  // rounds up to ±inf in bfloat16
    v[i] = std::bit_cast<float>(bits);
  }
  std::vector<float> one(static_cast<std::size_t>(K * K), 0.f);
  for (std::int64_t i = 0; i < K; ++i) one[static_cast<std::size_t>(i * K + i)] = 1.f;
  const Tensor a = Tensor::from_vector(v, {M, K}, Device::cpu());
  const Tensor eye = Tensor::from_vector(one, {K, K}, Device::cpu());
  for (const DType out_dt : {bfloat16, float16}) {
    CAPTURE(to_string(out_dt));
    Tensor out = Tensor::empty({M, K}, out_dt, Device::cpu());
    cpu::packed_gemm(cpu::gemm_shape(a, eye, false, false), a, eye, false, false, Tensor(), UnaryOp::Linear, out);
    std::vector<std::uint16_t> got(v.size()), want(v.size());
    std::memcpy(got.data(), out.data_ptr(), got.size() * 2);
    if (out_dt == bfloat16) float_to_bfloat16(v.data(), want.data(), v.size());
    else float_to_half(v.data(), want.data(), v.size());
    std::int64_t bad = 0;
    for (std::size_t i = 0; i < v.size(); ++i) bad += got[i] != want[i];
    CHECK(bad == 0);
  }
}

TEST_CASE("packed GEMM: the bits do not depend on the thread count") {
  const int saved = num_threads();
  for (const DType in : {bfloat16, float16}) {
    CAPTURE(to_string(in));
    const Tensor a = random({300, 600}, in, Device::cpu(), 7), b = random({600, 290}, in, Device::cpu(), 8);
    const cpu::GemmShape g = cpu::gemm_shape(a, b, false, false);
    Tensor one = Tensor::empty({300, 290}, in, Device::cpu()), two = Tensor::empty({300, 290}, in, Device::cpu());
    set_num_threads(1);
    cpu::packed_gemm(g, a, b, false, false, Tensor(), UnaryOp::Linear, one);
    set_num_threads(2);
    cpu::packed_gemm(g, a, b, false, false, Tensor(), UnaryOp::Linear, two);
    CHECK(one.to_vector<double>() == two.to_vector<double>());
  }
  set_num_threads(saved);
}

TEST_CASE("packed GEMM: operands of different dtypes are an error naming it") {
  const Tensor a = Tensor::ones({4, 5}, bfloat16, Device::cpu()), b = Tensor::ones({5, 6}, float16, Device::cpu());
  Tensor out = Tensor::empty({4, 6}, bfloat16, Device::cpu());
  const std::string e = test::error_of([&] {
    cpu::packed_gemm(cpu::gemm_shape(a, b, false, false), a, b, false, false, Tensor(), UnaryOp::Linear, out);
  });
  CHECK(test::contains(e, "packed_gemm"));
  CHECK(test::contains(e, "bfloat16"));
  CHECK(test::contains(e, "float16"));
}

TEST_CASE("ops::matmul in 16 bits (packed above the baseline tier) and float32 (packed at avx2) matches float64 sums") {
  // Above the baseline tier the 16-bit operands take the packed kernel where oneDNN has no native
  // 16-bit GEMM, float32 ones at the avx2 tier (the rules), elsewhere the native or staged GEMM:
  // the same results to the output's rounding.
  const bool packed_here = detail::cpu_isa() != detail::CpuIsa::baseline;
  CAPTURE(packed_here);
  for_each_device([](Device d) {
    for (const DType in : {bfloat16, float16, float32}) {
      CAPTURE(to_string(in));
      const Tensor a = random({37, 70}, in, d, 41), b = random({45, 70}, in, d, 42);
      const Tensor y = ops::matmul(a, b, false, true);
      const auto av = a.to_vector<double>(), bv = b.to_vector<double>(), yv = y.to_vector<double>();
      REQUIRE(yv.size() == 37u * 45u);
      for (std::int64_t i = 0; i < 37; ++i)
        for (std::int64_t j = 0; j < 45; ++j) {
          double s = 0, g = 0;
          for (std::int64_t p = 0; p < 70; ++p) {
            s += av[i * 70 + p] * bv[j * 70 + p];
            g += std::abs(av[i * 70 + p] * bv[j * 70 + p]);
          }
          const double got = yv[static_cast<std::size_t>(i * 45 + j)];
          REQUIRE_MESSAGE(std::abs(got - s) <= 74 * unit(float32) * g + unit(in) * std::abs(s), "at ", i, ",", j,
                          ": got ", got, ", float64 ", s);
        }
    }
  });
}

TEST_CASE("float32 ops::dense at the avx2 tier is the packed GEMM's, bit for bit; oneDNN's elsewhere, to rounding") {
  // Model A's first layer in small: x [37, 70] · w [70, 45] + bias, relu fused into the GEMM.
  const Tensor x = random({37, 70}, float32, Device::cpu(), 51), w = random({70, 45}, float32, Device::cpu(), 52),
               bias = random({45}, float32, Device::cpu(), 53);
  const Tensor y = ops::dense(x, w, bias, "relu");
  Tensor packed = Tensor::empty({37, 45}, float32, Device::cpu());
  cpu::packed_gemm(cpu::gemm_shape(x, w, false, false), x, w, false, false, bias, UnaryOp::Relu, packed);
  const auto yv = y.to_vector<double>(), pv = packed.to_vector<double>();
  if (cpu::packed_gemm32_applies(cpu::gemm_shape(x, w, false, false))) {
    CHECK(yv == pv);
  } else {
    const auto xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = bias.to_vector<double>();
    for (std::int64_t i = 0; i < 37; ++i)
      for (std::int64_t j = 0; j < 45; ++j) {
        double s = bv[static_cast<std::size_t>(j)], g = std::abs(s);
        for (std::int64_t p = 0; p < 70; ++p) {
          s += xv[i * 70 + p] * wv[p * 45 + j];
          g += std::abs(xv[i * 70 + p] * wv[p * 45 + j]);
        }
        const std::size_t at = static_cast<std::size_t>(i * 45 + j);
        REQUIRE(std::abs(yv[at] - std::max(s, 0.0)) <= 74 * unit(float32) * g);
        REQUIRE(std::abs(pv[at] - std::max(s, 0.0)) <= 74 * unit(float32) * g);
      }
  }
  CHECK(cpu::packed_gemm32_applies(cpu::gemm_shape(x, w, false, false)) ==
        (std::getenv("MPT_CPU_GEMM32") ? std::string(std::getenv("MPT_CPU_GEMM32")) == "packed"
                                       : detail::cpu_isa() == detail::CpuIsa::avx2));
}

TEST_CASE("float32 weight gradients a^T b over a long k: oneDNN's run on a transposed copy of a, the bits of a b on it") {
  // k (the batch's rows) at least 4m with m <= n: where oneDNN runs the float32 GEMM (not the
  // packed kernel's tier) a is transposed first, so the result is that of ops::matmul on the
  // transposed operand, bit for bit; with m > n (no copy) and everywhere: float64 sums to rounding.
  for_each_device([](Device d) {
    struct Kmn { std::int64_t k, m, n; };
    for (const Kmn& s : {Kmn{300, 40, 50}, Kmn{640, 16, 160}, Kmn{300, 60, 20}}) {
      const std::int64_t k = s.k, m = s.m, n = s.n;
      CAPTURE(k);
      CAPTURE(m);
      CAPTURE(n);
      const Tensor a = random({k, m}, float32, d, 61), b = random({k, n}, float32, d, 62);
      const Tensor y = ops::matmul(a, b, true, false);
      const auto av = a.to_vector<double>(), bv = b.to_vector<double>(), yv = y.to_vector<double>();
      REQUIRE(yv.size() == static_cast<std::size_t>(m * n));
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          double s = 0, g = 0;
          for (std::int64_t p = 0; p < k; ++p) {
            s += av[p * m + i] * bv[p * n + j];
            g += std::abs(av[p * m + i] * bv[p * n + j]);
          }
          REQUIRE(std::abs(yv[static_cast<std::size_t>(i * n + j)] - s) <= (k + 4) * unit(float32) * g);
        }
      const bool copied = m <= n && !cpu::packed_gemm32_applies(cpu::gemm_shape(a, b, true, false));
      if (copied && d == Device::cpu()) CHECK(yv == ops::matmul(ops::transpose(a, {1, 0}), b).to_vector<double>());
    }
  });
}

TEST_CASE("transposes of the last two axes, blocked through registers: every element where it belongs") {
  // Sizes around every tier's square (4, 8, 16 float32 lanes) and the 32-value blocks of the
  // other widths; batches of matrices; each value checked against its index.
  for_each_device([](Device d) {
    for (const DType dt : {float32, int32, bfloat16, float64, uint8})
      for (const Shape& s : {Shape{16, 16}, Shape{37, 45}, Shape{64, 33}, Shape{3, 17, 40}, Shape{2, 1, 70},
                             Shape{130, 1}}) {
        const std::int64_t nd = static_cast<std::int64_t>(s.size()), rows = s[nd - 2], cols = s[nd - 1];
        const std::int64_t n = numel_of(s), batch = n / (rows * cols);
        std::vector<double> v(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<double>(i % 251);
        const Tensor x = Tensor::from_vector(v, s).to(dt).to(d);
        std::vector<std::int64_t> perm(static_cast<std::size_t>(nd));
        for (std::int64_t i = 0; i < nd; ++i) perm[static_cast<std::size_t>(i)] = i;
        std::swap(perm[static_cast<std::size_t>(nd - 2)], perm[static_cast<std::size_t>(nd - 1)]);
        const auto t = ops::transpose(x, perm).to_vector<double>();
        std::size_t bad = 0;
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t c = 0; c < cols; ++c)
            for (std::int64_t r = 0; r < rows; ++r)
              bad += t[static_cast<std::size_t>((b * cols + c) * rows + r)] !=
                     v[static_cast<std::size_t>((b * rows + r) * cols + c)];
        CHECK_MESSAGE(bad == 0, to_string(dt), " ", to_string(s), " on ", d.str());
      }
  });
}
