// mpt::cuda device queries (include/mpt/device.hpp). Without MPT_WITH_CUDA every query reports
// "no GPU"; with it, a missing driver or device is reported the same way, never as an error.
#include "mpt/device.hpp"

#include "mpt/error.hpp"

#include <atomic>

#ifdef MPT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <mutex>

#include "backend/cuda/cuda_check.hpp"
#endif

namespace mpt::cuda {

namespace {
std::atomic<bool> g_allow_tf32{false};
std::atomic<bool> g_cudnn_deterministic{true};
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }
void set_cudnn_deterministic(bool deterministic) { g_cudnn_deterministic = deterministic; }
bool cudnn_deterministic() { return g_cudnn_deterministic; }

#ifdef MPT_WITH_CUDA

void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear the (non-sticky) error so it does not resurface later
  fail(what, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

// Queried once per process; cudaGetDeviceCount is the first runtime call and also the one that
// fails when there is no driver or no GPU, so it must never throw.
const Probe& probe() {
  static Probe result;
  static std::once_flag once;
  std::call_once(once, [] {
    int n = 0;
    const cudaError_t st = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    if (st == cudaSuccess && n > 0) {
      result.count = n;
      return;
    }
    result.count = 0;
    switch (st) {
      case cudaSuccess:
      case cudaErrorNoDevice:
        result.reason = "no device";
        break;
      case cudaErrorInsufficientDriver:  // also what the runtime says when libcuda.so is absent
      case cudaErrorStubLibrary:         // only the toolkit's stub libcuda.so was found
        result.reason = "no driver";
        break;
      default:
        result.reason = detail::cat(cudaGetErrorName(st), ": ", cudaGetErrorString(st));
        break;
    }
  });
  return result;
}

}  // namespace

bool built_with_cuda() { return true; }

int device_count() { return probe().count; }

std::string unavailable_reason() { return probe().reason; }

DeviceInfo device_info(int index) {
  const int n = device_count();
  MPT_CHECK(index >= 0 && index < n, "cuda::device_info: no GPU with index ", index, " (",
            n, n == 1 ? " device" : " devices", n == 0 ? ", " + unavailable_reason() : "", ")");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  DeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;
  info.multiprocessors = prop.multiProcessorCount;
  return info;
}

std::string capability_warning(int index, DType compute_dtype) {
  int need_major = 0;
  if (compute_dtype == DType::Float16) need_major = 7;
  else if (compute_dtype == DType::BFloat16) need_major = 8;
  else return "";
  if (index < 0 || index >= device_count()) return "";
  const DeviceInfo info = device_info(index);
  if (info.major >= need_major) return "";
  return detail::cat("mpt: mixed precision compatibility check (", to_string(compute_dtype),
                     "): WARNING: GPU ", index, " (", info.name, ", compute capability ", info.major, ".",
                     info.minor, ") has no ", to_string(compute_dtype),
                     " tensor cores (they need compute capability ", need_major,
                     ".0 or higher); computing in ", to_string(compute_dtype), " may run slowly");
}

#else  // !MPT_WITH_CUDA

bool built_with_cuda() { return false; }

int device_count() { return 0; }

std::string unavailable_reason() { return "built without CUDA"; }

DeviceInfo device_info(int index) {
  fail("cuda::device_info: no GPU with index ", index, " (0 devices, built without CUDA)");
}

std::string capability_warning(int, DType) { return ""; }

#endif

}  // namespace mpt::cuda
