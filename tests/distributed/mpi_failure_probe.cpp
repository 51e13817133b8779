// A 2-rank job in which rank 1 fails in a chosen way during fit; tests/distributed/
// run_failure.cmake runs it under mpirun and checks that the job ends, with rank 0 stopped by an
// mpt::Error where that rank lives to say so, never hanging.
//   mpi_failure_probe throw   rank 1 throws in a callback: rank 0 hears of it at once
//   mpi_failure_probe stall   rank 1 stops taking part: rank 0 times out (MPT_DISTRIBUTED_TIMEOUT)
//   mpi_failure_probe leave   rank 1 leaves the job early, cleanly (exit(0), MPI_Finalize): rank 0
//                             ends with an mpt::Error
//   mpi_failure_probe exit    rank 1 dies (_Exit(3), no MPI_Finalize): the launcher ends the job
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <mpt/mpt.hpp>

using namespace mpt;
namespace dist = mpt::distributed;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "throw" && mode != "stall" && mode != "leave" && mode != "exit") {
    std::fprintf(stderr, "usage: mpi_failure_probe throw|stall|leave|exit\n");
    return 2;
  }
  dist::initialize();
  const int rank = dist::rank();
  set_random_seed(1);
  Sequential m({layers::Input({8}), layers::Dense(16, {.activation = "relu"}), layers::Dense(2),
                layers::Activation("softmax")});
  m.compile({.optimizer = "sgd", .loss = "sparse_categorical_crossentropy", .distribution = dist::DataParallel()});
  Tensor x = Tensor::random_uniform({256, 8}, 0, 1, 2);
  Tensor y = ops::cast(Tensor::random_uniform({256}, 0, 1.99, 3), int32);
  auto fault = std::make_shared<callbacks::LambdaCallback>();
  fault->batch_begin = [&](std::int64_t step, const Logs&) {
    if (rank != 1 || step != 3) return;
    if (mode == "throw") fail("injected failure on rank 1");
    if (mode == "stall") std::this_thread::sleep_for(std::chrono::seconds(120));
    if (mode == "leave") std::exit(0);
    if (mode == "exit") std::_Exit(3);
  };
  const auto start = std::chrono::steady_clock::now();
  try {
    m.fit(x, y, {.batch_size = 32, .epochs = 1000, .verbose = 0, .callbacks = {fault}});
    std::printf("rank %d: fit ended without an error\n", rank);
    return 1;
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d: mpt::Error after %.1f s: %s\n", rank, s, e.what());
    std::fflush(stdout);
    // The failed rank lingers so that rank 0 reports before the launcher ends the job.
    if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(5));
    return 0;
  }
}
