#pragma once
/// Data-parallel training across processes and machines: Open MPI for processes (and for the
/// gradients of CPU models), NCCL for the gradients of GPU models, bootstrapped over MPI.
///
///   mpt::distributed::initialize();                      // from MPI: mpirun -np 8 ./train
///   mpt::distributed::DataParallel strategy;             // gradients all-reduced
///   model.compile({..., .distribution = strategy});      // or mpt::distributed::set_strategy(strategy)
///   model.fit(x, y, {.batch_size = 1024});               // the global batch, split across ranks
///
/// Under a DataParallel strategy with more than one rank, fit broadcasts the weights from rank 0,
/// checks that every rank built the same model, gives each rank its share of every global batch
/// (the same global shuffle everywhere), averages the gradients in float32 buckets, skips a step
/// on every rank when a gradient overflowed on any, reduces loss and metrics for the logs, and
/// runs the chief-only callbacks (progress bar, ModelCheckpoint, CSVLogger, TensorBoard) on
/// rank 0 only. evaluate reduces over the ranks' shares; predict gathers every rank's rows.
///
/// Custom loops use the same pieces:
///   auto grads = tape.gradient(loss, model.trainable_variables());
///   grads = strategy.all_reduce_gradients(grads);        // the mean over ranks
///   optimizer.apply_gradients(grads, model.trainable_variables());
///
/// A collective that waits longer than the timeout for the other ranks (one died, hung or took
/// another path), or hears that another rank failed, throws mpt::Error; it never hangs.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mpt/tensor.hpp"
#include "mpt/variable.hpp"

namespace mpt::distributed {

enum class ReduceOp { sum, max };

/// A collective in flight (Communicator::all_reduce_sum_async).
class Pending {
 public:
  virtual ~Pending() = default;
  /// Returns when the collective is done and its results are in place (bounded by the
  /// timeout, as every collective).
  virtual void wait() = 0;
};

/// One process's link to the others. mpt's are Open MPI's (any device, through host copies
/// for device tensors) and NCCL's (GPU tensors); tests may give their own.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "mpi", "nccl", "single", ...
  virtual std::string backend() const = 0;
  /// Whether all_reduce_sum takes tensors on `device`.
  virtual bool serves(Device device) const { return true; }
  /// In place: each buffer becomes the elementwise sum of that buffer over all ranks. Buffers are
  /// contiguous float32 tensors, one call's buffers in the same order and sizes on every rank;
  /// they may be reduced concurrently, and the call returns when all are done.
  virtual void all_reduce_sum(std::vector<Tensor>& buffers) = 0;
  /// The same, started now and finished by the returned Pending's wait(): the caller computes
  /// meanwhile. Calls must come in the same order on every rank. The default runs
  /// all_reduce_sum at once.
  virtual std::unique_ptr<Pending> all_reduce_sum_async(std::vector<Tensor> buffers);
  /// Lets collectives in flight advance (MPI progresses non-blocking collectives inside its
  /// calls); called between pieces of other work.
  virtual void progress() {}
  /// Host values reduced over all ranks, in place.
  virtual void all_reduce(std::vector<double>& values, ReduceOp op) = 0;
  /// `t` (contiguous, same shape and dtype on every rank) takes rank `root`'s values.
  virtual void broadcast(Tensor& t, int root) = 0;
  /// Every rank's bytes, in rank order.
  virtual std::vector<std::string> all_gather(const std::string& mine) = 0;
  virtual void barrier() = 0;
  /// Tells the other ranks that this one failed with `message`; their next collective throws
  /// mpt::Error naming this rank. Never throws.
  virtual void signal_failure(const std::string& message) noexcept {}
};

struct InitializeOptions {
  /// Seconds a collective waits for the other ranks before mpt::Error. MPT_DISTRIBUTED_TIMEOUT
  /// (seconds) overrides it.
  double timeout_seconds = 300.0;
};

/// Joins the job started by mpirun / srun (MPI_Init_thread), or does nothing but record a
/// single process when mpt was built without MPI or started without a launcher that sets
/// several ranks. Idempotent. In CUDA builds it makes GPU local_rank() % GPUs the default (and
/// current) device, and decides once for all ranks whether GPU gradients go through NCCL (one
/// GPU per rank) or through MPI host copies (ranks sharing a GPU, or a rank without one; rank 0
/// logs why): see detail::decide_nccl.
void initialize(InitializeOptions options = {});
bool is_initialized();
/// This process's rank among size() (0 and 1 before initialize or without MPI).
int rank();
int size();
/// Rank and number of ranks on this machine (which GPU a rank takes).
int local_rank();
int local_size();
/// Rank 0: the one that prints, logs and writes checkpoints.
inline bool is_chief() { return rank() == 0; }
/// True when mpt was built with Open MPI (MPT_WITH_MPI).
bool built_with_mpi();
/// True when mpt was built with NCCL (CUDA builds).
bool built_with_nccl();
/// Seconds a collective waits (InitializeOptions / MPT_DISTRIBUTED_TIMEOUT).
double timeout_seconds();
/// Ends the job on every rank at once (MPI_Abort) with `code`; for a rank that caught an error
/// and cannot go on. Without MPI, std::exit(code).
[[noreturn]] void abort(int code = 1);
/// The world communicator: MPI's after initialize with several ranks, else a single-process one.
std::shared_ptr<Communicator> world();

struct DataParallelOptions {
  /// Gradients are packed into flat float32 buckets of about this size, each all-reduced as
  /// one message (PyTorch DDP's bucket_cap_mb).
  double bucket_mb = 25.0;
  /// BatchNormalization layers use statistics over the global batch (SyncBatchNorm) instead of
  /// their rank's share (the default, as Keras and PyTorch).
  bool sync_batch_norm = false;
  /// The host communicator (default: world()).
  std::shared_ptr<Communicator> communicator = nullptr;
  /// The communicator for GPU gradients (default in CUDA builds: NCCL over the world's ranks,
  /// made on first use, when `communicator` is the world and initialize() found one GPU per
  /// rank; else `communicator`).
  std::shared_ptr<Communicator> device_communicator = nullptr;
};

/// Synchronous data parallelism: every rank holds the whole model and takes a share of every
/// global batch; gradients are averaged (weighted by each rank's share of the rows).
class DataParallel {
 public:
  explicit DataParallel(DataParallelOptions options = {});
  int rank() const;
  int size() const;
  const DataParallelOptions& options() const { return o_; }
  Communicator& communicator() const { return *comm_; }

  /// Sums gradients while the backward pass still runs (see GradientReducer): fit's path.
  friend class GradientReducer;

  /// Rows [begin, end) of this rank's share of the global rows [0, n): contiguous, sizes
  /// differing by at most one, in rank order.
  std::pair<std::int64_t, std::int64_t> shard(std::int64_t n) const;

  /// Σ over ranks of weight·grads, in float32 buckets, on every rank (each result in its
  /// gradient's dtype and device). weight defaults to 1/size(): the mean. An undefined gradient
  /// stays undefined when it is undefined on every rank, and counts as zeros otherwise.
  std::vector<Tensor> all_reduce_gradients(const std::vector<Tensor>& grads,
                                           std::optional<double> weight = std::nullopt) const;
  /// Every variable takes rank `root`'s values (one message per dtype).
  void broadcast_variables(const std::vector<Variable>& variables, int root = 0) const;
  /// mpt::Error on every rank unless every rank passes the same description (a model's
  /// variables, the run's settings); names the first rank and line that differ.
  void check_same(const std::string& what, const std::vector<std::string>& lines) const;
  /// Host values summed (or maxed) over the ranks.
  std::vector<double> all_reduce(std::vector<double> values, ReduceOp op = ReduceOp::sum) const;
  /// Every rank's rows of `t` (host tensors, same trailing shape and dtype), concatenated in
  /// rank order, on every rank.
  Tensor all_gather_rows(const Tensor& t) const;

 private:
  Communicator& communicator_for(Device device) const;
  DataParallelOptions o_;
  std::shared_ptr<Communicator> comm_;
  mutable std::shared_ptr<Communicator> device_comm_;
};

/// Sums one step's gradients over the ranks while the backward pass runs, as PyTorch DDP does:
/// the gradients are laid out in float32 buckets of about bucket_mb, in reverse order (the last
/// layers' gradients are ready first), from their shapes alone, so every rank has the same
/// layout; a bucket is sent as soon as all its gradients are ready (ready(), which
/// GradientTape::gradient's on_ready calls) and the buckets before it were sent; finish() sends
/// the rest, waits and returns the sums.
///
///   distributed::GradientReducer reducer(strategy, shapes);
///   auto grads = tape.gradient(loss, vars, [&](std::size_t i, const Tensor& g) { reducer.ready(i, g); });
///   grads = reducer.finish(grads);      // Σ over ranks, each in its gradient's dtype
class GradientReducer {
 public:
  /// `shapes[i]`: gradient i's shape (a variable's); `weight` multiplies this rank's gradients
  /// (1: a plain sum).
  GradientReducer(const DataParallel& strategy, std::vector<Shape> shapes, Device device, double weight = 1.0);
  /// Gradient i is final (float, shape shapes[i], on the device).
  void ready(std::size_t i, const Tensor& gradient);
  /// Sends what was not sent (undefined gradients as zeros), waits, and returns the sums; a
  /// gradient undefined on every rank stays undefined.
  std::vector<Tensor> finish(const std::vector<Tensor>& gradients);

 private:
  struct Bucket {
    std::vector<std::size_t> members;
    std::int64_t elements = 0;
    std::size_t waiting = 0;  // members not ready yet
    Tensor flat;
    std::unique_ptr<Pending> pending;
  };
  void send_ready_buckets();
  void send(Bucket& b);
  const DataParallel& strategy_;
  Communicator& comm_;
  std::vector<Shape> shapes_;
  Device device_;
  double weight_;
  std::vector<Tensor> grads_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::size_t next_to_send_ = 0;
};

/// A process-wide strategy for fit/evaluate/predict of models compiled without one, and for
/// layers (SyncBatchNorm) in custom loops; std::nullopt clears it.
void set_strategy(std::optional<DataParallel> strategy);
/// The strategy in force: the one of the fit/evaluate/predict running on this thread, else the
/// process-wide one; null when none.
const DataParallel* current_strategy();

/// Σ over ranks of `t` (any device, float32), differentiable: the gradient of each rank's input
/// is the sum over ranks of the output's gradients. For layers such as SyncBatchNorm.
Tensor all_reduce_sum(const Tensor& t);

namespace detail {
/// Makes `strategy` the current one on this thread while alive (fit/evaluate/predict).
class ScopedStrategy {
 public:
  explicit ScopedStrategy(const DataParallel* strategy);
  ~ScopedStrategy();
  ScopedStrategy(const ScopedStrategy&) = delete;
  ScopedStrategy& operator=(const ScopedStrategy&) = delete;

 private:
  const DataParallel* previous_;
};
/// The NCCL communicator over `host`'s ranks for GPU `device` (unique id sent over `host`);
/// null in builds without NCCL.
std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> host, Device device);

/// The device of local rank `local_rank` of `local_size` on a machine that shows it `gpus`
/// GPUs: GPU local_rank % gpus (more ranks than GPUs share them), the CPU without a GPU.
/// initialize() makes it the default device (and the current CUDA device).
Device device_for_local_rank(int local_rank, int local_size, int gpus);

/// One rank's GPU, as the ranks tell each other in initialize().
struct RankGpu {
  std::string host;    ///< the machine's hostname
  int local_size = 1;  ///< ranks on that machine
  int gpus = 0;        ///< GPUs the machine shows this rank
  std::string gpu;     ///< its GPU's PCI bus id (what NCCL compares), "" when it runs on the CPU
};

struct NcclDecision {
  bool use_nccl = true;
  std::string reason;  ///< why not, naming the ranks, host and GPUs ("" when use_nccl)
};

/// Whether GPU gradients may go through NCCL, for every rank alike (`ranks` in rank order):
/// only when every rank has a GPU of its own. NCCL refuses two ranks on one GPU ("Duplicate
/// GPU detected"); then, as when a rank has no GPU, DataParallel sums GPU gradients over MPI
/// through host copies, and rank 0 logs why once. Ranks that each see one GPU (a launcher that
/// sets CUDA_VISIBLE_DEVICES per rank) share nothing when the bus ids differ.
///
///   decide_nccl({{"node1", 2, 1, "0000:01:00.0"}, {"node1", 2, 1, "0000:01:00.0"}}).use_nccl  // false
NcclDecision decide_nccl(const std::vector<RankGpu>& ranks);
}  // namespace detail

}  // namespace mpt::distributed
