// The CPU backend's direct kernels for convolutions with few input channels
// (src/backend/cpu/conv_small.cpp) against the float64 reference loops, in float32, bfloat16 and
// float16: the forward with bias and fused activations, and the kernel and bias gradients, over
// valid, 'same' (symmetric and asymmetric) and explicit padding, strides, dilations and kernel
// sizes from 1x1 to 5x5, with channel counts that leave partial register blocks.
#include <cmath>
#include <string>

#include "backend/cpu/conv_reference.hpp"
#include "backend/cpu/conv_small.hpp"
#include "core/cpu_isa.hpp"
#include "test_util.hpp"

using namespace mpt;
using mpt::test::check_close;
using mpt::test::random;
using mpt::test::tolerance;

namespace {

struct Case {
  Shape x;  // [N, H, W, Cin]
  std::int64_t kh, kw, cout;
  Conv2dGeometry g;
};

Conv2dGeometry geometry(std::int64_t sh, std::int64_t sw, std::int64_t dh, std::int64_t dw, std::int64_t top,
                        std::int64_t bottom, std::int64_t left, std::int64_t right) {
  Conv2dGeometry g;
  g.stride_h = sh, g.stride_w = sw, g.dilation_h = dh, g.dilation_w = dw;
  g.pad_top = top, g.pad_bottom = bottom, g.pad_left = left, g.pad_right = right;
  return g;
}

Shape out_shape(const Case& c) {
  auto axis = [](std::int64_t in, std::int64_t k, std::int64_t s, std::int64_t d, std::int64_t lo, std::int64_t hi) {
    return (in + lo + hi - (k - 1) * d - 1) / s + 1;
  };
  return {c.x[0], axis(c.x[1], c.kh, c.g.stride_h, c.g.dilation_h, c.g.pad_top, c.g.pad_bottom),
          axis(c.x[2], c.kw, c.g.stride_w, c.g.dilation_w, c.g.pad_left, c.g.pad_right), c.cout};
}

std::string describe(const Case& c, DType dt) {
  const Conv2dGeometry& g = c.g;
  return to_string(c.x) + " k" + std::to_string(c.kh) + "x" + std::to_string(c.kw) + "x" + std::to_string(c.cout) +
         " s" + std::to_string(g.stride_h) + std::to_string(g.stride_w) + " d" + std::to_string(g.dilation_h) +
         std::to_string(g.dilation_w) + " pad " + std::to_string(g.pad_top) + std::to_string(g.pad_bottom) +
         std::to_string(g.pad_left) + std::to_string(g.pad_right) + " " + to_string(dt);
}

Tensor f64(const Tensor& t) { return t.defined() ? t.to(float64) : t; }
Tensor abs64(const Tensor& t) { return t.defined() ? ops::abs(t.to(float64)) : t; }

double max_of(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, v);
  return m;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {{3, 9, 10, 1}, 3, 3, 32, geometry(1, 1, 1, 1, 0, 0, 0, 0)},    // valid (Fashion-MNIST's first layer)
      {{2, 9, 10, 3}, 3, 3, 16, geometry(1, 1, 1, 1, 1, 1, 1, 1)},    // same
      {{2, 8, 9, 1}, 4, 4, 20, geometry(1, 1, 1, 1, 1, 2, 1, 2)},     // same with an even kernel: asymmetric
      {{2, 9, 8, 3}, 3, 3, 8, geometry(2, 2, 1, 1, 1, 1, 0, 1)},      // same, stride 2
      {{2, 11, 11, 3}, 3, 3, 40, geometry(1, 1, 2, 2, 0, 0, 0, 0)},   // valid, dilation 2
      {{2, 10, 9, 1}, 5, 5, 64, geometry(1, 1, 1, 1, 2, 2, 2, 2)},    // 5x5 same
      {{3, 7, 6, 3}, 1, 1, 5, geometry(2, 2, 1, 1, 0, 0, 0, 0)},      // 1x1, stride 2
      {{2, 7, 8, 4}, 3, 2, 33, geometry(2, 1, 1, 2, 3, 0, 0, 2)},     // padding wider than the kernel reaches
      {{2, 6, 7, 2}, 2, 3, 17, geometry(1, 3, 1, 1, 0, 1, 2, 0)},     // stride 3, odd padding
      {{16, 28, 28, 1}, 3, 3, 32, geometry(1, 1, 1, 1, 0, 0, 0, 0)},  // several row blocks and threads
      {{4, 32, 32, 3}, 3, 3, 32, geometry(1, 1, 1, 1, 1, 1, 1, 1)},   // CIFAR's first layer
  };
  return c;
}

}  // namespace

TEST_CASE("small-channel direct convolutions apply to 1 to 4 input channels in float32, bfloat16, float16") {
  // The backend routes them there at the avx512 tier only (test_cpu_isa checks that rule); the
  // kernels below run at the process's tier either way (the _avx2 and _baseline runs).
  const bool routed = detail::cpu_isa() == detail::CpuIsa::avx512;
  for (DType d : {float32, bfloat16, float16}) {
    CHECK(cpu::small_conv_supports({8, 28, 28, 1}, {3, 3, 1, 32}, d));
    CHECK(cpu::small_conv_supports({8, 32, 32, 4}, {5, 5, 4, 7}, d));
    CHECK_FALSE(cpu::small_conv_supports({8, 32, 32, 5}, {3, 3, 5, 32}, d));
    CHECK(cpu::small_conv_applies({8, 32, 32, 4}, {5, 5, 4, 7}, d) == routed);
    CHECK_FALSE(cpu::small_conv_applies({8, 32, 32, 5}, {3, 3, 5, 32}, d));
  }
  CHECK_FALSE(cpu::small_conv_supports({8, 28, 28, 1}, {3, 3, 1, 32}, float64));
}

TEST_CASE("small-channel direct convolution forward matches the float64 reference") {
  // Every activation ops::conv2d fuses (those differentiated from the output), in turn.
  std::vector<Activation> acts;
  common::for_each_unary_op([&](auto o) {
    if (common::unary_info(o).keras != nullptr && common::unary_grad_from_output(o)) acts.push_back(o);
  });
  for (DType dt : {float32, bfloat16, float16})
    for (std::size_t i = 0; i < cases().size(); ++i) {
      const Case& c = cases()[i];
      const Activation act = acts[i % acts.size()];
      const std::string what = "forward " + describe(c, dt) + " " + common::unary_name(act);
      Tensor x = random(c.x, dt, Device::cpu(), 10 + i, -1, 1);
      Tensor w = random({c.kh, c.kw, c.x[3], c.cout}, dt, Device::cpu(), 20 + i, -0.5, 0.5);
      Tensor b = i % 3 == 2 ? Tensor() : random({c.cout}, dt, Device::cpu(), 30 + i);
      REQUIRE(cpu::small_conv_supports(x.shape(), w.shape(), dt));
      const Shape ys = out_shape(c);
      Tensor y = Tensor::empty(ys, dt, Device::cpu());
      cpu::small_conv_forward(x, w, b, c.g, act, y);
      Tensor ref = Tensor::empty(ys, float64, Device::cpu()), mag = Tensor::empty(ys, float64, Device::cpu());
      cpu::reference_conv_forward(f64(x), f64(w), f64(b), c.g, act, ref);
      cpu::reference_conv_forward(abs64(x), abs64(w), abs64(b), c.g, Activation::Linear, mag);
      const std::vector<double> expected = ref.to_vector<double>();
      // float32 sums, one rounding to the storage dtype; the activations are 1-Lipschitz.
      check_close(y, expected, {tolerance(dt).rtol, tolerance(dt).rtol * max_of(mag)}, what);
      if (dt != float32) {  // exactly the float32 result, rounded once
        Tensor y32 = Tensor::empty(ys, float32, Device::cpu());
        cpu::small_conv_forward(x.to(float32), w.to(float32), b.defined() ? b.to(float32) : b, c.g, act, y32);
        CHECK_MESSAGE(y.to_vector<double>() == y32.to(dt).to_vector<double>(), what,
                      ": not the rounded float32 result");
      }
    }
}

TEST_CASE("small-channel direct convolution kernel and bias gradients match the float64 reference") {
  for (DType dt : {float32, bfloat16, float16})
    for (std::size_t i = 0; i < cases().size(); ++i) {
      const Case& c = cases()[i];
      const std::string what = "weight gradient " + describe(c, dt);
      const Shape ys = out_shape(c), ws{c.kh, c.kw, c.x[3], c.cout};
      Tensor x = random(c.x, dt, Device::cpu(), 40 + i, -1, 1);
      Tensor dy = random(ys, dt, Device::cpu(), 50 + i, -1, 1);
      Tensor dw = Tensor::empty(ws, dt, Device::cpu()), db = Tensor::empty({c.cout}, dt, Device::cpu());
      cpu::small_conv_backward_weights(x, dy, c.g, dw, db);
      Tensor rw = Tensor::empty(ws, float64, Device::cpu()), rb = Tensor::empty({c.cout}, float64, Device::cpu());
      Tensor mw = Tensor::empty(ws, float64, Device::cpu()), mb = Tensor::empty({c.cout}, float64, Device::cpu());
      cpu::reference_conv_backward_weights(f64(x), f64(dy), c.g, rw, rb);
      cpu::reference_conv_backward_weights(abs64(x), abs64(dy), c.g, mw, mb);
      const test::Tolerance tol = tolerance(dt);
      check_close(dw, rw.to_vector<double>(), {tol.rtol, tol.rtol * max_of(mw)}, what + " dkernel");
      check_close(db, rb.to_vector<double>(), {tol.rtol, tol.rtol * max_of(mb)}, what + " dbias");
      if (i == 0) {  // each gradient alone
        Tensor none, dw_only = Tensor::empty(ws, dt, Device::cpu());
        Tensor db_only = Tensor::empty({c.cout}, dt, Device::cpu());
        cpu::small_conv_backward_weights(x, dy, c.g, dw_only, none);
        cpu::small_conv_backward_weights(x, dy, c.g, none, db_only);
        CHECK_MESSAGE(dw_only.to_vector<double>() == dw.to_vector<double>(), what, ": dkernel alone");
        CHECK_MESSAGE(db_only.to_vector<double>() == db.to_vector<double>(), what, ": dbias alone");
      }
    }
}
