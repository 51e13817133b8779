// The CPU's elementwise unary ops and their gradients: ms per call (median of several) on 4M
// elements in float32 and bfloat16, for each op of the table, plus the fused Dense epilogue
// (bias + activation in the GEMM). Used to show that defining each formula once
// (backend/common/unary_ops.hpp) costs nothing against the hand-written loops it replaced: run
// the binary of each build side by side (farm-bench, or one after the other on the same machine).
//
//   ./bench_elementwise [--n 4194304] [--reps 15] [--threads 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

using namespace mpt;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median_ms(int reps, const std::function<void()>& f) {
  f();  // warm-up: pages, thread pool
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now();
    f();
    t.push_back((now() - t0) * 1e3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t n = 1 << 22;
  int reps = 15, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--n")) n = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_elementwise: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  try {
    set_num_threads(threads);
    const Device cpu = Device::cpu();
    struct Op {
      const char* name;
      std::function<Tensor(const Tensor&)> f;
    };
    const std::vector<Op> unary_ops = {
        {"exp", ops::exp},
        {"log", ops::log},
        {"sqrt", ops::sqrt},
        {"relu", ops::relu},
        {"sigmoid", ops::sigmoid},
        {"tanh", ops::tanh},
        {"gelu", [](const Tensor& x) { return ops::gelu(x); }},
        {"silu", ops::silu},
        {"square", ops::square},
        {"abs", ops::abs},
        {"relu6", ops::relu6},
        {"leaky_relu", [](const Tensor& x) { return ops::leaky_relu(x); }},
        {"gelu_tanh", [](const Tensor& x) { return ops::gelu(x, true); }}};
    std::printf("%lld elements, %d threads, median of %d; ms per call\n", static_cast<long long>(n), threads, reps);
    std::printf("%-11s %-9s %10s %10s\n", "op", "dtype", "forward", "backward");
    for (DType dt : {float32, bfloat16}) {
      const Tensor x = Tensor::random_uniform({n}, 0.1, 2.0, 1, float32, cpu).to(dt);
      for (const Op& op : unary_ops) {
        const double fwd = median_ms(reps, [&] { (void)op.f(x); });
        Variable v(x.copy(), "x");
        const double bwd = median_ms(reps, [&] {
          GradientTape tape;
          Tensor y = op.f(v.value());
          (void)tape.gradient(ops::sum(y), std::vector<Variable>{v});
        });
        std::printf("%-11s %-9s %10.3f %10.3f\n", op.name, to_string(dt).c_str(), fwd, bwd - fwd);
        std::fflush(stdout);
      }
    }
    // The fused Dense epilogue: bias and activation applied with the GEMM's output.
    const Tensor a = Tensor::random_uniform({1024, 512}, -1, 1, 2, float32, cpu);
    const Tensor w = Tensor::random_uniform({512, 512}, -1, 1, 3, float32, cpu);
    const Tensor b = Tensor::random_uniform({512}, -1, 1, 4, float32, cpu);
    for (const char* act : {"linear", "relu", "sigmoid", "tanh", "gelu", "silu", "relu6", "leaky_relu"})
      std::printf("dense %-9s float32   %10.3f\n", act, median_ms(reps, [&] { (void)ops::dense(a, w, b, act); }));
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_elementwise: %s\n", e.what());
    return 1;
  }
}
