#pragma once
// oneDNN engine/stream and the primitive cache shared by the CPU kernels that use oneDNN.
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "backend/common/unary_ops.hpp"
#include "mpt/error.hpp"
#include "mpt/tensor.hpp"

namespace mpt::cpu {

dnnl::engine& dnnl_engine();
dnnl::stream& dnnl_stream();
/// True when oneDNN runs on AMX and mpt's own AMX kernels may too (see prepare_cpu_isa).
bool amx_enabled();
/// True when oneDNN has bfloat16 kernels on this CPU (AVX-512 and up); bfloat16 GEMMs and
/// convolutions compute in float32 where it has none.
bool dnnl_has_bf16();
/// True where oneDNN's bfloat16 kernels without AMX (vdpbf16ps) beat computing in float32: AMD
/// CPUs with AVX512-BF16 (Zen 4 and later), whose vdpbf16ps does twice the work of a float32 FMA
/// at the same rate (465 against 234 GFLOP/s on the 2-core EPYC). Not Intel CPUs without AMX,
/// where it issues at half the rate (101 against 216 GFLOP/s per core on the Xeon, AMX off).
bool bf16_dot_full_rate();
/// True where a bfloat16 GEMM runs natively (bf16 operands, float32 accumulation) rather than
/// computing in float32 copies: on AMX and where bf16_dot_full_rate. Elsewhere oneDNN's bf16
/// matmul is emulated or half-rate: on a Cascade Lake Xeon (AVX-512, no AVX512-BF16) the GPT-mini
/// step of bench_side took 2.0 s in bf16 against 0.77 s in float32.
/// MPT_CPU_BF16_MATMUL=native|float32 forces one (tests, benchmarks).
bool bf16_gemm_native();
dnnl::memory::data_type dnnl_type(DType d);
/// Primitive attributes applying `act` (with its default parameter) as an eltwise post-op;
/// none for Linear. Every activation has its oneDNN algorithm.
dnnl::primitive_attr activation_attr(Activation act);

/// Primitives created once per key (shape, dtypes, attributes) and reused.
template <class Prim>
class PrimitiveCache {
 public:
  /// Returns the cached primitive for `key`, building it with `make` the first time.
  Prim& get(const std::string& key, const std::function<Prim()>& make) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return *it->second;
    auto p = std::make_unique<Prim>(make());
    return *cache_.emplace(key, std::move(p)).first->second;
  }
  std::size_t size() const { return cache_.size(); }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<Prim>> cache_;
};

/// Runs f, turning dnnl::error into mpt::Error naming the op.
template <class F>
void dnnl_call(const char* op, F&& f) {
  try {
    f();
  } catch (const dnnl::error& e) {
    fail(op, ": oneDNN failed: ", e.what(), " (status ", static_cast<int>(e.status), ")");
  }
}

}  // namespace mpt::cpu
