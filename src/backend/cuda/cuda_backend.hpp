#pragma once
// The CUDA backend: cuBLASLt for GEMM, cuDNN (graph API) for convolutions, own kernels elsewhere
// (their arithmetic in kernels/*.hpp, host-and-device, so the tests run it on the CPU). Each op
// runs on the compute stream of its tensors' GPU; file for file the twin of src/backend/cpu.
#include "backend/backend.hpp"
#include "backend/cuda/cuda_check.hpp"

namespace mpt::cuda {

class CudaBackend final : public Backend {
 public:
  void* allocate(Device device, std::size_t nbytes) override;
  void deallocate(Device device, void* ptr) override;
  void copy_from_host(Device device, void* dst, const void* host_src, std::size_t n) override;
  void copy_to_host(Device device, void* host_dst, const void* src, std::size_t n) override;
  void copy_on_device(Device device, void* dst, const void* src, std::size_t n) override;
  bool caches_memory() const override { return true; }
  MemoryStats memory_stats(Device device) override;
  void reset_peak_memory(Device device) override;
  void empty_cache(Device device) override;
  void fill(Tensor& out, double value) override;
  void arange(Tensor& out, double start, double step) override;
  void cast(const Tensor& x, Tensor& out) override;
  void copy2d(Device device, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
              std::size_t row_bytes, std::size_t rows) override;
  void unary(UnaryOp op, const Tensor& x, Tensor& out, double param) override;
  void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy,
                      Tensor& dx, double param) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) override;
  void reduce(ReduceOp op, const Tensor& x, std::int64_t axis, Tensor& out) override;
  void argmax(const Tensor& x, std::int64_t axis, Tensor& out) override;
  void matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
              const Tensor& bias, Activation act, Tensor& out) override;
  void softmax(const Tensor& x, std::int64_t axis, bool log, Tensor& out) override;
  void softmax_backward(const Tensor& y, const Tensor& dy, std::int64_t axis, bool log,
                        Tensor& dx) override;
  void cross_entropy(const Tensor& x, const Tensor& labels, bool from_logits,
                     Tensor& loss) override;
  void cross_entropy_backward(const Tensor& x, const Tensor& labels, bool from_logits,
                              const Tensor& dloss, Tensor& dx) override;
  void transpose(const Tensor& x, const std::vector<std::int64_t>& perm, Tensor& out) override;
  void one_hot(const Tensor& indices, Tensor& out) override;
  bool has_nonfinite(const Tensor& x) override;
  void random(Distribution dist, double a, double b, std::uint64_t seed, std::uint64_t offset,
              Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) override;
  void scatter_add_rows(const Tensor& src, const Tensor& indices, Tensor& out) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const AttentionGeometry& g,
                 Tensor& out, Tensor& lse) override;
  bool fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                       const AttentionGeometry& g, Tensor& out, Tensor& lse) override;
  bool fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                const Tensor& out,
                                const Tensor& lse, const Tensor& dout, const AttentionGeometry& g, Tensor& dq,
                                Tensor& dk, Tensor& dv) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& out,
                          const Tensor& lse, const Tensor& dout, const AttentionGeometry& g, Tensor& dq, Tensor& dk,
                          Tensor& dv) override;
  void pad(const Tensor& x, const std::vector<std::int64_t>& offset, Tensor& out) override;
  void affine_transform(const Tensor& images, const Tensor& transform, const common::ImageTransform& how,
                        Tensor& out) override;
  void sgd_update(Tensor& var, const Tensor& grad, Tensor* momentum, double lr,
                  double momentum_coef, bool nesterov, Tensor* copy, double grad_scale) override;
  void adam_update(Tensor& var, const Tensor& grad, Tensor& m, Tensor& v, Tensor* vhat,
                   double alpha, double beta_1, double beta_2, double epsilon,
                   double decay, Tensor* copy, double grad_scale) override;
  void rmsprop_update(Tensor& var, const Tensor& grad, Tensor& velocity, Tensor* average_grad,
                      Tensor* momentum, double lr, double rho, double momentum_coef,
                      double epsilon, Tensor* copy, double grad_scale) override;
  void sgd_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                      const std::vector<Tensor*>& momenta, double lr, double momentum_coef,
                      bool nesterov, const std::vector<Tensor*>& copies,
                      double grad_scale) override;
  void adam_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                       const std::vector<Tensor*>& m, const std::vector<Tensor*>& v,
                       const std::vector<Tensor*>& vhat, double alpha, double beta_1, double beta_2,
                       double epsilon, double decay, const std::vector<Tensor*>& copies,
                       double grad_scale) override;
  void rmsprop_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                          const std::vector<Tensor*>& velocity,
                          const std::vector<Tensor*>& average_grad,
                          const std::vector<Tensor*>& momentum, double lr, double rho,
                          double momentum_coef, double epsilon,
                          const std::vector<Tensor*>& copies, double grad_scale) override;
  void adafactor_update(Tensor& var, const Tensor& grad, Tensor* r, Tensor* c, Tensor* v,
                        const common::AdafactorShape& s, const common::AdafactorHyper& h) override;
  void rule_update_all(common::RuleKind rule, std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                       const std::vector<std::vector<Tensor*>>& slots, const common::RuleHyper& h,
                       const std::vector<Tensor*>& copies, double grad_scale) override;
  void unscale_and_check(const std::vector<Tensor>& grads, const Tensor& inv_scale,
                         std::vector<Tensor>& outs, Tensor& found, Tensor& flags) override;
  void update_loss_scale(Tensor& scale, Tensor& inv_scale, Tensor& counters, const Tensor& found,
                         const ops::LossScaleRule& rule) override;
  void conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,
              Activation act, Tensor& out) override;
  void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g,
                       Tensor& dx, Tensor& dw, Tensor& dbias) override;
  void pool2d(const Tensor& x, const Pool2dGeometry& g, bool training, Tensor& out,
              Tensor& workspace) override;
  void pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& workspace,
                       const Pool2dGeometry& g, Tensor& dx) override;
  void batch_norm_stats(const Tensor& x, Tensor& mean, Tensor& var) override;
  void batch_norm(const Tensor& x, const Tensor& mean, const Tensor& var,
                          const Tensor& gamma, const Tensor& beta, double eps, Activation act,
                          Tensor& y) override;
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean,
                           const Tensor& var, const Tensor& gamma, const Tensor& beta, double eps,
                           bool batch_stats, Activation act, Tensor& dx, Tensor& dgamma,
                           Tensor& dbeta) override;
  void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y,
                  Tensor& mean, Tensor& rstd) override;
  void layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean,
                           const Tensor& rstd, const Tensor& gamma, Tensor& dx, Tensor& dgamma,
                           Tensor& dbeta) override;
};

}  // namespace mpt::cuda
