#include "mpt/mixed_precision/policy.hpp"

#include <mutex>

#include "mpt/error.hpp"

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
}  // namespace

void set_global_policy(const Policy& policy) {
  std::lock_guard<std::mutex> lock(g_mutex);
  global() = policy;
}

const Policy& global_policy() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return global();
}

}  // namespace mpt::mixed_precision
