// mpt's half of the side-by-side with PyTorch (bench/side_by_side.py): trains model A, B, C, D or
// G (bench_models.hpp) under one policy with fit on synthetic data and prints one JSON line: the
// median and minimum ms per step, samples/s and peak RSS. A-D train with Adam on softmax outputs;
// G (the GPT-mini) with AdamW (weight decay 0.01, not on biases, norms and embeddings) on float32
// logits against next-token ids [B, T].
//
//   bench_side --model D --policy mixed_bfloat16 [--steps 30] [--warmup 5]
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench_models.hpp"

using namespace mpt;

int main(int argc, char** argv) {
  std::string name = "A", policy = "float32";
  int steps = 30, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--policy")) policy = argv[i + 1];
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
    else steps = -1;
  }
  auto model = bench::training_model(name);
  if (!model || steps < 3 || warmup < 1 || (argc - 1) % 2 != 0) {
    std::fprintf(stderr, "usage: bench_side --model A|B|C|D|G --policy NAME [--steps N>=3] [--warmup N>=1]\n");
    return 2;
  }
  try {
    mixed_precision::set_global_policy(policy);
    set_random_seed(1);
    model = bench::training_model(name);  // under the policy
    const std::int64_t batch = bench::batch_size(name);
    Shape shape{batch * steps};
    for (auto d : bench::input_shape(name)) shape.push_back(d);
    Tensor x, y;
    if (name == "G") {
      auto adamw = optimizers::AdamW({.learning_rate = 1e-3, .weight_decay = 0.01});
      adamw->exclude_from_weight_decay({"bias", "gamma", "beta", "embeddings"});
      model->compile({.optimizer = adamw, .loss = losses::SparseCategoricalCrossentropy({.from_logits = true})});
      const double top = static_cast<double>(bench::GptMini::vocab) - 0.01;
      x = ops::cast(Tensor::random_uniform(shape, 0, top, 2, float32, Device::cpu()), int32);
      y = ops::cast(Tensor::random_uniform(shape, 0, top, 3, float32, Device::cpu()), int32);
    } else {
      model->compile({.optimizer = optimizers::Adam({.learning_rate = 1e-3}), .loss = "sparse_categorical_crossentropy"});
      x = Tensor::random_uniform(shape, 0, 1, 2, float32, Device::cpu());
      y = ops::cast(Tensor::random_uniform({batch * steps}, 0, 9.99, 3, float32, Device::cpu()), int32);
    }
    const std::int64_t w = std::min<std::int64_t>(warmup, steps) * batch;
    model->fit(x.slice(0, w), y.slice(0, w), {.batch_size = batch, .verbose = 0});
    auto clock = std::make_shared<bench::StepClock>();
    model->fit(x, y, {.batch_size = batch, .verbose = 0, .callbacks = {clock}});
    const auto ms = clock->sorted_ms();
    const double median = ms[ms.size() / 2];
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    const char* amx_env = std::getenv("MPT_ONEDNN_AMX");
    std::printf("{\"impl\": \"mpt\", \"model\": \"%s\", \"mode\": \"%s\", \"median_ms\": %.3f, \"min_ms\": %.3f, "
                "\"samples_per_s\": %.1f, \"peak_rss_mb\": %.1f, \"threads\": %d, \"batch\": %lld, "
                "\"mpt_onednn_amx\": \"%s\"}\n",
                name.c_str(), policy.c_str(), median, ms.front(), static_cast<double>(batch) / median * 1e3,
                static_cast<double>(usage.ru_maxrss) / 1024.0, num_threads(), static_cast<long long>(batch),
                amx_env ? amx_env : "");
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_side: %s\n", e.what());
    return 1;
  }
  return 0;
}
