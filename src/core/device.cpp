#include <atomic>
#include <charconv>
#include <cstdlib>
#include <limits>
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
  Device d;
  try {
    d = Device::parse(v);
  } catch (const Error& e) {
    fail("MPT_DEVICE: ", e.what());
  }
  if (d.is_cuda()) {
    const int count = cuda::device_count();
    MPT_CHECK(d.index < count, "MPT_DEVICE='", v, "': no such GPU (", count, " found",
              count == 0 ? "; " + cuda::unavailable_reason() : std::string(), ")");
  }
  MPT_CHECK(is_available(d), "MPT_DEVICE='", v, "': that device is registered only by mpt's test suite");
  return d;
}
}  // namespace

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "test") return test();
  if (text == "cuda") return cuda(0);
  const std::string digits = text.rfind("cuda:", 0) == 0 ? text.substr(5) : std::string();
  int index = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  const bool ok = !digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos &&
                  ec == std::errc() && end == digits.data() + digits.size();
  MPT_CHECK(ok, "device: expected cpu, cuda or cuda:N (N a GPU index from 0 to ", std::numeric_limits<int>::max(),
            "), got '", text, "'");
  return cuda(index);
}

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
