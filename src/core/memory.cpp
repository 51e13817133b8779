// Caching allocator: freed blocks are kept in per-device size classes and reused, so the hot
// path (one allocation per op output) does not reach the backend's allocate after warm-up.
// Raw memory and copies come from each device's backend.
#include "mpt/memory.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "backend/backend.hpp"
#include "mpt/error.hpp"

namespace mpt {
namespace {

constexpr int kMaxCudaDevices = 16;

// Size classes: 2^k, 1.25*2^k, 1.5*2^k, 1.75*2^k (at most 25 % slack), minimum 256 bytes.
std::size_t size_class(std::size_t n) {
  if (n <= 256) return 256;
  std::size_t p = std::size_t{1} << (63 - __builtin_clzll(n));
  if (n == p) return n;
  std::size_t q = p / 4;
  return (n + q - 1) / q * q;
}

struct Pool {
  std::mutex mutex;
  std::map<std::size_t, std::vector<void*>> free_blocks;
  MemoryStats stats;
};

using Pools = std::array<Pool, kMaxCudaDevices + 2>;

Pools& all_pools() {
  // Never destroyed: tensors in static storage may be freed after other statics, and the
  // cached blocks stay reachable (not leaks) for LeakSanitizer.
  static Pools* pools = [] {
    auto* p = new Pools;
    // Fork-safe, as glibc's malloc is: no pool is locked by another thread at the fork, so a
    // forked child (io::parse_guarded's) can allocate.
    pthread_atfork([] { for (Pool& q : all_pools()) q.mutex.lock(); },
                   [] { for (Pool& q : all_pools()) q.mutex.unlock(); },
                   [] { for (Pool& q : all_pools()) q.mutex.unlock(); });
    return p;
  }();
  return *pools;
}

Pool& pool_for(Device device) {
  Pools* pools = &all_pools();
  MPT_CHECK(!device.is_cuda() || (device.index >= 0 && device.index < kMaxCudaDevices),
            "allocator: invalid device ", device.str());
  return (*pools)[device.is_cpu() ? 0 : device.is_test() ? 1 : device.index + 2];
}

// The device's backend when it keeps its own cache (CUDA), else null (the pool here is used).
Backend* own_cache(Device device) {
  if (!detail::has_backend(device.type)) return nullptr;
  Backend& b = detail::backend(device);
  return b.caches_memory() ? &b : nullptr;
}

}  // namespace

double detail::host_memory_bytes() {
  static const double bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  return bytes;
}

void* detail::raw_alloc(Device device, std::size_t nbytes) { return backend(device).allocate(device, nbytes); }

void detail::raw_free(Device device, void* ptr) { backend(device).deallocate(device, ptr); }

void detail::copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                        std::size_t n) {
  if (n == 0) return;
  if (dst_device == src_device) return backend(dst_device).copy_on_device(dst_device, dst, src, n);
  if (src_device.is_cpu()) return backend(dst_device).copy_from_host(dst_device, dst, src, n);
  if (dst_device.is_cpu()) return backend(src_device).copy_to_host(src_device, dst, src, n);
  // Between two devices: through host memory.
  std::vector<char> host(n);
  backend(src_device).copy_to_host(src_device, host.data(), src, n);
  backend(dst_device).copy_from_host(dst_device, dst, host.data(), n);
}

Storage::Storage(std::size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (nbytes == 0) return;
  Backend& b = detail::backend(device);
  if (b.caches_memory()) {  // the backend's own caching allocator (CUDA: stream ordered)
    block_ = 0;
    data_ = b.allocate(device, nbytes);
    return;
  }
  block_ = size_class(nbytes);
  Pool& pool = pool_for(device);
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    auto it = pool.free_blocks.find(block_);
    if (it != pool.free_blocks.end() && !it->second.empty()) {
      data_ = it->second.back();
      it->second.pop_back();
      pool.stats.cached_bytes -= block_;
      ++pool.stats.cache_hits;
    }
  }
  if (!data_) data_ = detail::raw_alloc(device, block_);
  std::lock_guard<std::mutex> lock(pool.mutex);
  ++pool.stats.allocations;
  pool.stats.current_bytes += nbytes_;
  pool.stats.peak_bytes = std::max(pool.stats.peak_bytes, pool.stats.current_bytes);
}

Storage::Storage(void* data, std::size_t nbytes, Device device, std::function<void(void*)> release)
    : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (release_) {
    release_(data_);
    return;
  }
  if (!data_) return;
  if (block_ == 0) {
    detail::backend(device_).deallocate(device_, data_);
    return;
  }
  Pool& pool = pool_for(device_);
  std::lock_guard<std::mutex> lock(pool.mutex);
  pool.free_blocks[block_].push_back(data_);
  pool.stats.cached_bytes += block_;
  pool.stats.current_bytes -= nbytes_;
}

MemoryStats memory_stats(Device device) {
  if (Backend* b = own_cache(device)) return b->memory_stats(device);
  Pool& pool = pool_for(device);
  std::lock_guard<std::mutex> lock(pool.mutex);
  return pool.stats;
}

void reset_peak_memory(Device device) {
  if (Backend* b = own_cache(device)) return b->reset_peak_memory(device);
  Pool& pool = pool_for(device);
  std::lock_guard<std::mutex> lock(pool.mutex);
  pool.stats.peak_bytes = pool.stats.current_bytes;
}

void empty_cache(Device device) {
  if (Backend* b = own_cache(device)) return b->empty_cache(device);
  Pool& pool = pool_for(device);
  std::lock_guard<std::mutex> lock(pool.mutex);
  for (auto& [size, blocks] : pool.free_blocks)
    for (void* p : blocks) detail::raw_free(device, p);
  pool.free_blocks.clear();
  pool.stats.cached_bytes = 0;
}

}  // namespace mpt
