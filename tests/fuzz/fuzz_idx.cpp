// The IDX reader (MNIST / Fashion-MNIST files, gzip or plain).
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = mpt::fuzz::as_file(data, size, ".idx");
  mpt::fuzz::expect_clean([&] { mpt::io::read_idx(path); });
  return 0;
}
