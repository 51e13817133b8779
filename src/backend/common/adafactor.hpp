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
// every device: a row (or column) in index order; a long sum as kSumChunks chunks, each in
// index order, then the chunks' sums in order. Phases, in order:
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

/// g² + eps1, Keras's regulated gradient.
MPT_HOST_DEVICE inline float adafactor_reg(float g, const AdafactorHyper& h) {
  return exact::add(exact::mul(g, g), h.eps1);
}

/// b x + (1 - b) mean, the moving average of r, c and v.
MPT_HOST_DEVICE inline float adafactor_average(float x, float mean, const AdafactorHyper& h) {
  return exact::add(exact::mul(h.b, x), exact::mul(h.omb, mean));
}

/// Phase 1, row q = l·R + r: wrow[q] = Σ_c w², and r[q] (factored) or v[q] updated.
MPT_HOST_DEVICE inline void adafactor_row(const AdafactorShape& s, const AdafactorHyper& h, const float* w,
                                          const float* g, float* r_or_v, double* wrow, std::int64_t q) {
  const float* wq = w + q * s.cols;
  const float* gq = g + q * s.cols;
  double ws = 0, rs = 0;
  for (std::int64_t c = 0; c < s.cols; ++c) {
    const double wd = decayed(wq[c], h.decay);
    ws = exact::add(ws, exact::mul(wd, wd));
    rs = exact::add(rs, static_cast<double>(adafactor_reg(gq[c], h)));
  }
  wrow[q] = ws;
  if (s.factored) {
    r_or_v[q] = adafactor_average(r_or_v[q], static_cast<float>(rs / static_cast<double>(s.cols)), h);
  } else {  // cols == 1: the element's own second moment
    r_or_v[q] = adafactor_average(r_or_v[q], static_cast<float>(rs), h);
  }
}

/// Phase 2 (factored), column q = l·C + c: c[q] updated with the column's mean of reg.
MPT_HOST_DEVICE inline void adafactor_col(const AdafactorShape& s, const AdafactorHyper& h, const float* g,
                                          float* col, std::int64_t q) {
  const std::int64_t l = q / s.cols, c = q % s.cols;
  const float* gl = g + l * s.rows * s.cols + c;
  double cs = 0;
  for (std::int64_t r = 0; r < s.rows; ++r) cs = exact::add(cs, static_cast<double>(adafactor_reg(gl[r * s.cols], h)));
  col[q] = adafactor_average(col[q], static_cast<float>(cs / static_cast<double>(s.rows)), h);
}

/// u of element (q, c) of row q = l·R + r: g / sqrt(v), v from the updated moments; rsum[l]
/// is block l's Σ_r r (factored).
MPT_HOST_DEVICE inline float adafactor_u(const AdafactorShape& s, float g, const float* r_or_v, const float* col,
                                         const double* rsum, std::int64_t q, std::int64_t c) {
  float v;
  if (s.factored) {
    const std::int64_t l = q / s.rows;
    const float r_mean = static_cast<float>(rsum[l] / static_cast<double>(s.rows));
    v = exact::mul(exact::div(r_or_v[q], r_mean), col[l * s.cols + c]);
  } else {
    v = r_or_v[q];
  }
  return exact::div(g, exact::sqrt(v));
}

/// Phase 4, row q: urow[q] = Σ_c u².
MPT_HOST_DEVICE inline void adafactor_u_row(const AdafactorShape& s, const float* g, const float* r_or_v,
                                            const float* col, const double* rsum, double* urow, std::int64_t q) {
  const float* gq = g + q * s.cols;
  double us = 0;
  for (std::int64_t c = 0; c < s.cols; ++c) {
    const double u = adafactor_u(s, gq[c], r_or_v, col, rsum, q, c);
    us = exact::add(us, exact::mul(u, u));
  }
  urow[q] = us;
}

/// Phase 6, element i: w = w - max(eps2, rms(w)) rho u / max(1, rms(u) / clip), from the
/// totals wsum = Σ w², usum = Σ u².
MPT_HOST_DEVICE inline void adafactor_apply(const AdafactorShape& s, const AdafactorHyper& h, float* w, const float* g,
                                            const float* r_or_v, const float* col, const double* rsum, double wsum,
                                            double usum, std::int64_t i) {
  const double n = static_cast<double>(s.size());
  const float rms_w = exact::sqrt(static_cast<float>(wsum / n));
  const float rms_u = exact::sqrt(static_cast<float>(usum / n));
  const float alpha = exact::mul(h.eps2 < rms_w ? rms_w : h.eps2, h.rho);
  const float ratio = exact::div(rms_u, h.clip);
  const float denom = ratio > 1.0f ? ratio : 1.0f;
  const std::int64_t q = i / s.cols, c = i % s.cols;
  const float u_hat = exact::div(adafactor_u(s, g[i], r_or_v, col, rsum, q, c), denom);
  w[i] = exact::sub(decayed(w[i], h.decay), exact::mul(alpha, u_hat));
}

}  // namespace mpt::common
