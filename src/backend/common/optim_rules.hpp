#pragma once
// The element-wise update rules of Nadam, Adamax, Adagrad and Lion (mpt/optim_ops.hpp's
// rule_update), each defined once here: the CPU backend runs them over float32 blocks inside its
// vector clones (cpu/optim.cpp), CUDA once per element (cuda/kernels/optim.hpp). Every step
// rounds through exact:: (plain operators on the host, where optim.cpp is compiled with
// -ffp-contract=off; the round-to-nearest intrinsics on the device), so float32 results are
// bit-equal on both. The step's constants are rounded to float32 once, by src/ops/optim_ops.cpp, for both.
#include <cmath>
#include <cstdint>

#include "backend/common/host_device.hpp"
#include "backend/common/unary_ops.hpp"

namespace mpt::common {

/// Which rule (the order of mpt::ops::UpdateRule).
enum class RuleKind : std::int32_t { Nadam, Adamax, Adagrad, Lion };

/// How many float32 slots each rule updates (slot k of an entry is its k-th slot list).
MPT_HOST_DEVICE constexpr int rule_slots(RuleKind r) { return r == RuleKind::Nadam || r == RuleKind::Adamax ? 2 : 1; }

/// A step's float32 constants (rounded from mpt::ops::RuleArgs by src/ops/optim_ops.cpp). lr: the learning rate; decay: the decoupled weight decay
/// (weight_decay * lr, 0 for none), applied first as Keras's _apply_weight_decay; the others by rule:
///   Nadam:   c1 = 1 - beta_1, c2 = 1 - beta_2, k0 = u_{t+1}, k1 = 1 - u_product_{t+1},
///            k2 = 1 - u_t, k3 = 1 - u_product_t, k4 = 1 - beta_2^t, eps
///   Adamax:  c1 = 1 - beta_1, b2 = beta_2, k0 = 1 - beta_1^t, eps
///   Adagrad: eps
///   Lion:    k0 = beta_1, c1 = 1 - beta_1, b2 = beta_2, c2 = 1 - beta_2
struct RuleHyper {
  float lr = 0, decay = 0, eps = 0, c1 = 0, c2 = 0, b2 = 0;
  float k0 = 0, k1 = 0, k2 = 0, k3 = 0, k4 = 0;
};

/// var -= var * decay (Keras: variable - variable * weight_decay * lr, before the update).
MPT_HOST_DEVICE inline float decayed(float w, float decay) {
  return decay != 0.0f ? exact::sub(w, exact::mul(w, decay)) : w;
}

/// Keras's Nadam: m += (g - m)(1 - b1); v += (g² - v)(1 - b2);
/// m̂ = u_{t+1} m / (1 - Π_{t+1}) + (1 - u_t) g / (1 - Π_t); v̂ = v / (1 - b2^t);
/// var -= m̂ lr / (sqrt(v̂) + eps).
MPT_HOST_DEVICE inline void nadam_rule(float& w, float g, float& m, float& v, const RuleHyper& h) {
  w = decayed(w, h.decay);
  const float mm = exact::add(m, exact::mul(exact::sub(g, m), h.c1));
  const float vv = exact::add(v, exact::mul(exact::sub(exact::mul(g, g), v), h.c2));
  m = mm;
  v = vv;
  const float m_hat = exact::add(exact::div(exact::mul(h.k0, mm), h.k1), exact::div(exact::mul(h.k2, g), h.k3));
  const float v_hat = exact::div(vv, h.k4);
  w = exact::sub(w, exact::div(exact::mul(m_hat, h.lr), exact::add(exact::sqrt(v_hat), h.eps)));
}

/// Keras's Adamax: m += (g - m)(1 - b1); u = max(b2 u, |g|); var -= lr m / ((1 - b1^t)(u + eps)).
MPT_HOST_DEVICE inline void adamax_rule(float& w, float g, float& m, float& u, const RuleHyper& h) {
  w = decayed(w, h.decay);
  const float mm = exact::add(m, exact::mul(exact::sub(g, m), h.c1));
  const float bu = exact::mul(h.b2, u);
  const float ag = g < 0.0f ? -g : g;
  const float uu = bu < ag ? ag : bu;  // std::max's rule on both backends
  m = mm;
  u = uu;
  w = exact::sub(w, exact::div(exact::mul(h.lr, mm), exact::mul(h.k0, exact::add(uu, h.eps))));
}

/// Keras's Adagrad: acc += g²; var -= lr g / sqrt(acc + eps).
MPT_HOST_DEVICE inline void adagrad_rule(float& w, float g, float& acc, const RuleHyper& h) {
  w = decayed(w, h.decay);
  const float a = exact::add(acc, exact::mul(g, g));
  acc = a;
  w = exact::sub(w, exact::div(exact::mul(h.lr, g), exact::sqrt(exact::add(a, h.eps))));
}

/// sign(x): -1, 0 or 1 (x itself for zeros and NaN, as jnp.sign).
MPT_HOST_DEVICE inline float sign_of(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }

/// Keras's Lion: var -= lr sign(b1 m + (1 - b1) g); m = b2 m + (1 - b2) g.
MPT_HOST_DEVICE inline void lion_rule(float& w, float g, float& m, const RuleHyper& h) {
  w = decayed(w, h.decay);
  const float c = exact::add(exact::mul(m, h.k0), exact::mul(g, h.c1));
  w = exact::sub(w, exact::mul(h.lr, sign_of(c)));
  m = exact::add(exact::mul(m, h.b2), exact::mul(g, h.c2));
}

}  // namespace mpt::common
