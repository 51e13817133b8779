// A CNN training step of bench_models.hpp (model B or C), op by op: each op's forward and
// backward at the step's shapes, timed alone (median of --reps), at the ISA tier this process
// runs (MPT_CPU_ISA=avx2|baseline caps it; printed) and under one policy. The groups are those
// issue 30 asks for: the first-layer convolution, the other convolution, pooling, the dense
// layers' GEMMs, the loss (softmax + cross-entropy), the optimizer (Adam over every weight),
// and the casts (the batch to the compute dtype; the 16-bit weight copies come with Adam's update).
// Model B has no normalization layer.
//   bench_step_ops [--model B|C] [--policy float32|mixed_bfloat16|mixed_float16] [--reps 15]
// Backward = (forward + sum + gradient, under a tape) - (forward + sum, no tape).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

#include "core/cpu_isa.hpp"

using namespace mpt;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median_ms(const std::function<void()>& f, int reps) {
  f();  // plans, caches, first-touch
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    f();
    t.push_back((now() - t0) * 1e3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Tensor random(const Shape& s, DType d, std::uint64_t seed, double scale = 0.1) {
  return ops::cast(Tensor::random_normal(s, 0.0, scale, seed), d);
}

struct Op {
  std::string group, name;
  std::vector<Tensor> inputs;   // watched (the gradient's sources)
  std::function<Tensor(const std::vector<Tensor>&)> forward;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model = "B", policy = "float32";
  int reps = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    else if (!std::strcmp(argv[i], "--policy")) policy = argv[i + 1];
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  if ((model != "B" && model != "C") || reps < 1 ||
      (policy != "float32" && policy != "mixed_bfloat16" && policy != "mixed_float16")) {
    std::fprintf(stderr, "usage: bench_step_ops [--model B|C] [--policy float32|mixed_bfloat16|mixed_float16] [--reps N]\n");
    return 2;
  }
  const DType c = policy == "float32" ? float32 : policy == "mixed_bfloat16" ? bfloat16 : float16;
  const std::int64_t n = 128, side = model == "B" ? 32 : 28, cin = model == "B" ? 3 : 1;
  const std::int64_t s1 = side - 2, p1 = s1 / 2, s2 = p1 - 2, p2 = s2 / 2, flat = p2 * p2 * 64;

  const Tensor x = random({n, side, side, cin}, c, 1, 1.0);
  const Tensor k1 = random({3, 3, cin, 32}, c, 2), b1 = random({32}, c, 3);
  const Tensor y1 = random({n, s1, s1, 32}, c, 4, 1.0);
  const Tensor x2 = random({n, p1, p1, 32}, c, 5, 1.0);
  const Tensor k2 = random({3, 3, 32, 64}, c, 6), b2 = random({64}, c, 7);
  const Tensor y2 = random({n, s2, s2, 64}, c, 8, 1.0);
  const Tensor x3 = random({n, flat}, c, 9, 1.0), w3 = random({flat, 128}, c, 10, 0.02), b3 = random({128}, c, 11);
  const Tensor x4 = random({n, 128}, c, 12, 1.0), w4 = random({128, 10}, c, 13), b4 = random({10}, c, 14);
  const Tensor logits = random({n, 10}, float32, 15, 1.0);
  std::vector<std::int32_t> label_values(n);
  for (std::int64_t i = 0; i < n; ++i) label_values[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % 10);
  const Tensor labels = Tensor::from_vector(label_values, {n});

  std::vector<Op> ops_list = {
      {"first-layer convolution", "conv2d 3x3 " + std::to_string(cin) + "->32 + bias + relu", {k1, b1},
       [&](const std::vector<Tensor>& in) { return ops::conv2d(x, in[0], in[1], {.activation = "relu"}); }},
      {"pooling", "max_pool2d 2x2 (32 channels)", {y1},
       [](const std::vector<Tensor>& in) { return ops::max_pool2d(in[0]); }},
      {"other convolutions", "conv2d 3x3 32->64 + bias + relu", {x2, k2, b2},
       [](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1], in[2], {.activation = "relu"}); }},
      {"pooling", "max_pool2d 2x2 (64 channels)", {y2},
       [](const std::vector<Tensor>& in) { return ops::max_pool2d(in[0]); }},
      {"dense (GEMM)", "dense " + std::to_string(flat) + "->128 + relu", {x3, w3, b3},
       [](const std::vector<Tensor>& in) { return ops::dense(in[0], in[1], in[2], "relu"); }},
      {"dense (GEMM)", "dense 128->10", {x4, w4, b4},
       [](const std::vector<Tensor>& in) { return ops::dense(in[0], in[1], in[2]); }},
      {"loss", "softmax_cross_entropy [128, 10]", {logits},
       [&](const std::vector<Tensor>& in) { return ops::softmax_cross_entropy(in[0], labels); }},
  };

  const detail::CpuIsa isa = detail::cpu_isa();
  std::printf("model %s, %s, ISA tier %s (hardware %s%s), %d threads, median of %d\n", model.c_str(), policy.c_str(),
              detail::cpu_isa_name(isa), detail::cpu_isa_name(detail::hardware_cpu_isa()),
              detail::cpu_isa_capped() ? ", capped by MPT_CPU_ISA" : "", num_threads(), reps);
  std::printf("| group | op | forward ms | backward ms |\n|---|---|---|---|\n");
  double total = 0;
  for (Op& op : ops_list) {
    const double f = median_ms([&] { (void)ops::sum(op.forward(op.inputs)).to_vector<float>(); }, reps);
    const double fb = median_ms(
        [&] {
          GradientTape tape;
          for (Tensor& t : op.inputs) tape.watch(t);
          auto g = tape.gradient(ops::sum(op.forward(op.inputs)), op.inputs);
          (void)g;
        },
        reps);
    std::printf("| %s | %s | %.3f | %.3f |\n", op.group.c_str(), op.name.c_str(), f, std::max(0.0, fb - f));
    total += fb;
  }
  // Adam over the model's weights: float32 masters; 16-bit policies write the compute copies too.
  std::vector<Tensor> w, g, m, v, copies;
  for (const Tensor& t : {k1, b1, k2, b2, w3, b3, w4, b4}) {
    w.push_back(ops::cast(t, float32));
    g.push_back(random(t.shape(), c, 99, 1e-3));
    m.push_back(Tensor::zeros(t.shape()));
    v.push_back(Tensor::zeros(t.shape()));
    copies.push_back(Tensor::zeros(t.shape(), c));
  }
  const double adam = median_ms(
      [&] {
        for (std::size_t i = 0; i < w.size(); ++i)
          ops::adam_update(w[i], g[i], m[i], v[i], nullptr, 1e-3, 0.9, 0.999, 1e-7, 0.0, c == float32 ? nullptr : &copies[i]);
      },
      reps);
  std::printf("| optimizer | Adam over %zu weights%s | %.3f | - |\n", w.size(), c == float32 ? "" : " (+ 16-bit copies)", adam);
  total += adam;
  if (c != float32) {
    const Tensor batch = ops::cast(x, float32);
    const double cast = median_ms([&] { (void)ops::cast(batch, c); }, reps);
    std::printf("| casts | the batch to %s | %.3f | - |\n", to_string(c).c_str(), cast);
    total += cast;
  }
  std::printf("sum of the ops (forward + backward): %.2f ms\n", total);
  return 0;
}
