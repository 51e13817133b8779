// Host memory for CPU tensors (64-byte aligned, for AVX-512 loads) and plain copies.
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_backend.hpp"

namespace mpt::cpu {

void* CpuBackend::allocate(std::size_t nbytes) {
  void* p = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
  MPT_CHECK(p != nullptr, "allocator: out of host memory allocating ", nbytes, " bytes");
  return p;
}

void CpuBackend::deallocate(void* ptr) { std::free(ptr); }

void CpuBackend::copy_from_host(void* dst, const void* host_src, std::size_t n) { std::memcpy(dst, host_src, n); }
void CpuBackend::copy_to_host(void* host_dst, const void* src, std::size_t n) { std::memcpy(host_dst, src, n); }
void CpuBackend::copy_on_device(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }

}  // namespace mpt::cpu
