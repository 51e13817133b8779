// Training steps on a GPU under float32 (TF32 off), mixed_float16 and mixed_bfloat16: ms per
// step, samples/s and peak GPU memory for models A, B, C, D and D widened to 4096, at one batch
// size (1024 by default). scripts/gpu_check.sh runs it beside bench/torch_amp_gpu.py (the same
// models in PyTorch AMP) and puts both in one report.
//   A: MLP 784-512-512-10          B: CIFAR CNN conv32-pool-conv64-pool-dense128-10 (32x32x3)
//   C: Fashion-MNIST CNN (28x28x1) D: MLP 1024-2048x3-10    W: MLP 1024-4096x3-10
// Each step is the step fit runs (forward, float32 loss, backward, loss-scaled Adam update) and
// ends with the loss read on the host, as PyTorch's loss.item() does in the script beside it.
//
//   ./bench_gpu [--steps 50] [--warmup 10] [--batch 1024] [--models ABCDW] [--device cuda:0]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

Result measure(char which, const std::string& policy, std::int64_t batch, int warmup, int steps, Device dev) {
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
  reset_peak_memory(dev);
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    const double t0 = now();
    step();
    times.push_back((now() - t0) * 1e3);
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front(), memory_stats(dev).peak_bytes};
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 50, warmup = 10;
  std::int64_t batch = 1024;
  std::string models = "ABCDW", device = "cuda:0";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
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
    Device dev = device == "cpu" ? Device::cpu() : Device::cuda(device.size() > 5 ? std::atoi(device.c_str() + 5) : 0);
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
    std::printf("batch %lld, Adam, %d warm-up + %d timed steps; median (min) ms per step\n",
                static_cast<long long>(batch), warmup, steps);
    std::printf("%-6s %-16s %10s %10s %12s %10s %9s %9s\n", "model", "policy", "ms/step", "min ms", "samples/s",
                "peak MiB", "speed-up", "memory");
    for (char which : models) {
      Result f32;
      for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
        Result r = measure(which, policy, batch, warmup, steps, dev);
        if (!std::strcmp(policy, "float32")) f32 = r;
        std::printf("%-6c %-16s %10.3f %10.3f %12.0f %10.1f %8.2fx %8.2fx\n", which, policy, r.ms, r.min_ms,
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
