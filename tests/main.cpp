// The doctest main of every test program. A program whose tests all need a GPU defines
// mpt::test::needs_gpu() to return true; on a machine without one it exits with code 77, which
// CTest reports as "skipped" (SKIP_RETURN_CODE), never as passed. A program may define
// mpt::test::before_tests() to set up first (tests/distributed joins its MPI job there).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <mpt/device.hpp>

namespace mpt::test {
__attribute__((weak)) bool needs_gpu() { return false; }
/// Runs before the tests (the MPI tests join their job here).
__attribute__((weak)) void before_tests() {}
}  // namespace mpt::test

int main(int argc, char** argv) {
  if (mpt::test::needs_gpu() && mpt::cuda::device_count() == 0) {
    std::printf("skipped: this program needs a GPU (%s)\n", mpt::cuda::unavailable_reason().c_str());
    return 77;
  }
  mpt::test::before_tests();
  doctest::Context context(argc, argv);
  return context.run();
}
