#pragma once
// What the attention tests share: the float64 reference, boolean masks from 0/1 lists and the
// padding pattern both the op's and MultiHeadAttention's tests use.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "test_util.hpp"

namespace mpt::test {

/// softmax(scale q kᵀ) v per (b, h) in float64 on host arrays in Keras's layout (q [B, Tq, H, D],
/// k [B, Tk, H, D], v [B, Tk, H, Dv]), with the causal rule and a [B, Tq, Tk] mask (empty: none);
/// a row that attends to nothing gives zeros.
inline std::vector<double> attention_reference(const std::vector<double>& q, const std::vector<double>& k,
                                               const std::vector<double>& v, std::int64_t B, std::int64_t Tq,
                                               std::int64_t Tk, std::int64_t H, std::int64_t D, std::int64_t Dv,
                                               const std::vector<int>& mask, bool causal, double scale) {
  std::vector<double> out(static_cast<std::size_t>(B * Tq * H * Dv), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Tq; ++i) {
        std::vector<double> s(static_cast<std::size_t>(Tk), -INFINITY);
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < Tk; ++j) {
          if ((causal && j > i) || (!mask.empty() && !mask[(b * Tq + i) * Tk + j])) continue;
          double d = 0;
          for (std::int64_t e = 0; e < D; ++e) d += q[((b * Tq + i) * H + h) * D + e] * k[((b * Tk + j) * H + h) * D + e];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        if (mx == -INFINITY) continue;
        double z = 0;
        for (double sj : s) z += sj == -INFINITY ? 0 : std::exp(sj - mx);
        for (std::int64_t j = 0; j < Tk; ++j)
          if (s[j] != -INFINITY)
            for (std::int64_t e = 0; e < Dv; ++e)
              out[((b * Tq + i) * H + h) * Dv + e] += std::exp(s[j] - mx) / z * v[((b * Tk + j) * H + h) * Dv + e];
      }
  return out;
}

inline Tensor mask_tensor(const std::vector<int>& m, const Shape& s, Device dev) {
  std::vector<std::uint8_t> bytes(m.begin(), m.end());
  return Tensor::from_host(bytes.data(), bytes.size(), bool_, s, dev);
}

/// A padding mask [B, Tq, Tk]: batch b attends to its first Tk - b keys; query 1 of batch 0 to none.
inline std::vector<int> padding_mask(std::int64_t B, std::int64_t Tq, std::int64_t Tk) {
  std::vector<int> m(static_cast<std::size_t>(B * Tq * Tk));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < Tq; ++i)
      for (std::int64_t j = 0; j < Tk; ++j) m[(b * Tq + i) * Tk + j] = j < Tk - b && !(b == 0 && i == 1);
  return m;
}

}  // namespace mpt::test
