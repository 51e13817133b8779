// ops::dot_product_attention's memory and time on the CPU: forward + backward at B·T fixed, so
// that the inputs are the same size and only the attention's own buffers could grow with T.
// Prints the peak bytes (the caching allocator's count of live tensors) at each T and the ratio
// of the largest T's peak to the smallest's: no T² buffers means a ratio near 1 (the issue's
// bound is 2).
//
//   ./bench_attention [--tokens 8192] [--heads 2] [--dim 32] [--threads 2] [--dtype float32|bfloat16]
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
  std::string dtype = "float32";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--heads")) heads = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dim")) dim = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_attention: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  try {
    set_num_threads(threads);
    const DType dt = dtype_from_string(dtype);
    const Device cpu = Device::cpu();
    std::printf("B*T = %lld tokens, %lld heads of %lld, %s, causal, %d threads\n", static_cast<long long>(tokens),
                static_cast<long long>(heads), static_cast<long long>(dim), dtype.c_str(), threads);
    std::printf("%8s %6s %14s %12s\n", "T", "B", "peak MiB", "fwd+bwd s");
    double first = 0, last = 0;
    for (std::int64_t t = 1024; t <= tokens / 2 && t <= 4096; t *= 2) {
      const std::int64_t b = tokens / t;
      Tensor q = Tensor::random_uniform({b, t, heads, dim}, -1, 1, 1, dt, cpu);
      Tensor k = Tensor::random_uniform({b, t, heads, dim}, -1, 1, 2, dt, cpu);
      Tensor v = Tensor::random_uniform({b, t, heads, dim}, -1, 1, 3, dt, cpu);
      empty_cache(cpu);
      reset_peak_memory(cpu);
      const std::size_t base = memory_stats(cpu).current_bytes;
      const auto t0 = std::chrono::steady_clock::now();
      {
        GradientTape tape;
        tape.watch(q), tape.watch(k), tape.watch(v);
        Tensor y = ops::dot_product_attention(q, k, v, {.is_causal = true});
        auto g = tape.gradient(ops::sum(ops::cast(y, float32)), {q, k, v});
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double peak = static_cast<double>(memory_stats(cpu).peak_bytes - base) / (1 << 20);
      std::printf("%8lld %6lld %14.2f %12.2f\n", static_cast<long long>(t), static_cast<long long>(b), peak, secs);
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
