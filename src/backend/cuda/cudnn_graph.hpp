#pragma once
/// What every cuDNN graph of the CUDA backend shares (convolutions in conv_plans.*, attention in
/// attention_plans.*), over the backend C API of cudnn_graph.h (no cudnn-frontend): owning
/// descriptors, tensor and pointwise descriptors, graph finalization, engine heuristics and
/// execution plans for a PlanTarget (a handle, or a device description that needs no GPU), the
/// per-GPU handles and execution of a plan on the device's compute stream.
///
///   cudnn::Graph& g = ...;                                  // tensors and operations kept in g.parts
///   if (!cudnn::finalize_graph(g, ops, target, "attention")) return {};   // no engine supports it
///   auto plans = cudnn::plans_for(graph, target, 1, accept, "attention");
#include <cudnn_graph.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mpt/device.hpp"

namespace mpt::cuda::cudnn {

/// An owning cudnnBackendDescriptor_t (movable, not copyable).
class Descriptor {
 public:
  Descriptor() = default;
  /// Creates a descriptor of `type`; check_cudnn names `what` on failure.
  Descriptor(cudnnBackendDescriptorType_t type, const char* what);
  ~Descriptor();
  Descriptor(Descriptor&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Descriptor& operator=(Descriptor&& o) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  explicit operator bool() const { return d_ != nullptr; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

/// The cuDNN library loaded at run time (cudnnGetVersion(), e.g. 91900 for 9.19.0), which may
/// be older than the headers mpt was built against (CUDNN_VERSION). The first call logs a
/// warning naming both when it is.
std::size_t runtime_version();
/// "9.19.0" for 91900.
std::string version_string(std::size_t version);
/// The first cuDNN with device descriptions (CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR).
constexpr std::size_t kDevicePropVersion = 90800;

/// What plans are built for: the GPU behind a cuDNN handle (which must outlive the plans), or a
/// device description (no GPU; the plans keep it alive).
struct PlanTarget {
  cudnnHandle_t handle = nullptr;
  std::shared_ptr<const Descriptor> device_prop;
};

/// A device description from its JSON text (the keys cuDNN's own serialization writes:
/// deviceName, deviceVer (sm * 10), driverVer, multiProcessorCount, ...); mpt::Error naming
/// the missing or malformed key otherwise, or naming the runtime when it is older than 9.8.
std::shared_ptr<const Descriptor> device_properties(const std::string& json);
/// The description of the GPU behind `handle`, serialized (what device_properties reads).
std::string serialize_device_properties(cudnnHandle_t handle);

/// An operation graph and every descriptor it refers to.
struct Graph {
  std::shared_ptr<const Descriptor> device_prop;  // what the graph is planned for, when no handle
  std::deque<Descriptor> parts;  // tensors, operations (a deque: references stay valid)
  Descriptor graph;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();  // each descriptor before the ones it refers to
  /// Keeps d alive as long as the graph; returns it.
  const Descriptor& keep(Descriptor d) {
    parts.push_back(std::move(d));
    return parts.back();
  }
};

/// An execution plan with everything it refers to. cuDNN's backend API does not promise that a
/// finalized descriptor copies the descriptors its attributes name, so the engine configuration
/// the plan was finalized from and the graph behind that configuration's engine (tensors,
/// operations, device description) live as long as the plan, as in cudnn-frontend, whose
/// ExecutionPlan_v8 holds its engine config, whose engine holds the operation graph, which holds
/// its operations. Members are destroyed in reverse order: the plan first.
struct Plan {
  std::shared_ptr<const Graph> graph;
  Descriptor config;  ///< CUDNN_BACKEND_ENGINECFG_DESCRIPTOR
  Descriptor plan;    ///< CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR
  std::int64_t workspace = 0;  ///< bytes
  std::int64_t engine = -1;    ///< cuDNN's global engine index
};

// ---- descriptor building (each failure an mpt::Error naming op and step) ----------------------
void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         std::int64_t count, const void* values, const char* op, const char* step);
void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, const Descriptor& v, const char* op,
              const char* step);
void set_i64(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, std::initializer_list<std::int64_t> v,
             const char* op, const char* step);
void finalize(const Descriptor& d, const char* op, const char* step);
/// cuDNN reports "this engine / graph is not supported here" in the 3000s.
bool not_supported(cudnnStatus_t s);

/// A tensor descriptor: uid, data type, dims and strides (cuDNN's logical order), virtual or not,
/// the byte alignment its pointer promises, and by_value for a scalar passed in the variant pack
/// by host pointer.
struct TensorSpec {
  std::int64_t uid = 0;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::vector<std::int64_t> dims, strides;
  bool is_virtual = false;
  std::int64_t alignment = 16;
  bool by_value = false;
};
Descriptor tensor(const TensorSpec& t, const char* op);

/// A pointwise operation y = mode(x[, b[, t]]) computed in `compute` (GEN_INDEX: along `axis`).
struct PointwiseSpec {
  cudnnPointwiseMode_t mode;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  std::int64_t axis = -1;  ///< GEN_INDEX only
};
Descriptor pointwise(const PointwiseSpec& p, const Descriptor& x, const Descriptor* b, const Descriptor& y,
                     const char* op, const Descriptor* t = nullptr);

/// Finalizes the operation graph of `ops` into g.graph; false when cuDNN supports no such graph.
bool finalize_graph(Graph& g, const std::vector<cudnnBackendDescriptor_t>& ops, const PlanTarget& target,
                    const char* op);

/// The numerical notes of the engine behind a configuration, and its global index.
struct EngineInfo {
  std::int64_t index = -1;
  std::vector<cudnnBackendNumericalNote_t> notes;
  bool has(cudnnBackendNumericalNote_t n) const;
};
EngineInfo engine_info(const Descriptor& cfg, const char* op);

/// Execution plans for the engine configurations cuDNN's heuristics (mode A, then fallback)
/// propose for g, in their order, each engine once, those `accept` refuses skipped, stopping
/// after max_plans (0: all). Empty when no engine finalizes.
std::vector<Plan> plans_for(const std::shared_ptr<Graph>& g, const PlanTarget& target, int max_plans,
                            const std::function<bool(const EngineInfo&)>& accept, const char* op);

// ---- running plans ------------------------------------------------------------------------
/// Guards the per-GPU handles and every use of one: cuDNN functions are thread-safe only for
/// threads that do not use the same handle at the same time. Plan caches use it too.
std::mutex& mutex();
/// The cuDNN handle of GPU idx, bound to its compute stream. Caller holds mutex().
cudnnHandle_t handle_locked(int idx);
/// Runs plan on GPU idx with the variant pack (uids, pointers; a by-value tensor's pointer is a
/// host pointer to its value) and workspace from mpt's stream-ordered allocator.
void execute(const Plan& plan, int idx, const std::vector<std::int64_t>& uids, std::vector<void*> ptrs,
             Device device, const char* op);
/// The largest power of two (at most 16 bytes) every pointer is aligned to: cuDNN picks
/// vectorized kernels by the alignment the tensors promise.
std::int64_t alignment_of(std::initializer_list<const void*> ptrs);

}  // namespace mpt::cuda::cudnn
