// Host memory for CPU tensors (64-byte aligned, for AVX-512 loads) and plain copies.
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_backend.hpp"

namespace mpt::cpu {

void* CpuBackend::allocate(Device, std::size_t nbytes) {
  // More than the machine's memory is refused up front (an allocator may also say yes and let
  // the first touch fail, or abort under a sanitizer).
  MPT_CHECK(static_cast<double>(nbytes) <= detail::host_memory_bytes(), "allocator: out of host memory allocating ",
            nbytes, " bytes (this machine has ", static_cast<std::uint64_t>(detail::host_memory_bytes()), ")");
  void* p = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
  MPT_CHECK(p != nullptr, "allocator: out of host memory allocating ", nbytes, " bytes");
  return p;
}

void CpuBackend::deallocate(Device, void* ptr) { std::free(ptr); }

void CpuBackend::copy_from_host(Device, void* dst, const void* host_src, std::size_t n) { std::memcpy(dst, host_src, n); }
void CpuBackend::copy_to_host(Device, void* host_dst, const void* src, std::size_t n) { std::memcpy(host_dst, src, n); }
void CpuBackend::copy_on_device(Device, void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }

}  // namespace mpt::cpu
