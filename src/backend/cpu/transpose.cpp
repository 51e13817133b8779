#include <cstring>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"

namespace mpt::cpu {
namespace {

template <class T>
void permute(const T* in, T* out, const Shape& out_shape, const std::vector<std::int64_t>& src_stride) {
  const std::int64_t nd = static_cast<std::int64_t>(out_shape.size());
  const std::int64_t inner = out_shape[nd - 1], inner_stride = src_stride[nd - 1];
  std::int64_t rows = 1;
  for (std::int64_t i = 0; i + 1 < nd; ++i) rows *= out_shape[i];
  parallel_for(rows, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(inner, 1)),
               [&](std::int64_t b, std::int64_t e) {
                 for (std::int64_t r = b; r < e; ++r) {
                   std::int64_t rem = r, off = 0;
                   for (std::int64_t i = nd - 2; i >= 0; --i) {
                     off += (rem % out_shape[i]) * src_stride[i];
                     rem /= out_shape[i];
                   }
                   T* o = out + r * inner;
                   const T* s = in + off;
                   for (std::int64_t j = 0; j < inner; ++j) o[j] = s[j * inner_stride];
                 }
               });
}

}  // namespace

void CpuBackend::transpose(const Tensor& x, const std::vector<std::int64_t>& perm, Tensor& out) {
  const Shape& s = x.shape();
  const std::size_t nd = s.size();
  if (nd == 0 || x.numel() == 0) {
    std::memcpy(out.data_ptr(), x.data_ptr(), x.nbytes());
    return;
  }
  std::vector<std::int64_t> in_stride(nd), src_stride(nd);
  in_stride[nd - 1] = 1;
  for (std::size_t i = nd - 1; i > 0; --i) in_stride[i - 1] = in_stride[i] * s[i];
  for (std::size_t i = 0; i < nd; ++i) src_stride[i] = in_stride[perm[i]];
  switch (itemsize(x.dtype())) {
    case 1: return permute(static_cast<const std::uint8_t*>(x.data_ptr()),
                           static_cast<std::uint8_t*>(out.data_ptr()), out.shape(), src_stride);
    case 2: return permute(static_cast<const std::uint16_t*>(x.data_ptr()),
                           static_cast<std::uint16_t*>(out.data_ptr()), out.shape(), src_stride);
    case 4: return permute(static_cast<const std::uint32_t*>(x.data_ptr()),
                           static_cast<std::uint32_t*>(out.data_ptr()), out.shape(), src_stride);
    default: return permute(static_cast<const std::uint64_t*>(x.data_ptr()),
                            static_cast<std::uint64_t*>(out.data_ptr()), out.shape(), src_stride);
  }
}

}  // namespace mpt::cpu
