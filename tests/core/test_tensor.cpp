// mpt::Tensor: factories, random numbers, views, casts, printing, xtensor views, dtypes, devices,
// the caching allocator's statistics and the thread-count setting.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <mpt/mpt.hpp>
#include <mpt/xtensor.hpp>

#include "test_util.hpp"

using namespace mpt;
using mpt::test::error_of;
using mpt::test::contains;
using mpt::test::for_each_device;

namespace {

template <class T>
void check_roundtrip_vector(const std::vector<T>& values, DType expected_dtype, Device dev) {
  CAPTURE(to_string(expected_dtype));
  Tensor t = Tensor::from_vector(values, {}, dev);
  CHECK(t.dtype() == expected_dtype);
  CHECK(t.shape() == Shape{static_cast<std::int64_t>(values.size())});
  CHECK(t.device() == dev);
  CHECK(t.nbytes() == values.size() * sizeof(T));
  std::vector<T> back = t.to_vector<T>();
  REQUIRE(back.size() == values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t>)
      CHECK(back[i].bits == values[i].bits);
    else
      CHECK(back[i] == values[i]);
  }
}

}  // namespace

// ---- factories --------------------------------------------------------------------------------

TEST_CASE("empty/zeros/ones/full/scalar give the requested shape, dtype, device and values") {
  for_each_device([](Device dev) {
    const std::vector<DType> all{float32, float64, float16, bfloat16, int32, int64, uint8, bool_};
    for (DType d : all) {
      CAPTURE(to_string(d));
      Tensor e = Tensor::empty({2, 3, 4}, d, dev);
      CHECK(e.defined());
      CHECK(e.shape() == Shape{2, 3, 4});
      CHECK(e.dim() == 3);
      CHECK(e.numel() == 24);
      CHECK(e.size(1) == 3);
      CHECK(e.size(-1) == 4);
      CHECK(e.dtype() == d);
      CHECK(e.device() == dev);
      CHECK(e.nbytes() == 24 * itemsize(d));

      CHECK(Tensor::zeros({3, 2}, d, dev).to_vector<double>() == std::vector<double>(6, 0.0));
      CHECK(Tensor::ones({5}, d, dev).to_vector<double>() == std::vector<double>(5, 1.0));
      Tensor f = Tensor::full({2, 2}, 3.0, d, dev);
      CHECK(f.dtype() == d);
      // bool keeps only "non-zero"
      CHECK(f.to_vector<double>() == std::vector<double>(4, d == bool_ ? 1.0 : 3.0));
    }
    // Non-integral fill values are rounded per dtype: 2.75 is exact in every float type.
    CHECK(Tensor::full({3}, 2.75, float16, dev).to_vector<float>() == std::vector<float>(3, 2.75f));
    CHECK(Tensor::full({3}, -2.75, bfloat16, dev).to_vector<float>() == std::vector<float>(3, -2.75f));
    CHECK(Tensor::full({3}, 1e10, float64, dev).to_vector<double>() == std::vector<double>(3, 1e10));

    Tensor s = Tensor::scalar(2.5, float32, dev);
    CHECK(s.dim() == 0);
    CHECK(s.shape().empty());
    CHECK(s.numel() == 1);
    CHECK(s.item() == 2.5);
    CHECK(Tensor::scalar(-7, int64, dev).item() == -7.0);

    Tensor z = Tensor::zeros({2, 0, 3}, float32, dev);
    CHECK(z.numel() == 0);
    CHECK(z.nbytes() == 0);
    CHECK(z.to_vector<float>().empty());
  });
  CHECK_THROWS_AS(Tensor::empty({2, -1}), Error);
  CHECK(contains(error_of([] { Tensor::zeros({-3}); }), "(-3,)"));
  CHECK_FALSE(Tensor().defined());
}

TEST_CASE("arange matches numpy.arange, including fractional steps and empty ranges") {
  for_each_device([](Device dev) {
    auto vals = [&](double a, double b, double s, DType d = float64) {
      return Tensor::arange(a, b, s, d, dev).to_vector<double>();
    };
    CHECK(vals(0, 5, 1) == std::vector<double>{0, 1, 2, 3, 4});
    CHECK(Tensor::arange(0, 5, 1, float32, dev).dtype() == float32);
    CHECK(vals(2, 11, 3, int32) == std::vector<double>{2, 5, 8});
    CHECK(vals(5, 2, -1, int64) == std::vector<double>{5, 4, 3});

    // Fractional steps: numpy gives ceil((stop - start) / step) elements start + i * step.
    std::vector<double> f = vals(1.0, 2.0, 0.3);
    REQUIRE(f.size() == 4);
    for (std::size_t i = 0; i < f.size(); ++i) CHECK(f[i] == doctest::Approx(1.0 + 0.3 * i).epsilon(1e-15));
    CHECK(vals(0, 0.3, 0.1).size() == 3);  // 0.3 / 0.1 = 2.9999999999999996 -> 3 elements
    CHECK(vals(0, 1, 0.1).size() == 10);
    std::vector<double> g = Tensor::arange(-1, 1, 0.25, float16, dev).to_vector<double>();
    CHECK(g == std::vector<double>{-1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75});
    std::vector<double> down = vals(1, 0, -0.25);
    CHECK(down == std::vector<double>{1, 0.75, 0.5, 0.25});

    // Empty ranges give a (0,) tensor, not an error.
    const std::vector<std::tuple<double, double, double>> empty_ranges{
        {3.0, 3.0, 1.0}, {5.0, 2.0, 1.0}, {2.0, 5.0, -1.0}, {0.0, -0.5, 0.1}};
    for (auto [a, b, s] : empty_ranges) {
      Tensor e = Tensor::arange(a, b, s, float32, dev);
      CHECK(e.shape() == Shape{0});
      CHECK(e.numel() == 0);
    }
  });
  CHECK_THROWS_AS(Tensor::arange(0, 1, 0), Error);
  CHECK_THROWS_AS(Tensor::arange(0, INFINITY, 1), Error);
  CHECK(contains(error_of([] { Tensor::arange(0, 1, 0); }), "arange"));
}

TEST_CASE("from_vector: std::vector and initializer lists of every host element type") {
  for_each_device([](Device dev) {
    check_roundtrip_vector<float>({1.5f, -2.25f, 3e-8f, 1e30f}, float32, dev);
    check_roundtrip_vector<double>({1.0 / 3.0, -1e300, 5e-324}, float64, dev);
    check_roundtrip_vector<std::int32_t>({0, -1, 2147483647, -2147483647 - 1}, int32, dev);
    check_roundtrip_vector<std::int64_t>({0, -5, 9007199254740993LL, -(1LL << 62)}, int64, dev);
    check_roundtrip_vector<std::uint8_t>({0, 1, 128, 255}, uint8, dev);
    check_roundtrip_vector<bool>({true, false, false, true}, bool_, dev);
    check_roundtrip_vector<half>({half::from_bits(0x3c00), half::from_bits(0xc000), half::from_bits(0x0001)},
                                 float16, dev);
    check_roundtrip_vector<bfloat16_t>({bfloat16_t::from_bits(0x3f80), bfloat16_t::from_bits(0x4049)}, bfloat16,
                                       dev);

    // Initializer lists deduce the dtype from the element type and take a shape.
    Tensor a = Tensor::from_vector({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3}, dev);
    CHECK(a.dtype() == float32);
    CHECK(a.shape() == Shape{2, 3});
    CHECK(a.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK(Tensor::from_vector({1.0, 2.0}, {}, dev).dtype() == float64);
    Tensor i32 = Tensor::from_vector({std::int32_t{7}, std::int32_t{-8}}, {2, 1}, dev);
    CHECK(i32.dtype() == int32);
    CHECK(i32.shape() == Shape{2, 1});
    CHECK(i32.to_vector<std::int32_t>() == std::vector<std::int32_t>{7, -8});
    Tensor i64 = Tensor::from_vector({std::int64_t{1} << 40}, {}, dev);
    CHECK(i64.dtype() == int64);
    CHECK(i64.item() == std::ldexp(1.0, 40));
    Tensor u8 = Tensor::from_vector<std::uint8_t>({200, 3}, {}, dev);
    CHECK(u8.dtype() == uint8);
    CHECK(u8.to_vector<int>() == std::vector<int>{200, 3});
    Tensor b = Tensor::from_vector({true, false, true}, {}, dev);
    CHECK(b.dtype() == bool_);
    CHECK(b.to_vector<float>() == std::vector<float>{1, 0, 1});
    // 0.1f in binary16 is 0x2e66 (0.0999755859375); 1/3 in bfloat16 is 0x3eab (0.333984375).
    Tensor h = Tensor::from_vector({half(0.1f), half(-4.f)}, {}, dev);
    CHECK(h.dtype() == float16);
    CHECK(h.to_vector<double>() == std::vector<double>{0.0999755859375, -4.0});
    Tensor bf = Tensor::from_vector({bfloat16_t(1.f / 3.f), bfloat16_t(256.f)}, {}, dev);
    CHECK(bf.dtype() == bfloat16);
    CHECK(bf.to_vector<double>() == std::vector<double>{0.333984375, 256.0});

    // A 2-d shape from a std::vector, read back in another element type (converted).
    std::vector<std::int64_t> v{1, 2, 3, 4, 5, 6};
    Tensor m = Tensor::from_vector(v, {3, 2}, dev);
    CHECK(m.shape() == Shape{3, 2});
    CHECK(m.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  });
}

TEST_CASE("from_vector rejects values that do not fill the shape") {
  std::vector<float> five(5, 1.f);
  CHECK_THROWS_AS(Tensor::from_vector(five, {2, 3}), Error);
  const std::string msg = error_of([&] { Tensor::from_vector(five, {2, 3}); });
  CHECK(contains(msg, "from_vector"));
  CHECK(contains(msg, "5"));
  CHECK(contains(msg, "(2, 3)"));
  CHECK_THROWS_AS(Tensor::from_vector({1, 2, 3}, {4}), Error);
  CHECK_THROWS_AS(Tensor::from_vector({1.0, 2.0}, {1, 1}), Error);
  // An empty vector with an explicit zero-sized shape is fine.
  CHECK(Tensor::from_vector(std::vector<float>{}, {0, 4}).shape() == Shape{0, 4});
}

// ---- random ---------------------------------------------------------------------------------

TEST_CASE("random_normal / random_uniform: reproducible per seed, distinct across seeds") {
  for_each_device([](Device dev) {
    for (DType d : mpt::test::float_dtypes()) {
      CAPTURE(to_string(d));
      Tensor a = Tensor::random_normal({64, 33}, 0.0, 1.0, 42, d, dev);
      Tensor b = Tensor::random_normal({64, 33}, 0.0, 1.0, 42, d, dev);
      Tensor c = Tensor::random_normal({64, 33}, 0.0, 1.0, 43, d, dev);
      CHECK(a.dtype() == d);
      CHECK(a.shape() == Shape{64, 33});
      CHECK(a.to_vector<double>() == b.to_vector<double>());
      auto va = a.to_vector<double>(), vc = c.to_vector<double>();
      std::size_t same = 0;
      for (std::size_t i = 0; i < va.size(); ++i) same += va[i] == vc[i];
      CHECK(same < va.size() / 20);  // a few coincidences in 16-bit dtypes at most

      Tensor u = Tensor::random_uniform({1000}, -1.0, 1.0, 7, d, dev);
      Tensor u2 = Tensor::random_uniform({1000}, -1.0, 1.0, 7, d, dev);
      Tensor u3 = Tensor::random_uniform({1000}, -1.0, 1.0, 8, d, dev);
      CHECK(u.to_vector<double>() == u2.to_vector<double>());
      CHECK(u.to_vector<double>() != u3.to_vector<double>());
    }
    // The same stream on every device: values equal the CPU's.
    CHECK(Tensor::random_normal({100}, 1.0, 2.0, 5, float32, dev).to_vector<float>() ==
          Tensor::random_normal({100}, 1.0, 2.0, 5, float32, Device::cpu()).to_vector<float>());
    // A tensor's values do not depend on its shape's split, only on the element index.
    CHECK(Tensor::random_uniform({6, 5}, 0, 1, 9, float64, dev).to_vector<double>() ==
          Tensor::random_uniform({30}, 0, 1, 9, float64, dev).to_vector<double>());
  });
}

TEST_CASE("random_normal has the requested mean and standard deviation") {
  const double mu = 1.5, sigma = 2.0;
  const std::size_t n = 100000;
  for (DType d : {float64, float32}) {
    CAPTURE(to_string(d));
    std::vector<double> v = Tensor::random_normal({static_cast<std::int64_t>(n)}, mu, sigma, 123, d).to_vector<double>();
    double s = 0, s2 = 0;
    std::size_t within1 = 0;
    for (double x : v) {
      s += x;
      if (std::abs(x - mu) < sigma) ++within1;
    }
    const double mean = s / n;
    for (double x : v) s2 += (x - mean) * (x - mean);
    const double sd = std::sqrt(s2 / (n - 1));
    // Standard error of the mean is sigma/sqrt(n) = 0.0063; of the stddev about sigma/sqrt(2n) = 0.0045.
    CHECK(std::abs(mean - mu) < 0.04);
    CHECK(std::abs(sd - sigma) < 0.03);
    // Shape check: P(|z| < 1) = 0.6827 for a normal distribution.
    CHECK(std::abs(static_cast<double>(within1) / n - 0.6827) < 0.01);
  }
  // stddev 0 gives the mean exactly; a negative stddev is an error.
  CHECK(Tensor::random_normal({10}, 3.0, 0.0, 1).to_vector<float>() == std::vector<float>(10, 3.f));
  CHECK_THROWS_AS(Tensor::random_normal({10}, 0.0, -1.0), Error);
}

TEST_CASE("random_uniform stays in [minval, maxval) and covers it") {
  for_each_device([](Device dev) {
    const double lo = -2.0, hi = 3.0;
    std::vector<double> v = Tensor::random_uniform({100000}, lo, hi, 77, float64, dev).to_vector<double>();
    double mn = v[0], mx = v[0], s = 0;
    for (double x : v) {
      mn = std::min(mn, x);
      mx = std::max(mx, x);
      s += x;
    }
    CHECK(mn >= lo);
    CHECK(mx < hi);
    CHECK(mn < lo + 0.001);
    CHECK(mx > hi - 0.001);
    CHECK(std::abs(s / v.size() - 0.5) < 0.03);  // mean (lo + hi) / 2, se 5/sqrt(12 n) = 0.0046
    // Rounded to a 16-bit dtype the bounds still hold (inclusive at the top after rounding).
    for (DType d : {float16, bfloat16, float32}) {
      std::vector<double> w = Tensor::random_uniform({5000}, 0.25, 0.75, 3, d, dev).to_vector<double>();
      CHECK(*std::min_element(w.begin(), w.end()) >= 0.25);
      CHECK(*std::max_element(w.begin(), w.end()) <= 0.75);
    }
  });
  CHECK_THROWS_AS(Tensor::random_uniform({3}, 1.0, 0.0), Error);
}

// ---- views ----------------------------------------------------------------------------------

TEST_CASE("reshape infers -1 and shares storage with the original") {
  for_each_device([](Device dev) {
    Tensor x = Tensor::arange(0, 12, 1, float32, dev);
    Tensor r = x.reshape({3, -1});
    CHECK(r.shape() == Shape{3, 4});
    CHECK(x.reshape({-1, 6}).shape() == Shape{2, 6});
    CHECK(x.reshape({2, 3, 2}).shape() == Shape{2, 3, 2});
    CHECK(r.to_vector<float>() == x.to_vector<float>());
    CHECK(r.data_ptr() == x.data_ptr());
    CHECK(r.id() != x.id());

    // Writing through the view is visible in the original, and the other way round.
    r.slice(1, 2).assign(Tensor::full({1, 4}, -1.0, float32, dev));
    CHECK(x.to_vector<float>() == std::vector<float>{0, 1, 2, 3, -1, -1, -1, -1, 8, 9, 10, 11});
    x.assign(Tensor::full({12}, 5.0, float32, dev));
    CHECK(r.to_vector<float>() == std::vector<float>(12, 5.f));

    // Reshaping a row slice keeps its offset.
    Tensor y = Tensor::arange(0, 12, 1, int32, dev).reshape({4, 3});
    CHECK(y.slice(1, 3).reshape({-1}).to_vector<int>() == std::vector<int>{3, 4, 5, 6, 7, 8});
    // To and from 0-d and zero-sized shapes.
    CHECK(Tensor::scalar(4, float32, dev).reshape({1, 1}).shape() == Shape{1, 1});
    CHECK(Tensor::ones({1}, float32, dev).reshape({}).dim() == 0);
    CHECK(Tensor::zeros({0, 3}, float32, dev).reshape({3, 0}).shape() == Shape{3, 0});
  });
}

TEST_CASE("invalid reshapes are errors naming both shapes") {
  Tensor x = Tensor::zeros({3, 4});
  CHECK_THROWS_AS(x.reshape({5, 2}), Error);
  CHECK_THROWS_AS(x.reshape({-1, -1}), Error);
  CHECK_THROWS_AS(x.reshape({-1, 5}), Error);
  CHECK_THROWS_AS(x.reshape({-2, -6}), Error);
  CHECK_THROWS_AS(x.reshape({}), Error);
  CHECK_THROWS_AS(Tensor::zeros({0, 3}).reshape({-1, 0}), Error);  // -1 is ambiguous with a 0 factor
  const std::string msg = error_of([&] { x.reshape({5, 2}); });
  CHECK(contains(msg, "reshape"));
  CHECK(contains(msg, "(3, 4)"));
  CHECK(contains(msg, "(5, 2)"));
  CHECK_THROWS_AS(Tensor().reshape({1}), Error);
}

TEST_CASE("slice along the first axis shares storage and checks its bounds") {
  for_each_device([](Device dev) {
    Tensor x = Tensor::arange(0, 12, 1, float64, dev).reshape({4, 3});
    Tensor s = x.slice(1, 3);
    CHECK(s.shape() == Shape{2, 3});
    CHECK(s.to_vector<double>() == std::vector<double>{3, 4, 5, 6, 7, 8});
    CHECK(static_cast<char*>(s.data_ptr()) == static_cast<char*>(x.data_ptr()) + 3 * sizeof(double));
    s.assign(Tensor::full({2, 3}, 0.5, float32, dev).to(float64));
    CHECK(x.to_vector<double>() == std::vector<double>{0, 1, 2, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 9, 10, 11});
    // A slice of a slice, and an empty slice.
    Tensor ss = s.slice(1, 2);
    CHECK(ss.to_vector<double>() == std::vector<double>{0.5, 0.5, 0.5});
    ss.assign(Tensor::full({1, 3}, 7.0, float64, dev));
    CHECK(x.to_vector<double>()[6] == 7.0);
    CHECK(x.to_vector<double>()[3] == 0.5);
    CHECK(x.slice(4, 4).shape() == Shape{0, 3});
    CHECK(x.slice(0, 4).to_vector<double>() == x.to_vector<double>());
    // 1-d tensors slice elements.
    CHECK(Tensor::arange(0, 5, 1, int32, dev).slice(2, 5).to_vector<int>() == std::vector<int>{2, 3, 4});

    CHECK_THROWS_AS(x.slice(-1, 2), Error);
    CHECK_THROWS_AS(x.slice(3, 2), Error);
    CHECK_THROWS_AS(x.slice(0, 5), Error);
    CHECK_THROWS_AS(Tensor::scalar(1, float32, dev).slice(0, 1), Error);
    const std::string msg = error_of([&] { x.slice(2, 9); });
    CHECK(contains(msg, "slice"));
    CHECK(contains(msg, "(4, 3)"));
    CHECK(contains(msg, "9"));
  });
}

// ---- dtype and device conversion ------------------------------------------------------------

TEST_CASE("to(dtype): round trips, rounding, truncation to integers and conversion to bool") {
  for_each_device([](Device dev) {
    // Values exact in every dtype survive any round trip.
    const std::vector<double> exact{0, 1, -2, 3, 64, 100, -128, 120};
    const std::vector<DType> all{float32, float64, float16, bfloat16, int32, int64};
    Tensor base = Tensor::from_vector(exact, {2, 4}, dev);
    for (DType a : all)
      for (DType b : all) {
        CAPTURE(to_string(a));
        CAPTURE(to_string(b));
        Tensor t = base.to(a).to(b);
        CHECK(t.dtype() == b);
        CHECK(t.shape() == Shape{2, 4});
        CHECK(t.to_vector<double>() == exact);
      }
    // The same dtype gives the same handle; another dtype a new tensor.
    CHECK(base.to(float64).impl() == base.impl());
    CHECK(base.to(float32).impl() != base.impl());

    // Rounding to 16-bit floats: 1/3 is 0x3555 = 1365/4096 in float16 and 0x3eab = 171/512 in bfloat16.
    Tensor third = Tensor::from_vector({1.f / 3.f}, {}, dev);
    CHECK(third.to(float16).item() == 1365.0 / 4096.0);
    CHECK(third.to(bfloat16).item() == 171.0 / 512.0);
    CHECK(third.to(float16).to(float32).to(float16).item() == 1365.0 / 4096.0);
    // Overflow goes to infinity; 65504 is float16's largest finite value.
    CHECK(std::isinf(Tensor::from_vector({70000.f}, {}, dev).to(float16).item()));
    CHECK(Tensor::from_vector({65504.f}, {}, dev).to(float16).item() == 65504.0);
    // float64 -> float16 rounds once: 1 + 2^-11 + 2^-40 lies just above the midpoint of 1 and 1 + 2^-10.
    CHECK(Tensor::from_vector({1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)}, {}, dev).to(float16).item() ==
          1.0 + std::ldexp(1.0, -10));
    CHECK(Tensor::from_vector({1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)}, {}, dev).to(bfloat16).item() ==
          1.0 + std::ldexp(1.0, -7));

    // Float -> integer truncates toward zero.
    Tensor f = Tensor::from_vector({1.7f, -1.7f, 2.5f, -0.5f, 0.99f, 250.9f}, {}, dev);
    CHECK(f.to(int32).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, -1, 2, 0, 0, 250});
    CHECK(f.to(int64).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, -1, 2, 0, 0, 250});
    CHECK(f.to(float16).to(int32).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, -1, 2, 0, 0, 250});
    CHECK(Tensor::from_vector({0.5, 3.99, 255.5}, {}, dev).to(uint8).to_vector<int>() ==
          std::vector<int>{0, 3, 255});
    // Anything -> bool is x != 0 (no truncation first: 0.5 is true).
    CHECK(Tensor::from_vector({0.f, 0.5f, -3.f, -0.f, 1e-30f}, {}, dev).to(bool_).to_vector<bool>() ==
          std::vector<bool>{false, true, true, false, true});
    CHECK(Tensor::from_vector({std::int32_t{0}, std::int32_t{-4}}, {}, dev).to(bool_).to_vector<bool>() ==
          std::vector<bool>{false, true});
    CHECK(Tensor::from_vector({true, false}, {}, dev).to(float16).to_vector<float>() == std::vector<float>{1, 0});
    // Integers that float32 cannot hold round to nearest.
    CHECK(Tensor::from_vector({std::int64_t{16777217}}, {}, dev).to(float32).item() == 16777216.0);
  });
}

TEST_CASE("to(device) returns the same handle when already there; copy() is deep") {
  for_each_device([](Device dev) {
    Tensor x = Tensor::from_vector({1.f, 2.f, 3.f, 4.f}, {2, 2}, dev);
    CHECK(x.to(dev).impl() == x.impl());
    Tensor h = x.to(Device::cpu());
    CHECK(h.device() == Device::cpu());
    CHECK(h.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
    if (dev.is_cpu()) CHECK(h.impl() == x.impl());
    CHECK(h.to(dev).to_vector<float>() == x.to_vector<float>());

    Tensor c = x.copy();
    CHECK(c.impl() != x.impl());
    CHECK(c.data_ptr() != x.data_ptr());
    CHECK(c.shape() == x.shape());
    CHECK(c.dtype() == x.dtype());
    CHECK(c.device() == x.device());
    CHECK(c.to_vector<float>() == x.to_vector<float>());
    c.assign(Tensor::zeros({2, 2}, float32, dev));
    CHECK(x.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
    x.assign(Tensor::full({2, 2}, 9.0, float32, dev));
    CHECK(c.to_vector<float>() == std::vector<float>(4, 0.f));
    // A copy of a slice holds only the slice.
    Tensor rows = Tensor::arange(0, 6, 1, float32, dev).reshape({3, 2}).slice(1, 2).copy();
    CHECK(rows.to_vector<float>() == std::vector<float>{2, 3});
    // assign converts dtypes and checks shapes.
    Tensor d = Tensor::zeros({2, 2}, float64, dev);
    d.assign(Tensor::from_vector({0.5f, 1.5f, 2.5f, 3.5f}, {2, 2}, dev));
    CHECK(d.to_vector<double>() == std::vector<double>{0.5, 1.5, 2.5, 3.5});
    CHECK_THROWS_AS(d.assign(Tensor::zeros({4}, float64, dev)), Error);
  });
}

TEST_CASE("item() reads the single element of any one-element tensor") {
  CHECK(Tensor::scalar(-3.25).item() == -3.25);
  CHECK(Tensor::from_vector({7.5}, {1, 1, 1}).item() == 7.5);
  CHECK(Tensor::from_vector({std::int64_t{-9}}).item() == -9.0);
  CHECK(Tensor::from_vector({true}).item() == 1.0);
  CHECK(Tensor::full({1}, 0.1, bfloat16).item() == 0.10009765625);  // 0x3dcd
  CHECK_THROWS_AS(Tensor::zeros({2}).item(), Error);
  CHECK_THROWS_AS(Tensor::zeros({0}).item(), Error);
}

// ---- printing -------------------------------------------------------------------------------

TEST_CASE("printing shows values, shape and dtype, abbreviating large tensors") {
  Tensor x = Tensor::from_vector({1.f, 2.5f, -3.f, 4.f, 5.f, 6.f}, {2, 3});
  std::ostringstream os;
  os << x;
  const std::string s = os.str();
  CHECK(s == x.str());
  CHECK(contains(s, "shape=(2, 3)"));
  CHECK(contains(s, "dtype=float32"));
  for (const char* v : {"1", "2.5", "-3", "4", "5", "6"}) CHECK(contains(s, v));
  CHECK(s.find("2.5") < s.find("-3"));  // row-major order
  CHECK_FALSE(contains(s, "..."));
  CHECK_FALSE(contains(s, "device"));  // the CPU is not named

  const std::string b = x.to(bfloat16).str();
  CHECK(contains(b, "dtype=bfloat16"));
  CHECK(contains(b, "2.5"));
  CHECK(contains(b, "shape=(2, 3)"));
  CHECK(contains(Tensor::arange(0, 4, 1, int64).str(), "shape=(4,)"));
  CHECK(contains(Tensor::arange(0, 4, 1, int64).str(), "dtype=int64"));
  CHECK(contains(Tensor::scalar(0.75).str(), "0.75"));
  CHECK(contains(Tensor::scalar(0.75).str(), "shape=()"));

  // 1000 elements: the first and last three are shown, the middle is elided.
  const std::string big = Tensor::arange(0, 1000, 1, int32).str();
  CHECK(contains(big, "..."));
  CHECK(contains(big, "0, 1, 2"));
  CHECK(contains(big, "997, 998, 999"));
  CHECK_FALSE(contains(big, "500"));
  CHECK(big.size() < 200);
  const std::string big2 = Tensor::arange(0, 10000, 1, float32).reshape({100, 100}).str();
  CHECK(contains(big2, "..."));
  CHECK(contains(big2, "9999"));
  CHECK(contains(big2, "shape=(100, 100)"));
  CHECK(big2.size() < 1000);

  std::ostringstream d;
  d << bfloat16 << " " << Device::cpu();
  CHECK(d.str() == "bfloat16 cpu");
  CHECK(Tensor().str() == "Tensor(undefined)");
}

// ---- xtensor views --------------------------------------------------------------------------

TEST_CASE("as_xtensor reads and writes the tensor's memory") {
  Tensor t = Tensor::from_vector({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  auto v = as_xtensor<float>(t);
  CHECK(v.shape().size() == 2);
  CHECK(v.shape()[0] == 2);
  CHECK(v.shape()[1] == 3);
  CHECK(v(0, 0) == 1.f);
  CHECK(v(1, 0) == 4.f);
  CHECK(v(1, 2) == 6.f);
  CHECK(v.data() == t.data<float>());
  v(0, 1) = -10.f;
  CHECK(t.to_vector<float>() == std::vector<float>{1, -10, 3, 4, 5, 6});
  t.assign(Tensor::full({2, 3}, 2.0));
  CHECK(v(1, 1) == 2.f);
  // A view of a row slice sees the slice's rows.
  Tensor m = Tensor::arange(0, 6, 1, int64).reshape({3, 2});
  auto sv = as_xtensor<std::int64_t>(m.slice(1, 3));
  CHECK(sv(0, 0) == 2);
  CHECK(sv(1, 1) == 5);
  sv(1, 0) = 40;
  CHECK(m.to_vector<std::int64_t>()[4] == 40);
  // The element type must match.
  CHECK_THROWS_AS(as_xtensor<double>(t), Error);
}

// ---- dtypes and devices ---------------------------------------------------------------------

TEST_CASE("dtype names round trip and unknown names list the valid ones") {
  const std::vector<std::pair<DType, std::string>> names{
      {float32, "float32"}, {float64, "float64"}, {float16, "float16"}, {bfloat16, "bfloat16"},
      {int32, "int32"},     {int64, "int64"},     {uint8, "uint8"},     {bool_, "bool"}};
  const std::vector<std::size_t> sizes{4, 8, 2, 2, 4, 8, 1, 1};
  for (std::size_t i = 0; i < names.size(); ++i) {
    const DType d = names[i].first;
    const std::string& name = names[i].second;  // not a structured binding: CAPTURE captures it
    CAPTURE(name);
    CHECK(to_string(d) == name);
    CHECK(dtype_from_string(name) == d);
    CHECK(itemsize(d) == sizes[i]);
    CHECK(is_floating(d) == (i < 4));
    CHECK(is_integer(d) == (i >= 4));
    CHECK(is_half(d) == (d == float16 || d == bfloat16));
  }
  CHECK_THROWS_AS(dtype_from_string("float8"), Error);
  CHECK_THROWS_AS(dtype_from_string("Float32"), Error);
  CHECK_THROWS_AS(dtype_from_string(""), Error);
  const std::string msg = error_of([] { dtype_from_string("half"); });
  CHECK(contains(msg, "'half'"));
  for (const auto& [d, name] : names) CHECK(contains(msg, name));
}

TEST_CASE("devices: names, default device") {
  CHECK(Device::cpu().str() == "cpu");
  CHECK(Device::cuda(1).str() == "cuda:1");
  CHECK(Device::cuda().str() == "cuda:0");
  CHECK(Device::cpu().is_cpu());
  CHECK(Device::cuda(1).is_cuda());
  CHECK(Device::cuda(1) != Device::cuda(0));
  CHECK(is_available(Device::cpu()));
  if (std::getenv("MPT_DEVICE") == nullptr) {
    const Device expected = is_available(Device::cuda(0)) ? Device::cuda(0) : Device::cpu();
    CHECK(mpt::test::automatic_default_device() == expected);
  }
  if (cuda::device_count() == 0) CHECK(mpt::test::automatic_default_device() == Device::cpu());
  // Device::parse reads what str() writes, strictly, and quotes what it refuses.
  for (const Device d : {Device::cpu(), Device::test(), Device::cuda(0), Device::cuda(7), Device::cuda(2147483647)})
    CHECK(Device::parse(d.str()) == d);
  CHECK(Device::parse("cuda") == Device::cuda(0));
  for (const char* bad : {"cuda:99999999999999999999", "cuda:2147483648", "cuda:-1", "cuda:0abc", "cuda:", "cuda: 1",
                          "cuda:+1", "CPU", "gpu", "", "cuda:1 "}) {
    const std::string e = test::error_of([&] { Device::parse(bad); });
    CHECK_MESSAGE(test::contains(e, std::string("got '") + bad + "'"), bad, " -> ", e);
    CHECK(test::contains(e, "expected cpu, cuda or cuda:N"));
  }
  // The test main pins the CPU whatever the machine has: tests name their devices.
  CHECK(default_device() == Device::cpu());
  CHECK(Tensor::zeros({2}).device() == Device::cpu());
}

// ---- allocator statistics -------------------------------------------------------------------

TEST_CASE("memory_stats track live, peak and cached bytes") {
  for_each_device([](Device dev) {
    constexpr std::size_t kMiB = 1 << 20;
    const MemoryStats s0 = memory_stats(dev);
    reset_peak_memory(dev);
    CHECK(memory_stats(dev).peak_bytes == s0.current_bytes);

    MemoryStats s1;
    {
      Tensor t = Tensor::empty({static_cast<std::int64_t>(kMiB / 4)}, float32, dev);
      s1 = memory_stats(dev);
      CHECK(s1.current_bytes == s0.current_bytes + kMiB);
      CHECK(s1.peak_bytes == s0.current_bytes + kMiB);
      CHECK(s1.allocations == s0.allocations + 1);
    }
    const MemoryStats s2 = memory_stats(dev);
    CHECK(s2.current_bytes == s0.current_bytes);
    CHECK(s2.peak_bytes == s1.peak_bytes);  // the peak stays until reset
    CHECK(s2.cached_bytes == s1.cached_bytes + kMiB);

    {
      Tensor again = Tensor::empty({256, 256, 4}, float32, dev);  // the same 1 MiB
      const MemoryStats s3 = memory_stats(dev);
      CHECK(s3.cache_hits == s2.cache_hits + 1);
      CHECK(s3.allocations == s2.allocations + 1);
      CHECK(s3.cached_bytes == s2.cached_bytes - kMiB);
      CHECK(s3.current_bytes == s0.current_bytes + kMiB);
      reset_peak_memory(dev);
      CHECK(memory_stats(dev).peak_bytes == s3.current_bytes);
    }
    CHECK(memory_stats(dev).peak_bytes == s0.current_bytes + kMiB);

    empty_cache(dev);
    const MemoryStats s4 = memory_stats(dev);
    CHECK(s4.cached_bytes == 0);
    CHECK(s4.current_bytes == s0.current_bytes);
    {
      Tensor fresh = Tensor::empty({static_cast<std::int64_t>(kMiB / 4)}, float32, dev);
      CHECK(memory_stats(dev).cache_hits == s4.cache_hits);  // nothing cached to hit
    }
    // Views do not allocate.
    Tensor base = Tensor::zeros({64, 64}, float32, dev);
    const std::size_t before = memory_stats(dev).allocations;
    Tensor view = base.reshape({-1}).slice(0, 100);
    CHECK(memory_stats(dev).allocations == before);
    empty_cache(dev);
  });
}

// ---- threads --------------------------------------------------------------------------------

TEST_CASE("set_num_threads / num_threads") {
  const int n0 = num_threads();
  CHECK(n0 >= 1);
  set_num_threads(1);
  CHECK(num_threads() == 1);
  set_num_threads(3);
  CHECK(num_threads() == 3);
  // Kernels still give the same answers with another thread count.
  Tensor x = Tensor::arange(0, 100000, 1, float64);
  CHECK(ops::sum(x).item() == 99999.0 * 100000.0 / 2);
  CHECK_THROWS_AS(set_num_threads(0), Error);
  CHECK_THROWS_AS(set_num_threads(-2), Error);
  CHECK(contains(error_of([] { set_num_threads(0); }), "set_num_threads"));
  CHECK(num_threads() == 3);  // a rejected call changes nothing
  set_num_threads(n0);
  CHECK(num_threads() == n0);
}

TEST_CASE("shapes whose element or byte counts overflow are errors, not crashes or wrapped sizes") {
  // Each of these crashed or was accepted with a wrapped element count before (issue 14, defects 1-2).
  const std::int64_t big = std::int64_t{1} << 62;
  for_each_device([&](Device dev) {
    CHECK(contains(error_of([&] { Tensor::zeros({big}, float32, dev); }), "2^63 bytes"));
    CHECK(contains(error_of([&] { Tensor::ones({big / 2}, float64, dev); }), "2^63 bytes"));
    CHECK(contains(error_of([&] { Tensor::zeros({INT64_MAX, 2}, float32, dev); }), "more than 2^63 elements"));
    CHECK(contains(error_of([&] { Tensor::from_vector(std::vector<float>(1000, 1.f), {big + 250, 4}, dev); }),
                   "more than 2^63 elements"));
    CHECK(contains(error_of([&] { Tensor::from_vector(std::vector<float>{}, {big, 4}, dev); }), "more than 2^63"));
    Tensor t = Tensor::zeros({4, 4}, float32, dev);
    CHECK(contains(error_of([&] { t.reshape({big, 4, 4, -1}); }), "more than 2^63 elements"));
    CHECK(contains(error_of([&] { t.reshape({big + 1, 4}); }), "more than 2^63 elements"));
    CHECK(numel_of({0, big, big}) == 0);
    CHECK(numel_of({big, big, 0}) == 0);
  });
}
