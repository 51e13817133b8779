// mpt::cuda device queries: they must work (and agree) with or without a GPU, driver or CUDA build.
#include <doctest/doctest.h>

#include <string>

#include "mpt/device.hpp"
#include "mpt/error.hpp"

TEST_CASE("cuda::device_count agrees with built_with_cuda and unavailable_reason") {
  const int n = mpt::cuda::device_count();
  CHECK(n >= 0);
  CHECK(mpt::cuda::device_count() == n);  // cached, stable
  if (!mpt::cuda::built_with_cuda()) {
    CHECK(n == 0);
    CHECK(mpt::cuda::unavailable_reason() == "built without CUDA");
  }
  if (n == 0) {
    const std::string why = mpt::cuda::unavailable_reason();
    CHECK_FALSE(why.empty());
    MESSAGE("no usable GPU: GPU checks skipped (" << why << ")");
  } else {
    CHECK(mpt::cuda::built_with_cuda());
    CHECK(mpt::cuda::unavailable_reason().empty());
  }
}

TEST_CASE("cuda::device_info describes every GPU") {
  const int n = mpt::cuda::device_count();
  for (int i = 0; i < n; ++i) {
    const mpt::cuda::DeviceInfo info = mpt::cuda::device_info(i);
    CAPTURE(i);
    CHECK(info.index == i);
    CHECK_FALSE(info.name.empty());
    CHECK(info.major >= 3);
    CHECK(info.minor >= 0);
    CHECK(info.total_memory > 0);
    CHECK(info.multiprocessors > 0);
    MESSAGE("GPU " << i << ": " << info.name << ", sm_" << info.major << info.minor << ", "
                   << (info.total_memory >> 20) << " MiB, " << info.multiprocessors << " SMs");
  }
}

TEST_CASE("cuda::device_info rejects an index that does not exist") {
  const int n = mpt::cuda::device_count();
  CHECK_THROWS_AS(mpt::cuda::device_info(n), mpt::Error);
  CHECK_THROWS_AS(mpt::cuda::device_info(-1), mpt::Error);
  try {
    mpt::cuda::device_info(n);
  } catch (const mpt::Error& e) {
    const std::string what = e.what();
    CHECK(what.find(std::to_string(n)) != std::string::npos);  // names the index / count
  }
}
