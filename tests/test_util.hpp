#pragma once
// Shared test helpers: the per-dtype tolerance table, for_each_device, host references and
// the finite-difference gradient checker.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

#include "device/protected_device.hpp"

namespace mpt::test {

/// The message of the mpt::Error that f throws; "(no error)" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

/// A file of tests/data: under $MPT_TEST_DATA_DIR when set (a relocated test tree, e.g. the GPU
/// bundle of scripts/gpu_bundle.sh), else in the source tree the tests were built from.
inline std::string test_data(const std::string& name) {
  const char* dir = std::getenv("MPT_TEST_DATA_DIR");
  return std::string(dir && *dir ? dir : MPT_TEST_DATA_DIR) + "/" + name;
}

/// The default device the library chose at start-up (MPT_DEVICE, else the first GPU, else the
/// CPU); tests/main.cpp then pins the default to the CPU, since tests name their devices.
Device automatic_default_device();

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The global policy and default device for the models built in its scope; float32 and the CPU
/// again when it ends.
struct PolicyDeviceScope {
  PolicyDeviceScope(const std::string& policy, Device device) {
    mixed_precision::set_global_policy(policy);
    set_default_device(device);
  }
  ~PolicyDeviceScope() {
    mixed_precision::set_global_policy("float32");
    set_default_device(Device::cpu());
  }
  PolicyDeviceScope(const PolicyDeviceScope&) = delete;
  PolicyDeviceScope& operator=(const PolicyDeviceScope&) = delete;
};

struct Tolerance {
  double rtol, atol;
};

/// The shape two operands broadcast to (NumPy's rule; the shapes are assumed compatible).
inline Shape broadcast_shape(const Shape& a, const Shape& b) {
  Shape o(std::max(a.size(), b.size()), 1);
  for (std::size_t i = 0; i < o.size(); ++i) {
    const std::int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1, db = i < b.size() ? b[b.size() - 1 - i] : 1;
    o[o.size() - 1 - i] = da == 1 ? db : da;
  }
  return o;
}

/// The one table of tolerances for results computed in a dtype against a float64 reference.
inline Tolerance tolerance(DType d) {
  switch (d) {
    case DType::Float64: return {1e-12, 1e-12};
    case DType::Float32: return {2e-5, 1e-6};
    case DType::Float16: return {4e-3, 1e-4};   // 10 fraction bits: 2^-11 per rounding, a few roundings
    case DType::BFloat16: return {3e-2, 1e-3};  // 7 fraction bits: 2^-8 per rounding
    default: return {0, 0};
  }
}

/// Tolerance of a finite-difference check of float64 gradients.
inline constexpr Tolerance kGradTolerance{1e-6, 1e-8};

inline const std::vector<DType>& float_dtypes() {
  static const std::vector<DType> d{float32, float16, bfloat16, float64};
  return d;
}

/// Runs `f` on the CPU, on the test device (CPU kernels behind memory host code cannot touch:
/// device/protected_device.hpp) and on every GPU this build can use; says so when the GPU half is
/// skipped.
inline void for_each_device(const std::function<void(Device)>& f) {
  SUBCASE("cpu") { f(Device::cpu()); }
  REQUIRE(test_device_registered());
  SUBCASE("test") { f(Device::test()); }
  const int gpus = cuda::device_count();
  if (gpus > 0 && is_available(Device::cuda(0))) {
    for (int i = 0; i < gpus; ++i) {
      SUBCASE(("cuda:" + std::to_string(i)).c_str()) { f(Device::cuda(i)); }
    }
  } else {
    static bool said = false;
    if (!said) {
      said = true;
      MESSAGE("CUDA half skipped: ",
              gpus == 0 ? "no usable GPU (" + cuda::unavailable_reason() + ")"
                        : std::string("mpt was built without the CUDA backend"));
    }
  }
}

/// Element-wise |a - e| <= atol + rtol * |e|, NaN matching NaN and inf matching inf.
inline void check_close(const std::vector<double>& actual, const std::vector<double>& expected, Tolerance tol,
                        const std::string& what) {
  REQUIRE_MESSAGE(actual.size() == expected.size(), what, ": size ", actual.size(), " vs ", expected.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    double a = actual[i], e = expected[i];
    bool ok = (std::isnan(a) && std::isnan(e)) || (std::isinf(e) && a == e) ||
              std::abs(a - e) <= tol.atol + tol.rtol * std::abs(e);
    if (!ok && bad++ == 0) first = i;
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", actual.size(), " elements differ; first at ", first, ": got ",
                bad ? actual[first] : 0.0, ", expected ", bad ? expected[first] : 0.0);
}

inline void check_close(const Tensor& actual, const std::vector<double>& expected, Tolerance tol,
                        const std::string& what) {
  check_close(actual.to_vector<double>(), expected, tol, what);
}

/// Random values of `dtype` (rounded to it), in [lo, hi).
inline Tensor random(const Shape& shape, DType dtype, Device device, std::uint64_t seed, double lo = -2.0,
                     double hi = 2.0) {
  return Tensor::random_uniform(shape, lo, hi, seed, dtype, device);
}

/// Compares the tape's gradient of sum(f(inputs)) with central differences, all in float64.
inline void check_gradients(const std::string& what, const std::function<Tensor(const std::vector<Tensor>&)>& f,
                            std::vector<Tensor> inputs, double eps = 1e-6, Tolerance tol = kGradTolerance) {
  std::vector<Tensor> analytic;
  {
    GradientTape tape;
    for (auto& x : inputs) tape.watch(x);
    Tensor y = ops::sum(f(inputs));
    analytic = tape.gradient(y, inputs);
  }
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    std::vector<double> values = inputs[k].to_vector<double>();
    std::vector<double> numeric(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      auto eval = [&](double v) {
        std::vector<double> changed = values;
        changed[i] = v;
        std::vector<Tensor> in = inputs;
        in[k] = Tensor::from_vector(changed, inputs[k].shape(), inputs[k].device());
        return ops::sum(f(in)).item();
      };
      numeric[i] = (eval(values[i] + eps) - eval(values[i] - eps)) / (2 * eps);
    }
    REQUIRE_MESSAGE(analytic[k].defined(), what, ": no gradient for input ", k);
    CHECK(analytic[k].dtype() == float64);
    check_close(analytic[k], numeric, tol, what + ": d/d(input " + std::to_string(k) + ")");
  }
}

}  // namespace mpt::test
