// GradientTape: what is recorded, gradients of composites, accumulation, persistence, nesting,
// 16-bit and mixed-precision gradients, and gradients through shape ops.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

#include "test_util.hpp"

using namespace mpt;
using mpt::test::check_close;
using mpt::test::for_each_device;
using mpt::test::tolerance;

namespace {

std::vector<double> values_of(const Tensor& t) { return t.to_vector<double>(); }

/// 0, 1, 2, ... + offset as float64 values of `shape`: distinct weights that are easy to place.
Tensor weights(const Shape& shape, DType dtype, Device dev, double offset = 1.0) {
  return Tensor::arange(offset, offset + static_cast<double>(numel_of(shape)), 1.0, dtype, dev).reshape(shape);
}

}  // namespace

TEST_CASE("nothing is recorded outside a tape, even for variables") {
  for_each_device([](Device dev) {
    Tensor w = Tensor::from_vector({1.f, 2.f, 3.f}, {}, dev);
    w.set_requires_grad(true);
    CHECK(w.requires_grad());
    CHECK_FALSE(autograd::is_recording());
    Tensor y = w * w + 1.0;
    CHECK_FALSE(y.requires_grad());
    CHECK(y.impl()->grad_fn == nullptr);
    CHECK_FALSE(ops::sum(ops::exp(w)).requires_grad());
    CHECK_FALSE(w.reshape({3, 1}).requires_grad());
    CHECK_FALSE(w.slice(0, 2).requires_grad());
    CHECK_FALSE(ops::cast(w, float16).requires_grad());
    CHECK_FALSE(ops::matmul(w.reshape({1, 3}), w.reshape({3, 1})).requires_grad());
    CHECK(y.to_vector<float>() == std::vector<float>{2, 5, 10});

    // A tape opened afterwards cannot differentiate what was computed before it.
    Tensor before = ops::sum(w * w);
    GradientTape tape;
    CHECK(autograd::is_recording());
    auto g = tape.gradient(before, {w});
    REQUIRE(g.size() == 1);
    CHECK_FALSE(g[0].defined());
  });
}

TEST_CASE("NoGradGuard suspends recording inside a tape and restores it") {
  Tensor x = Tensor::from_vector({0.5, -1.0, 2.0});
  GradientTape tape({.persistent = true});
  tape.watch(x);
  Tensor recorded = x * x;
  CHECK(recorded.requires_grad());
  Tensor not_recorded;
  {
    NoGradGuard guard;
    CHECK_FALSE(autograd::is_recording());
    not_recorded = x * x;
    {
      NoGradGuard inner;
      CHECK_FALSE(autograd::is_recording());
    }
    CHECK_FALSE(autograd::is_recording());  // the inner guard restores "off", not "on"
  }
  CHECK(autograd::is_recording());
  CHECK_FALSE(not_recorded.requires_grad());
  CHECK(not_recorded.to_vector<double>() == recorded.to_vector<double>());
  CHECK_FALSE(tape.gradient(ops::sum(not_recorded), {x})[0].defined());
  check_close(tape.gradient(ops::sum(recorded), {x})[0], {1.0, -2.0, 4.0}, tolerance(float64), "d sum(x^2)");
}

TEST_CASE("inside a tape, ops on a watched tensor are recorded and others are not") {
  for_each_device([](Device dev) {
    Tensor x = Tensor::from_vector({1.f, 2.f}, {}, dev);
    Tensor c = Tensor::from_vector({3.f, 4.f}, {}, dev);
    GradientTape tape;
    CHECK_FALSE(x.requires_grad());
    tape.watch(x);
    CHECK(x.requires_grad());
    Tensor y = x * c;
    REQUIRE(y.requires_grad());
    REQUIRE(y.impl()->grad_fn != nullptr);
    CHECK(y.impl()->grad_fn->name == "mul");
    CHECK(y.impl()->grad_fn->inputs.size() == 2);
    CHECK(y.impl()->grad_fn->inputs[0].leaf_id == x.id());
    CHECK_FALSE(y.impl()->grad_fn->inputs[1].needed());  // c is a constant
    Tensor s = ops::sum(y);
    CHECK(s.impl()->grad_fn->name == "sum");
    CHECK(s.impl()->grad_fn->inputs[0].fn == y.impl()->grad_fn);
    // Ops on constants only are not recorded; nor are comparisons or argmax.
    CHECK_FALSE((c * c).requires_grad());
    CHECK_FALSE(ops::greater(x, c).requires_grad());
    CHECK_FALSE(ops::argmax(x).requires_grad());
    // Integer tensors cannot be watched.
    Tensor i = Tensor::from_vector({1, 2}, {}, dev);
    CHECK_THROWS_AS(tape.watch(i), Error);
  });
}

TEST_CASE("gradient of sum(x*x + 3x) is 2x + 3 in every float dtype") {
  for_each_device([](Device dev) {
    for (DType d : mpt::test::float_dtypes()) {
      CAPTURE(to_string(d));
      Tensor x = mpt::test::random({3, 4}, d, dev, 11);
      GradientTape tape;
      tape.watch(x);
      Tensor y = ops::sum(x * x + 3.0 * x);
      auto g = tape.gradient(y, {x});
      REQUIRE(g[0].defined());
      CHECK(g[0].dtype() == d);
      CHECK(g[0].shape() == x.shape());
      CHECK(g[0].device() == dev);
      std::vector<double> expected;
      for (double v : values_of(x)) expected.push_back(2 * v + 3);
      check_close(g[0], expected, tolerance(d), "d/dx sum(x*x + 3x)");
    }
  });
  // A longer composite against central differences.
  mpt::test::check_gradients(
      "tanh(x) * x / (1 + x^2) - exp(x) * 0.5",
      [](const std::vector<Tensor>& in) {
        const Tensor& x = in[0];
        return ops::tanh(x) * x / (1.0 + x * x) - ops::exp(x) * 0.5;
      },
      {mpt::test::random({2, 5}, float64, Device::cpu(), 3)});
}

TEST_CASE("gradient of a non-scalar target is that of its sum; of the target itself is ones") {
  Tensor x = Tensor::from_vector({1.0, -2.0, 0.5}, {3, 1});
  GradientTape tape({.persistent = true});
  tape.watch(x);
  Tensor y = x * x;  // not reduced
  check_close(tape.gradient(y, {x})[0], {2.0, -4.0, 1.0}, tolerance(float64), "d sum(x^2)");
  Tensor g = tape.gradient(y, {y})[0];
  CHECK(g.shape() == y.shape());
  CHECK(g.to_vector<double>() == std::vector<double>{1, 1, 1});
}

TEST_CASE("gradients with respect to intermediate tensors") {
  for_each_device([](Device dev) {
    Tensor x = Tensor::from_vector({1.0, -2.0, 3.0}, {}, dev);
    GradientTape tape;
    tape.watch(x);
    Tensor h = x * x;              // h = x^2
    Tensor y = ops::sum(h * h);    // y = sum(h^2) = sum(x^4)
    auto g = tape.gradient(y, {h, x});
    REQUIRE(g[0].defined());
    REQUIRE(g[1].defined());
    check_close(g[0], {2.0, 8.0, 18.0}, tolerance(float64), "dy/dh = 2h");
    check_close(g[1], {4.0, -32.0, 108.0}, tolerance(float64), "dy/dx = 4x^3");
  });
}

TEST_CASE("a source the target does not depend on gets an undefined gradient") {
  Tensor x = Tensor::from_vector({1.f, 2.f});
  Tensor z = Tensor::from_vector({5.f, 6.f});
  Tensor c = Tensor::from_vector({7.f, 8.f});  // used, but neither watched nor a variable
  GradientTape tape;
  tape.watch(x);
  tape.watch(z);
  Tensor unrelated = z * 2.0;  // recorded, but not part of y
  Tensor y = ops::sum(x * c);
  auto g = tape.gradient(y, {x, z, c, unrelated});
  REQUIRE(g.size() == 4);
  REQUIRE(g[0].defined());
  CHECK(g[0].to_vector<float>() == std::vector<float>{7, 8});
  CHECK_FALSE(g[1].defined());
  CHECK_FALSE(g[2].defined());
  CHECK_FALSE(g[3].defined());
}

TEST_CASE("a tensor used several times accumulates its gradients") {
  for_each_device([](Device dev) {
    Tensor x = Tensor::from_vector({1.0, -2.0, 0.5}, {}, dev);
    {
      GradientTape tape;
      tape.watch(x);
      check_close(tape.gradient(ops::sum(x + x), {x})[0], {2, 2, 2}, tolerance(float64), "x + x");
    }
    {
      GradientTape tape;
      tape.watch(x);
      Tensor a = x * 2.0, b = x * x, c = ops::exp(x);
      Tensor y = ops::sum(a) + ops::sum(b * 3.0) - ops::sum(c);
      std::vector<double> expected;
      for (double v : values_of(x)) expected.push_back(2 + 6 * v - std::exp(v));
      check_close(tape.gradient(y, {x})[0], expected, tolerance(float64), "2x + 3x^2 - e^x");
    }
    {
      // Broadcasting: b [3] is used by both rows of x + b, and again alone.
      Tensor m = Tensor::ones({2, 3}, float64, dev);
      Tensor b = Tensor::from_vector({0.0, 1.0, 2.0}, {}, dev);
      GradientTape tape;
      tape.watch(b);
      Tensor y = ops::sum((m + b) * (m + b)) + ops::sum(b);
      std::vector<double> expected;
      for (double v : values_of(b)) expected.push_back(2 * 2 * (1 + v) + 1);
      check_close(tape.gradient(y, {b})[0], expected, tolerance(float64), "broadcast accumulation");
    }
    {
      // The same tensor concatenated with itself.
      GradientTape tape;
      tape.watch(x);
      Tensor y = ops::sum(ops::concat({x, x, x}) * 0.5);
      check_close(tape.gradient(y, {x})[0], {1.5, 1.5, 1.5}, tolerance(float64), "concat(x, x, x)");
    }
  });
}

TEST_CASE("gradients summed in place never change a gradient handed out or shared") {
  // A slot takes further contributions in place only when nothing else holds it. Here add's
  // backward hands its incoming gradient itself to h (the gradient also handed to the caller as
  // a's), a reshape's backward hands over a view of b's (also the caller's), and h's slot keeps
  // summing; both orders of the terms, so either contribution can arrive first.
  for_each_device([](Device dev) {
    for (DType dt : {float32, float64})
      for (bool order : {false, true}) {
        const Tensor x = Tensor::from_vector({1.0, -2.0, 0.5, 3.0, 0.25, -1.5}, {2, 3}, dev).to(dt);
        const Tensor c = Tensor::from_vector({7.0, 7.0, 7.0, 7.0, 7.0, 7.0}, {2, 3}, dev).to(dt);
        const Tensor w1 = Tensor::from_vector({0.5, 1.0, -1.0, 2.0, 0.0, 3.0}, {2, 3}, dev).to(dt);
        const Tensor w2 = Tensor::from_vector({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3}, dev).to(dt);
        const Tensor w3 = Tensor::from_vector({-1.0, 0.5, 0.25, -0.5, 2.0, 1.0}, {3, 2}, dev).to(dt);
        Tensor xs = x;
        GradientTape tape;
        tape.watch(xs);
        const Tensor h = xs * 1.0, a = h + c, b = ops::reshape(h, {3, 2});
        const Tensor t1 = ops::sum(a * w1), t2 = ops::sum(h * w2), t3 = ops::sum(b * w3);
        const Tensor y = order ? t1 + t2 + t3 : t3 + t2 + t1;
        const auto g = tape.gradient(y, {xs, h, a, b});
        const std::vector<double> v1 = values_of(w1), v2 = values_of(w2), v3 = values_of(w3);
        std::vector<double> dh;
        for (std::size_t i = 0; i < 6; ++i) dh.push_back(v1[i] + v2[i] + v3[i]);  // w3's [3, 2] in row-major order
        const std::string what = to_string(dt) + (order ? " t1 first" : " t3 first") + " on " + dev.str();
        check_close(g[2], v1, {0, 0}, "da " + what);
        check_close(g[3], v3, {0, 0}, "db " + what);
        check_close(g[1], dh, {0, 0}, "dh " + what);
        check_close(g[0], dh, {0, 0}, "dx " + what);
      }
  });
}

TEST_CASE("a non-persistent tape allows one gradient() call; a persistent one several") {
  Tensor x = Tensor::from_vector({1.f, 2.f, 3.f});
  {
    GradientTape tape;
    tape.watch(x);
    Tensor y = ops::sum(x * x);
    Tensor g = tape.gradient(y, {x})[0];
    CHECK(g.to_vector<float>() == std::vector<float>{2, 4, 6});
    CHECK_THROWS_AS(tape.gradient(y, {x}), Error);
    try {
      tape.gradient(y, {x});
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("persistent") != std::string::npos);
    }
  }
  {
    GradientTape tape({.persistent = true});
    tape.watch(x);
    Tensor y = ops::sum(ops::exp(x) * x);
    Tensor g1 = tape.gradient(y, {x})[0];
    Tensor g2 = tape.gradient(y, {x})[0];
    REQUIRE(g1.defined());
    REQUIRE(g2.defined());
    CHECK(g1.to_vector<float>() == g2.to_vector<float>());
    std::vector<double> expected;
    for (double v : {1.0, 2.0, 3.0}) expected.push_back(std::exp(v) * (1 + v));
    check_close(g1, expected, tolerance(float32), "d sum(x e^x)");
    // Another target on the same persistent tape.
    Tensor z = ops::sum(x * 4.0);
    CHECK(tape.gradient(z, {x})[0].to_vector<float>() == std::vector<float>{4, 4, 4});
  }
}

TEST_CASE("nested tapes: both see the ops run inside the inner one") {
  Tensor x = Tensor::from_vector({1.0, 2.0});
  Tensor y = Tensor::from_vector({3.0, -4.0});
  GradientTape outer;
  outer.watch(x);
  Tensor z;
  {
    GradientTape inner;
    inner.watch(y);
    z = ops::sum(x * y * y);
    auto gi = inner.gradient(z, {y});
    REQUIRE(gi[0].defined());
    check_close(gi[0], {2 * 1.0 * 3.0, 2 * 2.0 * -4.0}, tolerance(float64), "inner: dz/dy = 2xy");
  }
  // After the inner tape is done, the outer one still differentiates through the same ops.
  Tensor w = z * 2.0;  // recorded by the outer tape only
  CHECK(w.requires_grad());
  auto go = outer.gradient(w, {x});
  REQUIRE(go[0].defined());
  check_close(go[0], {2 * 9.0, 2 * 16.0}, tolerance(float64), "outer: dw/dx = 2y^2");
}

TEST_CASE("gradients of float16 / bfloat16 tensors come back in their dtype") {
  for_each_device([](Device dev) {
    for (DType d : {float16, bfloat16}) {
      CAPTURE(to_string(d));
      Tensor x = Tensor::from_vector({0.5f, -1.25f, 2.f, 3.5f}, {2, 2}, dev).to(d);
      GradientTape tape;
      tape.watch(x);
      Tensor y = ops::sum(ops::square(x) * 0.5 + ops::relu(x));
      CHECK(y.dtype() == d);
      Tensor g = tape.gradient(y, {x})[0];
      REQUIRE(g.defined());
      CHECK(g.dtype() == d);
      CHECK(g.shape() == Shape{2, 2});
      check_close(g, {1.5, -1.25, 3.0, 4.5}, tolerance(d), "x + relu'(x)");
    }
  });
}

TEST_CASE("mixed precision: a float32 variable read through cast(float16) gets a float32 gradient") {
  for_each_device([](Device dev) {
    for (DType compute : {float16, bfloat16}) {
      CAPTURE(to_string(compute));
      Tensor w = Tensor::from_vector({0.5f, -1.f, 2.f}, {}, dev);
      w.set_requires_grad(true);
      Tensor x = Tensor::from_vector({1.f, 2.f, 3.f, -1.f, 0.25f, 4.f}, {2, 3}, dev).to(compute);
      GradientTape tape;
      Tensor wc = ops::cast(w, compute);
      CHECK(wc.dtype() == compute);
      Tensor y = ops::sum(x * wc);
      Tensor g = tape.gradient(y, {w})[0];
      REQUIRE(g.defined());
      CHECK(g.dtype() == float32);
      check_close(g, {1.0 - 1.0, 2.0 + 0.25, 3.0 + 4.0}, tolerance(compute), "column sums of x");

      // The same through a dense layer: kernel and bias are float32 variables.
      Tensor k = Tensor::from_vector({0.5f, -0.5f, 1.f, 0.f, 0.25f, 2.f}, {3, 2}, dev);
      Tensor b = Tensor::from_vector({0.1f, -0.2f}, {}, dev);
      k.set_requires_grad(true);
      b.set_requires_grad(true);
      GradientTape tape2;
      Tensor out = ops::dense(x, ops::cast(k, compute), ops::cast(b, compute));
      CHECK(out.dtype() == compute);
      auto gs = tape2.gradient(ops::sum(out), {k, b});
      REQUIRE(gs[0].defined());
      REQUIRE(gs[1].defined());
      CHECK(gs[0].dtype() == float32);
      CHECK(gs[1].dtype() == float32);
      // d sum(x k + b)/dk[i][j] = sum over rows of x[:, i]; d/db[j] = number of rows.
      check_close(gs[0], {0.0, 0.0, 2.25, 2.25, 7.0, 7.0}, tolerance(compute), "dense dk");
      check_close(gs[1], {2.0, 2.0}, tolerance(compute), "dense db");
    }
  });
}

TEST_CASE("gradients through slice, reshape, concat and transpose land in the right places") {
  for_each_device([](Device dev) {
    const DType d = float64;
    SUBCASE("Tensor::slice rows") {
      Tensor x = Tensor::zeros({4, 3}, d, dev);
      GradientTape tape;
      tape.watch(x);
      Tensor y = ops::sum(x.slice(1, 3) * weights({2, 3}, d, dev));
      CHECK(tape.gradient(y, {x})[0].to_vector<double>() ==
            std::vector<double>{0, 0, 0, 1, 2, 3, 4, 5, 6, 0, 0, 0});
    }
    SUBCASE("ops::slice along axis 1") {
      Tensor x = Tensor::zeros({2, 4}, d, dev);
      GradientTape tape;
      tape.watch(x);
      Tensor y = ops::sum(ops::slice(x, 1, 1, 3) * weights({2, 2}, d, dev));
      CHECK(tape.gradient(y, {x})[0].to_vector<double>() == std::vector<double>{0, 1, 2, 0, 0, 3, 4, 0});
    }
    SUBCASE("reshape") {
      Tensor x = Tensor::zeros({2, 3}, d, dev);
      GradientTape tape;
      tape.watch(x);
      Tensor y = ops::sum(x.reshape({3, -1}) * weights({3, 2}, d, dev));
      Tensor g = tape.gradient(y, {x})[0];
      CHECK(g.shape() == Shape{2, 3});
      CHECK(g.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
    }
    SUBCASE("concat along axes 0 and 1") {
      Tensor a = Tensor::zeros({2, 2}, d, dev), b = Tensor::zeros({2, 3}, d, dev);
      GradientTape tape({.persistent = true});
      tape.watch(a);
      tape.watch(b);
      Tensor y = ops::sum(ops::concat({a, b}, 1) * weights({2, 5}, d, dev));
      auto g = tape.gradient(y, {a, b});
      // weights rows: [1 2 3 4 5], [6 7 8 9 10]
      CHECK(g[0].to_vector<double>() == std::vector<double>{1, 2, 6, 7});
      CHECK(g[1].to_vector<double>() == std::vector<double>{3, 4, 5, 8, 9, 10});
      Tensor c = Tensor::zeros({1, 2}, d, dev);
      tape.watch(c);
      Tensor y0 = ops::sum(ops::concat({a, c}, 0) * weights({3, 2}, d, dev));
      auto g0 = tape.gradient(y0, {a, c});
      CHECK(g0[0].to_vector<double>() == std::vector<double>{1, 2, 3, 4});
      CHECK(g0[1].to_vector<double>() == std::vector<double>{5, 6});
    }
    SUBCASE("transpose") {
      Tensor x = Tensor::zeros({2, 3}, d, dev);
      GradientTape tape;
      tape.watch(x);
      Tensor y = ops::sum(ops::transpose(x) * weights({3, 2}, d, dev));
      // w = [[1 2] [3 4] [5 6]]; dx[i][j] = w[j][i]
      CHECK(tape.gradient(y, {x})[0].to_vector<double>() == std::vector<double>{1, 3, 5, 2, 4, 6});
    }
    SUBCASE("transpose with a 3-d permutation") {
      Tensor x = Tensor::zeros({2, 3, 4}, d, dev);
      GradientTape tape;
      tape.watch(x);
      Tensor w = weights({3, 4, 2}, d, dev);
      Tensor y = ops::sum(ops::transpose(x, {1, 2, 0}) * w);  // out[a][b][c] = x[c][a][b]
      std::vector<double> wv = w.to_vector<double>(), expected(24);
      for (int c = 0; c < 2; ++c)
        for (int a = 0; a < 3; ++a)
          for (int b = 0; b < 4; ++b) expected[(c * 3 + a) * 4 + b] = wv[(a * 4 + b) * 2 + c];
      CHECK(tape.gradient(y, {x})[0].to_vector<double>() == expected);
    }
    SUBCASE("a chain of views") {
      Tensor x = Tensor::zeros({3, 4}, d, dev);
      GradientTape tape;
      tape.watch(x);
      Tensor t = ops::transpose(x.slice(1, 3)).reshape({-1});  // [4, 2] -> [8]: x[1+j][i] at 2i+j
      Tensor y = ops::sum(t * weights({8}, d, dev));
      std::vector<double> expected(12, 0.0);
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 2; ++j) expected[(1 + j) * 4 + i] = 2 * i + j + 1;
      CHECK(tape.gradient(y, {x})[0].to_vector<double>() == expected);
    }
  });
}

TEST_CASE("variables: set_requires_grad(true) without watch gives gradients") {
  for_each_device([](Device dev) {
    Tensor w = Tensor::from_vector({1.f, -1.f, 2.f, 0.5f}, {2, 2}, dev);
    w.set_requires_grad(true);
    Tensor x = Tensor::from_vector({1.f, 2.f, 3.f, 4.f}, {2, 2}, dev);
    GradientTape tape;
    Tensor y = ops::sum(ops::matmul(x, w));
    REQUIRE(y.requires_grad());
    auto g = tape.gradient(y, {w, x});
    REQUIRE(g[0].defined());
    // d sum(x w)/dw[k][j] = sum_i x[i][k]
    check_close(g[0], {4, 4, 6, 6}, tolerance(float32), "d/dw");
    CHECK_FALSE(g[1].defined());  // x is a constant
    // Switching it off makes it a constant again.
    w.set_requires_grad(false);
    CHECK_FALSE(w.requires_grad());
    GradientTape tape2;
    Tensor y2 = ops::sum(ops::matmul(x, w));
    CHECK_FALSE(y2.requires_grad());
    CHECK_FALSE(tape2.gradient(y2, {w})[0].defined());
  });
}

TEST_CASE("on_ready: each source's gradient as soon as it is final, the last layers first") {
  for_each_device([](Device dev) {
    // x -> w1 -> relu -> w2 -> sum, with w1 used twice (its gradient has two contributions).
    Tensor x = Tensor::random_uniform({4, 3}, -1, 1, 1, float32, dev);
    Tensor w1 = Tensor::random_uniform({3, 3}, -1, 1, 2, float32, dev);
    Tensor w2 = Tensor::random_uniform({3, 2}, -1, 1, 3, float32, dev);
    Tensor unused = Tensor::ones({2}, float32, dev);
    for (Tensor* t : {&w1, &w2, &unused}) t->set_requires_grad(true);
    GradientTape tape;
    Tensor h = ops::relu(ops::matmul(ops::matmul(x, w1), w1));
    Tensor y = ops::sum(ops::matmul(h, w2));
    std::vector<std::pair<std::size_t, std::vector<float>>> seen;
    const auto g = tape.gradient(y, {w1, w2, unused}, [&](std::size_t i, const Tensor& gi) {
      seen.emplace_back(i, gi.to_vector<float>());
    });
    REQUIRE(seen.size() == 2);  // no call for a source without a gradient
    CHECK(seen[0].first == 1);  // w2 is final before the backward pass reaches w1
    CHECK(seen[1].first == 0);
    // What was handed over is the final gradient (w1's two contributions summed).
    CHECK(seen[0].second == g[1].to_vector<float>());
    CHECK(seen[1].second == g[0].to_vector<float>());
    CHECK_FALSE(g[2].defined());
  });
}

TEST_CASE("dense and matmul compute only the gradients that flow somewhere: no dx for a model's input") {
  for_each_device([](Device dev) {
    const Tensor x0 = Tensor::random_uniform({8, 5}, -1, 1, 1, float32, dev);
    const Tensor w = Tensor::random_uniform({5, 4}, -1, 1, 2, float32, dev).set_requires_grad(true);
    const Tensor b = Tensor::random_uniform({4}, -1, 1, 3, float32, dev).set_requires_grad(true);
    // Allocations of the backward pass, and the gradients of (x when watched,) w and b.
    auto backward = [&](bool use_matmul, bool watch_x) {
      Tensor x = x0.copy();
      GradientTape tape;
      if (watch_x) tape.watch(x);
      Tensor y = ops::sum(use_matmul ? ops::matmul(x, w) : ops::dense(x, w, b, "relu"));
      const std::uint64_t before = memory_stats(dev).allocations;
      std::vector<Tensor> sources{w, b};
      if (watch_x) sources.push_back(x);
      auto g = tape.gradient(y, sources);
      return std::make_pair(memory_stats(dev).allocations - before, g);
    };
    for (bool use_matmul : {false, true}) {
      CAPTURE(use_matmul);
      const auto [n_without, g_without] = backward(use_matmul, false);
      const auto [n_with, g_with] = backward(use_matmul, true);
      CHECK(n_without < n_with);  // the input's gradient was not computed
      REQUIRE(g_with[2].defined());
      CHECK(g_with[2].shape() == x0.shape());
      // The weights' gradients are the same either way.
      CHECK(g_without[0].to_vector<float>() == g_with[0].to_vector<float>());
      CHECK(g_without[1].defined() == !use_matmul);
      if (!use_matmul) CHECK(g_without[1].to_vector<float>() == g_with[1].to_vector<float>());
    }
  });
}

TEST_CASE("keep_source_gradient_dtype: a float32 variable read in 16 bits keeps that gradient; two reads sum in float32") {
  for_each_device([](Device dev) {
    for (DType cd : {bfloat16, float16}) {
      CAPTURE(to_string(cd));
      Variable w(Tensor::random_uniform({3, 4}, -1, 1, 5, float32, dev), "w");
      const Tensor x = Tensor::random_uniform({2, 3}, -1, 1, 6, cd, dev);
      auto grad = [&](bool keep, int reads) {
        GradientTape tape({.keep_source_gradient_dtype = keep});
        Tensor y = ops::sum(ops::matmul(x, w.read(cd)));
        if (reads == 2) y = ops::add(y, ops::sum(ops::matmul(x, w.read(cd))));
        return tape.gradient(y, std::vector<Variable>{w})[0];
      };
      const Tensor converted = grad(false, 1);
      const Tensor kept = grad(true, 1);
      CHECK(converted.dtype() == float32);
      CHECK(kept.dtype() == cd);
      CHECK(kept.to(float32).to_vector<double>() == converted.to_vector<double>());  // the same values
      const Tensor twice = grad(true, 2);
      CHECK(twice.dtype() == float32);
      CHECK(twice.to_vector<double>() == grad(false, 2).to_vector<double>());
    }
  });
}
