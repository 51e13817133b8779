// Prints the CUDA stack this process loaded: driver, runtime, cuBLASLt, cuDNN and NCCL versions,
// the file each library came from, and the GPUs mpt sees. scripts/gpu_check.sh puts it at the
// top of its report; CTest runs it too, where it must succeed with no GPU and no driver.
// --device-json PATH also writes GPU 0's description as cuDNN itself serializes it
// (CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION of a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR made from a
// handle): what tests/data/cuda/h100_sm90.json holds, taken from a real H100.
//   ./cuda_versions [--device-json PATH]
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>
#ifdef MPT_WITH_NCCL
#include <nccl.h>
#endif

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <mpt/device.hpp>
#include <mpt/error.hpp>

#include "backend/cuda/conv_plans.hpp"

namespace {

// The shared object `symbol` was loaded from.
std::string origin(const void* symbol) {
  Dl_info info{};
  return dladdr(symbol, &info) != 0 && info.dli_fname ? info.dli_fname : "?";
}

std::string dotted(long v, long major_div, long minor_div) {
  return std::to_string(v / major_div) + "." + std::to_string(v % major_div / minor_div) + "." +
         std::to_string(v % minor_div);
}

}  // namespace

int main(int argc, char** argv) {
  const char* device_json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device-json") == 0 && i + 1 < argc) {
      device_json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: cuda_versions [--device-json PATH]\n");
      return 2;
    }
  }
  int driver = 0, runtime = 0;
  const bool has_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaGetLastError();
  std::printf("driver (CUDA API)  %s\n", has_driver ? dotted(driver, 1000, 10).c_str() : "none");
  std::printf("CUDA runtime       %s  %s\n", dotted(runtime, 1000, 10).c_str(),
              origin(reinterpret_cast<const void*>(&cudaRuntimeGetVersion)).c_str());
  const std::size_t lt = cublasLtGetVersion();
  std::printf("cuBLASLt           %s  %s\n", dotted(static_cast<long>(lt), 10000, 100).c_str(),
              origin(reinterpret_cast<const void*>(&cublasLtGetVersion)).c_str());
  const std::size_t dnn = cudnnGetVersion();
  std::printf("cuDNN              %s (built against %s)  %s\n", dotted(static_cast<long>(dnn), 10000, 100).c_str(),
              dotted(CUDNN_VERSION, 10000, 100).c_str(), origin(reinterpret_cast<const void*>(&cudnnGetVersion)).c_str());
  if (dnn < CUDNN_VERSION) std::printf("  note: the cuDNN runtime is older than the headers mpt was built with\n");
#ifdef MPT_WITH_NCCL
  int nccl = 0;
  (void)ncclGetVersion(&nccl);
  std::printf("NCCL               %s  %s\n", dotted(nccl, 10000, 100).c_str(),
              origin(reinterpret_cast<const void*>(&ncclGetVersion)).c_str());
#else
  std::printf("NCCL               not built in\n");
#endif
  const int gpus = mpt::cuda::device_count();
  if (gpus == 0) std::printf("GPUs               none (%s)\n", mpt::cuda::unavailable_reason().c_str());
  for (int i = 0; i < gpus; ++i) {
    const auto d = mpt::cuda::device_info(i);
    std::printf("GPU %d              %s, sm_%d%d, %d SMs, %.1f GiB\n", i, d.name.c_str(), d.major, d.minor,
                d.multiprocessors, static_cast<double>(d.total_memory) / (1 << 30));
  }
  if (device_json != nullptr) {
    if (gpus == 0) {
      std::printf("device description: no GPU, nothing written to %s\n", device_json);
      return 1;
    }
    try {
      cudnnHandle_t handle = nullptr;
      if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) throw mpt::Error("cuda_versions: cudnnCreate failed");
      const std::string json = mpt::cuda::conv::serialize_device_properties(handle);
      cudnnDestroy(handle);
      std::ofstream(device_json) << json << "\n";
      std::printf("device description (cuDNN's serialization, %zu bytes) written to %s\n", json.size(), device_json);
    } catch (const mpt::Error& e) {
      std::printf("device description: %s\n", e.what());
      return 1;
    }
  }
  return 0;
}
