// fit on a data::Dataset whose batches take as long to prepare as a training step (issue 28):
// the step time with workers = 0 (get() on the training thread), 1 and 2, against fit on the
// same data in memory, all in one run. The preparation waits (as reading a file or a network
// share does) rather than computing, so it overlaps the step only when a worker runs it.
//
//   ./bench_dataset [--steps 60] [--rounds 3] [--prepare-ms 0 (0: the measured in-memory step)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <mpt/mpt.hpp>

namespace layers = mpt::layers;
using namespace mpt;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

/// Model C of bench_models.hpp's size class: a small CNN on 28x28x1.
std::unique_ptr<Sequential> model() {
  auto m = std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      layers::Input({28, 28, 1}), layers::Conv2D(16, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}),
      layers::Conv2D(32, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}), layers::Flatten(),
      layers::Dense(64, {.activation = "relu"}), layers::Dense(10), layers::Activation("softmax")});
  m->compile({.optimizer = optimizers::Adam({.learning_rate = 1e-3}), .loss = "sparse_categorical_crossentropy"});
  return m;
}

/// Batches of in-memory tensors that take `prepare_s` to hand out: the slicing, then a wait.
struct Slow : data::TensorDataset {
  Slow(Tensor x, Tensor y, std::int64_t bs, double prepare_s) : TensorDataset(x, y, bs), prepare_s(prepare_s) {}
  data::Batch get(std::int64_t index) override {
    const double t0 = now();
    data::Batch b = TensorDataset::get(index);
    b.x = b.x.copy(), b.y = b.y.copy();  // a batch of its own, as one read from a file is
    const double left = prepare_s - (now() - t0);
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
    return b;
  }
  double prepare_s;
};

/// ms per step of one fit of `steps` batches (the first epoch of warm-up excluded).
template <class Fit>
double ms_per_step(Fit fit, std::int64_t steps) {
  fit(std::int64_t{5});  // warm-up: plans, caches
  const double t0 = now();
  fit(steps);
  return (now() - t0) * 1e3 / static_cast<double>(steps);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t steps = 60;
  int rounds = 3;
  double prepare_ms = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--prepare-ms")) prepare_ms = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_dataset: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  try {
    const std::int64_t bs = 128, n = bs * (steps + 5);
    Tensor x = Tensor::random_uniform({n, 28, 28, 1}, 0, 1, 1, float32, Device::cpu());
    Tensor y = ops::cast(Tensor::random_uniform({n}, 0, 9.99, 2, float32, Device::cpu()), int32);
    set_random_seed(1);
    auto m = model();
    auto in_memory = [&](std::int64_t s) {
      m->fit(x, y, {.batch_size = bs, .epochs = 1, .verbose = 0, .shuffle = false, .steps_per_epoch = s});
    };
    const double base = ms_per_step(in_memory, steps);
    const double prep_s = (prepare_ms > 0 ? prepare_ms : base) / 1e3;
    std::printf("in-memory step %.2f ms; each dataset batch takes %.2f ms to prepare; %lld steps, %d rounds\n", base,
                prep_s * 1e3, static_cast<long long>(steps), rounds);
    std::printf("%10s %12s %14s %16s\n", "workers", "ms/step", "in-memory ms", "dataset/memory");
    std::vector<double> worst_ratio(3, 0.0);
    for (int r = 0; r < rounds; ++r)
      for (int workers : {0, 1, 2}) {
        Slow ds(x, y, bs, prep_s);
        const double mem = ms_per_step(in_memory, steps);  // interleaved: the same load on both
        const double got = ms_per_step(
            [&](std::int64_t s) {
              m->fit(ds, {.epochs = 1, .verbose = 0, .workers = workers, .max_queue_size = 4, .shuffle = false,
                          .steps_per_epoch = s});
            },
            steps);
        std::printf("%10d %12.2f %14.2f %16.3f\n", workers, got, mem, got / mem);
        std::fflush(stdout);
        worst_ratio[static_cast<std::size_t>(workers)] =
            std::max(worst_ratio[static_cast<std::size_t>(workers)], got / mem);
      }
    std::printf("worst dataset/memory ratio: workers 0: %.3f, 1: %.3f, 2: %.3f (target for 2: <= 1.10)\n",
                worst_ratio[0], worst_ratio[1], worst_ratio[2]);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_dataset: %s\n", e.what());
    return 1;
  }
}
