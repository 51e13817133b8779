#include "backend/backend.hpp"

#include <array>

namespace mpt::detail {
namespace {
std::array<Backend*, 3>& registry() {
  static std::array<Backend*, 3> r{};
  return r;
}
}  // namespace

void register_backend(DeviceType type, Backend* b) { registry()[static_cast<int>(type)] = b; }

bool has_backend(DeviceType type) { return registry()[static_cast<int>(type)] != nullptr; }

Backend& backend(Device device) {
  Backend* b = registry()[static_cast<int>(device.type)];
  MPT_CHECK(b != nullptr, "no ", device.is_cuda() ? "CUDA" : device.is_test() ? "test-device" : "CPU",
            " kernels in this build for device ", device.str(),
            device.is_cuda() ? " (built without CUDA; use MPT_DEVICE=cpu)"
                             : "");
  return *b;
}

}  // namespace mpt::detail


