// The NCCL communicator for the gradients of GPU models: one NCCL communicator per process and
// GPU over the host communicator's ranks, bootstrapped through it (rank 0's unique id sent by
// all_gather). It is non-blocking so that no wait is unbounded: every collective runs on the
// GPU's compute stream and is polled against timeout_seconds(); a rank that died, hung or took
// another path makes the others abort the communicator and throw instead of hanging. Host values
// stay on the host communicator.
#include "mpt/distributed.hpp"

#if defined(MPT_WITH_CUDA) && defined(MPT_WITH_NCCL)
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "backend/cuda/cuda_check.hpp"
#include "mpt/error.hpp"

namespace mpt::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using mpt::detail::cat;  // mpt::distributed::detail hides it

/// "<error string> (<NCCL's last error message>)": the code alone rarely says which peer or
/// transport failed.
std::string describe(ncclResult_t status) {
  const char* last = ncclGetLastError(nullptr);
  return cat(ncclGetErrorString(status), last && *last ? cat(" (", last, ")") : "");
}

/// Throws mpt::Error "distributed (nccl): <what>: <error>" unless status is ncclSuccess.
void check_nccl(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) fail("distributed (nccl): ", what, ": ", describe(status));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Communicator> host, Device device)
      : host_(std::move(host)), device_(device) {
    cuda::DeviceGuard g(device_.index);
    ncclUniqueId id{};
    std::string mine;
    ncclResult_t id_status = ncclSuccess;
    if (host_->rank() == 0) {
      id_status = ncclGetUniqueId(&id);
      if (id_status == ncclSuccess) mine.assign(id.internal, sizeof id.internal);
    }
    // Rank 0 joins the all_gather even when it has no id, so the others fail here, not hang.
    const std::string root = host_->all_gather(mine).at(0);
    check_nccl(id_status, "ncclGetUniqueId");
    MPT_CHECK(root.size() == sizeof id.internal, "distributed (nccl): rank 0 could not make the NCCL unique id");
    std::memcpy(id.internal, root.data(), sizeof id.internal);

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    await("initialization", ncclCommInitRankConfig(&comm_, host_->size(), id, host_->rank(), &config), false);
    const cudaError_t st = cudaEventCreateWithFlags(&event_, cudaEventDisableTiming);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      abort_and_fail(cat("cudaEventCreateWithFlags: ", cudaGetErrorName(st)));
    }
  }

  /// Finalize flushes this rank's last collectives, bounded like one; then the local resources
  /// go. A failed communicator was aborted already.
  ~NcclCommunicator() override {
    try {
      if (comm_) {
        cuda::DeviceGuard g(device_.index);
        await("finalize", ncclCommFinalize(comm_), false);
        (void)ncclCommDestroy(comm_);
      }
    } catch (...) {  // await aborted the communicator; a destructor must not throw
    }
    if (event_) (void)cudaEventDestroy(event_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string backend() const override { return "nccl"; }
  bool serves(Device device) const override { return device == device_; }

  /// One NCCL group: the buffers' reductions are fused into as few kernels as NCCL likes.
  void all_reduce_sum(std::vector<Tensor>& buffers) override {
    for (const Tensor& b : buffers) {
      MPT_CHECK(b.defined() && b.dtype() == float32 && b.device() == device_,
                "distributed (nccl): all_reduce_sum takes float32 tensors on ", device_, ", got ",
                b.defined() ? cat(to_string(b.dtype()), " on ", b.device()) : "an undefined tensor");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    check_alive();
    cuda::DeviceGuard g(device_.index);
    const cudaStream_t s = cuda::stream(device_.index);
    ncclResult_t status = ncclGroupStart();
    if (status != ncclSuccess) abort_and_fail(cat("all_reduce_sum: ncclGroupStart: ", describe(status)));
    for (Tensor& b : buffers) {
      if (b.numel() == 0) continue;
      status = ncclAllReduce(b.data_ptr(), b.data_ptr(), static_cast<std::size_t>(b.numel()), ncclFloat, ncclSum,
                             comm_, s);
      if (status != ncclSuccess) break;
    }
    const ncclResult_t end = ncclGroupEnd();  // also after a failed call, to leave the group
    await("all_reduce_sum", status != ncclSuccess ? status : end, true);
  }

  void all_reduce(std::vector<double>& values, ReduceOp op) override { host_->all_reduce(values, op); }

  /// In place on this GPU (as bytes: any dtype); other tensors go through the host communicator.
  void broadcast(Tensor& t, int root) override {
    if (!t.defined() || t.device() != device_) {
      host_->broadcast(t, root);
      return;
    }
    MPT_CHECK(root >= 0 && root < size(), "distributed (nccl): broadcast from rank ", root, " of ", size());
    std::lock_guard<std::mutex> lock(mutex_);
    check_alive();
    cuda::DeviceGuard g(device_.index);
    await("broadcast", ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclChar, root, comm_,
                                     cuda::stream(device_.index)), true);
  }

  std::vector<std::string> all_gather(const std::string& mine) override { return host_->all_gather(mine); }
  void barrier() override { host_->barrier(); }
  void signal_failure(const std::string& message) noexcept override { host_->signal_failure(message); }

 private:
  void check_alive() const {
    MPT_CHECK(comm_, "distributed (nccl): the communicator failed earlier and was aborted: ", failure_);
  }

  /// Aborts the communicator (its in-flight kernels too), remembers why, and throws.
  [[noreturn]] void abort_and_fail(const std::string& message) {
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    failure_ = message;
    fail("distributed (nccl): ", message);
  }

  /// Waits for the NCCL call that returned `issued` (ncclInProgress while a non-blocking
  /// communicator still works on it) and, with `on_stream`, for the kernels it put on the compute
  /// stream, by polling the communicator's state and an event; aborts on error or at the deadline.
  void await(const char* op, ncclResult_t issued, bool on_stream) {
    const auto start = Clock::now();
    const auto waited = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
    const auto broken = [&](const std::string& what) {
      abort_and_fail(cat(op, " on rank ", rank(), " ", what, " after ", waited(),
                         " s: a rank died, hung or took another path (the wait is bounded by "
                         "MPT_DISTRIBUTED_TIMEOUT, now ", timeout_seconds(), " s)"));
    };
    if (issued != ncclSuccess && issued != ncclInProgress) broken(cat("failed: ", describe(issued)));
    const auto deadline = start + std::chrono::duration<double>(timeout_seconds());
    bool recorded = false;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t st = ncclCommGetAsyncError(comm_, &state);
      if (st != ncclSuccess) state = st;
      if (state != ncclSuccess && state != ncclInProgress) broken(cat("failed: ", describe(state)));
      if (state == ncclSuccess) {
        if (!on_stream) return;
        if (!recorded) {  // only now are the kernels on the stream
          const cudaError_t rec = cudaEventRecord(event_, cuda::stream(device_.index));
          if (rec != cudaSuccess) broken(cat("failed: cudaEventRecord: ", cudaGetErrorName(rec)));
          recorded = true;
        }
        const cudaError_t q = cudaEventQuery(event_);
        if (q == cudaSuccess) return;
        (void)cudaGetLastError();  // cudaErrorNotReady is no error: keep it from later checks
        if (q != cudaErrorNotReady) broken(cat("failed: ", cudaGetErrorName(q), " (", cudaGetErrorString(q), ")"));
      }
      if (Clock::now() > deadline) broken("had no answer");
      std::this_thread::yield();
    }
  }

  std::shared_ptr<Communicator> host_;
  Device device_;
  ncclComm_t comm_ = nullptr;  ///< null once aborted
  cudaEvent_t event_ = nullptr;
  std::string failure_;
  std::mutex mutex_;  ///< one collective at a time: an NCCL communicator is not thread-safe
};

}  // namespace

std::shared_ptr<Communicator> detail::make_nccl_communicator(std::shared_ptr<Communicator> host, Device device) {
  MPT_CHECK(host, "distributed (nccl): no host communicator");
  MPT_CHECK(device.is_cuda(), "distributed (nccl): ", device, " is not a GPU");
  return std::make_shared<NcclCommunicator>(std::move(host), device);
}

}  // namespace mpt::distributed

#else  // no NCCL in this build

std::shared_ptr<mpt::distributed::Communicator> mpt::distributed::detail::make_nccl_communicator(
    std::shared_ptr<Communicator>, Device) {
  return nullptr;
}

#endif
