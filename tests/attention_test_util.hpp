#pragma once
// What the attention tests share: boolean masks from 0/1 lists and the padding pattern both the
// op's and MultiHeadAttention's tests use.
#include <cstdint>
#include <vector>

#include "test_util.hpp"

namespace mpt::test {

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
