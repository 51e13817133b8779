#pragma once
/// Devices: the CPU and CUDA GPUs.
///
///   mpt::Device d = mpt::Device::cuda(0);
///   if (mpt::cuda::device_count() == 0) d = mpt::Device::cpu();
///   auto info = mpt::cuda::device_info(0);   // name, compute capability, memory
#include <cstdint>
#include <string>
#include <vector>

#include "mpt/dtype.hpp"

namespace mpt {

/// Test: a device whose backend only the test suite registers: the CPU kernels on memory that
/// host code outside the backend cannot touch (tests/device), to prove code paths device-clean.
enum class DeviceType : std::uint8_t { CPU, CUDA, Test };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  static Device test() { return {DeviceType::Test, 0}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_test() const { return type == DeviceType::Test; }
  /// "cpu", "cuda:0" or "test".
  std::string str() const;
  /// The device a text names, as str() writes it: "cpu", "cuda" (cuda:0), "cuda:N" (N decimal
  /// digits, in int's range) or "test"; mpt::Error quoting the text otherwise. Whether the
  /// device exists is is_available()'s question.
  ///   Device d = Device::parse("cuda:1");
  static Device parse(const std::string& text);
  friend bool operator==(const Device&, const Device&) = default;
};

/// The device new tensors go to when none is named: MPT_DEVICE=cpu|cuda|cuda:N overrides;
/// otherwise the first usable GPU whose backend is built with its kernels, else the CPU.
Device default_device();
/// Sets the default device for this process (overrides MPT_DEVICE).
void set_default_device(Device device);
/// True when tensors and ops can run on `device` in this build on this machine (the CPU
/// always; a GPU when it exists and the CUDA op backend is built; the test device when the
/// test suite registered it).
bool is_available(Device device);

namespace cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int major = 0;  ///< compute capability
  int minor = 0;
  std::size_t total_memory = 0;
  int multiprocessors = 0;
};

/// True when mpt was built with the CUDA backend (MPT_WITH_CUDA).
bool built_with_cuda();
/// Number of usable GPUs; 0 when built without CUDA, with no driver or with no device.
int device_count();
/// Properties of GPU `index`; mpt::Error when it does not exist.
DeviceInfo device_info(int index);
/// float32 GEMMs on GPUs use TF32 tensor cores only when allowed (off by default, as PyTorch's
/// torch.backends.cuda.matmul.allow_tf32): TF32 keeps 10 fraction bits of each input.
void set_allow_tf32(bool allow);
bool allow_tf32();
/// cuDNN convolutions run only engines cuDNN does not note as nondeterministic (on by default,
/// as PyTorch's torch.backends.cudnn.deterministic = True), so the same inputs give bit-identical
/// outputs and gradients on every run, which resuming a fit relies on. false also admits engines
/// whose reductions (atomics, split-K) may sum in a different order each run: faster for some
/// problems, weight gradients mostly. Plans are cached per setting.
///
///   mpt::cuda::set_cudnn_deterministic(false);   // speed over run-to-run reproducibility
void set_cudnn_deterministic(bool deterministic);
bool cudnn_deterministic();
/// Keras's "mixed precision compatibility check": the warning for computing in `compute_dtype`
/// on GPU `index` when it lacks tensor cores for it (float16 needs compute capability 7.0,
/// bfloat16 8.0); "" when it has them, for other dtypes, and when there is no such GPU.
/// set_global_policy prints it once per process and (GPU, dtype) for the default device.
std::string capability_warning(int index, DType compute_dtype);
/// Why device_count() is 0 ("built without CUDA", "no driver", "no device"), or "" if > 0.
std::string unavailable_reason();

}  // namespace cuda
}  // namespace mpt
