#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/vector_types.hpp"
#include "backend/common/reduce_ops.hpp"  // reduce_init, ReduceCombine (the CUDA kernels' too)
#include "backend/common/unary_ops.hpp"  // exact::add: integer sums wrap around

// sum_rows's vectors are inlined into its tier's wrapper (isa_call_native): the ABI warning
// about passing them to a baseline function never applies.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace mpt::cpu {
namespace {

/// acc[j] = combine(acc[j], p[j]) for j < m: one branch-free loop per op, so that it vectorizes
/// (each acc[j] still adds its rows in order: the same bits as the scalar loop).
template <class C>
MPT_KERNEL void combine_row(C* __restrict acc, const C* __restrict p, std::int64_t m, ReduceOp op) {
  switch (op) {
    case ReduceOp::Max:
      for (std::int64_t j = 0; j < m; ++j) acc[j] = (p[j] > acc[j] || p[j] != p[j]) ? p[j] : acc[j];
      return;
    case ReduceOp::Min:
      for (std::int64_t j = 0; j < m; ++j) acc[j] = (p[j] < acc[j] || p[j] != p[j]) ? p[j] : acc[j];
      return;
    default:
      for (std::int64_t j = 0; j < m; ++j) acc[j] = common::exact::add(acc[j], p[j]);  // integers wrap
  }
}

/// Sums of one long run p[0, m) in kLanes interleaved partial sums: acc[j] adds p[i] for i ≡ j
/// (mod kLanes), in order. The association is fixed (not the tier's width, not the thread count):
/// one zmm, two ymm or four xmm of partial sums give the same bits.
constexpr std::int64_t kLanes = 16;
/// Values per chunk of a long row reduced on one thread (a multiple of kBlock).
constexpr std::int64_t kRunChunk = 1 << 15;
template <class C>
MPT_KERNEL void sum_lanes(C* __restrict acc, const C* __restrict p, std::int64_t m) {
  std::int64_t i = 0;
  for (; i + kLanes <= m; i += kLanes)
    for (std::int64_t j = 0; j < kLanes; ++j) acc[j] = common::exact::add(acc[j], p[i + j]);  // integers wrap
  for (std::int64_t j = 0; i + j < m; ++j) acc[j] = common::exact::add(acc[j], p[i + j]);
}

/// One vector of x's W values at p, as the sums' type: float32 and float64 as they are, bfloat16
/// widened on the lanes (no float32 copy of each row).
template <int B, class T>
[[gnu::always_inline]] inline auto load_summand(const T* p) {
  if constexpr (std::is_same_v<T, bf16_bits>) return Bf16Lanes<B>::load(p);
  else return load_lanes<typename Lanes<T, B>::V>(p);
}

/// acc[j] += x[r · stride + j] over rows r < rows, j < m, for float32, float64 or bfloat16 x read
/// in place (sums in float32 for bfloat16): up to four vectors of sums held in registers while the
/// rows stream past (a bias gradient's column sums had been a dispatched call per row, 2 % of a
/// transformer step), each acc[j] adding its rows in order: the bits of combine_row on the
/// widened rows.
template <class T, int B>
MPT_KERNEL void sum_rows(decltype(widen(T{}))* __restrict acc, const T* __restrict x, std::int64_t stride,
                         std::int64_t rows, std::int64_t m) {
  using C = decltype(widen(T{}));
  using V = typename Lanes<C, B>::V;
  constexpr std::int64_t W = Lanes<C, B>::W;
  std::int64_t j = 0;
  for (; j + 4 * W <= m; j += 4 * W) {
    V a0 = load_lanes<V>(acc + j), a1 = load_lanes<V>(acc + j + W), a2 = load_lanes<V>(acc + j + 2 * W),
      a3 = load_lanes<V>(acc + j + 3 * W);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* p = x + r * stride + j;
      a0 += load_summand<B>(p), a1 += load_summand<B>(p + W), a2 += load_summand<B>(p + 2 * W),
          a3 += load_summand<B>(p + 3 * W);
    }
    store_lanes(acc + j, a0), store_lanes(acc + j + W, a1), store_lanes(acc + j + 2 * W, a2),
        store_lanes(acc + j + 3 * W, a3);
  }
  for (; j + W <= m; j += W) {
    V a = load_lanes<V>(acc + j);
    for (std::int64_t r = 0; r < rows; ++r) a += load_summand<B>(x + r * stride + j);
    store_lanes(acc + j, a);
  }
  for (; j < m; ++j) {
    C a = acc[j];
    for (std::int64_t r = 0; r < rows; ++r) a = a + widen(x[r * stride + j]);
    acc[j] = a;
  }
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& x, std::int64_t axis, Tensor& out) {
  std::int64_t outer, n, inner;
  split_axis(x.shape(), axis, outer, n, inner);
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    const C init = common::reduce_init<C>(op);
    const common::ReduceCombine<C> combine{op};
    auto finish = [op, n](C acc) { return op == ReduceOp::Mean ? C(acc / C(n)) : acc; };
    if (inner == 1 && n >= 2 * kRunChunk) {
      // Long rows (a whole tensor's sum): each row in chunks of kRunChunk on the threads, the
      // chunks' results combined in order. A chunk's maximum or minimum runs in order, so the
      // result is the row's sequential one (first of equal maxima, the last NaN); a chunk's sum
      // in kLanes partial sums, folded in order: bits that depend on neither the thread count nor
      // the tier (one adder's chain had run 4M float32 values in 10 ms).
      const std::int64_t chunks = (n + kRunChunk - 1) / kRunChunk;
      const bool sum = op == ReduceOp::Sum || op == ReduceOp::Mean;
      std::vector<C> part(static_cast<std::size_t>(outer * chunks));
      parallel_for(outer * chunks, 1, [&](std::int64_t b, std::int64_t e) {
        C s[kBlock], lanes[kLanes];
        for (std::int64_t u = b; u < e; ++u) {
          const std::int64_t o = u / chunks, start = (u % chunks) * kRunChunk, len = std::min(kRunChunk, n - start);
          C acc = init;
          std::fill(lanes, lanes + kLanes, C(0));
          for (std::int64_t i = 0; i < len; i += kBlock) {  // kBlock: a multiple of kLanes
            const std::int64_t m = std::min(kBlock, len - i);
            const C* p = load<C>(x, o * n + start + i, m, s);
            if (sum) isa_call<sum_lanes<C>>(lanes, p, m);
            else
              for (std::int64_t j = 0; j < m; ++j) acc = combine(acc, p[j]);
          }
          if (sum)
            for (std::int64_t j = 0; j < kLanes; ++j) acc = common::exact::add(acc, lanes[j]);
          part[static_cast<std::size_t>(u)] = acc;
        }
      });
      std::vector<C> res(static_cast<std::size_t>(outer));
      for (std::int64_t o = 0; o < outer; ++o) {
        C acc = init;
        for (std::int64_t c = 0; c < chunks; ++c) acc = combine(acc, part[static_cast<std::size_t>(o * chunks + c)]);
        res[static_cast<std::size_t>(o)] = finish(acc);
      }
      detail::convert(res.data(), compute_dtype_of<C>(), out.data_ptr(), out.dtype(), res.size());
      return;
    }
    if (inner == 1) {  // contiguous rows
      parallel_for(outer, std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(n, 1)),
                   [&](std::int64_t b, std::int64_t e) {
                     C s[kBlock];
                     std::vector<C> res(static_cast<std::size_t>(e - b));
                     for (std::int64_t o = b; o < e; ++o) {
                       C acc = init;
                       for (std::int64_t i = 0; i < n; i += kBlock) {
                         std::int64_t m = std::min(kBlock, n - i);
                         const C* p = load<C>(x, o * n + i, m, s);
                         for (std::int64_t j = 0; j < m; ++j) acc = combine(acc, p[j]);
                       }
                       res[o - b] = finish(acc);
                     }
                     detail::convert(res.data(), compute_dtype_of<C>(),
                                     static_cast<char*>(out.data_ptr()) + b * itemsize(out.dtype()),
                                     out.dtype(), res.size());
                   });
      return;
    }
    // Strided: accumulate whole rows of `inner` elements, in column blocks of `width`; narrower
    // blocks when there are fewer of them than threads (a bias gradient: one [rows, units] sum).
    const std::int64_t threads = omp_get_max_threads();
    std::int64_t width = kBlock;
    if (outer < threads) {
      const std::int64_t parts = (threads + outer - 1) / outer;
      width = std::clamp<std::int64_t>(((inner + parts - 1) / parts + 15) / 16 * 16, 64, kBlock);
    }
    const std::int64_t iblocks = (inner + width - 1) / width;
    const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(n * width, 1));
    parallel_for(outer * iblocks, grain, [&](std::int64_t b, std::int64_t e) {
      C s[kBlock], acc[kBlock];
      for (std::int64_t u = b; u < e; ++u) {
        std::int64_t o = u / iblocks, j0 = (u % iblocks) * width;
        std::int64_t m = std::min(width, inner - j0);
        std::fill(acc, acc + m, init);
        bool summed = false;
        if constexpr (std::is_floating_point_v<C>)
          if (op == ReduceOp::Sum || op == ReduceOp::Mean) {
            const std::int64_t at = o * n * inner + j0;
            if (x.dtype() == compute_dtype_of<C>()) {
              isa_call_native<sum_rows<C, 64>, sum_rows<C, 32>, sum_rows<C, 16>>(
                  acc, static_cast<const C*>(x.data_ptr()) + at, inner, n, m);
              summed = true;
            } else if constexpr (std::is_same_v<C, float>) {
              if (x.dtype() == bfloat16) {
                isa_call_native<sum_rows<bf16_bits, 64>, sum_rows<bf16_bits, 32>, sum_rows<bf16_bits, 16>>(
                    acc, static_cast<const bf16_bits*>(x.data_ptr()) + at, inner, n, m);
                summed = true;
              }
            }
          }
        if (!summed)
          for (std::int64_t i = 0; i < n; ++i) isa_call<combine_row<C>>(acc, load<C>(x, (o * n + i) * inner + j0, m, s), m, op);
        for (std::int64_t j = 0; j < m; ++j) acc[j] = finish(acc[j]);
        detail::convert(acc, compute_dtype_of<C>(),
                        static_cast<char*>(out.data_ptr()) + (o * inner + j0) * itemsize(out.dtype()),
                        out.dtype(), static_cast<std::size_t>(m));
      }
    });
  });
}

void CpuBackend::argmax(const Tensor& x, std::int64_t axis, Tensor& out) {
  std::int64_t outer, n, inner;
  split_axis(x.shape(), axis, outer, n, inner);
  auto* res = out.data<std::int64_t>();
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    if (inner == 1 && n <= kBlock) {  // rows (the class axis of predictions): one block load each
      parallel_for(outer, std::max<std::int64_t>(1, 16384 / n), [&](std::int64_t b, std::int64_t e) {
        C row[kBlock];
        for (std::int64_t o = b; o < e; ++o) {
          const C* p = load<C>(x, o * n, n, row);
          std::int64_t best = 0;
          for (std::int64_t i = 1; i < n; ++i)
            if (p[i] > p[best] || (p[i] != p[i] && p[best] == p[best])) best = i;
          res[o] = best;
        }
      });
      return;
    }
    parallel_for(outer * inner, 4096, [&](std::int64_t b, std::int64_t e) {
      C v;
      for (std::int64_t u = b; u < e; ++u) {
        std::int64_t o = u / inner, j = u % inner;
        std::int64_t best = 0;
        C best_v = *load<C>(x, o * n * inner + j, 1, &v);
        for (std::int64_t i = 1; i < n; ++i) {
          C cur = *load<C>(x, (o * n + i) * inner + j, 1, &v);
          if (cur > best_v || (cur != cur && best_v == best_v)) best_v = cur, best = i;
        }
        res[u] = best;
      }
    });
  });
}

}  // namespace mpt::cpu
