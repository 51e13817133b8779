#pragma once
/// IEEE float16 and bfloat16 scalars and bulk conversions.
///
/// Every conversion rounds to nearest even, keeps NaN a (quiet) NaN with its sign and upper
/// payload bits, overflows to +-inf and handles subnormals exactly.
///
///   mpt::half h(1.0f / 3.0f);            // 0x3555
///   float f = static_cast<float>(h);
///   std::vector<std::uint16_t> bits(n);
///   mpt::float_to_half(src.data(), bits.data(), n);   // vectorised (AVX-512 / F16C)
#include <cstddef>
#include <cstdint>

namespace mpt {

// Scalar conversions (portable bit manipulation).
std::uint16_t float_to_half_bits(float f);
float half_bits_to_float(std::uint16_t h);
std::uint16_t float_to_bfloat16_bits(float f);
float bfloat16_bits_to_float(std::uint16_t b);

// Bulk conversions: vectorised where the CPU allows (chosen at run time), scalar otherwise.
void float_to_half(const float* src, std::uint16_t* dst, std::size_t n);
void half_to_float(const std::uint16_t* src, float* dst, std::size_t n);
void float_to_bfloat16(const float* src, std::uint16_t* dst, std::size_t n);
void bfloat16_to_float(const std::uint16_t* src, float* dst, std::size_t n);

/// Which implementation the bulk conversions use: "avx512", "f16c" or "portable".
const char* conversion_isa();
/// Forces the portable path (true) or restores run-time selection (false); for tests and bench.
void force_portable_conversions(bool on);
/// Forces one bulk implementation by name ("portable", "f16c", "avx512"), or restores run-time
/// selection (nullptr); false, changing nothing, if the CPU cannot run it. For tests and bench.
bool force_conversion_isa(const char* isa);

struct half {
  std::uint16_t bits = 0;
  half() = default;
  explicit half(float f) : bits(float_to_half_bits(f)) {}
  static half from_bits(std::uint16_t b) { half h; h.bits = b; return h; }
  explicit operator float() const { return half_bits_to_float(bits); }
};

struct bfloat16_t {
  std::uint16_t bits = 0;
  bfloat16_t() = default;
  explicit bfloat16_t(float f) : bits(float_to_bfloat16_bits(f)) {}
  static bfloat16_t from_bits(std::uint16_t b) { bfloat16_t h; h.bits = b; return h; }
  explicit operator float() const { return bfloat16_bits_to_float(bits); }
};

}  // namespace mpt
