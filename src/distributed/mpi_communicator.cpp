#include "distributed/mpi_communicator.hpp"

#ifdef MPT_WITH_MPI

// The C API only: no C++ bindings (deprecated, and a library of their own).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "mpt/error.hpp"
#include "mpt/log.hpp"

namespace mpt::distributed::detail {
namespace {

constexpr int kFailureTag = 7301;
constexpr int kFailureBytes = 1024;
// MPI counts are int: larger buffers go in pieces of this many elements.
constexpr std::int64_t kMaxCount = std::int64_t{1} << 30;

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

/// Host bytes of a tensor for MPI: its own memory on the CPU, a host copy elsewhere (copied back
/// by finish()).
class HostView {
 public:
  explicit HostView(Tensor t) : t_(std::move(t)) {
    MPT_CHECK(t_.defined(), "distributed (mpi): an undefined tensor");
    if (t_.device().is_cpu()) {
      ptr_ = static_cast<char*>(t_.data_ptr());
    } else {
      host_ = t_.to(Device::cpu());
      ptr_ = static_cast<char*>(host_.data_ptr());
    }
  }
  char* data() const { return ptr_; }
  void finish() {
    if (host_.defined()) t_.assign(host_.to(t_.device()));
  }

 private:
  Tensor t_, host_;
  char* ptr_ = nullptr;
};

class MpiCommunicator;

/// Non-blocking all-reduces in flight; the buffers (and host copies) live until wait().
class MpiPending final : public Pending {
 public:
  MpiPending(MpiCommunicator& comm, std::vector<HostView> views, std::vector<MPI_Request> requests)
      : comm_(comm), views_(std::move(views)), requests_(std::move(requests)) {}
  void wait() override;

 private:
  MpiCommunicator& comm_;
  std::vector<HostView> views_;
  std::vector<MPI_Request> requests_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm parent) {
    check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_dup(parent, &failure_comm_), "MPI_Comm_dup");
    // Errors come back as codes (and become mpt::Error), never abort the job from inside MPI.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(failure_comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Always listening for another rank's failure note, so a waiting collective can stop at once.
    check(MPI_Irecv(failure_in_, kFailureBytes, MPI_CHAR, MPI_ANY_SOURCE, kFailureTag, failure_comm_,
                    &failure_request_),
          "MPI_Irecv");
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce_sum(std::vector<Tensor>& buffers) override { all_reduce_sum_async(buffers)->wait(); }

  std::unique_ptr<Pending> all_reduce_sum_async(std::vector<Tensor> buffers) override {
    MPT_CHECK(!failed_, "distributed (mpi): rank ", rank_, " cannot start an all-reduce: an earlier collective ",
              "failed (", failure_, "); end this process");
    std::vector<HostView> views;
    views.reserve(buffers.size());
    std::vector<MPI_Request> requests;
    for (auto& b : buffers) {
      MPT_CHECK(b.defined() && b.dtype() == float32, "distributed (mpi): all_reduce_sum takes float32 buffers, got ",
                b.defined() ? to_string(b.dtype()) : std::string("an undefined tensor"));
      views.emplace_back(b);
      auto* p = reinterpret_cast<float*>(views.back().data());
      for (std::int64_t off = 0; off < b.numel(); off += kMaxCount) {
        const int count = static_cast<int>(std::min(kMaxCount, b.numel() - off));
        requests.emplace_back();
        check(MPI_Iallreduce(MPI_IN_PLACE, p + off, count, MPI_FLOAT, MPI_SUM, comm_, &requests.back()),
              "MPI_Iallreduce");
      }
    }
    return std::make_unique<MpiPending>(*this, std::move(views), std::move(requests));
  }

  void progress() override {
    // Any MPI call drives Open MPI's progress engine; testing the failure listener also
    // notices a failed rank during the backward pass.
    if (failed_) return;
    poll_failure("all-reduce of gradients");
  }

  void all_reduce(std::vector<double>& values, ReduceOp op) override {
    if (values.empty()) return;
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE,
                         op == ReduceOp::sum ? MPI_SUM : MPI_MAX, comm_, &request),
          "MPI_Iallreduce");
    std::vector<MPI_Request> requests{request};
    wait(requests, "all-reduce of logs");
  }

  void broadcast(Tensor& t, int root) override {
    MPT_CHECK(root >= 0 && root < size_, "distributed (mpi): broadcast from rank ", root, " of ", size_);
    HostView view(t);
    std::vector<MPI_Request> requests;
    const auto bytes = static_cast<std::int64_t>(t.nbytes());
    for (std::int64_t off = 0; off < bytes; off += kMaxCount) {
      requests.emplace_back();
      check(MPI_Ibcast(view.data() + off, static_cast<int>(std::min(kMaxCount, bytes - off)), MPI_BYTE, root, comm_,
                       &requests.back()),
            "MPI_Ibcast");
    }
    wait(requests, "broadcast of variables");
    view.finish();
  }

  std::vector<std::string> all_gather(const std::string& mine) override {
    MPT_CHECK(mine.size() < static_cast<std::size_t>(INT_MAX), "distributed (mpi): all_gather of ", mine.size(),
              " bytes is too large");
    std::vector<int> sizes(static_cast<std::size_t>(size_));
    int my_size = static_cast<int>(mine.size());
    std::vector<MPI_Request> requests(1);
    check(MPI_Iallgather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm_, &requests[0]), "MPI_Iallgather");
    wait(requests, "all-gather");
    std::vector<int> displacements(sizes.size());
    std::int64_t total = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      MPT_CHECK(total + sizes[r] < INT_MAX, "distributed (mpi): all_gather of more than 2 GiB");
      displacements[r] = static_cast<int>(total);
      total += sizes[r];
    }
    std::string all(static_cast<std::size_t>(total), '\0');
    check(MPI_Iallgatherv(mine.data(), my_size, MPI_CHAR, all.data(), sizes.data(), displacements.data(), MPI_CHAR,
                          comm_, &requests[0]),
          "MPI_Iallgatherv");
    wait(requests, "all-gather");
    std::vector<std::string> out;
    for (std::size_t r = 0; r < sizes.size(); ++r)
      out.push_back(all.substr(static_cast<std::size_t>(displacements[r]), static_cast<std::size_t>(sizes[r])));
    return out;
  }

  void barrier() override {
    std::vector<MPI_Request> requests(1);
    check(MPI_Ibarrier(comm_, &requests[0]), "MPI_Ibarrier");
    wait(requests, "barrier");
  }

  void signal_failure(const std::string& message) noexcept override {
    if (failed_ || signalled_ || size_ == 1) return;
    signalled_ = true;
    failure_ = "this rank failed: " + message;
    const std::string text = message.substr(0, kFailureBytes - 1);
    std::memcpy(failure_out_, text.c_str(), text.size() + 1);
    std::vector<MPI_Request> sends;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      sends.emplace_back();
      if (MPI_Isend(failure_out_, static_cast<int>(text.size() + 1), MPI_CHAR, r, kFailureTag, failure_comm_,
                    &sends.back()) != MPI_SUCCESS)
        sends.pop_back();
    }
    // Short notes go out eagerly; give them a moment, never block on a dead peer.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    int done = 0;
    while (!sends.empty() && std::chrono::steady_clock::now() < deadline) {
      if (MPI_Testall(static_cast<int>(sends.size()), sends.data(), &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS || done)
        break;
      std::this_thread::yield();
    }
    failed_ = true;  // the job is broken: no more collectives, no MPI_Finalize
  }

  /// Called once at exit: the listening receive is cancelled so MPI_Finalize can finish.
  bool shut_down() noexcept {
    if (failed_) return false;
    int done = 0;
    MPI_Test(&failure_request_, &done, MPI_STATUS_IGNORE);
    if (!done) {
      MPI_Cancel(&failure_request_);
      MPI_Wait(&failure_request_, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&comm_);
    MPI_Comm_free(&failure_comm_);
    return true;
  }

 private:
  void check(int code, const char* what) {
    if (code == MPI_SUCCESS) return;
    failed_ = true;
    fail("distributed (mpi): ", what, " on rank ", rank_, " failed: ", mpi_error_string(code));
  }

  /// Throws when another rank reported a failure.
  void poll_failure(const char* what) {
    MPI_Status status;
    int heard = 0;
    MPI_Test(&failure_request_, &heard, &status);
    if (!heard) return;
    failed_ = true;
    failure_ = "rank " + std::to_string(status.MPI_SOURCE) + " failed: " + failure_in_;
    fail("distributed (mpi): the ", what, " on rank ", rank_, " stopped: ", failure_);
  }

 public:
  /// Waits for `requests` with a deadline, stopping early when another rank reports a failure.
  void wait(std::vector<MPI_Request>& requests, const char* what) {
    MPT_CHECK(!failed_, "distributed (mpi): rank ", rank_, " cannot run the ", what,
              ": an earlier collective failed (", failure_, "); end this process");
    const auto start = std::chrono::steady_clock::now();
    const double limit = timeout_seconds();
    for (;;) {
      int done = 0;
      check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
            "MPI_Testall");
      if (done) return;
      poll_failure(what);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > limit) {
        failed_ = true;
        failure_ = "timed out after " + std::to_string(static_cast<int>(waited)) + " s";
        fail("distributed (mpi): the ", what, " on rank ", rank_, " of ", size_, " waited ", waited,
             " s for the other ranks: one died, hung or took another path (the limit is ", limit,
             " s: InitializeOptions::timeout_seconds or MPT_DISTRIBUTED_TIMEOUT)");
      }
      std::this_thread::yield();
    }
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL, failure_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  MPI_Request failure_request_ = MPI_REQUEST_NULL;
  char failure_in_[kFailureBytes] = {};
  char failure_out_[kFailureBytes] = {};
  bool failed_ = false, signalled_ = false;
  std::string failure_;
};

void MpiPending::wait() {
  if (done_) return;
  comm_.wait(requests_, "all-reduce of gradients");
  for (auto& v : views_) v.finish();
  done_ = true;
}

std::shared_ptr<MpiCommunicator>& world_slot() {
  static auto* slot = new std::shared_ptr<MpiCommunicator>();  // outlives static destructors
  return *slot;
}
bool& initialized_by_mpt() {
  static bool by_us = false;
  return by_us;
}

}  // namespace

std::shared_ptr<Communicator> mpi_world(int& local_rank, int& local_size) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    const int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPT_CHECK(code == MPI_SUCCESS, "distributed::initialize: MPI_Init_thread failed: ", mpi_error_string(code));
    initialized_by_mpt() = true;
  }
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  world_slot() = std::make_shared<MpiCommunicator>(MPI_COMM_WORLD);
  return world_slot();
}

void mpi_finalize() noexcept {
  auto& world = world_slot();
  const bool clean = !world || world->shut_down();
  world.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  // After a failed collective, requests are left pending and MPI_Finalize could wait forever
  // for the dead rank: exit without it (the launcher reports the job as failed, as it should).
  if (clean && initialized_by_mpt() && !finalized) MPI_Finalize();
}

void mpi_abort(int code) noexcept {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace mpt::distributed::detail

#endif  // MPT_WITH_MPI
