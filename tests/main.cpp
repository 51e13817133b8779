// The doctest main of every test program. A program whose tests all need a GPU defines
// mpt::test::needs_gpu() to return true; on a machine without one it exits with code 77, which
// CTest reports as "skipped" (SKIP_RETURN_CODE), never as passed. A program may define
// mpt::test::before_tests() to set up first (tests/distributed joins its MPI job there).
//
// Tests name their devices: for_each_device runs a test on the CPU, the test device and every
// GPU, PolicyDeviceScope sets one for a scope. Everything else runs on the CPU, so the default
// device is pinned to it here, whatever the machine has: on a GPU machine the library's default
// is cuda:0, and a test that fills a default-device tensor through a host pointer would write
// device memory from the host. automatic_default_device() keeps what the library chose.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <mpt/device.hpp>
#include <mpt/error.hpp>

namespace mpt::test {
__attribute__((weak)) bool needs_gpu() { return false; }
/// Runs before the tests (the MPI tests join their job here).
__attribute__((weak)) void before_tests() {}

namespace {
Device g_automatic = Device::cpu();
}
Device automatic_default_device() { return g_automatic; }
}  // namespace mpt::test

int main(int argc, char** argv) {
  if (mpt::test::needs_gpu() && mpt::cuda::device_count() == 0) {
    std::printf("skipped: this program needs a GPU (%s)\n", mpt::cuda::unavailable_reason().c_str());
    return 77;
  }
  try {
    mpt::test::g_automatic = mpt::default_device();
  } catch (const mpt::Error& e) {  // a bad MPT_DEVICE: said, and the tests run on the CPU
    std::printf("%s\n", e.what());
  }
  mpt::set_default_device(mpt::Device::cpu());
  mpt::test::before_tests();
  doctest::Context context(argc, argv);
  return context.run();
}
