// Smallest program using the installed mpt: headers, the shared library and its CMake package.
#include <mpt/mpt.hpp>

#include <cstdio>

int main() {
  bool ok = true;
  if (mpt::to_string(mpt::bfloat16) != "bfloat16") {
    std::printf("to_string(bfloat16) = %s\n", mpt::to_string(mpt::bfloat16).c_str());
    ok = false;
  }
  const unsigned bits = mpt::float_to_half_bits(1.0f);
  if (bits != 0x3c00u) {
    std::printf("float_to_half_bits(1.0f) = 0x%04x, expected 0x3c00\n", bits);
    ok = false;
  }
  // Layer configs are nlohmann::json objects (the package finds nlohmann_json for its users).
  const nlohmann::json config = mpt::layers::Dense(4)->config();
  if (config.value("units", 0) != 4) {
    std::printf("Dense(4)->config() = %s\n", config.dump().c_str());
    ok = false;
  }
  const int gpus = mpt::cuda::device_count();
  if (gpus < 0) {
    std::printf("cuda::device_count() = %d\n", gpus);
    ok = false;
  }
  std::printf("mpt consumer: %d GPU(s)\n", gpus);
  if (!ok) return 1;
  std::printf("mpt consumer OK\n");
  return 0;
}
