// Bulk float16/bfloat16 conversion throughput: the run-time selected vectorised path against the
// portable loop and against a plain _Float16 cast loop, all measured in the same run.
//   bench_convert [elements]     (default 16M)
#include "mpt/half.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using u16 = std::uint16_t;

#ifdef __FLT16_MAX__
// With the default flags GCC 12 turns each cast into a libgcc call (__truncsfhf2 / __extendhfsf2).
__attribute__((noinline)) void cast_f2h(const float* s, u16* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const auto h = static_cast<_Float16>(s[i]);
    std::memcpy(d + i, &h, sizeof h);
  }
}
__attribute__((noinline)) void cast_h2f(const u16* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    _Float16 h;
    std::memcpy(&h, s + i, sizeof h);
    d[i] = static_cast<float>(h);
  }
}
#if defined(__x86_64__) || defined(__i386__)
#define MPT_BENCH_F16C_CAST 1
// The same loops where the compiler may use F16C: GCC 12 emits one scalar VCVTPS2PH per element.
__attribute__((noinline, target("avx2,f16c"))) void cast_f2h_f16c(const float* s, u16* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const auto h = static_cast<_Float16>(s[i]);
    std::memcpy(d + i, &h, sizeof h);
  }
}
__attribute__((noinline, target("avx2,f16c"))) void cast_h2f_f16c(const u16* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    _Float16 h;
    std::memcpy(&h, s + i, sizeof h);
    d[i] = static_cast<float>(h);
  }
}
#endif
#endif

struct Variant {
  std::string name;
  const char* isa;  // for the library paths; nullptr for the cast loops
  std::function<void()> run;
};

struct Result {
  std::string name;
  double seconds;
};

std::size_t g_elements = 0;

void report(const char* what, std::size_t bytes_per_elem, const std::vector<Result>& rs) {
  std::printf("\n%s\n", what);
  for (const Result& r : rs)
    std::printf("  %-26s %8.2f ms %9.0f Melem/s %7.2f GB/s   x%.2f vs portable\n", r.name.c_str(), r.seconds * 1e3,
                g_elements / r.seconds / 1e6, g_elements * bytes_per_elem / r.seconds / 1e9,
                rs[1].seconds / r.seconds);
  for (std::size_t i = 2; i < rs.size(); ++i)
    std::printf("  speed-up %s over %s: x%.2f\n", rs[0].name.c_str(), rs[i].name.c_str(), rs[i].seconds / rs[0].seconds);
}

// Variants run round-robin and each keeps its best time, so load from other processes on the
// machine hits them alike; the first round is a warm-up (page faults, frequency ramp).
std::vector<Result> measure(const std::vector<Variant>& vs, int rounds = 12) {
  std::vector<Result> rs;
  std::vector<const Variant*> runnable;
  for (const Variant& v : vs) {
    if (v.isa != nullptr && !mpt::force_conversion_isa(v.isa)) continue;
    runnable.push_back(&v);
    rs.push_back({v.name, 1e30});
  }
  for (int round = 0; round <= rounds; ++round) {
    for (std::size_t k = 0; k < runnable.size(); ++k) {
      const std::size_t i = (k + round) % runnable.size();  // rotate: no variant always follows the same one
      if (runnable[i]->isa != nullptr) mpt::force_conversion_isa(runnable[i]->isa);
      const auto t0 = std::chrono::steady_clock::now();
      runnable[i]->run();
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (round > 0) rs[i].seconds = std::min(rs[i].seconds, t);
      mpt::force_conversion_isa(nullptr);
    }
  }
  return rs;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{1} << 24;
  g_elements = n;
  const std::string best = mpt::conversion_isa();
  std::printf("bulk conversions, %zu elements; run-time selected path: %s\n", n, best.c_str());

  // Activations-like values: mostly moderate magnitudes, some tiny ones that land in subnormals.
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> src(n), back(n);
  std::vector<u16> bits(n), hsrc(n), bsrc(n);
  for (std::size_t i = 0; i < n; ++i) src[i] = (i % 64 == 0) ? dist(rng) * 1e-6f : dist(rng);
  mpt::float_to_half(src.data(), hsrc.data(), n);
  mpt::float_to_bfloat16(src.data(), bsrc.data(), n);

  const std::string vec = "vectorised (" + best + ")";
  const bool has_f16c_path = best == "avx512";  // then the F16C/AVX2 path is measured too

  std::vector<Variant> f2h{{vec, best.c_str(), [&] { mpt::float_to_half(src.data(), bits.data(), n); }},
                           {"portable", "portable", [&] { mpt::float_to_half(src.data(), bits.data(), n); }}};
  std::vector<Variant> h2f{{vec, best.c_str(), [&] { mpt::half_to_float(hsrc.data(), back.data(), n); }},
                           {"portable", "portable", [&] { mpt::half_to_float(hsrc.data(), back.data(), n); }}};
  std::vector<Variant> f2b{{vec, best.c_str(), [&] { mpt::float_to_bfloat16(src.data(), bits.data(), n); }},
                           {"portable", "portable", [&] { mpt::float_to_bfloat16(src.data(), bits.data(), n); }}};
  std::vector<Variant> b2f{{vec, best.c_str(), [&] { mpt::bfloat16_to_float(bsrc.data(), back.data(), n); }},
                           {"portable", "portable", [&] { mpt::bfloat16_to_float(bsrc.data(), back.data(), n); }}};
  if (has_f16c_path) {
    f2h.push_back({"vectorised (f16c)", "f16c", [&] { mpt::float_to_half(src.data(), bits.data(), n); }});
    h2f.push_back({"vectorised (f16c)", "f16c", [&] { mpt::half_to_float(hsrc.data(), back.data(), n); }});
    f2b.push_back({"vectorised (avx2)", "f16c", [&] { mpt::float_to_bfloat16(src.data(), bits.data(), n); }});
    b2f.push_back({"vectorised (avx2)", "f16c", [&] { mpt::bfloat16_to_float(bsrc.data(), back.data(), n); }});
  }
#ifdef __FLT16_MAX__
  f2h.push_back({"(_Float16) cast", nullptr, [&] { cast_f2h(src.data(), bits.data(), n); }});
  h2f.push_back({"(_Float16) cast", nullptr, [&] { cast_h2f(hsrc.data(), back.data(), n); }});
#ifdef MPT_BENCH_F16C_CAST
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
    f2h.push_back({"(_Float16) cast, f16c", nullptr, [&] { cast_f2h_f16c(src.data(), bits.data(), n); }});
    h2f.push_back({"(_Float16) cast, f16c", nullptr, [&] { cast_h2f_f16c(hsrc.data(), back.data(), n); }});
  }
#endif
#else
  std::printf("(_Float16 is not available with this compiler: no cast baseline)\n");
#endif

  report("float -> float16 (6 bytes/elem)", 6, measure(f2h));
  report("float16 -> float (6 bytes/elem)", 6, measure(h2f));
  report("float -> bfloat16 (6 bytes/elem)", 6, measure(f2b));
  report("bfloat16 -> float (6 bytes/elem)", 6, measure(b2f));

  // The paths must agree; a fast wrong answer is no result.
  std::vector<u16> a(n), b(n);
  mpt::float_to_half(src.data(), a.data(), n);
  mpt::force_portable_conversions(true);
  mpt::float_to_half(src.data(), b.data(), n);
  mpt::force_portable_conversions(false);
  const bool same = a == b;
#ifdef __FLT16_MAX__
  cast_f2h(src.data(), b.data(), n);
  std::printf("\ncheck: vectorised == portable: %s, == (_Float16) cast: %s\n", same ? "yes" : "NO",
              a == b ? "yes" : "NO");
#else
  std::printf("\ncheck: vectorised == portable: %s\n", same ? "yes" : "NO");
#endif
  return same ? 0 : 1;
}
