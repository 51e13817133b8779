// The stream-ordered caching allocator (allocator.hpp). Blocks live in segments reserved from the
// source; a segment is a doubly linked list of blocks, split on allocation and merged on free.
// Free blocks sit in one of two pools (small, large) ordered by (stream, size, address), so a
// best fit on the requesting stream is one lower_bound.
#include "backend/cuda/allocator.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <limits>

#include "mpt/error.hpp"

namespace mpt::cuda {

struct CachingAllocator::Block {
  char* ptr = nullptr;
  std::size_t size = 0;       // rounded, what the block spans in its segment
  std::size_t requested = 0;  // asked for by the live allocation (0 when free)
  StreamId stream = nullptr;  // the stream that allocated the segment; its pool
  Pool* pool = nullptr;
  bool allocated = false;
  int event_count = 0;  // events still pending before a freed block may be reused
  Block* prev = nullptr;  // neighbours in the segment
  Block* next = nullptr;
  std::vector<StreamId> stream_uses;  // other streams it was used on (record_stream)

  bool is_free() const { return !allocated && event_count == 0; }
};

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  const auto sa = reinterpret_cast<std::uintptr_t>(a->stream), sb = reinterpret_cast<std::uintptr_t>(b->stream);
  if (sa != sb) return sa < sb;
  if (a->size != b->size) return a->size < b->size;
  return reinterpret_cast<std::uintptr_t>(a->ptr) < reinterpret_cast<std::uintptr_t>(b->ptr);
}

namespace {
// "3.00 MiB" for messages (the exact byte count goes next to it).
std::string human(std::size_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
  return buf;
}
std::string bytes_str(std::size_t bytes) { return detail::cat(bytes, " bytes (", human(bytes), ")"); }
}  // namespace

CachingAllocator::CachingAllocator(MemorySource& source, std::string name)
    : source_(source), name_(std::move(name)) {}

CachingAllocator::~CachingAllocator() {
  // Nothing may throw here: a failed wait or release is dropped (the process is going away or
  // the device is lost, and the memory goes with it).
  for (auto& [event, block] : pending_) {
    try {
      event->synchronize();
    } catch (...) {
    }
  }
  pending_.clear();
  for (Block* head : segments_) {
    void* ptr = head->ptr;
    for (Block* b = head; b;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    try {
      source_.release(ptr);
    } catch (...) {
    }
  }
}

std::size_t CachingAllocator::round_size(std::size_t nbytes) {
  if (nbytes == 0) return kRound;
  return (nbytes + kRound - 1) / kRound * kRound;
}

std::size_t CachingAllocator::segment_size(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded < kMinLargeAlloc) return kLargeSegment;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

void* CachingAllocator::allocate(std::size_t nbytes, StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A size whose rounding would overflow cannot exist; say so as the out-of-memory it is.
  MPT_CHECK(nbytes <= std::numeric_limits<std::size_t>::max() - kRoundLarge, name_,
            ": out of memory: tried to allocate ", nbytes, " bytes");
  process_events();
  const std::size_t size = round_size(nbytes);
  Pool& pool = pool_of(size);
  Block* block = find_free(pool, stream, size);
  const bool hit = block != nullptr;
  if (!block) block = reserve_segment(pool, stream, size, nbytes);

  // Split when the rest is worth keeping: any 512 B in the small pool; in the large pool only
  // more than 1 MiB, so large blocks do not fragment into small slivers (as PyTorch).
  const std::size_t rest = block->size - size;
  if (&pool == &small_ ? rest >= kRound : rest > kSmallSize) {
    auto* tail = new Block;
    tail->ptr = block->ptr + size;
    tail->size = rest;
    tail->stream = stream;
    tail->pool = &pool;
    tail->prev = block;
    tail->next = block->next;
    if (block->next) block->next->prev = tail;
    block->next = tail;
    block->size = size;
    pool.insert(tail);
  }
  block->allocated = true;
  block->requested = nbytes;
  live_.emplace(block->ptr, block);

  ++stats_.allocations;
  if (hit) ++stats_.cache_hits;
  stats_.current_bytes += nbytes;
  stats_.allocated_bytes += block->size;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  return block->ptr;
}

CachingAllocator::Block* CachingAllocator::find_free(Pool& pool, StreamId stream, std::size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::reserve_segment(Pool& pool, StreamId stream, std::size_t size,
                                                           std::size_t requested) {
  const std::size_t bytes = segment_size(size);
  void* p = source_.reserve(bytes);
  if (!p) {
    // The source is exhausted: give back every unused cached segment and try once more.
    ++stats_.oom_retries;
    release_cached();
    p = source_.reserve(bytes);
  }
  if (!p)
    fail(name_, ": out of memory: tried to allocate ", bytes_str(requested), " (a segment of ",
         bytes_str(bytes), "); ", bytes_str(stats_.current_bytes), " in use by tensors, ",
         bytes_str(stats_.reserved_bytes - stats_.allocated_bytes), " cached, ",
         bytes_str(stats_.reserved_bytes), " reserved in ", stats_.segments,
         " segments (the cache was freed and the request retried)");
  auto* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = bytes;
  b->stream = stream;
  b->pool = &pool;
  segments_.push_back(b);
  ++stats_.reservations;
  ++stats_.segments;
  stats_.reserved_bytes += bytes;
  // MPT_CUDA_ALLOC_LOG=1: one line per reservation, to see which request needed a new segment.
  static const bool log = [] {
    const char* v = std::getenv("MPT_CUDA_ALLOC_LOG");
    return v && *v && std::string(v) != "0";
  }();
  if (log)
    std::fprintf(stderr, "mpt: %s: reservation %zu: segment of %s for a request of %s (%s in use by tensors, %s reserved)\n",
                 name_.c_str(), stats_.reservations, bytes_str(bytes).c_str(), bytes_str(requested).c_str(),
                 bytes_str(stats_.current_bytes).c_str(), bytes_str(stats_.reserved_bytes).c_str());
  return b;
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  MPT_CHECK(it != live_.end(), name_, ": deallocate of a pointer this allocator did not hand out");
  Block* b = it->second;
  // Events first: if recording one fails, the block stays live and nothing is half done.
  std::vector<std::unique_ptr<Event>> events;
  for (StreamId s : b->stream_uses) events.push_back(source_.record(s));
  live_.erase(it);
  stats_.current_bytes -= b->requested;
  stats_.allocated_bytes -= b->size;
  b->allocated = false;
  b->requested = 0;
  b->stream_uses.clear();
  if (events.empty()) return free_block(b);
  b->event_count = static_cast<int>(events.size());
  for (auto& e : events) pending_.emplace_back(std::move(e), b);
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  MPT_CHECK(it != live_.end(), name_, ": record_stream of a pointer that is not a live block");
  Block* b = it->second;
  if (stream == b->stream) return;  // ordered on its own stream already
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end())
    b->stream_uses.push_back(stream);
}

void CachingAllocator::free_block(Block* b) {
  Pool& pool = *b->pool;
  if (b->prev && b->prev->is_free()) {
    Block* p = b->prev;
    pool.erase(p);  // its key (size) changes
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  if (b->next && b->next->is_free()) {
    Block* n = b->next;
    pool.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  pool.insert(b);
}

void CachingAllocator::process_events() {
  std::erase_if(pending_, [this](auto& entry) {
    if (!entry.first->query()) return false;
    if (--entry.second->event_count == 0) free_block(entry.second);
    return true;
  });
}

void CachingAllocator::synchronize_events() {
  for (auto& [event, block] : pending_) {
    event->synchronize();
    if (--block->event_count == 0) free_block(block);
  }
  pending_.clear();
}

void CachingAllocator::release_cached() {
  synchronize_events();
  for (Pool* pool : {&small_, &large_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev || b->next) {  // part of a segment still in use
        ++it;
        continue;
      }
      source_.release(b->ptr);
      it = pool->erase(it);
      std::erase(segments_, b);
      --stats_.segments;
      ++stats_.releases;
      stats_.reserved_bytes -= b->size;
      delete b;
    }
  }
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  AllocatorStats s = stats_;
  s.cached_bytes = s.reserved_bytes - s.allocated_bytes;
  return s;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached();
}

}  // namespace mpt::cuda
