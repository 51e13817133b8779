// Batching: take_rows in every dtype, seeded shuffles that cover each row once per epoch,
// partial and dropped last batches, and the errors for bad input.
#include <algorithm>
#include <numeric>
#include <set>

#include "test_util.hpp"

using namespace mpt;

namespace {

// x [n, 3] float32 with row r = (r, r + 0.25, r + 0.5); y [n] int32 = r.
std::pair<Tensor, Tensor> numbered(std::int64_t n, Device device) {
  std::vector<float> xv;
  std::vector<std::int32_t> yv;
  for (std::int64_t r = 0; r < n; ++r) {
    xv.insert(xv.end(), {float(r), float(r) + 0.25f, float(r) + 0.5f});
    yv.push_back(static_cast<std::int32_t>(r));
  }
  return {Tensor::from_vector(xv, {n, 3}, device), Tensor::from_vector(yv, {n}, device)};
}

// Row ids of a batch, checking that x's rows agree with y.
std::vector<std::int32_t> rows_of(const Tensor& x, const Tensor& y) {
  std::vector<float> xv = x.to_vector<float>();
  std::vector<std::int32_t> yv = y.to_vector<std::int32_t>();
  REQUIRE(xv.size() == 3 * yv.size());
  for (std::size_t i = 0; i < yv.size(); ++i) {
    CHECK(xv[3 * i] == float(yv[i]));
    CHECK(xv[3 * i + 2] == float(yv[i]) + 0.5f);
  }
  return yv;
}

std::vector<std::int32_t> epoch_order(const Tensor& x, const Tensor& y, data::BatchOptions o) {
  std::vector<std::int32_t> order;
  for (auto [xb, yb] : data::batches(x, y, o)) {
    auto r = rows_of(xb, yb);
    order.insert(order.end(), r.begin(), r.end());
  }
  return order;
}

}  // namespace

TEST_CASE("permutation: a seeded Fisher-Yates, the same on every machine") {
  for (std::int64_t n : {0, 1, 2, 7, 1000}) {
    std::vector<std::int64_t> p = data::permutation(n, 42);
    std::vector<std::int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::int64_t> iota(static_cast<std::size_t>(n));
    std::iota(iota.begin(), iota.end(), 0);
    CHECK(sorted == iota);
    CHECK(data::permutation(n, 42) == p);
  }
  CHECK(data::permutation(1000, 1) != data::permutation(1000, 2));
  // Golden values (also computed independently in Python): splitmix64 from the seed, then
  // j = uniform [0, i] by rejection, swapping from the end. They must never change.
  CHECK(data::permutation(10, 123) == std::vector<std::int64_t>{7, 3, 4, 9, 8, 2, 1, 0, 6, 5});
  CHECK_THROWS_AS(data::permutation(-1, 0), mpt::Error);

  // Every position sees every value about equally often (no modulo bias, no stuck element).
  std::vector<int> first(5, 0);
  for (std::uint64_t seed = 0; seed < 5000; ++seed) ++first[static_cast<std::size_t>(data::permutation(5, seed)[0])];
  for (int c : first) CHECK(std::abs(c - 1000) < 150);
}

TEST_CASE("take_rows: gathers rows of any dtype, repeats allowed") {
  mpt::test::for_each_device([](Device device) {
    const std::vector<std::int64_t> idx{3, 0, 3, 1};
    SUBCASE("float32") {
      Tensor x = Tensor::from_vector(std::vector<float>{0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}, device);
      Tensor r = data::take_rows(x, idx);
      CHECK(r.shape() == Shape{4, 2});
      CHECK(r.dtype() == float32);
      CHECK(r.device() == device);
      CHECK(r.to_vector<float>() == std::vector<float>{30, 31, 0, 1, 30, 31, 10, 11});
    }
    SUBCASE("bfloat16") {
      Tensor x = Tensor::from_vector(std::vector<float>{0.5f, -1.5f, 2.25f, 3, 4, 5, 6, 7}, {4, 1, 2}, device)
                     .to(bfloat16);
      Tensor r = data::take_rows(x, idx);
      CHECK(r.shape() == Shape{4, 1, 2});
      CHECK(r.dtype() == bfloat16);
      CHECK(r.to_vector<float>() == std::vector<float>{6, 7, 0.5f, -1.5f, 6, 7, 2.25f, 3});
    }
    SUBCASE("int32") {
      Tensor x = Tensor::from_vector(std::vector<std::int32_t>{-7, 8, 9, 2147483647}, {4}, device);
      Tensor r = data::take_rows(x, idx);
      CHECK(r.shape() == Shape{4});
      CHECK(r.to_vector<std::int32_t>() == std::vector<std::int32_t>{2147483647, -7, 2147483647, 8});
    }
    SUBCASE("empty index list and zero-size rows") {
      Tensor x = Tensor::zeros({4, 3}, float32, device);
      CHECK(data::take_rows(x, {}).shape() == Shape{0, 3});
      Tensor z = Tensor::zeros({4, 0}, float32, device);
      CHECK(data::take_rows(z, {1, 2}).shape() == Shape{2, 0});
    }
    SUBCASE("the result is a copy") {
      Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}, device);
      Tensor r = data::take_rows(x, {0, 1, 2});
      x.assign(Tensor::zeros({3}, float32, device));
      CHECK(r.to_vector<float>() == std::vector<float>{1, 2, 3});
    }
  });
}

TEST_CASE("take_rows: errors") {
  Tensor x = Tensor::zeros({4, 2}, float32, Device::cpu());
  CHECK_THROWS_WITH_AS(data::take_rows(x, {0, 4}), doctest::Contains("index 4"), mpt::Error);
  CHECK_THROWS_WITH_AS(data::take_rows(x, {-1}), doctest::Contains("out of range"), mpt::Error);
  CHECK_THROWS_AS(data::take_rows(Tensor::scalar(1.0, float32, Device::cpu()), {0}), mpt::Error);
  CHECK_THROWS_AS(data::take_rows(Tensor(), {0}), mpt::Error);
}

TEST_CASE("batches: in order, the last batch partial or dropped") {
  mpt::test::for_each_device([](Device device) {
    auto [x, y] = numbered(10, device);
    data::Batches b = data::batches(x, y, {.batch_size = 4});
    REQUIRE(b.size() == 3);
    std::vector<std::int64_t> sizes;
    std::vector<std::int32_t> all;
    for (auto [xb, yb] : b) {
      CHECK(xb.device() == device);
      CHECK(xb.shape()[1] == 3);
      sizes.push_back(xb.shape()[0]);
      auto r = rows_of(xb, yb);
      all.insert(all.end(), r.begin(), r.end());
    }
    CHECK(sizes == std::vector<std::int64_t>{4, 4, 2});
    std::vector<std::int32_t> expect(10);
    std::iota(expect.begin(), expect.end(), 0);
    CHECK(all == expect);

    data::Batches d = data::batches(x, y, {.batch_size = 4, .drop_remainder = true});
    CHECK(d.size() == 2);
    std::int64_t n = 0;
    for (auto [xb, yb] : d) {
      CHECK(xb.shape()[0] == 4);
      n += yb.shape()[0];
    }
    CHECK(n == 8);
    CHECK(data::batches(x, y, {.batch_size = 5, .drop_remainder = true}).size() == 2);
    CHECK(data::batches(x, y, {.batch_size = 11, .drop_remainder = true}).size() == 0);
    CHECK(data::batches(x, y, {.batch_size = 11}).size() == 1);
    CHECK(data::batches(x, y, {.batch_size = 1}).size() == 10);
  });
}

TEST_CASE("batches: a shuffle covers every row exactly once per epoch and follows the seed") {
  mpt::test::for_each_device([](Device device) {
    auto [x, y] = numbered(103, device);
    std::set<std::vector<std::int32_t>> orders;
    for (std::uint64_t epoch = 0; epoch < 5; ++epoch) {
      const data::BatchOptions o{.batch_size = 16, .shuffle = true, .seed = 1000 + epoch};
      std::vector<std::int32_t> order = epoch_order(x, y, o);
      REQUIRE(order.size() == 103);
      std::vector<std::int32_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (int i = 0; i < 103; ++i) CHECK(sorted[static_cast<std::size_t>(i)] == i);
      CHECK(epoch_order(x, y, o) == order);  // same seed, same order
      orders.insert(order);
    }
    CHECK(orders.size() == 5);  // different seeds, different orders
    std::vector<std::int32_t> in_order(103);
    std::iota(in_order.begin(), in_order.end(), 0);
    CHECK(orders.count(in_order) == 0);

    // The order is fixed at construction: iterating one Batches twice gives the same batches.
    data::Batches b = data::batches(x, y, {.batch_size = 16, .shuffle = true, .seed = 7});
    auto first = b.batch(3).second.to_vector<std::int32_t>();
    CHECK(b.batch(3).second.to_vector<std::int32_t>() == first);
    CHECK(b.batch(6).first.shape() == Shape{7, 3});  // 103 = 6 * 16 + 7

    // drop_remainder with a shuffle leaves out 103 % 16 random rows, each at most once.
    std::vector<std::int32_t> dropped =
        epoch_order(x, y, {.batch_size = 16, .shuffle = true, .seed = 9, .drop_remainder = true});
    CHECK(dropped.size() == 96);
    CHECK(std::set<std::int32_t>(dropped.begin(), dropped.end()).size() == 96);
  });
}

TEST_CASE("batches: y may be undefined; other dtypes and ranks; device option") {
  Tensor x = Tensor::arange(0, 24, 1, bfloat16, Device::cpu()).reshape({6, 2, 2});
  int count = 0;
  for (auto [xb, yb] : data::batches(x, Tensor(), {.batch_size = 4, .shuffle = true, .seed = 3})) {
    CHECK_FALSE(yb.defined());
    CHECK(xb.dtype() == bfloat16);
    CHECK(xb.shape()[1] == 2);
    ++count;
  }
  CHECK(count == 2);
  auto [xb, yb] = data::batches(x, Tensor(), {.batch_size = 4, .device = Device::cpu()}).batch(1);
  CHECK(xb.device() == Device::cpu());
  CHECK(xb.to_vector<float>() == std::vector<float>{16, 17, 18, 19, 20, 21, 22, 23});

  // Zero rows: no batches.
  CHECK(data::batches(Tensor::zeros({0, 3}, float32, Device::cpu()), Tensor(), {.batch_size = 4, .shuffle = true})
            .size() == 0);
}

TEST_CASE("batches: errors") {
  auto [x, y] = numbered(10, Device::cpu());
  CHECK_THROWS_WITH_AS(data::batches(x, y, {.batch_size = 0}), doctest::Contains("batch_size must be positive"),
                       mpt::Error);
  CHECK_THROWS_WITH_AS(data::batches(x, y, {.batch_size = -3}), doctest::Contains("batch_size must be positive"),
                       mpt::Error);
  Tensor y9 = y.slice(0, 9);
  try {
    data::batches(x, y9, {.batch_size = 4});
    FAIL(std::string("no error for x/y with different first dimensions"));
  } catch (const mpt::Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("(10, 3)") != std::string::npos);
    CHECK(msg.find("(9,)") != std::string::npos);
  }
  CHECK_THROWS_AS(data::batches(Tensor::scalar(1.0, float32, Device::cpu()), Tensor()), mpt::Error);
  CHECK_THROWS_AS(data::batches(Tensor(), y), mpt::Error);
  data::Batches b = data::batches(x, y, {.batch_size = 4});
  CHECK_THROWS_AS(b.batch(3), mpt::Error);
  CHECK_THROWS_AS(b.batch(-1), mpt::Error);
}
