#pragma once
// The GPU descriptions the device-less cuDNN plan tests plan for: the H100 of
// tests/data/cuda/h100_sm90.json (cuDNN's own serialization of an H100 80GB HBM3, written by
// `cuda_versions --device-json` on the GPU machine on 2026-11-26) and a Tesla T4 (sm_75: tensor
// cores for float16, none for bfloat16), the negative control.
#include <fstream>
#include <sstream>
#include <string>

#include "test_util.hpp"

namespace mpt::test {

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline const std::string& h100() {
  static const std::string json = read_text(test_data("cuda/h100_sm90.json"));
  return json;
}

inline const char* const kT4 = R"({"deviceName":"Tesla T4","deviceVer":750,"driverVer":13000,"cudaDeviceId":0,
  "totalGlobalMem":15642329088,"maxGridSize":[2147483647,65535,65535],"maxBlockSize":[1024,1024,64],
  "regsPerBlock":65536,"multiProcessorCount":40,"warpSize":32,"maxSharedMemoryPerBlock":49152,
  "maxSharedMemoryPerBlockOptin":65536,"reservedSharedMemoryPerBlock":0,"maxRegistersPerSM":65536,
  "maxCtasPerSM":16,"maxThreadsPerBlock":1024,"maxThreadsPerSM":1024,"pciDeviceId":0,"isTccDriver":0,
  "supportCoopLaunch":1,"smClockRateKHz":1590000,"memClockRateKHz":5001000,"l2CacheSize":4194304})";

}  // namespace mpt::test
