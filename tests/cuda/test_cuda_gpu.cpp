// What only a real GPU can show, beyond the for_each_device tests (which then also run every op,
// layer, fit, optimizer and checkpoint test on cuda:0): the same bits as the CPU where the
// arithmetic is shared, whole training on cuda:0 against the CPU, the allocator's steady state,
// TF32's opt-in, and errors instead of crashes. Without a GPU the program exits with 77 and CTest
// reports it skipped (tests/main.cpp).
#include <cmath>

#include "test_util.hpp"

namespace mpt::test {
bool needs_gpu() { return true; }
}  // namespace mpt::test

using namespace mpt;
using namespace mpt::test;
namespace layers = mpt::layers;

namespace {
const Device gpu = Device::cuda(0);

std::vector<double> host(const Tensor& t) { return t.to(Device::cpu()).to(float64).to_vector<double>(); }

std::unique_ptr<Sequential> small_cnn() {
  return std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      layers::Input({12, 12, 1}), layers::Conv2D(8, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}),
      layers::BatchNormalization(), layers::Flatten(), layers::Dense(16, {.activation = "relu"}), layers::Dense(4),
      layers::Activation("softmax")});
}
}  // namespace

TEST_CASE("Philox random numbers and casts give the CPU's bits on the GPU") {
  for (DType d : {float32, float16, bfloat16, float64}) {
    Tensor c = Tensor::random_normal({1001}, 0.5, 2.0, 42, d, Device::cpu(), 7);
    Tensor g = Tensor::random_normal({1001}, 0.5, 2.0, 42, d, gpu, 7);
    CHECK(host(c) == host(g));
    Tensor x = Tensor::random_uniform({777}, -70000, 70000, 3, float32, Device::cpu());
    CHECK(host(x.to(d)) == host(x.to(gpu).to(d)));
  }
}

TEST_CASE("fit on cuda:0 follows the CPU's loss curve in every policy") {
  for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
    CAPTURE(policy);
    std::vector<double> losses[2];
    for (int side = 0; side < 2; ++side) {
      const Device dev = side == 0 ? Device::cpu() : gpu;
      mixed_precision::set_global_policy(policy);
      set_default_device(dev);
      set_random_seed(3);
      auto m = small_cnn();
      m->compile({.optimizer = optimizers::Adam({.learning_rate = 1e-2}), .loss = "sparse_categorical_crossentropy",
                  .metrics = {"accuracy"}});
      Tensor x = Tensor::random_uniform({256, 12, 12, 1}, 0, 1, 5, float32, dev);
      Tensor y = ops::cast(Tensor::random_uniform({256}, 0, 3.99, 6, float32, dev), int32);
      losses[side] = m->fit(x, y, {.batch_size = 64, .epochs = 3, .verbose = 0}).history.at("loss");
    }
    set_default_device(Device::cpu());
    mixed_precision::set_global_policy("float32");
    REQUIRE(losses[0].size() == 3);
    // Summation orders differ (cuDNN/cuBLASLt against oneDNN): the curves agree within the
    // policy's rounding, and both go down.
    const double tol = std::string(policy) == "float32" ? 1e-3 : 3e-2;
    for (int e = 0; e < 3; ++e) CHECK(losses[1][e] == doctest::Approx(losses[0][e]).epsilon(tol));
    CHECK(losses[1][2] < losses[1][0]);
  }
}

TEST_CASE("a steady-state training step reserves no new GPU memory") {
  set_default_device(gpu);
  mixed_precision::set_global_policy("mixed_float16");
  set_random_seed(1);
  auto m = small_cnn();
  m->compile({.optimizer = optimizers::Adam({}), .loss = "sparse_categorical_crossentropy"});
  Tensor x = Tensor::random_uniform({64, 12, 12, 1}, 0, 1, 5, float32, gpu);
  Tensor y = ops::cast(Tensor::random_uniform({64}, 0, 3.99, 6, float32, gpu), int32);
  m->fit(x, y, {.batch_size = 32, .epochs = 2, .verbose = 0});  // warm-up: plans, workspaces, slots
  const MemoryStats before = memory_stats(gpu);
  m->fit(x, y, {.batch_size = 32, .epochs = 3, .verbose = 0});
  const MemoryStats after = memory_stats(gpu);
  // Every block of the later steps came from the cache: no cudaMalloc in a steady-state step.
  CHECK(after.allocations - before.allocations == after.cache_hits - before.cache_hits);
  CHECK(after.allocations > before.allocations);
  set_default_device(Device::cpu());
  mixed_precision::set_global_policy("float32");
}

TEST_CASE("float32 GEMMs are strict float32 unless TF32 is allowed") {
  Tensor a = Tensor::random_uniform({256, 512}, -1, 1, 1, float32, Device::cpu());
  Tensor b = Tensor::random_uniform({512, 128}, -1, 1, 2, float32, Device::cpu());
  const std::vector<double> ref = host(ops::matmul(a.to(float64), b.to(float64)));
  auto max_rel = [&](const Tensor& r) {
    const auto v = host(r);
    double worst = 0;
    for (std::size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::abs(v[i] - ref[i]) / (std::abs(ref[i]) + 1));
    return worst;
  };
  cuda::set_allow_tf32(false);
  const double strict = max_rel(ops::matmul(a.to(gpu), b.to(gpu)));
  cuda::set_allow_tf32(true);
  const double tf32 = max_rel(ops::matmul(a.to(gpu), b.to(gpu)));
  cuda::set_allow_tf32(false);
  CHECK(strict < 1e-5);
  CHECK(tf32 > strict);  // TF32 keeps 10 fraction bits: visibly coarser on 512-term sums
  CHECK(tf32 < 1e-2);
}

TEST_CASE("GEMMs whose first cuBLASLt plan may be refused equal the CPU: epilogues, broadcast batches, slices") {
  // Each may run a fallback of matmul_plan.hpp's chain (unfused epilogue, aligned copies, folded
  // or looped batch); the result must not change. References: float64 on the CPU, same inputs.
  const auto same = [](const Tensor& on_gpu, const Tensor& reference, DType d, const std::string& what) {
    check_close(host(on_gpu), host(reference), tolerance(d), what);
  };
  const auto cpu64 = [](const Tensor& t) { return t.to(Device::cpu()).to(float64); };
  for (DType d : float_dtypes()) {
    CAPTURE(to_string(d));
    const Tensor x = random({6, 5, 24}, d, gpu, 1, -1, 1);
    const Tensor w = random({24, 16}, d, gpu, 2, -1, 1);
    const Tensor bias = random({16}, d, gpu, 3, -1, 1);
    // Bias and ReLU epilogues (cuBLASLt lacks them for float64 on many configurations).
    for (const char* act : {"relu", "linear", "sigmoid"})
      same(ops::dense(x, w, bias, act), ops::dense(cpu64(x), cpu64(w), cpu64(bias), act), d, act);
    // Batch stride 0: a matrix of batch 1 against a batch of 6, on either side, transposed too.
    const Tensor wb = random({6, 16, 24}, d, gpu, 4, -1, 1);
    same(ops::matmul(x, w), ops::matmul(cpu64(x), cpu64(w)), d, "broadcast b");
    same(ops::matmul(w, wb, true, true), ops::matmul(cpu64(w), cpu64(wb), true, true), d, "broadcast a");
    const Tensor xt = random({6, 24, 5}, d, gpu, 5, -1, 1);
    same(ops::matmul(xt, w, true, false), ops::matmul(cpu64(xt), cpu64(w), true, false), d, "broadcast b, a^T");
    // Operands one element past an aligned address: under 16 bytes aligned in every dtype.
    const Tensor flat_a = random({1 + 40 * 24}, d, gpu, 6, -1, 1);
    const Tensor flat_b = random({1 + 24 * 16}, d, gpu, 7, -1, 1);
    const Tensor a1 = flat_a.slice(1, 1 + 40 * 24).reshape({40, 24});
    const Tensor b1 = flat_b.slice(1, 1 + 24 * 16).reshape({24, 16});
    same(ops::matmul(a1, b1), ops::matmul(cpu64(a1), cpu64(b1)), d, "unaligned operands");
    same(ops::dense(a1, b1, bias, "relu"), ops::dense(cpu64(a1), cpu64(b1), cpu64(bias), "relu"), d,
         "unaligned operands, relu");
  }
}

TEST_CASE("GPU errors are mpt::Error naming what failed") {
  CHECK(contains(error_of([] { Tensor::empty({std::int64_t{1} << 50}, float32, gpu); }), "out of memory"));
  CHECK(contains(error_of([] { Tensor::empty({4}, float32, Device::cuda(99)); }), "cuda:99"));
  // After an error the device still works.
  Tensor t = Tensor::ones({5}, float32, gpu);
  CHECK(ops::sum(t).item() == 5.0);
}
