// fit, evaluate and predict on a data::Dataset (Keras's PyDataset): the same weights as on the
// tensors, workers and their errors, no thread left behind, shuffling and on_epoch_end, endless
// datasets; memory-mapped .npy files, NpyDataset across shards, TokenWindows.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "test_util.hpp"

using namespace mpt;
namespace layers = mpt::layers;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<Model> classifier() {
  auto x = mpt::Input({6}, {.name = "x"});
  auto h = layers::Dense(8, {.activation = "tanh", .name = "d1"})(x);
  auto m = std::make_unique<Model>(x, layers::Dense(3, {.activation = "softmax", .name = "d2"})(h), "m");
  m->compile({.optimizer = optimizers::Adam({.learning_rate = 0.01}),
              .loss = "sparse_categorical_crossentropy",
              .metrics = {"accuracy"}});
  return m;
}

struct Data {
  Tensor x, y;
};
Data make_data(std::int64_t n) {
  Tensor x = Tensor::random_uniform({n, 6}, -1, 1, 5, float32, Device::cpu());
  std::vector<std::int32_t> labels;
  const auto xv = x.to_vector<float>();
  for (std::int64_t i = 0; i < n; ++i) labels.push_back(xv[i * 6] + xv[i * 6 + 1] > 0.3f ? 2 : xv[i * 6 + 2] > 0 ? 1 : 0);
  return {x, Tensor::from_vector(labels, {n}, Device::cpu())};
}

void check_same_weights(Model& a, Model& b) {
  const auto wa = a.get_weights(), wb = b.get_weights();
  REQUIRE(wa.size() == wb.size());
  for (std::size_t i = 0; i < wa.size(); ++i) CHECK(wa[i].to_vector<float>() == wb[i].to_vector<float>());
}

/// Threads of this process now.
int thread_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

/// Whether the thread count comes back to `want` within 2 s (the OpenMP teams the workers'
/// own parallel loops started end with them, a moment after the join).
bool threads_back_to(int want) {
  for (int i = 0; i < 200 && thread_count() > want; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return thread_count() <= want;
}

/// A TensorDataset that records what it is asked, can throw on one batch and can be slow.
class Recording : public data::TensorDataset {
 public:
  using TensorDataset::TensorDataset;
  data::Batch get(std::int64_t index) override {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    {
      std::lock_guard<std::mutex> lock(mutex);
      asked.push_back(index);
      if (index == throw_on) {
        thrown_at = Clock::now();
        throw Error("Recording: cannot read batch " + std::to_string(index));
      }
    }
    active.fetch_add(1);
    auto b = TensorDataset::get(index);
    active.fetch_sub(1);
    return b;
  }
  void on_epoch_end() override { ++epochs_ended; }
  std::mutex mutex;
  std::vector<std::int64_t> asked;
  std::int64_t throw_on = -1;
  int delay_ms = 0;
  Clock::time_point thrown_at;
  std::atomic<int> active{0};
  int epochs_ended = 0;
};

}  // namespace

TEST_CASE("fit, evaluate and predict on a Dataset give what they give on the tensors") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const Data d = make_data(100);
    for (int workers : {0, 2}) {
      CAPTURE(workers);
      set_random_seed(3);
      auto a = classifier();
      set_random_seed(3);
      auto b = classifier();
      check_same_weights(*a, *b);
      const History ha = a->fit(d.x, d.y, {.batch_size = 16, .epochs = 3, .verbose = 0, .shuffle = false});
      data::TensorDataset ds(d.x, d.y, 16);
      const History hb = b->fit(ds, {.epochs = 3, .verbose = 0, .workers = workers, .max_queue_size = 3, .shuffle = false});
      check_same_weights(*a, *b);  // bit for bit
      CHECK(ha.history.at("loss") == hb.history.at("loss"));
      CHECK(ha.history.at("accuracy") == hb.history.at("accuracy"));
      const auto ea = a->evaluate(d.x, d.y, {.batch_size = 16});
      const auto eb = b->evaluate(ds, {.workers = workers});
      CHECK(ea.at("loss") == eb.at("loss"));
      CHECK(ea.at("accuracy") == eb.at("accuracy"));
      const Tensor pa = a->predict(d.x, {.batch_size = 16}), pb = b->predict(ds, {.workers = workers});
      CHECK(pb.device().is_cpu());
      CHECK(pa.to(Device::cpu()).to_vector<float>() == pb.to_vector<float>());
    }
  });
}

TEST_CASE("fit on a Dataset: validation_dataset, sample weights from the batches, steps_per_epoch") {
  const Data d = make_data(64), v = make_data(32);
  set_random_seed(4);
  auto a = classifier();
  set_random_seed(4);
  auto b = classifier();
  Tensor w = Tensor::random_uniform({64}, 0.5, 2, 9, float32, Device::cpu());
  const History ha = a->fit(d.x, d.y, {.batch_size = 16, .epochs = 2, .verbose = 0,
                                       .validation_data = std::pair{v.x, v.y}, .shuffle = false, .sample_weight = w,
                                       .steps_per_epoch = 3});
  data::TensorDataset train(d.x, d.y, 16, w), val(v.x, v.y, 16);
  const History hb = b->fit(train, {.epochs = 2, .verbose = 0, .workers = 1, .validation_dataset = &val,
                                    .shuffle = false, .steps_per_epoch = 3});
  check_same_weights(*a, *b);
  CHECK(ha.history.at("val_loss") == hb.history.at("val_loss"));
  CHECK(ha.history.at("loss") == hb.history.at("loss"));
}

TEST_CASE("fit on a Dataset: each epoch a seeded permutation of the batches, on_epoch_end after each") {
  const Data d = make_data(80);
  auto m = classifier();
  Recording ds(d.x, d.y, 8);  // 10 batches
  m->fit(ds, {.epochs = 3, .verbose = 0, .workers = 2, .seed = 11});
  REQUIRE(ds.asked.size() == 1 + 30);  // batch 0 read once up front, then 3 epochs
  CHECK(ds.epochs_ended == 3);
  for (int e = 0; e < 3; ++e) {
    std::vector<std::int64_t> got(ds.asked.begin() + 1 + e * 10, ds.asked.begin() + 1 + (e + 1) * 10);
    std::sort(got.begin(), got.end());
    std::vector<std::int64_t> all(10);
    std::iota(all.begin(), all.end(), 0);
    CHECK(got == all);  // every batch once per epoch
  }
  // Without workers the order is exactly the permutation of the seed and the epoch.
  Recording sync(d.x, d.y, 8);
  auto m2 = classifier();
  m2->fit(sync, {.epochs = 2, .verbose = 0, .seed = 11});
  for (int e = 0; e < 2; ++e) {
    const auto want = data::permutation(10, 11 + static_cast<std::uint64_t>(e));
    CHECK(std::vector<std::int64_t>(sync.asked.begin() + 1 + e * 10, sync.asked.begin() + 1 + (e + 1) * 10) == want);
  }
}

TEST_CASE("a Dataset of unknown size trains steps_per_epoch batches an epoch, its index going on") {
  const Data d = make_data(64);
  struct Endless : data::Dataset {
    Tensor x, y;
    std::vector<std::int64_t> asked;
    std::int64_t size() const override { return -1; }
    data::Batch get(std::int64_t index) override {
      asked.push_back(index);
      const std::int64_t b = (index % 8) * 8;
      return {x.slice(b, b + 8), y.slice(b, b + 8), Tensor()};
    }
  } ds;
  ds.x = d.x, ds.y = d.y;
  auto m = classifier();
  CHECK_THROWS_WITH_AS(m->fit(ds, {.epochs = 1, .verbose = 0}), doctest::Contains("steps_per_epoch"), Error);
  ds.asked.clear();
  m->fit(ds, {.epochs = 2, .verbose = 0, .steps_per_epoch = 5});
  CHECK(ds.asked == std::vector<std::int64_t>{0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK_THROWS_WITH_AS(m->evaluate(ds), doctest::Contains("give steps"), Error);
  CHECK(m->predict(ds, {.steps = 3}).shape() == Shape{24, 3});
}

TEST_CASE("a worker's error reaches fit at once, as an mpt::Error naming the batch") {
  const Data d = make_data(400);
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    auto m = classifier();
    Recording ds(d.x, d.y, 8);  // 50 batches
    ds.throw_on = 17;
    ds.delay_ms = 5;
    const int before = thread_count();
    std::string message;
    Clock::time_point caught;
    try {
      m->fit(ds, {.epochs = 1, .verbose = 0, .workers = workers, .max_queue_size = 4, .shuffle = false});
    } catch (const Error& e) {
      caught = Clock::now();
      message = e.what();
    }
    CHECK(message.find("batch 17") != std::string::npos);
    CHECK(message.find("Recording: cannot read batch 17") != std::string::npos);
    const double seconds = std::chrono::duration<double>(caught - ds.thrown_at).count();
    CHECK(seconds >= 0);
    CHECK(seconds < 1.0);
    CHECK(threads_back_to(before));  // the workers are gone
    CHECK(ds.active.load() == 0);
  }
}

TEST_CASE("a fit stopped early, by EarlyStopping or in the middle of an epoch, leaves no worker running") {
  const Data d = make_data(400);
  auto m = classifier();
  m->fit(d.x, d.y, {.epochs = 1, .verbose = 0});  // OpenMP's threads exist from here on
  const int before = thread_count();
  Recording ds(d.x, d.y, 8);
  ds.delay_ms = 2;
  const History h =
      m->fit(ds, {.epochs = 50, .verbose = 0, .workers = 3, .max_queue_size = 8,
                  .callbacks = {callbacks::EarlyStopping({.monitor = "loss", .min_delta = 10})}});
  CHECK(h.epoch.size() == 2);  // no improvement of 10 in epoch 2: stopped there (Keras's rule)
  CHECK(threads_back_to(before));
  CHECK(ds.active.load() == 0);
  // Stopped at batch 3 of 50 while the workers were ahead.
  struct StopAt : callbacks::Callback {
    void on_train_batch_end(std::int64_t step, const Logs&) override {
      if (step == 3) model()->stop_training = true;
    }
  };
  Recording ds2(d.x, d.y, 8);
  m->fit(ds2, {.epochs = 5, .verbose = 0, .workers = 2, .callbacks = {std::make_shared<StopAt>()}});
  CHECK(threads_back_to(before));
  CHECK(ds2.asked.size() < 20u);  // the batch read up front, 4 trained, at most the queue ahead
}

TEST_CASE("a Dataset's bad batch is an mpt::Error: labels, rows, non-finite values, no y") {
  const Data d = make_data(32);
  auto m = classifier();
  struct Bad : data::Dataset {
    Tensor x, y;
    int kind = 0;
    std::int64_t size() const override { return 4; }
    data::Batch get(std::int64_t index) override {
      data::Batch b{x.slice(index * 8, index * 8 + 8), y.slice(index * 8, index * 8 + 8), Tensor()};
      if (index < 2) return b;
      if (kind == 0) b.y = Tensor::full({8}, 7, int32, Device::cpu());           // label 7 of 3 classes
      if (kind == 1) b.y = b.y.slice(0, 5);                                       // rows
      if (kind == 2) b.x = Tensor::full({8, 6}, std::nan(""), float32, Device::cpu());  // NaN
      if (kind == 3) b.y = Tensor();                                              // no y
      return b;
    }
  } ds;
  ds.x = d.x, ds.y = d.y;
  const char* want[] = {"7", "different numbers of rows", "NaN", "no y"};
  for (int k = 0; k < 4; ++k) {
    ds.kind = k;
    CAPTURE(k);
    CHECK_THROWS_WITH_AS(m->fit(ds, {.epochs = 1, .verbose = 0, .workers = 2, .shuffle = false}),
                         doctest::Contains(want[k]), Error);
  }
  CHECK_THROWS_WITH_AS(m->fit(ds, {.epochs = 1, .verbose = 0, .validation_split = 0.5}),
                       doctest::Contains("validation_dataset"), Error);
  CHECK_THROWS_WITH_AS(m->fit(ds, {.epochs = 1, .verbose = 0, .workers = -1}), doctest::Contains("workers"), Error);
}

TEST_CASE("load_npy with mmap: the file's bytes, mapped; copy-on-write; layouts it cannot map are refused") {
  const auto dir = std::filesystem::temp_directory_path() / ("mpt_mmap_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "x.npy").string();
  const Tensor x = Tensor::random_uniform({300, 7}, -1, 1, 2, float32, Device::cpu());
  io::save_npy(path, x);
  const std::size_t live = memory_stats(Device::cpu()).current_bytes;
  Tensor m = io::load_npy(path, {.mmap = true});
  CHECK(memory_stats(Device::cpu()).current_bytes == live);  // not the allocator's memory
  CHECK(m.shape() == x.shape());
  CHECK(m.dtype() == float32);
  CHECK(m.to_vector<float>() == x.to_vector<float>());
  CHECK(ops::sum(m).item() == doctest::Approx(ops::sum(x).item()));
  static_cast<float*>(m.data_ptr())[0] = 123.0f;  // a private copy of the page
  CHECK(io::load_npy(path, Device::cpu()).to_vector<float>() == x.to_vector<float>());
  m = Tensor();  // unmapped
  // Empty arrays map too; Fortran order and big-endian data are refused by name.
  io::save_npy((dir / "e.npy").string(), Tensor::zeros({0, 3}));
  CHECK(io::load_npy((dir / "e.npy").string(), {.mmap = true}).shape() == Shape{0, 3});
  {
    std::string header = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }";
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    std::string file = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header +
                       std::string(16, '\0');
    std::FILE* f = std::fopen((dir / "f.npy").string().c_str(), "wb");
    std::fwrite(file.data(), 1, file.size(), f);
    std::fclose(f);
  }
  CHECK_THROWS_WITH_AS(io::load_npy((dir / "f.npy").string(), {.mmap = true}), doctest::Contains("Fortran"), Error);
  CHECK(io::load_npy((dir / "f.npy").string(), {.mmap = false}).shape() == Shape{2, 2});
  CHECK_THROWS_AS(io::load_npy((dir / "missing.npy").string(), {.mmap = true}), Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("NpyDataset batches rows across shard boundaries; TokenWindows cuts shifted windows") {
  const auto dir = std::filesystem::temp_directory_path() / ("mpt_shards_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const Data d = make_data(50);
  std::vector<std::string> xs, ys;
  const std::int64_t cuts[] = {0, 13, 13, 40, 50};  // an empty shard too
  for (int s = 0; s < 4; ++s) {
    xs.push_back((dir / ("x" + std::to_string(s) + ".npy")).string());
    ys.push_back((dir / ("y" + std::to_string(s) + ".npy")).string());
    io::save_npy(xs.back(), d.x.slice(cuts[s], cuts[s + 1]));
    io::save_npy(ys.back(), d.y.slice(cuts[s], cuts[s + 1]));
  }
  data::NpyDataset shards(xs, ys, 8);
  CHECK(shards.rows() == 50);
  REQUIRE(shards.size() == 7);
  for (std::int64_t i = 0; i < 7; ++i) {
    const auto b = shards.get(i);
    const std::int64_t e = std::min<std::int64_t>(50, i * 8 + 8);
    CHECK(b.x.to_vector<float>() == d.x.slice(i * 8, e).to_vector<float>());
    CHECK(b.y.to_vector<std::int32_t>() == d.y.slice(i * 8, e).to_vector<std::int32_t>());
  }
  // Trains as the tensors do.
  set_random_seed(5);
  auto a = classifier();
  set_random_seed(5);
  auto b = classifier();
  a->fit(d.x, d.y, {.batch_size = 8, .epochs = 2, .verbose = 0, .shuffle = false});
  b->fit(shards, {.epochs = 2, .verbose = 0, .workers = 2, .shuffle = false});
  check_same_weights(*a, *b);
  io::save_npy((dir / "bad.npy").string(), Tensor::zeros({4, 5}));
  CHECK_THROWS_WITH_AS(data::NpyDataset({xs[0], (dir / "bad.npy").string()}, {}, 8), doctest::Contains("bad.npy"),
                       Error);

  // Tokens 0..99 as int64 on disk, memory-mapped.
  std::vector<std::int64_t> t(100);
  std::iota(t.begin(), t.end(), 0);
  io::save_npy((dir / "tokens.npy").string(), Tensor::from_vector(t, {100}, Device::cpu()));
  data::TokenWindows windows(io::load_npy((dir / "tokens.npy").string(), {.mmap = true}),
                             {.seq_len = 10, .batch_size = 4, .stride = 7});
  CHECK(windows.windows() == (100 - 11) / 7 + 1);
  const auto w1 = windows.get(1);  // windows 4..7
  CHECK(w1.x.shape() == Shape{4, 10});
  CHECK(w1.x.dtype() == int32);
  const auto xv = w1.x.to_vector<std::int32_t>(), yv = w1.y.to_vector<std::int32_t>();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 10; ++c) {
      CHECK(xv[r * 10 + c] == (4 + r) * 7 + c);
      CHECK(yv[r * 10 + c] == (4 + r) * 7 + c + 1);
    }
  data::TokenWindows shuffled(io::load_npy((dir / "tokens.npy").string(), {.mmap = true}),
                              {.seq_len = 10, .batch_size = 4, .shuffle = true, .seed = 3});
  std::set<std::int32_t> starts;
  for (std::int64_t i = 0; i < shuffled.size(); ++i) {
    const auto v = shuffled.get(i).x.to_vector<std::int32_t>();
    for (std::size_t r = 0; r < v.size(); r += 10) starts.insert(v[r]);
  }
  CHECK(starts.size() == static_cast<std::size_t>(shuffled.windows()));  // every window once
  CHECK_THROWS_WITH_AS(data::TokenWindows(Tensor::zeros({5}, int32, Device::cpu()), {.seq_len = 10}),
                       doctest::Contains("no window"), Error);
  std::filesystem::remove_all(dir);
}
