#pragma once
// Image resampling (ops::affine_transform, ops::resize): one thread per output pixel, its taps
// and blend from common/image_transform.hpp (the CPU's arithmetic), over every channel.
#include <cstdint>

#include "backend/common/image_transform.hpp"
#include "backend/cuda/kernels/element_types.hpp"
#include "backend/cuda/kernels/launch.hpp"

namespace mpt::kernels {

/// Output pixels [B, oh, ow] of images [B, h, w, channels] of storage type T, transform [B, 8]
/// in the compute type C.
struct ImageGeom {
  std::int64_t batch, h, w, channels, oh, ow;
};

template <class T, class C>
MPT_HOST_DEVICE void affine_transform_body(const Thread& t, const T* images, const C* transform, T* out, ImageGeom g,
                                           common::Interpolation interpolation, common::FillMode mode, C fill) {
  const std::int64_t pixels = g.batch * g.oh * g.ow;
  for (std::int64_t p = t.global(); p < pixels; p += t.stride()) {
    const std::int64_t b = p / (g.oh * g.ow), rest = p - b * g.oh * g.ow, y = rest / g.ow, x = rest - y * g.ow;
    const T* image = images + b * g.h * g.w * g.channels;
    const auto tp = common::image::taps<C>(transform + b * 8, y, x, g.h, g.w, interpolation, mode);
    for (std::int64_t ch = 0; ch < g.channels; ++ch)
      out[p * g.channels + ch] = store<T>(common::image::blend(
          tp, fill, [&](std::int64_t q) { return static_cast<C>(load(image[q * g.channels + ch])); }));
  }
}

}  // namespace mpt::kernels
