#include "backend/cpu/cpu_backend.hpp"

namespace mpt::cpu {
namespace {
// Registered when libmpt loads: the CPU backend is always there.
struct Registrar {
  Registrar() {
    static CpuBackend backend;
    detail::register_backend(DeviceType::CPU, &backend);
  }
} registrar;
}  // namespace
}  // namespace mpt::cpu
