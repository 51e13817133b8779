#include "backend/backend.hpp"

#include <array>

#include "core/cpu_isa.hpp"

namespace mpt {

namespace {
/// Entry i of an optional slot (or copy) list (empty: unused by every variable).
Tensor* at(const std::vector<Tensor*>& slots, std::size_t i) { return slots.empty() ? nullptr : slots[i]; }
}  // namespace

void Backend::sgd_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                             const std::vector<Tensor*>& momenta, double lr, double momentum_coef, bool nesterov,
                             const std::vector<Tensor*>& copies, double grad_scale) {
  for (std::size_t i = 0; i < vars.size(); ++i)
    sgd_update(vars[i], grads[i], at(momenta, i), lr, momentum_coef, nesterov, at(copies, i), grad_scale);
}

void Backend::adam_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                              const std::vector<Tensor*>& m, const std::vector<Tensor*>& v,
                              const std::vector<Tensor*>& vhat, double alpha, double beta_1, double beta_2,
                              double epsilon, double decay, const std::vector<Tensor*>& copies, double grad_scale) {
  for (std::size_t i = 0; i < vars.size(); ++i)
    adam_update(vars[i], grads[i], *m[i], *v[i], at(vhat, i), alpha, beta_1, beta_2, epsilon, decay, at(copies, i),
                grad_scale);
}

void Backend::rmsprop_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                                 const std::vector<Tensor*>& velocity, const std::vector<Tensor*>& average_grad,
                                 const std::vector<Tensor*>& momentum, double lr, double rho, double momentum_coef,
                                 double epsilon, const std::vector<Tensor*>& copies, double grad_scale) {
  for (std::size_t i = 0; i < vars.size(); ++i)
    rmsprop_update(vars[i], grads[i], *velocity[i], at(average_grad, i), at(momentum, i), lr, rho, momentum_coef,
                   epsilon, at(copies, i), grad_scale);
}

}  // namespace mpt

namespace mpt::detail {
namespace {
std::array<Backend*, 3>& registry() {
  static std::array<Backend*, 3> r{};
  return r;
}
}  // namespace

void register_backend(DeviceType type, Backend* b) { registry()[static_cast<int>(type)] = b; }

bool has_backend(DeviceType type) { return registry()[static_cast<int>(type)] != nullptr; }

Backend& backend(Device device) {
  Backend* b = registry()[static_cast<int>(device.type)];
  MPT_CHECK(b != nullptr, "no ", device.is_cuda() ? "CUDA" : device.is_test() ? "test-device" : "CPU",
            " kernels in this build for device ", device.str(),
            device.is_cuda() ? " (built without CUDA; use MPT_DEVICE=cpu)"
                             : "");
  if (!device.is_cuda()) check_cpu_isa_setting();  // the CPU kernels' tier (MPT_CPU_ISA)
  return *b;
}

}  // namespace mpt::detail


