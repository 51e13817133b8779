// Every op's forward pass against a naive float64 reference, in every floating dtype, on every
// device (the elementwise unary and binary ops and the activations: test_op_table.cpp). Inputs are generated in the tested dtype, so the reference sees exactly the same values.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;  // check_close, for_each_device, random, tolerance, ...

namespace {

using Vec = std::vector<double>;

/// Row-major strides of a shape broadcast to `out`.
std::vector<std::int64_t> bstrides(const Shape& s, const Shape& out) {
  std::vector<std::int64_t> st(out.size(), 0);
  std::int64_t stride = 1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    std::size_t d = s.size() - 1 - i, o = out.size() - 1 - i;
    st[o] = s[d] == 1 ? 0 : stride;
    stride *= s[d];
  }
  return st;
}

Vec broadcast_ref(const Vec& a, const Shape& sa, const Vec& b, const Shape& sb, const Shape& out,
                  const std::function<double(double, double)>& f) {
  auto ta = bstrides(sa, out), tb = bstrides(sb, out);
  Vec r(numel_of(out));
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(r.size()); ++i) {
    std::int64_t rem = i, ia = 0, ib = 0;
    for (std::int64_t d = static_cast<std::int64_t>(out.size()) - 1; d >= 0; --d) {
      std::int64_t idx = rem % out[d];
      rem /= out[d];
      ia += idx * ta[d];
      ib += idx * tb[d];
    }
    r[i] = f(a[ia], b[ib]);
  }
  return r;
}

/// Rounds reference values to the dtype the op stores in (what the op can at best return).
Vec rounded(const Vec& v, DType d) { return Tensor::from_vector(v).to(d).to_vector<double>(); }

}  // namespace

TEST_CASE("integer arithmetic and where") {
  // Every binary op in every float dtype: test_op_table.cpp.
  for_each_device([](Device dev) {
    auto a = Tensor::from_vector<std::int32_t>({7, -3, 4, 0}, {4}, dev);
    auto b = Tensor::from_vector<std::int32_t>({2, 2, -4, 5}, {4}, dev);
    CHECK(ops::add(a, b).to_vector<std::int32_t>() == std::vector<std::int32_t>{9, -1, 0, 5});
    CHECK(ops::mul(a, b).to_vector<std::int32_t>() == std::vector<std::int32_t>{14, -6, -16, 0});
    CHECK(ops::div(a, b).to_vector<std::int32_t>() == std::vector<std::int32_t>{3, -1, -1, 0});
    CHECK(ops::add(a, b).dtype() == int32);
    for (DType dt : test::float_dtypes()) {
      Tensor x = random({6, 50}, dt, dev, 3), y = random({50}, dt, dev, 4);
      Vec xs = x.to_vector<double>(), ys = y.to_vector<double>();
      Tensor cond = ops::greater(x, Tensor::scalar(0, dt, dev));
      Tensor w = ops::where(cond, x, y);
      Vec ref = broadcast_ref(xs, x.shape(), ys, y.shape(), x.shape(), [](double p, double q) { return p > 0 ? p : q; });
      check_close(w, ref, {0, 0}, "where " + to_string(dt));
    }
  });
}

TEST_CASE("reductions of long rows (whole-tensor sums) run in chunks: float64 references, bits independent of the thread count") {
  // Past 2 chunks of 32768 values a row is reduced in chunks on the threads: sums in 16 interleaved
  // partial sums per chunk, maxima and minima in order (so the first of equal maxima and the
  // last NaN win, as sequentially).
  const std::int64_t n = 3 * 32768 + 1001;
  for_each_device([&](Device dev) {
    for (DType dt : test::float_dtypes()) {
      const Tensor x = random({n}, dt, dev, 9, 0.1, 0.5);  // a float16 sum below 65504
      const Vec xs = x.to_vector<double>();
      double sum = 0, mx = -1e300, mn = 1e300;
      for (double v : xs) sum += v, mx = std::max(mx, v), mn = std::min(mn, v);
      const std::string what = to_string(dt) + " " + dev.str();
      const test::Tolerance t = tolerance(dt);
      // float32 partial sums of about n/16 values each: rounding grows with their size
      check_close(ops::sum(x), {sum}, {dt == float64 ? 1e-12 : 2e-6 + t.rtol, 0}, "sum " + what);
      check_close(ops::mean(x), {sum / double(n)}, {dt == float64 ? 1e-12 : 2e-6 + t.rtol, 0}, "mean " + what);
      check_close(ops::max(x), {mx}, {0, 0}, "max " + what);
      check_close(ops::min(x), {mn}, {0, 0}, "min " + what);
      // Two rows along the last axis, and keepdims.
      const Tensor x2 = x.slice(0, 2 * 40000).reshape({2, 40000});
      const Vec s2 = ops::sum(x2, {1}).to_vector<double>();
      for (int r = 0; r < 2; ++r) {
        double ref = 0;
        for (int i = 0; i < 40000; ++i) ref += xs[static_cast<std::size_t>(r * 40000 + i)];
        CHECK_MESSAGE(std::abs(s2[static_cast<std::size_t>(r)] - ref) <= (dt == float64 ? 1e-12 : 2e-6 + t.rtol) * ref, what);
      }
      if (dev == Device::cpu()) {  // the same bits on 1 thread and on 2
        const int saved = num_threads();
        set_num_threads(1);
        const Tensor one = ops::sum(x), one_max = ops::max(x);
        set_num_threads(2);
        const Tensor two = ops::sum(x), two_max = ops::max(x);
        set_num_threads(saved);
        CHECK_MESSAGE(one.to_vector<double>() == two.to_vector<double>(), what);
        CHECK_MESSAGE(one_max.to_vector<double>() == two_max.to_vector<double>(), what);
      }
    }
    // Equal maxima of both signs of zero and NaNs: the sequential answers.
    std::vector<float> v(static_cast<std::size_t>(n), -1.0f);
    v[5] = 0.0f, v[40000] = -0.0f, v[70000] = 0.0f;
    const std::vector<float> zeros = ops::max(Tensor::from_vector(v, {n}).to(dev)).to_vector<float>();
    CHECK((zeros[0] == 0.0f && !std::signbit(zeros[0])));  // +0 came first
    v[5] = -0.0f, v[40000] = 0.0f;
    const std::vector<float> neg = ops::max(Tensor::from_vector(v, {n}).to(dev)).to_vector<float>();
    CHECK((neg[0] == 0.0f && std::signbit(neg[0])));  // -0 came first
    v[100] = NAN;
    CHECK(std::isnan(ops::max(Tensor::from_vector(v, {n}).to(dev)).item()));
    CHECK(std::isnan(ops::sum(Tensor::from_vector(v, {n}).to(dev)).item()));
  });
}

TEST_CASE("max of -inf values is -inf, min of +inf values +inf (whole tensors, rows, columns, long rows)") {
  for_each_device([](Device dev) {
    for (DType dt : test::float_dtypes())
      for (std::int64_t n : {std::int64_t{3}, std::int64_t{70000}}) {
        const Tensor lo = Tensor::full({2, n}, -INFINITY, dt, dev), hi = Tensor::full({2, n}, INFINITY, dt, dev);
        const std::string what = to_string(dt) + " " + dev.str() + " n " + std::to_string(n);
        CHECK_MESSAGE(ops::max(lo).item() == -INFINITY, what);
        CHECK_MESSAGE(ops::min(hi).item() == INFINITY, what);
        for (double v : ops::max(lo, {1}).to_vector<double>()) CHECK_MESSAGE(v == -INFINITY, what);
        for (double v : ops::max(lo, {0}).to_vector<double>()) CHECK_MESSAGE(v == -INFINITY, what);
        for (double v : ops::min(hi, {0}).to_vector<double>()) CHECK_MESSAGE(v == INFINITY, what);
      }
  });
}

TEST_CASE("reductions match float64 references") {
  const Shape shape{3, 4, 5};
  const std::vector<std::vector<std::int64_t>> axes_list = {{}, {0}, {1}, {-1}, {0, 2}, {1, 2}};
  for_each_device([&](Device dev) {
    for (DType dt : test::float_dtypes()) {
      Tensor x = random(shape, dt, dev, 5);
      Vec xs = x.to_vector<double>();
      for (const auto& axes : axes_list)
        for (bool keep : {false, true}) {
          std::vector<bool> red(3, axes.empty());
          for (auto a : axes) red[(a + 3) % 3] = true;
          Shape ks{red[0] ? 1 : 3, red[1] ? 1 : 4, red[2] ? 1 : 5};
          Vec sum(numel_of(ks), 0), mx(numel_of(ks), -1e300), mn(numel_of(ks), 1e300);
          double count = 60.0 / numel_of(ks);
          for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 4; ++j)
              for (int k = 0; k < 5; ++k) {
                std::int64_t o = ((red[0] ? 0 : i) * ks[1] + (red[1] ? 0 : j)) * ks[2] + (red[2] ? 0 : k);
                double v = xs[(i * 4 + j) * 5 + k];
                sum[o] += v, mx[o] = std::max(mx[o], v), mn[o] = std::min(mn[o], v);
              }
          Vec mean = sum;
          for (auto& m : mean) m /= count;
          std::string what = to_string(dt) + " axes size " + std::to_string(axes.size()) + (keep ? " keepdims" : "");
          Tensor s = ops::sum(x, axes, keep);
          Shape expect_shape = keep ? ks : Shape{};
          if (!keep)
            for (int d = 0; d < 3; ++d)
              if (!red[d]) expect_shape.push_back(shape[d]);
          CHECK(s.shape() == expect_shape);
          CHECK(s.dtype() == dt);
          // Sums accumulate in float32 and round once: compare with the scale of the summands.
          test::Tolerance t = tolerance(dt);
          check_close(s, sum, {t.rtol, t.rtol * count * 2}, "sum " + what);
          check_close(ops::mean(x, axes, keep), mean, {t.rtol, t.rtol * 2}, "mean " + what);
          check_close(ops::max(x, axes, keep), mx, {0, 0}, "max " + what);
          check_close(ops::min(x, axes, keep), mn, {0, 0}, "min " + what);
        }
      for (std::int64_t axis : {0, 1, 2}) {
        Tensor am = ops::argmax(x, axis);
        CHECK(am.dtype() == int64);
        auto got = am.to_vector<std::int64_t>();
        std::size_t idx = 0;
        for (int i = 0; i < (axis == 0 ? 1 : 3); ++i)
          for (int j = 0; j < (axis == 1 ? 1 : 4); ++j)
            for (int k = 0; k < (axis == 2 ? 1 : 5); ++k) {
              std::int64_t best = 0;
              double bv = -1e300;
              for (int r = 0; r < shape[axis]; ++r) {
                int ii = axis == 0 ? r : i, jj = axis == 1 ? r : j, kk = axis == 2 ? r : k;
                double v = xs[(ii * 4 + jj) * 5 + kk];
                if (v > bv) bv = v, best = r;
              }
              CHECK(got[idx++] == best);
            }
      }
    }
  });
}

namespace {
/// Reference op(a) . op(b) [+ bias] for 2-d operands.
Vec matmul_ref(const Vec& a, const Vec& b, std::int64_t m, std::int64_t k, std::int64_t n, bool ta, bool tb,
               double* scale) {
  Vec c(m * n, 0);
  *scale = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        double av = ta ? a[p * m + i] : a[i * k + p], bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv, mag += std::abs(av * bv);
      }
      c[i * n + j] = s;
      *scale = std::max(*scale, mag);
    }
  return c;
}
}  // namespace

TEST_CASE("matmul with transposes and batches matches the reference") {
  const std::int64_t m = 37, k = 53, n = 29;
  for_each_device([&](Device dev) {
    for (DType dt : test::float_dtypes())
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          Tensor a = random(ta ? Shape{k, m} : Shape{m, k}, dt, dev, 7);
          Tensor b = random(tb ? Shape{n, k} : Shape{k, n}, dt, dev, 8);
          Tensor c = ops::matmul(a, b, ta, tb);
          REQUIRE(c.shape() == Shape{m, n});
          CHECK(c.dtype() == dt);
          double scale;
          Vec ref = matmul_ref(a.to_vector<double>(), b.to_vector<double>(), m, k, n, ta, tb, &scale);
          // float32 accumulation of k products, one rounding to the storage dtype.
          check_close(c, ref, {tolerance(dt).rtol, tolerance(dt).rtol * scale},
                      "matmul " + to_string(dt) + (ta ? " ta" : "") + (tb ? " tb" : ""));
        }
    for (DType dt : {float32, bfloat16}) {  // batched, and a 2-d right operand broadcast over the batch
      Tensor a = random({3, m, k}, dt, dev, 9), b3 = random({3, k, n}, dt, dev, 10), b2 = random({k, n}, dt, dev, 11);
      Tensor c3 = ops::matmul(a, b3), c2 = ops::matmul(a, b2);
      REQUIRE(c3.shape() == Shape{3, m, n});
      REQUIRE(c2.shape() == Shape{3, m, n});
      Vec av = a.to_vector<double>(), b3v = b3.to_vector<double>(), b2v = b2.to_vector<double>();
      Vec c3v = c3.to_vector<double>(), c2v = c2.to_vector<double>();
      for (std::int64_t bi = 0; bi < 3; ++bi) {
        double scale;
        Vec ai(av.begin() + bi * m * k, av.begin() + (bi + 1) * m * k);
        Vec bi3(b3v.begin() + bi * k * n, b3v.begin() + (bi + 1) * k * n);
        test::Tolerance t{tolerance(dt).rtol, 0};
        Vec r3 = matmul_ref(ai, bi3, m, k, n, false, false, &scale);
        t.atol = tolerance(dt).rtol * scale;
        check_close(Vec(c3v.begin() + bi * m * n, c3v.begin() + (bi + 1) * m * n), r3, t, "batched matmul");
        Vec r2 = matmul_ref(ai, b2v, m, k, n, false, false, &scale);
        check_close(Vec(c2v.begin() + bi * m * n, c2v.begin() + (bi + 1) * m * n), r2, t, "broadcast matmul");
      }
    }
  });
}

TEST_CASE("dense keeps leading batch dimensions") {
  // The activations fused into dense are tests/ops/test_op_table.cpp's.
  for_each_device([](Device dev) {
    Tensor x3 = random({2, 3, 40}, float32, dev, 4), w = random({40, 24}, float32, dev, 5);
    CHECK(ops::dense(x3, w).shape() == Shape{2, 3, 24});
  });
}

TEST_CASE("softmax and log_softmax compute in float32 and match the reference") {
  for_each_device([](Device dev) {
    for (DType dt : test::float_dtypes())
      for (std::int64_t axis : {-1, 0}) {
        Tensor x = random({6, 10}, dt, dev, 12, -5, 5);
        Vec xs = x.to_vector<double>(), sm(60), lsm(60);
        for (int o = 0; o < (axis == 0 ? 10 : 6); ++o) {
          auto at = [&](int i) { return axis == 0 ? i * 10 + o : o * 10 + i; };
          int n = axis == 0 ? 6 : 10;
          double mx = -1e300, s = 0;
          for (int i = 0; i < n; ++i) mx = std::max(mx, xs[at(i)]);
          for (int i = 0; i < n; ++i) s += std::exp(xs[at(i)] - mx);
          for (int i = 0; i < n; ++i) sm[at(i)] = std::exp(xs[at(i)] - mx) / s, lsm[at(i)] = xs[at(i)] - mx - std::log(s);
        }
        Tensor y = ops::softmax(x, axis);
        CHECK(y.dtype() == dt);
        check_close(y, sm, tolerance(dt), "softmax " + to_string(dt));
        check_close(ops::log_softmax(x, axis), lsm, tolerance(dt), "log_softmax " + to_string(dt));
      }
    // Large logits do not overflow (max subtraction).
    Tensor big = Tensor::from_vector<float>({1000, 1001, 1002}, {1, 3}, dev);
    auto v = ops::softmax(big).to_vector<double>();
    CHECK(v[2] == doctest::Approx(1 / (1 + std::exp(-1.0) + std::exp(-2.0))).epsilon(1e-6));
  });
}

TEST_CASE("column sums (a bias gradient's reduction over rows) add each column's rows in order, widths past the lanes") {
  // The rows stream past sums held in registers, up to four vectors at a time, then one, then a
  // scalar tail: widths around every tier's lane counts give each part. Each column adds its rows
  // in order from zero, so a float32 sum is the sequential float32 sum bit for bit.
  for_each_device([](Device dev) {
    for (std::int64_t m : {1, 3, 8, 15, 16, 17, 40, 64, 100, 129, 257, 1030, 2500})
      for (std::int64_t rows : {1, 7, 300}) {
        const std::string what = "[" + std::to_string(rows) + ", " + std::to_string(m) + "] " + dev.str();
        const Tensor x = random({rows, m}, float32, dev, 21, -2, 2);
        const std::vector<float> xs = x.to_vector<float>();
        std::vector<float> in_order(static_cast<std::size_t>(m), 0.0f);
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < m; ++j) in_order[j] += xs[r * m + j];
        const std::vector<float> got = ops::sum(x, {0}).to_vector<float>();
        CHECK_MESSAGE(got == in_order, "float32 " << what);
        Vec mean(in_order.begin(), in_order.end());
        for (double& v : mean) v = static_cast<float>(v / static_cast<double>(rows));
        check_close(ops::mean(x, {0}), mean, {0, 0}, "float32 mean " + what);
        const Tensor x64 = random({rows, m}, float64, dev, 22, -2, 2);
        const Vec x64s = x64.to_vector<double>();
        Vec ref(static_cast<std::size_t>(m), 0.0);
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < m; ++j) ref[j] += x64s[r * m + j];
        check_close(ops::sum(x64, {0}), ref, {0, 0}, "float64 " + what);
      }
  });
}

TEST_CASE("softmax, log_softmax and cross-entropy over long rows: float64 references, masked logits exactly 0") {
  // Rows of every length around the tiers' lane counts (vectors, then a tail), logits spread wide
  // enough for exp to underflow, and -inf (a masked logit) giving probability exactly 0.
  for_each_device([](Device dev) {
    for (std::int64_t n : {1, 5, 16, 17, 33, 128, 200}) {
      const std::int64_t rows = 9;
      const std::string what = "n " + std::to_string(n) + " " + dev.str();
      Tensor x = random({rows, n}, float32, dev, 23, -40, 40);
      std::vector<float> xv = x.to_vector<float>();
      for (std::int64_t r = 0; r < rows; ++r)
        if (n > 1) xv[r * n + (r * 7) % n] = -INFINITY;
      x = Tensor::from_vector(xv, {rows, n}).to(dev);
      std::vector<std::int32_t> ids(rows);
      Vec sm(rows * n), lsm(rows * n), xent(rows);
      for (std::int64_t r = 0; r < rows; ++r) {
        ids[r] = static_cast<std::int32_t>((r * 3 + 1) % n);
        if (n > 1 && ids[r] == (r * 7) % n) ids[r] = static_cast<std::int32_t>((ids[r] + 1) % n);
        double mx = -1e300, s = 0;
        for (std::int64_t c = 0; c < n; ++c) mx = std::max(mx, double(xv[r * n + c]));
        for (std::int64_t c = 0; c < n; ++c) s += std::exp(double(xv[r * n + c]) - mx);
        for (std::int64_t c = 0; c < n; ++c) {
          sm[r * n + c] = std::exp(double(xv[r * n + c]) - mx) / s;
          lsm[r * n + c] = double(xv[r * n + c]) - mx - std::log(s);
        }
        xent[r] = -lsm[r * n + ids[r]];
      }
      const Tensor y = ops::softmax(x);
      // float32's x - max (up to 80 here) is within 2^-24 · 80 of the exact difference: e^d to 1e-5.
      check_close(y, sm, {1e-5, 1e-30}, "softmax " + what);
      const std::vector<float> yv = y.to_vector<float>();
      for (std::int64_t r = 0; r < rows; ++r)
        if (n > 1) CHECK_MESSAGE(yv[r * n + (r * 7) % n] == 0.0f, what);
      check_close(ops::log_softmax(x), lsm, {1e-6, 1e-5}, "log_softmax " + what);  // -inf where masked
      // The masked logit is not the label: the loss stays finite.
      const Tensor labels = Tensor::from_vector(ids, {rows}).to(dev);
      check_close(ops::softmax_cross_entropy(x, labels), xent, {1e-6, 1e-5}, "cross-entropy " + what);
      check_close(ops::softmax_cross_entropy(x, ops::one_hot(labels, n)), xent, {1e-6, 1e-5},
                  "cross-entropy, one-hot " + what);
    }
  });
}

TEST_CASE("softmax_cross_entropy: sparse and one-hot labels, logits and probabilities") {
  const std::int64_t rows = 20, classes = 7;
  for_each_device([&](Device dev) {
    std::vector<std::int32_t> ids(rows);
    for (std::int64_t i = 0; i < rows; ++i) ids[i] = static_cast<std::int32_t>((i * 5 + 3) % classes);
    Tensor sparse = Tensor::from_vector(ids, {rows}, dev);
    Tensor onehot = ops::one_hot(sparse, classes);
    for (DType dt : test::float_dtypes()) {
      Tensor logits = random({rows, classes}, dt, dev, 13, -4, 4);
      Tensor probs = ops::softmax(logits.to(float32)).to(dt);
      Vec lg = logits.to_vector<double>(), pr = probs.to_vector<double>();
      Vec ref_logits(rows), ref_probs(rows);
      for (std::int64_t r = 0; r < rows; ++r) {
        double mx = -1e300, s = 0, ps = 0;
        for (std::int64_t c = 0; c < classes; ++c) mx = std::max(mx, lg[r * classes + c]), ps += pr[r * classes + c];
        for (std::int64_t c = 0; c < classes; ++c) s += std::exp(lg[r * classes + c] - mx);
        ref_logits[r] = -(lg[r * classes + ids[r]] - mx - std::log(s));
        double q = std::clamp(pr[r * classes + ids[r]] / ps, 1e-7, 1 - 1e-7);
        ref_probs[r] = -std::log(q);
      }
      const DType loss_dt = dt == float64 ? float64 : float32;
      test::Tolerance t = tolerance(loss_dt);
      for (const Tensor& labels : {sparse, onehot}) {
        Tensor l1 = ops::softmax_cross_entropy(logits, labels);
        CHECK(l1.dtype() == loss_dt);
        REQUIRE(l1.shape() == Shape{rows});
        check_close(l1, ref_logits, t, "cross-entropy from logits " + to_string(dt));
        Tensor l2 = ops::softmax_cross_entropy(probs, labels, {.from_logits = false});
        check_close(l2, ref_probs, t, "cross-entropy from probabilities " + to_string(dt));
      }
    }
  });
}

TEST_CASE("shape ops: cast, reshape, transpose, concat, slice, one_hot") {
  for_each_device([](Device dev) {
    for (DType dt : test::float_dtypes()) {
      Tensor x = random({2, 3, 4}, dt, dev, 14);
      Vec xs = x.to_vector<double>();
      Tensor t = ops::transpose(x, {2, 0, 1});
      REQUIRE(t.shape() == Shape{4, 2, 3});
      Vec tv = t.to_vector<double>();
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
          for (int k = 0; k < 4; ++k) CHECK(tv[(k * 2 + i) * 3 + j] == xs[(i * 3 + j) * 4 + k]);
      Tensor c = ops::concat({x, ops::slice(x, 1, 1, 3)}, 1);
      REQUIRE(c.shape() == Shape{2, 5, 4});
      Vec cv = c.to_vector<double>();
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 5; ++j)
          for (int k = 0; k < 4; ++k) CHECK(cv[(i * 5 + j) * 4 + k] == xs[(i * 3 + (j < 3 ? j : j - 2)) * 4 + k]);
      CHECK(ops::reshape(x, {4, -1}).to_vector<double>() == xs);
      CHECK(ops::cast(x, float64).to_vector<double>() == xs);  // widening is exact
    }
    Tensor idx = Tensor::from_vector<std::int64_t>({2, 0, 5}, {3}, dev);
    Tensor oh = ops::one_hot(idx, 4, bfloat16);
    CHECK(oh.dtype() == bfloat16);
    CHECK(oh.to_vector<float>() == std::vector<float>{0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0});
  });
}

TEST_CASE("16-bit results are the float32 result rounded once") {
  // "Accumulate in float32, store in the own dtype": the 16-bit op must equal the float32 op
  // on the same (already 16-bit) inputs, rounded to 16 bits.
  for_each_device([](Device dev) {
    for (DType dt : {float16, bfloat16}) {
      Tensor a = random({64, 96}, dt, dev, 15), b = random({96, 48}, dt, dev, 16);
      Tensor ref = ops::matmul(a.to(float32), b.to(float32)).to(dt);
      if (!dev.is_cuda()) {
        CHECK(ops::matmul(a, b).to_vector<float>() == ref.to_vector<float>());
      } else {
        // cuBLASLt's 16-bit and float32 GEMMs are different kernels that sum in different
        // orders (tensor-core tiles against FFMA), so their float32 sums differ in the last
        // float32 bits and may round to neighbouring 16-bit values: one 16-bit ulp at most.
        const std::vector<float> got = ops::matmul(a, b).to_vector<float>(), want = ref.to_vector<float>();
        const int mantissa = dt == float16 ? 10 : 7;
        int beyond = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          const float ulp = std::ldexp(1.0f, std::max(std::ilogb(std::max(std::abs(want[i]), 1e-30f)), -14) - mantissa);
          beyond += std::abs(got[i] - want[i]) > ulp;
        }
        CHECK_MESSAGE(beyond == 0, to_string(dt), ": ", beyond, " of ", got.size(), " beyond one ulp");
      }
      Tensor s16 = ops::sum(a, {1}), s32 = ops::sum(a.to(float32), {1}).to(dt);
      CHECK(s16.to_vector<float>() == s32.to_vector<float>());
      CHECK(ops::exp(a).to_vector<float>() == ops::exp(a.to(float32)).to(dt).to_vector<float>());
    }
  });
}
