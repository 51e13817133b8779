// The counter-based generator every backend shares (src/backend/common/philox.hpp). The CPU and
// CUDA backends run the same bodies, so the checks here are: the Philox block is Random123's
// (known-answer vectors), the hand-written log/cos are accurate (they replace library calls that
// differ between glibc and CUDA), the uniform/normal draws have the right moments, and a draw
// depends on (seed, offset, i) alone. A few draws are pinned to the bit, so a change to the
// stream (or to how a compiler's flags treat it) shows up here; a CUDA test can compare to them.
#include "backend/common/philox.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <utility>
#include <vector>

namespace {

using namespace mpt::kernels;

void check_block(const Philox4& got, std::uint32_t a, std::uint32_t b, std::uint32_t c, std::uint32_t d) {
  CHECK(got.v[0] == a);
  CHECK(got.v[1] == b);
  CHECK(got.v[2] == c);
  CHECK(got.v[3] == d);
}

// |got - want| in units of the last place of want.
double ulps(double got, double want) {
  if (got == want) return 0;
  const double a = std::fabs(want);
  return std::fabs(got - want) / (std::nextafter(a, INFINITY) - a);
}

constexpr long double two_pi = 6.283185307179586476925286766559005768L;
constexpr int n_draws = 1'000'000;

}  // namespace

TEST_CASE("philox4x32_10 matches Random123's known-answer vectors") {
  check_block(philox4x32_10(0, 0, 0, 0, 0, 0), 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8);
  const std::uint32_t f = 0xffffffff;
  check_block(philox4x32_10(f, f, f, f, f, f), 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd);
  check_block(philox4x32_10(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0),
              0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1);
}

TEST_CASE("philox_at lays out counter (i, offset) and key seed, low words first") {
  const std::uint64_t seed = 0x0123456789abcdefull, offset = 0xfedcba9876543210ull, i = 0x0000001234567890ull;
  const Philox4 want = philox4x32_10(0x34567890, 0x12, 0x76543210, 0xfedcba98, 0x89abcdef, 0x01234567);
  check_block(philox_at(seed, offset, i), want.v[0], want.v[1], want.v[2], want.v[3]);
}

TEST_CASE("det_log is within 2 ulp of std::log on (0, 1]") {
  std::vector<double> xs = {1.0, 0x1p-53, 0x1p-1022, 0.5, 0.25, 0.1, std::sqrt(0.5), 1 - 0x1p-53, 0.999999};
  for (double c : {1.0, 0.5, std::sqrt(0.5), 0x1p-53}) {  // neighbours of the reduction boundaries
    double lo = c, hi = c;
    for (int k = 0; k < 64; ++k) {
      xs.push_back(lo = std::nextafter(lo, 0.0));
      if ((hi = std::nextafter(hi, 2.0)) <= 1.0) xs.push_back(hi);
    }
  }
  std::mt19937_64 gen(1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int k = 0; k < 200'000; ++k) {
    xs.push_back(std::ldexp(0.5 + 0.5 * unit(gen), -static_cast<int>(gen() % 1022)));  // every exponent
    xs.push_back(std::nextafter(unit(gen), 1.0));
  }
  double worst = 0;
  for (double x : xs) worst = std::fmax(worst, ulps(det_log(x), std::log(x)));
  CHECK(worst <= 2.0);
  CHECK(det_log(1.0) == 0.0);
}

TEST_CASE("det_cos_2pi is within 1e-15 of cos(2 pi u) on [0, 1)") {
  std::vector<double> us;
  for (double c : {0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0}) {
    double lo = c, hi = c;
    if (c < 1.0) us.push_back(c);
    for (int k = 0; k < 64; ++k) {
      if ((lo = std::nextafter(lo, 0.0)) >= 0.0) us.push_back(lo);
      if ((hi = std::nextafter(hi, 1.0)) < 1.0) us.push_back(hi);
    }
  }
  std::mt19937_64 gen(2);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int k = 0; k < 400'000; ++k) us.push_back(unit(gen));
  double worst = 0;
  for (double u : us) {
    const long double want = std::cos(two_pi * u);  // long double reference
    worst = std::fmax(worst, static_cast<double>(std::fabs(det_cos_2pi(u) - want)));
  }
  CHECK(worst <= 1e-15);
  CHECK(det_cos_2pi(0.0) == 1.0);
  CHECK(det_cos_2pi(0.5) == -1.0);
  CHECK(det_cos_2pi(0.25) == 0.0);
}

TEST_CASE("uniform_at is in (0, 1) with the moments of U(0, 1)") {
  CHECK(uniform_from_words(0, 0) == 0x1p-54);
  CHECK(uniform_from_words(0xffffffff, 0xffffffff) == 1 - 0x1p-53);  // not rounded up to 1
  double sum = 0, sum_sq = 0;
  bool inside = true;
  for (int i = 0; i < n_draws; ++i) {
    const double u = uniform_at(42, 7, i);
    inside = inside && u > 0.0 && u < 1.0;
    sum += u;
    sum_sq += (u - 0.5) * (u - 0.5);
  }
  CHECK(inside);
  const double n = n_draws;
  CHECK(std::fabs(sum / n - 0.5) < 5 * std::sqrt(1.0 / 12 / n));
  CHECK(std::fabs(sum_sq / n - 1.0 / 12) < 5 * std::sqrt(1.0 / 180 / n));  // Var((U - 1/2)^2) = 1/180
}

TEST_CASE("a draw depends on (seed, offset, i) only") {
  const std::uint64_t big = std::uint64_t{1} << 32;  // high words count too
  const std::pair<std::uint64_t, std::uint64_t> others[] = {{43, 7}, {42, 8}, {42 + big, 7}, {42, 7 + big}};
  for (const auto& [seed, offset] : others) {
    int same = 0;
    for (int i = 0; i < 256; ++i) same += uniform_at(seed, offset, i) == uniform_at(42, 7, i);
    CHECK(same == 0);
  }
  CHECK(uniform_at(42, 7, 5) != uniform_at(42, 7, 5 + big));
  // Any visiting order (any thread layout) gives the same values.
  std::vector<double> forward(1000), backward(1000);
  for (int i = 0; i < 1000; ++i) forward[i] = normal_at(9, 3, 1000 + i);
  for (int i = 999; i >= 0; --i) backward[i] = normal_at(9, 3, 1000 + i);
  CHECK(forward == backward);
}

TEST_CASE("normal_at has the moments and tails of N(0, 1)") {
  double sum = 0, sum_sq = 0;
  int beyond_2 = 0;
  for (int i = 0; i < n_draws; ++i) {
    const double z = normal_at(1234, 0, i);
    sum += z;
    sum_sq += z * z;
    beyond_2 += std::fabs(z) > 2.0;
  }
  const double n = n_draws, p = 0.04550026389635842;  // P(|Z| > 2)
  CHECK(std::fabs(sum / n) < 5 * std::sqrt(1.0 / n));
  CHECK(std::fabs(sum_sq / n - 1.0) < 5 * std::sqrt(2.0 / n));  // Var(Z^2) = 2
  CHECK(std::fabs(beyond_2 / n - p) < 5 * std::sqrt(p * (1 - p) / n));
}

TEST_CASE("the stream is pinned to the bit") {
  CHECK(uniform_at(2024, 5, 0) == 0x1.485c6a9dc7e3dp-2);
  CHECK(normal_at(2024, 5, 0) == 0x1.7f6ecac0c0e2cp+0);
  CHECK(uniform_at(2024, 5, 123456789) == 0x1.39a5815a0c532p-1);
  CHECK(normal_at(2024, 5, 123456789) == -0x1.15b62fd406ab9p-1);
  CHECK(normal_at(2024, 5, std::uint64_t{1} << 40) == -0x1.e8fc650c7ac65p-2);
}
