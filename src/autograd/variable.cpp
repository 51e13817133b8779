#include "mpt/variable.hpp"

#include <map>
#include <mutex>

#include "mpt/autograd.hpp"

namespace mpt {

struct Variable::State {
  Tensor value;
  std::string name, path;
  bool trainable = true;
  std::uint64_t version = 0;
  std::map<DType, std::pair<std::uint64_t, Tensor>> casts;  // dtype -> (version, cast value)
  DType last_cast = float32;                                 // set at construction, then by read()
  std::mutex mutex;
};

Variable::Variable(const Tensor& initial, std::string name, bool trainable) : state_(std::make_shared<State>()) {
  MPT_CHECK(initial.defined(), "Variable '", name, "': undefined initial value");
  state_->value = initial.detach().copy();
  state_->name = name;
  state_->path = std::move(name);
  state_->trainable = trainable;
  state_->last_cast = state_->value.dtype();
  state_->value.set_requires_grad(trainable && is_floating(initial.dtype()));
}

const Tensor& Variable::value() const {
  MPT_CHECK(state_ != nullptr, "Variable: use of an undefined variable");
  return state_->value;
}

Tensor Variable::read(DType dtype) const {
  const Tensor& v = value();
  if (dtype == v.dtype()) return v;
  Tensor cached;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->last_cast = dtype;
    auto& slot = state_->casts[dtype];
    if (!slot.second.defined() || slot.first != state_->version) {
      NoGradGuard no_grad;
      slot = {state_->version, v.to(dtype)};
    }
    cached = slot.second;
  }
  // A fresh handle on the cached data, connected to the stored tensor like a cast op.
  Tensor out = cached.detach();
  // The gradient passes through: the tape converts it to the variable's dtype (or keeps the
  // compute dtype, GradientTapeOptions::keep_source_gradient_dtype).
  autograd::record("read_variable", {v}, {&out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

void Variable::assign(const Tensor& v) const {
  NoGradGuard no_grad;
  value();
  state_->value.assign(v);
  mark_modified();
}

void Variable::mark_modified() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  ++state_->version;
}

void Variable::mark_modified(const Tensor& cast) const {
  const Tensor& v = value();
  MPT_CHECK(cast.defined() && cast.shape() == v.shape() && cast.device() == v.device(), "Variable '", state_->path,
            "': mark_modified: the cast ", cast.defined() ? to_string(cast.shape()) + " on " + cast.device().str()
                                                         : std::string("(undefined)"),
            " does not match the variable's ", to_string(v.shape()), " on ", v.device().str());
  std::lock_guard<std::mutex> lock(state_->mutex);
  ++state_->version;
  if (cast.dtype() != v.dtype()) state_->casts[cast.dtype()] = {state_->version, cast.detach()};
}

DType Variable::last_cast_dtype() const {
  value();
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->last_cast;
}

const std::string& Variable::name() const { return value(), state_->name; }
const std::string& Variable::path() const { return value(), state_->path; }
void Variable::set_path(const std::string& path) const { value(), state_->path = path; }
bool Variable::trainable() const { return value(), state_->trainable; }
void Variable::set_trainable(bool on) const {
  value();
  state_->trainable = on;
  state_->value.set_requires_grad(on && is_floating(state_->value.dtype()));
}
std::uint64_t Variable::version() const { return value(), state_->version; }

std::vector<Tensor> values_of(const std::vector<Variable>& vars) {
  std::vector<Tensor> out;
  out.reserve(vars.size());
  for (const auto& v : vars) out.push_back(v.value());
  return out;
}

}  // namespace mpt
