// CIFAR-10 binary batches.
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = mpt::fuzz::as_file(data, size, ".bin");
  mpt::fuzz::expect_clean([&] { mpt::datasets::cifar10::read_batch(path); });
  return 0;
}
