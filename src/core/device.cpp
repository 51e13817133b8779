#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "backend/backend.hpp"
#include "mpt/device.hpp"
#include "mpt/error.hpp"
#include "mpt/log.hpp"

namespace mpt {

std::string Device::str() const {
  if (is_test()) return "test";
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

namespace {
std::mutex g_mutex;
std::optional<Device> g_default;

Device parse_device_env(const std::string& v) {
  if (v == "cpu") return Device::cpu();
  if (v == "cuda" || v.rfind("cuda:", 0) == 0) {
    int index = v == "cuda" ? 0 : std::atoi(v.c_str() + 5);
    int count = cuda::device_count();
    MPT_CHECK(index < count, "MPT_DEVICE=", v, ": no such GPU (", count, " found",
              count == 0 ? "; " + cuda::unavailable_reason() : std::string(), ")");
    return Device::cuda(index);
  }
  fail("MPT_DEVICE: expected cpu, cuda or cuda:N, got '", v, "'");
}
}  // namespace

Device default_device() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_default) {
    const char* env = std::getenv("MPT_DEVICE");
    if (env && *env) {
      g_default = parse_device_env(env);
    } else if (detail::has_backend(DeviceType::CUDA) && cuda::device_count() > 0) {
      g_default = Device::cuda(0);
    } else {
      g_default = Device::cpu();
      // A CUDA build on a machine without a driver or GPU says so once, and runs on the CPU.
      if (detail::has_backend(DeviceType::CUDA))
        mpt::log(LogLevel::info, "no usable GPU (", cuda::unavailable_reason(), "); running on the CPU");
    }
  }
  return *g_default;
}

bool is_available(Device device) {
  if (device.is_cpu()) return true;
  if (device.is_test()) return detail::has_backend(DeviceType::Test);
  return detail::has_backend(DeviceType::CUDA) && device.index >= 0 && device.index < cuda::device_count();
}

void set_default_device(Device device) {
  MPT_CHECK(is_available(device), "set_default_device: ", device.str(), " is not available (",
            cuda::device_count(), " GPUs)");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_default = device;
}

}  // namespace mpt
