// The test device itself: host access to its memory outside a backend call faults, copies
// count, and ops on it give the CPU's results.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;

TEST_CASE("host code that touches test-device memory is killed by a protection fault") {
  REQUIRE(test_device_registered());
  Tensor t = Tensor::ones({1024}, float32, Device::test());
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // the child reads device memory the way a stray host loop would
    signal(SIGSEGV, SIG_DFL);  // die of the fault, without doctest's crash report
    volatile float v = *t.data<float>();
    (void)v;
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  // The same read through the backend is fine and counted.
  reset_transfers();
  CHECK(t.to_vector<float>() == std::vector<float>(1024, 1.0f));
  CHECK(transfers().to_host == 1);
  Tensor::from_vector(std::vector<float>{1, 2}, {2}, Device::test());
  CHECK(transfers().from_host == 1);
}

TEST_CASE("the same Philox stream on the CPU and the test device, any shape") {
  for (DType d : {float32, float16, bfloat16, float64}) {
    for (std::uint64_t offset : {0ull, 7ull}) {
      auto a = Tensor::random_normal({3, 1000}, 0.5, 2.0, 42, d, Device::cpu(), offset).to_vector<double>();
      auto b = Tensor::random_normal({3, 1000}, 0.5, 2.0, 42, d, Device::test(), offset).to_vector<double>();
      CHECK(a == b);
      // Element i is the same whatever the shape around it.
      auto c = Tensor::random_normal({3000}, 0.5, 2.0, 42, d, Device::test(), offset).to_vector<double>();
      CHECK(a == c);
      auto u = Tensor::random_uniform({5000}, -1, 3, 42, d, Device::cpu(), offset).to_vector<double>();
      auto v = Tensor::random_uniform({5000}, -1, 3, 42, d, Device::test(), offset).to_vector<double>();
      CHECK(u == v);
      CHECK(std::all_of(u.begin(), u.end(), [](double x) { return x >= -1 && x <= 3; }));
    }
  }
  CHECK(Tensor::random_uniform({64}, 0, 1, 1).to_vector<float>() != Tensor::random_uniform({64}, 0, 1, 2).to_vector<float>());
  CHECK(Tensor::random_uniform({64}, 0, 1, 1, float32, Device::cpu(), 1).to_vector<float>() !=
        Tensor::random_uniform({64}, 0, 1, 1, float32, Device::cpu(), 2).to_vector<float>());
}
