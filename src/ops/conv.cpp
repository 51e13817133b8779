#include "mpt/nn_ops.hpp"
#include "ops/ops_common.hpp"
#include "ops/spatial.hpp"

namespace mpt::ops {
using namespace detail;

namespace {

std::string size2(const IntPair& s) { return std::to_string(s[0]) + "x" + std::to_string(s[1]); }

Conv2dGeometry conv_geometry(const Tensor& x, const Tensor& w, const Conv2dOptions& o, Shape& out) {
  const char* name = "conv2d";
  const bool same = parse_padding(name, o.padding);
  for (int i = 0; i < 2; ++i) {
    MPT_CHECK(o.strides[i] >= 1, name, ": strides must be positive, got ", size2(o.strides));
    MPT_CHECK(o.dilation[i] >= 1, name, ": dilation must be positive, got ", size2(o.dilation));
  }
  const Shape& xs = x.shape();
  const Shape& ws = w.shape();
  IntPair eff;
  for (int i = 0; i < 2; ++i)
    MPT_CHECK(!__builtin_mul_overflow(ws[i] - 1, o.dilation[i], &eff[i]) && eff[i] < INT64_MAX, name,
              ": dilation_rate ", size2(o.dilation), " makes the ", size2({ws[0], ws[1]}),
              " kernel span more than 2^63 pixels");
  eff[0] += 1, eff[1] += 1;
  MPT_CHECK(same || (eff[0] <= xs[1] && eff[1] <= xs[2]), name, ": kernel ", size2({ws[0], ws[1]}),
            (o.dilation == IntPair{1, 1} ? std::string() : " (" + size2(eff) + " dilated)"), " is larger than the input ",
            size2({xs[1], xs[2]}), " with 'valid' padding (input ", describe(x), ", kernel ", describe(w), ")");
  const SpatialAxis h = spatial_axis(xs[1], eff[0], o.strides[0], same);
  const SpatialAxis v = spatial_axis(xs[2], eff[1], o.strides[1], same);
  out = {xs[0], h.out, v.out, ws[3]};
  Conv2dGeometry g;
  g.stride_h = o.strides[0], g.stride_w = o.strides[1];
  g.dilation_h = o.dilation[0], g.dilation_w = o.dilation[1];
  g.pad_top = h.pad_lo, g.pad_bottom = h.pad_hi, g.pad_left = v.pad_lo, g.pad_right = v.pad_hi;
  g.groups = o.groups;
  return g;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias, Conv2dOptions o) {
  const char* name = "conv2d";
  check_compatible(name, x, kernel);
  check_floating(name, x);
  MPT_CHECK(x.dim() == 4, name, ": input must be 4-d [batch, height, width, channels], got ", describe(x));
  MPT_CHECK(kernel.dim() == 4, name, ": kernel must be 4-d [kernel_height, kernel_width, in_channels, filters], got ",
            describe(kernel));
  const Shape& ws = kernel.shape();
  MPT_CHECK(ws[0] > 0 && ws[1] > 0 && ws[2] > 0 && ws[3] > 0, name, ": empty kernel ", describe(kernel));
  const std::int64_t groups = o.groups, cin = x.shape()[3];
  MPT_CHECK(groups >= 1, name, ": groups must be positive, got ", groups);
  MPT_CHECK(cin % groups == 0 && ws[3] % groups == 0, name, ": groups = ", groups, " must divide the ", cin,
            " input channels of ", describe(x), " and the ", ws[3], " filters of kernel ", describe(kernel));
  MPT_CHECK(ws[2] * groups == cin, name, ": input ", describe(x), " has ", cin, " channels but kernel ",
            describe(kernel), " expects ", ws[2], groups > 1 ? " per group (" + std::to_string(ws[2] * groups) + " in " +
                                                                   std::to_string(groups) + " groups)"
                                                             : std::string());
  if (bias.defined()) {
    check_compatible(name, x, bias);
    MPT_CHECK(bias.dim() == 1 && bias.shape()[0] == ws[3], name, ": bias ", describe(bias), " does not match kernel ",
              describe(kernel), " (", ws[3], " filters)");
  }
  const Activation act = activation_from_name(name, o.activation);
  Shape out_shape;
  const Conv2dGeometry g = conv_geometry(x, kernel, o, out_shape);
  // As in dense: activations whose gradient needs the pre-activation run unfused.
  const bool fuse = common::unary_grad_from_output(act);
  Tensor z = Tensor::empty(out_shape, x.dtype(), x.device());
  backend_of(x).conv2d(x, kernel, bias, g, fuse ? act : Activation::Linear, z);
  Tensor y = z;
  if (!fuse) {
    y = Tensor::empty(out_shape, x.dtype(), x.device());
    apply_activation(act, z, y);
  }
  autograd::record(name, {x, kernel, bias}, {&y},
                   [x = x.detach(), w = kernel.detach(), bias_shape = bias.defined() ? bias.shape() : Shape{}, g, act,
                    fuse, z = fuse ? Tensor() : z.detach(), yd = y.detach(), need_x = x.requires_grad(),
                    need_w = kernel.requires_grad(),
                    need_b = bias.defined() && bias.requires_grad()](const std::vector<Tensor>& grads) {
                     Backend& be = backend_of(x);
                     Tensor dz = grads[0];
                     if (act != Activation::Linear) {
                       dz = Tensor::empty(yd.shape(), yd.dtype(), yd.device());
                       activation_backward(act, fuse ? yd : z, yd, grads[0], dz);
                     }
                     Tensor dx = need_x ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor();
                     Tensor dw = need_w ? Tensor::empty(w.shape(), w.dtype(), w.device()) : Tensor();
                     Tensor db = need_b ? Tensor::empty(bias_shape, dz.dtype(), dz.device()) : Tensor();
                     be.conv2d_backward(x, w, dz, g, dx, dw, db);
                     return std::vector<Tensor>{dx, dw, db};
                   });
  return y;
}

Tensor zero_pad2d(const Tensor& x, std::int64_t top, std::int64_t bottom, std::int64_t left, std::int64_t right) {
  const char* name = "zero_pad2d";
  check_defined(name, x);
  MPT_CHECK(x.dim() == 4, name, ": input must be 4-d [batch, height, width, channels], got ", describe(x));
  MPT_CHECK(top >= 0 && bottom >= 0 && left >= 0 && right >= 0, name, ": padding must be >= 0, got ((", top, ", ",
            bottom, "), (", left, ", ", right, "))");
  const Shape& s = x.shape();
  std::int64_t h = 0, w = 0;
  MPT_CHECK(!__builtin_add_overflow(s[1], top, &h) && !__builtin_add_overflow(h, bottom, &h) &&
                !__builtin_add_overflow(s[2], left, &w) && !__builtin_add_overflow(w, right, &w),
            name, ": padding ((", top, ", ", bottom, "), (", left, ", ", right, ")) of ", describe(x),
            " gives a size beyond 2^63");
  Tensor out = Tensor::empty({s[0], h, w, s[3]}, x.dtype(), x.device());
  if (out.numel() > 0) backend_of(x).pad(x, {0, top, left, 0}, out);
  autograd::record(name, {x}, {&out}, [s, top, left](const std::vector<Tensor>& g) {
    Tensor dx = Tensor::empty(s, g[0].dtype(), g[0].device());
    if (dx.numel() > 0) backend_of(dx).pad(g[0], {0, -top, -left, 0}, dx);  // the gradient crops
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace mpt::ops
