// Training steps on a GPU under float32 (TF32 off, and on), mixed_float16 and mixed_bfloat16: ms per
// step, samples/s and peak GPU memory for models A, B, C, D and D widened to 4096, at one batch
// size (1024 by default). scripts/gpu_check.sh runs it beside bench/torch_amp_gpu.py (the same
// models in PyTorch AMP) and puts both in one report.
//   A: MLP 784-512-512-10          B: CIFAR CNN conv32-pool-conv64-pool-dense128-10 (32x32x3)
//   C: Fashion-MNIST CNN (28x28x1) D: MLP 1024-2048x3-10    W: MLP 1024-4096x3-10
// Each step is the step fit runs (forward, float32 loss, backward, loss-scaled Adam update) and
// ends with the loss read on the host, as PyTorch's loss.item() does in the script beside it.
//
// --gemm times mpt's GEMMs of a D-4096 step at the batch (forward, data gradient, weight gradient,
// through ops::matmul) in TFLOP/s, beside torch_amp_gpu.py --gemm's torch.matmul on the same shapes.
// --launches N brackets N steps of each model and policy after the warm-up with
// cudaProfilerStart/Stop, so that `ncu --profile-from-start off` counts the kernels a step launches.
//
//   ./bench_gpu [--steps 50] [--warmup 10] [--batch 1024] [--models ABCDW] [--device cuda:0]
//               [--policies float32,float32_tf32,mixed_float16,mixed_bfloat16] [--gemm] [--launches N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

namespace layers = mpt::layers;
using namespace mpt;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::unique_ptr<Sequential> make_model(char which) {
  auto mlp = [](std::int64_t in, std::int64_t width, int hidden) {
    std::vector<LayerRef> l{layers::Input({in})};
    for (int i = 0; i < hidden; ++i) l.push_back(layers::Dense(width, {.activation = "relu"}));
    l.push_back(layers::Dense(10));
    l.push_back(layers::Activation("softmax"));
    return std::make_unique<Sequential>(l);
  };
  switch (which) {
    case 'A': return mlp(784, 512, 2);
    case 'D': return mlp(1024, 2048, 3);
    case 'W': return mlp(1024, 4096, 3);
    case 'B':
      return std::make_unique<Sequential>(std::initializer_list<LayerRef>{
          layers::Input({32, 32, 3}), layers::Conv2D(32, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}),
          layers::Conv2D(64, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}), layers::Flatten(),
          layers::Dense(128, {.activation = "relu"}), layers::Dense(10), layers::Activation("softmax")});
    case 'C':
      return std::make_unique<Sequential>(std::initializer_list<LayerRef>{
          layers::Input({28, 28, 1}), layers::Conv2D(32, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}),
          layers::Conv2D(64, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}), layers::Flatten(),
          layers::Dense(128, {.activation = "relu"}), layers::Dense(10), layers::Activation("softmax")});
  }
  fail("bench_gpu: unknown model '", which, "' (expected A, B, C, D or W)");
}

Shape input_shape(char which, std::int64_t batch) {
  switch (which) {
    case 'A': return {batch, 784};
    case 'B': return {batch, 32, 32, 3};
    case 'C': return {batch, 28, 28, 1};
    default: return {batch, 1024};
  }
}

struct Result {
  double ms = 0, min_ms = 0;
  std::size_t peak = 0;
};

/// cudaProfilerStart/Stop from the CUDA runtime libmpt loaded (none in a CPU-only build).
void profiler(bool start) {
  using Fn = int (*)();
  static const auto on = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "cudaProfilerStart"));
  static const auto off = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "cudaProfilerStop"));
  if (start ? on : off) (start ? on : off)();
  else std::fprintf(stderr, "bench_gpu: no cudaProfilerStart/Stop in this process\n");
}

/// Blocks until the device's queue has run: one element of t read on the host.
void sync(const Tensor& t) { (void)t.reshape({t.numel()}).slice(0, 1).item(); }

/// TFLOP/s of ops::matmul on the 4096x4096 layers' GEMMs of a D-4096 step at `batch`: the
/// median of 7 rounds of 10 GEMMs queued back to back (one host read per round).
void gemm_rates(std::int64_t batch, Device dev) {
  const std::int64_t n = 4096;
  std::printf("mpt ops::matmul, D-4096 GEMMs at batch %lld: TFLOP/s (median of 7 rounds of 10)\n",
              static_cast<long long>(batch));
  struct Mode {
    const char* name;
    DType dtype;
    bool tf32;
  };
  for (const Mode& m : {Mode{"fp32", float32, false}, Mode{"fp32_tf32", float32, true}, Mode{"fp16", float16, false},
                        Mode{"bf16", bfloat16, false}}) {
    cuda::set_allow_tf32(m.tf32);
    const Tensor x = Tensor::random_uniform({batch, n}, 0, 1, 1, m.dtype, dev);
    const Tensor w = Tensor::random_uniform({n, n}, 0, 1, 2, m.dtype, dev);
    const Tensor dy = Tensor::random_uniform({batch, n}, 0, 1, 3, m.dtype, dev);
    struct Gemm {
      const char* name;
      std::function<Tensor()> run;
    };
    const std::vector<Gemm> gemms = {{"forward x.w", [&] { return ops::matmul(x, w); }},
                                     {"data grad dy.w^T", [&] { return ops::matmul(dy, w, false, true); }},
                                     {"weight grad x^T.dy", [&] { return ops::matmul(x, dy, true, false); }}};
    std::ostringstream row;
    for (const Gemm& g : gemms) {
      for (int i = 0; i < 5; ++i) sync(g.run());
      std::vector<double> per;
      for (int r = 0; r < 7; ++r) {
        const double t0 = now();
        Tensor last;
        for (int i = 0; i < 10; ++i) last = g.run();
        sync(last);
        per.push_back((now() - t0) / 10);
      }
      std::sort(per.begin(), per.end());
      const double flops = 2.0 * batch * n * n;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s %7.1f   ", g.name, flops / per[per.size() / 2] / 1e12);
      row << buf;
    }
    std::printf("  %-10s %s\n", m.name, row.str().c_str());
    std::fflush(stdout);
  }
  cuda::set_allow_tf32(false);
}

Result measure(char which, std::string policy, std::int64_t batch, int warmup, int steps, Device dev,
               int launches = 0) {
  // float32_tf32: the float32 policy with TF32 tensor cores allowed in GEMMs and convolutions.
  cuda::set_allow_tf32(policy == "float32_tf32");
  if (policy == "float32_tf32") policy = "float32";
  mixed_precision::set_global_policy(policy);
  set_random_seed(1);
  auto m = make_model(which);
  m->compile({.optimizer = optimizers::Adam({.learning_rate = 1e-3}), .loss = "sparse_categorical_crossentropy"});
  Tensor x = Tensor::random_uniform(input_shape(which, batch), 0, 1, 7, float32, dev);
  Tensor y = ops::cast(Tensor::random_uniform({batch}, 0, 9.99, 8, float32, dev), int32);
  auto step = [&] {
    auto* lso = m->loss_scale_optimizer();
    GradientTape tape;
    Tensor pred = (*m)(x, {.training = true}).to(float32);
    auto vars = m->trainable_variables();
    Tensor loss = m->loss()(y, pred);
    bool applied = true;
    if (lso) {
      auto g = tape.gradient(lso->get_scaled_loss(loss), vars);
      applied = lso->apply_gradients(g, vars).applied;
    } else {
      m->optimizer().apply_gradients(tape.gradient(loss, vars), vars);
    }
    m->finish_step(applied);
    return loss.item();
  };
  for (int i = 0; i < warmup; ++i) step();
  if (launches > 0) {
    profiler(true);
    for (int i = 0; i < launches; ++i) step();
    profiler(false);
    cuda::set_allow_tf32(false);
    return {};
  }
  reset_peak_memory(dev);
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    const double t0 = now();
    step();
    times.push_back((now() - t0) * 1e3);
  }
  std::sort(times.begin(), times.end());
  cuda::set_allow_tf32(false);
  return {times[times.size() / 2], times.front(), memory_stats(dev).peak_bytes};
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 50, warmup = 10, launches = 0;
  bool gemm = false;
  std::int64_t batch = 1024;
  std::string models = "ABCDW", device = "cuda:0", policies = "float32,float32_tf32,mixed_float16,mixed_bfloat16";
  for (int i = 1; i < argc; i += 2) {
    if (!std::strcmp(argv[i], "--gemm")) {
      gemm = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_gpu: %s needs a value\n", argv[i]);
      return 2;
    }
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--launches")) launches = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--policies")) policies = argv[i + 1];
    else if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--models")) models = argv[i + 1];
    else if (!std::strcmp(argv[i], "--device")) device = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_gpu: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  try {
    const Device dev = Device::parse(device);
    if (!is_available(dev)) {
      std::printf("bench_gpu: %s is not available (%s)\n", device.c_str(), cuda::unavailable_reason().c_str());
      return 2;
    }
    set_default_device(dev);
    cuda::set_allow_tf32(false);
    if (dev.is_cuda()) {
      auto info = cuda::device_info(dev.index);
      std::printf("device: %s (sm_%d%d, %d SMs, %.1f GiB)\n", info.name.c_str(), info.major, info.minor,
                  info.multiprocessors, info.total_memory / 1073741824.0);
    }
    if (gemm) {
      gemm_rates(batch, dev);
      return 0;
    }
    std::vector<std::string> policy_list;
    for (std::stringstream ss(policies); ss.good();) {
      std::string p;
      std::getline(ss, p, ',');
      if (!p.empty()) policy_list.push_back(p);
    }
    if (launches > 0) {
      for (char which : models)
        for (const std::string& policy : policy_list) {
          std::printf("launches: model %c %s, %d steps between cudaProfilerStart and Stop\n", which, policy.c_str(),
                      launches);
          std::fflush(stdout);
          measure(which, policy, batch, warmup, 0, dev, launches);
        }
      return 0;
    }
    std::printf("batch %lld, Adam, %d warm-up + %d timed steps; median (min) ms per step\n",
                static_cast<long long>(batch), warmup, steps);
    std::printf("%-6s %-16s %10s %10s %12s %10s %9s %9s\n", "model", "policy", "ms/step", "min ms", "samples/s",
                "peak MiB", "speed-up", "memory");
    for (char which : models) {
      Result f32;
      for (const std::string& policy : policy_list) {
        Result r = measure(which, policy, batch, warmup, steps, dev);
        if (policy == "float32" || f32.ms == 0) f32 = r;
        std::printf("%-6c %-16s %10.3f %10.3f %12.0f %10.1f %8.2fx %8.2fx\n", which, policy.c_str(), r.ms, r.min_ms,
                    batch / r.ms * 1e3, r.peak / 1048576.0, f32.ms / r.ms,
                    f32.peak ? static_cast<double>(r.peak) / f32.peak : 0.0);
        std::fflush(stdout);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
}
