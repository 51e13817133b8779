#pragma once
/// The caching allocator behind every tensor, and its statistics per device.
///
///   mpt::reset_peak_memory(mpt::Device::cpu());
///   ... train a step ...
///   auto s = mpt::memory_stats(mpt::Device::cpu());
///   std::cout << s.peak_bytes << " bytes at peak\n";
#include <cstddef>
#include <functional>
#include <memory>

#include "mpt/device.hpp"

namespace mpt {

struct MemoryStats {
  std::size_t current_bytes = 0;  ///< bytes held by live tensors
  std::size_t peak_bytes = 0;     ///< maximum of current_bytes since the last reset
  std::size_t cached_bytes = 0;   ///< freed blocks kept for reuse
  std::size_t allocations = 0;    ///< blocks handed out
  std::size_t cache_hits = 0;     ///< of which served from the cache
};

MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);
/// Returns all cached blocks of `device` to the system.
void empty_cache(Device device);

/// A block of device memory, returned to the cache when the last owner drops it.
class Storage {
 public:
  Storage(std::size_t nbytes, Device device);
  /// Memory the allocator does not own (a memory-mapped file): `release` gives it back when the
  /// last owner drops it. Not counted in memory_stats.
  Storage(void* data, std::size_t nbytes, Device device, std::function<void(void*)> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  std::size_t block_ = 0;  // size actually reserved (bucket size)
  Device device_;
  std::function<void(void*)> release_;  // set for memory the allocator does not own
};

namespace detail {
/// Raw device allocation hooks used by the allocator (CPU: aligned malloc; CUDA: cudaMalloc).
void* raw_alloc(Device device, std::size_t nbytes);
void raw_free(Device device, void* ptr);
/// Bytes of physical memory on this machine: host allocations larger than this are refused up
/// front with an mpt::Error (an allocator may also say yes and let the first touch fail).
double host_memory_bytes();
/// Copies between any two devices (host<->device through the CUDA runtime).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t n);
}  // namespace detail

}  // namespace mpt
