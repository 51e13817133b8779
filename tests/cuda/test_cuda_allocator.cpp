// The CUDA backend's caching allocator (src/backend/cuda/allocator.hpp) over a fake memory source
// (host malloc with counters, a byte limit to simulate running out) and fake streams whose
// events complete when the test says so: reuse, splitting, merging, per-stream pools, events,
// the out-of-memory path, exact statistics, a steady state with no reservations, empty_cache.
#include <cstdlib>
#include <map>
#include <thread>

#include "backend/cuda/allocator.hpp"
#include "test_util.hpp"

using namespace mpt;
using namespace mpt::cuda;
using mpt::test::contains;
using mpt::test::error_of;

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

// A stream is a counter of recorded events and of completed ones: an event is done once the
// stream has completed past its ticket (the test advances it with finish()).
struct FakeStream {
  std::size_t recorded = 0, completed = 0;
  void finish() { completed = recorded; }
};

struct FakeEvent final : Event {
  FakeStream* stream;
  std::size_t ticket;
  int* syncs;
  FakeEvent(FakeStream* s, int* n) : stream(s), ticket(s->recorded++), syncs(n) {}
  bool query() override { return stream->completed > ticket; }
  void synchronize() override {
    ++*syncs;
    if (stream->completed <= ticket) stream->completed = ticket + 1;
  }
};

struct FakeSource final : MemorySource {
  std::size_t limit = SIZE_MAX;  // reserve returns null beyond this many bytes held
  std::map<void*, std::size_t> held;
  std::size_t held_bytes = 0;
  int reserves = 0, releases = 0, refusals = 0, events = 0, syncs = 0;
  bool throw_next = false;

  ~FakeSource() override {
    for (auto& [p, n] : held) std::free(p);
  }
  void* reserve(std::size_t bytes) override {
    if (throw_next) {
      throw_next = false;
      fail("fake source: device lost");
    }
    if (held_bytes + bytes > limit) {
      ++refusals;
      return nullptr;
    }
    void* p = std::malloc(bytes);  // never touched: cheap even for 20 MiB segments
    REQUIRE(p != nullptr);
    held[p] = bytes;
    held_bytes += bytes;
    ++reserves;
    return p;
  }
  void release(void* p) override {
    auto it = held.find(p);
    REQUIRE(it != held.end());
    held_bytes -= it->second;
    held.erase(it);
    std::free(p);
    ++releases;
  }
  std::unique_ptr<Event> record(StreamId s) override {
    ++events;
    return std::make_unique<FakeEvent>(static_cast<FakeStream*>(s), &syncs);
  }
};

char* cp(void* p) { return static_cast<char*>(p); }

}  // namespace

TEST_CASE("cuda allocator: rounding and segment sizes") {
  using A = CachingAllocator;
  CHECK(A::round_size(0) == 512);
  CHECK(A::round_size(1) == 512);
  CHECK(A::round_size(512) == 512);
  CHECK(A::round_size(513) == 1024);
  CHECK(A::round_size(MiB) == MiB);
  CHECK(A::round_size(MiB + 1) == MiB + 512);
  CHECK(A::segment_size(512) == 2 * MiB);
  CHECK(A::segment_size(MiB) == 2 * MiB);               // still small
  CHECK(A::segment_size(MiB + 512) == 20 * MiB);        // large, under 10 MiB: shared 20 MiB segment
  CHECK(A::segment_size(10 * MiB - 512) == 20 * MiB);
  CHECK(A::segment_size(10 * MiB) == 10 * MiB);         // its own segment, 2 MiB multiple
  CHECK(A::segment_size(11 * MiB + 512) == 12 * MiB);
}

TEST_CASE("cuda allocator: a freed block is handed out again without a new reservation") {
  FakeSource src;
  FakeStream s;
  CachingAllocator a(src, "fake:0");
  void* p = a.allocate(1000, &s);
  REQUIRE(p != nullptr);
  CHECK(src.reserves == 1);
  a.deallocate(p);
  void* q = a.allocate(1000, &s);
  CHECK(q == p);
  CHECK(src.reserves == 1);
  const auto st = a.stats();
  CHECK(st.allocations == 2);
  CHECK(st.cache_hits == 1);
  CHECK(st.reservations == 1);
  a.deallocate(q);
  a.deallocate(nullptr);  // ignored
}

TEST_CASE("cuda allocator: small requests are split from one 2 MiB segment") {
  FakeSource src;
  FakeStream s;
  CachingAllocator a(src, "fake:0");
  void* p = a.allocate(1000, &s);   // 1024
  void* q = a.allocate(3000, &s);   // 3072, right after p
  CHECK(src.reserves == 1);
  CHECK(src.held.begin()->second == 2 * MiB);
  CHECK(cp(q) == cp(p) + 1024);
  auto st = a.stats();
  CHECK(st.current_bytes == 4000);
  CHECK(st.allocated_bytes == 4096);
  CHECK(st.reserved_bytes == 2 * MiB);
  CHECK(st.cached_bytes == 2 * MiB - 4096);  // the remainder, free for the next request
  CHECK(st.segments == 1);
  CHECK(st.cache_hits == 1);  // q came from the segment p's request reserved
  // The remainder serves exactly the rest of the segment, then a new segment is needed.
  void* r = a.allocate(2 * MiB - 4096, &s);  // > 1 MiB: large pool, its own segment
  CHECK(src.reserves == 2);
  void* t = a.allocate(MiB, &s);  // 1 MiB fits the small remainder (2 MiB - 4 KiB)
  CHECK(cp(t) == cp(q) + 3072);
  CHECK(src.reserves == 2);
  for (void* x : {p, q, r, t}) a.deallocate(x);
  st = a.stats();
  CHECK(st.current_bytes == 0);
  CHECK(st.allocated_bytes == 0);
  CHECK(st.cached_bytes == st.reserved_bytes);
}

TEST_CASE("cuda allocator: neighbours merge on free, so a larger request fits without a new segment") {
  FakeSource src;
  FakeStream s;
  CachingAllocator a(src, "fake:0");
  SUBCASE("small pool") {
    void* b[4];
    for (auto& x : b) x = a.allocate(512 * KiB, &s);  // fills the 2 MiB segment exactly
    CHECK(src.reserves == 1);
    CHECK(a.stats().cached_bytes == 0);
    a.deallocate(b[2]);
    a.deallocate(b[1]);  // merges with b[2]
    void* m = a.allocate(MiB, &s);
    CHECK(m == b[1]);
    CHECK(src.reserves == 1);
    a.deallocate(m);
    a.deallocate(b[0]);
    a.deallocate(b[3]);  // the whole segment is one free block again
    void* whole = a.allocate(MiB, &s);
    CHECK(whole == b[0]);
    CHECK(src.reserves == 1);
    a.deallocate(whole);
  }
  SUBCASE("large pool") {
    void* x = a.allocate(6 * MiB, &s);  // 20 MiB segment: 6 | 6 | 6 | 2
    void* y = a.allocate(6 * MiB, &s);
    void* z = a.allocate(6 * MiB, &s);
    CHECK(src.reserves == 1);
    CHECK(cp(y) == cp(x) + 6 * MiB);
    a.deallocate(x);
    a.deallocate(y);  // 12 MiB free at the start
    void* big = a.allocate(11 * MiB, &s);
    CHECK(big == x);
    CHECK(src.reserves == 1);
    // The 1 MiB left over is not worth a block in the large pool: the block keeps it.
    CHECK(a.stats().allocated_bytes == 12 * MiB + 6 * MiB);
    a.deallocate(big);
    a.deallocate(z);
  }
  a.empty_cache();
  CHECK(src.held.empty());
}

TEST_CASE("cuda allocator: pools are per stream; a block used on another stream waits for its event") {
  FakeSource src;
  FakeStream s1, s2;
  CachingAllocator a(src, "fake:0");
  void* p = a.allocate(1000, &s1);
  a.deallocate(p);
  void* q = a.allocate(1000, &s2);  // s1's free block is not given to s2
  CHECK(q != p);
  CHECK(src.reserves == 2);
  a.deallocate(q);

  void* r = a.allocate(1000, &s1);
  CHECK(r == p);
  a.record_stream(r, &s2);  // r is read by work on s2
  a.record_stream(r, &s1);  // its own stream: nothing to wait for
  a.deallocate(r);
  CHECK(src.events == 1);
  void* t = a.allocate(1000, &s1);  // s2 has not finished: r is not reused
  CHECK(t != r);
  CHECK(cp(t) == cp(r) + 1024);
  CHECK(src.reserves == 2);
  auto st = a.stats();
  CHECK(st.current_bytes == 1000);
  CHECK(st.cached_bytes == 2 * 2 * MiB - 1024);  // the pending block counts as cached
  s2.finish();
  void* u = a.allocate(1000, &s1);  // the event completed: r is back in s1's pool
  CHECK(u == r);
  CHECK(src.syncs == 0);  // only queried, never waited for
  a.deallocate(t);
  a.deallocate(u);

  // empty_cache waits for pending events, then releases.
  void* v = a.allocate(1000, &s1);
  a.record_stream(v, &s2);
  a.deallocate(v);
  a.empty_cache();
  CHECK(src.syncs == 1);
  CHECK(src.held.empty());
  CHECK(a.stats().reserved_bytes == 0);
}

TEST_CASE("cuda allocator: out of memory frees the cache, retries once, then names the numbers") {
  FakeSource src;
  src.limit = 4 * MiB;
  FakeStream s1, s2, s3, s4;
  CachingAllocator a(src, "fake:0");
  void* p = a.allocate(MiB, &s1);
  void* q = a.allocate(MiB, &s2);
  CHECK(src.held_bytes == 4 * MiB);
  a.deallocate(q);  // s2's segment is cached, unused
  void* r = a.allocate(MiB, &s3);  // refused, s2's segment released, retried: fits
  CHECK(r != nullptr);
  auto st = a.stats();
  CHECK(src.refusals == 1);
  CHECK(st.oom_retries == 1);
  CHECK(st.releases == 1);
  CHECK(st.reservations == 3);
  CHECK(st.segments == 2);

  const std::string msg = error_of([&] { a.allocate(MiB + 512 * KiB, &s4); });
  CHECK(contains(msg, "fake:0: out of memory"));
  CHECK(contains(msg, "tried to allocate 1572864 bytes (1.50 MiB)"));
  CHECK(contains(msg, "a segment of 20971520 bytes"));
  CHECK(contains(msg, "2097152 bytes (2.00 MiB) in use by tensors"));
  CHECK(contains(msg, "2097152 bytes (2.00 MiB) cached"));
  CHECK(contains(msg, "4194304 bytes (4.00 MiB) reserved in 2 segments"));
  CHECK(src.refusals == 3);  // the first try and the one retry
  st = a.stats();
  CHECK(st.oom_retries == 2);
  CHECK(st.allocations == 3);  // the failed request counts nothing
  CHECK(st.current_bytes == 2 * MiB);

  // A request whose rounding would overflow is an out-of-memory error, not a wrapped size.
  CHECK(contains(error_of([&] { a.allocate(SIZE_MAX, &s1); }), "out of memory"));
  // Other failures of the source pass through unchanged.
  src.limit = SIZE_MAX;
  src.throw_next = true;
  CHECK(error_of([&] { a.allocate(3 * MiB, &s1); }) == "fake source: device lost");
  CHECK(a.stats().allocations == 3);
  a.deallocate(p);
  a.deallocate(r);
  a.empty_cache();
  CHECK(src.held.empty());
}

TEST_CASE("cuda allocator: statistics are exact") {
  FakeSource src;
  FakeStream s;
  CachingAllocator a(src, "fake:0");
  CHECK(a.stats().reserved_bytes == 0);
  void* p = a.allocate(100, &s);       // 512 of a 2 MiB segment
  void* q = a.allocate(3 * MiB, &s);   // 3 MiB of a 20 MiB segment
  auto st = a.stats();
  CHECK(st.current_bytes == 100 + 3 * MiB);
  CHECK(st.peak_bytes == 100 + 3 * MiB);
  CHECK(st.allocated_bytes == 512 + 3 * MiB);
  CHECK(st.reserved_bytes == 22 * MiB);
  CHECK(st.cached_bytes == 22 * MiB - 512 - 3 * MiB);
  CHECK(st.allocations == 2);
  CHECK(st.cache_hits == 0);
  CHECK(st.reservations == 2);
  CHECK(st.segments == 2);
  a.deallocate(q);
  st = a.stats();
  CHECK(st.current_bytes == 100);
  CHECK(st.peak_bytes == 100 + 3 * MiB);
  CHECK(st.cached_bytes == 22 * MiB - 512);
  a.reset_peak();
  CHECK(a.stats().peak_bytes == 100);
  void* r = a.allocate(2000, &s);  // from p's segment
  st = a.stats();
  CHECK(st.peak_bytes == 2100);
  CHECK(st.allocations == 3);
  CHECK(st.cache_hits == 1);
  CHECK(st.reservations == 2);
  a.deallocate(p);
  a.deallocate(r);
  st = a.stats();
  CHECK(st.current_bytes == 0);
  CHECK(st.cached_bytes == 22 * MiB);
  a.empty_cache();
  st = a.stats();
  CHECK(st.reserved_bytes == 0);
  CHECK(st.cached_bytes == 0);
  CHECK(st.segments == 0);
  CHECK(st.releases == 2);
  CHECK(st.peak_bytes == 2100);  // empty_cache does not touch the peak
}

TEST_CASE("cuda allocator: a steady-state training step reserves nothing after the first") {
  FakeSource src;
  FakeStream s;
  CachingAllocator a(src, "fake:0");
  // One "step": activations of mixed sizes allocated in order, freed in another order, with
  // short-lived temporaries in between.
  const std::vector<std::size_t> sizes{1000, 70000, 3 * MiB + 7, 12 * MiB, 512, MiB, 25 * MiB, 4, 300 * KiB};
  std::size_t reservations_after_first = 0;
  for (int step = 0; step < 10; ++step) {
    std::vector<void*> live;
    for (std::size_t n : sizes) {
      live.push_back(a.allocate(n, &s));
      void* tmp = a.allocate(n / 3 + 1, &s);
      a.deallocate(tmp);
    }
    for (std::size_t i = 0; i < live.size(); i += 2) a.deallocate(live[i]);
    for (std::size_t i = 1; i < live.size(); i += 2) a.deallocate(live[i]);
    const auto st = a.stats();
    if (step == 0) {
      reservations_after_first = st.reservations;
      CHECK(st.reservations > 0);
    } else {
      CHECK(st.reservations == reservations_after_first);
      CHECK(st.cache_hits == st.allocations - reservations_after_first);
    }
    CHECK(st.current_bytes == 0);
  }
  CHECK(src.reserves == static_cast<int>(reservations_after_first));
  a.empty_cache();
  CHECK(src.held.empty());
  CHECK(src.releases == src.reserves);
}

TEST_CASE("cuda allocator: empty_cache gives back every unused segment, keeps used ones") {
  FakeSource src;
  FakeStream s;
  CachingAllocator a(src, "fake:0");
  std::vector<void*> ps;
  for (std::size_t n : {100ul, 5000ul, 2 * MiB, 15 * MiB, 40 * MiB}) ps.push_back(a.allocate(n, &s));
  const int reserved = src.reserves;
  void* keep = ps[1];  // shares the small segment with ps[0]
  for (void* p : ps)
    if (p != keep) a.deallocate(p);
  a.empty_cache();
  CHECK(src.held.size() == 1);  // the small segment, still in use
  CHECK(src.releases == reserved - 1);
  const auto st = a.stats();
  CHECK(st.reserved_bytes == 2 * MiB);
  CHECK(st.current_bytes == 5000);
  a.deallocate(keep);
  a.empty_cache();
  CHECK(src.held.empty());
  CHECK(src.held_bytes == 0);
  CHECK(a.stats().segments == 0);
}

TEST_CASE("cuda allocator: bad pointers, destruction, threads") {
  FakeSource src;
  FakeStream s;
  {
    CachingAllocator a(src, "fake:1");
    int x = 0;
    CHECK(contains(error_of([&] { a.deallocate(&x); }), "fake:1: deallocate of a pointer this allocator did not hand out"));
    void* p = a.allocate(10, &s);
    a.deallocate(p);
    CHECK(contains(error_of([&] { a.deallocate(p); }), "did not hand out"));  // double free
    CHECK(contains(error_of([&] { a.record_stream(p, &s); }), "not a live block"));
    a.allocate(4 * MiB, &s);  // live when the allocator goes: released all the same
  }
  CHECK(src.held.empty());

  CachingAllocator a(src, "fake:0");
  FakeStream streams[4];
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<void*> live;
      for (int i = 0; i < 2000; ++i) {
        live.push_back(a.allocate(static_cast<std::size_t>((i * 7919 + t) % (3 * MiB)), &streams[t]));
        if (live.size() > 8) {
          a.deallocate(live.front());
          live.erase(live.begin());
        }
      }
      for (void* p : live) a.deallocate(p);
    });
  for (auto& th : threads) th.join();
  const auto st = a.stats();
  CHECK(st.allocations == 8000);
  CHECK(st.current_bytes == 0);
  CHECK(st.allocated_bytes == 0);
  a.empty_cache();
  CHECK(src.held.empty());
}
