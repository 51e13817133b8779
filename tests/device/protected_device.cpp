// The test device's backend: CpuBackend's kernels, memory from a protected arena. See
// protected_device.hpp.
#include "device/protected_device.hpp"
#include "mpt/optim_ops.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "backend/cpu/cpu_backend.hpp"

namespace mpt::test {
namespace {

constexpr std::size_t kArenaBytes = std::size_t{64} << 30;  // reserved, not committed

class TestBackend final : public Backend {
 public:
  TestBackend() {
    void* p = mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("test device: mmap");
      return;
    }
    base_ = static_cast<char*>(p);
    instance_base_ = base_;
    struct sigaction sa {};
    sa.sa_sigaction = &TestBackend::on_fault;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigaction(SIGSEGV, &sa, nullptr);
    detail::register_backend(DeviceType::Test, this);
  }

  static bool contains(const void* p) {
    const char* c = static_cast<const char*>(p);
    return instance_base_ && c >= instance_base_ && c < instance_base_ + kArenaBytes;
  }

  // ---- memory ---------------------------------------------------------------------------
  void* allocate(Device, std::size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t n = (nbytes + 4095) / 4096 * 4096;
    MPT_CHECK(used_ + n <= kArenaBytes, "test device: arena of ", kArenaBytes, " bytes exhausted");
    char* p = base_ + used_;
    used_ += n;
    if (depth_ > 0) protect(p, n, PROT_READ | PROT_WRITE);  // inside a call: usable at once
    return p;
  }
  void deallocate(Device, void* ptr) override {}  // the arena only grows; the caching allocator reuses blocks
  void copy_from_host(Device, void* dst, const void* host_src, std::size_t n) override {
    Call c(*this);
    ++from_host_;
    std::memcpy(dst, host_src, n);
  }
  void copy_to_host(Device, void* host_dst, const void* src, std::size_t n) override {
    Call c(*this);
    ++to_host_;
    std::memcpy(host_dst, src, n);
  }
  void copy_on_device(Device, void* dst, const void* src, std::size_t n) override {
    Call c(*this);
    std::memcpy(dst, src, n);
  }
  bool has_nonfinite(const Tensor& x) override {
    Call c(*this);
    ++to_host_;  // a value handed back to the host
    return cpu_.has_nonfinite(x);
  }

  // ---- ops: the CPU kernels inside an unprotected window -----------------------------------
  void fill(Tensor& out, double value) override {
    Call c(*this);
    cpu_.fill(out, value);
  }
  void arange(Tensor& out, double start, double step) override {
    Call c(*this);
    cpu_.arange(out, start, step);
  }
  void cast(const Tensor& x, Tensor& out) override {
    Call c(*this);
    cpu_.cast(x, out);
  }
  void copy2d(Device d, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t row_bytes, std::size_t rows) override {
    Call c(*this);
    cpu_.copy2d(Device::cpu(), dst, dst_pitch, src, src_pitch, row_bytes, rows);
  }
  void unary(UnaryOp op, const Tensor& x, Tensor& out, double param) override {
    Call c(*this);
    cpu_.unary(op, x, out, param);
  }
  void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx,
                      double param) override {
    Call c(*this);
    cpu_.unary_backward(op, x, y, dy, dx, param);
  }
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override {
    Call c(*this);
    cpu_.binary(op, a, b, out);
  }
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) override {
    Call c(*this);
    cpu_.where(cond, a, b, out);
  }
  void reduce(ReduceOp op, const Tensor& x, std::int64_t axis, Tensor& out) override {
    Call c(*this);
    cpu_.reduce(op, x, axis, out);
  }
  void argmax(const Tensor& x, std::int64_t axis, Tensor& out) override {
    Call c(*this);
    cpu_.argmax(x, axis, out);
  }
  void matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, const Tensor& bias, Activation act, Tensor& out) override {
    Call c(*this);
    cpu_.matmul(a, b, transpose_a, transpose_b, bias, act, out);
  }
  void softmax(const Tensor& x, std::int64_t axis, bool log, Tensor& out) override {
    Call c(*this);
    cpu_.softmax(x, axis, log, out);
  }
  void softmax_backward(const Tensor& y, const Tensor& dy, std::int64_t axis, bool log, Tensor& dx) override {
    Call c(*this);
    cpu_.softmax_backward(y, dy, axis, log, dx);
  }
  void cross_entropy(const Tensor& x, const Tensor& labels, bool from_logits, Tensor& loss) override {
    Call c(*this);
    cpu_.cross_entropy(x, labels, from_logits, loss);
  }
  void cross_entropy_backward(const Tensor& x, const Tensor& labels, bool from_logits, const Tensor& dloss, Tensor& dx) override {
    Call c(*this);
    cpu_.cross_entropy_backward(x, labels, from_logits, dloss, dx);
  }
  void transpose(const Tensor& x, const std::vector<std::int64_t>& perm, Tensor& out) override {
    Call c(*this);
    cpu_.transpose(x, perm, out);
  }
  void one_hot(const Tensor& indices, Tensor& out) override {
    Call c(*this);
    cpu_.one_hot(indices, out);
  }
  void random(Distribution dist, double a, double b, std::uint64_t seed, std::uint64_t offset, Tensor& out) override {
    Call c(*this);
    cpu_.random(dist, a, b, seed, offset, out);
  }
  void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) override {
    Call c(*this);
    cpu_.gather_rows(x, indices, out);
  }
  void scatter_add_rows(const Tensor& src, const Tensor& indices, Tensor& out) override {
    Call c(*this);
    cpu_.scatter_add_rows(src, indices, out);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const AttentionGeometry& g,
                 Tensor& out, Tensor& lse) override {
    Call c(*this);
    cpu_.attention(q, k, v, mask, g, out, lse);
  }
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& out,
                          const Tensor& lse, const Tensor& dout, const AttentionGeometry& g, Tensor& dq, Tensor& dk,
                          Tensor& dv) override {
    Call c(*this);
    cpu_.attention_backward(q, k, v, mask, out, lse, dout, g, dq, dk, dv);
  }
  void pad(const Tensor& x, const std::vector<std::int64_t>& offset, Tensor& out) override {
    Call c(*this);
    cpu_.pad(x, offset, out);
  }
  void affine_transform(const Tensor& images, const Tensor& transform, const common::ImageTransform& how,
                        Tensor& out) override {
    Call c(*this);
    cpu_.affine_transform(images, transform, how, out);
  }
  void sgd_update(Tensor& var, const Tensor& grad, Tensor* momentum, double lr, double momentum_coef, bool nesterov, Tensor* copy, double grad_scale) override {
    Call c(*this);
    cpu_.sgd_update(var, grad, momentum, lr, momentum_coef, nesterov, copy, grad_scale);
  }
  void adam_update(Tensor& var, const Tensor& grad, Tensor& m, Tensor& v, Tensor* vhat, double alpha, double beta_1, double beta_2, double epsilon, double decay, Tensor* copy, double grad_scale) override {
    Call c(*this);
    cpu_.adam_update(var, grad, m, v, vhat, alpha, beta_1, beta_2, epsilon, decay, copy, grad_scale);
  }
  void rmsprop_update(Tensor& var, const Tensor& grad, Tensor& velocity, Tensor* average_grad, Tensor* momentum, double lr, double rho, double momentum_coef, double epsilon, Tensor* copy, double grad_scale) override {
    Call c(*this);
    cpu_.rmsprop_update(var, grad, velocity, average_grad, momentum, lr, rho, momentum_coef, epsilon, copy, grad_scale);
  }
  void rule_update_all(common::RuleKind rule, std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                       const std::vector<std::vector<Tensor*>>& slots, const common::RuleHyper& h,
                       const std::vector<Tensor*>& copies, double grad_scale) override {
    Call c(*this);
    cpu_.rule_update_all(rule, vars, grads, slots, h, copies, grad_scale);
  }
  void adafactor_update(Tensor& var, const Tensor& grad, Tensor* r, Tensor* c, Tensor* v,
                        const common::AdafactorShape& s, const common::AdafactorHyper& h) override {
    Call c_(*this);
    cpu_.adafactor_update(var, grad, r, c, v, s, h);
  }
  void unscale_and_check(const std::vector<Tensor>& grads, const Tensor& inv_scale, std::vector<Tensor>& outs, Tensor& found,
                         Tensor& flags) override {
    Call c(*this);
    cpu_.unscale_and_check(grads, inv_scale, outs, found, flags);
  }
  void update_loss_scale(Tensor& scale, Tensor& inv_scale, Tensor& counters, const Tensor& found, const ops::LossScaleRule& rule) override {
    Call c(*this);
    cpu_.update_loss_scale(scale, inv_scale, counters, found, rule);
  }
  void conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g, Activation act, Tensor& out) override {
    Call c(*this);
    cpu_.conv2d(x, w, bias, g, act, out);
  }
  void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g, Tensor& dx, Tensor& dw, Tensor& dbias) override {
    Call c(*this);
    cpu_.conv2d_backward(x, w, dy, g, dx, dw, dbias);
  }
  void pool2d(const Tensor& x, const Pool2dGeometry& g, bool training, Tensor& out, Tensor& workspace) override {
    Call c(*this);
    cpu_.pool2d(x, g, training, out, workspace);
  }
  void pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& workspace, const Pool2dGeometry& g, Tensor& dx) override {
    Call c(*this);
    cpu_.pool2d_backward(x, y, dy, workspace, g, dx);
  }
  void batch_norm_stats(const Tensor& x, Tensor& mean, Tensor& var) override {
    Call c(*this);
    cpu_.batch_norm_stats(x, mean, var);
  }
  void batch_norm(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& gamma, const Tensor& beta, double eps, Activation act, Tensor& y) override {
    Call c(*this);
    cpu_.batch_norm(x, mean, var, gamma, beta, eps, act, y);
  }
  void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& var, const Tensor& gamma, const Tensor& beta, double eps, bool batch_stats, Activation act, Tensor& dx, Tensor& dgamma, Tensor& dbeta) override {
    Call c(*this);
    cpu_.batch_norm_backward(x, dy, mean, var, gamma, beta, eps, batch_stats, act, dx, dgamma, dbeta);
  }
  void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& mean, Tensor& rstd) override {
    Call c(*this);
    cpu_.layer_norm(x, gamma, beta, eps, y, mean, rstd);
  }
  void layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd, const Tensor& gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta) override {
    Call c(*this);
    cpu_.layer_norm_backward(x, dy, mean, rstd, gamma, dx, dgamma, dbeta);
  }

  std::atomic<std::int64_t> to_host_{0}, from_host_{0};

 private:
  /// Opens the arena for the duration of a backend call (calls nest, and may come from
  /// several threads: fit's prefetch thread copies while the main thread computes).
  struct Call {
    explicit Call(TestBackend& b) : b_(b) {
      std::lock_guard<std::mutex> lock(b_.mutex_);
      if (b_.depth_++ == 0) b_.protect(b_.base_, b_.used_, PROT_READ | PROT_WRITE);
    }
    ~Call() {
      std::lock_guard<std::mutex> lock(b_.mutex_);
      if (--b_.depth_ == 0) b_.protect(b_.base_, b_.used_, PROT_NONE);
    }
    TestBackend& b_;
  };

  void protect(char* p, std::size_t n, int prot) {
    if (n > 0 && mprotect(p, n, prot) != 0) {
      std::perror("test device: mprotect");
      std::abort();
    }
  }

  static void on_fault(int, siginfo_t* info, void*) {
    if (contains(info->si_addr)) {
      static const char msg[] = "\nmpt test device: host code touched device memory outside a backend call\n";
      (void)!write(2, msg, sizeof msg - 1);
    }
    // SA_RESETHAND restored the default action: returning re-runs the access, which now kills.
  }

  cpu::CpuBackend cpu_;
  std::mutex mutex_;
  char* base_ = nullptr;
  std::size_t used_ = 0;
  int depth_ = 0;

 public:
  static inline const char* instance_base_ = nullptr;
};

TestBackend& instance() {
  static auto* b = new TestBackend;  // never destroyed: tensors in static storage may outlive it
  return *b;
}

// Registered at start-up, before any test runs.
const bool g_registered = (instance(), true);

}  // namespace

bool test_device_registered() { return g_registered && is_available(Device::test()); }

TransferCounts transfers() { return {instance().to_host_.load(), instance().from_host_.load()}; }

void reset_transfers() {
  instance().to_host_ = 0;
  instance().from_host_ = 0;
}

}  // namespace mpt::test
