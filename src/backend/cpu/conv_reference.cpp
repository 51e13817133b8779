// float64 reference convolutions: the oracle-grade loops behind float64 gradient checks.
#include "backend/cpu/conv_reference.hpp"

#include <algorithm>
#include <cmath>

#include "backend/common/unary_ops.hpp"
#include "backend/cpu/cpu_common.hpp"

namespace mpt::cpu {
namespace {

/// cin, cout: all channels; cg, og: those of one group (the kernel is [kh, kw, cg, cout]).
struct ConvShape {
  std::int64_t n, h, w, cin, oh, ow, cout, kh, kw, cg, og;
};

ConvShape conv_shape(const Shape& x, const Shape& w, const Shape& y, const Conv2dGeometry& g) {
  return {x[0], x[1], x[2], x[3], y[1], y[2], y[3], w[0], w[1], x[3] / g.groups, y[3] / g.groups};
}

double activate(Activation act, double v) { return common::activate(act, v); }

/// Calls f(input row, input col, kernel row, kernel col) for each tap of output (oy, ox) that
/// falls inside the input.
template <class F>
void for_taps(const ConvShape& s, const Conv2dGeometry& g, std::int64_t oy, std::int64_t ox, F&& f) {
  for (std::int64_t i = 0; i < s.kh; ++i) {
    const std::int64_t iy = oy * g.stride_h - g.pad_top + i * g.dilation_h;
    if (iy < 0 || iy >= s.h) continue;
    for (std::int64_t j = 0; j < s.kw; ++j) {
      const std::int64_t ix = ox * g.stride_w - g.pad_left + j * g.dilation_w;
      if (ix >= 0 && ix < s.w) f(iy, ix, i, j);
    }
  }
}

}  // namespace

void reference_conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g, Activation act,
                       Tensor& out) {
  const ConvShape s = conv_shape(x.shape(), w.shape(), out.shape(), g);
  const double* X = x.data<double>();
  const double* W = w.data<double>();
  const double* B = bias.defined() ? bias.data<double>() : nullptr;
  double* Y = out.data<double>();
  parallel_for(s.n * s.oh, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t u = b; u < e; ++u) {
      const std::int64_t n = u / s.oh, oy = u % s.oh;
      for (std::int64_t ox = 0; ox < s.ow; ++ox) {
        double* o = Y + ((n * s.oh + oy) * s.ow + ox) * s.cout;
        for (std::int64_t co = 0; co < s.cout; ++co) o[co] = B ? B[co] : 0.0;
        for_taps(s, g, oy, ox, [&](std::int64_t iy, std::int64_t ix, std::int64_t i, std::int64_t j) {
          const double* xp = X + ((n * s.h + iy) * s.w + ix) * s.cin;
          const double* wp = W + (i * s.kw + j) * s.cg * s.cout;
          for (std::int64_t co = 0; co < s.cout; ++co) {
            const std::int64_t c0 = co / s.og * s.cg;  // the input block of co's group
            for (std::int64_t ci = 0; ci < s.cg; ++ci) o[co] += xp[c0 + ci] * wp[ci * s.cout + co];
          }
        });
        for (std::int64_t co = 0; co < s.cout; ++co) o[co] = activate(act, o[co]);
      }
    }
  });
}

void reference_conv_backward_data(const Tensor& dy, const Tensor& w, const Conv2dGeometry& g, Tensor& dx) {
  const ConvShape s = conv_shape(dx.shape(), w.shape(), dy.shape(), g);
  const double* DY = dy.data<double>();
  const double* W = w.data<double>();
  double* DX = dx.data<double>();
  std::fill(DX, DX + dx.numel(), 0.0);
  parallel_for(s.n, 1, [&](std::int64_t b, std::int64_t e) {  // images scatter independently
    for (std::int64_t n = b; n < e; ++n)
      for (std::int64_t oy = 0; oy < s.oh; ++oy)
        for (std::int64_t ox = 0; ox < s.ow; ++ox) {
          const double* d = DY + ((n * s.oh + oy) * s.ow + ox) * s.cout;
          for_taps(s, g, oy, ox, [&](std::int64_t iy, std::int64_t ix, std::int64_t i, std::int64_t j) {
            double* xp = DX + ((n * s.h + iy) * s.w + ix) * s.cin;
            const double* wp = W + (i * s.kw + j) * s.cg * s.cout;
            for (std::int64_t c = 0; c < s.cin; ++c) {
              const std::int64_t o0 = c / s.cg * s.og, ci = c % s.cg;  // c's group's output block
              double acc = 0;
              for (std::int64_t co = o0; co < o0 + s.og; ++co) acc += d[co] * wp[ci * s.cout + co];
              xp[c] += acc;
            }
          });
        }
  });
}

void reference_conv_backward_weights(const Tensor& x, const Tensor& dy, const Conv2dGeometry& g, Tensor& dw,
                                Tensor& dbias) {
  const ConvShape s = conv_shape(x.shape(), dw.shape(), dy.shape(), g);
  const double* X = x.data<double>();
  const double* DY = dy.data<double>();
  double* DW = dw.data<double>();
  parallel_for(s.kh * s.kw * s.cg, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t u = b; u < e; ++u) {
      const std::int64_t i = u / (s.kw * s.cg), j = (u / s.cg) % s.kw, ci = u % s.cg;
      double* o = DW + u * s.cout;
      std::fill(o, o + s.cout, 0.0);
      for (std::int64_t n = 0; n < s.n; ++n)
        for (std::int64_t oy = 0; oy < s.oh; ++oy) {
          const std::int64_t iy = oy * g.stride_h - g.pad_top + i * g.dilation_h;
          if (iy < 0 || iy >= s.h) continue;
          for (std::int64_t ox = 0; ox < s.ow; ++ox) {
            const std::int64_t ix = ox * g.stride_w - g.pad_left + j * g.dilation_w;
            if (ix < 0 || ix >= s.w) continue;
            const double* xp = X + ((n * s.h + iy) * s.w + ix) * s.cin + ci;
            const double* d = DY + ((n * s.oh + oy) * s.ow + ox) * s.cout;
            for (std::int64_t co = 0; co < s.cout; ++co) o[co] += xp[co / s.og * s.cg] * d[co];
          }
        }
    }
  });
  if (dbias.defined()) {
    double* DB = dbias.data<double>();
    std::fill(DB, DB + s.cout, 0.0);
    for (std::int64_t r = 0; r < s.n * s.oh * s.ow; ++r)
      for (std::int64_t co = 0; co < s.cout; ++co) DB[co] += DY[r * s.cout + co];
  }
}

}  // namespace mpt::cpu
