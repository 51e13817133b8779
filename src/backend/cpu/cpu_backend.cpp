#include "backend/cpu/cpu_backend.hpp"

#include <omp.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "mpt/tensor.hpp"  // max_threads

namespace mpt::cpu {
namespace {
/// An OMP_NUM_THREADS (its first number: libgomp also takes a list) above max_threads() would
/// crash libgomp or make it exit the process at the first parallel region: lowered, with a word.
void limit_environment_threads() {
  const char* text = std::getenv("OMP_NUM_THREADS");
  if (text == nullptr) return;
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(text, &end, 10);
  if (end == text || (n <= max_threads() && errno != ERANGE)) return;
  std::fprintf(stderr, "mpt: OMP_NUM_THREADS=%s is more threads than mpt allows; using %d (mpt::max_threads())\n",
               text, max_threads());
  omp_set_num_threads(max_threads());
}

// Registered when libmpt loads: the CPU backend is always there.
struct Registrar {
  Registrar() {
    static CpuBackend backend;
    detail::register_backend(DeviceType::CPU, &backend);
    limit_environment_threads();
  }
} registrar;
}  // namespace
}  // namespace mpt::cpu
