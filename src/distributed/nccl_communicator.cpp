// The NCCL communicator for the gradients of GPU models: one NCCL communicator per process and
// GPU over the host communicator's ranks, bootstrapped through it (rank 0's unique id sent by
// all_gather). It is non-blocking so that no wait is unbounded: every collective is polled against
// timeout_seconds(); a rank that died, hung or took another path makes the others abort the
// communicator and throw instead of hanging. Host values stay on the host communicator.
//
// Collectives run on the communicator's own stream, ordered after the compute stream's earlier
// ops (an event), so that an all-reduce started by all_reduce_sum_async overlaps the compute
// stream's later work (the rest of the backward pass), as in PyTorch DDP; its Pending's wait()
// orders the compute stream's later ops after it (another event) and polls it.
#include "mpt/distributed.hpp"

#if defined(MPT_WITH_CUDA) && defined(MPT_WITH_NCCL)
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

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

class NcclCommunicator;

/// A collective on the communicator's stream. It holds the buffers, so their memory lives until
/// the collective is done: mpt's caching allocator is stream-ordered on the compute stream, and
/// both wait() and the destructor (when wait() was not called) make the compute stream wait for
/// the collective's `done` event before any later op, so memory freed afterwards is reused only
/// by ops that run after the collective has finished with it.
class NcclPending final : public Pending {
 public:
  NcclPending(std::shared_ptr<NcclCommunicator> comm, const char* op, cudaEvent_t done, std::vector<Tensor> buffers)
      : comm_(std::move(comm)), op_(op), done_(done), buffers_(std::move(buffers)) {}
  ~NcclPending() override;
  NcclPending(const NcclPending&) = delete;
  NcclPending& operator=(const NcclPending&) = delete;
  void wait() override;

 private:
  std::shared_ptr<NcclCommunicator> comm_;  ///< kept alive: the stream and event are its
  const char* op_;
  cudaEvent_t done_;
  std::vector<Tensor> buffers_;
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator, public std::enable_shared_from_this<NcclCommunicator> {
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
    await("initialization", ncclCommInitRankConfig(&comm_, host_->size(), id, host_->rank(), &config));
    cuda_or_abort("initialization", "cudaEventCreateWithFlags",
                  cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    cuda_or_abort("initialization", "cudaStreamCreateWithFlags",
                  cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }

  /// Finalize flushes this rank's last collectives, bounded like one; then the local resources
  /// go. A failed communicator was aborted already. No Pending is left (each holds this).
  ~NcclCommunicator() override {
    try {  // a destructor must not throw
      cuda::DeviceGuard g(device_.index);
      try {
        if (comm_) {
          await("finalize", ncclCommFinalize(comm_));
          (void)ncclCommDestroy(comm_);
        }
      } catch (...) {  // await aborted the communicator
      }
      for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
      if (ready_) (void)cudaEventDestroy(ready_);
      if (stream_) (void)cudaStreamDestroy(stream_);
    } catch (...) {
    }
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string backend() const override { return "nccl"; }
  bool serves(Device device) const override { return device == device_; }

  /// In place (the Pending's tensors share the buffers' storage).
  void all_reduce_sum(std::vector<Tensor>& buffers) override { all_reduce_sum_async(buffers)->wait(); }

  /// One NCCL group: the buffers' reductions are fused into as few kernels as NCCL likes. The
  /// buffers must not be touched until wait().
  std::unique_ptr<Pending> all_reduce_sum_async(std::vector<Tensor> buffers) override {
    for (const Tensor& b : buffers) {
      MPT_CHECK(b.defined() && b.dtype() == float32 && b.device() == device_,
                "distributed (nccl): all_reduce_sum takes float32 tensors on ", device_, ", got ",
                b.defined() ? cat(to_string(b.dtype()), " on ", b.device()) : "an undefined tensor");
    }
    return launch("all_reduce_sum", std::move(buffers), [this](std::vector<Tensor>& bs, cudaStream_t s) {
      ncclResult_t status = ncclGroupStart();
      if (status != ncclSuccess) abort_and_fail(cat("all_reduce_sum: ncclGroupStart: ", describe(status)));
      for (Tensor& b : bs) {
        if (b.numel() == 0) continue;
        status = ncclAllReduce(b.data_ptr(), b.data_ptr(), static_cast<std::size_t>(b.numel()), ncclFloat,
                               ncclSum, comm_, s);
        if (status != ncclSuccess) break;
      }
      const ncclResult_t end = ncclGroupEnd();  // also after a failed call, to leave the group
      return status != ncclSuccess ? status : end;
    });
  }

  void all_reduce(std::vector<double>& values, ReduceOp op) override { host_->all_reduce(values, op); }

  /// In place on this GPU (as bytes: any dtype); other tensors go through the host communicator.
  void broadcast(Tensor& t, int root) override {
    if (!t.defined() || t.device() != device_) {
      host_->broadcast(t, root);
      return;
    }
    MPT_CHECK(root >= 0 && root < size(), "distributed (nccl): broadcast from rank ", root, " of ", size());
    launch("broadcast", {t}, [this, root](std::vector<Tensor>& bs, cudaStream_t s) {
      return ncclBroadcast(bs[0].data_ptr(), bs[0].data_ptr(), bs[0].nbytes(), ncclChar, root, comm_, s);
    })->wait();
  }

  std::vector<std::string> all_gather(const std::string& mine) override { return host_->all_gather(mine); }
  void barrier() override { host_->barrier(); }
  void signal_failure(const std::string& message) noexcept override { host_->signal_failure(message); }

 private:
  friend class NcclPending;

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

  /// A CUDA failure around a collective leaves this rank out of step with the others: abort.
  void cuda_or_abort(const char* op, const char* what, cudaError_t status) {
    if (status == cudaSuccess) return;
    (void)cudaGetLastError();
    abort_and_fail(cat(op, ": ", what, ": ", cudaGetErrorName(status)));
  }

  /// Starts a collective on stream_ after the compute stream's earlier ops (the buffers'
  /// producers): enqueue(buffers, stream_) makes the NCCL call(s) and returns their status.
  template <class Enqueue>
  std::unique_ptr<Pending> launch(const char* op, std::vector<Tensor> buffers, Enqueue enqueue) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_alive();
    cuda::DeviceGuard g(device_.index);
    // cudaStreamWaitEvent takes the event's latest record: ready_ may be recorded again at once.
    cuda_or_abort(op, "cudaEventRecord", cudaEventRecord(ready_, cuda::stream(device_.index)));
    cuda_or_abort(op, "cudaStreamWaitEvent", cudaStreamWaitEvent(stream_, ready_, 0));
    // Bounded wait until issued: a non-blocking communicator may answer ncclInProgress (the
    // first collectives connect to the peers), and only then are the kernels on stream_.
    try {
      await(op, enqueue(buffers, stream_));
    } catch (...) {  // aborted: whatever reached stream_ still comes before the buffers' reuse
      if (cudaEventRecord(ready_, stream_) != cudaSuccess ||
          cudaStreamWaitEvent(cuda::stream(device_.index), ready_, 0) != cudaSuccess)
        (void)cudaGetLastError();
      throw;
    }
    cudaEvent_t done = nullptr;
    if (!events_.empty()) {
      done = events_.back();
      events_.pop_back();
    } else {
      cuda_or_abort(op, "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    }
    const cudaError_t rec = cudaEventRecord(done, stream_);
    if (rec != cudaSuccess) events_.push_back(done);
    cuda_or_abort(op, "cudaEventRecord", rec);
    return std::make_unique<NcclPending>(shared_from_this(), op, done, std::move(buffers));
  }

  /// Pending::wait(): the compute stream's later ops wait for `done`, which is polled.
  void finish(const char* op, cudaEvent_t done) {
    std::lock_guard<std::mutex> lock(mutex_);
    cuda::DeviceGuard g(device_.index);
    const cudaError_t st = cudaStreamWaitEvent(cuda::stream(device_.index), done, 0);
    if (st != cudaSuccess) (void)cudaGetLastError();
    check_alive();
    cuda_or_abort(op, "cudaStreamWaitEvent", st);
    await(op, ncclSuccess, done);
  }

  /// A Pending gives its event back; when it was not waited for, the compute stream's later ops
  /// still wait for the collective (it writes the buffers whose memory is about to be freed).
  void release(cudaEvent_t done, bool order) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (order) {
      try {
        cuda::DeviceGuard g(device_.index);
        if (cudaStreamWaitEvent(cuda::stream(device_.index), done, 0) != cudaSuccess) (void)cudaGetLastError();
      } catch (...) {  // the device is gone
      }
    }
    events_.push_back(done);  // reusable: a later cudaStreamWaitEvent takes a later record
  }

  /// Waits for the NCCL call that returned `issued` (ncclInProgress while a non-blocking
  /// communicator still works on it) and, when `done` is given, for that event (recorded after
  /// a collective's kernels), by polling the communicator's state and the event; aborts on error
  /// or at the deadline.
  void await(const char* op, ncclResult_t issued, cudaEvent_t done = nullptr) {
    const auto start = Clock::now();
    const auto waited = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
    const auto broken = [&](const std::string& what) {
      abort_and_fail(cat(op, " on rank ", rank(), " ", what, " after ", waited(),
                         " s: a rank died, hung or took another path (the wait is bounded by "
                         "MPT_DISTRIBUTED_TIMEOUT, now ", timeout_seconds(), " s)"));
    };
    if (issued != ncclSuccess && issued != ncclInProgress) broken(cat("failed: ", describe(issued)));
    const auto deadline = start + std::chrono::duration<double>(timeout_seconds());
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t st = ncclCommGetAsyncError(comm_, &state);
      if (st != ncclSuccess) state = st;
      if (state != ncclSuccess && state != ncclInProgress) broken(cat("failed: ", describe(state)));
      if (state == ncclSuccess) {
        if (!done) return;
        const cudaError_t q = cudaEventQuery(done);
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
  cudaStream_t stream_ = nullptr;  ///< the collectives' stream
  cudaEvent_t ready_ = nullptr;    ///< recorded on the compute stream before each collective
  std::vector<cudaEvent_t> events_;  ///< free `done` events
  std::string failure_;
  std::mutex mutex_;  ///< one NCCL call or wait at a time: an NCCL communicator is not thread-safe
};

NcclPending::~NcclPending() { comm_->release(done_, !waited_); }

void NcclPending::wait() {
  if (waited_) return;
  waited_ = true;  // finish() orders the compute stream first, also when it then throws
  comm_->finish(op_, done_);
  buffers_.clear();
}

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
