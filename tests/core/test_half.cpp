#include "mpt/half.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif
#if __has_include(<sys/mman.h>) && __has_include(<unistd.h>)
#include <sys/mman.h>
#include <unistd.h>
#define MPT_TEST_GUARD_PAGE 1
#endif

namespace {

using u16 = std::uint16_t;
using u32 = std::uint32_t;

u32 bits_of(float f) { return std::bit_cast<u32>(f); }
float float_of(u32 u) { return std::bit_cast<float>(u); }

std::string hex(u32 v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", v);
  return buf;
}

// Independent model of a binary16-like format: values come from ldexp on the fields in double,
// and rounding is a nearest search over the sorted table of every finite value.
struct Format {
  const char* name;
  int mbits, ebits;
  u16 (*to_bits)(float);
  float (*to_float)(u16);
  void (*bulk_to_bits)(const float*, u16*, std::size_t);
  void (*bulk_to_float)(const u16*, float*, std::size_t);
  std::vector<double> table;  // table[p] = value of pattern p for 0 <= p <= inf pattern

  u16 inf_bits() const { return static_cast<u16>(((1u << ebits) - 1) << mbits); }
  int bias() const { return (1 << (ebits - 1)) - 1; }

  double decode(u16 b) const {
    const int e = (b & 0x7fff) >> mbits, m = b & ((1 << mbits) - 1);
    double v;
    if (e == (1 << ebits) - 1) v = m ? std::nan("") : INFINITY;
    else if (e == 0) v = std::ldexp(m, 1 - bias() - mbits);
    else v = std::ldexp((1 << mbits) + m, e - bias() - mbits);
    return (b & 0x8000) ? -v : v;
  }

  void build_table() {
    for (u32 p = 0; p < inf_bits(); ++p) table.push_back(decode(static_cast<u16>(p)));
    // Where the next binade would start: inputs at or past the midpoint to it round to inf.
    table.push_back(std::ldexp(1.0, bias() + 1));
  }

  // Round to nearest, ties to the even pattern; x must not be NaN.
  u16 nearest(double x) const {
    const u16 sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    const std::size_t i = std::lower_bound(table.begin(), table.end(), a) - table.begin();
    if (i == table.size()) return sign | inf_bits();
    if (table[i] == a) return sign | static_cast<u16>(i);
    const double twice = 2 * a, mid = table[i - 1] + table[i];  // both exact in double
    const std::size_t pick = twice < mid ? i - 1 : twice > mid ? i : (i % 2 == 0 ? i : i - 1);
    return sign | static_cast<u16>(pick);
  }

  // The NaN rule: quiet, same sign, the top payload bits that fit.
  u16 nan_from_float(u32 f) const {
    const u32 mant = f & 0x7fffff;
    return static_cast<u16>(((f >> 16) & 0x8000) | inf_bits() | (1u << (mbits - 1)) | (mant >> (23 - mbits)));
  }
  u32 nan_to_float(u16 b) const {
    const u32 m = b & ((1u << mbits) - 1);
    return (static_cast<u32>(b & 0x8000) << 16) | 0x7fc00000u | (m << (23 - mbits));
  }
  bool is_nan(u16 b) const { return (b & 0x7fff) > inf_bits(); }

  u16 expected(float f) const {
    return std::isnan(f) ? nan_from_float(bits_of(f)) : nearest(static_cast<double>(f));
  }
};

Format& fp16() {
  static Format f = [] {
    Format r{"float16", 10, 5, mpt::float_to_half_bits, mpt::half_bits_to_float, mpt::float_to_half, mpt::half_to_float, {}};
    r.build_table();
    return r;
  }();
  return f;
}

Format& bf16() {
  static Format f = [] {
    Format r{"bfloat16", 7, 8, mpt::float_to_bfloat16_bits, mpt::bfloat16_bits_to_float, mpt::float_to_bfloat16,
             mpt::bfloat16_to_float, {}};
    r.build_table();
    return r;
  }();
  return f;
}

// Counts disagreements and reports only the first few, so big sweeps stay fast and readable.
struct Mismatches {
  std::size_t count = 0;
  void operator()(const std::string& what) {
    if (++count <= 5) FAIL_CHECK(what);
  }
};

// Every bulk implementation this CPU can run, including the forced portable one.
std::vector<const char*> bulk_isas() {
  std::vector<const char*> r{"auto"};
  for (const char* isa : {"portable", "f16c", "avx512"})
    if (mpt::force_conversion_isa(isa)) r.push_back(isa);
  mpt::force_conversion_isa(nullptr);
  return r;
}

struct IsaScope {
  explicit IsaScope(const char* isa) {
    if (std::string(isa) == "portable") mpt::force_portable_conversions(true);  // the public switch
    else if (std::string(isa) != "auto") REQUIRE(mpt::force_conversion_isa(isa));
  }
  ~IsaScope() { mpt::force_conversion_isa(nullptr); }
};

// Bulk (every implementation) must equal the scalar conversion bit for bit.
void check_bulk_to_bits(const Format& fmt, const std::vector<float>& in, Mismatches& bad) {
  std::vector<u16> out(in.size());
  for (const char* isa : bulk_isas()) {
    IsaScope scope(isa);
    fmt.bulk_to_bits(in.data(), out.data(), in.size());
    for (std::size_t i = 0; i < in.size(); ++i)
      if (out[i] != fmt.to_bits(in[i]))
        bad(std::string(fmt.name) + " bulk[" + isa + "](" + hex(bits_of(in[i])) + ") = " + hex(out[i]) +
            ", scalar " + hex(fmt.to_bits(in[i])));
  }
}

void check_bulk_to_float(const Format& fmt, const std::vector<u16>& in, Mismatches& bad) {
  std::vector<float> out(in.size());
  for (const char* isa : bulk_isas()) {
    IsaScope scope(isa);
    fmt.bulk_to_float(in.data(), out.data(), in.size());
    for (std::size_t i = 0; i < in.size(); ++i)
      if (bits_of(out[i]) != bits_of(fmt.to_float(in[i])))
        bad(std::string(fmt.name) + " bulk[" + isa + "](" + hex(in[i]) + ") = " + hex(bits_of(out[i])));
  }
}

void check_all_patterns(const Format& fmt) {
  Mismatches bad;
  std::vector<u16> pats(65536);
  std::vector<float> floats(65536);
  for (u32 p = 0; p < 65536; ++p) {
    const u16 b = static_cast<u16>(p);
    pats[p] = b;
    const float f = fmt.to_float(b);
    floats[p] = f;
    if (fmt.is_nan(b)) {
      if (bits_of(f) != fmt.nan_to_float(b)) bad(hex(b) + " -> " + hex(bits_of(f)) + " (NaN rule)");
      if (fmt.to_bits(f) != (b | (1u << (fmt.mbits - 1)))) bad(hex(b) + " NaN round trip");
      continue;
    }
    const double ref = fmt.decode(b);
    if (static_cast<double>(f) != ref || std::signbit(f) != std::signbit(ref)) bad(hex(b) + " -> " + hex(bits_of(f)));
    if (fmt.to_bits(f) != b) bad(hex(b) + " round trip gives " + hex(fmt.to_bits(f)));
    if (fmt.nearest(ref) != b) bad(hex(b) + " reference encoder disagrees");
  }
  check_bulk_to_float(fmt, pats, bad);
  check_bulk_to_bits(fmt, floats, bad);
  CHECK(bad.count == 0);
}

void check_edges(const Format& fmt, const std::vector<std::pair<u32, u16>>& cases) {
  Mismatches bad;
  std::vector<float> in;
  for (auto [f, want] : cases) {
    in.push_back(float_of(f));
    const u16 got = fmt.to_bits(float_of(f)), ref = fmt.expected(float_of(f));
    if (got != want || ref != want)
      bad(std::string(fmt.name) + "(" + hex(f) + ") = " + hex(got) + ", reference " + hex(ref) + ", want " + hex(want));
  }
  check_bulk_to_bits(fmt, in, bad);
  CHECK(bad.count == 0);
}

void check_random(const Format& fmt, std::size_t n, u32 near_lo, u32 near_hi) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<u32> any, near_exp(near_lo, near_hi);
  std::vector<float> in(n);
  for (std::size_t i = 0; i < n; ++i) {
    u32 x = any(rng);
    if (i % 2) x = (x & 0x807fffffu) | (near_exp(rng) << 23);  // half of them near the format's range
    in[i] = float_of(x);
  }
  Mismatches bad;
  for (float f : in)
    if (fmt.to_bits(f) != fmt.expected(f))
      bad(std::string(fmt.name) + "(" + hex(bits_of(f)) + ") = " + hex(fmt.to_bits(f)) + ", reference " + hex(fmt.expected(f)));
  check_bulk_to_bits(fmt, in, bad);
  CHECK(bad.count == 0);
}

void check_all_float_nans(const Format& fmt) {
  Mismatches bad;
  std::vector<float> in(1u << 16);
  for (u32 sign : {0u, 0x80000000u}) {
    for (u32 base = 1; base < (1u << 23); base += in.size()) {
      for (u32 i = 0; i < in.size(); ++i) in[i] = float_of(sign | 0x7f800000u | std::min(base + i, 0x7fffffu));
      for (float f : in)
        if (fmt.to_bits(f) != fmt.nan_from_float(bits_of(f))) bad(hex(bits_of(f)) + " -> " + hex(fmt.to_bits(f)));
      check_bulk_to_bits(fmt, in, bad);
    }
  }
  CHECK(bad.count == 0);
}

}  // namespace

TEST_CASE("conversion_isa reports and switches the bulk implementation") {
  const std::string hw = mpt::conversion_isa();
  CHECK((hw == "avx512" || hw == "f16c" || hw == "portable"));
  mpt::force_portable_conversions(true);
  CHECK(std::string(mpt::conversion_isa()) == "portable");
  mpt::force_portable_conversions(false);
  CHECK(std::string(mpt::conversion_isa()) == hw);
  CHECK_FALSE(mpt::force_conversion_isa("sse"));
  CHECK(std::string(mpt::conversion_isa()) == hw);
  MESSAGE("bulk conversions use " << hw);
}

TEST_CASE("half and bfloat16_t wrap the scalar conversions") {
  CHECK(mpt::half(1.0f / 3.0f).bits == 0x3555);
  CHECK(static_cast<float>(mpt::half::from_bits(0x3c00)) == 1.0f);
  CHECK(mpt::bfloat16_t(1.0f / 3.0f).bits == 0x3eab);
  CHECK(static_cast<float>(mpt::bfloat16_t::from_bits(0xc040)) == -3.0f);
}

TEST_CASE("float16: all 65536 patterns against ldexp and back") { check_all_patterns(fp16()); }
TEST_CASE("bfloat16: all 65536 patterns against ldexp and back") { check_all_patterns(bf16()); }

TEST_CASE("float16: float32 edge cases") {
  const u32 one = 0x3f800000, tie = 0x3f801000;  // 1 + 2^-11
  check_edges(fp16(), {
      {one, 0x3c00}, {tie, 0x3c00}, {tie + 1, 0x3c01}, {tie - 1, 0x3c00},
      {0x3f803000, 0x3c02},                                   // 1 + 3*2^-11 -> 1 + 2^-9
      {bits_of(1.0f / 3.0f), 0x3555}, {bits_of(-2.5f), 0xc100},
      {bits_of(65504.0f), 0x7bff}, {bits_of(65519.99f), 0x7bff}, {bits_of(65520.0f), 0x7c00},
      {bits_of(-65520.0f), 0xfc00}, {bits_of(1e6f), 0x7c00}, {bits_of(FLT_MAX), 0x7c00},
      {bits_of(INFINITY), 0x7c00}, {bits_of(-INFINITY), 0xfc00},
      {bits_of(0x1p-24f), 0x0001}, {bits_of(0x1p-25f), 0x0000}, {bits_of(-0x1p-25f), 0x8000},
      {bits_of(0x1p-25f) + 1, 0x0001}, {bits_of(0x1p-25f) - 1, 0x0000},
      {bits_of(0x3p-25f), 0x0002}, {bits_of(0x5p-25f), 0x0002}, {bits_of(0x7p-25f), 0x0004},  // ties
      {bits_of(0x3p-25f) - 1, 0x0001}, {bits_of(0x5p-25f) + 1, 0x0003},
      {bits_of(0x1p-14f), 0x0400}, {bits_of(0x1p-14f - 0x1p-24f), 0x03ff},
      {bits_of(0x1p-14f - 0x1p-25f), 0x0400}, {bits_of(0x1p-14f - 0x1p-25f) - 1, 0x03ff},
      {bits_of(0x1p-14f + 0x1p-24f), 0x0401}, {bits_of(0x1p-14f + 0x1p-25f), 0x0400}, {bits_of(0x1p-14f + 0x3p-25f), 0x0402},
      {0x00000001, 0x0000}, {0x807fffff, 0x8000}, {0x00000000, 0x0000}, {0x80000000, 0x8000},
      {0x7fc00000, 0x7e00}, {0xffc00000, 0xfe00}, {0x7f800001, 0x7e00}, {0xff800001, 0xfe00},
      {0x7fa00000, 0x7f00}, {0x7f802000, 0x7e01}, {0xff9fe000, 0xfeff}, {0x7f801fff, 0x7e00},
      {0x7fffffff, 0x7fff}, {0xffd55555, 0xfeaa},
  });
}

TEST_CASE("bfloat16: float32 edge cases") {
  check_edges(bf16(), {
      {0x3f800000, 0x3f80}, {0x3f808000, 0x3f80}, {0x3f808001, 0x3f81}, {0x3f807fff, 0x3f80},
      {0x3f818000, 0x3f82}, {bits_of(1.0f / 3.0f), 0x3eab},
      {0x7f7f7fff, 0x7f7f}, {0x7f7f8000, 0x7f80}, {0x7f7fffff, 0x7f80}, {0xff7fffff, 0xff80},
      {0x7f7e8000, 0x7f7e}, {bits_of(INFINITY), 0x7f80}, {bits_of(-INFINITY), 0xff80},
      {0x00000001, 0x0000}, {0x00008000, 0x0000}, {0x00008001, 0x0001}, {0x00010000, 0x0001},
      {0x00018000, 0x0002}, {0x00028000, 0x0002}, {0x80017fff, 0x8001}, {0x007fffff, 0x0080},
      {0x007f7fff, 0x007f}, {0x807f0000, 0x807f}, {0x00800000, 0x0080}, {0x80000000, 0x8000},
      {0x7fc00000, 0x7fc0}, {0xffc00000, 0xffc0}, {0x7f800001, 0x7fc0}, {0xff810000, 0xffc1},
      {0x7fa00000, 0x7fe0}, {0x7f80ffff, 0x7fc0}, {0x7fffffff, 0x7fff}, {0xffbf0000, 0xffff},
  });
  CHECK(bits_of(mpt::bfloat16_bits_to_float(0x7f81)) == 0x7fc10000u);  // signalling NaN is quieted
  CHECK(bits_of(mpt::bfloat16_bits_to_float(0x0001)) == bits_of(0x1p-133f));
}

TEST_CASE("float16: random float32 patterns") { check_random(fp16(), 1u << 22, 100, 145); }
TEST_CASE("bfloat16: random float32 patterns") { check_random(bf16(), 1u << 22, 0, 255); }

TEST_CASE("float16: every float32 NaN") { check_all_float_nans(fp16()); }
TEST_CASE("bfloat16: every float32 NaN") { check_all_float_nans(bf16()); }

TEST_CASE("bulk conversions: tails and unaligned pointers leave neighbours alone") {
  std::mt19937 rng(7);
  std::vector<u32> raw(80);
  for (auto& r : raw) r = rng();
  raw[3] = 0x7f800001;  // a signalling NaN in every window
  for (const char* isa : bulk_isas()) {
    IsaScope scope(isa);
    for (std::size_t n = 0; n <= 70; ++n) {
      for (std::size_t fo = 0; fo < 16; ++fo) {  // every float position in a cache line
        const std::size_t ho = (5 * fo + 3) % 16;  // and a different offset on the 16-bit side
        CAPTURE(isa);
        CAPTURE(n);
        CAPTURE(fo);
        std::vector<float> src(n + 20), fdst(n + 20, float_of(0x5a5a5a5a));
        std::vector<u16> hsrc(n + 20), hdst(n + 20, 0xa5a5);
        for (std::size_t i = 0; i < n; ++i) {
          src[fo + i] = float_of(raw[i]);
          hsrc[ho + i] = static_cast<u16>(raw[i]);
        }
        for (const Format* fmt : {&fp16(), &bf16()}) {
          std::fill(hdst.begin(), hdst.end(), 0xa5a5);
          std::fill(fdst.begin(), fdst.end(), float_of(0x5a5a5a5a));
          fmt->bulk_to_bits(src.data() + fo, hdst.data() + ho, n);
          fmt->bulk_to_float(hsrc.data() + ho, fdst.data() + fo, n);
          bool ok = true;
          for (std::size_t i = 0; i < n + 20; ++i) {
            ok &= hdst[i] == (i >= ho && i < ho + n ? fmt->to_bits(src[i - ho + fo]) : 0xa5a5);
            ok &= bits_of(fdst[i]) == (i >= fo && i < fo + n ? bits_of(fmt->to_float(hsrc[i - fo + ho])) : 0x5a5a5a5au);
          }
          CHECK_MESSAGE(ok, fmt->name);
        }
      }
    }
  }
}

#ifdef MPT_TEST_GUARD_PAGE
TEST_CASE("bulk conversions: tails ending at an inaccessible page do not touch it") {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* mem = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mem != MAP_FAILED);
  REQUIRE(mprotect(static_cast<char*>(mem) + page, page, PROT_NONE) == 0);
  char* end = static_cast<char*>(mem) + page;  // any access at or past this faults
  std::vector<float> fbuf(40);
  std::vector<u16> hbuf(40);
  for (const char* isa : bulk_isas()) {
    IsaScope scope(isa);
    for (std::size_t n = 1; n <= 40; ++n) {
      CAPTURE(isa);
      CAPTURE(n);
      float* f = reinterpret_cast<float*>(end) - n;
      u16* h = reinterpret_cast<u16*>(end) - n;
      for (const Format* fmt : {&fp16(), &bf16()}) {
        for (std::size_t i = 0; i < n; ++i) f[i] = 1.0f + static_cast<float>(i);
        fmt->bulk_to_bits(f, hbuf.data(), n);   // source ends at the guard page
        fmt->bulk_to_float(hbuf.data(), f, n);  // destination ends at it
        CHECK(f[n - 1] == static_cast<float>(n));
        for (std::size_t i = 0; i < n; ++i) h[i] = hbuf[i];
        fmt->bulk_to_float(h, fbuf.data(), n);
        fmt->bulk_to_bits(fbuf.data(), h, n);
        CHECK(fmt->to_float(h[n - 1]) == static_cast<float>(n));
      }
    }
  }
  CHECK(munmap(mem, 2 * page) == 0);
}
#endif

#if defined(__SSE2__)
TEST_CASE("bulk conversions ignore MXCSR (DAZ, FTZ, rounding mode)") {
  // Inputs that DAZ/FTZ/rounding would change: float32 denormals, half subnormal results, ties.
  std::vector<float> floats;
  for (u32 f : {0x00000001u, 0x807fffffu, 0x00400000u, 0x33000001u, 0x387fc000u, 0x3f801000u, 0x3f808000u,
                0x00008001u, 0x00018000u, 0x477ff000u, 0x7f7f8000u, 0x7f800001u, 0x80000000u})
    floats.push_back(float_of(f));
  for (u32 f = 0x33000000u; f < 0x38900000u; f += 0x1001) floats.push_back(float_of(f));
  std::vector<u16> pats(65536);
  for (u32 p = 0; p < 65536; ++p) pats[p] = static_cast<u16>(p);

  auto run_all = [&] {
    std::vector<u32> out;
    std::vector<u16> h(floats.size());
    std::vector<float> f(pats.size());
    for (const char* isa : bulk_isas()) {
      IsaScope scope(isa);
      for (const Format* fmt : {&fp16(), &bf16()}) {
        fmt->bulk_to_bits(floats.data(), h.data(), h.size());
        fmt->bulk_to_float(pats.data(), f.data(), f.size());
        for (u16 v : h) out.push_back(v);
        for (float v : f) out.push_back(bits_of(v));
        for (float v : floats) out.push_back(fmt->to_bits(v));
        for (u16 v : pats) out.push_back(bits_of(fmt->to_float(v)));
      }
    }
    return out;
  };
  const std::vector<u32> normal = run_all();
  const unsigned saved = _mm_getcsr();
  for (unsigned mode : {0x8040u /* DAZ|FTZ */, 0x0040u /* DAZ */, 0x8000u /* FTZ */, 0x6000u /* toward zero */,
                        0x4000u /* up */, 0xe040u}) {
    _mm_setcsr((saved & ~0xe040u) | mode);
    const std::vector<u32> changed = run_all();
    _mm_setcsr(saved);
    CHECK_MESSAGE(changed == normal, "MXCSR mode " << hex(mode));
  }
}
#endif

// Every float32 input, bulk against scalar; a minute or two, so only on request (--no-skip).
TEST_CASE("float16/bfloat16: all 2^32 float32 inputs, bulk == scalar" * doctest::skip()) {
  std::vector<float> in(1u << 22);
  for (const Format* fmt : {&fp16(), &bf16()}) {
    Mismatches bad;
    for (std::uint64_t base = 0; base < (1ull << 32); base += in.size()) {
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = float_of(static_cast<u32>(base + i));
      check_bulk_to_bits(*fmt, in, bad);
    }
    CHECK(bad.count == 0);
  }
}
