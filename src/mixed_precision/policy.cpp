#include "mpt/mixed_precision/policy.hpp"

#include <mutex>
#include <set>
#include <utility>

#include "mpt/device.hpp"
#include "mpt/error.hpp"
#include "mpt/log.hpp"

namespace mpt::mixed_precision {

const std::vector<std::string>& Policy::valid_names() {
  static const std::vector<std::string> names{"float32", "float64", "float16", "bfloat16", "mixed_float16",
                                              "mixed_bfloat16"};
  return names;
}

Policy::Policy(const std::string& name) : name_(name) {
  if (name == "mixed_float16") compute_ = float16, variable_ = float32;
  else if (name == "mixed_bfloat16") compute_ = bfloat16, variable_ = float32;
  else if (name == "float32" || name == "float64" || name == "float16" || name == "bfloat16")
    compute_ = variable_ = dtype_from_string(name);
  else {
    std::string valid;
    for (const auto& n : valid_names()) valid += (valid.empty() ? "" : ", ") + n;
    fail("Policy: unknown dtype policy '", name, "'; valid policies: ", valid);
  }
}

namespace {
std::mutex g_mutex;
Policy& global() {
  static Policy p("float32");
  return p;
}

// Keras's mixed precision compatibility check: once per process and (GPU, dtype), a warning when
// the default device is a GPU without tensor cores for the policy's compute dtype.
void check_compatibility(DType compute) {
  if (compute != float16 && compute != bfloat16) return;
  if (!cuda::built_with_cuda() || cuda::device_count() == 0) return;
  static std::mutex mutex;
  static std::set<std::pair<int, DType>> checked;
  std::string warning;
  try {
    const Device device = default_device();
    if (!device.is_cuda()) return;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!checked.insert({device.index, compute}).second) return;
    }
    warning = cuda::capability_warning(device.index, compute);
  } catch (const Error&) {
    return;  // a bad MPT_DEVICE or a failed query is reported where tensors are made, not here
  }
  if (warning.rfind("mpt: ", 0) == 0) warning.erase(0, 5);  // the logger adds its own prefix
  if (!warning.empty()) mpt::log(LogLevel::warning, warning);
}
}  // namespace

void set_global_policy(const Policy& policy) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    global() = policy;
  }
  check_compatibility(policy.compute_dtype());
}

const Policy& global_policy() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return global();
}

}  // namespace mpt::mixed_precision
