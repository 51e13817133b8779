// NumPy .npy files.
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = mpt::fuzz::as_file(data, size, ".npy");
  mpt::fuzz::expect_clean([&] { mpt::io::load_npy(path, mpt::Device::cpu()); });
  return 0;
}
