// The quickest end-to-end demo of the core: a two-layer classifier trained with
// GradientTape in mixed precision (float32 master weights, 16-bit compute, dynamic loss
// scaling for float16), on a synthetic 10-class problem that float32 solves.
//
//   ./quickstart [--policy mixed_float16|mixed_bfloat16|float32] [--steps N]
#include <cmath>
#include <cstdio>
#include <string>

#include <mpt/mpt.hpp>

#include "flags.hpp"

using namespace mpt;

int main(int argc, char** argv) {
  std::string policy = "mixed_float16";
  int steps = 300;
  CLI::App app{"A two-layer classifier trained with GradientTape in mixed precision"};
  examples::add_policy(app, policy, {"float32", "mixed_float16", "mixed_bfloat16"});
  app.add_option("--steps", steps, "training steps")->check(examples::kPositive)->capture_default_str();
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  const DType compute = policy == "mixed_float16" ? float16 : policy == "mixed_bfloat16" ? bfloat16 : float32;
  const bool scale_loss = compute == float16;

  // Data: 10 Gaussian clusters in 64 dimensions.
  const std::int64_t n = 4096, dim = 64, classes = 10, hidden = 128, batch = 128;
  Tensor centers = Tensor::random_normal({classes, dim}, 0, 1, 1);
  std::vector<std::int32_t> ids(n);
  for (std::int64_t i = 0; i < n; ++i) ids[i] = static_cast<std::int32_t>((i * 7) % classes);
  Tensor y = Tensor::from_vector(ids, {n});
  Tensor x = ops::add(ops::matmul(ops::one_hot(y, classes), centers), Tensor::random_normal({n, dim}, 0, 1.5, 2));

  // float32 master weights
  Tensor w1 = Tensor::random_normal({dim, hidden}, 0, std::sqrt(2.0 / dim), 3).set_requires_grad(true);
  Tensor b1 = Tensor::zeros({hidden}).set_requires_grad(true);
  Tensor w2 = Tensor::random_normal({hidden, classes}, 0, std::sqrt(1.0 / hidden), 4).set_requires_grad(true);
  Tensor b2 = Tensor::zeros({classes}).set_requires_grad(true);
  std::vector<Tensor> vars{w1, b1, w2, b2};

  double loss_scale = scale_loss ? 32768.0 : 1.0, lr = 0.05;
  int skipped = 0;
  std::printf("quickstart: policy %s (compute %s), %d steps, CPU threads %d\n", policy.c_str(),
              to_string(compute).c_str(), steps, num_threads());
  for (int step = 0; step < steps; ++step) {
    std::int64_t start = (step * batch) % n;
    Tensor xb = x.slice(start, start + batch).to(compute), yb = y.slice(start, start + batch);
    GradientTape tape;
    // Variables are read in the compute dtype; their gradients come back in float32.
    Tensor h = ops::dense(xb, ops::cast(w1, compute), ops::cast(b1, compute), "relu");
    Tensor logits = ops::dense(h, ops::cast(w2, compute), ops::cast(b2, compute));
    Tensor loss = ops::mean(ops::softmax_cross_entropy(logits, yb));  // float32
    auto grads = tape.gradient(loss * loss_scale, vars);
    bool finite = true;
    for (auto& g : grads) finite = finite && !ops::has_nonfinite(g);
    if (!finite) {  // overflow: skip the step and back off
      loss_scale /= 2, ++skipped;
      continue;
    }
    NoGradGuard no_grad;
    for (std::size_t i = 0; i < vars.size(); ++i) vars[i].assign(vars[i] - grads[i] * (lr / loss_scale));
    if (step % 50 == 0 || step == steps - 1) std::printf("step %4d  loss %.4f\n", step, loss.item());
  }
  NoGradGuard no_grad;
  Tensor pred = ops::argmax(ops::dense(ops::dense(x, w1, b1, "relu"), w2, b2));
  double acc = ops::mean(ops::equal(pred, y.to(int64)).to(float32)).item();
  std::printf("skipped steps %d, final loss scale %.0f\n", skipped, loss_scale);
  std::printf("peak CPU memory %.1f MiB\n", memory_stats(Device::cpu()).peak_bytes / 1048576.0);
  std::printf("train_accuracy=%.4f\n", acc);
  return acc > 0.9 ? 0 : 1;
}
