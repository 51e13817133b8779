#pragma once
// A stream-ordered caching allocator (the design of PyTorch's CUDACachingAllocator), written over
// an abstract memory source so that it runs and is tested on the host; memory.cpp puts it over
// cudaMalloc/cudaFree and CUDA events.
//
//   CachingAllocator a(source, "cuda:0");
//   void* p = a.allocate(1000, s);   // 1024 bytes carved from a 2 MiB segment, owned by stream s
//   a.record_stream(p, other);        // p is also read on `other`
//   a.deallocate(p);                  // back to s's pool once `other`'s event has completed
//
// Why stream ordered: a block freed on its own stream may be handed out again at once, since any
// later use on that stream runs after every earlier one; only a use on another stream needs an
// event before the block can be reused. No CUDA header here: streams are opaque handles.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace mpt::cuda {

/// An opaque stream handle (a cudaStream_t in memory.cpp, any distinct pointer in the tests).
using StreamId = void*;

/// A marker recorded on a stream: complete once the stream's work queued before it is done.
class Event {
 public:
  virtual ~Event() = default;
  /// True once the event has completed (never blocks).
  virtual bool query() = 0;
  /// Blocks until the event has completed.
  virtual void synchronize() = 0;
};

/// Where the allocator's segments come from (cudaMalloc/cudaFree on one GPU, or a fake).
/// reserve returns null when the memory is exhausted (the allocator then frees its cache and
/// retries once); any other failure throws and is passed on unchanged.
struct MemorySource {
  virtual ~MemorySource() = default;
  virtual void* reserve(std::size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
  /// An event recorded now on `stream`.
  virtual std::unique_ptr<Event> record(StreamId stream) = 0;
};

struct AllocatorStats {
  std::size_t current_bytes = 0;    ///< bytes requested by live blocks
  std::size_t peak_bytes = 0;       ///< maximum of current_bytes since the last reset
  std::size_t allocated_bytes = 0;  ///< bytes of live blocks after rounding
  std::size_t reserved_bytes = 0;   ///< bytes of all segments held from the source
  std::size_t cached_bytes = 0;     ///< reserved_bytes - allocated_bytes: free for reuse (or waiting for an event)
  std::size_t allocations = 0;      ///< blocks handed out
  std::size_t cache_hits = 0;       ///< of which served without reserving a segment
  std::size_t reservations = 0;     ///< segments ever reserved from the source
  std::size_t releases = 0;         ///< segments given back to the source
  std::size_t segments = 0;         ///< segments held now
  std::size_t oom_retries = 0;      ///< times the source ran out and the cache was freed to retry
};

class CachingAllocator {
 public:
  /// Requests up to kSmallSize come from kSmallSegment segments, rounded to kRound bytes;
  /// larger ones are rounded to kRound too and come from kLargeSegment segments when under
  /// kMinLargeAlloc, else from a segment of their own rounded up to kRoundLarge.
  static constexpr std::size_t kRound = 512;
  static constexpr std::size_t kSmallSize = std::size_t{1} << 20;       // 1 MiB
  static constexpr std::size_t kSmallSegment = std::size_t{2} << 20;    // 2 MiB
  static constexpr std::size_t kLargeSegment = std::size_t{20} << 20;   // 20 MiB
  static constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;  // 10 MiB
  static constexpr std::size_t kRoundLarge = std::size_t{2} << 20;      // 2 MiB

  /// `name` prefixes error messages ("cuda:0"). The source must outlive the allocator.
  CachingAllocator(MemorySource& source, std::string name);
  /// Gives every segment back to the source (blocks still live are the caller's bug and are
  /// released too, so a destroyed allocator leaks nothing).
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// A block of at least `nbytes` for use on `stream` (never null: mpt::Error "out of memory"
  /// with the numbers when the source is exhausted even after freeing the cache).
  void* allocate(std::size_t nbytes, StreamId stream);
  /// Returns a block from allocate to its stream's pool (after the events of the other streams
  /// it was recorded on). null is ignored; a pointer not from allocate is an mpt::Error.
  void deallocate(void* ptr);
  /// Marks the live block `ptr` as used on `stream` too: when freed, it is reused only after
  /// the work queued on `stream` until then has completed. Its own stream is ignored.
  void record_stream(void* ptr, StreamId stream);

  AllocatorStats stats() const;
  void reset_peak();
  /// Waits for the pending events, then gives every segment with no live block back to the
  /// source. Blocks still in use keep their segments.
  void empty_cache();

  /// Rounded size of a request and the segment size it is carved from (exposed for tests).
  static std::size_t round_size(std::size_t nbytes);
  static std::size_t segment_size(std::size_t rounded);

 private:
  struct Block;
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockLess>;

  Block* find_free(Pool& pool, StreamId stream, std::size_t size);
  Block* reserve_segment(Pool& pool, StreamId stream, std::size_t size, std::size_t requested);
  void free_block(Block* block);  // to its pool, merged with free neighbours
  void process_events();          // blocks whose events all completed go back to their pools
  void synchronize_events();      // waits for every pending event, then as process_events
  void release_cached();          // synchronize_events, then every whole free segment to the source
  Pool& pool_of(std::size_t rounded) { return rounded <= kSmallSize ? small_ : large_; }

  MemorySource& source_;
  std::string name_;
  mutable std::mutex mutex_;
  Pool small_, large_;
  std::unordered_map<void*, Block*> live_;
  std::vector<std::pair<std::unique_ptr<Event>, Block*>> pending_;  // in recording order
  std::vector<Block*> segments_;                                     // first block of each
  AllocatorStats stats_;
};

}  // namespace mpt::cuda
