// Data parallelism on Open MPI: run by CTest as `mpirun -np 2 --oversubscribe` with one thread
// per rank (tests/CMakeLists.txt). Every rank runs every test case; the collectives inside them
// meet because all ranks take the same path. References are single-process runs of the same
// program (no strategy), computed on every rank.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;
namespace dist = mpt::distributed;
namespace opt = mpt::optimizers;

namespace mpt::test {
void before_tests() { dist::initialize(); }
}  // namespace mpt::test

namespace {

/// Host data with learnable labels: x [n, 16] in [0, 1), y = argmax of a fixed projection.
std::pair<Tensor, Tensor> make_data(std::int64_t n, std::uint64_t seed) {
  Tensor x = Tensor::random_uniform({n, 16}, 0, 1, seed, float32, Device::cpu());
  const auto v = x.to_vector<float>();
  std::vector<std::int32_t> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const float* r = v.data() + i * 16;
    const float s[4] = {r[0] + r[1], r[2] + r[3], r[4] + r[5], r[6] + r[7]};
    y[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(std::max_element(s, s + 4) - s);
  }
  return {x, Tensor::from_vector(y, {n}, Device::cpu())};
}

std::shared_ptr<Sequential> mlp(std::uint64_t seed, bool batch_norm = false, std::int64_t width = 32) {
  set_random_seed(seed);
  auto m = std::make_shared<Sequential>();
  m->add(layers::Input({16}));
  m->add(layers::Dense(width, {.activation = "relu"}));
  if (batch_norm) m->add(layers::BatchNormalization());
  m->add(layers::Dense(32, {.activation = "relu"}));
  m->add(layers::Dense(4));
  m->add(layers::Activation("softmax"));
  return m;
}

CompileOptions sgd(std::optional<dist::DataParallel> strategy = std::nullopt) {
  return {.optimizer = opt::SGD({.learning_rate = 0.1, .momentum = 0.9}),
          .loss = "sparse_categorical_crossentropy",
          .metrics = {"accuracy"},
          .distribution = std::move(strategy)};
}

/// All weights of a model, flattened, as float64 host values.
std::vector<double> flat_weights(const Model& m) {
  std::vector<double> out;
  for (const auto& w : m.get_weights()) {
    const auto v = w.to_vector<double>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

/// Whether every rank holds exactly these values (bit for bit).
bool same_on_all_ranks(const std::vector<double>& v) {
  dist::DataParallel dp;
  const Tensor all = dp.all_gather_rows(Tensor::from_vector(v, {1, static_cast<std::int64_t>(v.size())}, Device::cpu()));
  const auto a = all.to_vector<double>();
  for (int r = 1; r < dp.size(); ++r)
    if (!std::equal(v.begin(), v.end(), a.begin() + static_cast<std::ptrdiff_t>(r * v.size()))) return false;
  return true;
}

/// The largest difference allowed between a 2-rank run and the 1-process run after 20 SGD
/// steps: the compute dtype's relative tolerance (test_util.hpp) of the largest weight. float32
/// differs only by the order of the gradient sums; 16-bit policies also round each rank's
/// half-batch gradient to 16 bits before the float32 average.
double weight_tolerance(const std::string& policy, const std::vector<double>& w) {
  double largest = 0;
  for (double v : w) largest = std::max(largest, std::abs(v));
  return tolerance(mixed_precision::Policy(policy).compute_dtype()).rtol * largest;
}

}  // namespace

TEST_CASE("the job: ranks and the world communicator") {
  REQUIRE(dist::is_initialized());
  CHECK(dist::size() >= 2);
  CHECK(dist::world()->backend() == "mpi");
  CHECK(dist::local_size() == dist::size());  // one machine
  CHECK(num_threads() == 1);                   // OMP_NUM_THREADS=1 per rank
  const auto all = dist::world()->all_gather("rank " + std::to_string(dist::rank()));
  REQUIRE(all.size() == static_cast<std::size_t>(dist::size()));
  for (int r = 0; r < dist::size(); ++r) CHECK(all[static_cast<std::size_t>(r)] == "rank " + std::to_string(r));
  dist::DataParallel dp;
  CHECK(dp.all_reduce({1.0, static_cast<double>(dist::rank())})[0] == dist::size());
  CHECK(dp.all_reduce({static_cast<double>(dist::rank())}, dist::ReduceOp::max)[0] == dist::size() - 1);
}

TEST_CASE("fit on 2 ranks with batch 64 each matches one process with batch 128 over 20 steps") {
  for (const std::string policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
    SUBCASE(policy.c_str()) {
      for_each_device([&](Device d) {
        PolicyDeviceScope scope(policy, d);
        auto [x, y] = make_data(20 * 128, 5);
        auto ref = mlp(7);
        ref->compile(sgd());
        const History hr = ref->fit(x, y, {.batch_size = 128, .epochs = 1, .verbose = 0, .seed = 11});
        // Rank 1 starts from other weights: fit broadcasts rank 0's.
        auto m = mlp(7 + static_cast<std::uint64_t>(dist::rank()));
        m->compile(sgd(dist::DataParallel({.bucket_mb = 0.004})));  // several buckets
        const History h = m->fit(x, y, {.batch_size = 128, .epochs = 1, .verbose = 0, .seed = 11});
        const auto w = flat_weights(*m), wr = flat_weights(*ref);
        const double diff = max_abs_diff(w, wr);
        const double tol = weight_tolerance(policy, wr);
        MESSAGE(policy, " on ", d.str(), ": max |w(2 ranks) - w(1 process)| = ", diff, " (tolerance ", tol, ")");
        CHECK(diff <= tol);
        CHECK(diff > 0.0);  // the runs really differ in summation order (not one run twice)
        CHECK(same_on_all_ranks(w));
        // Logs are over the global batch: the epoch's loss and accuracy equal the reference's.
        CHECK(h.history.at("loss")[0] == doctest::Approx(hr.history.at("loss")[0]).epsilon(1e-3));
        CHECK(h.history.at("accuracy")[0] == doctest::Approx(hr.history.at("accuracy")[0]).epsilon(1e-2));
        CHECK(same_on_all_ranks({h.history.at("loss")[0], h.history.at("accuracy")[0]}));
      });
    }
  }
}

TEST_CASE("a loss reduced by \"sum\" on 2 ranks: the gradient, the logged loss and evaluate of one process") {
  // The sum over the global batch: each rank's part counts whole (not by its share of the rows),
  // as Keras's reductions under tf.distribute; a second output keeps the mean.
  for_each_device([&](Device d) {
    PolicyDeviceScope scope("float32", d);
    auto [x, y] = make_data(10 * 128, 15);
    auto compile = [](Model& m, std::optional<dist::DataParallel> strategy) {
      losses::SparseCategoricalCrossentropy sum;
      sum.set_reduction("sum");
      m.compile({.optimizer = opt::SGD({.learning_rate = 0.1 / 128}), .loss = sum, .metrics = {"accuracy"},
                 .distribution = std::move(strategy)});
    };
    auto ref = mlp(21);
    compile(*ref, std::nullopt);
    const History hr = ref->fit(x, y, {.batch_size = 128, .epochs = 1, .verbose = 0, .seed = 3});
    auto m = mlp(21);
    compile(*m, dist::DataParallel());
    const History h = m->fit(x, y, {.batch_size = 128, .epochs = 1, .verbose = 0, .seed = 3});
    const auto w = flat_weights(*m), wr = flat_weights(*ref);
    const double diff = max_abs_diff(w, wr), tol = weight_tolerance("float32", wr);
    MESSAGE("summed loss on ", d.str(), ": max |w(2 ranks) - w(1 process)| = ", diff, " (tolerance ", tol, ")");
    CHECK(diff <= tol);
    CHECK(same_on_all_ranks(w));
    CHECK(h.history.at("loss")[0] == doctest::Approx(hr.history.at("loss")[0]).epsilon(1e-4));
    CHECK(hr.history.at("loss")[0] > 20.0);  // a sum over 128 rows, not a mean
    const double e = m->evaluate(x, y, {.batch_size = 128}).at("loss");
    CHECK(e == doctest::Approx(ref->evaluate(x, y, {.batch_size = 128}).at("loss")).epsilon(1e-4));
    CHECK(same_on_all_ranks({e}));
  });
}

namespace {
/// Identity whose variable's gradient is NaN on rank `rank` at training call `step` (sqrt(0) has
/// an infinite derivative, times 0), and 0 elsewhere: an overflow on one rank only.
class PoisonOnRank : public Layer {
 public:
  PoisonOnRank(int rank, int step) : Layer("PoisonOnRank"), rank_(rank), step_(step) { set_name("poison"); }
  void build(const Shape&) override { v_ = add_weight("v", {1}, "zeros"); }
  Tensor call(const Tensor& x, bool training) override {
    const bool poison = training && dist::rank() == rank_ && calls_++ == step_;
    const Tensor shift = Tensor::scalar(poison ? 0.0 : 1.0, float32, x.device());
    return ops::add(x, ops::cast(ops::mul(ops::sqrt(ops::add(v_.read(float32), shift)),
                                          Tensor::scalar(0.0, float32, x.device())),
                                 x.dtype()));
  }

 private:
  Variable v_;
  int rank_, step_, calls_ = 0;
};

struct WeightsAround : callbacks::Callback {
  std::vector<std::vector<double>> before, after;
  bool wants_batch_logs(std::int64_t) override { return false; }
  void on_train_batch_begin(std::int64_t, const Logs&) override { before.push_back(flat_weights(*model())); }
  void on_train_batch_end(std::int64_t, const Logs&) override { after.push_back(flat_weights(*model())); }
};
}  // namespace

namespace {
/// Batches of in-memory rows that records the indices it is asked for.
struct RecordingDataset : data::TensorDataset {
  using TensorDataset::TensorDataset;
  data::Batch get(std::int64_t index) override {
    {
      std::lock_guard<std::mutex> lock(mutex);
      asked.push_back(index);
    }
    return TensorDataset::get(index);
  }
  std::mutex mutex;
  std::vector<std::int64_t> asked;
};
}  // namespace

TEST_CASE("fit on a Dataset over 2 ranks: disjoint batches covering each epoch, the weights of one process at double batch") {
  for_each_device([&](Device d) {
    PolicyDeviceScope scope("float32", d);
    auto [x, y] = make_data(21 * 64, 6);  // 21 batches of 64: the last global step has one only
    auto ref = mlp(7);
    ref->compile(sgd());
    data::TensorDataset doubled(x, y, 128);
    ref->fit(doubled, {.epochs = 2, .verbose = 0, .shuffle = false});
    auto m = mlp(7 + static_cast<std::uint64_t>(dist::rank()));
    m->compile(sgd(dist::DataParallel()));
    RecordingDataset ds(x, y, 64);
    m->fit(ds, {.epochs = 2, .verbose = 0, .workers = 2, .shuffle = false, .seed = 11});
    const auto w = flat_weights(*m), wr = flat_weights(*ref);
    const double diff = max_abs_diff(w, wr), tol = weight_tolerance("float32", wr);
    MESSAGE("dataset on ", d.str(), ": max |w(2 ranks) - w(1 process, double batch)| = ", diff, " (tolerance ", tol, ")");
    CHECK(diff <= tol);
    CHECK(same_on_all_ranks(w));
    // Batch 0 read up front on each rank, then each epoch's share.
    std::vector<std::int64_t> mine(ds.asked.begin() + 1, ds.asked.end());
    std::sort(mine.begin(), mine.end());
    dist::DataParallel dp;
    const auto n_all = dp.all_reduce({static_cast<double>(mine.size())})[0];
    CHECK(n_all == 2 * 21);  // 2 epochs of 21 batches over the ranks
    std::vector<double> counts(21, 0.0);
    for (std::int64_t i : mine) counts[static_cast<std::size_t>(i)] += 1;
    const auto total = dp.all_reduce(counts);
    for (double c : total) CHECK(c == 2.0);  // every batch once per epoch, on one rank
    for (std::int64_t i : mine) CHECK(i % 2 == dist::rank());  // rank r takes positions g·2 + r
    // Shuffled: the same permutation on every rank, still disjoint and covering.
    RecordingDataset shuffled(x, y, 64);
    m->fit(shuffled, {.epochs = 1, .verbose = 0, .seed = 3});
    std::vector<double> seen(21, 0.0);
    for (auto it = shuffled.asked.begin() + 1; it != shuffled.asked.end(); ++it) seen[static_cast<std::size_t>(*it)] += 1;
    for (double c : dp.all_reduce(seen)) CHECK(c == 1.0);
  });
}

TEST_CASE("an inf/NaN gradient on one rank only: every rank skips the step and halves the scale") {
  for_each_device([&](Device d) {
    PolicyDeviceScope scope("mixed_float16", d);
    auto [x, y] = make_data(4 * 64, 6);
    set_random_seed(3);
    Sequential m({layers::Input({16}), layers::Dense(16, {.activation = "relu"}),
                  std::make_shared<PoisonOnRank>(1, 2), layers::Dense(4), layers::Activation("softmax")});
    m.compile({.optimizer = opt::SGD({.learning_rate = 0.1}), .loss = "sparse_categorical_crossentropy",
               .distribution = dist::DataParallel()});
    auto probe = std::make_shared<WeightsAround>();
    const History h = m.fit(x, y, {.batch_size = 64, .epochs = 1, .verbose = 0, .callbacks = {probe}, .shuffle = false});
    CHECK(h.history.at("skipped_steps")[0] == 1.0);
    CHECK(h.history.at("loss_scale")[0] == 16384.0);  // 32768 halved once, on every rank
    REQUIRE(probe->before.size() == 4);
    CHECK(probe->before[2] == probe->after[2]);  // the poisoned step changed nothing
    CHECK(probe->before[1] != probe->after[1]);  // the others trained
    CHECK(probe->before[3] != probe->after[3]);
    CHECK(m.loss_scale_optimizer()->skipped_steps() == 1);
    CHECK(same_on_all_ranks(flat_weights(m)));
  });
}

TEST_CASE("custom GradientTape loop: all_reduce_gradients and broadcast_variables") {
  for_each_device([&](Device d) {
    PolicyDeviceScope scope("float32", d);
    auto [x, y] = make_data(128, 8);
    auto ref = mlp(4), m = mlp(4 + static_cast<std::uint64_t>(dist::rank()));
    dist::DataParallel dp;
    ref->build({16});
    m->build({16});
    dp.broadcast_variables(m->variables());
    CHECK(flat_weights(*m) == flat_weights(*ref));
    losses::SparseCategoricalCrossentropy loss_fn;
    opt::SGDOptimizer o1({.learning_rate = 0.5}), o2({.learning_rate = 0.5});
    const auto [b, e] = dp.shard(128);
    for (int step = 0; step < 5; ++step) {
      std::vector<Tensor> g;
      {
        GradientTape tape;
        g = tape.gradient(loss_fn(y.slice(b, e).to(d), (*m)(x.slice(b, e).to(d), {.training = true})),
                          m->trainable_variables());
      }
      g = dp.all_reduce_gradients(g);  // equal shares: the mean
      o1.apply_gradients(g, m->trainable_variables());
      std::vector<Tensor> gr;
      {
        GradientTape tape;
        gr = tape.gradient(loss_fn(y.to(d), (*ref)(x.to(d), {.training = true})), ref->trainable_variables());
      }
      o2.apply_gradients(gr, ref->trainable_variables());
    }
    CHECK(max_abs_diff(flat_weights(*m), flat_weights(*ref)) <= 1e-5);
    CHECK(same_on_all_ranks(flat_weights(*m)));
  });
}

TEST_CASE("evaluate and predict share the rows and agree with one process") {
  for_each_device([&](Device d) {
    PolicyDeviceScope scope("float32", d);
    auto [x, y] = make_data(301, 9);  // 301 rows: shares of 150 and 151
    auto m = mlp(12);
    m->compile(sgd(dist::DataParallel()));
    auto ref = mlp(12);
    ref->compile(sgd());
    const auto scores = m->evaluate(x, y, {.batch_size = 64}), ref_scores = ref->evaluate(x, y, {.batch_size = 64});
    CHECK(scores.at("loss") == doctest::Approx(ref_scores.at("loss")).epsilon(1e-6));
    CHECK(scores.at("accuracy") == doctest::Approx(ref_scores.at("accuracy")).epsilon(1e-12));
    const Tensor p = m->predict(x, {.batch_size = 64}), pr = ref->predict(x, {.batch_size = 64});
    CHECK(p.shape() == pr.shape());
    CHECK(p.device() == Device::cpu());
    CHECK(max_abs_diff(p.to_vector<double>(), pr.to_vector<double>()) <= 1e-6);
  });
}

TEST_CASE("evaluate and predict on a Dataset shard its batches (rank r: r, r + W, ...) and agree with one process") {
  for_each_device([&](Device d) {
    PolicyDeviceScope scope("float32", d);
    auto [x, y] = make_data(5 * 64 + 17, 13);  // 6 batches, the last of 17 rows: unequal shares
    auto m = mlp(14);
    m->compile(sgd(dist::DataParallel()));
    auto ref = mlp(14);
    ref->compile(sgd());
    dist::DataParallel dp;
    for (std::optional<std::int64_t> steps : {std::optional<std::int64_t>{}, std::optional<std::int64_t>{5},
                                              std::optional<std::int64_t>{1}}) {
      CAPTURE(steps.value_or(-1));
      const std::int64_t batches = steps.value_or(6), rows = std::min<std::int64_t>(batches * 64, x.shape()[0]);
      RecordingDataset ds(x, y, 64);
      const auto scores = m->evaluate(ds, {.workers = 1, .steps = steps});
      const auto ref_scores = ref->evaluate(x.slice(0, rows), y.slice(0, rows), {.batch_size = 64});
      // Over the whole dataset, weighted by rows (not the mean of the ranks' means).
      CHECK(scores.at("loss") == doctest::Approx(ref_scores.at("loss")).epsilon(1e-6));
      CHECK(scores.at("accuracy") == doctest::Approx(ref_scores.at("accuracy")).epsilon(1e-12));
      CHECK(same_on_all_ranks({scores.at("loss"), scores.at("accuracy")}));
      // Batch 0 read up front on every rank, then this rank's positions.
      std::vector<double> counts(static_cast<std::size_t>(batches), 0.0);
      for (auto it = ds.asked.begin() + 1; it != ds.asked.end(); ++it) {
        CHECK(*it % 2 == dist::rank());
        counts[static_cast<std::size_t>(*it)] += 1;
      }
      for (double c : dp.all_reduce(counts)) CHECK(c == 1.0);
      RecordingDataset pds(x, y, 64);
      const Tensor p = m->predict(pds, {.steps = steps});
      const Tensor pr = ref->predict(x.slice(0, rows), {.batch_size = 64});
      CHECK(p.shape() == pr.shape());
      CHECK(p.device() == Device::cpu());
      CHECK(max_abs_diff(p.to_vector<double>(), pr.to_vector<double>()) <= 1e-6);  // in the dataset's order
      std::vector<double> pcounts(static_cast<std::size_t>(batches), 0.0);
      for (std::int64_t i : pds.asked) pcounts[static_cast<std::size_t>(i)] += 1;
      // Each batch predicted once (with one batch, the rank without one also reads batch 0 for the
      // outputs' shapes).
      const auto pc = dp.all_reduce(pcounts);
      if (batches > 1)
        for (double c : pc) CHECK(c == 1.0);
    }
  });
}

TEST_CASE("sample weights and class weights shard with their rows; steps_per_epoch and weighted validation agree") {
  for_each_device([&](Device d) {
    PolicyDeviceScope scope("float32", d);
    auto [x, y] = make_data(301, 21);  // a last batch of 45 rows: shares of 22 and 23
    const Tensor w = Tensor::random_uniform({301}, 0, 2, 22, float32, Device::cpu());
    const Tensor vx = x.slice(0, 50), vy = y.slice(0, 50), vw = w.slice(0, 50);
    for (const bool class_weighted : {false, true}) {
      CAPTURE(class_weighted);
      FitOptions o{.batch_size = 64, .epochs = 4, .verbose = 0, .validation_data = std::make_pair(vx, vy),
                   .validation_sample_weight = vw, .steps_per_epoch = 3, .validation_batch_size = 16,
                   .validation_freq = 2};
      o.seed = 23;
      if (class_weighted) o.class_weight = {{0, 0.5}, {3, 4.0}};
      else o.sample_weight = w;
      auto ref = mlp(24);
      ref->compile(sgd());
      const History hr = ref->fit(x, y, o);
      auto m = mlp(24);
      m->compile(sgd(dist::DataParallel()));
      const History h = m->fit(x, y, o);
      CHECK(max_abs_diff(flat_weights(*m), flat_weights(*ref)) <= 1e-5);
      CHECK(same_on_all_ranks(flat_weights(*m)));
      REQUIRE(h.history.at("loss").size() == 4);
      REQUIRE(h.history.at("val_loss").size() == 2);
      for (std::size_t e = 0; e < 4; ++e)
        CHECK(h.history.at("loss")[e] == doctest::Approx(hr.history.at("loss")[e]).epsilon(1e-5));
      for (std::size_t e = 0; e < 2; ++e)
        CHECK(h.history.at("val_loss")[e] == doctest::Approx(hr.history.at("val_loss")[e]).epsilon(1e-5));
      const double weighted = m->evaluate(x, y, {.batch_size = 64, .sample_weight = w}).at("loss");
      CHECK(weighted == doctest::Approx(ref->evaluate(x, y, {.batch_size = 64, .sample_weight = w}).at("loss")).epsilon(1e-5));
    }
  });
}

TEST_CASE("a stop on one rank stops every rank; chief-only callbacks run on rank 0") {
  PolicyDeviceScope scope("float32", Device::cpu());
  auto [x, y] = make_data(256, 10);
  auto m = mlp(13);
  m->compile(sgd(dist::DataParallel()));
  auto stopper = std::make_shared<callbacks::LambdaCallback>();
  stopper->epoch_end = [&](int epoch, const Logs&) {
    if (dist::rank() == 1 && epoch == 1) m->stop_training = true;
  };
  const std::string csv = "mpi_history_" + std::to_string(dist::size()) + ".csv";
  const History h = m->fit(x, y, {.batch_size = 64, .epochs = 5, .verbose = 0,
                                 .callbacks = {stopper, std::make_shared<callbacks::CSVLogger>(csv)}});
  CHECK(h.epoch.size() == 2);  // epochs 0 and 1, on every rank
  dist::world()->barrier();
  std::ifstream in(csv);
  int lines = 0;
  for (std::string l; std::getline(in, l);) ++lines;
  CHECK(lines == 3);  // header + 2 epochs, written once (by rank 0)
}

TEST_CASE("SyncBatchNorm: statistics over the global batch match one process") {
  for_each_device([&](Device d) {
    PolicyDeviceScope scope("float32", d);
    auto [x, y] = make_data(10 * 128, 14);
    auto ref = mlp(15, true);
    ref->compile(sgd());
    ref->fit(x, y, {.batch_size = 128, .epochs = 1, .verbose = 0, .seed = 3});
    auto synced = mlp(15, true), local = mlp(15, true);
    synced->compile(sgd(dist::DataParallel({.sync_batch_norm = true})));
    synced->fit(x, y, {.batch_size = 128, .epochs = 1, .verbose = 0, .seed = 3});
    local->compile(sgd(dist::DataParallel()));
    local->fit(x, y, {.batch_size = 128, .epochs = 1, .verbose = 0, .seed = 3});
    const double sync_diff = max_abs_diff(flat_weights(*synced), flat_weights(*ref));
    const double local_diff = max_abs_diff(flat_weights(*local), flat_weights(*ref));
    MESSAGE("BatchNormalization on ", d.str(), ": synced ", sync_diff, ", local ", local_diff);
    CHECK(sync_diff <= 1e-4);
    CHECK(local_diff > 10 * sync_diff);  // local statistics are a different computation
    CHECK(same_on_all_ranks(flat_weights(*synced)));
  });
}

TEST_CASE("models that differ across ranks are an error at the start of fit, on every rank") {
  PolicyDeviceScope scope("float32", Device::cpu());
  const auto data = make_data(128, 16);  // no structured binding: the lambdas below use x and y
  const Tensor x = data.first, y = data.second;
  auto m = mlp(17, false, dist::rank() == 1 ? 33 : 32);
  m->compile(sgd(dist::DataParallel()));
  const std::string err = error_of([&] { m->fit(x, y, {.batch_size = 64, .epochs = 1, .verbose = 0}); });
  CHECK(contains(err, "differ between rank 0 and rank 1"));
  CHECK(contains(err, "'dense/kernel (16, 32) float32' on rank 0 and 'dense/kernel (16, 33) float32' on rank 1"));
  // Different data sizes too.
  auto m2 = mlp(17);
  m2->compile(sgd(dist::DataParallel()));
  const std::int64_t n = dist::rank() == 1 ? 100 : 128;
  const std::string err2 = error_of([&] { m2->fit(x.slice(0, n), y.slice(0, n), {.batch_size = 64, .verbose = 0}); });
  CHECK(contains(err2, "training samples"));
}

// Checkpoints do not depend on the number of ranks. This job saves after epoch 1 and records
// epochs 2 and 3; each rank then resumes alone (one process) and must continue the same curve.
// tests/CMakeLists.txt then resumes the same file on 4 ranks (the next test case).
TEST_CASE("a checkpoint saved by 2 ranks resumes on 1 with the same loss curve") {
  for_each_device([&](Device d) {
    PolicyDeviceScope scope("mixed_float16", d);
    auto [x, y] = make_data(8 * 128, 18);
    const std::string path = "mpi_checkpoint_" + d.str() + ".h5";
    auto m = mlp(19);
    m->compile({.optimizer = opt::Adam({.learning_rate = 1e-2}), .loss = "sparse_categorical_crossentropy",
                .distribution = dist::DataParallel()});
    m->fit(x, y, {.batch_size = 128, .epochs = 1, .verbose = 0});
    m->save(path);
    dist::world()->barrier();  // rank 0 wrote it
    const History h = m->fit(x, y, {.batch_size = 128, .epochs = 3, .verbose = 0, .initial_epoch = 1});
    auto r = load_model(path);
    REQUIRE(r->distribution() == nullptr);  // one process: no strategy in force
    const History hr = r->fit(x, y, {.batch_size = 128, .epochs = 3, .verbose = 0, .initial_epoch = r->epoch()});
    REQUIRE(hr.history.at("loss").size() == 2);
    for (int e = 0; e < 2; ++e)
      CHECK(hr.history.at("loss")[e] == doctest::Approx(h.history.at("loss")[e]).epsilon(2e-3));
    CHECK(hr.history.at("loss_scale") == h.history.at("loss_scale"));
    if (dist::rank() == 0 && d.is_cpu()) {
      std::ofstream out("mpi_checkpoint_expected.txt");
      out.precision(17);
      out << h.history.at("loss")[0] << ' ' << h.history.at("loss")[1] << '\n';
    }
    dist::world()->barrier();
  });
}

TEST_CASE("4 ranks: the checkpoint saved by 2 ranks resumes with the same loss curve" * doctest::skip(true)) {
  // Run only by the 4-rank CTest (-tc with --no-skip), after the 2-rank one wrote the files.
  REQUIRE(dist::size() == 4);
  PolicyDeviceScope scope("mixed_float16", Device::cpu());
  auto [x, y] = make_data(8 * 128, 18);
  std::ifstream in("mpi_checkpoint_expected.txt");
  REQUIRE(in.good());
  double l2 = 0, l3 = 0;
  in >> l2 >> l3;
  auto r = load_model("mpi_checkpoint_cpu.h5");
  dist::set_strategy(dist::DataParallel());
  REQUIRE(r->distribution() != nullptr);
  const History h = r->fit(x, y, {.batch_size = 128, .epochs = 3, .verbose = 0, .initial_epoch = r->epoch()});
  dist::set_strategy(std::nullopt);
  CHECK(h.history.at("loss")[0] == doctest::Approx(l2).epsilon(2e-3));
  CHECK(h.history.at("loss")[1] == doctest::Approx(l3).epsilon(2e-3));
  CHECK(same_on_all_ranks(flat_weights(*r)));
}
