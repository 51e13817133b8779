#pragma once
// Adafactor's update (Keras's), defined once for both backends: the CPU runs these phases over
// its threads (cpu/optim.cpp), CUDA one kernel per phase (cuda/kernels/optim.hpp), and both give
// the same bits. A variable is seen as L blocks of R x C: a matrix's last two axes, its leading
// axes the blocks (factored: the second moment kept as row means r [L, R] and column means
// c [L, C]); anything of rank < 2 as L = 1, R = n, C = 1 with a full second moment v [n].
//
// Keras, in float32, with w the variable after the decoupled weight decay and g the gradient:
//   reg    = g² + eps1
//   r      = b r + (1 - b) mean_c(reg)          c = b c + (1 - b) mean_r(reg)
//   v      = (r / mean_r(r))[.., None] * c[.., None, :]      (unfactored: v = b v + (1 - b) reg)
//   u      = g / sqrt(v);  u_hat = u / max(1, rms(u) / clip)
//   w      = w - max(eps2, rms(w)) rho_t u_hat
// The sums behind the means and the RMSs are taken in float64, each in one fixed order on
// every device: a row on 8 lanes (lane_sum); a column in index order; a long sum as kSumChunks
// chunks, each in index order, then the chunks' sums in order. Phases, in order:
//   1. rows     (L·R rows):    Σ_c w² of each row; r, or v, updated
//   2. columns  (L·C columns): c updated (factored only)
//   3. sums:    Σ w² (the rows' sums) and each block's Σ_r r
//   4. u rows   (L·R rows):    Σ_c u² of each row
//   5. sums:    Σ u²
//   6. update   (every element)
#include <cmath>
#include <cstdint>

#include "backend/common/host_device.hpp"
#include "backend/common/optim_rules.hpp"  // decayed
#include "backend/common/unary_ops.hpp"

namespace mpt::common {

/// The L x R x C view of a variable of n = L·R·C elements.
struct AdafactorShape {
  std::int64_t blocks = 1, rows = 0, cols = 1;
  bool factored = false;
  MPT_HOST_DEVICE std::int64_t size() const { return blocks * rows * cols; }
};

/// A step's float32 constants (Keras computes them in float32): b = beta_2_t = 1 - t^decay_rate,
/// omb = 1 - b, rho = rho_t, decay = weight_decay * lr (0: none).
struct AdafactorHyper {
  float b = 0, omb = 0, eps1 = 0, eps2 = 0, rho = 0, clip = 1, decay = 0;
};

/// Chunks of the long sums (Σ w², Σ u², each block's Σ r).
constexpr int kSumChunks = 256;

/// Σ of chunk k (of kSumChunks) of x[0, n) in float64, in index order.
template <class T>
MPT_HOST_DEVICE inline double chunk_sum(const T* x, std::int64_t n, int k) {
  const std::int64_t b = n * k / kSumChunks, e = n * (k + 1) / kSumChunks;
  double s = 0;
  for (std::int64_t i = b; i < e; ++i) s = exact::add(s, static_cast<double>(x[i]));
  return s;
}

/// Σ of the kSumChunks chunk sums, in order.
MPT_HOST_DEVICE inline double chunks_total(const double* partial) {
  double s = 0;
  for (int k = 0; k < kSumChunks; ++k) s = exact::add(s, partial[k]);
  return s;
}

/// Σ_{c < n} term(c) in float64 on 8 lanes: lane k sums the terms c ≡ k (mod 8) in order, then
/// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). One order on every device, and one the CPU
/// vectorizes.
template <class F>
MPT_HOST_DEVICE inline double lane_sum(std::int64_t n, F&& term) {
  double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int k = 0; k < 8; ++k) l[k] = exact::add(l[k], term(c + k));
  for (int k = 0; c < n; ++c, ++k) l[k] = exact::add(l[k], term(c));
  return exact::add(exact::add(exact::add(l[0], l[1]), exact::add(l[2], l[3])),
                    exact::add(exact::add(l[4], l[5]), exact::add(l[6], l[7])));
}

/// g² + eps1, Keras's regulated gradient.
MPT_HOST_DEVICE inline float adafactor_reg(float g, const AdafactorHyper& h) {
  return exact::add(exact::mul(g, g), h.eps1);
}

/// b x + (1 - b) mean, the moving average of r, c and v.
MPT_HOST_DEVICE inline float adafactor_average(float x, float mean, const AdafactorHyper& h) {
  return exact::add(exact::mul(h.b, x), exact::mul(h.omb, mean));
}

/// Phase 1, row q = l·R + r: wrow[q] = Σ_c w² (lane_sum), and r[q] (factored, with the mean of
/// reg over the row, lane_sum) or v[q] updated.
MPT_HOST_DEVICE inline void adafactor_row(const AdafactorShape& s, const AdafactorHyper& h, const float* w,
                                          const float* g, float* r_or_v, double* wrow, std::int64_t q) {
  const float* wq = w + q * s.cols;
  const float* gq = g + q * s.cols;
  wrow[q] = lane_sum(s.cols, [&](std::int64_t c) {
    const double wd = decayed(wq[c], h.decay);
    return exact::mul(wd, wd);
  });
  if (s.factored) {
    const double rs = lane_sum(s.cols, [&](std::int64_t c) { return static_cast<double>(adafactor_reg(gq[c], h)); });
    r_or_v[q] = adafactor_average(r_or_v[q], static_cast<float>(rs / static_cast<double>(s.cols)), h);
  } else {  // cols == 1: the element's own second moment
    r_or_v[q] = adafactor_average(r_or_v[q], adafactor_reg(gq[0], h), h);
  }
}

/// Phase 2 (factored), column q = l·C + c: c[q] updated with the column's mean of reg, summed
/// over the rows in order with one float64 accumulator (adafactor_col_add, then _finish: the
/// CPU runs the same additions row by row over many columns at once).
MPT_HOST_DEVICE inline double adafactor_col_add(double acc, float g, const AdafactorHyper& h) {
  return exact::add(acc, static_cast<double>(adafactor_reg(g, h)));
}
MPT_HOST_DEVICE inline void adafactor_col_finish(const AdafactorShape& s, const AdafactorHyper& h, float* col,
                                                 std::int64_t q, double sum) {
  col[q] = adafactor_average(col[q], static_cast<float>(sum / static_cast<double>(s.rows)), h);
}
MPT_HOST_DEVICE inline void adafactor_col(const AdafactorShape& s, const AdafactorHyper& h, const float* g,
                                          float* col, std::int64_t q) {
  const std::int64_t l = q / s.cols, c = q % s.cols;
  const float* gl = g + l * s.rows * s.cols + c;
  double cs = 0;
  for (std::int64_t r = 0; r < s.rows; ++r) cs = adafactor_col_add(cs, gl[r * s.cols], h);
  adafactor_col_finish(s, h, col, q, cs);
}

/// Row q's factor of v: r[q] / mean(r of its block) (factored; rsum[l] is block l's Σ_r r), or
/// v[q] itself (unfactored).
MPT_HOST_DEVICE inline float adafactor_row_factor(const AdafactorShape& s, const float* r_or_v, const double* rsum,
                                                  std::int64_t q) {
  if (!s.factored) return r_or_v[q];
  const float r_mean = static_cast<float>(rsum[q / s.rows] / static_cast<double>(s.rows));
  return exact::div(r_or_v[q], r_mean);
}

/// u of an element of row q, column c: g / sqrt(v), v = row factor · c (factored) or the row
/// factor (v itself); col_q is the row's block of c.
MPT_HOST_DEVICE inline float adafactor_u(const AdafactorShape& s, float g, float factor, const float* col_q,
                                         std::int64_t c) {
  const float v = s.factored ? exact::mul(factor, col_q[c]) : factor;
  return exact::div(g, exact::sqrt(v));
}

/// The block of c that row q uses (null when unfactored).
MPT_HOST_DEVICE inline const float* adafactor_col_of(const AdafactorShape& s, const float* col, std::int64_t q) {
  return s.factored ? col + (q / s.rows) * s.cols : nullptr;
}

/// Phase 4, row q: urow[q] = Σ_c u² (lane_sum).
MPT_HOST_DEVICE inline void adafactor_u_row(const AdafactorShape& s, const float* g, const float* r_or_v,
                                            const float* col, const double* rsum, double* urow, std::int64_t q) {
  const float* gq = g + q * s.cols;
  const float factor = adafactor_row_factor(s, r_or_v, rsum, q);
  const float* col_q = adafactor_col_of(s, col, q);
  urow[q] = lane_sum(s.cols, [&](std::int64_t c) {
    const double u = adafactor_u(s, gq[c], factor, col_q, c);
    return exact::mul(u, u);
  });
}

/// Phase 6's step size and divisor from the totals wsum = Σ w², usum = Σ u²:
/// alpha = max(eps2, rms(w)) rho, denom = max(1, rms(u) / clip).
MPT_HOST_DEVICE inline void adafactor_step(const AdafactorShape& s, const AdafactorHyper& h, double wsum, double usum,
                                           float& alpha, float& denom) {
  const double n = static_cast<double>(s.size());
  const float rms_w = exact::sqrt(static_cast<float>(wsum / n));
  const float rms_u = exact::sqrt(static_cast<float>(usum / n));
  alpha = exact::mul(h.eps2 < rms_w ? rms_w : h.eps2, h.rho);
  const float ratio = exact::div(rms_u, h.clip);
  denom = ratio > 1.0f ? ratio : 1.0f;
}

/// Phase 6, element c of row q: w = w - alpha u / denom (w after the decay).
MPT_HOST_DEVICE inline void adafactor_apply(const AdafactorShape& s, const AdafactorHyper& h, float* w, const float* g,
                                            float factor, const float* col_q, float alpha, float denom,
                                            std::int64_t q, std::int64_t c) {
  const std::int64_t i = q * s.cols + c;
  const float u_hat = exact::div(adafactor_u(s, g[i], factor, col_q, c), denom);
  w[i] = exact::sub(decayed(w[i], h.decay), exact::mul(alpha, u_hat));
}

}  // namespace mpt::common
