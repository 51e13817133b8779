// 2-D convolution through cuDNN 9's graph API (backend C API, no cudnn-frontend): the graphs
// and plans are built in conv_plans.cpp, here the per-device handle, the plan cache (one plan
// per problem, dtypes, fused epilogue, alignment and device), workspace from mpt's allocator and
// execution on the device's compute stream. Grouped convolutions (Keras's groups,
// DepthwiseConv2D) take the same graphs, the filter's C being Cin / groups (conv_plans.cpp).
//
// NHWC activations are described to cuDNN in place; mpt's [kh, kw, Cin, Cout] weights go through
// a KRSC copy ([Cout, kh, kw, Cin], cuDNN's NHWC filter layout) and dw comes back through one:
// described in place by their strides, cuDNN 9.19 planned them and computed wrong results on an
// H100 (conv_plans.cpp, filter()).
//
// Forward tries conv + bias add + activation as one graph first; cuDNN fuses conv -> add ->
// Relu/Sigmoid/Tanh but not an activation without the add, and where it cannot fuse, the bias
// and activation run as binary()/unary() on the output. Every pass computes in float32 (float64
// for float64) and, for float32 data, without TF32 unless mpt::cuda::allow_tf32(); only engines
// cuDNN does not note as nondeterministic run unless mpt::cuda::cudnn_deterministic() is off.
#include <cudnn_graph.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/cuda/conv_plans.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "mpt/device.hpp"
#include "mpt/error.hpp"
#include "backend/backend.hpp"

namespace mpt::cuda {
namespace {

using namespace conv;

constexpr int kMaxDevices = 16;

/// Per device: the plan of each problem; an empty ConvPlan when cuDNN has none for it. Guarded
/// by cudnn::mutex().
std::array<std::unordered_map<ConvKey, ConvPlan, ConvKeyHash>, kMaxDevices>& plans() {
  static auto* p = new std::array<std::unordered_map<ConvKey, ConvPlan, ConvKeyHash>, kMaxDevices>;
  return *p;  // never destroyed: plans outlive static destructors
}

/// The cached plan of k on GPU idx (built on first use), or null when cuDNN has no engine for it.
const ConvPlan* plan_for(const ConvKey& k, int idx) {
  std::lock_guard<std::mutex> lock(cudnn::mutex());
  cudnnHandle_t h = cudnn::handle_locked(idx);
  MPT_CHECK(idx < kMaxDevices, "conv2d: no GPU with index ", idx);
  auto& cache = plans()[idx];
  auto it = cache.find(k);
  if (it == cache.end()) {
    std::vector<ConvPlan> built = build_plans(k, PlanTarget{h, nullptr}, 1);
    it = cache.emplace(k, built.empty() ? ConvPlan{} : std::move(built.front())).first;
  }
  return it->second.plan ? &it->second : nullptr;
}

/// k's plan; mpt::Error when cuDNN has none.
const ConvPlan& require_plan(const ConvKey& k, int idx) {
  if (const ConvPlan* p = plan_for(k, idx)) return *p;
  fail("conv2d: cuDNN ", version_string(runtime_version()), " has no engine for ", describe(k), " on GPU ", idx,
       k.deterministic ? " (deterministic engines only: mpt::cuda::set_cudnn_deterministic(false) admits all)" : "");
}

/// conv_key with the process-wide settings that decide which engines may run.
ConvKey key_of(ConvPass pass, const Shape& x, const Shape& w, const Shape& y, const Conv2dGeometry& g, DType dtype) {
  ConvKey k = conv_key(pass, x, w, y, g, dtype);
  k.allow_tf32 = allow_tf32();
  k.deterministic = cudnn_deterministic();
  return k;
}

/// w ([kh, kw, Cin / groups, Cout]) as the KRSC copy cuDNN reads ([Cout, kh, kw, Cin / groups]).
Tensor krsc_copy(CudaBackend& backend, const Tensor& w) {
  const Shape& s = w.shape();
  Tensor wk = Tensor::empty({s[3], s[0], s[1], s[2]}, w.dtype(), w.device());
  backend.transpose(w, {3, 0, 1, 2}, wk);
  return wk;
}

using cudnn::alignment_of;
using cudnn::execute;

}  // namespace

void CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,
                         Activation act, Tensor& out) {
  if (out.numel() == 0) return;
  const int idx = out.device().index;
  DeviceGuard guard(idx);
  hint_tensor_core_shape("conv2d", static_cast<int>(x.dtype()), {x.shape()[3], w.shape()[3]});
  const Tensor wk = krsc_copy(*this, w);
  ConvKey k = key_of(ConvPass::Forward, x.shape(), w.shape(), out.shape(), g, x.dtype());
  k.alignment = alignment_of({x.data_ptr(), wk.data_ptr(), out.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr});
  cudnnPointwiseMode_t mode{};
  const Activation fused_act = cudnn_pointwise(act, mode) ? act : Activation::Linear;
  const auto activate_after = [&] {
    if (act != fused_act) unary(act, out, out, common::unary_default_param(act));
  };
  if (bias.defined() || fused_act != Activation::Linear) {
    ConvKey f = k;
    f.bias = bias.defined();
    if (f.bias) f.bias_dtype = bias.dtype();
    f.act = fused_act;
    if (const ConvPlan* p = plan_for(f, idx)) {
      std::vector<std::int64_t> uids{kUidX, kUidW, kUidY};
      std::vector<void*> ptrs{x.data_ptr(), wk.data_ptr(), out.data_ptr()};
      if (f.bias) uids.push_back(kUidBias), ptrs.push_back(bias.data_ptr());
      execute(*p, idx, uids, ptrs, out.device(), "conv2d");
      return activate_after();
    }
  }
  const ConvPlan& p = require_plan(k, idx);
  execute(p, idx, {kUidX, kUidW, kUidY}, {x.data_ptr(), wk.data_ptr(), out.data_ptr()}, out.device(), "conv2d");
  if (bias.defined()) binary(BinaryOp::Add, out, bias, out);  // bias [Cout] broadcasts over N, OH, OW
  if (act != Activation::Linear) unary(act, out, out, common::unary_default_param(act));
}

void CudaBackend::conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g,
                                  Tensor& dx, Tensor& dw, Tensor& dbias) {
  if (dy.numel() == 0) {  // an empty batch: zero gradients
    for (Tensor* t : {&dx, &dw, &dbias})
      if (t->defined()) fill(*t, 0.0);
    return;
  }
  const int idx = dy.device().index;
  DeviceGuard guard(idx);
  const Shape& ws = w.shape();
  hint_tensor_core_shape("conv2d backward", static_cast<int>(x.dtype()), {ws[2], ws[3]});
  if (dx.defined()) {
    const Tensor wk = krsc_copy(*this, w);
    ConvKey k = key_of(ConvPass::BackwardData, x.shape(), ws, dy.shape(), g, dx.dtype());
    k.alignment = alignment_of({dy.data_ptr(), wk.data_ptr(), dx.data_ptr()});
    const ConvPlan& p = require_plan(k, idx);
    execute(p, idx, {kUidX, kUidW, kUidY}, {dx.data_ptr(), wk.data_ptr(), dy.data_ptr()}, dx.device(),
            "conv2d backward (data)");
  }
  if (dw.defined()) {
    // dw in its own dtype, accumulated in float32. cuDNN's wgrad writes dw in x's dtype: a
    // float32 (or float64) dw of 16-bit data computes from float32 copies of x and dy, exact
    // products as the CPU's; any other mix computes in x's dtype and casts.
    Tensor xs = x, dys = dy, dwt = dw;
    if (dw.dtype() != x.dtype()) {
      if (dw.dtype() == float32 || dw.dtype() == float64) {
        xs = Tensor::empty(x.shape(), dw.dtype(), x.device());
        dys = Tensor::empty(dy.shape(), dw.dtype(), dy.device());
        cast(x, xs);
        cast(dy, dys);
      } else {
        dwt = Tensor::empty(ws, x.dtype(), dw.device());
      }
    }
    Tensor dwk = Tensor::empty({ws[3], ws[0], ws[1], ws[2]}, dwt.dtype(), dw.device());  // KRSC
    ConvKey k = key_of(ConvPass::BackwardFilter, xs.shape(), ws, dys.shape(), g, xs.dtype());
    k.dw_dtype = dwt.dtype();
    k.alignment = alignment_of({xs.data_ptr(), dys.data_ptr(), dwk.data_ptr()});
    const ConvPlan& p = require_plan(k, idx);
    execute(p, idx, {kUidX, kUidW, kUidY}, {xs.data_ptr(), dwk.data_ptr(), dys.data_ptr()}, dw.device(),
            "conv2d backward (weights)");
    transpose(dwk, {1, 2, 3, 0}, dwt);  // [Cout, kh, kw, Cin] -> [kh, kw, Cin, Cout]
    if (dwt.data_ptr() != dw.data_ptr()) cast(dwt, dw);
  }
  if (dbias.defined()) {
    // Sum of dy over N, OH, OW: dy viewed as [N*OH*OW, Cout] reduced over its rows.
    const std::int64_t cout = dy.shape()[3];
    Tensor rows = dy.reshape({dy.numel() / cout, cout});
    Tensor db = dbias.reshape({1, cout});
    reduce(ReduceOp::Sum, rows, 0, db);
  }
}

}  // namespace mpt::cuda
