// mpt's own GEMM for 16-bit operands (packed_gemm.hpp), in the layout of BLIS/GotoBLAS:
//   - each thread owns a range of output columns (or of rows, when there are more rows than
//     columns: the side not split is the one every thread reads whole);
//   - for each panel of kNc of its columns and each block of kKc values of k, it packs op(b)'s
//     block once, widened to float32: slabs of NR columns, each [kc][NR], zero-padded past the end;
//   - for each block of kMc rows, op(a)'s block is widened into a float32 buffer as it lies (rows
//     of a: contiguous conversions; float32 rows are read in place) or, for aᵀ, tile by tile as
//     [kc][R]; micro_gemm.hpp's tiles of R rows by NR columns sum it against each slab, into out
//     itself when out is float32, else into a float32 block (accumulating from the second block
//     of k on);
//   - when a block of rows has its last block of k, its rows get bias and activation and are
//     rounded into out. (A 16-bit output summed over several blocks of k keeps float32 sums of
//     all the thread's rows: past kMaxRows rows the thread works in chunks of them, op(b)'s blocks
//     packed again for each.)
// The widening gives the library's bulk conversion's bits (vector_types.hpp's load_widened: F16C's
// instruction for float16, inlined into the packing loops), the rounding the bulk conversion's
// bits too (store_narrowed: VCVTPS2PH for float16, bfloat16's rule on the lanes), so the only
// difference from the staged path is the order of the float32 sums.
#include "backend/cpu/packed_gemm.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/micro_gemm.hpp"
#include "core/convert.hpp"
#include "core/cpu_isa.hpp"
#include "mpt/error.hpp"

namespace mpt::cpu {
namespace {

constexpr std::int64_t kKc = 512;  // values of k per block (measured best of 128, 256, 384, 512, 1024 at avx2)
constexpr std::int64_t kMc = 144;  // rows per block: a multiple of every tile's R (best of 24 to 288)
constexpr std::int64_t kMaxRows = 8 * kMc;  // rows of a float32 sum kept over several blocks of k
constexpr std::int64_t kNc = 512;  // columns per packed panel of op(b) (best of 256 to 2048)

/// The register tile of each width: R rows by NV vectors (R·NV accumulators, NV vectors of b and
/// one broadcast of a within the tier's registers: 15 of 16 at avx2 and sse, 27 of 32 at avx512).
template <int B> struct Tile;
template <> struct Tile<64> { static constexpr int R = 12, NV = 2; };
template <> struct Tile<32> { static constexpr int R = 6, NV = 2; };
template <> struct Tile<16> { static constexpr int R = 6, NV = 2; };

// Threads split columns in multiples of 32 and rows in multiples of 12 (whole tiles at every width).
constexpr std::int64_t kColUnit = 32, kRowUnit = 12;

struct Job {
  std::int64_t m, n, k;
  const char* a;  // [m, k], or [k, m] when ta
  const char* b;  // [k, n], or [n, k] when tb
  bool ta, tb;
  DType in;            // a's and b's dtype
  const float* bias;   // n values, or null
  Activation act;
  char* out;           // [m, n]
  DType out_dt;
};

/// n values of dtype dt at src, as float32 at dst (the bulk conversion; a copy for float32).
void widen(const char* src, DType dt, float* dst, std::int64_t n) {
  if (n > 0) detail::convert(src, dt, dst, float32, static_cast<std::size_t>(n));
}

/// f(Widen constant) for the operands' dtype: the packing loops below are compiled for each.
template <class F>
[[gnu::always_inline]] inline void with_widen(DType in, F&& f) {
  switch (widen_of(in)) {
    case Widen::f32: return f(std::integral_constant<Widen, Widen::f32>{});
    case Widen::bf16: return f(std::integral_constant<Widen, Widen::bf16>{});
    case Widen::f16: return f(std::integral_constant<Widen, Widen::f16>{});
  }
}

// The packing loops, widening on the tier's lanes (load_widened: the bulk conversion's bits)
// and going through the source a few rows at a time, so each thread's reads and writes stay in
// a few KiB: row by row, through a row buffer and a call per row, the slab writes 32 KiB apart
// had shared cache sets (about 1 ns a value at avx2, 10 % of a 2048 x 2048 GEMM).
constexpr std::int64_t kPackRows = 8;

/// Slabs of op(b)'s columns [0, nt) from rows p of src (column q of row p at src[p·ld + q]): slab
/// s holds columns s·NR.. as [kc][NR], zeros past nt.
template <Widen S, int B, std::int64_t NR>
MPT_KERNEL void pack_b_rows(const char* src, std::int64_t ld, std::int64_t kc, std::int64_t nt, float* bp) {
  constexpr std::int64_t W = Lanes<float, B>::W, isz = widen_bytes<S>;
  const std::int64_t slabs = (nt + NR - 1) / NR;
  for (std::int64_t p0 = 0; p0 < kc; p0 += kPackRows) {
    const std::int64_t pn = std::min(kPackRows, kc - p0);
    for (std::int64_t s = 0; s < slabs; ++s) {
      const std::int64_t c0 = s * NR;
      float* d = bp + (s * kc + p0) * NR;
      const char* row = src + (p0 * ld + c0) * isz;
      if (c0 + NR <= nt) {
        for (std::int64_t p = 0; p < pn; ++p)
          for (std::int64_t v = 0; v < NR; v += W)
            store_lanes(d + p * NR + v, load_widened<S, B>(row + (p * ld + v) * isz));
      } else {
        for (std::int64_t p = 0; p < pn; ++p)
          for (std::int64_t q = 0; q < NR; ++q)
            d[p * NR + q] = c0 + q < nt ? widen_one<S>(row + (p * ld + q) * isz) : 0.f;
      }
    }
  }
}

/// The same slabs from columns of src (row p of column q at src[q·ld + p]: op(b) = bᵀ): W x W
/// squares (W the tier's lanes) widened a column to a register, transposed in registers, stored as
/// slab rows; the edges (a partial slab, kc's last values) one value at a time.
template <Widen S, int B, std::int64_t NR>
MPT_KERNEL void pack_b_cols(const char* src, std::int64_t ld, std::int64_t kc, std::int64_t nt, float* bp) {
  using F = typename Lanes<float, B>::V;
  constexpr std::int64_t W = Lanes<float, B>::W, isz = widen_bytes<S>;
  const std::int64_t slabs = (nt + NR - 1) / NR;
  for (std::int64_t s = 0; s < slabs; ++s) {
    const bool whole = (s + 1) * NR <= nt;
    for (std::int64_t p0 = 0; p0 < kc; p0 += W) {
      const std::int64_t pn = std::min(W, kc - p0);
      float* d = bp + (s * kc + p0) * NR;
      if (whole && pn == W) {
        for (std::int64_t v = 0; v < NR; v += W) {
          F r[W];
          for (std::int64_t q = 0; q < W; ++q) r[q] = load_widened<S, B>(src + ((s * NR + v + q) * ld + p0) * isz);
          transpose_lanes<B>(r);
          for (std::int64_t p = 0; p < W; ++p) store_lanes(d + p * NR + v, r[p]);
        }
      } else {
        for (std::int64_t p = 0; p < pn; ++p)
          for (std::int64_t q = 0; q < NR; ++q)
            d[p * NR + q] = s * NR + q < nt ? widen_one<S>(src + ((s * NR + q) * ld + p0 + p) * isz) : 0.f;
      }
    }
  }
}

/// op(a)'s rows [0, mc) of a block from rows of src (row r at src + r·ld), widened to lda apart;
/// rows [mc, mcp) zeros.
template <Widen S, int B>
MPT_KERNEL void pack_a_rows(const char* src, std::int64_t ld, std::int64_t kc, std::int64_t mc, std::int64_t mcp,
                            float* ab, std::int64_t lda) {
  constexpr std::int64_t W = Lanes<float, B>::W, isz = widen_bytes<S>;
  for (std::int64_t r = 0; r < mc; ++r) {
    const char* row = src + r * ld * isz;
    float* d = ab + r * lda;
    std::int64_t p = 0;
    for (; p + W <= kc; p += W) store_lanes(d + p, load_widened<S, B>(row + p * isz));
    for (; p < kc; ++p) d[p] = widen_one<S>(row + p * isz);
  }
  for (std::int64_t r = mc; r < mcp; ++r) std::fill_n(ab + r * lda, kc, 0.f);
}

/// op(a) = aᵀ's rows [0, mc) of a block, from rows p of src (op(a)'s row r of row p at
/// src[p·ld + r]), tile by tile as [kc][R]; rows [mc, mcp) zeros. `row_left`: the values from
/// the block's first row to the end of src's rows (widen_n reads a whole vector where they last).
template <Widen S, int B, int R>
MPT_KERNEL void pack_a_cols(const char* src, std::int64_t ld, std::int64_t kc, std::int64_t mc, std::int64_t mcp,
                            std::int64_t row_left, float* ab) {
  constexpr std::int64_t W = Lanes<float, B>::W, isz = widen_bytes<S>;
  for (std::int64_t p0 = 0; p0 < kc; p0 += kPackRows) {
    const std::int64_t pn = std::min(kPackRows, kc - p0);
    // The next rows' values, asked for now: src's rows are far apart (often a multiple of 4 KiB),
    // so the hardware's prefetchers do not follow them, and each row was a wait on L3.
    for (std::int64_t p = p0 + kPackRows; p < std::min(kc, p0 + 2 * kPackRows); ++p)
      for (std::int64_t x = 0; x < mc * isz; x += 64) __builtin_prefetch(src + p * ld * isz + x);
    for (std::int64_t i = 0; i < mcp; i += R) {
      float* d = ab + i * kc + p0 * R;
      const char* rows = src + (p0 * ld + i) * isz;
      if (i + R <= mc) {
        const bool whole_vector = i + R / W * W + W <= row_left;
        for (std::int64_t p = 0; p < pn; ++p) widen_n<S, B, R>(rows + p * ld * isz, d + p * R, whole_vector);
      } else {
        for (std::int64_t p = 0; p < pn; ++p)
          for (std::int64_t r = 0; r < R; ++r)
            d[p * R + r] = i + r < mc ? widen_one<S>(rows + (p * ld + r) * isz) : 0.f;
      }
    }
  }
}

/// A thread's buffer of at least n floats, 64-byte aligned (tiles load whole cache lines: from a
/// 16-byte aligned buffer every other load of a packed slab was split across two lines).
float* buffer(std::vector<float>& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.size()) < n + 16) v.resize(static_cast<std::size_t>(n + 16));
  const auto at = reinterpret_cast<std::uintptr_t>(v.data());
  return v.data() + ((64 - at % 64) % 64) / sizeof(float);
}

std::int64_t round_up(std::int64_t v, std::int64_t to) { return (v + to - 1) / to * to; }

/// Rows [m0, m1) by columns [n0, n1) of the job's output, on this thread, at width B.
template <int B>
MPT_KERNEL void gemm_part(const Job& j, std::int64_t m_begin, std::int64_t m_end, std::int64_t n0, std::int64_t n1) {
  constexpr int R = Tile<B>::R, NV = Tile<B>::NV;
  constexpr std::int64_t NR = NV * Lanes<float, B>::W;
  const std::int64_t k = j.k, isz = static_cast<std::int64_t>(itemsize(j.in));
  const std::int64_t osz = static_cast<std::int64_t>(itemsize(j.out_dt));
  // float32 results are summed in out itself (rows n apart; tiles that would cross its edge go
  // through `edge`); others in cb, float32 blocks of ntp columns: one block of rows at a time, or,
  // when k has several blocks, all the rows of a chunk of at most kMaxRows (so that cb stays
  // bounded: op(b) is packed again for each chunk).
  const bool direct = j.out_dt == float32, all_rows = !direct && k > kKc;
  const std::int64_t chunk = all_rows ? kMaxRows : m_end - m_begin;
  static thread_local std::vector<float> bp_store, ab_store, cb_store;
  float* const bp = buffer(bp_store, kKc * kNc);
  float* const ab = buffer(ab_store, kMc * (kKc + 16));
  float* const cb = direct ? nullptr
                           : buffer(cb_store, (all_rows ? round_up(std::min(chunk, m_end - m_begin), R) : kMc) *
                                                  std::min(kNc, round_up(n1 - n0, NR)));
  alignas(64) float edge[R * NR];

  for (std::int64_t m0 = m_begin; m0 < m_end; m0 += chunk) {
    const std::int64_t m1 = std::min(m_end, m0 + chunk);
    for (std::int64_t jc = n0; jc < n1; jc += kNc) {
      const std::int64_t nt = std::min(kNc, n1 - jc), slabs = (nt + NR - 1) / NR, ntp = slabs * NR;
      const std::int64_t ldc = direct ? j.n : ntp;
      auto block_of = [&](std::int64_t ic) MPT_INLINE_LAMBDA -> float* {
        if (direct) return reinterpret_cast<float*>(j.out) + ic * j.n + jc;
        return cb + (all_rows ? (ic - m0) * ntp : 0);
      };
      // The finished rows [ic, ic + mc) of cblock: + bias, activation (float32, as oneDNN's
      // epilogue in the staged path), rounded into out.
      auto finish = [&](std::int64_t ic, std::int64_t mc, float* cblock) MPT_INLINE_LAMBDA {
        for (std::int64_t r = 0; r < mc; ++r) {
          float* c = cblock + r * ldc;
          if (j.bias)
            for (std::int64_t q = 0; q < nt; ++q) c[q] += j.bias[jc + q];
          common::with_unary_op(j.act, [&](auto o) MPT_INLINE_LAMBDA {
            constexpr UnaryOp op = decltype(o)::value;
            if constexpr (op != UnaryOp::Linear) {
              const float prm = static_cast<float>(common::unary_default_param(op));
              for (std::int64_t q = 0; q < nt; ++q) c[q] = common::unary_apply<op>(c[q], prm);
            }
          });
          if (direct) continue;
          // Rounded on the lanes (the bulk conversion's bits, without a call per row).
          with_widen(j.out_dt, [&](auto w) MPT_INLINE_LAMBDA {
            narrow_n<decltype(w)::value, B>(c, j.out + ((ic + r) * j.n + jc) * osz, nt);
          });
        }
      };
      if (k == 0) {
        for (std::int64_t ic = m0; ic < m1; ic += kMc) {
          const std::int64_t mc = std::min(kMc, m1 - ic);
          float* cblock = block_of(ic);
          for (std::int64_t r = 0; r < mc; ++r) std::fill_n(cblock + r * ldc, nt, 0.f);
          finish(ic, mc, cblock);
        }
      }
      for (std::int64_t pc = 0; pc < k; pc += kKc) {
        const std::int64_t kc = std::min(kKc, k - pc);
        // op(b)[pc.., jc..] packed: slab s holds columns s·NR.. as [kc][NR], zeros past nt.
        with_widen(j.in, [&](auto w) MPT_INLINE_LAMBDA {
          constexpr Widen S = decltype(w)::value;
          if (!j.tb) pack_b_rows<S, B, NR>(j.b + (pc * j.n + jc) * isz, j.n, kc, nt, bp);
          else pack_b_cols<S, B, NR>(j.b + (jc * k + pc) * isz, k, kc, nt, bp);
        });
        for (std::int64_t ic = m0; ic < m1; ic += kMc) {
          const std::int64_t mc = std::min(kMc, m1 - ic), mcp = round_up(mc, R);
          // The block of op(a), widened: rows of a as they lie (lda = kc + 16: rows 2 KiB apart
          // would share cache sets); aᵀ's rows (R values of each p) packed tile by tile as [kc][R],
          // so the tile reads them in order. The rows past mc are zeros.
          const float* ablock = ab;
          std::int64_t lda;
          if (!j.ta && j.in == float32 && mc == mcp && (k * 4) % 4096 != 0) {
            // float32 rows of whole tiles, read where they lie (rows a multiple of 4 KiB apart would
            // all share cache sets: those are copied as the others).
            ablock = reinterpret_cast<const float*>(j.a) + ic * k + pc;
            lda = k;
          } else {
            lda = j.ta ? R : kc + 16;
            with_widen(j.in, [&](auto w) MPT_INLINE_LAMBDA {
              constexpr Widen S = decltype(w)::value;
              if (!j.ta) pack_a_rows<S, B>(j.a + (ic * k + pc) * isz, k, kc, mc, mcp, ab, lda);
              else pack_a_cols<S, B, R>(j.a + (pc * j.m + ic) * isz, j.m, kc, mc, mcp, j.m - ic, ab);
            });
          }
          float* cblock = block_of(ic);
          for (std::int64_t s = 0; s < slabs; ++s) {
            const float* bs = &bp[s * kc * NR];
            for (std::int64_t i = 0; i < mcp; i += R) {
              const float* ai = j.ta ? ablock + i * kc : ablock + i * lda;
              float* c = cblock + i * ldc + s * NR;
              const std::int64_t rows_here = std::min<std::int64_t>(R, mc - i), cols_here = std::min(NR, nt - s * NR);
              const bool cut = direct && (rows_here < R || cols_here < NR);
              float* t = cut ? edge : c;
              const std::int64_t ldt = cut ? NR : ldc;
              if (cut && pc > 0)
                for (std::int64_t r = 0; r < rows_here; ++r)
                  std::memcpy(edge + r * NR, c + r * ldc, cols_here * sizeof(float));
              if (j.ta) {
                if (pc == 0) micro_tile<float, B, false, true, R, NV>(kc, ai, lda, bs, NR, t, ldt);
                else micro_tile<float, B, true, true, R, NV>(kc, ai, lda, bs, NR, t, ldt);
              } else {
                if (pc == 0) micro_tile<float, B, false, false, R, NV>(kc, ai, lda, bs, NR, t, ldt);
                else micro_tile<float, B, true, false, R, NV>(kc, ai, lda, bs, NR, t, ldt);
              }
              if (cut)
                for (std::int64_t r = 0; r < rows_here; ++r)
                  std::memcpy(c + r * ldc, edge + r * NR, cols_here * sizeof(float));
            }
          }
          if (pc + kc >= k) finish(ic, mc, cblock);
        }
      }
    }
  }
}

/// The whole job on the threads: each takes a range of columns (or rows), whole tiles apart.
void run(const Job& j) {
  const bool by_cols = j.m <= j.n;
  const std::int64_t units = by_cols ? (j.n + kColUnit - 1) / kColUnit : (j.m + kRowUnit - 1) / kRowUnit;
  const int threads = omp_in_parallel() ? 1 : static_cast<int>(std::min<std::int64_t>(omp_get_max_threads(), units));
  auto part = [&](int t, int nthr) {
    const std::int64_t u0 = units * t / nthr, u1 = units * (t + 1) / nthr;
    if (u0 == u1) return;
    if (by_cols)
      isa_call_native<gemm_part<64>, gemm_part<32>, gemm_part<16>>(j, std::int64_t{0}, j.m, u0 * kColUnit,
                                                                   std::min(j.n, u1 * kColUnit));
    else
      isa_call_native<gemm_part<64>, gemm_part<32>, gemm_part<16>>(j, u0 * kRowUnit, std::min(j.m, u1 * kRowUnit),
                                                                   std::int64_t{0}, j.n);
  };
  if (threads <= 1) return part(0, 1);
#pragma omp parallel num_threads(threads)
  part(omp_get_thread_num(), omp_get_num_threads());
}

}  // namespace

GemmShape gemm_shape(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  GemmShape g{1, 1, 0, 0, 0};
  for (std::size_t i = 0; i + 2 < sa.size(); ++i) g.batch_a *= sa[i];
  for (std::size_t i = 0; i + 2 < sb.size(); ++i) g.batch_b *= sb[i];
  g.m = ta ? sa[sa.size() - 1] : sa[sa.size() - 2];
  g.k = ta ? sa[sa.size() - 2] : sa[sa.size() - 1];
  g.n = tb ? sb[sb.size() - 2] : sb[sb.size() - 1];
  return g;
}

namespace {
/// A path forced by environment variable `name`: 1 when it says `packed`, 0 when it says `other`,
/// else -1 (the rule decides).
int forced_path(const char* name, const char* other) {
  const char* e = std::getenv(name);
  if (e && !std::strcmp(e, "packed")) return 1;
  if (e && !std::strcmp(e, other)) return 0;
  return -1;
}
bool nonempty(const GemmShape& g) { return g.m > 0 && g.n > 0 && g.k > 0; }
}  // namespace

bool packed_gemm16_applies(const GemmShape& g) {
  static const int forced = forced_path("MPT_CPU_GEMM16", "staged");
  if (forced >= 0) return forced == 1;
  // At the avx2 and avx512 tiers, every shape: with its packing widened on the lanes it runs at
  // least as fast as the staged copies plus oneDNN's float32 GEMM, model D's 2048-wide shapes too
  // (docs/design.md, "CPU GEMMs"). Not at the baseline tier (no FMA, and not measured).
  return detail::cpu_isa() != detail::CpuIsa::baseline && nonempty(g);
}

bool packed_gemm32_applies(const GemmShape& g) {
  static const int forced = forced_path("MPT_CPU_GEMM32", "onednn");
  if (forced >= 0) return forced == 1 && nonempty(g);
  // At the avx2 tier only. There oneDNN 2.6's jit:avx2 float32 GEMM loses on the shapes of models
  // A and G (small row counts, and aᵀ·b weight gradients over long k: 93-150 GFLOP/s against the
  // packed kernel's 197-219) and the packed kernel loses by at most a few per cent elsewhere; at
  // avx512 oneDNN is as fast or faster on every measured shape (docs/design.md, "CPU GEMMs").
  return detail::cpu_isa() == detail::CpuIsa::avx2 && nonempty(g);
}

void packed_gemm(const GemmShape& g, const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& bias,
                 Activation act, Tensor& out) {
  const DType in = a.dtype();
  if (b.dtype() != in || (in != float32 && in != bfloat16 && in != float16) || out.dtype() == float64 ||
      !is_floating(out.dtype()))
    fail("packed_gemm: operands ", to_string(in), " and ", to_string(b.dtype()), " into ", to_string(out.dtype()),
         " (expected float32, bfloat16 or float16 operands of one dtype)");
  std::vector<float> bias32;
  if (bias.defined()) {
    bias32.resize(static_cast<std::size_t>(g.n));
    widen(static_cast<const char*>(bias.data_ptr()), bias.dtype(), bias32.data(), g.n);
  }
  const std::int64_t isz = static_cast<std::int64_t>(itemsize(in));
  const std::int64_t osz = static_cast<std::int64_t>(itemsize(out.dtype()));
  const std::int64_t batches = std::max(g.batch_a, g.batch_b);
  for (std::int64_t i = 0; i < batches; ++i) {
    Job j{g.m, g.n, g.k,
          static_cast<const char*>(a.data_ptr()) + (g.batch_a == 1 ? 0 : i) * g.m * g.k * isz,
          static_cast<const char*>(b.data_ptr()) + (g.batch_b == 1 ? 0 : i) * g.k * g.n * isz,
          ta, tb, in, bias.defined() ? bias32.data() : nullptr, act,
          static_cast<char*>(out.data_ptr()) + i * g.m * g.n * osz, out.dtype()};
    run(j);
  }
}

}  // namespace mpt::cpu
