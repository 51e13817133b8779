// mpt::load_model of full checkpoints (.h5) and .keras archives.
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const bool zip = size >= 2 && data[0] == 'P' && data[1] == 'K';
  const std::string path = mpt::fuzz::as_file(data, size, zip ? ".keras" : ".h5");
  mpt::fuzz::expect_clean([&] { mpt::load_model(path); });
  return 0;
}
