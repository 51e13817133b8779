// ops::dot_product_attention's memory and time: forward + backward at B·T fixed, so that the
// inputs are the same size and only the attention's own buffers could grow with T. Prints the
// peak bytes (the caching allocator's count of live tensors) at each T and the ratio of the
// largest T's peak to the smallest's: no T² buffers means a ratio near 1 (the bound is
// 2), and the fastest of --repeat timed runs after one untimed (forward alone, and forward +
// backward; on a GPU the first run also builds cuDNN's plan). --device cuda:0 runs on a GPU,
// where 16-bit inputs go through cuDNN's fused attention forward.
//
//   ./bench_attention [--tokens 8192] [--heads 2] [--dim 32] [--threads 2] [--dtype float32|bfloat16]
//                     [--device cpu|cuda:0] [--repeat 1] [--seq T]
// --seq runs that one T (B = tokens / T) rather than 1024, 2048, 4096: the GPT-mini's attention is
// --tokens 4096 --heads 4 --dim 64 --seq 256.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <mpt/mpt.hpp>

using namespace mpt;

int main(int argc, char** argv) {
  std::int64_t tokens = 8192, heads = 2, dim = 32;
  int threads = 2;
  std::string dtype = "float32", device = "cpu";
  int repeat = 1;
  std::int64_t seq = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--heads")) heads = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dim")) dim = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
    else if (!std::strcmp(argv[i], "--device")) device = argv[i + 1];
    else if (!std::strcmp(argv[i], "--repeat")) repeat = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seq")) seq = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_attention: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  try {
    set_num_threads(threads);
    const DType dt = dtype_from_string(dtype);
    const Device cpu = Device::parse(device);
    std::printf("B*T = %lld tokens, %lld heads of %lld, %s, causal, on %s (%d CPU threads)\n",
                static_cast<long long>(tokens), static_cast<long long>(heads), static_cast<long long>(dim),
                dtype.c_str(), cpu.str().c_str(), threads);
    std::printf("%8s %6s %14s %12s %12s\n", "T", "B", "peak MiB", "fwd ms", "fwd+bwd ms");
    double first = 0, last = 0;
    if (seq < 0 || (seq > 0 && tokens % seq != 0)) throw Error("bench_attention: --seq must divide --tokens");
    const std::int64_t t_first = seq > 0 ? seq : 1024, t_last = seq > 0 ? seq : std::min<std::int64_t>(tokens / 2, 4096);
    for (std::int64_t t = t_first; t <= t_last; t *= 2) {
      const std::int64_t b = tokens / t;
      Tensor q = Tensor::random_uniform({b, t, heads, dim}, -1, 1, 1, dt, cpu);
      Tensor k = Tensor::random_uniform({b, t, heads, dim}, -1, 1, 2, dt, cpu);
      Tensor v = Tensor::random_uniform({b, t, heads, dim}, -1, 1, 3, dt, cpu);
      // One forward, or forward + backward, finished (a scalar read back waits for the device).
      auto run = [&](bool backward) {
        GradientTape tape;
        tape.watch(q), tape.watch(k), tape.watch(v);
        Tensor y = ops::dot_product_attention(q, k, v, {.is_causal = true});
        if (!backward) return ops::sum(ops::cast(y, float32)).item();
        auto g = tape.gradient(ops::sum(ops::cast(y, float32)), {q, k, v});
        return ops::sum(ops::cast(g[0], float32)).item();
      };
      run(true);  // untimed: plans, caches
      empty_cache(cpu);
      reset_peak_memory(cpu);
      const std::size_t base = memory_stats(cpu).current_bytes;
      double best[2] = {1e30, 1e30};
      for (int r = 0; r < repeat; ++r)
        for (int backward = 0; backward < 2; ++backward) {
          const auto t0 = std::chrono::steady_clock::now();
          run(backward == 1);
          best[backward] = std::min(best[backward],
                                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
      const double peak = static_cast<double>(memory_stats(cpu).peak_bytes - base) / (1 << 20);
      std::printf("%8lld %6lld %14.2f %12.3f %12.3f\n", static_cast<long long>(t), static_cast<long long>(b), peak,
                  best[0] * 1e3, best[1] * 1e3);
      std::fflush(stdout);
      if (first == 0) first = peak;
      last = peak;
    }
    std::printf("peak ratio, longest T / shortest T at the same B*T: %.3f\n", last / first);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 1;
  }
}
