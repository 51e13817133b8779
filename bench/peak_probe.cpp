// This CPU's peak arithmetic on T threads, and how much of it model D's bfloat16 GEMMs reach:
//   - float32 FMA (AVX-512 zmm, else AVX2 ymm): 12 independent accumulator chains per thread
//   - bfloat16 dot products (vdpbf16ps, AVX512-BF16): 12 chains
//   - AMX bfloat16 tiles (tdpbf16ps), where the CPU has AMX and MPT_ONEDNN_AMX is not 0: 4 tiles
//   - model D's bfloat16 GEMMs (bench_models.hpp; batch 512: the forward products, and for each
//     layer dW = X^T dY and, but for the first, dX = dY W^T) through mpt::ops::matmul, timed
//     best of several repeats, as GFLOP/s and as a fraction of the bfloat16 peak (AMX's where
//     used, else vdpbf16ps's)
//
//   peak_probe [--threads T]        (default: mpt::num_threads())
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "bench_models.hpp"

namespace {

bool cpuid_bit(unsigned leaf, unsigned sub, int reg, int bit) {
  unsigned r[4] = {};
  if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) return false;
  return (r[reg] >> bit) & 1u;
}
bool has_avx512() { return __builtin_cpu_supports("avx512f"); }
bool has_avx512_bf16() { return has_avx512() && cpuid_bit(7, 1, 0, 5); }  // CPUID.(7,1):EAX[5]
bool has_amx_bf16() { return cpuid_bit(7, 0, 3, 22) && cpuid_bit(7, 0, 3, 24); }  // EDX: AMX-BF16, AMX-TILE

float sink = 0;  // keeps the loops' results alive

__attribute__((target("avx512f"))) double fma_avx512(std::int64_t iters) {
  __m512 c[12];
  for (auto& v : c) v = _mm512_set1_ps(0.5f);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (std::int64_t i = 0; i < iters; ++i)
    for (auto& v : c) v = _mm512_fmadd_ps(v, a, b);
  __m512 s = c[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, c[k]);
  sink += _mm512_reduce_add_ps(s);
  return static_cast<double>(iters) * 12 * 16 * 2;
}

__attribute__((target("avx2,fma"))) double fma_avx2(std::int64_t iters) {
  __m256 c[12];
  for (auto& v : c) v = _mm256_set1_ps(0.5f);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (std::int64_t i = 0; i < iters; ++i)
    for (auto& v : c) v = _mm256_fmadd_ps(v, a, b);
  alignas(32) float out[8];
  __m256 s = c[0];
  for (int k = 1; k < 12; ++k) s = _mm256_add_ps(s, c[k]);
  _mm256_store_ps(out, s);
  sink += out[0];
  return static_cast<double>(iters) * 12 * 8 * 2;
}

__attribute__((target("avx512f,avx512bf16"))) double dpbf16(std::int64_t iters) {
  __m512 c[12];
  for (auto& v : c) v = _mm512_setzero_ps();
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.001f), _mm512_set1_ps(0.002f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.003f), _mm512_set1_ps(0.004f));
  for (std::int64_t i = 0; i < iters; ++i)
    for (auto& v : c) v = _mm512_dpbf16_ps(v, a, b);
  __m512 s = c[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, c[k]);
  sink += _mm512_reduce_add_ps(s);
  return static_cast<double>(iters) * 12 * 32 * 2;  // 16 lanes x 2 bf16 pairs, multiply + add
}

struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-bf16"))) double amx_bf16(std::int64_t iters) {
  TileConfig cfg;
  for (int t = 0; t < 6; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;  // 16x16 float / 16x32 bf16
  _tile_loadconfig(&cfg);
  alignas(64) static thread_local std::uint16_t ab[16 * 32];
  for (auto& v : ab) v = 0x3c00;  // bfloat16 0.0078125
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  for (std::int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  alignas(64) static thread_local float c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  sink += c[0];
  return static_cast<double>(iters) * 4 * 16 * 16 * 32 * 2;
}

/// GFLOP/s of `kernel` run on `threads` threads at once, best of 5.
double gflops(int threads, const std::function<double(std::int64_t)>& kernel, std::int64_t iters) {
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> flops(static_cast<std::size_t>(threads));
    const double t0 = bench::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { flops[static_cast<std::size_t>(t)] = kernel(iters); });
    for (auto& th : pool) th.join();
    const double s = bench::now() - t0;
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / s / 1e9);
  }
  return best;
}

bool amx_permitted() {
  constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;  // Linux arch_prctl
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
}

/// Model D's bfloat16 GEMMs through mpt::ops::matmul: GFLOP/s over the step's products.
double model_d_gemms() {
  using mpt::Tensor;
  const std::int64_t m = bench::batch_size("D");
  const std::vector<std::pair<std::int64_t, std::int64_t>> layers{{1024, 2048}, {2048, 2048}, {2048, 2048}, {2048, 10}};
  struct Product {
    Tensor a, b;
    bool ta, tb;
    double flops;
  };
  std::vector<Product> products;
  auto rnd = [](std::int64_t r, std::int64_t c, std::uint64_t seed) {
    return Tensor::random_uniform({r, c}, -1, 1, seed, mpt::bfloat16, mpt::Device::cpu());
  };
  std::uint64_t seed = 1;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const auto [k, n] = layers[l];
    Tensor x = rnd(m, k, seed++), w = rnd(k, n, seed++), dy = rnd(m, n, seed++);
    const double f = 2.0 * static_cast<double>(m * k * n);
    products.push_back({x, w, false, false, f});   // forward: x w
    products.push_back({x, dy, true, false, f});   // dW = x^T dy
    if (l > 0) products.push_back({dy, w, false, true, f});  // dX = dy w^T
  }
  double seconds = 0, flops = 0;
  for (const auto& p : products) {
    double best = 1e30;
    for (int rep = 0; rep < 12; ++rep) {
      const double t0 = bench::now();
      Tensor c = mpt::ops::matmul(p.a, p.b, p.ta, p.tb);
      (void)c.data_ptr();
      best = std::min(best, bench::now() - t0);
    }
    seconds += best;
    flops += p.flops;
  }
  return flops / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = mpt::num_threads();
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  if (threads < 1 || (argc - 1) % 2 != 0) {
    std::fprintf(stderr, "usage: peak_probe [--threads T]\n");
    return 2;
  }
  mpt::set_num_threads(threads);
  const std::int64_t iters = 20'000'000;
  const double fp32 = has_avx512() ? gflops(threads, fma_avx512, iters) : gflops(threads, fma_avx2, iters);
  std::printf("{\"probe\": \"fma_fp32\", \"isa\": \"%s\", \"threads\": %d, \"gflops\": %.1f}\n",
              has_avx512() ? "avx512" : "avx2", threads, fp32);
  double bf16_peak = 0;
  std::string bf16_isa = "none";
  if (has_avx512_bf16()) {
    bf16_peak = gflops(threads, dpbf16, iters);
    bf16_isa = "vdpbf16ps";
    std::printf("{\"probe\": \"vdpbf16ps\", \"threads\": %d, \"gflops\": %.1f}\n", threads, bf16_peak);
  }
  const char* amx_env = std::getenv("MPT_ONEDNN_AMX");
  const bool amx = has_amx_bf16() && !(amx_env && std::string(amx_env) == "0");
  if (amx && amx_permitted()) {
    const double amx_peak = gflops(threads, [](std::int64_t n) {
      amx_permitted();  // per thread
      return amx_bf16(n);
    }, iters / 20);
    std::printf("{\"probe\": \"amx_bf16\", \"threads\": %d, \"gflops\": %.1f}\n", threads, amx_peak);
    bf16_peak = amx_peak, bf16_isa = "amx";
  }
  const double d = model_d_gemms();
  std::printf("{\"probe\": \"model_d_bf16_gemms\", \"threads\": %d, \"gflops\": %.1f, \"peak\": \"%s\", "
              "\"fraction_of_peak\": %.3f}\n",
              threads, d, bf16_isa.c_str(), bf16_peak > 0 ? d / bf16_peak : 0.0);
  return sink == 12345.0f ? 1 : 0;
}
