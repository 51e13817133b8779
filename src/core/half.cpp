#include "mpt/half.hpp"

#include "core/cpu_isa.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <string_view>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define MPT_HALF_X86 1
// GCC 12's intrinsics start from _mm512_undefined_*(), which trips -W[maybe-]uninitialized (PR105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

// NaN rule shared by every path, taken from what VCVTPS2PH/VCVTPH2PS do (checked on hardware):
// the result is quiet, keeps the sign and keeps the payload bits that fit (the top ones when
// narrowing). The vector paths never consult MXCSR: rounding comes from the immediate, FTZ is
// ignored by both F16C instructions and VCVTPH2PS ignores DAZ; VCVTPS2PH honours DAZ, but a
// float32 denormal rounds to +-0 in half under round-to-nearest anyway. The bfloat16 paths are
// integer arithmetic.

namespace mpt {

std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | ((a >> 13) & 0x3ffu);
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520: rounds past 65504
  if (a >= 0x38800000u) {                        // normal half: rebias, then RNE on 13 bits
    const std::uint32_t r = a - (112u << 23);
    return sign | static_cast<std::uint16_t>((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25: the tie at 2^-25 goes to even (zero)
  const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - (a >> 23);  // 14..24; the result counts units of 2^-24
  const std::uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
  // q + 1 may reach 0x400, which is exactly the smallest normal half.
  return sign | static_cast<std::uint16_t>(q + (rem > halfway || (rem == halfway && (q & 1u))));
}

float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  std::uint32_t bits;
  if (e == 0x1f) {
    bits = sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u);
  } else if (e != 0) {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    bits = sign;
  } else {  // subnormal half is normal in float: move the leading one to the implicit bit
    const int p = std::bit_width(m) - 1;
    bits = sign | (static_cast<std::uint32_t>(p + 103) << 23) | ((m << (23 - p)) & 0x7fffffu);
  }
  return std::bit_cast<float>(bits);
}

std::uint16_t float_to_bfloat16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float bfloat16_bits_to_float(std::uint16_t b) {
  const std::uint32_t q = (b & 0x7fffu) > 0x7f80u ? 0x40u : 0u;
  return std::bit_cast<float>(static_cast<std::uint32_t>(b | q) << 16);
}

namespace {

enum class Isa { portable, f16c, avx512 };
constexpr const char* kIsaNames[] = {"portable", "f16c", "avx512"};
constexpr int kNoOverride = -1;
std::atomic<int> g_override{kNoOverride};

// The process's CPU tier (core/cpu_isa.hpp, MPT_CPU_ISA included): its avx2 tier has F16C, its
// avx512 tier AVX-512 F, BW and VL besides.
Isa detect_isa() {
#ifdef MPT_HALF_X86
  switch (detail::cpu_isa()) {
    case detail::CpuIsa::avx512: return Isa::avx512;
    case detail::CpuIsa::avx2: return Isa::f16c;
    case detail::CpuIsa::baseline: break;
  }
#endif
  return Isa::portable;
}

Isa hardware_isa() {
  static const Isa hw = detect_isa();
  return hw;
}

Isa active_isa() {
  const int o = g_override.load(std::memory_order_relaxed);
  return o == kNoOverride ? hardware_isa() : static_cast<Isa>(o);
}

#ifdef MPT_HALF_X86
#define MPT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))
#define MPT_F16C __attribute__((target("avx2,f16c")))
constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// Elements before the float side reaches an `align`-byte boundary. Unaligned full-width accesses
// straddle two cache lines every time (64 bytes) or every other time (32 bytes); on large arrays
// split 64-byte stores measured 10-20% slower (malloc gives 16-byte alignment).
std::size_t head_to_align(const float* p, std::size_t align, std::size_t n) {
  const std::size_t off = reinterpret_cast<std::uintptr_t>(p) % align;
  return off == 0 ? 0 : std::min(n, (align - off) / sizeof(float));
}

constexpr __mmask16 lanes(std::size_t count) { return static_cast<__mmask16>((1u << count) - 1u); }

// 16 lanes under mask k: masked loads and stores neither fault on nor touch the lanes left out.
MPT_AVX512 void f2h16(const float* s, std::uint16_t* d, __mmask16 k) {
  _mm256_mask_storeu_epi16(d, k, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, s), kRne));
}

MPT_AVX512 void h2f16(const std::uint16_t* s, float* d, __mmask16 k) {
  _mm512_mask_storeu_ps(d, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, s)));
}

// VCVTNEPS2BF16 would flush float32 denormals, so this is the scalar formula in 16 lanes.
MPT_AVX512 void f2bf16(const float* s, std::uint16_t* d, __mmask16 k) {
  const __m512i x = _mm512_maskz_loadu_epi32(k, s);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), odd), 16);
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
  _mm256_mask_storeu_epi16(d, k, _mm512_cvtepi32_epi16(r));
}

MPT_AVX512 void bf2f16(const std::uint16_t* s, float* d, __mmask16 k) {
  const __m512i x = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, s)), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  _mm512_mask_storeu_epi32(d, k, _mm512_mask_or_epi32(x, nan, x, _mm512_set1_epi32(0x400000)));
}

// Masked head up to the float side's 64-byte boundary, full blocks, masked tail.
template <class Src, class Dst, void (*Block)(const Src*, Dst*, __mmask16)>
MPT_AVX512 void run_avx512(const Src* src, Dst* dst, std::size_t n, const float* float_side) {
  const std::size_t head = head_to_align(float_side, 64, n);
  Block(src, dst, lanes(head));
  std::size_t i = head;
  for (; i + 16 <= n; i += 16) Block(src + i, dst + i, 0xffff);
  Block(src + i, dst + i, lanes(n - i));
}

MPT_F16C void f2h_f16c(const float* src, std::uint16_t* dst, std::size_t n) {
  std::size_t i = 0;
  for (const std::size_t head = head_to_align(src, 32, n); i < head; ++i) dst[i] = float_to_half_bits(src[i]);
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRne));
  for (; i < n; ++i) dst[i] = float_to_half_bits(src[i]);
}

MPT_F16C void h2f_f16c(const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (const std::size_t head = head_to_align(dst, 32, n); i < head; ++i) dst[i] = half_bits_to_float(src[i]);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_bits_to_float(src[i]);
}

MPT_F16C __m256i f2bf_avx2_vec(__m256i x) {
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd), 16);
  const __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, q, nan);
}

MPT_F16C void f2bf_f16c(const float* src, std::uint16_t* dst, std::size_t n) {
  std::size_t i = 0;
  for (const std::size_t head = head_to_align(src, 32, n); i < head; ++i) dst[i] = float_to_bfloat16_bits(src[i]);
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = f2bf_avx2_vec(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m256i hi = f2bf_avx2_vec(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // packus works per 128-bit lane; the permute puts the four 64-bit groups back in order.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8));
  }
  for (; i < n; ++i) dst[i] = float_to_bfloat16_bits(src[i]);
}

MPT_F16C void bf2f_f16c(const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (const std::size_t head = head_to_align(dst, 32, n); i < head; ++i) dst[i] = bfloat16_bits_to_float(src[i]);
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i q = _mm256_and_si256(nan, _mm256_set1_epi32(0x400000));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_or_si256(x, q));
  }
  for (; i < n; ++i) dst[i] = bfloat16_bits_to_float(src[i]);
}
#endif  // MPT_HALF_X86

}  // namespace

void float_to_half(const float* src, std::uint16_t* dst, std::size_t n) {
#ifdef MPT_HALF_X86
  switch (active_isa()) {
    case Isa::avx512: return run_avx512<float, std::uint16_t, f2h16>(src, dst, n, src);
    case Isa::f16c: return f2h_f16c(src, dst, n);
    case Isa::portable: break;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) dst[i] = float_to_half_bits(src[i]);
}

void half_to_float(const std::uint16_t* src, float* dst, std::size_t n) {
#ifdef MPT_HALF_X86
  switch (active_isa()) {
    case Isa::avx512: return run_avx512<std::uint16_t, float, h2f16>(src, dst, n, dst);
    case Isa::f16c: return h2f_f16c(src, dst, n);
    case Isa::portable: break;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) dst[i] = half_bits_to_float(src[i]);
}

void float_to_bfloat16(const float* src, std::uint16_t* dst, std::size_t n) {
#ifdef MPT_HALF_X86
  switch (active_isa()) {
    case Isa::avx512: return run_avx512<float, std::uint16_t, f2bf16>(src, dst, n, src);
    case Isa::f16c: return f2bf_f16c(src, dst, n);
    case Isa::portable: break;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) dst[i] = float_to_bfloat16_bits(src[i]);
}

void bfloat16_to_float(const std::uint16_t* src, float* dst, std::size_t n) {
#ifdef MPT_HALF_X86
  switch (active_isa()) {
    case Isa::avx512: return run_avx512<std::uint16_t, float, bf2f16>(src, dst, n, dst);
    case Isa::f16c: return bf2f_f16c(src, dst, n);
    case Isa::portable: break;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) dst[i] = bfloat16_bits_to_float(src[i]);
}

const char* conversion_isa() { return kIsaNames[static_cast<int>(active_isa())]; }

void force_portable_conversions(bool on) {
  g_override.store(on ? static_cast<int>(Isa::portable) : kNoOverride, std::memory_order_relaxed);
}

bool force_conversion_isa(const char* isa) {
  if (isa == nullptr) {
    g_override.store(kNoOverride, std::memory_order_relaxed);
    return true;
  }
  for (int i = 0; i <= static_cast<int>(hardware_isa()); ++i) {  // names in order of capability
    if (std::string_view(isa) == kIsaNames[i]) {
      g_override.store(i, std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

}  // namespace mpt
