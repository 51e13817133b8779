#include "backend/cuda/cudnn_graph.hpp"

#include <array>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_check.hpp"
#include "mpt/error.hpp"
#include "mpt/log.hpp"
#include "mpt/tensor.hpp"

namespace mpt::cuda::cudnn {
namespace {

std::string what(const char* op, const char* step) { return std::string(op) + ": " + step; }

/// Engine configurations cuDNN's heuristic `mode` proposes for the graph, best first.
std::vector<Descriptor> engine_configs(const Graph& g, const PlanTarget& target, cudnnBackendHeurMode_t mode,
                                       const char* op) {
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what(op, "engine heuristics").c_str());
  set_desc(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g.graph, op, "heuristics graph");
  set(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, op, "heuristics mode");
  if (target.device_prop)
    set_desc(heur.get(), CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, *target.device_prop, op, "heuristics device properties");
  const cudnnStatus_t s = cudnnBackendFinalize(heur.get());
  if (not_supported(s)) return {};
  check_cudnn(s, what(op, "heuristics finalize").c_str());
  std::int64_t count = 0;
  check_cudnn(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                       &count, nullptr),
              what(op, "heuristics result count").c_str());
  std::vector<Descriptor> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, what(op, "engine config").c_str());
    raw.push_back(cfgs.back().get());
  }
  if (count == 0) return cfgs;
  std::int64_t got = 0;
  check_cudnn(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       count, &got, raw.data()),
              what(op, "heuristics results").c_str());
  cfgs.resize(static_cast<std::size_t>(got));
  return cfgs;
}

/// mpt::Error naming the runtime when it has no device descriptions.
void require_device_descriptions() {
  const std::size_t v = runtime_version();
  MPT_CHECK(v >= kDevicePropVersion, "cuDNN: device descriptions (CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR) need cuDNN >= ",
            version_string(kDevicePropVersion), ", the cuDNN loaded at run time is ", version_string(v));
}

constexpr int kMaxDevices = 16;

}  // namespace

// ---- descriptors ----------------------------------------------------------------------------

Descriptor::Descriptor(cudnnBackendDescriptorType_t type, const char* what) {
  check_cudnn(cudnnBackendCreateDescriptor(type, &d_), what);
}

Descriptor::~Descriptor() {
  if (d_) (void)cudnnBackendDestroyDescriptor(d_);
}

Descriptor& Descriptor::operator=(Descriptor&& o) noexcept {
  if (this != &o) {
    if (d_) (void)cudnnBackendDestroyDescriptor(d_);
    d_ = o.d_;
    o.d_ = nullptr;
  }
  return *this;
}

Graph::~Graph() {
  graph = Descriptor();
  while (!parts.empty()) parts.pop_back();
}

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         std::int64_t count, const void* values, const char* op, const char* step) {
  check_cudnn(cudnnBackendSetAttribute(d, name, type, count, values), what(op, step).c_str());
}

void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, const Descriptor& v, const char* op,
              const char* step) {
  cudnnBackendDescriptor_t p = v.get();
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p, op, step);
}

void set_i64(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, std::initializer_list<std::int64_t> v,
             const char* op, const char* step) {
  set(d, name, CUDNN_TYPE_INT64, static_cast<std::int64_t>(v.size()), v.begin(), op, step);
}

void finalize(const Descriptor& d, const char* op, const char* step) {
  check_cudnn(cudnnBackendFinalize(d.get()), what(op, step).c_str());
}

bool not_supported(cudnnStatus_t s) { return CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_NOT_SUPPORTED; }

Descriptor tensor(const TensorSpec& s, const char* op) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what(op, "tensor descriptor").c_str());
  set(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &s.type, op, "tensor data type");
  set(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(s.dims.size()), s.dims.data(),
      op, "tensor dimensions");
  set(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<std::int64_t>(s.strides.size()),
      s.strides.data(), op, "tensor strides");
  set_i64(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, {s.uid}, op, "tensor uid");
  set_i64(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, {s.alignment}, op, "tensor alignment");
  const bool v = s.is_virtual;
  set(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, op, "tensor is_virtual");
  if (s.by_value) {
    const bool b = true;
    set(t.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &b, op, "tensor is_by_value");
  }
  finalize(t, op, "tensor finalize");
  return t;
}

Descriptor pointwise(const PointwiseSpec& p, const Descriptor& x, const Descriptor* b, const Descriptor& y,
                     const char* op, const Descriptor* t) {
  Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what(op, "pointwise descriptor").c_str());
  set(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &p.mode, op, "pointwise mode");
  set(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &p.compute, op, "pointwise precision");
  if (p.axis >= 0) set_i64(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, {p.axis}, op, "pointwise axis");
  finalize(pw, op, "pointwise finalize");
  Descriptor o(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what(op, "pointwise operation").c_str());
  set_desc(o.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, op, "pointwise descriptor");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, op, "pointwise x");
  if (b) set_desc(o.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b, op, "pointwise b");
  if (t) set_desc(o.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t, op, "pointwise t");
  set_desc(o.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, op, "pointwise y");
  finalize(o, op, "pointwise operation finalize");
  return o;
}

bool finalize_graph(Graph& g, const std::vector<cudnnBackendDescriptor_t>& ops, const PlanTarget& target,
                    const char* op) {
  g.graph = Descriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what(op, "operation graph").c_str());
  set(g.graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<std::int64_t>(ops.size()),
      ops.data(), op, "operation graph ops");
  if (target.handle)
    set(g.graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle, op,
        "operation graph handle");
  const cudnnStatus_t s = cudnnBackendFinalize(g.graph.get());
  if (not_supported(s)) return false;
  check_cudnn(s, what(op, "operation graph finalize").c_str());
  return true;
}

bool EngineInfo::has(cudnnBackendNumericalNote_t n) const {
  for (auto x : notes)
    if (x == n) return true;
  return false;
}

EngineInfo engine_info(const Descriptor& cfg, const char* op) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, what(op, "engine descriptor").c_str());
  cudnnBackendDescriptor_t e = engine.get();
  std::int64_t n = 0;
  check_cudnn(cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e),
              what(op, "engine of config").c_str());
  EngineInfo info;
  check_cudnn(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &info.index),
              what(op, "engine index").c_str());
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  std::int64_t count = 0;
  check_cudnn(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                       CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes),
              what(op, "engine numerical notes").c_str());
  info.notes.assign(notes, notes + count);
  return info;
}

std::vector<Plan> plans_for(const std::shared_ptr<Graph>& g, const PlanTarget& target, int max_plans,
                            const std::function<bool(const EngineInfo&)>& accept, const char* op) {
  std::vector<Plan> plans;
  // Mode A ranks the engines for this problem; the fallback list adds engines A leaves out.
  std::vector<std::int64_t> planned;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (Descriptor& cfg : engine_configs(*g, target, mode, op)) {
      const EngineInfo info = engine_info(cfg, op);
      if (!accept(info)) continue;
      bool seen = false;
      for (std::int64_t e : planned) seen = seen || e == info.index;
      if (seen) continue;  // each engine once (its best-ranked configuration that finalizes)
      Plan p;
      p.engine = info.index;
      p.plan = Descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, what(op, "execution plan").c_str());
      set_desc(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg, op, "plan engine config");
      if (target.handle)
        set(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle, op, "plan handle");
      else
        set_desc(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, *target.device_prop, op, "plan device properties");
      // An engine that cannot run this problem on this device fails here: try the next one.
      if (cudnnBackendFinalize(p.plan.get()) != CUDNN_STATUS_SUCCESS) continue;
      planned.push_back(info.index);
      p.graph = g;
      p.config = std::move(cfg);
      std::int64_t n = 0;
      check_cudnn(cudnnBackendGetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                           &n, &p.workspace),
                  what(op, "plan workspace size").c_str());
      plans.push_back(std::move(p));
      if (max_plans > 0 && static_cast<int>(plans.size()) >= max_plans) return plans;
    }
  }
  return plans;
}

// ---- versions and device descriptions ------------------------------------------------------

std::size_t runtime_version() {
  static const std::size_t version = [] {
    const std::size_t v = cudnnGetVersion();
    if (v < CUDNN_VERSION)
      mpt::log(LogLevel::warning, "cuDNN: the library loaded at run time is ", version_string(v),
               ", older than the cuDNN ", version_string(CUDNN_VERSION),
               " mpt was built against: engines and features added since are unavailable");
    return v;
  }();
  return version;
}

std::string version_string(std::size_t v) { return mpt::detail::cat(v / 10000, ".", v / 100 % 100, ".", v % 100); }

std::shared_ptr<const Descriptor> device_properties(const std::string& json) {
  const char* op = "cuDNN";
  require_device_descriptions();
  auto d = std::make_shared<Descriptor>(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "cuDNN: device properties descriptor");
  set(d->get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, static_cast<std::int64_t>(json.size()),
      json.data(), op, "device properties JSON");
  finalize(*d, op, "device properties from JSON");
  return d;
}

std::string serialize_device_properties(cudnnHandle_t handle) {
  const char* op = "cuDNN";
  require_device_descriptions();
  Descriptor d(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "cuDNN: device properties descriptor");
  set(d.get(), CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, op, "device properties handle");
  finalize(d, op, "device properties of handle");
  std::int64_t size = 0;
  check_cudnn(cudnnBackendGetAttribute(d.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &size,
                                       nullptr),
              "cuDNN: device properties JSON size");
  std::string json(static_cast<std::size_t>(size), '\0');
  std::int64_t written = 0;
  check_cudnn(cudnnBackendGetAttribute(d.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, size,
                                       &written, json.data()),
              "cuDNN: device properties JSON");
  json.resize(static_cast<std::size_t>(written));
  while (!json.empty() && json.back() == '\0') json.pop_back();
  return json;
}

// ---- running plans --------------------------------------------------------------------------

std::mutex& mutex() {
  static std::mutex* m = new std::mutex;  // never destroyed: handles and plans outlive static destructors
  return *m;
}

cudnnHandle_t handle_locked(int idx) {
  static std::array<cudnnHandle_t, kMaxDevices>* handles = new std::array<cudnnHandle_t, kMaxDevices>{};
  MPT_CHECK(idx >= 0 && idx < kMaxDevices, "cuDNN: no GPU with index ", idx);
  if (!(*handles)[idx]) {
    cudnnHandle_t h = nullptr;
    check_cudnn(cudnnCreate(&h), "cuDNN: cudnnCreate");
    check_cudnn(cudnnSetStream(h, stream(idx)), "cuDNN: cudnnSetStream");
    (*handles)[idx] = h;
  }
  return (*handles)[idx];
}

void execute(const Plan& plan, int idx, const std::vector<std::int64_t>& uids, std::vector<void*> ptrs, Device device,
             const char* op) {
  // Workspace from mpt's stream-ordered allocator: freed on return, reused by later work on the
  // same stream only after cuDNN's kernels.
  Tensor workspace = plan.workspace > 0 ? Tensor::empty({plan.workspace}, uint8, device) : Tensor();
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, what(op, "variant pack").c_str());
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(uids.size()),
      uids.data(), op, "variant pack uids");
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<std::int64_t>(ptrs.size()),
      ptrs.data(), op, "variant pack pointers");
  void* ws = workspace.defined() ? workspace.data_ptr() : nullptr;
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, op, "variant pack workspace");
  finalize(pack, op, "variant pack finalize");
  std::lock_guard<std::mutex> lock(mutex());  // enqueues only: held for microseconds
  check_cudnn(cudnnBackendExecute(handle_locked(idx), plan.plan.get(), pack.get()), what(op, "execute").c_str());
}

std::int64_t alignment_of(std::initializer_list<const void*> ptrs) {
  std::uintptr_t bits = 16;
  for (const void* p : ptrs)
    if (p) bits |= reinterpret_cast<std::uintptr_t>(p);
  return static_cast<std::int64_t>(bits & (~bits + 1));
}

}  // namespace mpt::cuda::cudnn
