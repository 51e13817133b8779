// Row gathers (shuffled batches) and zero padding / cropping: grid-stride copies of
// kernels/gather.hpp, bit for bit the CPU's.
#include <cstdint>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/gather.hpp"
#include "mpt/error.hpp"

namespace mpt::cuda {
namespace {
using namespace mpt::kernels;

constexpr unsigned kThreads = 256;

template <class W>
__global__ void gather_rows_kernel(const W* x, const std::int64_t* indices, W* out, std::int64_t count,
                                   std::int64_t row_words, std::int64_t rows) {
  gather_rows_body(this_thread(), x, indices, out, count, row_words, rows);
}

template <class S, class C>
__global__ void scatter_add_rows_kernel(const S* src, const std::int64_t* indices, C* out, std::int64_t count,
                                        std::int64_t width) {
  scatter_add_rows_body(this_thread(), src, indices, out, count, width);
}

template <class W>
__global__ void pad_kernel(const W* x, W* out, std::int64_t total, PadGeom g) {
  pad_body(this_thread(), x, out, total, g);
}

/// Calls f(W{}) with the unsigned word of `bytes` bytes (1, 2, 4, 8 or 16).
template <class F>
void with_word(std::size_t bytes, F&& f) {
  switch (bytes) {
    case 16: return f(uint4{});
    case 8: return f(std::uint64_t{});
    case 4: return f(std::uint32_t{});
    case 2: return f(std::uint16_t{});
    default: return f(std::uint8_t{});
  }
}
}  // namespace

void CudaBackend::gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) {
  const std::int64_t count = indices.numel();
  const std::size_t row = x.shape()[0] > 0 ? x.nbytes() / static_cast<std::size_t>(x.shape()[0]) : 0;
  if (row == 0 || count == 0) return;
  // The widest word that divides the row and both base addresses.
  const auto align = reinterpret_cast<std::uintptr_t>(x.data_ptr()) | reinterpret_cast<std::uintptr_t>(out.data_ptr()) | row;
  std::size_t word = 16;
  while (word > 1 && (align % word) != 0) word /= 2;
  DeviceGuard guard(out.device().index);
  with_word(word, [&](auto w) {
    using W = decltype(w);
    const auto row_words = static_cast<std::int64_t>(row / sizeof(W));
    gather_rows_kernel<W><<<blocks_for(count * row_words, kThreads), kThreads, 0, stream(guard.index())>>>(
        static_cast<const W*>(x.data_ptr()), indices.data<std::int64_t>(), static_cast<W*>(out.data_ptr()), count,
        row_words, x.shape()[0]);
    check_launch("gather_rows");
  });
}

void CudaBackend::scatter_add_rows(const Tensor& src, const Tensor& indices, Tensor& out) {
  const std::int64_t count = indices.numel(), rows = out.shape()[0];
  const std::int64_t width = rows > 0 ? out.numel() / rows : 0;
  if (count == 0 || width == 0) return;
  DeviceGuard guard(out.device().index);
  dispatch_float(src.dtype(), "scatter_add_rows", [&](auto tag) {
    using S = typename decltype(tag)::type;
    auto launch = [&](auto* o) {
      using C = std::remove_pointer_t<decltype(o)>;
      scatter_add_rows_kernel<S, C><<<blocks_for(width, kThreads), kThreads, 0, stream(guard.index())>>>(
          static_cast<const S*>(src.data_ptr()), indices.data<std::int64_t>(), o, count, width);
    };
    if (out.dtype() == float64) launch(out.data<double>());
    else launch(out.data<float>());
    check_launch("scatter_add_rows");
  });
}

void CudaBackend::pad(const Tensor& x, const std::vector<std::int64_t>& offset, Tensor& out) {
  const std::int64_t total = out.numel();
  if (total == 0) return;
  const Shape& xs = x.shape();
  const Shape& os = out.shape();
  PadGeom g;
  g.nd = static_cast<int>(os.size());
  MPT_CHECK(g.nd <= kMaxPadDims, "pad: rank ", g.nd, " above the CUDA kernel's ", kMaxPadDims);
  for (int d = 0; d < g.nd; ++d) g.out_shape[d] = os[d], g.in_shape[d] = xs[d], g.offset[d] = offset[d];
  DeviceGuard guard(out.device().index);
  with_word(itemsize(out.dtype()), [&](auto w) {
    using W = decltype(w);
    if constexpr (sizeof(W) <= 8) {
      pad_kernel<W><<<blocks_for(total, kThreads), kThreads, 0, stream(guard.index())>>>(
          static_cast<const W*>(x.data_ptr()), static_cast<W*>(out.data_ptr()), total, g);
      check_launch("pad");
    }
  });
}

}  // namespace mpt::cuda
