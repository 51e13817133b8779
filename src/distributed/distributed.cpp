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

std::string describe(const Tensor& t) { return to_string(t.shape()) + " " + to_string(t.dtype()); }

}  // namespace

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
  // One GPU per rank on its machine.
  if (const int gpus = cuda::device_count(); gpus > 0) set_default_device(Device::cuda(s.local_rank % gpus));
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
    if (!device_comm_ || !device_comm_->serves(device)) {
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
  NoGradGuard no_grad;
  // Every rank must lay the buckets out alike: the count and shapes are checked with the model
  // at the start of fit; here the device comes from the first defined gradient.
  std::optional<Device> device;
  for (const auto& g : grads)
    if (g.defined()) {
      if (!device) device = g.device();
      MPT_CHECK(g.device() == *device, "DataParallel::all_reduce_gradients: gradients on ", device->str(), " and ",
                g.device().str());
      MPT_CHECK(is_floating(g.dtype()), "DataParallel::all_reduce_gradients: gradient of ", describe(g),
                " is not floating-point");
    }
  if (!device) device = default_device();
  // A mask (one float per gradient, in the last bucket) counts the ranks that had each one.
  const auto bucket_bytes = static_cast<std::int64_t>(o_.bucket_mb * 1024 * 1024);
  struct Bucket {
    std::vector<std::size_t> members;
    std::int64_t elements = 0;
  };
  std::vector<Bucket> buckets(1);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    const std::int64_t n = grads[i].numel();
    if (!buckets.back().members.empty() && (buckets.back().elements + n) * 4 > bucket_bytes) buckets.emplace_back();
    buckets.back().members.push_back(i);
    buckets.back().elements += n;
  }
  std::vector<Tensor> flats;
  std::vector<float> mask(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) mask[i] = grads[i].defined() ? 1.0f : 0.0f;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::vector<Tensor> parts;
    for (std::size_t i : buckets[b].members) parts.push_back(grads[i].to(float32).reshape({-1}));
    Tensor flat = parts.empty() ? Tensor::zeros({0}, float32, *device) : ops::concat(parts, 0);
    if (w != 1.0) flat = ops::mul(flat, Tensor::scalar(w, float32, *device));
    if (b + 1 == buckets.size()) {
      // The mask rides in the last bucket, unweighted.
      flat = ops::concat({flat, Tensor::from_vector(mask, {static_cast<std::int64_t>(mask.size())}, *device)}, 0);
    }
    flats.push_back(flat.copy());  // own contiguous storage, reduced in place
  }
  // The buckets' layout must be the same on every rank: the same gradients defined, with the
  // same shapes (fit checks the model at its start and passes zeros for a rank without rows).
  communicator_for(*device).all_reduce_sum(flats);
  // Mask: how many ranks had each gradient.
  const Tensor& last = flats.back();
  const std::int64_t mask_at = last.numel() - static_cast<std::int64_t>(grads.size());
  const std::vector<float> counts = last.slice(mask_at, last.numel()).to_vector<float>();
  std::vector<Tensor> out(grads.size());
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::int64_t offset = 0;
    for (std::size_t i : buckets[b].members) {
      const std::int64_t n = grads[i].numel();
      Tensor g = flats[b].slice(offset, offset + n).reshape(grads[i].shape());
      out[i] = grads[i].dtype() == float32 ? g : g.to(grads[i].dtype());
      offset += n;
    }
  }
  for (std::size_t i = 0; i < grads.size(); ++i)
    MPT_CHECK(counts[i] == 0.0f || grads[i].defined(), "DataParallel::all_reduce_gradients: gradient ", i,
              " is defined on ", counts[i], " ranks but undefined on rank ", rank(),
              "; pass zeros of the variable's shape where a rank has none");
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
