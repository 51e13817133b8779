// mpt::distributed in one process: the gradient buckets, weights and mask, the one skip decision,
// shards, the model check and the differentiable all-reduce, through a fake communicator whose
// peer rank is simulated; a process that is the whole job; which GPU a rank takes and when NCCL
// may sum GPU gradients. The real jobs (mpirun -np 2 / 4)
// are tests/distributed/mpi_data_parallel.cpp.
#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;
namespace dist = mpt::distributed;

namespace {

/// Rank 0 of 2; the other rank's buffers are `peer(i, mine)` (default: the same as this rank's).
class FakePeer : public dist::Communicator {
 public:
  std::function<Tensor(std::size_t, const Tensor&)> peer;
  std::vector<std::string> peer_lines;  // what the other rank passes to all_gather
  std::vector<std::int64_t> reduced_sizes;  // element count of every all_reduce_sum buffer
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "fake"; }
  void all_reduce_sum(std::vector<Tensor>& buffers) override {
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      reduced_sizes.push_back(buffers[i].numel());
      const Tensor other = peer ? peer(i, buffers[i]) : buffers[i].copy();
      buffers[i].assign(ops::add(buffers[i], other));
    }
  }
  void all_reduce(std::vector<double>& v, dist::ReduceOp op) override {
    for (auto& x : v) x = op == dist::ReduceOp::sum ? 2 * x : x;
  }
  void broadcast(Tensor&, int) override {}
  std::vector<std::string> all_gather(const std::string& mine) override {
    std::string other;
    for (const auto& l : peer_lines) other += l + "\n";
    return {mine, peer_lines.empty() ? mine : other};
  }
  void barrier() override {}
};

}  // namespace

TEST_CASE("a process started without mpirun is the whole job") {
  dist::initialize();
  dist::initialize();  // idempotent
  CHECK(dist::is_initialized());
  CHECK(dist::rank() == 0);
  CHECK(dist::size() == 1);
  CHECK(dist::is_chief());
  CHECK(dist::world()->backend() == "single");
  dist::DataParallel dp;
  CHECK(dp.size() == 1);
  CHECK(dp.shard(10) == std::pair<std::int64_t, std::int64_t>{0, 10});
  const std::vector<Tensor> g{Tensor::ones({3})};
  CHECK(dp.all_reduce_gradients(g)[0].id() == g[0].id());  // nothing to do
  // A model compiled with a one-rank strategy trains as without one.
  Sequential m({layers::Input({2}), layers::Dense(1)});
  m.compile({.optimizer = "sgd", .loss = "mse", .distribution = dp});
  CHECK(m.distribution() == nullptr);
  CHECK(error_of([] { dist::DataParallel bad({.bucket_mb = 0}); }) ==
        "DataParallel: bucket_mb must be positive, got 0");
}

TEST_CASE("shards of a global batch: contiguous, in rank order, sizes differing by at most one") {
  auto fake = std::make_shared<FakePeer>();
  dist::DataParallel dp({.communicator = fake});
  CHECK(dp.shard(128) == std::pair<std::int64_t, std::int64_t>{0, 64});
  CHECK(dp.shard(7) == std::pair<std::int64_t, std::int64_t>{0, 3});
  CHECK(dp.shard(1) == std::pair<std::int64_t, std::int64_t>{0, 0});  // rank 1 takes the one row
  CHECK(error_of([&] { dp.shard(-1); }) == "DataParallel::shard: negative row count -1");
}

TEST_CASE("all_reduce_gradients: float32 buckets of the set size, weighted sums, the mask") {
  for_each_device([](Device d) {
    auto fake = std::make_shared<FakePeer>();
    // 100 float32 values per bucket.
    dist::DataParallel dp({.bucket_mb = 400.0 / (1024 * 1024), .communicator = fake});
    const std::vector<Tensor> g{Tensor::random_uniform({6, 10}, -1, 1, 1, float32, d),   // 60
                                Tensor::random_uniform({30}, -1, 1, 2, float32, d),      // 30: fits with 60
                                Tensor(),                                               // no gradient
                                Tensor::random_uniform({50}, -1, 1, 3, bfloat16, d),     // a new bucket
                                Tensor::random_uniform({120}, -1, 1, 4, float32, d)};    // alone, over the cap
    // The other rank's gradients: 3 * this rank's.
    fake->peer = [](std::size_t, const Tensor& mine) { return ops::mul(mine, Tensor::scalar(3.0, float32, mine.device())); };
    const auto out = dp.all_reduce_gradients(g, 0.25);
    // Buckets in reverse order (the backward pass's): [120], [50 + 30], [60], then the 5-value
    // mask of which gradients were defined.
    CHECK(fake->reduced_sizes == std::vector<std::int64_t>{120, 80, 60, 5});
    REQUIRE(out.size() == g.size());
    CHECK_FALSE(out[2].defined());
    for (std::size_t i : {0u, 1u, 3u, 4u}) {
      CHECK(out[i].device() == d);
      CHECK(out[i].dtype() == g[i].dtype());
      CHECK(out[i].shape() == g[i].shape());
      // 0.25·g + 3·(0.25·g) = g, computed exactly in float32 (powers of two).
      const auto a = out[i].to_vector<double>(), e = g[i].to_vector<double>();
      CHECK(a == e);
    }
    // Default weight 1/size: the mean of identical gradients is the gradient.
    fake->peer = nullptr;
    CHECK(dp.all_reduce_gradients({g[0]})[0].to_vector<float>() == g[0].to_vector<float>());
  });
}

TEST_CASE("GradientReducer: a bucket goes out once its gradients are ready, in layout order only") {
  for_each_device([](Device d) {
    auto fake = std::make_shared<FakePeer>();
    dist::DataParallel dp({.bucket_mb = 400.0 / (1024 * 1024), .communicator = fake});  // 100 floats
    // Layout, last gradient first: [3: 120], [2: 50, 1: 30], [0: 60].
    dist::GradientReducer reducer(dp, {{60}, {30}, {50}, {120}}, d);
    std::vector<Tensor> g;
    for (std::int64_t n : {60, 30, 50, 120}) g.push_back(Tensor::random_uniform({n}, -1, 1, static_cast<std::uint64_t>(n), float32, d));
    reducer.ready(0, g[0]);  // its bucket is complete, but two buckets come before it
    CHECK(fake->reduced_sizes.empty());
    reducer.ready(3, g[3]);
    CHECK(fake->reduced_sizes == std::vector<std::int64_t>{120});
    reducer.ready(1, g[1]);
    CHECK(fake->reduced_sizes == std::vector<std::int64_t>{120});
    reducer.ready(2, g[2]);  // completes [2, 1], which lets [0] go too
    CHECK(fake->reduced_sizes == std::vector<std::int64_t>{120, 80, 60});
    const auto out = reducer.finish(g);
    CHECK(fake->reduced_sizes == std::vector<std::int64_t>{120, 80, 60, 4});
    for (std::size_t i = 0; i < g.size(); ++i) {
      auto e = g[i].to_vector<float>();
      for (auto& v : e) v *= 2;  // the peer holds the same gradients
      CHECK(out[i].to_vector<float>() == e);
    }
    CHECK(contains(error_of([&] { reducer.ready(0, g[0]); }), "gradient 0 was given twice"));
    dist::GradientReducer other(dp, {{2}}, d);
    CHECK(contains(error_of([&] { other.ready(0, Tensor::ones({3}, float32, d)); }),
                   "gradient 0 must be a floating tensor of shape (2,) on " + d.str() + ", got (3,) float32"));
  });
}

TEST_CASE("an inf on the other rank only: the summed gradients carry it, so every rank skips") {
  for_each_device([](Device d) {
    set_default_device(d);
    auto fake = std::make_shared<FakePeer>();
    dist::DataParallel dp({.communicator = fake});
    mixed_precision::LossScaleOptimizer lso(optimizers::SGD({.learning_rate = 0.1}));
    Variable v(Tensor::ones({4}, float32, d), "v");
    const Tensor before = v.value().copy();
    fake->peer = [](std::size_t, const Tensor& mine) {
      auto h = mine.to_vector<float>();
      if (h.size() == 4) h[1] = std::numeric_limits<float>::infinity();  // the gradient, not the 1-value mask
      return Tensor::from_vector(h, mine.shape(), mine.device());
    };
    lso.get_scaled_loss(Tensor::scalar(1.0, float32, d));
    auto g = dp.all_reduce_gradients({Tensor::full({4}, 0.5, float32, d)});
    auto r = lso.apply_gradients(lso.get_unscaled_gradients(g), {v});
    CHECK_FALSE(r.applied);
    CHECK(lso.loss_scale() == 16384.0);
    CHECK(v.value().to_vector<float>() == before.to_vector<float>());
    // And a step whose sums are finite is applied.
    fake->peer = nullptr;
    lso.get_scaled_loss(Tensor::scalar(1.0, float32, d));
    g = dp.all_reduce_gradients({Tensor::full({4}, 16384.0, float32, d)});
    r = lso.apply_gradients(lso.get_unscaled_gradients(g), {v});
    CHECK(r.applied);
    CHECK(v.value().to_vector<float>() == std::vector<float>(4, 0.9f));
    set_default_device(Device::cpu());
  });
}

TEST_CASE("a gradient defined on another rank but not here is an error, not a silent zero") {
  auto fake = std::make_shared<FakePeer>();
  dist::DataParallel dp({.communicator = fake});
  // The peer's mask (the last, 2-value message; the one bucket holds gradient 1's 2 values too)
  // says it had gradient 0, which this rank did not.
  fake->peer = [](std::size_t, const Tensor& mine) {
    auto h = mine.to_vector<float>();
    if (h.size() == 2) h[0] = 1.0f, h[1] = 1.0f;
    return Tensor::from_vector(h, mine.shape(), mine.device());
  };
  const std::string err = error_of([&] { dp.all_reduce_gradients({Tensor(), Tensor::ones({2})}); });
  CHECK(contains(err, "gradient 0 is defined on another rank but undefined on rank 0"));
}

TEST_CASE("check_same names the first line that differs") {
  auto fake = std::make_shared<FakePeer>();
  dist::DataParallel dp({.communicator = fake});
  dp.check_same("models", {"a (2)", "b (3)"});  // the peer passes the same
  fake->peer_lines = {"a (2)", "b (4)"};
  CHECK(error_of([&] { dp.check_same("models", {"a (2)", "b (3)"}); }) ==
        "distributed: the models differ between rank 0 and rank 1: line 2 is 'b (3)' on rank 0 and 'b (4)' on rank 1; "
        "every rank must build the same model and call fit alike");
  fake->peer_lines = {"a (2)"};
  CHECK(contains(error_of([&] { dp.check_same("models", {"a (2)", "b (3)"}); }), "line 2 is 'b (3)' on rank 0 and '(nothing)'"));
}

TEST_CASE("all_reduce_sum is differentiable: the backward pass all-reduces the gradient") {
  for_each_device([](Device d) {
    auto fake = std::make_shared<FakePeer>();
    dist::DataParallel dp({.communicator = fake});
    dist::detail::ScopedStrategy scoped(&dp);
    Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}, d);
    GradientTape tape;
    tape.watch(x);
    Tensor y = dist::all_reduce_sum(x);  // the peer holds the same x: 2x
    CHECK(y.to_vector<float>() == std::vector<float>{2, 4, 6});
    Tensor loss = ops::sum(ops::mul(y, y));  // d/dy = 2y; summed over the 2 ranks: 4y = 8x
    const auto g = tape.gradient(loss, {x})[0];
    CHECK(g.to_vector<float>() == std::vector<float>{8, 16, 24});
  });
}

TEST_CASE("metrics reduce by their state: a mean over every rank's samples") {
  metrics::Mean m("loss");
  m.update(3.0, 2.0);  // total 6, count 2
  CHECK(m.reduction_state() == std::vector<double>{6.0, 2.0});
  CHECK(m.result_of_state({6.0 + 10.0, 2.0 + 2.0}) == 4.0);
}

TEST_CASE("the NCCL communicator: only in CUDA builds with NCCL, only for GPUs") {
  if (!dist::built_with_nccl()) {
    CHECK(dist::detail::make_nccl_communicator(dist::world(), Device::cuda(0)) == nullptr);
  } else {
    CHECK(cuda::built_with_cuda());
    CHECK(contains(error_of([] { dist::detail::make_nccl_communicator(dist::world(), Device::cpu()); }),
                   "distributed (nccl)"));
  }
  // A DataParallel of one process never asks for it: CPU and GPU gradients alike stay put.
  dist::DataParallel dp;
  CHECK(&dp.communicator() == dist::world().get());
}

TEST_CASE("a local rank's GPU, and whether NCCL may sum GPU gradients: only with one GPU per rank") {
  namespace d = dist::detail;
  CHECK(d::device_for_local_rank(0, 1, 0) == Device::cpu());
  CHECK(d::device_for_local_rank(1, 2, 0) == Device::cpu());
  CHECK(d::device_for_local_rank(0, 1, 1) == Device::cuda(0));
  CHECK(d::device_for_local_rank(3, 4, 8) == Device::cuda(3));
  CHECK(d::device_for_local_rank(1, 2, 1) == Device::cuda(0));  // more ranks than GPUs: shared
  CHECK(d::device_for_local_rank(3, 4, 2) == Device::cuda(1));
  CHECK(error_of([] { d::device_for_local_rank(2, 2, 1); }) == "distributed: local rank 2 of 2 with 1 GPUs");
  CHECK(contains(error_of([] { d::device_for_local_rank(0, 1, -1); }), "distributed: local rank 0 of 1"));

  // A machine's ranks as initialize() describes them: the GPU device_for_local_rank gives, and
  // its bus id (one per GPU index on the machine).
  const auto machine = [](const std::string& host, int local_size, int gpus) {
    std::vector<d::RankGpu> ranks;
    for (int r = 0; r < local_size; ++r) {
      const Device dev = d::device_for_local_rank(r, local_size, gpus);
      ranks.push_back({host, local_size, gpus, dev.is_cuda() ? "0000:0" + std::to_string(dev.index) + ":00.0" : ""});
    }
    return ranks;
  };
  struct Case {
    int local_size, gpus;
    bool nccl;
  };
  for (const Case& c : {Case{1, 1, true}, Case{2, 2, true}, Case{2, 8, true}, Case{8, 8, true}, Case{2, 1, false},
                        Case{3, 2, false}, Case{4, 2, false}, Case{1, 0, false}, Case{2, 0, false}}) {
    CAPTURE(c.local_size);
    CAPTURE(c.gpus);
    const d::NcclDecision one = d::decide_nccl(machine("n1", c.local_size, c.gpus));
    CHECK(one.use_nccl == c.nccl);
    CHECK(one.reason.empty() == c.nccl);
    // Every machine of a job must be fine: the ranks all take one path.
    auto job = machine("n1", 2, 2);
    for (const auto& r : machine("n2", c.local_size, c.gpus)) job.push_back(r);
    CHECK(d::decide_nccl(job).use_nccl == c.nccl);
  }
  CHECK(d::decide_nccl(machine("n1", 2, 1)).reason == "ranks 0 and 1 share GPU 0000:00:00.0 on n1 (2 ranks, 1 GPU there)");
  CHECK(d::decide_nccl(machine("n1", 4, 1)).reason ==
        "ranks 0, 1, 2 and 3 share GPU 0000:00:00.0 on n1 (4 ranks, 1 GPU there)");
  auto job = machine("n1", 2, 2);
  for (const auto& r : machine("n2", 3, 2)) job.push_back(r);
  CHECK(d::decide_nccl(job).reason == "ranks 2 and 4 share GPU 0000:00:00.0 on n2 (3 ranks, 2 GPUs there)");
  job = machine("n1", 1, 1);
  job.push_back({"n2", 1, 0, ""});
  CHECK(d::decide_nccl(job).reason == "rank 1 on n2 has no GPU (0 GPUs for 1 rank there)");
  // A launcher that gives each rank one GPU (CUDA_VISIBLE_DEVICES per rank): every rank sees one
  // GPU, index 0, but they are different GPUs.
  CHECK(d::decide_nccl({{"n1", 2, 1, "0000:01:00.0"}, {"n1", 2, 1, "0000:41:00.0"}}).use_nccl);
  CHECK_FALSE(d::decide_nccl({{"n1", 2, 1, "0000:01:00.0"}, {"n1", 2, 1, "0000:01:00.0"}}).use_nccl);
}
