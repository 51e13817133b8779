// Square GEMM throughput of mpt::ops::matmul (float32, bfloat16, float16) against the raw
// oneDNN matmul primitive (float32, bfloat16) measured in the same run, at 1 and 2 threads.
//   bench_gemm [--quick]      (--quick: sizes 256 and 1024 only, fewer/shorter batches)
//
// Method: tensors and raw primitives are created once per (size, threads); each variant gets
// warm-up calls, then k timed batches (each repeats the call until it has run >= the batch
// time or hit an iteration cap). mpt and oneDNN batches of one dtype alternate, so load from
// other processes hits both alike. Reported: the MEDIAN batch GFLOP/s (2*M*N*K / time).
// Every mpt and oneDNN result is checked once per (size, threads, dtype) against a float64
// dot product of the actual (rounded) inputs before anything is timed.
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "mpt/mpt.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<std::int64_t> sizes{256, 512, 1024, 2048};
  std::vector<int> threads{1, 2};
  int batches = 7;            // timed batches per variant (the median is reported)
  double batch_s = 0.08;      // minimum time of one batch (so >= batches*batch_s per variant)
  int max_iters = 10000;      // iteration cap of one batch
  int warmup = 2;             // untimed calls before the batches
};

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "n/a";
  return a + " " + b + " " + c;
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::all: return "all";
    default: return "other";
  }
}

/// One timed batch: runs fn until >= min_s elapsed or max_iters calls; returns seconds per call.
double time_batch(const std::function<void()>& fn, int iters_hint, double min_s, int max_iters) {
  int iters = 0;
  const auto t0 = Clock::now();
  double el = 0;
  do {
    for (int i = 0; i < iters_hint && iters < max_iters; ++i, ++iters) fn();
    el = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (el < min_s && iters < max_iters);
  return el / iters;
}

/// Iterations per inner loop chunk so that the clock is read rarely but batches do not overshoot.
int iters_hint_for(const std::function<void()>& fn, int warmup, double min_s) {
  double one = 1e30;
  for (int w = 0; w < std::max(1, warmup); ++w) {
    const auto t0 = Clock::now();
    fn();
    one = std::min(one, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return std::max(1, static_cast<int>(min_s / std::max(one, 1e-9) / 4));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- correctness ----------------------------------------------------------------------------

double out_eps(mpt::DType dt) {
  if (dt == mpt::bfloat16) return 1.0 / 256;   // 2^-8
  if (dt == mpt::float16) return 1.0 / 2048;   // 2^-11
  return 1.0 / 16777216;                       // 2^-24
}

/// c = a.b for n x n row-major matrices given as float values (the exact rounded inputs);
/// checks 16 sampled elements (corners included) against a float64 dot product.
void verify(const char* what, std::int64_t n, mpt::DType dt, const std::vector<float>& a,
            const std::vector<float>& b, const std::vector<float>& c) {
  std::vector<std::pair<std::int64_t, std::int64_t>> idx{{0, 0}, {0, n - 1}, {n - 1, 0}, {n - 1, n - 1}};
  std::uint64_t s = 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(n);
  while (idx.size() < 16) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    idx.emplace_back(static_cast<std::int64_t>(s % n), static_cast<std::int64_t>((s >> 32) % n));
  }
  for (auto [i, j] : idx) {
    double ref = 0, sumabs = 0;
    for (std::int64_t p = 0; p < n; ++p) {
      const double t = static_cast<double>(a[i * n + p]) * b[p * n + j];
      ref += t;
      sumabs += std::fabs(t);
    }
    const double got = c[i * n + j];
    const double tol = 2 * out_eps(dt) * std::fabs(ref) + 1e-4 * sumabs + 1e-6;
    if (!(std::fabs(got - ref) <= tol)) {
      std::fprintf(stderr,
                   "bench_gemm: WRONG RESULT from %s (%s, n=%lld, %d threads) at [%lld,%lld]: got %.8g, "
                   "float64 reference %.8g (tolerance %.3g)\n",
                   what, mpt::to_string(dt).c_str(), static_cast<long long>(n), omp_get_max_threads(),
                   static_cast<long long>(i), static_cast<long long>(j), got, ref, tol);
      std::exit(2);
    }
  }
}

// ---- raw oneDNN baseline --------------------------------------------------------------------

struct RawGemm {
  dnnl::matmul prim;
  std::unordered_map<int, dnnl::memory> args;
};

RawGemm make_raw(const dnnl::engine& eng, std::int64_t n, dnnl::memory::data_type t, void* a, void* b,
                 void* c) {
  using tag = dnnl::memory::format_tag;
  dnnl::memory::desc md({n, n}, t, tag::ab);  // plain row-major n x n
  RawGemm r;
  r.prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(md, md, md), eng));
  r.args = {{DNNL_ARG_SRC, dnnl::memory(md, eng, a)},
            {DNNL_ARG_WEIGHTS, dnnl::memory(md, eng, b)},
            {DNNL_ARG_DST, dnnl::memory(md, eng, c)}};
  return r;
}

struct Row {
  std::int64_t n;
  int threads;
  double mpt_f32, mpt_bf16, mpt_f16, dnnl_f32, dnnl_bf16;
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: %s [--quick]\n", argv[0]);
      return 0;
    } else {
      std::fprintf(stderr, "bench_gemm: unknown argument '%s' (usage: %s [--quick])\n", arg.c_str(), argv[0]);
      return 1;
    }
  }
  if (quick) {
    opt.sizes = {256, 1024};
    opt.batches = 5;
    opt.batch_s = 0.04;
    opt.warmup = 1;
  }

  // One tiny mpt matmul first: mpt's engine initialisation decides the ISA (AMX where its
  // tile-config workaround applies, else capped at avx512_core_bf16; ONEDNN_MAX_CPU_ISA wins),
  // and that choice then holds for the raw primitives too (printed as "effective ISA").
  {
    auto x = mpt::Tensor::ones({4, 4});
    (void)mpt::ops::matmul(x, x);
  }
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const dnnl_version_t* v = dnnl_version();

  std::printf("bench_gemm: C = A.B, square n x n, row-major; GFLOP/s = 2n^3/time\n");
  std::printf("oneDNN %d.%d.%d (cpu runtime %s), effective ISA %s; %d hardware threads; %s\n", v->major,
              v->minor, v->patch, v->cpu_runtime == DNNL_RUNTIME_OMP ? "OMP" : "other",
              isa_name(dnnl::get_effective_cpu_isa()), omp_get_num_procs(), quick ? "--quick" : "default run");
  std::printf("timing: %d warm-up calls, then %d batches of >= %.2f s (or %d calls) per variant, "
              "mpt/oneDNN batches interleaved; reported: MEDIAN batch\n",
              opt.warmup, opt.batches, opt.batch_s, opt.max_iters);
  std::printf("mpt f16 = float16 storage, float32 compute (inputs/outputs converted per call)\n");
  std::printf("load average at start: %s\n\n", loadavg().c_str());
  std::fflush(stdout);

  const auto t_start = Clock::now();
  std::vector<Row> rows;
  for (std::int64_t n : opt.sizes) {
    const double flops = 2.0 * n * n * n;
    for (int threads : opt.threads) {
      mpt::set_num_threads(threads);  // omp_set_num_threads: mpt kernels and oneDNN (OMP runtime)
      Row row{n, threads, 0, 0, 0, 0, 0};

      // Inputs: uniform [-1, 1), created once per dtype; float values of the rounded inputs for
      // the reference.
      struct Bench {
        mpt::DType dt;
        double *mpt_out, *dnnl_out;
      };
      const Bench benches[] = {{mpt::float32, &row.mpt_f32, &row.dnnl_f32},
                               {mpt::bfloat16, &row.mpt_bf16, &row.dnnl_bf16},
                               {mpt::float16, &row.mpt_f16, nullptr}};
      for (const Bench& bench : benches) {
        const mpt::DType dt = bench.dt;
        mpt::Tensor a = mpt::Tensor::random_uniform({n, n}, -1, 1, 1000 + n, dt);
        mpt::Tensor b = mpt::Tensor::random_uniform({n, n}, -1, 1, 2000 + n, dt);
        const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();

        auto run_mpt = [&] { (void)mpt::ops::matmul(a, b); };
        verify("mpt::ops::matmul", n, dt, av, bv, mpt::ops::matmul(a, b).to_vector<float>());

        const bool raw = bench.dnnl_out != nullptr;
        mpt::Tensor c_raw = mpt::Tensor::empty({n, n}, dt);
        RawGemm r;
        std::function<void()> run_raw;
        if (raw) {
          r = make_raw(eng, n, dt == mpt::float32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16,
                       a.data_ptr(), b.data_ptr(), c_raw.data_ptr());
          run_raw = [&] {
            r.prim.execute(strm, r.args);
            strm.wait();
          };
          run_raw();
          verify("raw oneDNN matmul", n, dt, av, bv, c_raw.to_vector<float>());
        }

        const int hint_mpt = iters_hint_for(run_mpt, opt.warmup, opt.batch_s);
        const int hint_raw = raw ? iters_hint_for(run_raw, opt.warmup, opt.batch_s) : 0;
        std::vector<double> t_mpt, t_raw;
        for (int k = 0; k < opt.batches; ++k) {
          t_mpt.push_back(time_batch(run_mpt, hint_mpt, opt.batch_s, opt.max_iters));
          if (raw) t_raw.push_back(time_batch(run_raw, hint_raw, opt.batch_s, opt.max_iters));
        }
        *bench.mpt_out = flops / median(t_mpt) / 1e9;
        if (raw) *bench.dnnl_out = flops / median(t_raw) / 1e9;
      }
      rows.push_back(row);
      std::fprintf(stderr, "  done n=%lld threads=%d (%.0f s)\n", static_cast<long long>(n), threads,
                   std::chrono::duration<double>(Clock::now() - t_start).count());
    }
  }

  std::printf("%6s %4s | %9s %9s %9s | %10s %10s | %8s %8s | %9s %9s\n", "size", "thr", "mpt f32",
              "mpt bf16", "mpt f16", "oneDNN f32", "oneDNN bf16", "f32 m/o", "bf16 m/o", "mpt b/f", "oneDNN b/f");
  std::printf("%6s %4s | %9s %9s %9s | %10s %10s | %8s %8s | %9s %9s\n", "", "", "GFLOP/s", "GFLOP/s",
              "GFLOP/s", "GFLOP/s", "GFLOP/s", "ratio", "ratio", "bf16/f32", "bf16/f32");
  for (const Row& r : rows) {
    std::printf("%6lld %4d | %9.1f %9.1f %9.1f | %10.1f %10.1f | %7.1f%% %7.1f%% | %9.2f %9.2f\n",
                static_cast<long long>(r.n), r.threads, r.mpt_f32, r.mpt_bf16, r.mpt_f16, r.dnnl_f32,
                r.dnnl_bf16, 100 * r.mpt_f32 / r.dnnl_f32, 100 * r.mpt_bf16 / r.dnnl_bf16,
                r.mpt_bf16 / r.mpt_f32, r.dnnl_bf16 / r.dnnl_f32);
  }
  std::printf("\n");
  for (const Row& r : rows) {
    if (r.n != 1024 || r.threads != 2) continue;
    std::printf("gemm 1024 2 threads: f32 %.1f GFLOP/s (%.0f%% of oneDNN), bf16 %.1f GFLOP/s (%.0f%% of oneDNN), "
                "bf16/f32 = %.2f\n",
                r.mpt_f32, 100 * r.mpt_f32 / r.dnnl_f32, r.mpt_bf16, 100 * r.mpt_bf16 / r.dnnl_bf16,
                r.mpt_bf16 / r.mpt_f32);
    std::printf("gemm 1024 2 threads: f16 %.1f GFLOP/s (%.0f%% of mpt f32); oneDNN bf16/f32 = %.2f\n", r.mpt_f16,
                100 * r.mpt_f16 / r.mpt_f32, r.dnnl_bf16 / r.dnnl_f32);
  }
  // A second thread that makes things slower means the other core was busy (other processes):
  // those rows measure the machine, not the GEMM.
  for (const Row& r : rows) {
    if (r.threads == 1) continue;
    for (const Row& q : rows) {
      if (q.n != r.n || q.threads != 1) continue;
      if (r.dnnl_f32 < 0.8 * q.dnnl_f32 || r.dnnl_bf16 < 0.8 * q.dnnl_bf16) {
        std::printf("WARNING: n=%lld: oneDNN at %d threads (f32 %.1f, bf16 %.1f) is below 1 thread (f32 %.1f, "
                    "bf16 %.1f): another process was using the cores; re-run on a quiet machine\n",
                    static_cast<long long>(r.n), r.threads, r.dnnl_f32, r.dnnl_bf16, q.dnnl_f32, q.dnnl_bf16);
      }
    }
  }
  std::printf("load average at end: %s; total %.0f s\n", loadavg().c_str(),
              std::chrono::duration<double>(Clock::now() - t_start).count());
  return 0;
}
