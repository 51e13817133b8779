#pragma once
/// Dtype policies, exactly Keras's: a compute dtype for a layer's math and a variable dtype
/// for its weights.
///
///   mpt::mixed_precision::set_global_policy("mixed_bfloat16");
///   mpt::mixed_precision::Policy p = mpt::mixed_precision::global_policy();
///   p.compute_dtype();   // bfloat16
///   p.variable_dtype();  // float32
#include <string>
#include <vector>

#include "mpt/dtype.hpp"

namespace mpt::mixed_precision {

class Policy {
 public:
  /// float32, float64, float16, bfloat16, mixed_float16, mixed_bfloat16; any other name is an
  /// mpt::Error listing these.
  Policy(const std::string& name = "float32");  // NOLINT: implicit, a name is a policy
  Policy(const char* name) : Policy(std::string(name)) {}  // NOLINT
  const std::string& name() const { return name_; }
  DType compute_dtype() const { return compute_; }
  DType variable_dtype() const { return variable_; }
  /// compute dtype differs from variable dtype.
  bool is_mixed() const { return compute_ != variable_; }
  friend bool operator==(const Policy& a, const Policy& b) { return a.name_ == b.name_; }

  static const std::vector<std::string>& valid_names();

 private:
  std::string name_;
  DType compute_, variable_;
};

void set_global_policy(const Policy& policy);
const Policy& global_policy();

}  // namespace mpt::mixed_precision
