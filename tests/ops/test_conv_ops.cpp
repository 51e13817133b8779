// Convolution, pooling and normalization ops: forward against naive float64 loops written here
// (Keras's padding rules spelled out independently), in every float dtype; gradients against
// finite differences in float64; invalid calls.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;  // check_close, for_each_device, random, tolerance, ...

namespace {

using Vec = std::vector<double>;

/// Keras/TensorFlow padding of one axis: output size and the padding before it.
void keras_axis(std::int64_t in, std::int64_t window, std::int64_t stride, bool same, std::int64_t& out,
                std::int64_t& before) {
  if (same) {
    out = (in + stride - 1) / stride;
    const std::int64_t total = std::max<std::int64_t>((out - 1) * stride + window - in, 0);
    before = total / 2;  // the odd extra goes after (bottom / right)
  } else {
    out = (in - window) / stride + 1;
    before = 0;
  }
}

struct ConvRef {
  Vec y;
  Shape shape;
  double scale = 0;  // largest sum of |terms| of one output
};

/// groups: the kernel is [kh, kw, C / groups, F], output f seeing input channels of block f / (F / groups).
ConvRef conv_ref(const Tensor& xt, const Tensor& wt, const Tensor& bt, IntPair s, bool same, IntPair d,
                 std::int64_t groups = 1) {
  const Vec x = xt.to_vector<double>(), w = wt.to_vector<double>();
  const Vec b = bt.defined() ? bt.to_vector<double>() : Vec();
  const Shape& xs = xt.shape();
  const Shape& ws = wt.shape();
  const std::int64_t N = xs[0], H = xs[1], W = xs[2], C = xs[3], KH = ws[0], KW = ws[1], F = ws[3];
  const std::int64_t CG = C / groups, FG = F / groups;
  std::int64_t OH, OW, pt, pl;
  keras_axis(H, (KH - 1) * d[0] + 1, s[0], same, OH, pt);
  keras_axis(W, (KW - 1) * d[1] + 1, s[1], same, OW, pl);
  ConvRef r;
  r.shape = {N, OH, OW, F};
  r.y.assign(N * OH * OW * F, 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t oy = 0; oy < OH; ++oy)
      for (std::int64_t ox = 0; ox < OW; ++ox)
        for (std::int64_t f = 0; f < F; ++f) {
          double acc = b.empty() ? 0.0 : b[f], mag = std::abs(acc);
          for (std::int64_t i = 0; i < KH; ++i)
            for (std::int64_t j = 0; j < KW; ++j) {
              const std::int64_t iy = oy * s[0] + i * d[0] - pt, ix = ox * s[1] + j * d[1] - pl;
              if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;  // zero padding
              for (std::int64_t c = 0; c < CG; ++c) {
                const double t = x[((n * H + iy) * W + ix) * C + f / FG * CG + c] * w[((i * KW + j) * CG + c) * F + f];
                acc += t, mag += std::abs(t);
              }
            }
          r.y[((n * OH + oy) * OW + ox) * F + f] = acc;
          r.scale = std::max(r.scale, mag);
        }
  return r;
}

Vec pool_ref(const Tensor& xt, IntPair k, IntPair s, bool same, bool max, Shape& shape) {
  const Vec x = xt.to_vector<double>();
  const Shape& xs = xt.shape();
  const std::int64_t N = xs[0], H = xs[1], W = xs[2], C = xs[3];
  std::int64_t OH, OW, pt, pl;
  keras_axis(H, k[0], s[0], same, OH, pt);
  keras_axis(W, k[1], s[1], same, OW, pl);
  shape = {N, OH, OW, C};
  Vec y(N * OH * OW * C);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t oy = 0; oy < OH; ++oy)
      for (std::int64_t ox = 0; ox < OW; ++ox)
        for (std::int64_t c = 0; c < C; ++c) {
          double acc = max ? -std::numeric_limits<double>::infinity() : 0.0;
          int count = 0;  // padded positions are not counted (Keras 'same' average)
          for (std::int64_t i = 0; i < k[0]; ++i)
            for (std::int64_t j = 0; j < k[1]; ++j) {
              const std::int64_t iy = oy * s[0] + i - pt, ix = ox * s[1] + j - pl;
              if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
              const double v = x[((n * H + iy) * W + ix) * C + c];
              acc = max ? std::max(acc, v) : acc + v;
              ++count;
            }
          y[((n * OH + oy) * OW + ox) * C + c] = max ? acc : acc / count;
        }
  return y;
}

/// Runs f once; for bfloat16 once per CPU convolution path: the automatic per-pass choice
/// (AMX where oneDNN has it, the transposed backward-data), all native, all float32.
void for_bf16_paths(DType dt, const std::function<void(const char*)>& f) {
  if (dt != bfloat16) return f("default");
  for (const char* path : {"auto", "native", "float32"}) {
    if (std::string(path) == "auto") unsetenv("MPT_CPU_BF16_CONV");
    else setenv("MPT_CPU_BF16_CONV", path, 1);
    f(path);
  }
  unsetenv("MPT_CPU_BF16_CONV");
}

Tensor weigh(const Tensor& y) {
  return ops::mul(y, Tensor::random_uniform(y.shape(), 0.5, 1.5, 99, y.dtype(), y.device()));
}

void check_message(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  const std::string msg = mpt::test::error_of(f);
  for (const auto& p : parts) CHECK_MESSAGE(msg.find(p) != std::string::npos, "message \"", msg, "\" lacks \"", p, "\"");
}

}  // namespace

#define CHECK_MPT_ERROR(expr, ...)                          \
  do {                                                      \
    CHECK_THROWS_AS((void)(expr), mpt::Error);              \
    check_message([&] { (void)(expr); }, {__VA_ARGS__});    \
  } while (0)

TEST_CASE("conv2d matches the float64 reference: strides, padding, dilation, odd sizes, every dtype") {
  struct Case {
    Shape x;
    IntPair k;
    std::int64_t filters;
    IntPair strides;
    const char* padding;
    IntPair dilation;
  };
  const std::vector<Case> cases = {
      {{2, 7, 9, 3}, {3, 3}, 5, {1, 1}, "valid", {1, 1}},  {{2, 7, 9, 3}, {3, 3}, 5, {1, 1}, "same", {1, 1}},
      {{2, 8, 7, 4}, {3, 2}, 6, {2, 2}, "same", {1, 1}},   {{2, 9, 8, 4}, {3, 3}, 6, {2, 1}, "valid", {1, 1}},
      {{1, 9, 10, 3}, {3, 3}, 4, {1, 1}, "valid", {2, 2}}, {{1, 9, 10, 3}, {3, 3}, 4, {1, 1}, "same", {2, 1}},
      {{3, 6, 6, 1}, {5, 5}, 8, {1, 1}, "same", {1, 1}},   {{2, 5, 5, 16}, {1, 1}, 32, {2, 2}, "same", {1, 1}},
      {{2, 11, 11, 32}, {3, 3}, 64, {1, 1}, "valid", {1, 1}},
  };
  for_each_device([&](Device dev) {
    for (DType dt : test::float_dtypes())
      for_bf16_paths(dt, [&](const char* path) {
        for (const auto& c : cases) {
          const std::string what = "conv2d " + to_string(c.x) + " k" + std::to_string(c.k[0]) + "x" +
                                   std::to_string(c.k[1]) + " s" + std::to_string(c.strides[0]) + std::to_string(c.strides[1]) +
                                   " " + c.padding + " d" + std::to_string(c.dilation[0]) + std::to_string(c.dilation[1]) +
                                   " " + to_string(dt) + " (" + path + ")";
          Tensor x = random(c.x, dt, dev, 1, -1, 1);
          Tensor w = random({c.k[0], c.k[1], c.x[3], c.filters}, dt, dev, 2, -0.5, 0.5);
          Tensor b = random({c.filters}, dt, dev, 3);
          Tensor y = ops::conv2d(x, w, b, {.strides = c.strides, .padding = c.padding, .dilation = c.dilation});
          ConvRef r = conv_ref(x, w, b, c.strides, std::string(c.padding) == "same", c.dilation);
          REQUIRE_MESSAGE(y.shape() == r.shape, what, ": shape ", to_string(y.shape()), " vs ", to_string(r.shape));
          CHECK(y.dtype() == dt);
          // float32 accumulation of the products, one rounding to the storage dtype.
          check_close(y, r.y, {tolerance(dt).rtol, tolerance(dt).rtol * r.scale}, what);
        }
      });
  });
}

TEST_CASE("conv2d fuses bias and activation, and works without a bias") {
  // Every activation fused into conv2d: test_op_table.cpp. Here: with and without a bias.
  for_each_device([&](Device dev) {
    for (DType dt : float_dtypes())
      for (bool bias : {true, false}) {
        Tensor x = random({2, 6, 5, 3}, dt, dev, 4, -1, 1), w = random({3, 3, 3, 7}, dt, dev, 5, -0.5, 0.5);
        Tensor b = bias ? random({7}, dt, dev, 6) : Tensor();
        Tensor y = ops::conv2d(x, w, b, {.padding = "same", .activation = "relu"});
        ConvRef r = conv_ref(x, w, b, {1, 1}, true, {1, 1});
        for (auto& v : r.y) v = v > 0 ? v : 0;
        check_close(y, r.y, {tolerance(dt).rtol, tolerance(dt).rtol * (r.scale + 2)},
                    "conv2d relu " + to_string(dt) + (bias ? " bias" : ""));
      }
  });
}

TEST_CASE("max and average pooling match the reference; 'same' averages leave padding out") {
  struct Case {
    Shape x;
    IntPair k, s;
    const char* padding;
  };
  const std::vector<Case> cases = {{{2, 6, 6, 3}, {2, 2}, {2, 2}, "valid"}, {{2, 7, 5, 3}, {2, 2}, {2, 2}, "valid"},
                                   {{2, 7, 5, 3}, {2, 2}, {2, 2}, "same"},  {{1, 9, 8, 4}, {3, 3}, {2, 2}, "same"},
                                   {{1, 9, 8, 4}, {3, 2}, {1, 1}, "valid"}, {{2, 5, 5, 17}, {3, 3}, {1, 1}, "same"}};
  for_each_device([&](Device dev) {
    for (DType dt : test::float_dtypes())
      for (const auto& c : cases)
        for (bool max : {true, false}) {
          const std::string what = std::string(max ? "max_pool2d " : "avg_pool2d ") + to_string(c.x) + " " + c.padding +
                                   " " + to_string(dt);
          Tensor x = random(c.x, dt, dev, 7);
          ops::Pool2dOptions o{.strides = c.s, .padding = c.padding};
          Tensor y = max ? ops::max_pool2d(x, c.k, o) : ops::avg_pool2d(x, c.k, o);
          Shape shape;
          Vec ref = pool_ref(x, c.k, c.s, std::string(c.padding) == "same", max, shape);
          REQUIRE_MESSAGE(y.shape() == shape, what, ": shape ", to_string(y.shape()));
          CHECK(y.dtype() == dt);
          check_close(y, ref, max ? test::Tolerance{0, 0} : tolerance(dt), what);
        }
    // Strides default to the pool size.
    Tensor x = random({1, 8, 8, 2}, float32, dev, 8);
    CHECK(ops::max_pool2d(x, {4, 4}).shape() == Shape{1, 2, 2, 2});
  });
}

TEST_CASE("global average pooling and zero padding") {
  for_each_device([](Device dev) {
    for (DType dt : test::float_dtypes()) {
      Tensor x = random({2, 3, 4, 5}, dt, dev, 9);
      Vec xv = x.to_vector<double>(), ref(2 * 5, 0.0);
      for (std::int64_t n = 0; n < 2; ++n)
        for (std::int64_t p = 0; p < 12; ++p)
          for (std::int64_t c = 0; c < 5; ++c) ref[n * 5 + c] += xv[(n * 12 + p) * 5 + c] / 12;
      Tensor g = ops::global_avg_pool2d(x);
      CHECK(g.shape() == Shape{2, 5});
      check_close(g, ref, tolerance(dt), "global_avg_pool2d " + to_string(dt));
      CHECK(ops::global_avg_pool2d(x, true).shape() == Shape{2, 1, 1, 5});

      Tensor p = ops::zero_pad2d(x, 1, 2, 0, 3);
      REQUIRE(p.shape() == Shape{2, 6, 7, 5});
      Vec pv = p.to_vector<double>();
      bool ok = true;
      for (std::int64_t n = 0; n < 2; ++n)
        for (std::int64_t i = 0; i < 6; ++i)
          for (std::int64_t j = 0; j < 7; ++j)
            for (std::int64_t c = 0; c < 5; ++c) {
              const bool inside = i >= 1 && i < 4 && j < 4;
              const double e = inside ? xv[((n * 3 + i - 1) * 4 + j) * 5 + c] : 0.0;
              ok = ok && pv[((n * 6 + i) * 7 + j) * 5 + c] == e;
            }
      CHECK_MESSAGE(ok, "zero_pad2d ", to_string(dt));
    }
  });
}

TEST_CASE("batch_norm and layer_norm compute float32 statistics and match the reference") {
  for_each_device([](Device dev) {
    for (DType dt : test::float_dtypes()) {
      const std::int64_t rows = 2 * 5 * 3, ch = 6;
      Tensor x = random({2, 5, 3, ch}, dt, dev, 10, -1, 3);
      Tensor gamma = random({ch}, float32, dev, 11, 0.5, 1.5), beta = random({ch}, float32, dev, 12);
      Vec xv = x.to_vector<double>(), gv = gamma.to_vector<double>(), bv = beta.to_vector<double>();
      Vec m(ch, 0), v(ch, 0);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < ch; ++c) m[c] += xv[r * ch + c] / rows;
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < ch; ++c) v[c] += (xv[r * ch + c] - m[c]) * (xv[r * ch + c] - m[c]) / rows;
      const double eps = 1e-3;
      for (bool relu : {false, true}) {
        auto r = ops::batch_norm(x, gamma, beta, {}, {}, {.training = true, .epsilon = eps, .activation = relu ? "relu" : "linear"});
        CHECK(r.y.dtype() == dt);
        CHECK(r.mean.dtype() == (dt == float64 ? float64 : float32));
        Vec ref(rows * ch);
        for (std::int64_t i = 0; i < rows * ch; ++i) {
          const std::int64_t c = i % ch;
          ref[i] = (xv[i] - m[c]) / std::sqrt(v[c] + eps) * gv[c] + bv[c];
          if (relu) ref[i] = std::max(ref[i], 0.0);
        }
        const auto stat_tol = dt == float64 ? tolerance(float64) : tolerance(float32);
        check_close(r.mean, m, stat_tol, "batch_norm mean " + to_string(dt));
        check_close(r.variance, v, stat_tol, "batch_norm variance " + to_string(dt));
        check_close(r.y, ref, tolerance(dt), "batch_norm training " + to_string(dt) + (relu ? " relu" : ""));
      }
      // Inference with given statistics; 16-bit parameters are accepted too.
      Tensor mm = random({ch}, float32, dev, 13), mv = random({ch}, float32, dev, 14, 0.5, 2);
      auto r = ops::batch_norm(x, gamma.to(dt), beta, mm, mv, {.epsilon = eps});
      Vec mmv = mm.to_vector<double>(), mvv = mv.to_vector<double>(), g16 = gamma.to(dt).to_vector<double>(), ref(rows * ch);
      for (std::int64_t i = 0; i < rows * ch; ++i) {
        const std::int64_t c = i % ch;
        ref[i] = (xv[i] - mmv[c]) / std::sqrt(mvv[c] + eps) * g16[c] + bv[c];
      }
      check_close(r.y, ref, tolerance(dt), "batch_norm inference " + to_string(dt));

      Tensor ln = ops::layer_norm(x, gamma, beta, eps);
      CHECK(ln.dtype() == dt);
      Vec lref(rows * ch);
      for (std::int64_t row = 0; row < rows; ++row) {
        double mu = 0, var = 0;
        for (std::int64_t c = 0; c < ch; ++c) mu += xv[row * ch + c] / ch;
        for (std::int64_t c = 0; c < ch; ++c) var += (xv[row * ch + c] - mu) * (xv[row * ch + c] - mu) / ch;
        for (std::int64_t c = 0; c < ch; ++c)
          lref[row * ch + c] = (xv[row * ch + c] - mu) / std::sqrt(var + eps) * gv[c] + bv[c];
      }
      check_close(ln, lref, tolerance(dt), "layer_norm " + to_string(dt));
    }
    // bfloat16 storage is read and rounded in registers: exactly the float32 result rounded once.
    {
      Tensor xb = random({64, 8}, bfloat16, dev, 70, -3, 3);
      Tensor g8 = random({8}, float32, dev, 71, 0.5, 1.5), b8 = random({8}, float32, dev, 72);
      Tensor m8 = random({8}, float32, dev, 73), v8 = random({8}, float32, dev, 74, 0.5, 2);
      for (const char* act : {"linear", "relu"}) {
        auto y16 = ops::batch_norm(xb, g8, b8, m8, v8, {.activation = act}).y;
        auto y32 = ops::batch_norm(xb.to(float32), g8, b8, m8, v8, {.activation = act}).y;
        CHECK(y16.to_vector<float>() == y32.to(bfloat16).to_vector<float>());
      }
      auto nan = ops::batch_norm(Tensor::full({2, 8}, NAN, bfloat16, dev), g8, b8, m8, v8).y.to_vector<float>();
      CHECK(std::isnan(nan[0]));
    }
    // Statistics of a large 16-bit batch far from zero stay accurate (float32 blocks, float64 totals).
    Tensor big = ops::add(random({64, 32, 32, 8}, bfloat16, dev, 15, -1, 1), Tensor::scalar(100, bfloat16, dev));
    auto r = ops::batch_norm(big, {}, {}, {}, {}, {.training = true});
    Vec bv = big.to_vector<double>(), m(8, 0), v(8, 0);
    const std::int64_t n = big.numel() / 8;
    for (std::int64_t i = 0; i < big.numel(); ++i) m[i % 8] += bv[i] / n;
    for (std::int64_t i = 0; i < big.numel(); ++i) v[i % 8] += (bv[i] - m[i % 8]) * (bv[i] - m[i % 8]) / n;
    check_close(r.mean, m, {1e-6, 0}, "batch_norm mean of a large batch");
    check_close(r.variance, v, {1e-4, 0}, "batch_norm variance of a large batch");
  });
}

TEST_CASE("gradients of conv2d w.r.t. input, kernel and bias") {
  struct Case {
    Shape x;
    IntPair k;
    std::int64_t filters;
    IntPair strides;
    const char* padding;
    IntPair dilation;
    const char* activation;
  };
  const std::vector<Case> cases = {{{2, 5, 6, 3}, {3, 3}, 4, {1, 1}, "valid", {1, 1}, "linear"},
                                   {{2, 5, 6, 3}, {3, 2}, 4, {2, 2}, "same", {1, 1}, "tanh"},
                                   {{1, 7, 6, 2}, {3, 3}, 3, {1, 1}, "same", {2, 2}, "sigmoid"},
                                   {{1, 6, 7, 2}, {2, 3}, 3, {2, 1}, "valid", {1, 2}, "gelu"}};
  for_each_device([&](Device dev) {
    for (const auto& c : cases) {
      ops::Conv2dOptions o{.strides = c.strides, .padding = c.padding, .dilation = c.dilation, .activation = c.activation};
      check_gradients(std::string("conv2d ") + c.padding + " " + c.activation,
                      [&](const std::vector<Tensor>& in) { return weigh(ops::conv2d(in[0], in[1], in[2], o)); },
                      {random(c.x, float64, dev, 20), random({c.k[0], c.k[1], c.x[3], c.filters}, float64, dev, 21, -0.5, 0.5),
                       random({c.filters}, float64, dev, 22)});
    }
    check_gradients("conv2d without bias",
                    [&](const std::vector<Tensor>& in) { return weigh(ops::conv2d(in[0], in[1], {}, {.padding = "same"})); },
                    {random({1, 4, 4, 2}, float64, dev, 23), random({3, 3, 2, 3}, float64, dev, 24)});
    // relu: keep pre-activations away from the kink by a large bias
    check_gradients("conv2d relu",
                    [&](const std::vector<Tensor>& in) {
                      return weigh(ops::conv2d(in[0], in[1], in[2], {.activation = "relu"}));
                    },
                    {random({1, 4, 5, 2}, float64, dev, 25, 0.1, 1), random({2, 2, 2, 3}, float64, dev, 26, 0.1, 1),
                     random({3}, float64, dev, 27, 0.5, 1)});
  });
}

namespace {
/// Grouped convolutions: (input, kernel, filters, groups, strides, padding, dilation).
struct GroupedCase {
  Shape x;
  IntPair k;
  std::int64_t filters, groups;
  IntPair strides;
  const char* padding;
  IntPair dilation;
};
const std::vector<GroupedCase>& grouped_cases() {
  static const std::vector<GroupedCase> cases = {
      {{2, 7, 6, 4}, {3, 3}, 6, 2, {1, 1}, "valid", {1, 1}},     // 2 groups of 2 -> 3
      {{2, 8, 7, 6}, {3, 2}, 9, 3, {2, 2}, "same", {1, 1}},      // strided, asymmetric 'same'
      {{1, 9, 9, 4}, {3, 3}, 4, 4, {1, 1}, "same", {2, 2}},      // depthwise, dilated
      {{2, 6, 7, 5}, {3, 3}, 10, 5, {1, 2}, "valid", {1, 1}},    // depthwise, multiplier 2
      {{2, 6, 6, 3}, {1, 1}, 3, 3, {1, 1}, "valid", {1, 1}},     // depthwise 1x1, 3 channels
      {{2, 9, 8, 32}, {3, 3}, 64, 32, {2, 2}, "same", {1, 1}},   // MobileNet-like depthwise
      {{2, 7, 7, 32}, {3, 3}, 32, 4, {1, 1}, "same", {1, 1}},    // 4 groups of 8 (AMX-sized channels)
  };
  return cases;
}
std::string describe_case(const GroupedCase& c) {
  std::string s = "grouped conv2d ";
  s.append(to_string(c.x)).append(" k").append(std::to_string(c.k[0])).append("x").append(std::to_string(c.k[1]));
  s.append(" f").append(std::to_string(c.filters)).append(" groups ").append(std::to_string(c.groups));
  s.append(" s").append(std::to_string(c.strides[0])).append(std::to_string(c.strides[1])).append(" ").append(c.padding);
  s.append(" d").append(std::to_string(c.dilation[0])).append(std::to_string(c.dilation[1]));
  return s;
}
}  // namespace

TEST_CASE("grouped and depthwise conv2d match the float64 reference in every dtype") {
  for_each_device([&](Device dev) {
    for (DType dt : test::float_dtypes())
      for_bf16_paths(dt, [&](const char* path) {
        for (const auto& c : grouped_cases()) {
          const std::string what = describe_case(c) + " " + to_string(dt) + " (" + path + ")";
          Tensor x = random(c.x, dt, dev, 1, -1, 1);
          Tensor w = random({c.k[0], c.k[1], c.x[3] / c.groups, c.filters}, dt, dev, 2, -0.5, 0.5);
          Tensor b = random({c.filters}, dt, dev, 3);
          Tensor y = ops::conv2d(x, w, b,
                                 {.strides = c.strides, .padding = c.padding, .dilation = c.dilation, .groups = c.groups});
          ConvRef r = conv_ref(x, w, b, c.strides, std::string(c.padding) == "same", c.dilation, c.groups);
          REQUIRE_MESSAGE(y.shape() == r.shape, what, ": shape ", to_string(y.shape()), " vs ", to_string(r.shape));
          CHECK(y.dtype() == dt);
          check_close(y, r.y, {tolerance(dt).rtol, tolerance(dt).rtol * r.scale}, what);
          // The same convolution as `groups` separate ones, concatenated: the kernel's and the
          // output's channel blocks line up (exact in float64).
          if (dt == float64) {
            std::vector<Tensor> parts;
            const std::int64_t cg = c.x[3] / c.groups, fg = c.filters / c.groups;
            for (std::int64_t g = 0; g < c.groups; ++g) {
              Tensor xg = ops::slice(x, 3, g * cg, (g + 1) * cg), wg = ops::slice(w, 3, g * fg, (g + 1) * fg);
              parts.push_back(ops::conv2d(xg, wg, ops::slice(b, 0, g * fg, (g + 1) * fg),
                                          {.strides = c.strides, .padding = c.padding, .dilation = c.dilation}));
            }
            check_close(y, ops::concat(parts, 3).to_vector<double>(), {1e-12, 1e-12}, what + " as separate groups");
          }
        }
      });
  });
}

TEST_CASE("gradients of grouped and depthwise conv2d against finite differences") {
  for_each_device([&](Device dev) {
    const char* acts[] = {"linear", "tanh", "sigmoid", "gelu"};
    int i = 0;
    for (const auto& c : grouped_cases()) {
      if (c.x[3] > 8) continue;  // finite differences of every entry: the small cases
      ops::Conv2dOptions o{.strides = c.strides, .padding = c.padding, .dilation = c.dilation,
                           .activation = acts[i++ % 4], .groups = c.groups};
      check_gradients(describe_case(c) + " " + o.activation,
                      [&](const std::vector<Tensor>& in) { return weigh(ops::conv2d(in[0], in[1], in[2], o)); },
                      {random(c.x, float64, dev, 20),
                       random({c.k[0], c.k[1], c.x[3] / c.groups, c.filters}, float64, dev, 21, -0.5, 0.5),
                       random({c.filters}, float64, dev, 22)},
                      1e-5);  // sums of a few hundred outputs: a step of 1e-6 leaves 1e-8 of float64 roundoff
    }
    check_gradients("depthwise conv2d without bias",
                    [&](const std::vector<Tensor>& in) {
                      return weigh(ops::conv2d(in[0], in[1], {}, {.padding = "same", .groups = 3}));
                    },
                    {random({1, 4, 5, 3}, float64, dev, 23), random({3, 3, 1, 6}, float64, dev, 24)});
  });
}

TEST_CASE("grouped and depthwise conv2d gradients in 16-bit and float32 match float64") {
  // Every CPU path of a grouped backward (oneDNN native, float32 staging; bfloat16's forced
  // paths) against the float64 reference loops, relative to the gradients' magnitude.
  for_each_device([&](Device dev) {
    for (DType dt : {float32, float16, bfloat16})
      for_bf16_paths(dt, [&](const char* path) {
        for (const auto& c : grouped_cases()) {
          const std::string what = describe_case(c) + " " + to_string(dt) + " (" + path + ")";
          ops::Conv2dOptions o{.strides = c.strides, .padding = c.padding, .dilation = c.dilation, .groups = c.groups};
          Tensor x = random(c.x, dt, dev, 30, -1, 1);
          Tensor w = random({c.k[0], c.k[1], c.x[3] / c.groups, c.filters}, dt, dev, 31, -0.5, 0.5);
          Tensor b = random({c.filters}, dt, dev, 32);
          auto run = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi) {
            GradientTape tape;
            Tensor xs = xi, ws = wi, bs = bi;
            tape.watch(xs), tape.watch(ws), tape.watch(bs);
            Tensor y = ops::conv2d(xs, ws, bs, o);
            return tape.gradient(ops::sum(ops::cast(weigh(y), float32)), {xs, ws, bs});
          };
          auto g = run(x, w, b), g64 = run(x.to(float64), w.to(float64), b.to(float64));
          const char* names[] = {"dx", "dkernel", "dbias"};
          for (int i = 0; i < 3; ++i) {
            CHECK(g[i].dtype() == dt);
            Vec ref = g64[i].to_vector<double>();
            double scale = 0;
            for (double v : ref) scale = std::max(scale, std::abs(v));
            check_close(g[i], ref, {tolerance(dt).rtol, 2 * tolerance(dt).rtol * scale}, what + " " + names[i]);
          }
        }
      });
  });
}

TEST_CASE("gradients of pooling, padding, batch_norm and layer_norm") {
  for_each_device([](Device dev) {
    for (const char* padding : {"valid", "same"}) {
      const std::string p = padding;
      check_gradients("max_pool2d " + p,
                      [&](const std::vector<Tensor>& in) { return weigh(ops::max_pool2d(in[0], {2, 2}, {.padding = padding})); },
                      {random({2, 5, 5, 3}, float64, dev, 30)});
      check_gradients("max_pool2d 3x3/2 " + p,
                      [&](const std::vector<Tensor>& in) {
                        return weigh(ops::max_pool2d(in[0], {3, 3}, {.strides = IntPair{2, 2}, .padding = padding}));
                      },
                      {random({1, 6, 7, 2}, float64, dev, 31)});
      check_gradients("avg_pool2d " + p,
                      [&](const std::vector<Tensor>& in) {
                        return weigh(ops::avg_pool2d(in[0], {3, 2}, {.strides = IntPair{2, 1}, .padding = padding}));
                      },
                      {random({2, 5, 4, 3}, float64, dev, 32)});
    }
    check_gradients("global_avg_pool2d", [](const std::vector<Tensor>& in) { return weigh(ops::global_avg_pool2d(in[0])); },
                    {random({2, 3, 4, 3}, float64, dev, 33)});
    check_gradients("zero_pad2d", [](const std::vector<Tensor>& in) { return weigh(ops::zero_pad2d(in[0], 1, 0, 2, 1)); },
                    {random({2, 3, 2, 2}, float64, dev, 34)});
    for (const char* act : {"linear", "relu"})
      check_gradients(std::string("batch_norm training ") + act,
                      [&](const std::vector<Tensor>& in) {
                        return weigh(ops::batch_norm(in[0], in[1], in[2], {}, {}, {.training = true, .activation = act}).y);
                      },
                      {random({3, 2, 3, 4}, float64, dev, 35), random({4}, float64, dev, 36, 0.5, 1.5),
                       random({4}, float64, dev, 37)});
    Tensor mm = random({4}, float64, dev, 38), mv = random({4}, float64, dev, 39, 0.5, 2);
    check_gradients("batch_norm inference",
                    [&](const std::vector<Tensor>& in) { return weigh(ops::batch_norm(in[0], in[1], in[2], mm, mv).y); },
                    {random({3, 5, 4}, float64, dev, 40), random({4}, float64, dev, 41, 0.5, 1.5), random({4}, float64, dev, 42)});
    check_gradients("batch_norm without gamma/beta",
                    [&](const std::vector<Tensor>& in) {
                      return weigh(ops::batch_norm(in[0], {}, {}, {}, {}, {.training = true}).y);
                    },
                    {random({6, 3}, float64, dev, 43)});
    check_gradients("layer_norm",
                    [](const std::vector<Tensor>& in) { return weigh(ops::layer_norm(in[0], in[1], in[2])); },
                    {random({3, 2, 7}, float64, dev, 44), random({7}, float64, dev, 45, 0.5, 1.5), random({7}, float64, dev, 46)});
    check_gradients("layer_norm without gamma/beta", [](const std::vector<Tensor>& in) { return weigh(ops::layer_norm(in[0])); },
                    {random({4, 5}, float64, dev, 47)});
  });
}

TEST_CASE("16-bit conv, pooling and batch_norm gradients agree with float32") {
  for_each_device([](Device dev) {
    for (DType dt : {float16, bfloat16}) for_bf16_paths(dt, [&](const char* path) {
      Tensor x = random({2, 6, 6, 4}, dt, dev, 50, -1, 1), w = random({3, 3, 4, 8}, dt, dev, 51, -0.5, 0.5);
      Tensor b = random({8}, dt, dev, 52), gamma = random({8}, float32, dev, 53, 0.5, 1.5);
      auto run = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi) {
        GradientTape tape;
        Tensor xs = xi, ws = wi, bs = bi, gs = gamma;
        tape.watch(xs), tape.watch(ws), tape.watch(bs), tape.watch(gs);
        Tensor h = ops::conv2d(xs, ws, bs, {.padding = "same", .activation = "relu"});
        h = ops::batch_norm(h, gs, {}, {}, {}, {.training = true}).y;
        h = ops::max_pool2d(h, {2, 2});
        Tensor loss = ops::sum(ops::cast(weigh(h), float32));
        return tape.gradient(loss, {xs, ws, bs, gs});
      };
      auto g16 = run(x, w, b);
      auto g32 = run(x.to(float32), w.to(float32), b.to(float32));
      const char* names[] = {"dx", "dkernel", "dbias", "dgamma"};
      for (int i = 0; i < 4; ++i) {
        CHECK(g16[i].dtype() == (i == 3 ? float32 : dt));
        Vec ref = g32[i].to_vector<double>();
        double scale = 0;
        for (double v : ref) scale = std::max(scale, std::abs(v));
        // a few 16-bit roundings along the chain, relative to the gradient's magnitude
        check_close(g16[i], ref, {0, 8 * tolerance(dt).rtol * scale},
                    std::string(names[i]) + " " + to_string(dt) + " (" + path + ")");
      }
    });
  });
}

namespace {

// Bit patterns of a 16-bit float type that stress comparisons: NaNs of either sign with any
// payload, infinities, signed zeros, subnormals, the largest numbers and runs of equal values.
std::vector<std::uint16_t> special_bits(DType dt, std::size_t n, unsigned seed) {
  const std::uint16_t inf = dt == bfloat16 ? 0x7f80 : 0x7c00, one = dt == bfloat16 ? 0x3f80 : 0x3c00;
  std::mt19937 rng(seed);
  std::vector<std::uint16_t> bits(n);
  for (auto& b : bits) {
    const std::uint16_t sign = (rng() & 1) ? 0x8000 : 0, r = static_cast<std::uint16_t>(rng());
    const std::uint16_t kinds[] = {static_cast<std::uint16_t>(inf + 1 + r % (0x7fff - inf)), inf, 0,
                                   static_cast<std::uint16_t>(1 + r % (inf == 0x7f80 ? 0x7f : 0x3ff)),
                                   static_cast<std::uint16_t>(inf - 1), static_cast<std::uint16_t>(one + r % 3)};
    const unsigned k = rng() % 9;
    b = k < 6 ? static_cast<std::uint16_t>(sign | kinds[k]) : r;
  }
  return bits;
}

std::vector<std::uint16_t> bits_of(const Tensor& t) {
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(t.numel()));
  t.copy_to_host(bits.data(), t.dtype());
  return bits;
}

}  // namespace

TEST_CASE("16-bit max pooling and relu gradients: NaN, inf, signed zeros and ties as float32, bit for bit") {
  // The CPU kernels compare float16/bfloat16 as bit patterns; float32 compute on the widened
  // values is the definition: NaN wins (the last one in the window), the first of equal maxima
  // wins (-0 and +0 are equal), and gradients land on the same positions.
  const Device dev = Device::cpu();
  for (DType dt : {bfloat16, float16}) {
    auto from_bits = [&](const Shape& shape, unsigned seed) {
      std::size_t n = 1;
      for (auto d : shape) n *= static_cast<std::size_t>(d);
      const auto bits = special_bits(dt, n, seed);
      return Tensor::from_host(bits.data(), bits.size(), dt, shape, dev);
    };
    struct Case {
      Shape x;
      IntPair k, s;
      const char* padding;
    };
    for (const Case& c : {Case{{2, 8, 6, 37}, {2, 2}, {2, 2}, "valid"}, Case{{2, 7, 5, 3}, {2, 2}, {2, 2}, "same"},
                          Case{{1, 9, 8, 33}, {3, 3}, {2, 2}, "same"}}) {
      const std::string what = "max_pool2d " + to_string(c.x) + " " + c.padding + " " + to_string(dt);
      Tensor x = from_bits(c.x, 60);
      auto run = [&](const Tensor& xi) {
        GradientTape tape;
        Tensor xs = xi;
        tape.watch(xs);
        Tensor y = ops::max_pool2d(xs, c.k, {.strides = c.s, .padding = c.padding});
        Tensor dx = tape.gradient(ops::mul(y, from_bits(y.shape(), 61).to(xi.dtype())), {xs})[0];
        return std::pair{y.to(dt), dx.to(dt)};
      };
      auto [y16, dx16] = run(x);
      auto [y32, dx32] = run(x.to(float32));
      CHECK_MESSAGE(bits_of(y16) == bits_of(y32), what);
      CHECK_MESSAGE(bits_of(dx16) == bits_of(dx32), what, " gradient");
    }
    auto relu_grad = [&](const Tensor& xi, const Tensor& wi) {
      GradientTape tape;
      Tensor xs = xi;
      tape.watch(xs);
      return tape.gradient(ops::mul(ops::relu(xs), wi), {xs})[0].to(dt);
    };
    Tensor x = from_bits({4099}, 62), w = from_bits({4099}, 63);
    CHECK_MESSAGE(bits_of(relu_grad(x, w)) == bits_of(relu_grad(x.to(float32), w.to(float32))),
                  "relu gradient ", to_string(dt));
  }
}

TEST_CASE("16-bit convolutions over several batch chunks match float32 compute") {
  // Large enough that the CPU stages the batch through float32 in more than one chunk.
  for_each_device([](Device dev) {
    for (DType dt : {float16, bfloat16}) {
      if (dt == bfloat16) setenv("MPT_CPU_BF16_CONV", "float32", 1);
      Tensor x = random({24, 32, 32, 32}, dt, dev, 60, -1, 1), w = random({3, 3, 32, 16}, dt, dev, 61, -0.3, 0.3);
      Tensor b = random({16}, dt, dev, 62), dyw = random({24, 32, 32, 16}, dt, dev, 63, -1, 1);
      auto run = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi) {
        GradientTape tape;
        Tensor xs = xi, ws = wi, bs = bi;
        tape.watch(xs), tape.watch(ws), tape.watch(bs);
        Tensor y = ops::conv2d(xs, ws, bs, {.padding = "same", .activation = "tanh"});
        Tensor loss = ops::sum(ops::cast(ops::mul(y, dyw.to(y.dtype())), float32));
        auto g = tape.gradient(loss, {xs, ws, bs});
        g.insert(g.begin(), y);
        return g;
      };
      auto r16 = run(x, w, b), r32 = run(x.to(float32), w.to(float32), b.to(float32));
      const char* names[] = {"y", "dx", "dkernel", "dbias"};
      for (int i = 0; i < 4; ++i) {
        CHECK(r16[i].dtype() == dt);
        Vec ref = r32[i].to_vector<double>();
        double scale = 0;
        for (double v : ref) scale = std::max(scale, std::abs(v));
        check_close(r16[i], ref, {tolerance(dt).rtol, 4 * tolerance(dt).rtol * scale},
                    std::string("chunked ") + names[i] + " " + to_string(dt));
      }
      unsetenv("MPT_CPU_BF16_CONV");
    }
  });
}

TEST_CASE("bfloat16 convolutions: every pass's path agrees with float32 compute") {
  // Batches of 16 images, so that the passes recast as forward convolutions (backward data with
  // the flipped kernel; weight gradient with images and channels swapped) run on AMX where it is.
  struct Case {
    Shape x;
    std::int64_t filters;
    IntPair strides;
    const char* padding;
    IntPair dilation;
    IntPair kernel = {3, 3};
  };
  // Strided cases also cover backward-data by stride phases: odd sizes with 'same' padding on
  // both sides, stride 3, a 2x2 kernel under stride 3 (no tap reaches one phase), and a 4x4
  // kernel under stride 2 (2x2 sub-kernels).
  const std::vector<Case> cases = {{{16, 9, 9, 16}, 32, {1, 1}, "same", {1, 1}},
                                   {{16, 10, 9, 16}, 16, {2, 2}, "same", {1, 1}},
                                   {{16, 11, 11, 8}, 16, {1, 1}, "valid", {2, 2}},
                                   {{16, 9, 8, 16}, 16, {2, 1}, "valid", {1, 1}},
                                   {{16, 8, 8, 1}, 32, {1, 1}, "valid", {1, 1}},
                                   {{16, 9, 11, 32}, 16, {2, 2}, "same", {1, 1}},
                                   {{16, 13, 11, 16}, 32, {3, 3}, "valid", {1, 1}},
                                   {{16, 11, 10, 16}, 16, {3, 3}, "valid", {1, 1}, {2, 2}},
                                   {{16, 12, 12, 16}, 16, {2, 2}, "same", {1, 1}, {4, 4}}};
  for_each_device([&](Device dev) {
    for_bf16_paths(bfloat16, [&](const char* path) {
      for (const auto& c : cases) {
        Tensor x = random(c.x, bfloat16, dev, 80, -1, 1);
        Tensor w = random({c.kernel[0], c.kernel[1], c.x[3], c.filters}, bfloat16, dev, 81, -0.5, 0.5);
        Tensor b = random({c.filters}, bfloat16, dev, 82);
        ops::Conv2dOptions o{.strides = c.strides, .padding = c.padding, .dilation = c.dilation};
        auto run = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi) {
          GradientTape tape;
          Tensor xs = xi, ws = wi, bs = bi;
          tape.watch(xs), tape.watch(ws), tape.watch(bs);
          Tensor y = ops::conv2d(xs, ws, bs, o);
          Tensor loss = ops::sum(ops::cast(weigh(y), float32));
          auto g = tape.gradient(loss, {xs, ws, bs});
          g.insert(g.begin(), y);
          return g;
        };
        auto r16 = run(x, w, b), r32 = run(x.to(float32), w.to(float32), b.to(float32));
        const char* names[] = {"y", "dx", "dkernel", "dbias"};
        for (int i = 0; i < 4; ++i) {
          Vec ref = r32[i].to_vector<double>();
          double scale = 0;
          for (double v : ref) scale = std::max(scale, std::abs(v));
          check_close(r16[i], ref, {tolerance(bfloat16).rtol, 2 * tolerance(bfloat16).rtol * scale},
                      std::string("bf16 (") + path + ") " + to_string(c.x) + " " + c.padding + " " + names[i]);
        }
      }
    });
  });
}

TEST_CASE("bfloat16 kernel gradients (AMX tiles where the CPU has them) match float64 sums") {
  // The products of bfloat16 values are exact in float32, so the only error is the float32
  // summation's: 1e-5 of the sum of magnitudes bounds it. Shapes cover channel counts that are
  // not multiples of 16, 1x1/4x4/5x5 kernels, asymmetric 'same' padding, dilation, strides (the
  // input split into phases), batches whose grid spans several 512-row blocks split over
  // threads, and an image wide enough for larger blocks.
  struct Case {
    Shape x;
    std::int64_t filters;
    IntPair kernel;
    const char* padding;
    IntPair dilation;
    IntPair strides = {1, 1};
  };
  const std::vector<Case> cases = {{{2, 5, 7, 16}, 16, {3, 3}, "same", {1, 1}},
                                   {{12, 13, 13, 32}, 64, {3, 3}, "valid", {1, 1}},
                                   {{5, 11, 9, 20}, 33, {4, 4}, "same", {1, 1}},
                                   {{3, 12, 10, 40}, 17, {5, 5}, "same", {2, 2}},
                                   {{7, 6, 6, 48}, 1, {1, 1}, "valid", {1, 1}},
                                   {{9, 16, 16, 32}, 64, {3, 3}, "same", {1, 1}, {2, 2}},
                                   {{4, 13, 11, 24}, 20, {3, 3}, "valid", {1, 1}, {2, 1}},
                                   {{3, 15, 14, 16}, 16, {5, 4}, "same", {1, 1}, {3, 2}},
                                   {{6, 9, 9, 32}, 48, {1, 1}, "valid", {1, 1}, {2, 2}},
                                   {{2, 9, 7, 130}, 70, {3, 3}, "same", {1, 1}},
                                   {{2, 8, 70, 16}, 16, {3, 3}, "same", {1, 1}}};
  for_each_device([&](Device dev) {
    for (const auto& c : cases) {
      Tensor x = random(c.x, bfloat16, dev, 90, -2, 2), w = random({c.kernel[0], c.kernel[1], c.x[3], c.filters}, bfloat16, dev, 91);
      Tensor b = random({c.filters}, bfloat16, dev, 92);
      ops::Conv2dOptions o{.strides = c.strides, .padding = c.padding, .dilation = c.dilation};
      auto grads = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi, const Tensor& dy) {
        GradientTape tape;
        Tensor ws = wi, bs = bi;
        tape.watch(ws), tape.watch(bs);
        Tensor y = ops::conv2d(xi, ws, bs, o);
        return tape.gradient(ops::sum(ops::cast(ops::mul(y, dy), float32)), {ws, bs});
      };
      const Shape ys = ops::conv2d(x, w, b, o).shape();
      Tensor dy = random(ys, bfloat16, dev, 93, -1, 1);
      auto g16 = grads(x, w, b, dy);
      auto g64 = grads(x.to(float64), w.to(float64), b.to(float64), dy.to(float64));
      // The same sums of magnitudes bound each entry's rounding error.
      auto a64 = grads(ops::abs(x.to(float64)), w.to(float64), b.to(float64), ops::abs(dy.to(float64)));
      for (int i = 0; i < 2; ++i) {
        REQUIRE(g16[i].dtype() == bfloat16);
        const Vec got = g16[i].to_vector<double>(), ref = g64[i].to_vector<double>(), mag = a64[i].to_vector<double>();
        int bad = 0;
        for (std::size_t k = 0; k < got.size(); ++k)
          // the float32 sum within 1e-5 of the magnitudes, then one rounding to bfloat16 (2^-8)
          bad += !(std::abs(got[k] - ref[k]) <= 1e-5 * mag[k] + std::ldexp(std::abs(ref[k]), -8) + 1e-30);  // NaN is bad
        CHECK_MESSAGE(bad == 0, (to_string(c.x) + " " + c.padding + (i ? " dbias: " : " dkernel: ") + std::to_string(bad) +
                                    " of " + std::to_string(got.size()) + " entries off"));
      }
    }
  });
}

TEST_CASE("first-layer convolutions (1 to 4 input channels) match float64, forward and gradients") {
  struct Case {
    Shape x;
    std::int64_t filters;
    IntPair strides;
    const char* padding;
    IntPair dilation;
    const char* activation;
  };
  const std::vector<Case> cases = {{{4, 9, 8, 3}, 16, {1, 1}, "same", {1, 1}, "relu"},
                                   {{4, 10, 9, 1}, 32, {2, 2}, "same", {1, 1}, "linear"},
                                   {{3, 11, 11, 3}, 8, {1, 1}, "valid", {2, 2}, "linear"},
                                   {{2, 8, 8, 4}, 16, {2, 1}, "valid", {1, 1}, "relu"}};
  for_each_device([&](Device dev) {
    for (DType dt : {float32, bfloat16})
      for (const auto& c : cases) {
        const std::string what = "first layer " + to_string(c.x) + " " + c.padding + " " + c.activation + " " + to_string(dt);
        Tensor x = random(c.x, dt, dev, 90, -1, 1), w = random({3, 3, c.x[3], c.filters}, dt, dev, 91, -0.5, 0.5);
        Tensor b = random({c.filters}, dt, dev, 92, 0.1, 0.5);
        ops::Conv2dOptions o{.strides = c.strides, .padding = c.padding, .dilation = c.dilation, .activation = c.activation};
        auto run = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi) {
          GradientTape tape;
          Tensor ws = wi, bs = bi;
          tape.watch(ws), tape.watch(bs);
          Tensor y = ops::conv2d(xi, ws, bs, o);
          auto g = tape.gradient(ops::sum(ops::cast(weigh(y), float32)), {ws, bs});
          g.insert(g.begin(), y);
          return g;
        };
        auto r = run(x, w, b), r64 = run(x.to(float64), w.to(float64), b.to(float64));
        const char* names[] = {"y", "dkernel", "dbias"};
        for (int i = 0; i < 3; ++i) {
          Vec ref = r64[i].to_vector<double>();
          double scale = 0;
          for (double v : ref) scale = std::max(scale, std::abs(v));
          check_close(r[i], ref, {tolerance(dt).rtol, 2 * tolerance(dt).rtol * scale}, what + " " + names[i]);
        }
      }
  });
}

TEST_CASE("conv, pooling and normalization errors name the op and the shapes") {
  for_each_device([](Device dev) {
    Tensor x = Tensor::ones({2, 4, 4, 3}, float32, dev);
    Tensor w5 = Tensor::ones({5, 5, 3, 8}, float32, dev);
    CHECK_MPT_ERROR(ops::conv2d(x, w5), "conv2d", "5x5", "4x4", "valid", "(2, 4, 4, 3)", "(5, 5, 3, 8)");
    CHECK(ops::conv2d(x, w5, {}, {.padding = "same"}).shape() == Shape{2, 4, 4, 8});
    CHECK_MPT_ERROR(ops::conv2d(x, Tensor::ones({3, 3, 3, 8}, float32, dev), {}, {.dilation = {3, 3}}), "conv2d",
                    "7x7 dilated", "4x4");
    CHECK_MPT_ERROR(ops::conv2d(Tensor::ones({4, 4, 3}, float32, dev), Tensor::ones({3, 3, 3, 8}, float32, dev)), "conv2d",
                    "4-d", "(4, 4, 3)");
    CHECK_MPT_ERROR(ops::conv2d(x, Tensor::ones({3, 3, 8}, float32, dev)), "conv2d", "kernel", "(3, 3, 8)");
    CHECK_MPT_ERROR(ops::conv2d(x, Tensor::ones({3, 3, 2, 8}, float32, dev)), "conv2d", "3 channels", "(2, 4, 4, 3)",
                    "(3, 3, 2, 8)");
    Tensor x4 = Tensor::ones({2, 4, 4, 4}, float32, dev);
    CHECK_MPT_ERROR(ops::conv2d(x4, Tensor::ones({3, 3, 2, 6}, float32, dev), {}, {.groups = 3}), "conv2d", "groups = 3",
                    "4 input channels", "6 filters");
    CHECK_MPT_ERROR(ops::conv2d(x4, Tensor::ones({3, 3, 2, 5}, float32, dev), {}, {.groups = 2}), "conv2d", "groups = 2",
                    "5 filters");
    CHECK_MPT_ERROR(ops::conv2d(x4, Tensor::ones({3, 3, 4, 6}, float32, dev), {}, {.groups = 2}), "conv2d",
                    "expects 4 per group", "8 in 2 groups", "(2, 4, 4, 4)");
    CHECK_MPT_ERROR(ops::conv2d(x4, Tensor::ones({3, 3, 4, 6}, float32, dev), {}, {.groups = 0}), "conv2d", "groups",
                    "got 0");
    CHECK_MPT_ERROR(ops::conv2d(x, Tensor::ones({3, 3, 3, 8}, float32, dev), Tensor::ones({4}, float32, dev)), "conv2d",
                    "bias", "(4,)");
    CHECK_MPT_ERROR(ops::conv2d(x, Tensor::ones({3, 3, 3, 8}, bfloat16, dev)), "conv2d", "float32", "bfloat16");
    CHECK_MPT_ERROR(ops::conv2d(x, Tensor::ones({3, 3, 3, 8}, float32, dev), {}, {.padding = "full"}), "conv2d", "full");
    CHECK_MPT_ERROR(ops::conv2d(x, Tensor::ones({3, 3, 3, 8}, float32, dev), {}, {.strides = {0, 1}}), "conv2d", "strides");
    CHECK_MPT_ERROR(ops::conv2d(x, Tensor::ones({3, 3, 3, 8}, float32, dev), {}, {.activation = "softplus"}), "conv2d",
                    "softplus");
    CHECK_MPT_ERROR(ops::max_pool2d(x, {5, 5}), "max_pool2d", "5x5", "4x4", "(2, 4, 4, 3)");
    CHECK_MPT_ERROR(ops::avg_pool2d(Tensor::ones({4, 4}, float32, dev)), "avg_pool2d", "4-d", "(4, 4)");
    CHECK_MPT_ERROR(ops::global_avg_pool2d(Tensor::ones({2, 3}, float32, dev)), "global_avg_pool2d", "(2, 3)");
    CHECK_MPT_ERROR(ops::zero_pad2d(x, -1, 0, 0, 0), "zero_pad2d", "-1");
    CHECK_MPT_ERROR(ops::batch_norm(x, Tensor::ones({4}, float32, dev), {}, {}, {}, {.training = true}), "batch_norm",
                    "gamma", "(4,)", "(2, 4, 4, 3)");
    CHECK_MPT_ERROR(ops::batch_norm(x, {}, {}, {}, {}), "batch_norm", "mean and variance");
    CHECK_MPT_ERROR(ops::batch_norm(Tensor::ones({0, 3}, float32, dev), {}, {}, {}, {}, {.training = true}), "batch_norm",
                    "(0, 3)");
    CHECK_MPT_ERROR(ops::layer_norm(x, Tensor::ones({4}, float32, dev)), "layer_norm", "gamma", "(4,)");
  });
}
