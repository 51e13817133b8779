// The TensorBoard callback: TFRecord framing and CRC-32C, and the event files a fit writes, read
// back with the library's TFRecord reader and the generated Event classes.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "src/callbacks/tensorboard/event.pb.h"
#include "callbacks/tensorboard/event_file.hpp"
#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;
namespace fs = std::filesystem;
namespace layers = mpt::layers;
namespace tb = mpt::tensorboard;

namespace {

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("mpt_test_tb_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

/// The events of the one event file in `dir`, its first record checked to be the version.
std::vector<tb::Event> read_events(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  REQUIRE(files.size() == 1);
  CHECK(files[0].filename().string().rfind("events.out.tfevents.", 0) == 0);
  CHECK(files[0].extension() == ".v2");
  std::vector<tb::Event> events;
  for (const auto& r : tb::read_tfrecords(files[0].string())) {
    tb::Event e;
    REQUIRE(e.ParseFromString(r));
    events.push_back(e);
  }
  REQUIRE(!events.empty());
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[0].wall_time() > 1.6e9);
  return events;
}

/// tag -> (step, simple_value) in file order.
std::map<std::string, std::vector<std::pair<std::int64_t, float>>> scalars(const std::vector<tb::Event>& events) {
  std::map<std::string, std::vector<std::pair<std::int64_t, float>>> out;
  for (const auto& e : events)
    if (e.has_summary())
      for (const auto& v : e.summary().value())
        if (v.has_simple_value()) out[v.tag()].emplace_back(e.step(), v.simple_value());
  return out;
}

std::map<std::string, std::vector<std::pair<std::int64_t, tb::HistogramProto>>> histograms(
    const std::vector<tb::Event>& events) {
  std::map<std::string, std::vector<std::pair<std::int64_t, tb::HistogramProto>>> out;
  for (const auto& e : events)
    if (e.has_summary())
      for (const auto& v : e.summary().value())
        if (v.has_histo()) out[v.tag()].emplace_back(e.step(), v.histo());
  return out;
}

std::pair<Tensor, Tensor> make_data(std::int64_t n) {
  Tensor x = Tensor::random_uniform({n, 16}, 0, 1, 11, float32, Device::cpu());
  auto v = x.to_vector<float>();
  std::vector<std::int32_t> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<std::int32_t>(v[i * 16] * 4);
  return {x, Tensor::from_vector(y, {n}, Device::cpu())};
}

std::unique_ptr<Sequential> small_model() {
  set_random_seed(3);
  auto m = std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      layers::Input({16}), layers::Dense(12, {.activation = "relu"}), layers::BatchNormalization(), layers::Dense(4),
      layers::Activation("softmax")});
  m->compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy", .metrics = {"accuracy"}});
  return m;
}

}  // namespace

TEST_CASE("crc32c matches the standard vectors and TFRecord frames round-trip") {
  const std::string digits = "123456789";
  CHECK(tb::crc32c(digits.data(), digits.size()) == 0xE3069283u);
  CHECK(tb::crc32c("", 0) == 0u);
  const std::vector<unsigned char> zeros(32, 0), ones(32, 0xff);
  CHECK(tb::crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);  // RFC 3720, B.4
  CHECK(tb::crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  std::vector<unsigned char> inc(32);
  std::iota(inc.begin(), inc.end(), 0);
  CHECK(tb::crc32c(inc.data(), inc.size()) == 0x46DD794Eu);
  // Incremental use continues the same checksum.
  CHECK(tb::crc32c(digits.data() + 4, 5, tb::crc32c(digits.data(), 4)) == 0xE3069283u);
  const std::uint32_t crc = 0xE3069283u;
  CHECK(tb::masked_crc32c(digits.data(), digits.size()) == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);

  TempDir dir("records");
  const fs::path file = dir.path / "r.tfrecord";
  {
    std::ofstream out(file, std::ios::binary);
    out << tb::tfrecord("hello") << tb::tfrecord("") << tb::tfrecord(std::string(1000, 'x'));
  }
  auto records = tb::read_tfrecords(file.string());
  REQUIRE(records.size() == 3);
  CHECK(records[0] == "hello");
  CHECK(records[1].empty());
  CHECK(records[2] == std::string(1000, 'x'));
  CHECK(fs::file_size(file) == 3 * 16 + 5 + 1000);
  {  // one flipped bit in the first record's data
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    f.put('H');
  }
  CHECK(contains(error_of([&] { tb::read_tfrecords(file.string()); }), "record 0: the data's CRC does not match"));
}

TEST_CASE("histograms use 30 equal buckets from min to max and leave non-finite values out") {
  std::vector<double> v;
  for (int i = 0; i < 300; ++i) v.push_back(i * 0.01 - 1.0);
  v.push_back(std::numeric_limits<double>::quiet_NaN());
  auto h = tb::histogram(v);
  CHECK(h.num == 300);
  CHECK(h.min == doctest::Approx(-1.0));
  CHECK(h.max == doctest::Approx(1.99));
  REQUIRE(h.bucket.size() == 30);
  REQUIRE(h.bucket_limit.size() == 30);
  CHECK(h.bucket_limit.back() == h.max);
  CHECK(std::accumulate(h.bucket.begin(), h.bucket.end(), 0.0) == 300);
  CHECK(std::is_sorted(h.bucket_limit.begin(), h.bucket_limit.end()));
  auto one = tb::histogram({2.5, 2.5});
  CHECK(one.num == 2);
  CHECK(std::accumulate(one.bucket.begin(), one.bucket.end(), 0.0) == 2);
  CHECK(tb::histogram({}).bucket.empty());
}

TEST_CASE("fit writes train and validation event files with Keras's tags, History's values and histograms") {
  for (const char* policy : {"float32", "mixed_float16"}) {
    CAPTURE(policy);
    PolicyDeviceScope scope(policy, Device::cpu());
    TempDir dir(std::string("fit_") + policy);
    auto [x, y] = make_data(100);
    auto m = small_model();
    auto cb = std::make_shared<callbacks::TensorBoard>(
        callbacks::TensorBoardOptions{.log_dir = dir.path.string(), .update_freq = 2, .histogram_freq = 2});
    // 80 training samples in batches of 16: 5 steps an epoch, 15 in all.
    History h = m->fit(x, y, {.batch_size = 16, .epochs = 3, .verbose = 0, .callbacks = {cb}, .validation_split = 0.2});
    CHECK(fs::path(cb->train_event_file()).parent_path() == dir.path / "train");
    CHECK(fs::path(cb->validation_event_file()).parent_path() == dir.path / "validation");

    auto train = read_events(dir.path / "train");
    auto val = read_events(dir.path / "validation");
    auto ts = scalars(train), vs = scalars(val);
    // Every History entry, per epoch, step = epoch: train/ for the training ones, validation/ for val_*.
    for (const auto& entry : h.history) {
      const std::string& key = entry.first;  // not a structured binding: clang 14 cannot capture those
      const std::vector<double>& values = entry.second;
      CAPTURE(key);
      const bool is_val = key.rfind("val_", 0) == 0;
      const std::string tag = "epoch_" + (is_val ? key.substr(4) : key);
      auto& got = is_val ? vs[tag] : ts[tag];
      REQUIRE(got.size() == values.size());
      for (std::size_t e = 0; e < values.size(); ++e) {
        CHECK(got[e].first == static_cast<std::int64_t>(e));
        CHECK(got[e].second == static_cast<float>(values[e]));
      }
    }
    for (const char* tag : {"epoch_loss", "epoch_accuracy", "epoch_learning_rate", "epoch_loss_scale", "epoch_skipped_steps"})
      CHECK(ts.count(tag));
    CHECK(vs.count("epoch_loss"));
    CHECK(vs.count("epoch_accuracy"));
    CHECK(vs.count("evaluation_loss_vs_iterations"));
    CHECK(vs["evaluation_loss_vs_iterations"].back().first == m->optimizer().iterations());
    CHECK(ts["epoch_loss_scale"].back().second == static_cast<float>(std::string(policy) == "mixed_float16" ? 32768.0 : 1.0));
    // Batch scalars every 2 batches of the 15, step = batches since fit began.
    for (const char* tag : {"batch_loss", "batch_accuracy"}) {
      CAPTURE(tag);
      REQUIRE(ts[tag].size() == 7);
      for (std::size_t i = 0; i < 7; ++i) CHECK(ts[tag][i].first == static_cast<std::int64_t>(2 * (i + 1)));
    }
    CHECK(ts.count("batch_loss_scale") == (std::string(policy) == "mixed_float16" ? 1u : 0u));
    // The last batch of an epoch carries the epoch's mean: batch 10 is epoch 1's last.
    CHECK(ts["batch_loss"][4].second == static_cast<float>(h.history["loss"][1]));

    // Histograms at epochs 0 and 2: every weight, and every trainable variable's gradient.
    auto hs = histograms(train);
    const auto vars = m->variables();
    for (const auto& v : vars) {
      CAPTURE(v.path());
      auto& got = hs[v.path() + "/histogram"];
      REQUIRE(got.size() == 2);
      CHECK(got[0].first == 0);
      CHECK(got[1].first == 2);
      const auto& p = got[1].second;
      CHECK(p.num() == static_cast<double>(v.numel()));
      CHECK(std::accumulate(p.bucket().begin(), p.bucket().end(), 0.0) == static_cast<double>(v.numel()));
      CHECK(p.bucket_size() == 30);
      CHECK(p.bucket_limit_size() == 30);
      auto w = v.value().to_vector<double>();  // the final weights are epoch 2's
      CHECK(p.min() == *std::min_element(w.begin(), w.end()));
      CHECK(p.max() == *std::max_element(w.begin(), w.end()));
      auto& grad = hs[v.path() + "/gradient/histogram"];
      CHECK(grad.size() == (v.trainable() ? 2u : 0u));
      if (v.trainable() && !grad.empty()) CHECK(grad[0].second.num() == static_cast<double>(v.numel()));
    }
    CHECK(hs.count("dense/kernel/histogram"));
    CHECK(hs.count("batch_normalization/moving_mean/histogram"));
  }
}

TEST_CASE("TensorBoard reads nothing extra from the device outside its update_freq batches and histogram epochs") {
  REQUIRE(test_device_registered());
  auto reads = [](std::optional<callbacks::TensorBoardOptions> o) {
    PolicyDeviceScope scope("mixed_float16", Device::test());
    TempDir dir("reads");
    auto [x, y] = make_data(80);
    auto m = small_model();
    std::vector<callbacks::CallbackArg> cbs;
    if (o) {
      o->log_dir = dir.path.string();
      cbs.emplace_back(callbacks::TensorBoard(*o));
    }
    reset_transfers();
    m->fit(x, y, {.batch_size = 16, .epochs = 2, .verbose = 0, .callbacks = cbs});
    return transfers().to_host;
  };
  const std::int64_t base = reads(std::nullopt);
  CHECK(reads(callbacks::TensorBoardOptions{}) == base);
  // 10 batches, logs of 5 of them (loss and accuracy: two reads each).
  CHECK(reads(callbacks::TensorBoardOptions{.update_freq = 2}) == base + 5 * 2);
  // Epoch 0: 6 weights (Dense, BN's 4, Dense: 2 + 4 + 2 = 8) and 6 gradients.
  CHECK(reads(callbacks::TensorBoardOptions{.histogram_freq = 2}) == base + 8 + 6);
}

TEST_CASE("TensorBoard errors name the callback and the path") {
  CHECK(contains(error_of([] { callbacks::TensorBoard({.update_freq = "sometimes"}); }), "TensorBoard: update_freq"));
  CHECK(contains(error_of([] { callbacks::TensorBoard({.update_freq = 0}); }), "TensorBoard: update_freq"));
  CHECK(contains(error_of([] { callbacks::TensorBoard({.histogram_freq = -1}); }), "TensorBoard: histogram_freq"));
  TempDir dir("unwritable");
  const fs::path blocker = dir.path / "a_file";
  std::ofstream(blocker) << "not a folder";
  Tensor x, y;
  std::tie(x, y) = make_data(32);
  auto m = small_model();
  const std::string log_dir = (blocker / "logs").string();
  auto msg = error_of([&] {
    m->fit(x, y, {.batch_size = 16, .epochs = 1, .verbose = 0, .callbacks = {callbacks::TensorBoard({.log_dir = log_dir})}});
  });
  CHECK(contains(msg, "TensorBoard"));
  CHECK(contains(msg, log_dir));
}
