// Image resampling (ops::affine_transform, ops::resize): the taps and their blend are
// common/image_transform.hpp's, which the CUDA kernel runs too.
#include <vector>

#include "backend/common/image_transform.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"

namespace mpt::cpu {

void CpuBackend::affine_transform(const Tensor& images, const Tensor& transform, const common::ImageTransform& how,
                                  Tensor& out) {
  const Shape& is = images.shape();
  const Shape& os = out.shape();
  const std::int64_t batch = is[0], h = is[1], w = is[2], channels = is[3], oh = os[1], ow = os[2];
  if (out.numel() == 0) return;
  auto run = [&](auto c) {
    using C = decltype(c);  // float64 images in double, every other floating dtype in float
    // The images widened once (16-bit inputs), the rows computed in C and stored (rounded) per row.
    const Tensor wide = images.dtype() == float64 ? images : to_float32(images);
    const C* src = wide.data<C>();
    const C* t = transform.data<C>();
    const C fill = static_cast<C>(how.fill_value);
    const std::int64_t row = ow * channels;
    parallel_for(batch * oh, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(1, row)),
                 [&](std::int64_t b0, std::int64_t e0) {
                   std::vector<C> scratch(static_cast<std::size_t>(row));
                   for (std::int64_t r = b0; r < e0; ++r) {
                     const std::int64_t b = r / oh, y = r - b * oh;
                     const C* image = src + b * h * w * channels;
                     C* o = store_target<C>(out, r * row, scratch.data());
                     for (std::int64_t x = 0; x < ow; ++x) {
                       const auto tp = common::image::taps<C>(t + b * 8, y, x, h, w, how.interpolation, how.fill_mode);
                       for (std::int64_t ch = 0; ch < channels; ++ch)
                         o[x * channels + ch] =
                             common::image::blend(tp, fill, [&](std::int64_t p) { return image[p * channels + ch]; });
                     }
                     store<C>(out, r * row, row, o);
                   }
                 });
  };
  if (out.dtype() == float64) run(double{});
  else run(float{});
}

}  // namespace mpt::cpu
