// The CUDA backend's registration, status checks, device guards and compute streams.
#include "backend/cuda/cuda_backend.hpp"

#include <cublas_api.h>
#include <cudnn_graph.h>

#include <array>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "mpt/device.hpp"
#include "mpt/dtype.hpp"
#include "mpt/error.hpp"
#include "mpt/log.hpp"

namespace mpt::cuda {
namespace {
// Registered when libmpt loads, whether or not this machine has a GPU: is_available() and
// default_device() ask device_count() before any op runs, so without a GPU nothing reaches it.
struct Registrar {
  Registrar() {
    static CudaBackend backend;
    detail::register_backend(DeviceType::CUDA, &backend);
  }
} registrar;

constexpr int kMaxDevices = 16;
}  // namespace

void check_cublas(int status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const auto s = static_cast<cublasStatus_t>(status);
  fail(what, ": ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")");
}

void check_cudnn(int status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  fail(what, ": ", cudnnGetErrorString(static_cast<cudnnStatus_t>(status)), " (", status, ")",
       detail[0] ? std::string(": ") + detail : std::string());
}

void check_launch(const char* op) { check_cuda(cudaGetLastError(), op); }

DeviceGuard::DeviceGuard(int index) : index_(index) {
  MPT_CHECK(index >= 0 && index < kMaxDevices && index < device_count(), "cuda: no GPU with index ",
            index, " (", device_count(), " found", device_count() == 0 ? "; " + unavailable_reason() : std::string(), ")");
  check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != index) check_cuda(cudaSetDevice(index), "cudaSetDevice");
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != index_) (void)cudaSetDevice(previous_);
}

cudaStream_t stream(int index) {
  static std::array<cudaStream_t, kMaxDevices> streams{};
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  MPT_CHECK(index >= 0 && index < kMaxDevices, "cuda: no GPU with index ", index);
  if (!streams[index]) {
    DeviceGuard g(index);
    check_cuda(cudaStreamCreateWithFlags(&streams[index], cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  return streams[index];
}

void hint_tensor_core_shape(const char* op, int dtype, std::initializer_list<long long> dims) {
  const auto d = static_cast<DType>(dtype);
  if (d != DType::Float16 && d != DType::BFloat16) return;
  bool aligned = true;
  for (long long n : dims) aligned = aligned && n % 8 == 0;
  if (aligned) return;
  static std::mutex mutex;
  static std::set<std::string> hinted;
  std::lock_guard<std::mutex> lock(mutex);
  if (!hinted.insert(op).second) return;
  std::string list;
  for (long long n : dims) list += (list.empty() ? "" : ", ") + std::to_string(n);
  mpt::log(LogLevel::info, op, " in ", to_string(d), " has dimensions (", list,
      ") that are not all multiples of 8: tensor cores run padded or not at all; sizes "
      "that are multiples of 8 are faster (said once per op)");
}

}  // namespace mpt::cuda
