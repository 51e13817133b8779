// Every differentiable op's gradient against central finite differences in float64 (the
// elementwise unary and binary ops and the activations: test_op_table.cpp).
#include "test_util.hpp"

using namespace mpt;
using mpt::test::check_gradients;
using mpt::test::for_each_device;
using mpt::test::random;

namespace {
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
Tensor r64(const Shape& s, Device d, std::uint64_t seed, double lo = -2, double hi = 2) {
  return random(s, float64, d, seed, lo, hi);
}
/// Weights the output so the checked scalar depends on every element differently.
Tensor weigh(const Tensor& y) {
  Tensor w = Tensor::random_uniform(y.shape(), 0.5, 1.5, 99, y.dtype(), y.device());
  return ops::mul(y, w);
}
}  // namespace

TEST_CASE("gradients of where") {
  // The binary ops: test_op_table.cpp.
  for_each_device([&](Device dev) {
    Tensor cond = ops::greater(r64({3, 4}, dev, 4), Tensor::scalar(0, float64, dev));
    check_gradients("where", [&](const std::vector<Tensor>& in) { return weigh(ops::where(cond, in[0], in[1])); },
                    {r64({3, 4}, dev, 5), r64({4}, dev, 6)});
  });
}

TEST_CASE("gradients of reductions") {
  for_each_device([](Device dev) {
    const std::vector<std::vector<std::int64_t>> axes_list = {{}, {0}, {-1}, {0, 2}};
    for (const auto& axes : axes_list)
      for (bool keep : {false, true}) {
        std::string what = "axes " + std::to_string(axes.size()) + (keep ? " keep" : "");
        Tensor x = r64({2, 3, 4}, dev, 7);
        check_gradients("sum " + what, [&](const std::vector<Tensor>& in) { return weigh(ops::sum(in[0], axes, keep)); }, {x});
        check_gradients("mean " + what, [&](const std::vector<Tensor>& in) { return weigh(ops::mean(in[0], axes, keep)); }, {x});
        check_gradients("max " + what, [&](const std::vector<Tensor>& in) { return weigh(ops::max(in[0], axes, keep)); }, {x});
        check_gradients("min " + what, [&](const std::vector<Tensor>& in) { return weigh(ops::min(in[0], axes, keep)); }, {x});
      }
    check_gradients("broadcast_to", [](const std::vector<Tensor>& in) { return weigh(ops::broadcast_to(in[0], {2, 3, 4})); },
                    {r64({3, 1}, dev, 8)});
  });
}

TEST_CASE("gradients of matmul and dense") {
  for_each_device([](Device dev) {
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        check_gradients(std::string("matmul") + (ta ? " ta" : "") + (tb ? " tb" : ""),
                        [&](const std::vector<Tensor>& in) { return weigh(ops::matmul(in[0], in[1], ta, tb)); },
                        {r64(ta ? Shape{4, 3} : Shape{3, 4}, dev, 9), r64(tb ? Shape{5, 4} : Shape{4, 5}, dev, 10)});
    check_gradients("batched matmul", [](const std::vector<Tensor>& in) { return weigh(ops::matmul(in[0], in[1])); },
                    {r64({2, 3, 4}, dev, 11), r64({2, 4, 5}, dev, 12)});
    check_gradients("broadcast matmul", [](const std::vector<Tensor>& in) { return weigh(ops::matmul(in[0], in[1], false, true)); },
                    {r64({2, 3, 4}, dev, 13), r64({5, 4}, dev, 14)});
    // dense with each activation: test_op_table.cpp
    check_gradients("dense no bias", [](const std::vector<Tensor>& in) { return weigh(ops::dense(in[0], in[1])); },
                    {r64({3, 4}, dev, 18), r64({4, 2}, dev, 19)});
  });
}

TEST_CASE("gradients of softmax, log_softmax and cross-entropy") {
  for_each_device([](Device dev) {
    for (std::int64_t axis : {-1, 0}) {
      check_gradients("softmax", [&](const std::vector<Tensor>& in) { return weigh(ops::softmax(in[0], axis)); },
                      {r64({3, 5}, dev, 20)});
      check_gradients("log_softmax", [&](const std::vector<Tensor>& in) { return weigh(ops::log_softmax(in[0], axis)); },
                      {r64({3, 5}, dev, 21)});
    }
    Tensor ids = Tensor::from_vector<std::int64_t>({1, 4, 0}, {3}, dev);
    Tensor soft = ops::softmax(r64({3, 5}, dev, 22));  // a label distribution, not only one-hot
    check_gradients("cross-entropy sparse logits",
                    [&](const std::vector<Tensor>& in) { return weigh(ops::softmax_cross_entropy(in[0], ids)); },
                    {r64({3, 5}, dev, 23)});
    check_gradients("cross-entropy soft labels logits",
                    [&](const std::vector<Tensor>& in) { return weigh(ops::softmax_cross_entropy(in[0], in[1])); },
                    {r64({3, 5}, dev, 24), soft});
    check_gradients("cross-entropy probabilities",
                    [&](const std::vector<Tensor>& in) {
                      return weigh(ops::softmax_cross_entropy(in[0], ids, {.from_logits = false}));
                    },
                    {r64({3, 5}, dev, 25, 0.1, 1.0)});  // unnormalised probabilities are normalised
  });
}

TEST_CASE("gradients of shape ops and casts") {
  for_each_device([](Device dev) {
    check_gradients("reshape", [](const std::vector<Tensor>& in) { return weigh(ops::reshape(in[0], {6, -1})); },
                    {r64({2, 3, 4}, dev, 26)});
    check_gradients("transpose", [](const std::vector<Tensor>& in) { return weigh(ops::transpose(in[0], {1, 2, 0})); },
                    {r64({2, 3, 4}, dev, 27)});
    check_gradients("concat", [](const std::vector<Tensor>& in) { return weigh(ops::concat({in[0], in[1]}, 1)); },
                    {r64({2, 3}, dev, 28), r64({2, 2}, dev, 29)});
    check_gradients("slice", [](const std::vector<Tensor>& in) { return weigh(ops::slice(in[0], 1, 1, 3)); },
                    {r64({2, 4}, dev, 30)});
    check_gradients("row slice", [](const std::vector<Tensor>& in) { return weigh(in[0].slice(1, 3)); },
                    {r64({4, 2}, dev, 31)});
    // cast to float32 and back: the gradient passes through (checked loosely: float32 rounding)
    check_gradients("cast", [](const std::vector<Tensor>& in) { return weigh(ops::cast(ops::cast(in[0], float32), float64)); },
                    {r64({3, 3}, dev, 32)}, 1e-3, {1e-4, 1e-4});
  });
}

TEST_CASE("embedding: rows by id in every dtype, a float32 scatter-add gradient, out-of-range ids refused") {
  for_each_device([](Device dev) {
    // Ids with repeats, as int64, int32 and integral float32 (Keras casts floating ids).
    const std::vector<double> idv = {3, 0, 3, 1, 4, 3};
    for (DType id_dtype : {int64, int32, float32}) {
      Tensor ids = Tensor::from_vector<double>(idv, {2, 3}).to(id_dtype).to(dev);
      for (DType dt : test::float_dtypes()) {
        Tensor table = test::random({5, 4}, float32, dev, 7);
        Tensor y = ops::embedding(ids, table, dt);
        REQUIRE(y.shape() == Shape{2, 3, 4});
        CHECK(y.dtype() == dt);
        const auto tv = table.to(dt).to_vector<double>(), yv = y.to_vector<double>();
        for (std::size_t k = 0; k < idv.size(); ++k)
          for (std::size_t j = 0; j < 4; ++j)
            CHECK(yv[k * 4 + j] == tv[static_cast<std::size_t>(idv[k]) * 4 + j]);
      }
    }
    Tensor ids = Tensor::from_vector<std::int64_t>({3, 0, 3, 1, 4, 3}, {2, 3}, dev);
    check_gradients("embedding", [&](const std::vector<Tensor>& in) { return weigh(ops::embedding(ids, in[0])); },
                    {r64({5, 4}, dev, 8)});
    // A float32 table read out in bfloat16: the gradient is float32, the repeated id's rows summed.
    Tensor table = test::random({5, 4}, float32, dev, 9);
    GradientTape tape;
    tape.watch(table);
    Tensor y = ops::embedding(ids, table, bfloat16);
    Tensor dy = Tensor::full({2, 3, 4}, 0.1, bfloat16, dev);
    Tensor g = tape.gradient(ops::sum(ops::cast(ops::mul(y, dy), float32)), {table})[0];
    REQUIRE(g.dtype() == float32);
    const double d = Tensor::scalar(0.1, bfloat16).item();
    const std::vector<double> count = {1, 1, 0, 3, 1};  // uses of each row
    const auto gv = g.to_vector<double>();
    for (std::size_t r = 0; r < 5; ++r)
      for (std::size_t j = 0; j < 4; ++j) CHECK(gv[r * 4 + j] == doctest::Approx(count[r] * d).epsilon(1e-6));
    CHECK_THROWS_WITH_AS(ops::embedding(Tensor::from_vector<std::int64_t>({0, 5}, {2}, dev), table),
                         doctest::Contains("ids must be in [0, 5)"), Error);
    CHECK_THROWS_WITH_AS(ops::embedding(Tensor::from_vector<std::int64_t>({-1}, {1}, dev), table),
                         doctest::Contains("from -1"), Error);
  });
}
