#include <cstring>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/vector_types.hpp"

// transpose_band_f32's vectors stay inside its tier's wrapper (isa_call_native): the ABI warning
// about passing them to a baseline function never applies.
#pragma GCC diagnostic ignored "-Wpsabi"

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

/// Rows [r0, r0 + nr) of each rows x cols matrix `in`, from column c_begin on, as columns of `out`
/// (cols x rows), for items of any size, in blocks of kT columns (both sides' lines stay in cache).
template <class T>
void transpose_band(const T* in, T* out, std::int64_t rows, std::int64_t cols, std::int64_t r0, std::int64_t nr,
                    std::int64_t c_begin = 0) {
  constexpr std::int64_t kT = 32;
  for (std::int64_t c0 = c_begin; c0 < cols; c0 += kT)
    for (std::int64_t c = c0; c < std::min(cols, c0 + kT); ++c)
      for (std::int64_t i = 0; i < nr; ++i) out[c * rows + r0 + i] = in[(r0 + i) * cols + c];
}

/// The same for float32: W x W squares through registers (transpose_square) where nr is a whole
/// W, the rest as transpose_band. A band of W input rows reads whole lines and writes one line of
/// each output row it touches (the gather of permute had read a column at a time: a [4096, 1024]
/// transpose took 15 ms).
template <int B>
MPT_KERNEL void transpose_band_f32(const float* in, float* out, std::int64_t rows, std::int64_t cols,
                                   std::int64_t r0, std::int64_t nr) {
  constexpr std::int64_t W = Lanes<float, B>::W;
  std::int64_t c0 = 0;
  if (nr == W)
    for (; c0 + W <= cols; c0 += W) transpose_square<B>(in + r0 * cols + c0, cols, out + c0 * rows + r0, rows);
  transpose_band(in, out, rows, cols, r0, nr, c0);
}

/// out[b] = in[b]ᵀ for `batch` matrices of rows x cols, in bands of `band` input rows on the threads.
template <class T>
void swap_last_two(const T* in, T* out, std::int64_t batch, std::int64_t rows, std::int64_t cols) {
  const std::int64_t band = sizeof(T) == 4 ? isa_native_bytes() / 4 : 32, bands = (rows + band - 1) / band;
  parallel_for(batch * bands, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(band * cols, 1)),
               [&](std::int64_t lo, std::int64_t hi) {
                 for (std::int64_t u = lo; u < hi; ++u) {
                   const std::int64_t b = u / bands, r0 = u % bands * band, nr = std::min(band, rows - r0);
                   const T* src = in + b * rows * cols;
                   T* dst = out + b * rows * cols;
                   if constexpr (sizeof(T) == 4)
                     isa_call_native<transpose_band_f32<64>, transpose_band_f32<32>, transpose_band_f32<16>>(
                         reinterpret_cast<const float*>(src), reinterpret_cast<float*>(dst), rows, cols, r0, nr);
                   else
                     transpose_band(src, dst, rows, cols, r0, nr);
                 }
               });
}

/// f(U{}) with U the unsigned integer of dtype's item size: a transpose moves bits, whatever they mean.
template <class F>
void with_item_bits(DType dtype, F&& f) {
  switch (itemsize(dtype)) {
    case 1: return f(std::uint8_t{});
    case 2: return f(std::uint16_t{});
    case 4: return f(std::uint32_t{});
    default: return f(std::uint64_t{});
  }
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
  // The last two axes swapped, the others kept (a matrix or a batch of them): blocked.
  bool swap = nd >= 2 && perm[nd - 2] == static_cast<std::int64_t>(nd - 1) && perm[nd - 1] == static_cast<std::int64_t>(nd - 2);
  for (std::size_t i = 0; i + 2 < nd; ++i) swap = swap && perm[i] == static_cast<std::int64_t>(i);
  with_item_bits(x.dtype(), [&](auto u) {
    using U = decltype(u);
    const auto* in = static_cast<const U*>(x.data_ptr());
    auto* o = static_cast<U*>(out.data_ptr());
    if (swap) {
      const std::int64_t rows = s[nd - 2], cols = s[nd - 1];
      swap_last_two(in, o, x.numel() / (rows * cols), rows, cols);
    } else {
      permute(in, o, out.shape(), src_stride);
    }
  });
}

}  // namespace mpt::cpu
