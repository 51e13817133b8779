// Image resampling: affine_transform and resize (keras.ops.image), one backend entry for both.
#include <cmath>
#include <vector>

#include "mpt/autograd.hpp"
#include "mpt/nn_ops.hpp"
#include "mpt/ops.hpp"
#include "ops/ops_common.hpp"

namespace mpt::ops {
using namespace detail;

namespace {

common::Interpolation parse_interpolation(const char* op, const std::string& s, bool nearest_allowed) {
  if (s == "bilinear") return common::Interpolation::Bilinear;
  if (s == "nearest" && nearest_allowed) return common::Interpolation::Nearest;
  fail(op, ": interpolation must be ", nearest_allowed ? "'bilinear' or 'nearest'" : "'bilinear'", ", got '", s, "'");
}

common::FillMode parse_fill_mode(const char* op, const std::string& s) {
  if (s == "constant") return common::FillMode::Constant;
  if (s == "nearest") return common::FillMode::Nearest;
  if (s == "wrap") return common::FillMode::Wrap;
  if (s == "mirror") return common::FillMode::Mirror;
  if (s == "reflect") return common::FillMode::Reflect;
  fail(op, ": fill_mode must be 'constant', 'nearest', 'wrap', 'mirror' or 'reflect', got '", s, "'");
}

/// images as [B, H, W, C] (a 3-d image gains a batch of one), checked.
Tensor as_batch(const char* op, const Tensor& images) {
  check_defined(op, images, "images");
  MPT_CHECK(images.dim() == 3 || images.dim() == 4, op,
            ": images must be [batch, height, width, channels] or [height, width, channels], got ", describe(images));
  check_floating(op, images);
  if (images.dim() == 4) return images;
  Shape s = images.shape();
  s.insert(s.begin(), 1);
  return reshape(images, s);
}

/// The resampled images [B, oh, ow, C] in images' dtype, from transform rows [B, 8] in the
/// compute dtype; a constant to autograd (no record).
Tensor resample(const Tensor& batch, const Tensor& transform, const common::ImageTransform& how, std::int64_t oh,
                std::int64_t ow, bool unbatch) {
  const Shape& s = batch.shape();
  Tensor out = Tensor::empty({s[0], oh, ow, s[3]}, batch.dtype(), batch.device());
  if (out.numel() > 0) {
    if (s[1] == 0 || s[2] == 0) {
      // No source pixels: every sample falls outside (constant fill; other modes have nothing to
      // repeat, so they fill too).
      backend_of(out).fill(out, how.fill_value);
    } else {
      backend_of(batch).affine_transform(batch.detach(), transform.detach(), how, out);
    }
  }
  return unbatch ? reshape(out, {oh, ow, s[3]}) : out;
}

}  // namespace

Tensor affine_transform(const Tensor& images, const Tensor& transform, AffineTransformOptions o) {
  const char* op = "affine_transform";
  const Tensor batch = as_batch(op, images);
  check_defined(op, transform, "transform");
  check_floating(op, transform);
  MPT_CHECK(transform.device() == images.device(), op, ": transform on ", transform.device().str(),
            ", images on ", images.device().str());
  const std::int64_t b = batch.shape()[0];
  const bool one = transform.dim() == 1 || (transform.dim() == 2 && transform.shape()[0] == 1);
  MPT_CHECK((transform.dim() == 1 || transform.dim() == 2) && transform.shape().back() == 8 &&
                (one || transform.shape()[0] == b),
            op, ": transform must be [8], [1, 8] or [batch, 8] with batch ", b, " (the images'), got ",
            describe(transform));
  const common::ImageTransform how{parse_interpolation(op, o.interpolation, true), parse_fill_mode(op, o.fill_mode),
                                   o.fill_value};
  const DType cd = images.dtype() == float64 ? float64 : float32;
  Tensor t = cast(reshape(transform.detach(), {one ? 1 : b, 8}), cd);
  if (one && b != 1) t = broadcast_to(t, {b, 8});
  return resample(batch, t, how, batch.shape()[1], batch.shape()[2], images.dim() == 3);
}

Tensor resize(const Tensor& images, IntPair size, ResizeOptions o) {
  const char* op = "resize";
  const Tensor batch = as_batch(op, images);
  MPT_CHECK(size.h > 0 && size.w > 0, op, ": size must be positive, got (", size.h, ", ", size.w, ")");
  const common::ImageTransform how{parse_interpolation(op, o.interpolation, false), common::FillMode::Nearest, 0.0};
  const Shape& s = batch.shape();
  const std::int64_t h = s[1], w = s[2];
  // The window resized: the whole image, or Keras's centred crop to the target's aspect ratio
  // (cut out first, so that the edges clamp to the window, as Keras).
  Tensor src = batch;
  std::int64_t ch = h, cw = w;
  if (o.crop_to_aspect_ratio && h > 0 && w > 0) {
    ch = std::max<std::int64_t>(std::min<std::int64_t>(h, static_cast<std::int64_t>(static_cast<double>(w) * static_cast<double>(size.h) / static_cast<double>(size.w))), 1);
    cw = std::max<std::int64_t>(std::min<std::int64_t>(w, static_cast<std::int64_t>(static_cast<double>(h) * static_cast<double>(size.w) / static_cast<double>(size.h))), 1);
    const std::int64_t y0 = (h - ch) / 2, x0 = (w - cw) / 2;
    src = slice(slice(batch.detach(), 1, y0, y0 + ch), 2, x0, x0 + cw);
  }
  // Half-pixel centres: source = (dst + 0.5) · scale - 0.5, one affine row per image.
  const double sy = static_cast<double>(ch) / static_cast<double>(size.h);
  const double sx = static_cast<double>(cw) / static_cast<double>(size.w);
  const std::vector<double> row{sx, 0.0, 0.5 * sx - 0.5, 0.0, sy, 0.5 * sy - 0.5, 0.0, 0.0};
  const DType cd = images.dtype() == float64 ? float64 : float32;
  Tensor t = Tensor::from_vector(row, {1, 8}, Device::cpu()).to(cd).to(images.device());
  if (s[0] != 1) t = broadcast_to(t, {s[0], 8});
  return resample(src, t, how, size.h, size.w, images.dim() == 3);
}

}  // namespace mpt::ops
