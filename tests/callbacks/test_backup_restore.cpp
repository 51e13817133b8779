// BackupAndRestore: a fit killed with SIGKILL mid-epoch (a child process of this test, killed by
// its own callback) and started again ends with the weights of an uninterrupted run, bit for bit
// (dropout's random streams, Adam's slots and the batch order restored); an interrupted fit
// resumes at the epoch after its last backup; the backup goes away when fit completes.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "io/checkpoint_util.hpp"
#include "test_util.hpp"

extern char** environ;

using namespace mpt;
namespace layers = mpt::layers;

namespace {

constexpr int kEpochs = 4;
constexpr int kKillEpoch = 2, kKillBatch = 5;  // 13 batches per epoch

std::pair<Tensor, Tensor> regression_data() {
  const Tensor x = Tensor::random_uniform({200, 6}, -1, 1, 17, float32, Device::cpu());
  const Tensor y = ops::sum(ops::mul(x, x), {1}, true);
  return {x, y};
}

std::unique_ptr<Sequential> make_model() {
  set_random_seed(5);
  auto m = std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      layers::Input({6}), layers::Dense(16, {.activation = "relu"}), layers::Dropout(0.3), layers::Dense(1)});
  m->compile({.optimizer = optimizers::Adam({.learning_rate = 0.01}), .loss = "mse"});
  return m;
}

FitOptions fit_options(std::vector<callbacks::CallbackArg> cbs) {
  return {.batch_size = 16, .epochs = kEpochs, .verbose = 0, .callbacks = std::move(cbs)};
}

std::vector<std::vector<float>> weights_of(const Model& m) {
  std::vector<std::vector<float>> out;
  for (const auto& v : m.variables()) out.push_back(v.value().to_vector<float>());
  return out;
}

/// Kills this process (no cleanup, no flush: as a preempted machine) after a given batch.
struct KillAt : callbacks::Callback {
  int epoch = -1;
  void on_epoch_begin(int e, const Logs&) override { epoch = e; }
  void on_train_batch_end(std::int64_t batch, const Logs&) override {
    if (epoch == kKillEpoch && batch == kKillBatch) ::kill(::getpid(), SIGKILL);
  }
};

/// Throws at the start of an epoch (an interrupted fit that unwinds).
struct ThrowAt : callbacks::Callback {
  int at;
  explicit ThrowAt(int e) : at(e) {}
  void on_epoch_begin(int e, const Logs&) override {
    if (e == at) throw Error("interrupted");
  }
};

}  // namespace

namespace mpt::test {
/// The child process of the SIGKILL test: trains with backups every 4 batches until KillAt kills it.
void before_tests() {
  const char* dir = std::getenv("MPT_BACKUP_CHILD");
  if (!dir) return;
  auto m = make_model();
  const auto [x, y] = regression_data();
  m->fit(x, y, fit_options({callbacks::BackupAndRestore(dir, {.save_freq = std::int64_t{4}}), KillAt()}));
  std::_Exit(3);  // not reached: KillAt killed the process
}
}  // namespace mpt::test

TEST_CASE("a fit killed with SIGKILL mid-epoch resumes from its backup and ends with the uninterrupted weights") {
  const auto [x, y] = regression_data();
  auto whole = make_model();
  whole->fit(x, y, fit_options({}));
  const auto want = weights_of(*whole);

  test::ScratchDir dir("backup");
  const std::string backup = dir / "backup";
  // The child: this program again, told by the environment to train and be killed.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  env_strings.push_back("MPT_BACKUP_CHILD=" + backup);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<char*> argv{self.data(), nullptr};
  pid_t pid = 0;
  REQUIRE(::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data()) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  REQUIRE(std::filesystem::exists(backup + "/latest.mpt.h5"));

  // Started again, as after the crash: same model, compile and fit arguments.
  auto again = make_model();
  callbacks::BackupAndRestore restore(backup, {.save_freq = std::int64_t{4}});
  auto shared = std::make_shared<callbacks::BackupAndRestore>(restore);
  History h = again->fit(x, y, fit_options({shared}));
  CHECK(shared->resumed_from().first == kKillEpoch);
  CHECK(shared->resumed_from().second > 0);
  CHECK(shared->resumed_from().second <= kKillBatch + 1);
  CHECK(h.epoch == std::vector<int>{2, 3});
  CHECK(weights_of(*again) == want);
  CHECK_FALSE(std::filesystem::exists(backup + "/latest.mpt.h5"));  // delete_checkpoint
}

TEST_CASE("an interrupted fit resumes at the epoch after its last backup; a finished one starts afresh") {
  const auto xy = regression_data();  // no structured bindings: clang 14's doctest macros capture them
  const Tensor& x = xy.first;
  const Tensor& y = xy.second;
  auto whole = make_model();
  whole->fit(x, y, fit_options({}));
  test::ScratchDir dir("backup-epoch");
  const std::string backup = dir / "b";
  auto first = make_model();
  CHECK_THROWS_WITH_AS(first->fit(x, y, fit_options({callbacks::BackupAndRestore(backup), ThrowAt(3)})),
                       doctest::Contains("interrupted"), Error);
  auto second = make_model();
  auto cb = std::make_shared<callbacks::BackupAndRestore>(backup, callbacks::BackupAndRestoreOptions{
                                                                      .delete_checkpoint = false});
  History h = second->fit(x, y, fit_options({cb}));
  CHECK(cb->resumed_from() == std::pair<int, std::int64_t>{3, 0});
  CHECK(h.epoch == std::vector<int>{3});
  CHECK(weights_of(*second) == weights_of(*whole));
  CHECK(std::filesystem::exists(backup + "/latest.mpt.h5"));  // kept: delete_checkpoint = false

  // Bad arguments and a model that does not match the backup.
  CHECK_THROWS_WITH_AS(callbacks::BackupAndRestore(""), doctest::Contains("backup_dir"), Error);
  CHECK_THROWS_WITH_AS(callbacks::BackupAndRestore(backup, {.save_freq = std::string("batch")}),
                       doctest::Contains("save_freq"), Error);
  set_random_seed(5);
  Sequential other({layers::Input({6}), layers::Dense(8), layers::Dense(1)});
  other.compile({.optimizer = optimizers::Adam(), .loss = "mse"});
  CHECK_THROWS_AS(other.fit(x, y, fit_options({callbacks::BackupAndRestore(backup)})), Error);
}
