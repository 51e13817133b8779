// Weight gradients of bfloat16 convolutions on AMX tiles (and AVX-512 BW, which every AMX CPU
// has): nothing in this file runs unless amx_enabled().
//
// dw[i, j, ci, co] = sum over output pixels p of x[p * stride + tap(i, j), ci] * dy[p, co]. The
// zero-padded input is split into stride_h x stride_w phases (phase (pa, pb) holds the padded
// pixels (y * sh + pa, x * sw + pb)), all on one grid of rows r = (n * gh + y) * gw + x. Output
// pixel (oy, ox) is grid row r = (n * gh + oy) * gw + ox, and its tap (i, j) reads one phase at
// grid row r + (i * dh / sh) * gw + j * dw / sw: every tap is one GEMM dw_ij[ci][co] = sum_r
// xt[phase][ci][r + off_ij] * dy[r][co] over the same rows, with dy zero on the grid rows that are
// no output pixel (the right and bottom margins, 10-40 % more rows for 3x3 kernels). Two copies
// feed the tiles: xt, the phases channels-major (a tile row is 32 consecutive grid rows of one
// channel, at any tap offset; transposed 32x32 at a time in registers), and dyv, dy's row pairs
// interleaved as TDPBF16PS wants its B operand. Each thread takes a share of the grid in blocks
// of 512 rows or more (at least 4x the largest tap offset, for wide images), builds a block's xt
// (plus the rows that offset reaches) and dyv in cache, runs all taps over it into its own
// float32 accumulators, and prefetches the next block's input; the accumulators are added in
// thread order.
//
// oneDNN 2.6 runs this pass in float32 (it has AMX forward convolutions only): for the second
// layer of the Fashion-MNIST CNN, 2.7 ms staged through float32 copies against 1.1 ms here.
#include "backend/cpu/conv_amx.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/dnnl_util.hpp"
#include "backend/cpu/vector_types.hpp"

namespace mpt::cpu {
namespace {

using conv::ConvShape;

constexpr std::int64_t kRowsPerChunk = 32;   // K of one TDPBF16PS
constexpr std::int64_t kMinBlockRows = 512;   // grid rows per accumulation block, at least
constexpr std::int64_t kMaxBlockRows = 4096;  // and at most

// Tiles 0-3: float32 accumulators [16 ci][16 co]; 4-5: xt [16 ci][32 rows]; 6-7: dyv [16 row
// pairs][16 co x 2]. All are 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette, start_row, reserved[14];
  std::uint16_t colsb[16];
  std::uint8_t rows[16];
};

#define MPT_TILE_LOAD(t, base, stride) \
  asm volatile("tileloadd (%0,%1,1), %%tmm" #t : : "r"(base), "r"(stride) : "memory")
#define MPT_TILE_STORE(t, base, stride) \
  asm volatile("tilestored %%tmm" #t ", (%0,%1,1)" : : "r"(base), "r"(stride) : "memory")
#define MPT_TILE_DP(c, a, b) asm volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

void tiles_configure() {
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  asm volatile("ldtilecfg %0" : : "m"(cfg));
}

void tiles_release() { asm volatile("tilerelease" ::); }

// Only the functions that use AVX-512 carry it: code from headers (templates, inline functions)
// instantiated here must stay baseline, since the linker may keep this copy for every caller.
#define MPT_AVX512BW __attribute__((target("avx512f,avx512bw")))

std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

/// The grid of one convolution: rows r = (n * gh + y) * gw + x, where grid point (y, x) of phase
/// (pa, pb) is the padded input pixel (y * sh + pa, x * sw + pb).
struct Grid {
  struct Tap {
    std::int64_t offset, slot;  // grid-row offset; the phase's slot in xt
  };
  std::int64_t gh, gw, rows, block_rows, padded_rows, blocks, pitch, cin16, cout16, sh, sw;
  std::vector<Tap> taps;                                    // i * kw + j
  std::vector<std::pair<std::int64_t, std::int64_t>> phases;  // (pa, pb) of each slot, as used

  Grid(const ConvShape& s, const Conv2dGeometry& g)
      : gh((s.h + g.pad_top + g.pad_bottom + g.stride_h - 1) / g.stride_h),
        gw((s.w + g.pad_left + g.pad_right + g.stride_w - 1) / g.stride_w),
        rows(s.n * gh * gw),
        cin16(round_up(s.cin, 16)),
        cout16(round_up(s.cout, 16)),
        sh(g.stride_h),
        sw(g.stride_w) {
    std::int64_t reach = 0;
    for (std::int64_t i = 0; i < s.kh; ++i)
      for (std::int64_t j = 0; j < s.kw; ++j) {
        const std::int64_t vy = i * g.dilation_h, vx = j * g.dilation_w;
        const std::pair<std::int64_t, std::int64_t> phase{vy % sh, vx % sw};
        auto it = std::find(phases.begin(), phases.end(), phase);
        if (it == phases.end()) it = phases.insert(it, phase);
        taps.push_back({vy / sh * gw + vx / sw, it - phases.begin()});
        reach = std::max(reach, taps.back().offset);
      }
    // A block's xt also holds the rows its largest tap offset reaches: blocks of at least 4x that
    // reach (wide images) keep this overlap under a quarter of the copy.
    block_rows = std::clamp(round_up(4 * reach, kMinBlockRows), kMinBlockRows, kMaxBlockRows);
    padded_rows = round_up(rows, block_rows);
    blocks = padded_rows / block_rows;
    pitch = round_up(block_rows + reach, kRowsPerChunk);
    if (pitch * 2 % 4096 == 0) pitch += kRowsPerChunk;  // xt rows 4 KB apart would share cache sets
  }
  std::int64_t xt_size() const { return static_cast<std::int64_t>(phases.size()) * cin16 * pitch; }
};

/// A 32x32 block of 16-bit values transposed in registers: at each scale b = 16, 8, ..., 1 the
/// off-diagonal b x b blocks of every 2b x 2b block swap places. Scales of 2 or more elements
/// move 32- or 64-bit lanes (one-uop VPERMT2D/Q); the last scale pairs 16-bit halves with shifts
/// and blends (VPERMT2W is three uops).
MPT_AVX512BW void transpose32(__m512i v[32]) {
  for (int b = 16; b >= 4; b /= 2) {  // 64-bit lanes: q = b / 4 of them per block
    alignas(64) std::int64_t lo[8], hi[8];
    const int q = b / 4;
    for (int c = 0; c < 8; ++c) lo[c] = c & q ? 8 + c - q : c, hi[c] = c & q ? 8 + c : c + q;
    const __m512i il = _mm512_load_si512(lo), ih = _mm512_load_si512(hi);
    for (int i = 0; i < 32; ++i)
      if (!(i & b)) {
        const __m512i x = v[i], y = v[i + b];
        v[i] = _mm512_permutex2var_epi64(x, il, y);
        v[i + b] = _mm512_permutex2var_epi64(x, ih, y);
      }
  }
  alignas(64) std::int32_t lo[16], hi[16];
  for (int c = 0; c < 16; ++c) lo[c] = c & 1 ? 16 + c - 1 : c, hi[c] = c & 1 ? 16 + c : c + 1;
  const __m512i il = _mm512_load_si512(lo), ih = _mm512_load_si512(hi);
  for (int i = 0; i < 32; i += 4)
    for (int k = i; k < i + 2; ++k) {
      const __m512i x = v[k], y = v[k + 2];
      v[k] = _mm512_permutex2var_epi32(x, il, y);
      v[k + 2] = _mm512_permutex2var_epi32(x, ih, y);
    }
  constexpr __mmask32 odd = 0xAAAAAAAAu;
  for (int i = 0; i < 32; i += 2) {
    const __m512i x = v[i], y = v[i + 1];
    v[i] = _mm512_mask_blend_epi16(odd, x, _mm512_maskz_slli_epi32(0xFFFF, y, 16));
    v[i + 1] = _mm512_mask_blend_epi16(odd, _mm512_maskz_srli_epi32(0xFFFF, x, 16), y);
  }
}

/// Block blk of xt, for each phase slot: xt[slot][ci][k] = the phase's padded input at grid row
/// blk * block_rows + k for k < pitch (zero past the last image and for ci >= cin), 32 grid rows x 32
/// channels transposed at a time.
MPT_AVX512BW void build_xt_block(const bf16_bits* x, const ConvShape& s, const Conv2dGeometry& g, const Grid& gr,
                    std::int64_t blk, bf16_bits* xt) {
  const bf16_bits* src[kRowsPerChunk];
  __m512i v[32];
  for (std::size_t slot = 0; slot < gr.phases.size(); ++slot) {
    const auto [pa, pb] = gr.phases[slot];
    bf16_bits* out = xt + static_cast<std::int64_t>(slot) * gr.cin16 * gr.pitch;
    for (std::int64_t k0 = 0; k0 < gr.pitch; k0 += kRowsPerChunk) {
      const std::int64_t r0 = blk * gr.block_rows + k0;
      std::int64_t n = r0 / (gr.gh * gr.gw), y = r0 / gr.gw % gr.gh, xx = r0 % gr.gw;
      for (std::int64_t k = 0; k < kRowsPerChunk; ++k) {
        const std::int64_t iy = y * gr.sh + pa - g.pad_top, ix = xx * gr.sw + pb - g.pad_left;
        src[k] = n < s.n && iy >= 0 && iy < s.h && ix >= 0 && ix < s.w ? x + ((n * s.h + iy) * s.w + ix) * s.cin : nullptr;
        if (++xx == gr.gw) xx = 0, ++y == gr.gh ? (y = 0, ++n) : 0;
      }
      for (std::int64_t c0 = 0; c0 < gr.cin16; c0 += 32) {
        const std::int64_t m = std::clamp<std::int64_t>(s.cin - c0, 0, 32);
        const __mmask32 mask = m == 32 ? ~__mmask32(0) : (__mmask32(1) << m) - 1;
        for (int k = 0; k < 32; ++k) v[k] = src[k] ? _mm512_maskz_loadu_epi16(mask, src[k] + c0) : _mm512_setzero_si512();
        transpose32(v);
        for (std::int64_t c = 0; c < std::min<std::int64_t>(32, gr.cin16 - c0); ++c)
          _mm512_storeu_si512(out + (c0 + c) * gr.pitch + k0, v[c]);
      }
    }
  }
}

/// Block blk of dyv: dyv[p][co][e] = dy at grid row blk * block_rows + 2p + e (zero where that row is
/// no output pixel, and for co >= cout): 32-bit lanes holding the even row's value in the low
/// half, the odd row's in the high.
MPT_AVX512BW void build_dyv_block(const bf16_bits* dy, const ConvShape& s, const Grid& gr, std::int64_t blk, const bf16_bits* zeros,
                     bf16_bits* dyv) {
  const std::int64_t r0 = blk * gr.block_rows;
  std::int64_t n = r0 / (gr.gh * gr.gw), y = r0 / gr.gw % gr.gh, xx = r0 % gr.gw;
  auto next_row = [&] {  // dy's row at grid position (n, y, xx), then advance
    const bf16_bits* p = n < s.n && y < s.oh && xx < s.ow ? dy + ((n * s.oh + y) * s.ow + xx) * s.cout : zeros;
    if (++xx == gr.gw) xx = 0, ++y == gr.gh ? (y = 0, ++n) : 0;
    return p;
  };
  for (std::int64_t p = 0; p < gr.block_rows / 2; ++p) {
    const bf16_bits* __restrict lo = next_row();
    const bf16_bits* __restrict hi = next_row();
    auto* __restrict dst = reinterpret_cast<std::uint32_t*>(dyv + p * gr.cout16 * 2);
    for (std::int64_t co = 0; co < s.cout; ++co) dst[co] = lo[co] | static_cast<std::uint32_t>(hi[co]) << 16;
    for (std::int64_t co = s.cout; co < gr.cout16; ++co) dst[co] = 0;
  }
}

/// acc[MI x 16 ci][NJ x 16 co] += xt rows (MI x 16 channels from a) times dyv columns (NJ x 16
/// channels from b), over `chunks` chunks of 32 grid rows.
template <int MI, int NJ>
void tile_block(const bf16_bits* a, std::int64_t a_stride, const bf16_bits* b, std::int64_t b_stride,
                std::int64_t chunks, float* acc, std::int64_t acc_stride) {
  const std::int64_t a_next = 16 * (a_stride / 2), acc_next = 16 * (acc_stride / 4);
  MPT_TILE_LOAD(0, acc, acc_stride);
  if constexpr (NJ > 1) MPT_TILE_LOAD(1, acc + 16, acc_stride);
  if constexpr (MI > 1) MPT_TILE_LOAD(2, acc + acc_next, acc_stride);
  if constexpr (MI > 1 && NJ > 1) MPT_TILE_LOAD(3, acc + acc_next + 16, acc_stride);
  for (std::int64_t c = 0; c < chunks; ++c) {
    const bf16_bits* ac = a + c * kRowsPerChunk;
    const bf16_bits* bc = b + c * (kRowsPerChunk / 2) * (b_stride / 2);
    // Each product issues as soon as its operands are in (the order oneDNN's brgemm uses).
    MPT_TILE_LOAD(4, ac, a_stride);
    MPT_TILE_LOAD(6, bc, b_stride);
    MPT_TILE_DP(0, 4, 6);
    if constexpr (NJ > 1) {
      MPT_TILE_LOAD(7, bc + 32, b_stride);
      MPT_TILE_DP(1, 4, 7);
    }
    if constexpr (MI > 1) {
      MPT_TILE_LOAD(5, ac + a_next, a_stride);
      MPT_TILE_DP(2, 5, 6);
      if constexpr (NJ > 1) MPT_TILE_DP(3, 5, 7);
    }
  }
  MPT_TILE_STORE(0, acc, acc_stride);
  if constexpr (NJ > 1) MPT_TILE_STORE(1, acc + 16, acc_stride);
  if constexpr (MI > 1) MPT_TILE_STORE(2, acc + acc_next, acc_stride);
  if constexpr (MI > 1 && NJ > 1) MPT_TILE_STORE(3, acc + acc_next + 16, acc_stride);
}

/// Pixels of an [n, h, w] image batch that grid rows [r0, r1) read, where grid point (y, x)
/// covers pixels (y * sy - pt, x * sx - pl) to (y * sy + sy - 1 - pt, x * sx + sx - 1 - pl): a
/// range, as clamped pixel indices grow with r.
std::pair<std::int64_t, std::int64_t> pixel_range(const Grid& gr, std::int64_t r0, std::int64_t r1, std::int64_t n,
                                                  std::int64_t h, std::int64_t w, std::int64_t sy, std::int64_t sx,
                                                  std::int64_t pt, std::int64_t pl) {
  auto pixel = [&](std::int64_t r, std::int64_t last) {
    const std::int64_t i = r / (gr.gh * gr.gw);
    if (i >= n) return n * h * w;
    const std::int64_t y = std::clamp<std::int64_t>(r / gr.gw % gr.gh * sy + last * (sy - 1) - pt, 0, h - 1);
    const std::int64_t x = std::clamp<std::int64_t>(r % gr.gw * sx + last * (sx - 1) - pl, 0, w - 1);
    return (i * h + y) * w + x;
  };
  return {pixel(r0, 0), std::min(pixel(r1 - 1, 1) + 1, n * h * w)};
}

/// Asks for the x and dy rows of block blk to be brought into L2 while the tiles work on the
/// previous block (x and dy come from memory; the block builders would otherwise wait on them).
void prefetch_block(const bf16_bits* x, const bf16_bits* dy, const ConvShape& s, const Conv2dGeometry& g, const Grid& gr,
                    std::int64_t blk) {
  auto lines = [](const bf16_bits* p, std::int64_t from, std::int64_t to) {
    for (const char* c = reinterpret_cast<const char*>(p + from); c < reinterpret_cast<const char*>(p + to); c += 64)
      _mm_prefetch(c, _MM_HINT_T1);
  };
  const std::int64_t r0 = blk * gr.block_rows;
  const auto [x0, x1] = pixel_range(gr, r0, r0 + gr.pitch, s.n, s.h, s.w, gr.sh, gr.sw, g.pad_top, g.pad_left);
  lines(x, x0 * s.cin, x1 * s.cin);
  const auto [y0, y1] = pixel_range(gr, r0, r0 + gr.block_rows, s.n, s.oh, s.ow, 1, 1, 0, 0);
  lines(dy, y0 * s.cout, y1 * s.cout);
}

/// One thread's share: blocks [b0, b1) of the grid rows into acc [taps][cin16][cout16]; xt and
/// dyv hold one block (built here, so that they stay in cache for the tiles).
void accumulate(const bf16_bits* x, const bf16_bits* dy, const ConvShape& s, const Conv2dGeometry& g, const Grid& gr,
                std::int64_t b0, std::int64_t b1, bf16_bits* xt, bf16_bits* dyv, const bf16_bits* zeros, float* acc) {
  const std::int64_t a_stride = gr.pitch * 2, b_stride = gr.cout16 * 4, acc_stride = gr.cout16 * 4;
  const std::int64_t mb = gr.cin16 / 16, nb = gr.cout16 / 16, chunks = gr.block_rows / kRowsPerChunk;
  tiles_configure();
  for (std::int64_t blk = b0; blk < b1; ++blk) {
    build_xt_block(x, s, g, gr, blk, xt);
    build_dyv_block(dy, s, gr, blk, zeros, dyv);
    if (blk + 1 < b1) prefetch_block(x, dy, s, g, gr, blk + 1);
    for (std::size_t t = 0; t < gr.taps.size(); ++t) {
      const bf16_bits* a_tap = xt + gr.taps[t].slot * gr.cin16 * gr.pitch + gr.taps[t].offset;
      float* acc_t = acc + static_cast<std::int64_t>(t) * gr.cin16 * gr.cout16;
      for (std::int64_t i = 0; i < mb; i += 2)
        for (std::int64_t j = 0; j < nb; j += 2) {
          const bf16_bits* a = a_tap + i * 16 * gr.pitch;
          const bf16_bits* b = dyv + j * 32;
          float* c = acc_t + i * 16 * gr.cout16 + j * 16;
          const bool two_i = i + 1 < mb, two_j = j + 1 < nb;
          if (two_i && two_j) tile_block<2, 2>(a, a_stride, b, b_stride, chunks, c, acc_stride);
          else if (two_i) tile_block<2, 1>(a, a_stride, b, b_stride, chunks, c, acc_stride);
          else if (two_j) tile_block<1, 2>(a, a_stride, b, b_stride, chunks, c, acc_stride);
          else tile_block<1, 1>(a, a_stride, b, b_stride, chunks, c, acc_stride);
        }
    }
  }
  tiles_release();
}

}  // namespace

void amx_conv_backward_weights(const Tensor& x, const Tensor& dy, const ConvShape& s, const Conv2dGeometry& g,
                               float* dw, float* db) {
  const Grid gr(s, g);
  const Device cpu = Device::cpu();
  const auto* xs = static_cast<const bf16_bits*>(x.data_ptr());
  const auto* dys = static_cast<const bf16_bits*>(dy.data_ptr());
  const std::int64_t threads = omp_in_parallel() ? 1 : std::clamp<std::int64_t>(omp_get_max_threads(), 1, gr.blocks);
  const std::int64_t taps = static_cast<std::int64_t>(gr.taps.size()), acc_size = taps * gr.cin16 * gr.cout16;
  const std::int64_t xt_size = gr.xt_size(), dyv_size = gr.block_rows * gr.cout16;
  Tensor acc = Tensor::zeros({threads * acc_size}, float32, cpu);
  Tensor scratch = Tensor::empty({threads * (xt_size + dyv_size)}, bfloat16, cpu);
  const std::vector<bf16_bits> zeros(static_cast<std::size_t>(gr.cout16), 0);
  float* accs = acc.data<float>();
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    const std::int64_t t = omp_get_thread_num();
    bf16_bits* xt = static_cast<bf16_bits*>(scratch.data_ptr()) + t * (xt_size + dyv_size);
    accumulate(xs, dys, s, g, gr, gr.blocks * t / threads, gr.blocks * (t + 1) / threads, xt, xt + xt_size,
               zeros.data(), accs + t * acc_size);
  }
  for (std::int64_t tap = 0; tap < taps; ++tap)
    for (std::int64_t ci = 0; ci < s.cin; ++ci)
      for (std::int64_t co = 0; co < s.cout; ++co) {
        float sum = 0;
        for (std::int64_t t = 0; t < threads; ++t) sum += accs[t * acc_size + (tap * gr.cin16 + ci) * gr.cout16 + co];
        dw[(tap * s.cin + ci) * s.cout + co] = sum;
      }
  if (!db) return;
  // db: each thread sums its rows of dy in float32, the partials are added in thread order.
  std::vector<float> part(static_cast<std::size_t>(threads * s.cout), 0.0f);
  const std::int64_t pixels = s.n * s.oh * s.ow;
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    const std::int64_t t = omp_get_thread_num();
    float* p = part.data() + t * s.cout;
    for (std::int64_t r = pixels * t / threads; r < pixels * (t + 1) / threads; ++r)
      for (std::int64_t co = 0; co < s.cout; ++co) p[co] += widen(dys[r * s.cout + co]);
  }
  for (std::int64_t co = 0; co < s.cout; ++co) {
    float sum = 0;
    for (std::int64_t t = 0; t < threads; ++t) sum += part[t * s.cout + co];
    db[co] = sum;
  }
}

}  // namespace mpt::cpu
