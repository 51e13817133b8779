// Data-parallel throughput: one process of an MPI job training model C (the Fashion-MNIST CNN,
// 128 rows per rank) or model D (MLP 1024-2048x3-10, 512 rows per rank) with fit, the global
// batch growing with the ranks (weak scaling, as DDP and Horovod are measured). Rank 0 prints the
// median step time and samples/s; scripts/bench_distributed.sh runs it on 1 and 2 ranks,
// interleaved, and prints the scaling.
//
//   mpirun -np 2 ./bench_distributed --model C --policy float32 --steps 40
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

#include "bench_models.hpp"

using namespace mpt;

int main(int argc, char** argv) {
  std::string model_name = "C", policy = "float32";
  int steps = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--policy")) policy = argv[i + 1];
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_distributed [--model C|D] [--policy NAME] [--steps N]\n");
      return 2;
    }
  }
  if ((model_name != "C" && model_name != "D") || steps < 5) {
    std::fprintf(stderr, "bench_distributed: --model C or D, --steps >= 5\n");
    return 2;
  }
  try {
    distributed::initialize();
    mixed_precision::set_global_policy(policy);
    set_random_seed(1);
    const std::int64_t per_rank = bench::batch_size(model_name), batch = per_rank * distributed::size();
    auto model = bench::model(model_name);
    model->compile({.optimizer = optimizers::Adam({.learning_rate = 1e-4}), .loss = "sparse_categorical_crossentropy",
                    .metrics = {"accuracy"}, .distribution = distributed::DataParallel()});
    // Every rank holds the global data, as with an in-memory data set (fit takes its shares).
    Shape shape{batch * steps};
    for (auto d : bench::input_shape(model_name)) shape.push_back(d);
    Tensor x = Tensor::random_uniform(shape, 0, 1, 2, float32, Device::cpu());
    Tensor y = ops::cast(Tensor::random_uniform({batch * steps}, 0, 9.99, 3, float32, Device::cpu()), int32);
    model->fit(x.slice(0, 3 * batch), y.slice(0, 3 * batch), {.batch_size = batch, .verbose = 0});  // warm-up
    auto clock = std::make_shared<bench::StepClock>();
    model->fit(x, y, {.batch_size = batch, .verbose = 0, .callbacks = {clock}});
    // The all-reduce alone: the model's gradients (zeros of every trainable variable's shape),
    // summed over the ranks as fit does, 20 times.
    std::vector<Tensor> zeros;
    std::int64_t params = 0;
    for (const auto& v : model->trainable_variables()) {
      zeros.push_back(Tensor::zeros(v.shape(), float32, v.value().device()));
      params += v.numel();
    }
    const distributed::DataParallel dp;
    std::vector<double> reduce_ms;
    for (int i = 0; i < 20; ++i) {
      distributed::world()->barrier();
      const double t0 = bench::now();
      dp.all_reduce_gradients(zeros, 1.0);
      reduce_ms.push_back(1e3 * (bench::now() - t0));
    }
    std::sort(reduce_ms.begin(), reduce_ms.end());
    const std::vector<double> ms = clock->sorted_ms();
    const double median = ms[ms.size() / 2];
    if (distributed::is_chief())
      std::printf("model %s %s ranks %d threads %d batch %lld (%lld per rank): median %.2f ms/step, min %.2f, %.0f samples/s\n",
                  model_name.c_str(), policy.c_str(), distributed::size(), num_threads(), static_cast<long long>(batch),
                  static_cast<long long>(per_rank), median, ms.front(), static_cast<double>(batch) / median * 1e3);
    if (distributed::is_chief() && distributed::size() > 1)
      std::printf("  all-reduce of the %.1f MB of gradients: median %.2f ms\n", 4.0 * static_cast<double>(params) / 1e6,
                  reduce_ms[reduce_ms.size() / 2]);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_distributed: %s\n", e.what());
    return 1;
  }
  return 0;
}
