#pragma once
// The values Backend::random stores: element i of a Philox stream scaled to the distribution's
// parameters, with explicit fma so every compiler rounds the same way.
#include <cmath>
#include <cstdint>

#include "backend/common/philox.hpp"

namespace mpt::kernels {

/// Uniform in (a, b) (a or b exactly only by rounding when the range is tiny).
MPT_HOST_DEVICE inline double uniform_value(std::uint64_t seed, std::uint64_t offset, std::uint64_t i, double a,
                                            double b) {
  return fma(b - a, uniform_at(seed, offset, i), a);
}

/// Normal with the given mean and standard deviation.
MPT_HOST_DEVICE inline double normal_value(std::uint64_t seed, std::uint64_t offset, std::uint64_t i, double mean,
                                           double stddev) {
  return fma(stddev, normal_at(seed, offset, i), mean);
}

}  // namespace mpt::kernels
