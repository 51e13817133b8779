#include "mpt/distributed.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>

#include "distributed/mpi_communicator.hpp"
#include "mpt/autograd.hpp"
#include "mpt/log.hpp"
#include "mpt/ops.hpp"

#ifdef MPT_WITH_MPI
#include <unistd.h>
#endif
#if defined(MPT_WITH_MPI) && defined(MPT_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.hpp"
#endif

namespace mpt::distributed {
namespace {

/// The communicator of a process that is the whole job.
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  void all_reduce_sum(std::vector<Tensor>&) override {}
  void all_reduce(std::vector<double>&, ReduceOp) override {}
  void broadcast(Tensor&, int root) override {
    MPT_CHECK(root == 0, "distributed: broadcast from rank ", root, " of a single process");
  }
  std::vector<std::string> all_gather(const std::string& mine) override { return {mine}; }
  void barrier() override {}
};

struct ProcessState {
  bool initialized = false;
  int local_rank = 0, local_size = 1;
  double timeout = 300.0;
  bool nccl_allowed = false;  ///< decide_nccl's answer for the world's ranks (initialize)
  std::shared_ptr<Communicator> world = std::make_shared<SingleProcess>();
  std::optional<DataParallel> strategy;
};

ProcessState& state() {
  static auto* s = new ProcessState();  // outlives static destructors (atexit finalizes MPI)
  return *s;
}

thread_local const DataParallel* t_scoped = nullptr;

/// Whether a launcher started this process as one rank of several (mpirun, srun).
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "SLURM_PROCID"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string describe(const Tensor& t) { return to_string(t.shape()) + " " + to_string(t.dtype()); }

#ifdef MPT_WITH_MPI
std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

/// Makes this rank's GPU the calling thread's current device, before any NCCL or cuBLAS call:
/// otherwise CUDA's default, GPU 0, gets a context of every rank (as torch.cuda.set_device).
/// Returns its PCI bus id, which NCCL compares to find ranks sharing a GPU.
std::string bind_gpu(Device device) {
#if defined(MPT_WITH_CUDA)
  cuda::check_cuda(cudaSetDevice(device.index), "distributed::initialize: cudaSetDevice");
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device.index) == cudaSuccess) return bus;
  (void)cudaGetLastError();
#endif
  return "device " + std::to_string(device.index);  // unique per machine while the GPUs are listed alike
}

/// RankGpu over all_gather: tab-separated fields (a hostname has no tab).
std::string to_wire(const detail::RankGpu& r) {
  return mpt::detail::cat(r.host, '\t', r.local_size, '\t', r.gpus, '\t', r.gpu);
}

detail::RankGpu from_wire(const std::string& text) {
  std::istringstream in(text);
  detail::RankGpu r;
  std::string local_size, gpus;
  std::getline(in, r.host, '\t');
  std::getline(in, local_size, '\t');
  std::getline(in, gpus, '\t');
  std::getline(in, r.gpu);
  r.local_size = std::atoi(local_size.c_str());
  r.gpus = std::atoi(gpus.c_str());
  return r;
}

/// Every rank's GPU, and whether NCCL may sum their gradients: a collective of initialize, so
/// that all ranks take the same path (NCCL on some and MPI on others would never meet).
bool agree_on_nccl(Communicator& world, int local_size, const std::string& bus_id) {
  const detail::RankGpu mine{host_name(), local_size, cuda::device_count(), bus_id};
  std::vector<detail::RankGpu> ranks;
  for (const std::string& text : world.all_gather(to_wire(mine))) ranks.push_back(from_wire(text));
  const detail::NcclDecision d = detail::decide_nccl(ranks);
  const bool any_gpu = std::any_of(ranks.begin(), ranks.end(), [](const detail::RankGpu& r) { return !r.gpu.empty(); });
  if (!d.use_nccl && any_gpu && world.rank() == 0)
    mpt::log(LogLevel::warning, "distributed: GPU gradients are summed by MPI through host memory, not by NCCL, "
             "which needs one GPU per rank: ", d.reason, ". For NCCL, start at most as many ranks per machine as "
             "it has GPUs (mpirun --map-by ppr:<GPUs>:node)");
  return d.use_nccl;
}
#endif  // MPT_WITH_MPI

}  // namespace

Device detail::device_for_local_rank(int local_rank, int local_size, int gpus) {
  MPT_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size && gpus >= 0,
            "distributed: local rank ", local_rank, " of ", local_size, " with ", gpus, " GPUs");
  return gpus > 0 ? Device::cuda(local_rank % gpus) : Device::cpu();
}

detail::NcclDecision detail::decide_nccl(const std::vector<RankGpu>& ranks) {
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const RankGpu& g = ranks[r];
    if (g.gpu.empty())
      return {false, mpt::detail::cat("rank ", r, " on ", g.host, " has no GPU (", g.gpus,
                                      g.gpus == 1 ? " GPU" : " GPUs", " for ", g.local_size,
                                      g.local_size == 1 ? " rank" : " ranks", " there)")};
    std::vector<std::size_t> sharing{r};
    for (std::size_t q = r + 1; q < ranks.size(); ++q)
      if (ranks[q].host == g.host && ranks[q].gpu == g.gpu) sharing.push_back(q);
    if (sharing.size() == 1) continue;
    std::string names;
    for (std::size_t i = 0; i < sharing.size(); ++i)
      names += mpt::detail::cat(i == 0 ? "" : i + 1 == sharing.size() ? " and " : ", ", sharing[i]);
    return {false, mpt::detail::cat("ranks ", names, " share GPU ", g.gpu, " on ", g.host, " (", g.local_size,
                                    " ranks, ", g.gpus, g.gpus == 1 ? " GPU" : " GPUs", " there)")};
  }
  return {true, ""};
}

bool built_with_mpi() {
#ifdef MPT_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool built_with_nccl() {
#if defined(MPT_WITH_CUDA) && defined(MPT_WITH_NCCL)
  return true;
#else
  return false;
#endif
}

void initialize(InitializeOptions options) {
  auto& s = state();
  if (s.initialized) return;
  s.timeout = options.timeout_seconds;
  if (const char* env = std::getenv("MPT_DISTRIBUTED_TIMEOUT")) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    MPT_CHECK(end != env && *end == '\0' && v > 0, "distributed::initialize: MPT_DISTRIBUTED_TIMEOUT must be a ",
              "positive number of seconds, got '", env, "'");
    s.timeout = v;
  }
  MPT_CHECK(s.timeout > 0, "distributed::initialize: timeout_seconds must be positive, got ", s.timeout);
  s.initialized = true;
  if (!launched_by_mpi()) {
    mpt::log(LogLevel::info, "distributed: one process (not started by mpirun or srun)");
    return;
  }
#ifdef MPT_WITH_MPI
  s.world = detail::mpi_world(s.local_rank, s.local_size);
  std::atexit([] { detail::mpi_finalize(); });
  // Ranks sharing a machine share its cores, unless the user chose a thread count.
  if (s.local_size > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    set_num_threads(std::max(1, cores / s.local_size));
  }
  // One GPU per rank on its machine, where there are enough.
  const Device device = detail::device_for_local_rank(s.local_rank, s.local_size, cuda::device_count());
  std::string bus_id;
  if (device.is_cuda()) {
    set_default_device(device);
    bus_id = bind_gpu(device);
  }
  // A collective: every rank of one binary takes this branch alike.
  s.nccl_allowed = built_with_nccl() && s.world->size() > 1 && agree_on_nccl(*s.world, s.local_size, bus_id);
  mpt::log(LogLevel::info, "distributed: rank ", s.world->rank(), " of ", s.world->size(), " (local ", s.local_rank,
           " of ", s.local_size, "), ", num_threads(), " threads, device ", default_device().str());
#else
  mpt::log(LogLevel::warning, "distributed: started by a launcher, but mpt was built without MPI; "
           "this process trains alone (install libopenmpi-dev and rebuild)");
#endif
}

bool is_initialized() { return state().initialized; }
int rank() { return state().world->rank(); }
int size() { return state().world->size(); }
int local_rank() { return state().local_rank; }
int local_size() { return state().local_size; }
double timeout_seconds() { return state().timeout; }
std::shared_ptr<Communicator> world() { return state().world; }

void abort(int code) {
#ifdef MPT_WITH_MPI
  if (state().world->backend() == "mpi") detail::mpi_abort(code);
#endif
  std::exit(code);
}

// ---- DataParallel -------------------------------------------------------------------------
DataParallel::DataParallel(DataParallelOptions options) : o_(std::move(options)) {
  MPT_CHECK(o_.bucket_mb > 0 && std::isfinite(o_.bucket_mb), "DataParallel: bucket_mb must be positive, got ",
            o_.bucket_mb);
  comm_ = o_.communicator ? o_.communicator : world();
  device_comm_ = o_.device_communicator;
  if (device_comm_)
    MPT_CHECK(device_comm_->size() == comm_->size() && device_comm_->rank() == comm_->rank(),
              "DataParallel: the device communicator is rank ", device_comm_->rank(), " of ", device_comm_->size(),
              ", the host one rank ", comm_->rank(), " of ", comm_->size());
}

int DataParallel::rank() const { return comm_->rank(); }
int DataParallel::size() const { return comm_->size(); }

std::pair<std::int64_t, std::int64_t> DataParallel::shard(std::int64_t n) const {
  MPT_CHECK(n >= 0, "DataParallel::shard: negative row count ", n);
  const auto r = static_cast<__int128>(rank()), s = static_cast<__int128>(size());
  return {static_cast<std::int64_t>(n * r / s), static_cast<std::int64_t>(n * (r + 1) / s)};
}

Communicator& DataParallel::communicator_for(Device device) const {
  if (device.is_cuda() && comm_->size() > 1) {
    // NCCL only over the world, where initialize() found one GPU per rank: over another host
    // communicator (a test's fake peers, say) nothing tells that its ranks have GPUs of their
    // own, and NCCL's initialization would wait for ranks that never come. A device communicator
    // the user gave is used as given.
    if ((!device_comm_ || !device_comm_->serves(device)) && state().nccl_allowed && comm_ == state().world) {
      auto nccl = detail::make_nccl_communicator(comm_, device);
      if (nccl) device_comm_ = nccl;
    }
    if (device_comm_ && device_comm_->serves(device)) return *device_comm_;
  }
  return *comm_;
}

std::vector<Tensor> DataParallel::all_reduce_gradients(const std::vector<Tensor>& grads,
                                                       std::optional<double> weight) const {
  const double w = weight.value_or(1.0 / size());
  MPT_CHECK(std::isfinite(w) && w >= 0, "DataParallel::all_reduce_gradients: weight must be finite and >= 0, got ", w);
  if (size() == 1 && w == 1.0) return grads;
  std::optional<Device> device;
  std::vector<Shape> shapes;
  for (const auto& g : grads) {
    if (g.defined()) {
      if (!device) device = g.device();
      MPT_CHECK(g.device() == *device, "DataParallel::all_reduce_gradients: gradients on ", device->str(), " and ",
                g.device().str());
    }
    // An undefined gradient takes no room: every rank must have the same ones defined (fit
    // checks the model first and passes zeros for a rank without rows).
    shapes.push_back(g.defined() ? g.shape() : Shape{0});
  }
  GradientReducer reducer(*this, shapes, device.value_or(default_device()), w);
  for (std::size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined()) reducer.ready(i, grads[i]);
  return reducer.finish(grads);
}

// ---- GradientReducer --------------------------------------------------------------------------
std::unique_ptr<Pending> Communicator::all_reduce_sum_async(std::vector<Tensor> buffers) {
  struct Done final : Pending {
    void wait() override {}
  };
  all_reduce_sum(buffers);
  return std::make_unique<Done>();
}

GradientReducer::GradientReducer(const DataParallel& strategy, std::vector<Shape> shapes, Device device, double weight)
    : strategy_(strategy),
      comm_(strategy.communicator_for(device)),
      shapes_(std::move(shapes)),
      device_(device),
      weight_(weight),
      grads_(shapes_.size()),
      bucket_of_(shapes_.size()) {
  MPT_CHECK(std::isfinite(weight_) && weight_ >= 0, "GradientReducer: weight must be finite and >= 0, got ", weight_);
  // Reverse order: the backward pass finishes the last layers' gradients first.
  const auto cap = static_cast<std::int64_t>(strategy.options().bucket_mb * 1024 * 1024 / 4);
  for (std::size_t k = shapes_.size(); k-- > 0;) {
    const std::int64_t n = numel_of(shapes_[k]);
    if (buckets_.empty() || (!buckets_.back().members.empty() && buckets_.back().elements + n > cap))
      buckets_.emplace_back();
    buckets_.back().members.push_back(k);
    buckets_.back().elements += n;
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (auto& b : buckets_) b.waiting = b.members.size();
}

void GradientReducer::ready(std::size_t i, const Tensor& gradient) {
  MPT_CHECK(i < shapes_.size(), "GradientReducer::ready: gradient ", i, " of ", shapes_.size());
  MPT_CHECK(!grads_[i].defined(), "GradientReducer::ready: gradient ", i, " was given twice");
  MPT_CHECK(gradient.defined() && gradient.shape() == shapes_[i] && gradient.device() == device_ &&
                is_floating(gradient.dtype()),
            "GradientReducer::ready: gradient ", i, " must be a floating tensor of shape ", to_string(shapes_[i]),
            " on ", device_.str(), ", got ",
            gradient.defined() ? to_string(gradient.shape()) + " " + to_string(gradient.dtype()) + " on " +
                                     gradient.device().str()
                               : std::string("an undefined tensor"));
  grads_[i] = gradient;
  if (--buckets_[bucket_of_[i]].waiting == 0) send_ready_buckets();
  comm_.progress();
}

void GradientReducer::send_ready_buckets() {
  // In layout order only: collectives must be started in the same order on every rank.
  while (next_to_send_ < buckets_.size() && buckets_[next_to_send_].waiting == 0) send(buckets_[next_to_send_++]);
}

void GradientReducer::send(Bucket& b) {
  NoGradGuard no_grad;
  std::vector<Tensor> parts;
  for (std::size_t i : b.members) {
    if (grads_[i].defined())
      parts.push_back(grads_[i].to(float32).reshape({-1}));
    else if (numel_of(shapes_[i]) > 0)
      parts.push_back(Tensor::zeros({numel_of(shapes_[i])}, float32, device_));
  }
  // concat gives the bucket its own storage in one pass; a weight costs one more.
  b.flat = parts.empty() ? Tensor::zeros({0}, float32, device_) : ops::concat(parts, 0);
  if (weight_ != 1.0) b.flat = ops::mul(b.flat, Tensor::scalar(weight_, float32, device_));
  b.pending = comm_.all_reduce_sum_async({b.flat});
}

std::vector<Tensor> GradientReducer::finish(const std::vector<Tensor>& gradients) {
  MPT_CHECK(gradients.size() == shapes_.size(), "GradientReducer::finish: ", gradients.size(), " gradients for ",
            shapes_.size(), " shapes");
  for (std::size_t i = 0; i < gradients.size(); ++i)
    if (!grads_[i].defined() && gradients[i].defined()) ready(i, gradients[i]);
  // The rest are undefined here: zeros in their buckets, and the mask tells the ranks apart.
  for (auto& b : buckets_) b.waiting = 0;
  send_ready_buckets();
  std::vector<float> mask(shapes_.size());
  for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = grads_[i].defined() ? 1.0f : 0.0f;
  Tensor counts_tensor = Tensor::from_vector(mask, {static_cast<std::int64_t>(mask.size())}, device_);
  auto mask_pending = comm_.all_reduce_sum_async({counts_tensor});
  for (auto& b : buckets_) b.pending->wait();
  mask_pending->wait();
  const std::vector<float> counts = counts_tensor.to_vector<float>();
  std::vector<Tensor> out(shapes_.size());
  for (auto& b : buckets_) {
    std::int64_t offset = 0;
    for (std::size_t i : b.members) {
      MPT_CHECK(counts[i] == 0.0f || grads_[i].defined(), "DataParallel::all_reduce_gradients: gradient ", i,
                " is defined on another rank but undefined on rank ", strategy_.rank(),
                "; pass zeros of the variable's shape where a rank has none");
      if (!grads_[i].defined()) {  // zeros in the bucket
        offset += numel_of(shapes_[i]);
        continue;
      }
      const std::int64_t n = grads_[i].numel();
      Tensor g = b.flat.slice(offset, offset + n).reshape(shapes_[i]);
      out[i] = grads_[i].dtype() == float32 ? g : g.to(grads_[i].dtype());
      offset += n;
    }
  }
  return out;
}

void DataParallel::broadcast_variables(const std::vector<Variable>& variables, int root) const {
  if (size() == 1) return;
  NoGradGuard no_grad;
  // One message per (device, dtype).
  std::map<std::pair<std::string, int>, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < variables.size(); ++i) {
    const Tensor& v = variables[i].value();
    groups[{v.device().str(), static_cast<int>(v.dtype())}].push_back(i);
  }
  for (const auto& [key, members] : groups) {
    std::vector<Tensor> parts;
    for (std::size_t i : members) parts.push_back(variables[i].value().reshape({-1}));
    Tensor flat = ops::concat(parts, 0).copy();
    const Device device = flat.device();
    if (flat.dtype() == float32)
      communicator_for(device).broadcast(flat, root);
    else
      comm_->broadcast(flat, root);
    std::int64_t offset = 0;
    for (std::size_t i : members) {
      const Variable& v = variables[i];
      v.assign(flat.slice(offset, offset + v.numel()).reshape(v.shape()));
      offset += v.numel();
    }
  }
}

void DataParallel::check_same(const std::string& what, const std::vector<std::string>& lines) const {
  if (size() == 1) return;
  std::string mine;
  for (const auto& l : lines) mine += l + "\n";
  const auto all = comm_->all_gather(mine);
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    std::istringstream a(all[0]), b(all[r]);
    std::string la, lb;
    int line = 1;
    for (;; ++line) {
      const bool ga = static_cast<bool>(std::getline(a, la)), gb = static_cast<bool>(std::getline(b, lb));
      if (!ga) la = "(nothing)";
      if (!gb) lb = "(nothing)";
      if (la != lb || (!ga && !gb)) break;
    }
    fail("distributed: the ", what, " differ between rank 0 and rank ", r, ": line ", line, " is '", la,
         "' on rank 0 and '", lb, "' on rank ", r, "; every rank must build the same model and call fit alike");
  }
}

std::vector<double> DataParallel::all_reduce(std::vector<double> values, ReduceOp op) const {
  if (size() > 1) comm_->all_reduce(values, op);
  return values;
}

Tensor DataParallel::all_gather_rows(const Tensor& t) const {
  MPT_CHECK(t.defined() && t.dim() >= 1, "DataParallel::all_gather_rows: needs a tensor with a row axis");
  if (size() == 1) return t;
  const Tensor host = t.to(Device::cpu()).copy();
  Shape row_shape(t.shape().begin() + 1, t.shape().end());
  std::ostringstream head;
  head << to_string(row_shape) << ' ' << to_string(t.dtype());
  std::string mine = head.str();
  mine += '\n';
  mine.append(static_cast<const char*>(host.data_ptr()), host.nbytes());
  const auto all = comm_->all_gather(mine);
  std::string bytes;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const auto nl = all[r].find('\n');
    MPT_CHECK(all[r].substr(0, nl) == head.str(), "DataParallel::all_gather_rows: rank ", r, " has rows of ",
              all[r].substr(0, nl), ", rank ", rank(), " of ", head.str());
    bytes.append(all[r], nl + 1);
  }
  std::int64_t row_elems = 1;
  for (auto d : row_shape) row_elems *= d;
  const auto row_bytes = static_cast<std::int64_t>(itemsize(t.dtype())) * row_elems;
  const std::int64_t rows = row_bytes == 0 ? 0 : static_cast<std::int64_t>(bytes.size()) / row_bytes;
  Shape shape{rows};
  shape.insert(shape.end(), row_shape.begin(), row_shape.end());
  return Tensor::from_host(bytes.data(), static_cast<std::size_t>(rows * row_elems), t.dtype(), shape, Device::cpu());
}

// ---- strategy in force ----------------------------------------------------------------------
void set_strategy(std::optional<DataParallel> strategy) { state().strategy = std::move(strategy); }

const DataParallel* current_strategy() {
  if (t_scoped) return t_scoped;
  const auto& s = state().strategy;
  return s ? &*s : nullptr;
}

detail::ScopedStrategy::ScopedStrategy(const DataParallel* strategy) : previous_(t_scoped) { t_scoped = strategy; }
detail::ScopedStrategy::~ScopedStrategy() { t_scoped = previous_; }

Tensor all_reduce_sum(const Tensor& t) {
  MPT_CHECK(t.defined() && t.dtype() == float32, "distributed::all_reduce_sum: takes a float32 tensor, got ",
            t.defined() ? describe(t) : std::string("an undefined tensor"));
  const DataParallel* s = current_strategy();
  const DataParallel fallback;  // the world, when no strategy is in force
  const DataParallel& strategy = s ? *s : fallback;
  Tensor out;
  {
    NoGradGuard no_grad;
    out = t.detach().copy();
    if (strategy.size() > 1) out = strategy.all_reduce_gradients({out}, 1.0)[0];
  }
  autograd::record("all_reduce_sum", {t}, {&out}, [strategy](const std::vector<Tensor>& g) {
    NoGradGuard no_grad;
    if (!g[0].defined() || strategy.size() == 1) return std::vector<Tensor>{g[0]};
    return std::vector<Tensor>{strategy.all_reduce_gradients({g[0].to(float32)}, 1.0)[0]};
  });
  return out;
}

}  // namespace mpt::distributed
