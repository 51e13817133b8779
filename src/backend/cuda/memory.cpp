// GPU memory for CUDA tensors and copies: one caching allocator (allocator.hpp) per GPU over
// cudaMalloc/cudaFree, its blocks owned by the GPU's compute stream, and copies ordered on that
// stream like every op.
#include <array>
#include <memory>
#include <mutex>

#include "backend/cuda/allocator.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "mpt/error.hpp"

namespace mpt::cuda {
namespace {

constexpr int kMaxDevices = 16;

class CudaEvent final : public Event {
 public:
  CudaEvent(int device, cudaStream_t stream) {
    DeviceGuard g(device);
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cuda allocator: cudaEventCreateWithFlags");
    const cudaError_t st = cudaEventRecord(event_, stream);
    if (st != cudaSuccess) {
      (void)cudaEventDestroy(event_);
      check_cuda(st, "cuda allocator: cudaEventRecord");
    }
  }
  ~CudaEvent() override { (void)cudaEventDestroy(event_); }
  bool query() override {
    const cudaError_t st = cudaEventQuery(event_);
    if (st == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it so no later check sees it
      return false;
    }
    check_cuda(st, "cuda allocator: cudaEventQuery");
    return true;
  }
  void synchronize() override { check_cuda(cudaEventSynchronize(event_), "cuda allocator: cudaEventSynchronize"); }

 private:
  cudaEvent_t event_ = nullptr;
};

// Segments of one GPU. Out of memory is reported as null (the allocator frees its cache and
// retries); every other failure is an mpt::Error.
class CudaSource final : public MemorySource {
 public:
  explicit CudaSource(int device) : device_(device) {}
  void* reserve(std::size_t bytes) override {
    DeviceGuard g(device_);
    void* p = nullptr;
    const cudaError_t st = cudaMalloc(&p, bytes);
    if (st == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    check_cuda(st, "cuda allocator: cudaMalloc");
    return p;
  }
  void release(void* ptr) override {
    DeviceGuard g(device_);
    check_cuda(cudaFree(ptr), "cuda allocator: cudaFree");
  }
  std::unique_ptr<Event> record(StreamId s) override {
    return std::make_unique<CudaEvent>(device_, static_cast<cudaStream_t>(s));
  }

 private:
  int device_;
};

struct PerDevice {
  std::unique_ptr<CudaSource> source;
  std::unique_ptr<CachingAllocator> allocator;
};

std::mutex g_mutex;
// Never destroyed: tensors in static storage may be freed after other statics are gone (as the
// generic pool in src/core/memory.cpp), and cudaFree at exit may find the driver shut down.
std::array<PerDevice, kMaxDevices>& devices() {
  static auto* d = new std::array<PerDevice, kMaxDevices>;
  return *d;
}

// The allocator of GPU `index`, created on first use; null when `create` is false and none yet
// (statistics of a GPU never used are zero, without touching the driver).
CachingAllocator* allocator_for(Device device, bool create) {
  MPT_CHECK(device.is_cuda() && device.index >= 0 && device.index < kMaxDevices,
            "cuda allocator: invalid device ", device.str());
  std::lock_guard<std::mutex> lock(g_mutex);
  PerDevice& d = devices()[device.index];
  if (!d.allocator && create) {
    DeviceGuard g(device.index);  // checks the GPU exists
    d.source = std::make_unique<CudaSource>(device.index);
    d.allocator = std::make_unique<CachingAllocator>(*d.source, device.str());
  }
  return d.allocator.get();
}

// True for host memory the runtime knows as page-locked (cudaHostAlloc / cudaHostRegister):
// an async copy from it needs no staging, and the caller keeps it alive as for any async copy.
bool is_pinned(const void* host) {
  cudaPointerAttributes attr{};
  const cudaError_t st = cudaPointerGetAttributes(&attr, host);
  if (st != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

}  // namespace

void* CudaBackend::allocate(Device device, std::size_t nbytes) {
  CachingAllocator* a = allocator_for(device, true);
  return a->allocate(nbytes, stream(device.index));
}

void CudaBackend::deallocate(Device device, void* ptr) {
  if (!ptr) return;
  allocator_for(device, true)->deallocate(ptr);
}

void CudaBackend::copy_from_host(Device device, void* dst, const void* host_src, std::size_t n) {
  if (n == 0) return;
  DeviceGuard g(device.index);
  cudaStream_t s = stream(g.index());
  check_cuda(cudaMemcpyAsync(dst, host_src, n, cudaMemcpyHostToDevice, s), "copy_from_host: cudaMemcpyAsync");
  // From pageable memory the runtime may still read the host buffer after returning: wait, so
  // the caller may free or reuse it at once.
  if (!is_pinned(host_src)) check_cuda(cudaStreamSynchronize(s), "copy_from_host: cudaStreamSynchronize");
}

void CudaBackend::copy_to_host(Device device, void* host_dst, const void* src, std::size_t n) {
  if (n == 0) return;
  DeviceGuard g(device.index);
  cudaStream_t s = stream(g.index());
  check_cuda(cudaMemcpyAsync(host_dst, src, n, cudaMemcpyDeviceToHost, s), "copy_to_host: cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(s), "copy_to_host: cudaStreamSynchronize");
}

void CudaBackend::copy_on_device(Device device, void* dst, const void* src, std::size_t n) {
  if (n == 0 || dst == src) return;
  DeviceGuard g(device.index);
  check_cuda(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream(g.index())),
             "copy_on_device: cudaMemcpyAsync");
}

MemoryStats CudaBackend::memory_stats(Device device) {
  const CachingAllocator* a = allocator_for(device, false);
  if (!a) return {};
  const AllocatorStats s = a->stats();
  MemoryStats m;
  m.current_bytes = s.current_bytes;
  m.peak_bytes = s.peak_bytes;
  m.cached_bytes = s.cached_bytes;
  m.allocations = s.allocations;
  m.cache_hits = s.cache_hits;
  return m;
}

void CudaBackend::reset_peak_memory(Device device) {
  if (CachingAllocator* a = allocator_for(device, false)) a->reset_peak();
}

void CudaBackend::empty_cache(Device device) {
  if (CachingAllocator* a = allocator_for(device, false)) a->empty_cache();
}

}  // namespace mpt::cuda
