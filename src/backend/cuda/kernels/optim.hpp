#pragma once
// Kernel bodies of the fused optimizer updates, the multi-tensor unscale-and-check and the
// loss-scale step (src/backend/cuda/optim.cu launches them; the tests run them on the host).
//
// The updates do the CPU backend's float32 arithmetic (src/backend/cpu/optim.cpp) in the same
// order, one element per grid-stride step, so float32 results are bit-equal. nvcc would fuse
// a * b + c into an fma (one rounding instead of two) where the CPU rounds twice; the exact::
// helpers below are the round-to-nearest intrinsics on the device, which nvcc never contracts,
// and plain operators on the host.
#include <cmath>
#include <cstdint>

#include "backend/common/adafactor.hpp"
#include "backend/common/loss_scale.hpp"
#include "backend/common/optim_rules.hpp"
#include "backend/cuda/kernels/launch.hpp"
#include "backend/cuda/kernels/element_types.hpp"

namespace mpt::kernels {


/// A variable or gradient element as float32 (float64 gradients rounded, as the CPU's load).
template <class T>
MPT_HOST_DEVICE inline float load_f32(T v) {
  return static_cast<float>(load(v));
}

/// Variable, gradient and copy element types, by code (the dtype switch runs once per block).
enum class GradType : std::int32_t { F32, F64, F16, BF16 };

/// The optional copy of the updated variable (mpt/optim_ops.hpp's `copy`): null when unused.
struct CopyOut {
  void* ptr = nullptr;
  GradType type = GradType::F32;
};

/// copy[i] = var[i] in the copy's type: cast's conversion of the stored, updated element.
template <class V>
MPT_HOST_DEVICE inline void copy_at(const CopyOut& c, const V* var, std::int64_t i) {
  if (!c.ptr) return;
  const float w = load_f32(var[i]);
  switch (c.type) {
    case GradType::F32: static_cast<float*>(c.ptr)[i] = w; break;
    case GradType::F16: static_cast<__half*>(c.ptr)[i] = store<__half>(w); break;
    case GradType::BF16: static_cast<__nv_bfloat16*>(c.ptr)[i] = store<__nv_bfloat16>(w); break;
    case GradType::F64: break;  // never a copy's type (src/ops refuses it)
  }
}

/// A gradient element in float32, times the update's grad_scale when that is not 1 (the
/// unscale of unscale_range below, fused into the update: the same product).
template <class G>
MPT_HOST_DEVICE inline float grad_at(const G* grad, std::int64_t i, float gs) {
  const float g = load_f32(grad[i]);
  return gs == 1.0f ? g : exact::mul(g, gs);
}

// ---- fused updates: var (V) and grad (G) in their storage types, slots float32 ------------------
//
// Each update is one function of element i (*_at) that both the single-tensor grid-stride bodies
// and the multi-tensor bodies below call, so the two paths give the same bits.

/// SGD: var -= g * lr; with momentum m = m * mu - g * lr, var += nesterov ? m * mu - g * lr : m.
template <class V, class G>
MPT_HOST_DEVICE inline void sgd_at(V* var, const G* grad, float* momentum, float lr, float mu, bool nesterov,
                                   float gs, std::int64_t i) {
  float w = load_f32(var[i]);
  const float g = grad_at(grad, i, gs);
  if (!momentum) {
    w = exact::sub(w, exact::mul(g, lr));
  } else {
    const float m = exact::sub(exact::mul(momentum[i], mu), exact::mul(g, lr));
    momentum[i] = m;
    w = exact::add(w, nesterov ? exact::sub(exact::mul(m, mu), exact::mul(g, lr)) : m);
  }
  var[i] = store<V>(w);
}

template <class V, class G>
MPT_HOST_DEVICE void sgd_body(const Thread& t, V* var, const G* grad, float* momentum, float lr,
                              float mu, bool nesterov, std::int64_t n, CopyOut copy = {}, float gs = 1.0f) {
  for (std::int64_t i = t.global(); i < n; i += t.stride()) {
    sgd_at(var, grad, momentum, lr, mu, nesterov, gs, i);
    copy_at(copy, var, i);
  }
}

/// Adam/AdamW (Keras's form): c1 = 1 - beta_1, c2 = 1 - beta_2, decay the decoupled weight decay;
/// vhat (amsgrad) null when unused.
template <class V, class G>
MPT_HOST_DEVICE inline void adam_at(V* var, const G* grad, float* m, float* v, float* vhat, float alpha, float c1,
                                    float c2, float eps, float decay, float gs, std::int64_t i) {
  float w = load_f32(var[i]);
  const float g = grad_at(grad, i, gs);
  if (decay != 0.0f) w = exact::sub(w, exact::mul(w, decay));
  const float mm = exact::add(m[i], exact::mul(exact::sub(g, m[i]), c1));
  const float vv = exact::add(v[i], exact::mul(exact::sub(exact::mul(g, g), v[i]), c2));
  m[i] = mm;
  v[i] = vv;
  float second = vv;
  if (vhat) {
    const float h = vhat[i];
    second = h < vv ? vv : h;  // std::max's rule, as the CPU: a NaN in vhat stays
    vhat[i] = second;
  }
  w = exact::sub(w, exact::div(exact::mul(mm, alpha), exact::add(exact::sqrt(second), eps)));
  var[i] = store<V>(w);
}

template <class V, class G>
MPT_HOST_DEVICE void adam_body(const Thread& t, V* var, const G* grad, float* m, float* v, float* vhat,
                               float alpha, float c1, float c2, float eps, float decay, std::int64_t n,
                               CopyOut copy = {}, float gs = 1.0f) {
  for (std::int64_t i = t.global(); i < n; i += t.stride()) {
    adam_at(var, grad, m, v, vhat, alpha, c1, c2, eps, decay, gs, i);
    copy_at(copy, var, i);
  }
}

/// RMSprop (Keras's form): c = 1 - rho; average_grad (centered) and momentum null when unused.
template <class V, class G>
MPT_HOST_DEVICE inline void rmsprop_at(V* var, const G* grad, float* velocity, float* average_grad, float* momentum,
                                       float lr, float rho, float c, float mu, float eps, float gs,
                                       std::int64_t i) {
  float w = load_f32(var[i]);
  const float g = grad_at(grad, i, gs);
  const float vel = exact::add(exact::mul(rho, velocity[i]), exact::mul(c, exact::mul(g, g)));
  velocity[i] = vel;
  float denom;
  if (average_grad) {
    const float avg = exact::add(exact::mul(rho, average_grad[i]), exact::mul(c, g));
    average_grad[i] = avg;
    denom = exact::add(exact::sub(vel, exact::mul(avg, avg)), eps);
  } else {
    denom = exact::add(vel, eps);
  }
  const float inc = exact::div(exact::mul(lr, g), exact::sqrt(denom));
  if (momentum) {
    const float mo = exact::add(exact::mul(mu, momentum[i]), inc);
    momentum[i] = mo;
    w = exact::sub(w, mo);
  } else {
    w = exact::sub(w, inc);
  }
  var[i] = store<V>(w);
}

template <class V, class G>
MPT_HOST_DEVICE void rmsprop_body(const Thread& t, V* var, const G* grad, float* velocity, float* average_grad,
                                  float* momentum, float lr, float rho, float c, float mu, float eps,
                                  std::int64_t n, CopyOut copy = {}, float gs = 1.0f) {
  for (std::int64_t i = t.global(); i < n; i += t.stride()) {
    rmsprop_at(var, grad, velocity, average_grad, momentum, lr, rho, c, mu, eps, gs, i);
    copy_at(copy, var, i);
  }
}

// ---- unscale_and_check: PyTorch's multi_tensor_apply pattern ------------------------------------
//
// One launch covers many gradients: the kernel argument (within the 4 KB parameter limit) holds
// up to kUnscaleTensors tensors and, per block, which tensor and which chunk of it that block
// unscales. Large tensors spread over many blocks (and launches); a tensor cut by a full launch
// carries over to the next one as its first entry.

struct UnscaleTensor {
  const void* in;
  float* out;
  std::int64_t numel;
  GradType type;
  std::int32_t index;  ///< position in the caller's list (for the per-tensor flags)
};

constexpr int kUnscaleTensors = 60;
constexpr int kUnscaleBlocks = 320;

struct UnscaleArgs {
  UnscaleTensor tensors[kUnscaleTensors];
  std::int32_t block_chunk[kUnscaleBlocks];   ///< chunk of its tensor that block b unscales
  std::uint8_t block_tensor[kUnscaleBlocks];  ///< entry of tensors[] block b works on
  const float* inv_scale;                     ///< device scalar
  float* found;                               ///< device scalar, zeroed before the first launch
  float* flags;                               ///< per-tensor flags (zeroed, one per caller index), or null
  std::int64_t chunk;                         ///< elements per chunk
};
static_assert(sizeof(UnscaleArgs) <= 4096, "kernel parameters are limited to 4 KB");
static_assert(kUnscaleTensors <= 256, "block_tensor is a uint8");

/// One gradient of the list (in: its storage; out: float32 of the same numel).
struct UnscaleItem {
  const void* in;
  float* out;
  std::int64_t numel;
  GradType type;
};

/// PyTorch's multi-tensor packing, shared by unscale_and_check and the list optimizer updates:
/// item k (numel_of(k) > 0; others skipped) goes into a.tensors[] through put(slot, k), each of its
/// chunks into a.block_tensor[] / a.block_chunk[]; a full argument struct (MaxBlocks blocks, or
/// MaxTensors tensors at a tensor's end) is handed to launch(args, blocks), and a tensor cut off
/// by a full launch carries on in the next one.
template <int MaxTensors, int MaxBlocks, class Args, class NumelOf, class Put, class Launch>
void pack_chunks(Args& a, std::int32_t count, std::int64_t chunk, NumelOf&& numel_of, Put&& put, Launch&& launch) {
  int tensors = 0, blocks = 0;
  for (std::int32_t k = 0; k < count; ++k) {
    const std::int64_t numel = numel_of(k);
    if (numel <= 0) continue;
    put(a.tensors[tensors++], k);
    const std::int64_t chunks = (numel + chunk - 1) / chunk;
    for (std::int64_t c = 0; c < chunks; ++c) {
      a.block_tensor[blocks] = static_cast<std::uint8_t>(tensors - 1);
      a.block_chunk[blocks] = static_cast<std::int32_t>(c);
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      if (blocks == MaxBlocks || (tensors == MaxTensors && last_chunk)) {
        launch(static_cast<const Args&>(a), static_cast<unsigned>(blocks));
        blocks = 0;
        if (last_chunk) {
          tensors = 0;
        } else {  // the rest of this tensor goes on in the next launch
          a.tensors[0] = a.tensors[tensors - 1];
          tensors = 1;
        }
      }
    }
  }
  if (blocks > 0) launch(static_cast<const Args&>(a), static_cast<unsigned>(blocks));
}

/// Packs items into as few UnscaleArgs as fit and calls launch(args, blocks) for each (blocks:
/// the grid). Host code; the tests call it with a small chunk so tensors cross chunks and launches.
template <class Launch>
void pack_unscale(const UnscaleItem* items, std::int32_t count, const float* inv_scale, float* found, float* flags,
                  std::int64_t chunk, Launch&& launch) {
  UnscaleArgs a{};
  a.inv_scale = inv_scale, a.found = found, a.flags = flags, a.chunk = chunk;
  pack_chunks<kUnscaleTensors, kUnscaleBlocks>(
      a, count, chunk, [&](std::int32_t k) { return items[k].numel; },
      [&](auto& slot, std::int32_t k) {
        const UnscaleItem& it = items[k];
        slot = {it.in, it.out, it.numel, it.type, k};
      },
      launch);
}

template <class G>
MPT_HOST_DEVICE inline bool unscale_range(const G* in, float* out, std::int64_t i, std::int64_t end,
                                          std::int64_t step, float s) {
  bool bad = false;
  for (; i < end; i += step) {
    const float o = load_f32(in[i]) * s;
    if (out) out[i] = o;  // null: check only (check_unscaled)
    bad |= nonfinite(o);
  }
  return bad;
}

/// Block b unscales chunk block_chunk[b] of tensor block_tensor[b]; any thread that met inf or
/// NaN stores 1 into found (the same value from every such thread: a benign race).
MPT_HOST_DEVICE inline void unscale_body(const Thread& t, const UnscaleArgs& a) {
  const UnscaleTensor& e = a.tensors[a.block_tensor[t.block.x]];
  const std::int64_t begin = static_cast<std::int64_t>(a.block_chunk[t.block.x]) * a.chunk;
  const std::int64_t end = begin + a.chunk < e.numel ? begin + a.chunk : e.numel;
  const std::int64_t i = begin + t.thread.x, step = t.block_dim.x;
  const float s = *a.inv_scale;
  bool bad = false;
  switch (e.type) {
    case GradType::F32: bad = unscale_range(static_cast<const float*>(e.in), e.out, i, end, step, s); break;
    case GradType::F64: bad = unscale_range(static_cast<const double*>(e.in), e.out, i, end, step, s); break;
    case GradType::F16: bad = unscale_range(static_cast<const __half*>(e.in), e.out, i, end, step, s); break;
    case GradType::BF16: bad = unscale_range(static_cast<const __nv_bfloat16*>(e.in), e.out, i, end, step, s); break;
  }
  if (bad) {
    *a.found = 1.0f;
    if (a.flags) a.flags[e.index] = 1.0f;
  }
}

// ---- the updates of many variables in few launches ----------------------------------------------
//
// The same packing as unscale_and_check (PyTorch's multi_tensor_apply): a launch's argument holds
// up to kUpdateTensors variables (pointers, storage types, numel) and, per block, which variable
// and which chunk of it that block updates; a variable cut by a full launch carries over to the
// next one. Each element goes through the single-tensor path's *_at function, so the results
// are the same bits. The hyperparameters are shared by all variables of a call.

enum class UpdateKind : std::int32_t { Sgd, Adam, Rmsprop, Nadam, Adamax, Adagrad, Lion };

/// One variable: var in its storage type (float32, float16, bfloat16; by code), grad in any
/// floating type, the float32 slots (null when unused):
///   Sgd: momentum;  Adam: m, v, vhat;  Rmsprop: velocity, average_grad, momentum;
///   Nadam: momentum, velocity;  Adamax: momentum, norm;  Adagrad: accumulator;  Lion: momentum;
/// and the optional copy of the updated variable.
struct UpdateTensor {
  void* var;
  const void* grad;
  float* slot[3];
  std::int64_t numel;
  GradType var_type, grad_type;
  CopyOut copy;
};

/// The step's float32 constants, rounded from the same doubles as the single-tensor launches:
/// Sgd uses lr, mu, nesterov; Adam alpha, c1 = 1 - beta_1, c2 = 1 - beta_2, eps, decay;
/// Rmsprop lr, rho, c = 1 - rho, mu, eps.
struct UpdateHyper {
  float lr = 0, mu = 0, alpha = 0, c1 = 0, c2 = 0, eps = 0, decay = 0, rho = 0, c = 0;
  float grad_scale = 1;  ///< every kind: multiplies each gradient element (grad_at)
  bool nesterov = false;
  common::RuleHyper rule;  ///< Nadam, Adamax, Adagrad, Lion: the rule's constants
};

constexpr int kUpdateTensors = 32;
constexpr int kUpdateBlocks = 320;

struct UpdateArgs {
  UpdateTensor tensors[kUpdateTensors];
  std::int32_t block_chunk[kUpdateBlocks];   ///< chunk of its variable that block b updates
  std::uint8_t block_tensor[kUpdateBlocks];  ///< entry of tensors[] block b works on
  UpdateHyper h;
  std::int64_t chunk;  ///< elements per chunk
};
static_assert(sizeof(UpdateArgs) <= 4096, "kernel parameters are limited to 4 KB");
static_assert(kUpdateTensors <= 256, "block_tensor is a uint8");

/// Packs items (numel 0 skipped) into as few UpdateArgs as fit and calls launch(args, blocks)
/// for each. Host code; the tests call it with a small chunk so variables cross chunks and
/// launches.
template <class Launch>
void pack_updates(const UpdateTensor* items, std::int32_t count, const UpdateHyper& h, std::int64_t chunk,
                  Launch&& launch) {
  UpdateArgs a{};
  a.h = h, a.chunk = chunk;
  pack_chunks<kUpdateTensors, kUpdateBlocks>(
      a, count, chunk, [&](std::int32_t k) { return items[k].numel; },
      [&](UpdateTensor& slot, std::int32_t k) { slot = items[k]; }, launch);
}

/// Nadam, Adamax, Adagrad and Lion: element i through its rule of backend/common/optim_rules.hpp
/// (the CPU runs the same functions over its blocks); s1 null for the one-slot rules.
template <UpdateKind K, class V, class G>
MPT_HOST_DEVICE inline void rule_at(V* var, const G* grad, float* s0, float* s1, const common::RuleHyper& h, float gs,
                                    std::int64_t i) {
  float w = load_f32(var[i]);
  const float g = grad_at(grad, i, gs);
  if constexpr (K == UpdateKind::Nadam) common::nadam_rule(w, g, s0[i], s1[i], h);
  else if constexpr (K == UpdateKind::Adamax) common::adamax_rule(w, g, s0[i], s1[i], h);
  else if constexpr (K == UpdateKind::Adagrad) common::adagrad_rule(w, g, s0[i], h);
  else common::lion_rule(w, g, s0[i], h);
  var[i] = store<V>(w);
}

template <UpdateKind K, class V, class G>
MPT_HOST_DEVICE inline void update_range(const UpdateTensor& e, const UpdateHyper& h, std::int64_t i,
                                         std::int64_t end, std::int64_t step) {
  V* var = static_cast<V*>(e.var);
  const G* grad = static_cast<const G*>(e.grad);
  for (; i < end; i += step) {
    if constexpr (K == UpdateKind::Sgd)
      sgd_at(var, grad, e.slot[0], h.lr, h.mu, h.nesterov, h.grad_scale, i);
    else if constexpr (K == UpdateKind::Adam)
      adam_at(var, grad, e.slot[0], e.slot[1], e.slot[2], h.alpha, h.c1, h.c2, h.eps, h.decay, h.grad_scale, i);
    else if constexpr (K == UpdateKind::Rmsprop)
      rmsprop_at(var, grad, e.slot[0], e.slot[1], e.slot[2], h.lr, h.rho, h.c, h.mu, h.eps, h.grad_scale, i);
    else
      rule_at<K>(var, grad, e.slot[0], e.slot[1], h.rule, h.grad_scale, i);
    copy_at(e.copy, var, i);
  }
}

template <UpdateKind K, class V>
MPT_HOST_DEVICE inline void update_range(const UpdateTensor& e, const UpdateHyper& h, std::int64_t i,
                                         std::int64_t end, std::int64_t step) {
  switch (e.grad_type) {
    case GradType::F32: update_range<K, V, float>(e, h, i, end, step); break;
    case GradType::F64: update_range<K, V, double>(e, h, i, end, step); break;
    case GradType::F16: update_range<K, V, __half>(e, h, i, end, step); break;
    case GradType::BF16: update_range<K, V, __nv_bfloat16>(e, h, i, end, step); break;
  }
}

/// Block b updates chunk block_chunk[b] of variable block_tensor[b], its threads striding by
/// the block size (the type switches run once per block).
template <UpdateKind K>
MPT_HOST_DEVICE void update_multi_body(const Thread& t, const UpdateArgs& a) {
  const UpdateTensor& e = a.tensors[a.block_tensor[t.block.x]];
  const std::int64_t begin = static_cast<std::int64_t>(a.block_chunk[t.block.x]) * a.chunk;
  const std::int64_t end = begin + a.chunk < e.numel ? begin + a.chunk : e.numel;
  const std::int64_t i = begin + t.thread.x, step = t.block_dim.x;
  switch (e.var_type) {
    case GradType::F32: update_range<K, float>(e, a.h, i, end, step); break;
    case GradType::F16: update_range<K, __half>(e, a.h, i, end, step); break;
    case GradType::BF16: update_range<K, __nv_bfloat16>(e, a.h, i, end, step); break;
    case GradType::F64: break;  // variables are never float64 (src/ops refuses them)
  }
}

/// The loss-scale rule's step (backend/common/loss_scale.hpp) in one thread.
MPT_HOST_DEVICE inline void loss_scale_body(const Thread& t, float* scale, float* inv_scale, std::int64_t* counters,
                                            const float* found, bool dynamic, std::int64_t growth_steps,
                                            std::int64_t hysteresis, double min_scale, double max_scale) {
  if (t.global() != 0) return;
  loss_scale_step(*scale, *inv_scale, counters[0], counters[1], *found != 0.0f, dynamic, growth_steps, hysteresis,
                  min_scale, max_scale);
}


// ---- Adafactor: the phases of backend/common/adafactor.hpp, one launch each -----------------
//
// var and grad float32; r_or_v is r (factored) or v; the float64 scratch: wrow and urow [L·R],
// partial [segments · kSumChunks], totals [1 + L + 1] = Σ w², each block's Σ r, Σ u².

/// Phase 1: one row per grid-stride step.
MPT_HOST_DEVICE inline void adafactor_rows_body(const Thread& t, common::AdafactorShape s, common::AdafactorHyper h,
                                                const float* w, const float* g, float* r_or_v, double* wrow) {
  const std::int64_t n = s.blocks * s.rows;
  for (std::int64_t q = t.global(); q < n; q += t.stride()) common::adafactor_row(s, h, w, g, r_or_v, wrow, q);
}

/// Phase 2: one column per step (consecutive threads, consecutive columns: coalesced).
MPT_HOST_DEVICE inline void adafactor_cols_body(const Thread& t, common::AdafactorShape s, common::AdafactorHyper h,
                                                const float* g, float* col) {
  const std::int64_t n = s.blocks * s.cols;
  for (std::int64_t q = t.global(); q < n; q += t.stride()) common::adafactor_col(s, h, g, col, q);
}

/// The chunk sums of `segments` consecutive segments of seg_len elements of x:
/// partial[seg · kSumChunks + k] = chunk k of segment seg.
template <class T>
MPT_HOST_DEVICE void chunk_sums_body(const Thread& t, const T* x, std::int64_t seg_len, std::int64_t segments,
                                     double* partial) {
  const std::int64_t n = segments * common::kSumChunks;
  for (std::int64_t p = t.global(); p < n; p += t.stride()) {
    const std::int64_t seg = p / common::kSumChunks;
    partial[p] = common::chunk_sum(x + seg * seg_len, seg_len, static_cast<int>(p % common::kSumChunks));
  }
}

/// totals[seg] = the segment's chunk sums added in order.
MPT_HOST_DEVICE inline void chunk_totals_body(const Thread& t, const double* partial, std::int64_t segments,
                                              double* totals) {
  for (std::int64_t seg = t.global(); seg < segments; seg += t.stride())
    totals[seg] = common::chunks_total(partial + seg * common::kSumChunks);
}

/// Phase 4: Σ_c u² of each row; rsum = totals + 1.
MPT_HOST_DEVICE inline void adafactor_u_rows_body(const Thread& t, common::AdafactorShape s, const float* g,
                                                  const float* r_or_v, const float* col, const double* rsum,
                                                  double* urow) {
  const std::int64_t n = s.blocks * s.rows;
  for (std::int64_t q = t.global(); q < n; q += t.stride()) common::adafactor_u_row(s, g, r_or_v, col, rsum, urow, q);
}

/// Phase 6: every element; totals as above.
MPT_HOST_DEVICE inline void adafactor_apply_body(const Thread& t, common::AdafactorShape s, common::AdafactorHyper h,
                                                 float* w, const float* g, const float* r_or_v, const float* col,
                                                 const double* totals) {
  const std::int64_t n = s.size();
  float alpha, denom;
  common::adafactor_step(s, h, totals[0], totals[1 + (s.factored ? s.blocks : 0)], alpha, denom);
  for (std::int64_t i = t.global(); i < n; i += t.stride()) {
    const std::int64_t q = i / s.cols, c = i % s.cols;
    common::adafactor_apply(s, h, w, g, common::adafactor_row_factor(s, r_or_v, totals + 1, q),
                            common::adafactor_col_of(s, col, q), alpha, denom, q, c);
  }
}
}  // namespace mpt::kernels
