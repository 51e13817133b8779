// Every invalid call raises mpt::Error, and the message names the op and what it was given
// (shapes, dtypes, axes, values), so that a user can tell what went wrong without a debugger.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

#include "test_util.hpp"

using namespace mpt;
using mpt::test::for_each_device;

namespace {

/// Runs f once more to read the message: it must be an mpt::Error containing every part.
void check_message(const char* expr, const std::function<void()>& f, std::initializer_list<std::string> parts) {
  std::string msg;
  bool mpt_error = false;
  try {
    f();
    msg = "<nothing thrown>";
  } catch (const Error& e) {
    mpt_error = true;
    msg = e.what();
  } catch (const std::exception& e) {
    msg = std::string("<not an mpt::Error> ") + e.what();
  }
  if (!mpt_error) return;  // CHECK_THROWS_AS already reported it
  for (const std::string& p : parts)
    CHECK_MESSAGE(msg.find(p) != std::string::npos, std::string(expr), ": message \"", msg, "\" does not contain \"", p, "\"");
}

}  // namespace

/// expr must throw mpt::Error whose what() contains each of the strings that follow.
#define CHECK_MPT_ERROR(expr, ...)                                   \
  do {                                                               \
    CHECK_THROWS_AS((void)(expr), mpt::Error);                       \
    check_message(#expr, [&] { (void)(expr); }, {__VA_ARGS__});      \
  } while (0)

TEST_CASE("elementwise ops: non-broadcastable shapes and mismatched dtypes") {
  for_each_device([](Device dev) {
    Tensor a = Tensor::ones({2, 3}, float32, dev);
    Tensor b = Tensor::ones({4}, float32, dev);
    Tensor c = Tensor::ones({3, 3}, float32, dev);
    CHECK_MPT_ERROR(ops::add(a, b), "add", "(2, 3)", "(4,)");
    CHECK_MPT_ERROR(a + c, "add", "(2, 3)", "(3, 3)");
    CHECK_MPT_ERROR(ops::sub(a, b), "sub", "(2, 3)", "(4,)");
    CHECK_MPT_ERROR(ops::mul(c, a), "mul", "(3, 3)", "(2, 3)");
    CHECK_MPT_ERROR(ops::div(a, b), "div", "(2, 3)", "(4,)");
    CHECK_MPT_ERROR(ops::maximum(a, b), "maximum", "(2, 3)", "(4,)");
    CHECK_MPT_ERROR(ops::pow(a, b), "pow", "(2, 3)", "(4,)");
    CHECK_MPT_ERROR(ops::less(a, c), "less", "(2, 3)", "(3, 3)");
    CHECK_MPT_ERROR(ops::broadcast_to(a, {3, 3}), "broadcast_to", "(2, 3)", "(3, 3)");
    CHECK_MPT_ERROR(ops::broadcast_to(a, {1, 3}), "broadcast_to", "(2, 3)", "(1, 3)");
    CHECK_MPT_ERROR(ops::sum_to(a, {4}), "sum_to", "(2, 3)", "(4,)");

    Tensor h = Tensor::ones({2, 3}, float16, dev);
    CHECK_MPT_ERROR(ops::add(a, h), "add", "float32", "float16", "(2, 3)");
    CHECK_MPT_ERROR(a * h, "mul", "float32", "float16");
    CHECK_MPT_ERROR(ops::equal(a, Tensor::ones({2, 3}, int32, dev)), "equal", "float32", "int32");
    CHECK_MPT_ERROR(ops::minimum(h, Tensor::ones({2, 3}, bfloat16, dev)), "minimum", "float16", "bfloat16");
    // Same shapes and dtypes work (the error above is not a blanket failure).
    CHECK((a + a).to_vector<float>() == std::vector<float>(6, 2.f));
    CHECK(ops::add(a, Tensor::ones({3}, float32, dev)).shape() == Shape{2, 3});
  });
}

TEST_CASE("matmul: inner dimensions, rank, batch dimensions and dtypes") {
  for_each_device([](Device dev) {
    Tensor a = Tensor::ones({2, 3}, float32, dev);
    Tensor b = Tensor::ones({4, 5}, float32, dev);
    CHECK_MPT_ERROR(ops::matmul(a, b), "matmul", "inner", "(2, 3)", "(4, 5)", "3 vs 4");
    CHECK_MPT_ERROR(ops::matmul(a, a), "matmul", "(2, 3)");
    CHECK_MPT_ERROR(ops::matmul(a, a, true, true), "matmul", "(2, 3)", "transposed");
    CHECK(ops::matmul(a, a, false, true).shape() == Shape{2, 2});  // a . a^T is fine
    CHECK(ops::matmul(a, a, true, false).shape() == Shape{3, 3});

    Tensor v = Tensor::ones({3}, float32, dev);
    CHECK_MPT_ERROR(ops::matmul(v, Tensor::ones({3, 2}, float32, dev)), "matmul", "rank", "(3,)");
    CHECK_MPT_ERROR(ops::matmul(a, v), "matmul", "rank", "(3,)");
    CHECK_MPT_ERROR(ops::matmul(Tensor::scalar(1, float32, dev), a), "matmul", "rank", "()");

    CHECK_MPT_ERROR(ops::matmul(Tensor::ones({2, 2, 3}, float32, dev), Tensor::ones({5, 3, 4}, float32, dev)),
                    "matmul", "batch", "(2,)", "(5,)");
    CHECK_MPT_ERROR(ops::matmul(a, Tensor::ones({3, 2}, float16, dev)), "matmul", "float32", "float16");
    CHECK_MPT_ERROR(ops::matmul(Tensor::ones({2, 3}, int32, dev), Tensor::ones({3, 2}, int32, dev)), "matmul",
                    "int32", "(2, 3)");
  });
}

TEST_CASE("dense: kernel and bias shapes, dtypes, unknown activations") {
  for_each_device([](Device dev) {
    Tensor x = Tensor::ones({2, 3}, float32, dev);
    Tensor w = Tensor::ones({3, 4}, float32, dev);
    Tensor b = Tensor::ones({4}, float32, dev);
    CHECK(ops::dense(x, w, b).shape() == Shape{2, 4});

    CHECK_MPT_ERROR(ops::dense(x, Tensor::ones({5, 4}, float32, dev), b), "dense", "(2, 3)", "(5, 4)");
    CHECK_MPT_ERROR(ops::dense(x, Tensor::ones({3}, float32, dev)), "dense", "kernel", "(3,)");
    CHECK_MPT_ERROR(ops::dense(x, Tensor::ones({1, 3, 4}, float32, dev)), "dense", "kernel", "(1, 3, 4)");
    CHECK_MPT_ERROR(ops::dense(x, w, Tensor::ones({3}, float32, dev)), "dense", "bias", "(3,)", "(3, 4)");
    CHECK_MPT_ERROR(ops::dense(x, w, Tensor::ones({1, 4}, float32, dev)), "dense", "bias", "(1, 4)");
    CHECK_MPT_ERROR(ops::dense(x, w, Tensor::ones({4}, float16, dev)), "dense", "float32", "float16");
    CHECK_MPT_ERROR(ops::dense(x, Tensor::ones({3, 4}, bfloat16, dev)), "dense", "float32", "bfloat16");
    CHECK_MPT_ERROR(ops::dense(x, w, b, "relu7"), "dense", "relu7", "relu6", "gelu");
    CHECK_MPT_ERROR(ops::dense(x, w, b, "ReLU"), "dense", "ReLU");
    CHECK_MPT_ERROR(ops::activation(x, "leaky"), "activation", "leaky");
  });
}

TEST_CASE("bad axes in reductions, softmax, argmax, transpose, concat and slice") {
  for_each_device([](Device dev) {
    Tensor x = Tensor::ones({2, 3}, float32, dev);
    CHECK_MPT_ERROR(ops::sum(x, {2}), "sum", "axis 2", "rank 2");
    CHECK_MPT_ERROR(ops::sum(x, {-3}), "sum", "axis -3", "rank 2");
    CHECK_MPT_ERROR(ops::sum(x, {0, 0}), "sum", "repeated");
    CHECK_MPT_ERROR(ops::sum(x, {1, -1}), "sum", "repeated");  // -1 is axis 1
    CHECK_MPT_ERROR(ops::mean(x, {5}), "mean", "axis 5");
    CHECK_MPT_ERROR(ops::max(x, {-4}, true), "max", "axis -4");
    CHECK_MPT_ERROR(ops::min(Tensor::scalar(1, float32, dev), {0}), "min", "axis 0", "rank 0");
    CHECK_MPT_ERROR(ops::softmax(x, 2), "softmax", "axis 2");
    CHECK_MPT_ERROR(ops::log_softmax(x, -3), "log_softmax", "axis -3");
    CHECK_MPT_ERROR(ops::softmax(Tensor::scalar(1, float32, dev)), "softmax", "rank");
    CHECK_MPT_ERROR(ops::argmax(x, 2), "argmax", "axis 2");
    CHECK_MPT_ERROR(ops::argmax(Tensor::zeros({0, 3}, float32, dev), 0), "argmax", "empty", "(0, 3)");
    CHECK_MPT_ERROR(ops::max(Tensor::zeros({0, 3}, float32, dev), {0}), "max", "empty", "(0, 3)");
    CHECK_MPT_ERROR(ops::transpose(x, {0, 2}), "transpose", "axis 2");
    CHECK_MPT_ERROR(ops::transpose(x, {1, 1}), "transpose", "repeated");
    CHECK_MPT_ERROR(ops::transpose(x, {0, 1, 2}), "transpose", "length 3", "(2, 3)");
    CHECK_MPT_ERROR(ops::transpose(x, {0}), "transpose", "length 1", "(2, 3)");
    CHECK_MPT_ERROR(ops::concat({x, x}, 2), "concat", "axis 2");
    CHECK_MPT_ERROR(ops::concat({x, x}, -3), "concat", "axis -3");
    CHECK_MPT_ERROR(ops::slice(x, 3, 0, 1), "slice", "axis 3");
    // Valid negative axes are accepted.
    CHECK(ops::sum(x, {-1}).shape() == Shape{2});
    CHECK(ops::concat({x, x}, -1).shape() == Shape{2, 6});
  });
}

TEST_CASE("concat of incompatible tensors, slices out of range") {
  for_each_device([](Device dev) {
    Tensor a = Tensor::ones({2, 3}, float32, dev);
    CHECK_MPT_ERROR(ops::concat({a, Tensor::ones({2, 4}, float32, dev)}, 0), "concat", "(2, 3)", "(2, 4)",
                    "axis 0");
    CHECK_MPT_ERROR(ops::concat({a, Tensor::ones({3, 3}, float32, dev)}, 1), "concat", "(2, 3)", "(3, 3)",
                    "axis 1");
    CHECK_MPT_ERROR(ops::concat({a, Tensor::ones({6}, float32, dev)}, 0), "concat", "(2, 3)", "(6,)");
    CHECK_MPT_ERROR(ops::concat({a, a, Tensor::ones({2, 3}, float64, dev)}, 0), "concat", "float32", "float64");
    CHECK_MPT_ERROR(ops::concat({}, 0), "concat", "no tensors");
    CHECK_MPT_ERROR(ops::concat({Tensor::scalar(1, float32, dev), Tensor::scalar(2, float32, dev)}), "concat",
                    "0-d");
    CHECK(ops::concat({a, Tensor::ones({1, 3}, float32, dev)}, 0).shape() == Shape{3, 3});

    CHECK_MPT_ERROR(ops::slice(a, 1, 2, 5), "slice", "[2, 5)", "axis 1", "(2, 3)");
    CHECK_MPT_ERROR(ops::slice(a, 0, -1, 1), "slice", "[-1, 1)", "(2, 3)");
    CHECK_MPT_ERROR(ops::slice(a, 0, 2, 1), "slice", "[2, 1)", "(2, 3)");
    CHECK_MPT_ERROR(a.slice(1, 3), "slice", "(2, 3)");
    CHECK(ops::slice(a, 1, 3, 3).shape() == Shape{2, 0});
  });
}

TEST_CASE("softmax_cross_entropy: labels out of range, negative, misshapen or of the wrong type") {
  for_each_device([](Device dev) {
    Tensor logits = Tensor::zeros({2, 3}, float32, dev);
    const char* op = "softmax_cross_entropy";
    if (dev.is_cpu()) {  // labels in host memory: checked for free
      CHECK_MPT_ERROR(ops::softmax_cross_entropy(logits, Tensor::from_vector({0, 3}, {}, dev)), op, "label 3",
                      "index 1", "[0, 3)");
      CHECK_MPT_ERROR(ops::softmax_cross_entropy(logits, Tensor::from_vector({std::int64_t{-1}, std::int64_t{0}}, {}, dev)),
                      op, "label -1", "index 0");
      CHECK_MPT_ERROR(ops::softmax_cross_entropy(logits, Tensor::from_vector<std::uint8_t>({1, 200}, {}, dev)), op,
                      "label 200");
    } else {  // on a device a check would read the labels back every step: the row's loss is NaN
      auto loss = ops::softmax_cross_entropy(logits, Tensor::from_vector({0, 3}, {}, dev)).to_vector<double>();
      CHECK(std::abs(loss[0] - std::log(3.0)) < 1e-6);
      CHECK(std::isnan(loss[1]));
      loss = ops::softmax_cross_entropy(logits, Tensor::from_vector({std::int64_t{-1}, std::int64_t{0}}, {}, dev))
                 .to_vector<double>();
      CHECK(std::isnan(loss[0]));
      CHECK_FALSE(std::isnan(loss[1]));
    }
    // Sparse labels shaped unlike the loss.
    CHECK_MPT_ERROR(ops::softmax_cross_entropy(logits, Tensor::from_vector({0, 1, 2}, {}, dev)), op, "(3,)",
                    "(2, 3)", "(2,)");
    CHECK_MPT_ERROR(ops::softmax_cross_entropy(logits, Tensor::zeros({2, 2}, int32, dev)), op, "(2, 2)", "(2, 3)");
    // One-hot labels shaped unlike the predictions.
    CHECK_MPT_ERROR(ops::softmax_cross_entropy(logits, Tensor::zeros({2, 4}, float32, dev)), op, "(2, 4)",
                    "(2, 3)");
    CHECK_MPT_ERROR(ops::softmax_cross_entropy(logits, Tensor::zeros({3}, float32, dev)), op, "(3,)", "(2, 3)");
    CHECK_MPT_ERROR(ops::softmax_cross_entropy(logits, Tensor::zeros({2}, bool_, dev)), op, "bool");
    CHECK_MPT_ERROR(ops::softmax_cross_entropy(Tensor::zeros({2, 3}, int32, dev), Tensor::zeros({2}, int32, dev)),
                    op, "int32", "(2, 3)");
    CHECK_MPT_ERROR(ops::softmax_cross_entropy(Tensor::zeros({2, 0}, float32, dev), Tensor::zeros({2}, int32, dev)),
                    op, "(2, 0)");
    // The valid forms work: [N] ids, [N, 1] ids, one-hot [N, C].
    CHECK(ops::softmax_cross_entropy(logits, Tensor::from_vector({0, 2}, {}, dev)).shape() == Shape{2});
    CHECK(ops::softmax_cross_entropy(logits, Tensor::from_vector({0, 2}, {2, 1}, dev)).shape() == Shape{2});
    CHECK(std::abs(ops::softmax_cross_entropy(logits, Tensor::from_vector({2, 2}, {}, dev)).to_vector<double>()[0] -
                   std::log(3.0)) < 1e-6);
  });
}

TEST_CASE("dtype restrictions: float-only ops, bool conditions, integer division by zero is 0, one_hot") {
  for_each_device([](Device dev) {
    Tensor i = Tensor::from_vector({1, 2, 3}, {}, dev);
    CHECK_MPT_ERROR(ops::exp(i), "exp", "int32", "(3,)");
    CHECK_MPT_ERROR(ops::log(i), "log", "int32");
    CHECK_MPT_ERROR(ops::sqrt(Tensor::ones({2}, int64, dev)), "sqrt", "int64");
    CHECK_MPT_ERROR(ops::sigmoid(i), "sigmoid", "int32");
    CHECK_MPT_ERROR(ops::tanh(Tensor::ones({2}, uint8, dev)), "tanh", "uint8");
    CHECK_MPT_ERROR(ops::gelu(i), "gelu", "int32");
    CHECK_MPT_ERROR(ops::softmax(i), "softmax", "int32");
    CHECK_MPT_ERROR(ops::pow(i, 2.0), "pow", "int32");
    CHECK_MPT_ERROR(ops::neg(Tensor::ones({2}, bool_, dev)), "neg", "bool");
    CHECK_MPT_ERROR(ops::add(Tensor::ones({2}, bool_, dev), Tensor::ones({2}, bool_, dev)), "add", "bool");
    CHECK_MPT_ERROR(ops::sum(Tensor::ones({2}, bool_, dev)), "sum", "bool");
    // Integer ops that are defined still work.
    CHECK((i * i).to_vector<int>() == std::vector<int>{1, 4, 9});
    CHECK(ops::abs(-i).to_vector<int>() == std::vector<int>{1, 2, 3});

    Tensor a = Tensor::from_vector({1.f, 2.f}, {}, dev);
    Tensor b = Tensor::from_vector({3.f, 4.f}, {}, dev);
    CHECK_MPT_ERROR(ops::where(Tensor::from_vector({1, 0}, {}, dev), a, b), "where", "bool", "int32");
    CHECK_MPT_ERROR(ops::where(a, a, b), "where", "bool", "float32");
    CHECK_MPT_ERROR(ops::where(Tensor::from_vector({true, false, true}, {}, dev), a, b), "where", "(3,)", "(2,)");
    CHECK_MPT_ERROR(ops::where(Tensor::from_vector({true, false}, {}, dev), a, b.to(float64)), "where", "float32",
                    "float64");
    CHECK(ops::where(Tensor::from_vector({true, false}, {}, dev), a, b).to_vector<float>() ==
          std::vector<float>{1, 4});

    Tensor num = Tensor::from_vector({6, 7, 8}, {}, dev);
    // Integer division by zero gives 0, as NumPy's (checking would read the divisor back from the device).
    CHECK(ops::div(num, Tensor::from_vector({1, 0, 2}, {}, dev)).to_vector<int>() == std::vector<int>{6, 0, 4});
    CHECK((num / 0.0).to_vector<int>() == std::vector<int>{0, 0, 0});
    CHECK(ops::div(Tensor::ones({2}, int64, dev), Tensor::zeros({1}, int64, dev)).to_vector<std::int64_t>() ==
          std::vector<std::int64_t>{0, 0});
    CHECK((num / Tensor::from_vector({2, -7, 3}, {}, dev)).to_vector<int>() == std::vector<int>{3, -1, 2});
    // Float division by zero is IEEE inf, not an error.
    CHECK(std::isinf((a / 0.0).to_vector<float>()[0]));

    CHECK_MPT_ERROR(ops::one_hot(a, 3), "one_hot", "integer", "float32");
    CHECK_MPT_ERROR(ops::one_hot(Tensor::from_vector({true}, {}, dev), 3), "one_hot", "bool");
    CHECK_MPT_ERROR(ops::one_hot(i, 0), "one_hot", "depth", "0");
    CHECK_MPT_ERROR(ops::one_hot(i, -2), "one_hot", "depth", "-2");
    CHECK(ops::one_hot(i, 4).to_vector<float>() == std::vector<float>{0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1});

    CHECK_MPT_ERROR(GradientTape().watch(i), "watch", "int32");
  });
}

TEST_CASE("reshape to an incompatible size") {
  for_each_device([](Device dev) {
    Tensor x = Tensor::ones({2, 3}, float32, dev);
    CHECK_MPT_ERROR(ops::reshape(x, {4, 2}), "reshape", "(2, 3)", "(4, 2)", "6 elements");
    CHECK_MPT_ERROR(x.reshape({7}), "reshape", "(2, 3)", "(7,)");
    CHECK_MPT_ERROR(x.reshape({-1, 4}), "reshape", "(2, 3)", "(-1, 4)");
    CHECK_MPT_ERROR(x.reshape({-1, -1}), "reshape", "more than one -1");
    CHECK_MPT_ERROR(x.reshape({3, -2}), "reshape", "(3, -2)");
  });
}

TEST_CASE("undefined tensors passed to ops are named errors, not crashes") {
  const Tensor u;
  Tensor x = Tensor::ones({2, 2});
  CHECK_MPT_ERROR(ops::add(u, x), "add", "undefined");
  CHECK_MPT_ERROR(ops::mul(x, u), "mul", "undefined");
  CHECK_MPT_ERROR(ops::div(x, u), "div", "undefined");
  CHECK_MPT_ERROR(ops::div(u, Tensor::ones({2}, int32)), "div", "undefined");
  CHECK_MPT_ERROR(ops::exp(u), "exp", "undefined");
  CHECK_MPT_ERROR(ops::neg(u), "neg", "undefined");
  CHECK_MPT_ERROR(ops::pow(u, 2.0), "pow", "undefined");
  CHECK_MPT_ERROR(ops::matmul(x, u), "matmul", "undefined");
  CHECK_MPT_ERROR(ops::dense(u, x), "dense", "undefined");
  CHECK_MPT_ERROR(ops::sum(u), "sum", "undefined");
  CHECK_MPT_ERROR(ops::argmax(u), "argmax", "undefined");
  CHECK_MPT_ERROR(ops::sum_to(u, {1}), "sum_to", "undefined");
  CHECK_MPT_ERROR(ops::broadcast_to(u, {2}), "broadcast_to", "undefined");
  CHECK_MPT_ERROR(ops::softmax(u), "softmax", "undefined");
  CHECK_MPT_ERROR(ops::softmax_cross_entropy(x, u), "softmax_cross_entropy", "labels", "undefined");
  CHECK_MPT_ERROR(ops::softmax_cross_entropy(u, x), "softmax_cross_entropy", "undefined");
  CHECK_MPT_ERROR(ops::where(u, x, x), "where", "undefined");
  CHECK_MPT_ERROR(ops::cast(u, float16), "cast", "undefined");
  CHECK_MPT_ERROR(ops::reshape(u, {4}), "reshape", "undefined");
  CHECK_MPT_ERROR(ops::transpose(u), "transpose", "undefined");
  CHECK_MPT_ERROR(ops::concat({x, u}), "concat", "undefined");
  CHECK_MPT_ERROR(ops::concat({u, x}), "concat", "undefined");
  CHECK_MPT_ERROR(ops::slice(u, 0, 0, 1), "slice", "undefined");
  CHECK_MPT_ERROR(ops::one_hot(u, 2), "one_hot", "undefined");
  CHECK_MPT_ERROR(ops::has_nonfinite(u), "has_nonfinite", "undefined");
  CHECK_MPT_ERROR(u + 1.0, "undefined");
  CHECK_MPT_ERROR(u.shape(), "undefined");
  CHECK_MPT_ERROR(u.item(), "undefined");
  CHECK_MPT_ERROR(u.slice(0, 1), "undefined");
  CHECK_MPT_ERROR(x.assign(u), "undefined");
  Tensor v;
  CHECK_MPT_ERROR(GradientTape().watch(v), "watch", "undefined");
  CHECK_MPT_ERROR(GradientTape().gradient(u, {x}), "gradient", "undefined");
  CHECK_MPT_ERROR(GradientTape().gradient(ops::sum(x), {u}), "gradient", "undefined");
}

TEST_CASE("Tensor::item needs exactly one element") {
  CHECK_MPT_ERROR(Tensor::ones({2, 3}).item(), "item", "(2, 3)");
  CHECK_MPT_ERROR(Tensor::ones({0}).item(), "item", "(0,)");
  CHECK(Tensor::ones({1, 1}).item() == 1.0);
}

TEST_CASE("tensors on a GPU that is not there are errors, not crashes") {
  if (cuda::device_count() > 0) {
    // With a GPU, only an index past the last one is missing.
    const int n = cuda::device_count();
    CHECK_MPT_ERROR(Tensor::zeros({2}, float32, Device::cuda(n)), "cuda:" + std::to_string(n));
    return;
  }
  const Device gpu = Device::cuda(0);
  CHECK_FALSE(is_available(gpu));
  CHECK_MPT_ERROR(Tensor::empty({2, 3}, float32, gpu), "cuda:0");
  CHECK_MPT_ERROR(Tensor::zeros({4}, float16, gpu), "cuda:0");
  CHECK_MPT_ERROR(Tensor::ones({4}, float32, gpu), "cuda:0");
  CHECK_MPT_ERROR(Tensor::full({1}, 2.0, int32, gpu), "cuda:0");
  CHECK_MPT_ERROR(Tensor::scalar(1.0, float32, gpu), "cuda:0");
  CHECK_MPT_ERROR(Tensor::arange(0, 10, 1, float32, gpu), "cuda:0");
  CHECK_MPT_ERROR(Tensor::random_normal({8}, 0, 1, 1, float32, gpu), "cuda:0");
  CHECK_MPT_ERROR(Tensor::random_uniform({8}, 0, 1, 1, bfloat16, gpu), "cuda:0");
  CHECK_MPT_ERROR(Tensor::from_vector({1.f, 2.f}, {}, gpu), "cuda:0");
  CHECK_MPT_ERROR(Tensor::ones({2}).to(gpu), "cuda:0");
  CHECK_MPT_ERROR(Tensor::empty({0}, float32, gpu), "cuda:0");  // even with no bytes to allocate
  CHECK_MPT_ERROR(Tensor::zeros({3, 0}, float32, gpu), "cuda:0");
  CHECK_MPT_ERROR(Tensor::zeros({2}, float32, Device::cuda(1)), "cuda:1");
  CHECK_MPT_ERROR(Tensor::zeros({2}, float32, Device::cuda(-1)), "cuda:-1");
  CHECK_MPT_ERROR(Tensor::zeros({2}, float32, Device::cuda(99)), "cuda:99");
  CHECK_MPT_ERROR(set_default_device(gpu), "cuda:0");
  // Nothing was left half-made: the CPU keeps working and the default device is unchanged.
  CHECK(default_device() == Device::cpu());
  CHECK(memory_stats(gpu).current_bytes == 0);
  CHECK((Tensor::ones({2}) + 1.0).to_vector<float>() == std::vector<float>{2, 2});
}
