// The CUDA optimizer, loss-scaling and pooling kernels (src/backend/cuda/kernels/optim.hpp,
// pool.hpp) run on the host through emulate, on small grids so grid-stride loops wrap and chunk
// tails are partial, against the CPU backend: the same bits in every dtype.
#include <algorithm>
#include <array>
#include <functional>
#include <tuple>
#include <cmath>
#include <cstring>
#include <optional>
#include <limits>
#include <random>

#include "backend/backend.hpp"
#include "mpt/optim_ops.hpp"
#include "backend/cuda/kernels/optim.hpp"
#include "backend/cuda/kernels/pool.hpp"
#include "test_util.hpp"

using namespace mpt;
namespace k = mpt::kernels;

namespace {

Backend& cpu() { return detail::backend(Device::cpu()); }

/// A CPU tensor of dtype d holding vals (rounded from float64).
Tensor make(const std::vector<double>& vals, const Shape& shape, DType d) {
  return Tensor::from_vector(vals, shape, Device::cpu()).to(d).copy();
}

std::vector<double> uniform(std::size_t n, double lo, double hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

/// A tensor's storage as T (the kernel's view of device memory).
template <class T>
std::vector<T> storage(const Tensor& t) {
  std::vector<T> v(static_cast<std::size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.data_ptr(), t.nbytes());
  return v;
}


/// Index of the first element whose bits differ, or -1 (NaNs included: types.hpp's store keeps a
/// NaN's sign and payload as the CPU's conversion does).
template <class T>
std::int64_t first_diff(const Tensor& expected, const std::vector<T>& actual) {
  REQUIRE(expected.nbytes() == actual.size() * sizeof(T));
  const T* e = static_cast<const T*>(expected.data_ptr());
  for (std::size_t i = 0; i < actual.size(); ++i)
    if (std::memcmp(&e[i], &actual[i], sizeof(T)) != 0)
      return static_cast<std::int64_t>(i);
  return -1;
}

#define CHECK_SAME_BITS(expected, actual, what)                                                         \
  do {                                                                                                  \
    const std::int64_t at_ = first_diff(expected, actual);                                              \
    CHECK_MESSAGE(at_ == -1, what, ": first differing element ", at_);                                  \
  } while (0)

template <class F>
void with_type(DType d, F&& f) {
  k::dispatch_float(d, "test", std::forward<F>(f));
}

const k::Dim kGrid{3}, kBlock{32};  // 96 threads over ~1000 elements: grid-stride loops wrap

}  // namespace

// ---- optimizer updates --------------------------------------------------------------------------

namespace {

struct Update {
  Tensor var, grad;
  std::vector<Tensor> slots;  // float32, some null per case
};

/// The same starting state twice: one copy for the CPU backend, one as kernel storage.
Update start(std::int64_t n, DType var_dtype, DType grad_dtype, unsigned seed) {
  Update u;
  u.var = make(uniform(n, -2, 2, seed), {n}, var_dtype);
  std::vector<double> g = uniform(n, -1, 1, seed + 1);
  g[0] = 0.0, g[n / 2] = -0.0;
  u.grad = make(g, {n}, grad_dtype);
  u.slots.push_back(make(uniform(n, -0.5, 0.5, seed + 2), {n}, float32));  // m / momentum / avg
  u.slots.push_back(make(uniform(n, 1.0, 2.0, seed + 3), {n}, float32));   // v / velocity (> avg^2)
  u.slots.push_back(make(uniform(n, 0.0, 3.0, seed + 4), {n}, float32));   // vhat / momentum
  return u;
}

float* ptr(std::vector<float>& v, bool used) { return used ? v.data() : nullptr; }

/// The grad_scale of case k: 1 (nothing to multiply) or an inverse loss scale, in turn.
double grad_scale_of(int k) { return k % 2 ? 1.0 / 1024 : 1.0; }

/// The copy dtype of case k (optim_ops.hpp's copy): none, bfloat16, float16, float32 in turn.
std::optional<DType> copy_dtype(int k) {
  switch (k % 4) {
    case 1: return bfloat16;
    case 2: return float16;
    case 3: return float32;
    default: return std::nullopt;
  }
}

k::GradType copy_type(DType d) {
  return d == bfloat16 ? k::GradType::BF16 : d == float16 ? k::GradType::F16 : k::GradType::F32;
}

/// A copy of case k for a variable of n elements: the CPU backend's tensor (undefined when the
/// case has none) and the kernel's bytes.
struct Copy {
  Tensor cpu;
  std::vector<unsigned char> bytes;
  Tensor* cpu_ptr() { return cpu.defined() ? &cpu : nullptr; }
  k::CopyOut out() {
    return cpu.defined() ? k::CopyOut{bytes.data(), copy_type(cpu.dtype())} : k::CopyOut{};
  }
};
Copy make_copy(std::int64_t n, int k) {
  Copy c;
  if (auto d = copy_dtype(k)) {
    c.cpu = Tensor::zeros({n}, *d, Device::cpu());
    c.bytes.assign(c.cpu.nbytes(), 0xAB);  // the kernel's copy starts as garbage: every byte must be written
  }
  return c;
}

/// The kernel's copy has the CPU copy's bits, and the CPU copy those of cast(updated variable).
void check_copy(const Copy& c, const Tensor& var, const char* what) {
  if (!c.cpu.defined()) return;
  CAPTURE(to_string(c.cpu.dtype()));
  REQUIRE(c.bytes.size() == c.cpu.nbytes());
  CHECK_MESSAGE(std::memcmp(c.bytes.data(), c.cpu.data_ptr(), c.bytes.size()) == 0, what, " copy (kernel vs CPU)");
  const Tensor cast = var.to(c.cpu.dtype());
  CHECK_MESSAGE(std::memcmp(cast.data_ptr(), c.cpu.data_ptr(), c.bytes.size()) == 0, what, " copy (CPU vs cast)");
}

}  // namespace

TEST_CASE("sgd, adam and rmsprop kernels give the CPU backend's bits") {
  const std::int64_t n = 1001;
  for (DType vd : {float32, float16, bfloat16}) {
    for (DType gd : {float32, float16, bfloat16, float64}) {
      CAPTURE(to_string(vd));
      CAPTURE(to_string(gd));
      with_type(vd, [&](auto vt) {
        using V = typename decltype(vt)::type;
        with_type(gd, [&](auto gt) {
          using G = typename decltype(gt)::type;
          // SGD: plain, momentum, nesterov.
          for (int mode = 0; mode < 3; ++mode) {
            CAPTURE(mode);
            Update u = start(n, vd, gd, 10 + mode);
            auto w = storage<V>(u.var);
            auto g = storage<G>(u.grad);
            auto m = storage<float>(u.slots[0]);
            const bool use_m = mode > 0;
            Copy c = make_copy(n, mode + 1);
            const double gs = grad_scale_of(mode);
            cpu().sgd_update(u.var, u.grad, use_m ? &u.slots[0] : nullptr, 0.01, 0.9, mode == 2, c.cpu_ptr(), gs);
            k::emulate(kGrid, kBlock, [&](const k::Thread& t) {
              k::sgd_body(t, w.data(), g.data(), ptr(m, use_m), 0.01f, 0.9f, mode == 2, n, c.out(),
                          static_cast<float>(gs));
            });
            CHECK_SAME_BITS(u.var, w, "sgd var");
            check_copy(c, u.var, "sgd");
            CHECK_SAME_BITS(u.slots[0], m, "sgd momentum");
          }
          // Adam (no decay, no amsgrad) and AdamW with amsgrad.
          for (int mode = 0; mode < 2; ++mode) {
            CAPTURE(mode);
            Update u = start(n, vd, gd, 20 + mode);
            auto w = storage<V>(u.var);
            auto g = storage<G>(u.grad);
            auto m = storage<float>(u.slots[0]);
            auto v = storage<float>(u.slots[1]);
            auto h = storage<float>(u.slots[2]);
            const double alpha = 0.001 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.9 * 0.9), decay = mode ? 0.004 * 0.001 : 0;
            Copy c = make_copy(n, mode + 1);
            const double gs = grad_scale_of(mode + 1);
            cpu().adam_update(u.var, u.grad, u.slots[0], u.slots[1], mode ? &u.slots[2] : nullptr, alpha, 0.9, 0.999,
                              1e-7, decay, c.cpu_ptr(), gs);
            k::emulate(kGrid, kBlock, [&](const k::Thread& t) {
              k::adam_body(t, w.data(), g.data(), m.data(), v.data(), ptr(h, mode), static_cast<float>(alpha),
                           static_cast<float>(1 - 0.9), static_cast<float>(1 - 0.999), static_cast<float>(1e-7),
                           static_cast<float>(decay), n, c.out(), static_cast<float>(gs));
            });
            CHECK_SAME_BITS(u.var, w, "adam var");
            check_copy(c, u.var, "adam");
            CHECK_SAME_BITS(u.slots[0], m, "adam m");
            CHECK_SAME_BITS(u.slots[1], v, "adam v");
            CHECK_SAME_BITS(u.slots[2], h, "adam vhat");
          }
          // RMSprop: plain, centered, centered with momentum, momentum only.
          for (int mode = 0; mode < 4; ++mode) {
            CAPTURE(mode);
            Update u = start(n, vd, gd, 30 + mode);
            auto w = storage<V>(u.var);
            auto g = storage<G>(u.grad);
            auto a = storage<float>(u.slots[0]);
            auto vel = storage<float>(u.slots[1]);
            auto mo = storage<float>(u.slots[2]);
            const bool centered = mode == 1 || mode == 2, momentum = mode >= 2;
            Copy c = make_copy(n, mode);
            const double gs = grad_scale_of(mode);
            cpu().rmsprop_update(u.var, u.grad, u.slots[1], centered ? &u.slots[0] : nullptr,
                                 momentum ? &u.slots[2] : nullptr, 0.001, 0.9, 0.5, 1e-7, c.cpu_ptr(), gs);
            k::emulate(kGrid, kBlock, [&](const k::Thread& t) {
              k::rmsprop_body(t, w.data(), g.data(), vel.data(), ptr(a, centered), ptr(mo, momentum), 0.001f, 0.9f,
                              static_cast<float>(1 - 0.9), 0.5f, static_cast<float>(1e-7), n, c.out(),
                              static_cast<float>(gs));
            });
            CHECK_SAME_BITS(u.var, w, "rmsprop var");
            check_copy(c, u.var, "rmsprop");
            CHECK_SAME_BITS(u.slots[1], vel, "rmsprop velocity");
            CHECK_SAME_BITS(u.slots[0], a, "rmsprop average_grad");
            CHECK_SAME_BITS(u.slots[2], mo, "rmsprop momentum");
          }
        });
      });
    }
  }
}

// ---- unscale_and_check ----------------------------------------------------------------------------

namespace {

k::GradType grad_type(DType d) {
  switch (d) {
    case DType::Float64: return k::GradType::F64;
    case DType::Float16: return k::GradType::F16;
    case DType::BFloat16: return k::GradType::BF16;
    default: return k::GradType::F32;
  }
}

/// Runs pack_unscale + unscale_body on the host over grads (undefined ones skipped) and checks
/// outs and the flag against the CPU backend; returns the number of launches and the per-tensor
/// flags.
int check_unscale(const std::vector<Tensor>& grads, float inv_scale, std::int64_t chunk, unsigned threads,
                  std::vector<float>& flags, float& found) {
  std::vector<Tensor> outs(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined()) outs[i] = Tensor::empty(grads[i].shape(), float32, Device::cpu());
  Tensor inv = Tensor::scalar(inv_scale, float32, Device::cpu());
  Tensor cpu_found = Tensor::scalar(0.5, float32, Device::cpu());
  Tensor cpu_flags = Tensor::full({static_cast<std::int64_t>(grads.size())}, 0.5, float32, Device::cpu());
  cpu().unscale_and_check(grads, inv, outs, cpu_found, cpu_flags);

  // Kernel side: its own outs (filled with a sentinel so unwritten elements show), inputs as storage.
  std::vector<std::vector<unsigned char>> in(grads.size());
  std::vector<std::vector<float>> out(grads.size());
  std::vector<k::UnscaleItem> items;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) {
      items.push_back({nullptr, nullptr, 0, k::GradType::F32});
      continue;
    }
    in[i].resize(grads[i].nbytes());
    std::memcpy(in[i].data(), grads[i].data_ptr(), grads[i].nbytes());
    out[i].assign(static_cast<std::size_t>(grads[i].numel()), -12345.0f);
    items.push_back({in[i].data(), out[i].data(), grads[i].numel(), grad_type(grads[i].dtype())});
  }
  found = 0.0f;  // the memset before the launches
  flags.assign(grads.size(), 0.0f);
  const float s = inv_scale;
  int launches = 0;
  k::pack_unscale(items.data(), static_cast<std::int32_t>(items.size()), &s, &found, flags.data(), chunk,
                  [&](const k::UnscaleArgs& a, unsigned blocks) {
                    ++launches;
                    k::emulate({blocks}, {threads}, [&](const k::Thread& t) { k::unscale_body(t, a); });
                  });
  for (std::size_t i = 0; i < grads.size(); ++i) {
    CAPTURE(i);
    if (!grads[i].defined()) continue;
    CHECK_SAME_BITS(outs[i], out[i], "unscaled gradient");
  }
  CHECK(found == *cpu_found.data<float>());
  CHECK(flags == cpu_flags.to_vector<float>());  // the per-gradient flags of the overflow diagnostics

  // Check only (check_unscaled): no outs on either side, the same flags.
  std::vector<Tensor> no_outs(grads.size());
  Tensor only_found = Tensor::scalar(0.5, float32, Device::cpu());
  Tensor only_flags = Tensor::full({static_cast<std::int64_t>(grads.size())}, 0.5, float32, Device::cpu());
  cpu().unscale_and_check(grads, inv, no_outs, only_found, only_flags);
  for (auto& it : items) it.out = nullptr;
  float k_found = 0.0f;
  std::vector<float> k_flags(grads.size(), 0.0f);
  k::pack_unscale(items.data(), static_cast<std::int32_t>(items.size()), &s, &k_found, k_flags.data(), chunk,
                  [&](const k::UnscaleArgs& a, unsigned blocks) {
                    k::emulate({blocks}, {threads}, [&](const k::Thread& t) { k::unscale_body(t, a); });
                  });
  CHECK(*only_found.data<float>() == found);
  CHECK(only_flags.to_vector<float>() == flags);
  CHECK(k_found == found);
  CHECK(k_flags == flags);
  return launches;
}

}  // namespace

TEST_CASE("unscale_and_check packs many gradients into few launches and gives the CPU's outs and flag") {
  const std::int64_t chunk = 64;  // small chunks: tensors span blocks, tails are partial
  auto grad = [](std::int64_t n, DType d, unsigned seed) { return make(uniform(n, -3e3, 3e3, seed), {n}, d); };
  std::vector<Tensor> grads{grad(1000, float32, 1), grad(37, float16, 2), Tensor(), grad(3 * chunk + 5, bfloat16, 3),
                            grad(129, float64, 4), grad(0, float32, 5), grad(2 * chunk + 7, float16, 6),
                            grad(chunk, float32, 7)};
  std::vector<float> flags;
  float found = -1;

  SUBCASE("all finite") {
    CHECK(check_unscale(grads, 1.0f / 1024, chunk, 32, flags, found) == 1);
    CHECK(found == 0.0f);
    CHECK(std::count(flags.begin(), flags.end(), 1.0f) == 0);
    check_unscale(grads, 0.3f, chunk, 32, flags, found);  // an inexact scale: the same rounding
    CHECK(found == 0.0f);
  }
  SUBCASE("inf in the last element of a chunk tail") {
    std::vector<double> v = uniform(2 * chunk + 7, -1, 1, 9);
    v.back() = INFINITY;
    grads[6] = make(v, {static_cast<std::int64_t>(v.size())}, float16);
    check_unscale(grads, 1.0f / 1024, chunk, 32, flags, found);
    CHECK(found == 1.0f);
    CHECK(flags == std::vector<float>{0, 0, 0, 0, 0, 0, 1, 0});
  }
  SUBCASE("one NaN") {
    std::vector<double> v = uniform(129, -1, 1, 10);
    v[77] = NAN;
    grads[4] = make(v, {129}, float64);
    check_unscale(grads, 0.5f, chunk, 32, flags, found);
    CHECK(found == 1.0f);
    CHECK(flags == std::vector<float>{0, 0, 0, 0, 1, 0, 0, 0});
  }
  SUBCASE("a finite float16 gradient that overflows once unscaled") {
    grads[1] = make(std::vector<double>(37, 60000.0), {37}, float16);
    check_unscale(grads, 1e35f, chunk, 32, flags, found);
    CHECK(found == 1.0f);
  }
  SUBCASE("more tensors and chunks than one launch holds") {
    std::vector<Tensor> many;
    for (int i = 0; i < 2 * k::kUnscaleTensors + 7; ++i)
      many.push_back(grad(1 + (i * 37) % 200, i % 2 ? bfloat16 : float32, 100 + i));
    many.push_back(grad(chunk * (k::kUnscaleBlocks + 30) + 3, float32, 99));  // crosses a launch
    std::vector<double> v = uniform(chunk * 500 + 1, -1, 1, 98);
    v[chunk * 450 + 17] = -INFINITY;  // in the second launch of this tensor
    many.push_back(make(v, {static_cast<std::int64_t>(v.size())}, float16));
    many.push_back(grad(5, float64, 97));
    const int launches = check_unscale(many, 0.25f, chunk, 32, flags, found);
    CHECK(launches >= 4);
    CHECK(found == 1.0f);
    CHECK(std::count(flags.begin(), flags.end(), 1.0f) == 1);
    CHECK(flags[many.size() - 2] == 1.0f);
  }
  SUBCASE("no gradients") {
    CHECK(check_unscale({Tensor()}, 1.0f, chunk, 32, flags, found) == 0);
    CHECK(found == 0.0f);
  }
}

// ---- the updates of many variables (pack_updates + update_multi_body) -----------------------------

namespace {

/// Many variables of mixed dtypes and sizes, each with its gradient and three float32 slots: the
/// CPU backend's copy (updated per tensor) and the kernels' storage (updated by the packed
/// launches).
struct MultiUpdate {
  std::vector<Update> cpu;
  std::vector<std::vector<unsigned char>> var, grad;
  std::vector<std::array<std::vector<float>, 3>> slots;
  std::vector<Copy> copies;  // variable i gets copy case i (none on every fourth)
  Tensor* copy(std::size_t i) { return copies[i].cpu_ptr(); }
};

MultiUpdate multi_start(const std::vector<std::tuple<std::int64_t, DType, DType>>& specs, unsigned seed) {
  MultiUpdate u;
  for (const auto& [n, vd, gd] : specs) {
    Update one;
    if (n > 0) {
      one = start(n, vd, gd, seed);
    } else {  // an empty variable: packed out
      one.var = Tensor::empty({0}, vd, Device::cpu()), one.grad = Tensor::empty({0}, gd, Device::cpu());
      for (int s = 0; s < 3; ++s) one.slots.push_back(Tensor::empty({0}, float32, Device::cpu()));
    }
    seed += 10;
    auto bytes = [](const Tensor& t) {
      std::vector<unsigned char> b(t.nbytes());
      if (!b.empty()) std::memcpy(b.data(), t.data_ptr(), b.size());
      return b;
    };
    u.var.push_back(bytes(one.var));
    u.grad.push_back(bytes(one.grad));
    u.slots.push_back({storage<float>(one.slots[0]), storage<float>(one.slots[1]), storage<float>(one.slots[2])});
    u.copies.push_back(make_copy(n, static_cast<int>(u.cpu.size())));
    u.cpu.push_back(std::move(one));
  }
  return u;
}

/// Packs every variable (the kernel's slot s is storage slot order[s], used where used[s](i))
/// and runs the launches on the host; returns their number.
template <k::UpdateKind K>
int run_multi(MultiUpdate& u, const std::array<std::function<bool(std::size_t)>, 3>& used, const k::UpdateHyper& h,
              std::int64_t chunk, unsigned threads, std::array<int, 3> order = {0, 1, 2}) {
  std::vector<k::UpdateTensor> items;
  for (std::size_t i = 0; i < u.cpu.size(); ++i) {
    k::UpdateTensor it{u.var[i].data(), u.grad[i].data(), {nullptr, nullptr, nullptr}, u.cpu[i].var.numel(),
                       grad_type(u.cpu[i].var.dtype()), grad_type(u.cpu[i].grad.dtype()), u.copies[i].out()};
    for (int s = 0; s < 3; ++s) it.slot[s] = used[s](i) ? u.slots[i][order[s]].data() : nullptr;
    items.push_back(it);
  }
  int launches = 0;
  k::pack_updates(items.data(), static_cast<std::int32_t>(items.size()), h, chunk,
                  [&](const k::UpdateArgs& a, unsigned blocks) {
                    ++launches;
                    REQUIRE(blocks <= static_cast<unsigned>(k::kUpdateBlocks));
                    k::emulate({blocks}, {threads}, [&](const k::Thread& t) { k::update_multi_body<K>(t, a); });
                  });
  return launches;
}

/// The kernels' storage equals the CPU's tensors bit for bit.
void check_multi(const MultiUpdate& u, const char* what) {
  for (std::size_t i = 0; i < u.cpu.size(); ++i) {
    CAPTURE(i);
    CAPTURE(to_string(u.cpu[i].var.dtype()));
    CAPTURE(to_string(u.cpu[i].grad.dtype()));
    const Tensor& var = u.cpu[i].var;
    REQUIRE(var.nbytes() == u.var[i].size());
    const bool same = var.nbytes() == 0 || std::memcmp(var.data_ptr(), u.var[i].data(), var.nbytes()) == 0;
    CHECK_MESSAGE(same, what, " var");
    for (int s = 0; s < 3; ++s) {
      CAPTURE(s);
      CHECK_SAME_BITS(u.cpu[i].slots[s], u.slots[i][s], what);
    }
    check_copy(u.copies[i], var, what);
  }
}

}  // namespace

TEST_CASE("the multi-tensor updates pack many variables into few launches and give the CPU's bits") {
  const std::int64_t chunk = 64;  // small chunks: variables span blocks, tails are partial
  const DType vds[] = {float32, float16, bfloat16};
  const DType gds[] = {float32, float16, bfloat16, float64};
  std::vector<std::tuple<std::int64_t, DType, DType>> specs;
  for (int i = 0; i < 2 * k::kUpdateTensors + 5; ++i)  // more variables than one launch holds
    specs.emplace_back(1 + (i * 53) % 300, vds[i % 3], gds[(i / 3) % 4]);
  specs.emplace_back(0, float32, float32);
  specs.emplace_back(chunk * (k::kUpdateBlocks + 40) + 3, float16, float32);  // crosses a launch
  specs.emplace_back(chunk, bfloat16, float64);
  specs.emplace_back(1, float32, float16);
  auto every = [](std::size_t) { return true; };
  auto none = [](std::size_t) { return false; };
  auto even = [](std::size_t i) { return i % 2 == 0; };

  SUBCASE("sgd: plain, momentum, nesterov, momentum on every other variable") {
    for (int mode = 0; mode < 4; ++mode) {
      CAPTURE(mode);
      MultiUpdate u = multi_start(specs, 100 + mode);
      const std::function<bool(std::size_t)> use = mode == 0 ? std::function<bool(std::size_t)>(none)
                                                   : mode == 3 ? std::function<bool(std::size_t)>(even)
                                                               : std::function<bool(std::size_t)>(every);
      const double lr = 0.01, mu = 0.9;
      for (std::size_t i = 0; i < u.cpu.size(); ++i)
        cpu().sgd_update(u.cpu[i].var, u.cpu[i].grad, use(i) ? &u.cpu[i].slots[0] : nullptr, lr, mu, mode == 2,
                         u.copy(i), grad_scale_of(mode));
      k::UpdateHyper h;
      h.lr = static_cast<float>(lr), h.mu = static_cast<float>(mu), h.nesterov = mode == 2;
      h.grad_scale = static_cast<float>(grad_scale_of(mode));
      const int launches = run_multi<k::UpdateKind::Sgd>(u, {use, none, none}, h, chunk, 32);
      CHECK(launches >= 4);
      check_multi(u, "sgd");
    }
  }
  SUBCASE("adam, and adamw with amsgrad") {
    for (int mode = 0; mode < 2; ++mode) {
      CAPTURE(mode);
      MultiUpdate u = multi_start(specs, 200 + mode);
      const double alpha = 0.001 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.9 * 0.9), decay = mode ? 0.004 * 0.001 : 0;
      for (std::size_t i = 0; i < u.cpu.size(); ++i)
        cpu().adam_update(u.cpu[i].var, u.cpu[i].grad, u.cpu[i].slots[0], u.cpu[i].slots[1],
                          mode ? &u.cpu[i].slots[2] : nullptr, alpha, 0.9, 0.999, 1e-7, decay, u.copy(i),
                          grad_scale_of(mode + 1));
      k::UpdateHyper h;
      h.grad_scale = static_cast<float>(grad_scale_of(mode + 1));
      h.alpha = static_cast<float>(alpha), h.c1 = static_cast<float>(1 - 0.9), h.c2 = static_cast<float>(1 - 0.999),
      h.eps = static_cast<float>(1e-7), h.decay = static_cast<float>(decay);
      run_multi<k::UpdateKind::Adam>(u, {every, every, mode ? every : none}, h, chunk, 32);
      check_multi(u, "adam");
    }
  }
  SUBCASE("rmsprop: plain, centered, momentum, centered with momentum") {
    for (int mode = 0; mode < 4; ++mode) {
      CAPTURE(mode);
      MultiUpdate u = multi_start(specs, 300 + mode);
      const bool centered = mode & 1, momentum = mode & 2;
      for (std::size_t i = 0; i < u.cpu.size(); ++i)
        cpu().rmsprop_update(u.cpu[i].var, u.cpu[i].grad, u.cpu[i].slots[1], centered ? &u.cpu[i].slots[0] : nullptr,
                             momentum ? &u.cpu[i].slots[2] : nullptr, 0.001, 0.9, 0.5, 1e-7, u.copy(i),
                             grad_scale_of(mode));
      k::UpdateHyper h;
      h.grad_scale = static_cast<float>(grad_scale_of(mode));
      h.lr = 0.001f, h.rho = 0.9f, h.c = static_cast<float>(1 - 0.9), h.mu = 0.5f, h.eps = static_cast<float>(1e-7);
      // velocity, average_grad and momentum are storage slots 1, 0, 2 (start() keeps velocity > avg^2).
      run_multi<k::UpdateKind::Rmsprop>(u, {every, centered ? every : none, momentum ? every : none}, h, chunk, 32,
                                        {1, 0, 2});
      check_multi(u, "rmsprop");
    }
  }
  SUBCASE("nadam, adamax, adagrad and lion: the rules of backend/common/optim_rules.hpp, with and without decay") {
    struct RuleCase {
      common::RuleKind rule;
      int slots;
      std::array<int, 3> order;  // storage slots: velocity and accumulators on the non-negative ones
    };
    const RuleCase cases[] = {{common::RuleKind::Nadam, 2, {0, 1, 2}},
                              {common::RuleKind::Adamax, 2, {0, 2, 1}},
                              {common::RuleKind::Adagrad, 1, {2, 0, 1}},
                              {common::RuleKind::Lion, 1, {0, 1, 2}}};
    for (const RuleCase& rc : cases) {
      for (int mode = 0; mode < 2; ++mode) {
        CAPTURE(static_cast<int>(rc.rule));
        CAPTURE(mode);
        MultiUpdate u = multi_start(specs, 400 + 10 * static_cast<unsigned>(rc.rule) + mode);
        common::RuleHyper h;  // a Nadam/Adamax step 3 with beta_1 0.9, beta_2 0.999 (others ignore what they do not use)
        h.lr = 0.01f, h.eps = 1e-7f, h.decay = mode ? 0.004f * 0.01f : 0.0f;
        h.c1 = 1.0f - 0.9f, h.c2 = 1.0f - 0.999f, h.b2 = 0.999f;
        h.k0 = rc.rule == common::RuleKind::Lion ? 0.9f : 0.8f, h.k1 = 0.6f, h.k2 = 0.55f, h.k3 = 0.65f, h.k4 = 0.003f;
        for (std::size_t i = 0; i < u.cpu.size(); ++i) {
          std::vector<Tensor> var{u.cpu[i].var};
          std::vector<std::vector<Tensor*>> slots;
          for (int s = 0; s < rc.slots; ++s) slots.push_back({&u.cpu[i].slots[rc.order[s]]});
          std::vector<Tensor*> copies;
          if (u.copy(i)) copies.push_back(u.copy(i));
          cpu().rule_update_all(rc.rule, var, {u.cpu[i].grad}, slots, h, copies, grad_scale_of(mode));
        }
        k::UpdateHyper uh;
        uh.grad_scale = static_cast<float>(grad_scale_of(mode));
        uh.rule = h;
        using Use = std::function<bool(std::size_t)>;
        const std::array<Use, 3> used{Use(every), rc.slots > 1 ? Use(every) : Use(none), Use(none)};
        switch (rc.rule) {
          case common::RuleKind::Nadam: run_multi<k::UpdateKind::Nadam>(u, used, uh, chunk, 32, rc.order); break;
          case common::RuleKind::Adamax: run_multi<k::UpdateKind::Adamax>(u, used, uh, chunk, 32, rc.order); break;
          case common::RuleKind::Adagrad: run_multi<k::UpdateKind::Adagrad>(u, used, uh, chunk, 32, rc.order); break;
          case common::RuleKind::Lion: run_multi<k::UpdateKind::Lion>(u, used, uh, chunk, 32, rc.order); break;
        }
        check_multi(u, "rule");
      }
    }
  }
  SUBCASE("the launches: every block within a launch's capacity, each variable's chunks once") {
    std::vector<k::UpdateTensor> items;
    for (const auto& [n, vd, gd] : specs)
      items.push_back({nullptr, nullptr, {nullptr, nullptr, nullptr}, n, grad_type(vd), grad_type(gd), {}});
    std::int64_t covered = 0, total = 0;
    for (const auto& [n, vd, gd] : specs) total += n;
    int launches = 0;
    k::pack_updates(items.data(), static_cast<std::int32_t>(items.size()), {}, chunk,
                    [&](const k::UpdateArgs& a, unsigned blocks) {
                      ++launches;
                      for (unsigned b = 0; b < blocks; ++b) {
                        REQUIRE(a.block_tensor[b] < k::kUpdateTensors);
                        const k::UpdateTensor& e = a.tensors[a.block_tensor[b]];
                        const std::int64_t begin = static_cast<std::int64_t>(a.block_chunk[b]) * chunk;
                        REQUIRE(begin < e.numel);
                        covered += std::min(chunk, e.numel - begin);
                      }
                    });
    CHECK(covered == total);
    CHECK(launches >= 3);
  }
}

TEST_CASE("update_loss_scale's kernel follows the CPU backend's scale and counters") {
  ops::LossScaleRule dynamic_rule{true, 3, 2, 1.0, 256.0};
  ops::LossScaleRule static_rule{false, 3, 1, 1.0, 65536.0};
  for (const auto& rule : {dynamic_rule, static_rule}) {
    Tensor scale = Tensor::scalar(8.0, float32, Device::cpu()), inv = Tensor::scalar(0.125, float32, Device::cpu());
    Tensor counters = Tensor::zeros({2}, int64, Device::cpu());
    float s = 8.0f, i = 0.125f;
    std::int64_t c[2] = {0, 0};
    bool saw_max = false;
    // Growth to the maximum, hysteresis (one overflow is not enough), halving to the minimum.
    std::vector<int> flags{0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1};
    for (int f = 0; f < 60; ++f) flags.push_back(f < 24 ? 0 : 1);
    for (int f : flags) {
      const float flag = static_cast<float>(f);
      Tensor found = Tensor::scalar(flag, float32, Device::cpu());
      cpu().update_loss_scale(scale, inv, counters, found, rule);
      k::emulate({1}, {1}, [&](const k::Thread& t) {
        k::loss_scale_body(t, &s, &i, c, &flag, rule.dynamic, rule.growth_steps, rule.hysteresis, rule.min_scale,
                           rule.max_scale);
      });
      REQUIRE(s == *scale.data<float>());
      REQUIRE(i == *inv.data<float>());
      REQUIRE(c[0] == counters.data<std::int64_t>()[0]);
      REQUIRE(c[1] == counters.data<std::int64_t>()[1]);
      saw_max |= s == 256.0f;
    }
    if (rule.dynamic) CHECK(s == 1.0f);  // the overflows at the end reached the minimum
    if (rule.dynamic) CHECK(saw_max);     // and the finite run before them the maximum
  }
}

// ---- pooling --------------------------------------------------------------------------------------

namespace {

struct PoolCase {
  const char* name;
  Pool2dGeometry g;
  std::int64_t h, w;
};

std::int64_t out_size(std::int64_t in, std::int64_t pool, std::int64_t stride, std::int64_t pad) {
  return (in + pad - pool) / stride + 1;
}

/// Values with many ties (multiples of 0.5 in a small range), -0 beside +0, -inf, and, when
/// `nan`, a few NaNs.
std::vector<double> pool_input(std::int64_t n, unsigned seed, bool nan) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(-6, 6);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) x = 0.5 * u(rng);
  for (std::size_t i = 3; i < v.size(); i += 17) v[i] = -0.0;
  for (std::size_t i = 11; i < v.size(); i += 41) v[i] = -INFINITY;
  if (nan)
    for (std::size_t i = 29; i < v.size(); i += 97) v[i] = NAN;
  return v;
}

}  // namespace

TEST_CASE("pooling kernels give the CPU backend's outputs, workspace and gradients") {
  const std::vector<PoolCase> cases{
      {"2x2/2 valid", {PoolKind::Max, 2, 2, 2, 2, 0, 0, 0, 0}, 7, 9},
      {"2x2/2 same", {PoolKind::Max, 2, 2, 2, 2, 0, 1, 0, 1}, 7, 9},
      {"3x3/1 same, asymmetric", {PoolKind::Max, 3, 3, 1, 1, 0, 2, 2, 0}, 6, 7},
      {"3x3/2 same", {PoolKind::Max, 3, 3, 2, 2, 1, 1, 0, 1}, 7, 8},
      {"3x3/2 valid", {PoolKind::Max, 3, 3, 2, 2, 0, 0, 0, 0}, 9, 7},
      {"2x2/3 gaps, asymmetric", {PoolKind::Max, 2, 2, 3, 3, 0, 1, 1, 0}, 8, 7},
      {"2x3/1x2 mixed", {PoolKind::Max, 2, 3, 1, 2, 1, 0, 1, 1}, 5, 8},
  };
  const std::int64_t N = 2, C = 5;
  for (const PoolCase& pc : cases) {
    for (PoolKind kind : {PoolKind::Max, PoolKind::Avg}) {
      for (DType d : {float32, float16, bfloat16, float64}) {
        for (bool nan : {false, true}) {
          Pool2dGeometry g = pc.g;
          g.kind = kind;
          const std::string name = pc.name;
          CAPTURE(name);
          CAPTURE(kind == PoolKind::Max ? "max" : "avg");
          CAPTURE(to_string(d));
          CAPTURE(nan);
          const std::int64_t oh = out_size(pc.h, g.pool_h, g.stride_h, g.pad_top + g.pad_bottom),
                             ow = out_size(pc.w, g.pool_w, g.stride_w, g.pad_left + g.pad_right);
          Tensor x = make(pool_input(N * pc.h * pc.w * C, 7, nan), {N, pc.h, pc.w, C}, d);
          Tensor y = Tensor::empty({N, oh, ow, C}, d, Device::cpu()), ws;
          cpu().pool2d(x, g, true, y, ws);
          Tensor dy = make(uniform(N * oh * ow * C, -1, 1, 8), {N, oh, ow, C}, d);
          Tensor dx = Tensor::empty(x.shape(), d, Device::cpu());
          cpu().pool2d_backward(x, y, dy, ws, g, dx);

          const k::PoolDims dims{N, pc.h, pc.w, C, oh, ow, g.pool_h, g.pool_w, g.stride_h, g.stride_w,
                                 g.pad_top, g.pad_left, kind == PoolKind::Max,
                                 g.stride_h >= g.pool_h && g.stride_w >= g.pool_w};
          with_type(d, [&](auto tag) {
            using T = typename decltype(tag)::type;
            auto hx = storage<T>(x);
            std::vector<T> hy(static_cast<std::size_t>(y.numel()));
            std::vector<std::uint16_t> hws(kind == PoolKind::Max ? hy.size() : 0);
            k::emulate(kGrid, kBlock, [&](const k::Thread& t) {
              k::pool_forward_body(t, hx.data(), hy.data(), hws.empty() ? nullptr : hws.data(), dims);
            });
            CHECK_SAME_BITS(y, hy, "pool2d output");
            if (kind == PoolKind::Max) {
              REQUIRE(ws.defined());
              CHECK_SAME_BITS(ws, hws, "pool2d workspace");
            }
            auto hdy = storage<T>(dy);
            std::vector<T> hdx(static_cast<std::size_t>(dx.numel()));
            k::emulate(kGrid, kBlock, [&](const k::Thread& t) {
              k::pool_backward_body(t, hdy.data(), hws.empty() ? nullptr : hws.data(), hdx.data(), dims);
            });
            CHECK_SAME_BITS(dx, hdx, "pool2d_backward dx");
          });
        }
      }
    }
  }
}

namespace {

/// Keras's Adafactor step in float64 (the formula of mpt/optim_ops.hpp's adafactor_update) on a
/// [L, R, C] view; r [L, R], c [L, C] when factored, else v [n].
void adafactor_reference(std::vector<double>& w, const std::vector<double>& g, std::vector<double>& r,
                         std::vector<double>& c, std::vector<double>& v, std::int64_t L, std::int64_t R,
                         std::int64_t C, bool factored, const ops::AdafactorArgs& a) {
  const std::size_t n = w.size();
  const double b = a.beta_2_t;
  for (double& x : w) x -= x * a.decay;
  double w2 = 0;
  for (double x : w) w2 += x * x;
  std::vector<double> u(n);
  if (factored) {
    for (std::int64_t l = 0; l < L; ++l) {
      for (std::int64_t i = 0; i < R; ++i) {
        double s = 0;
        for (std::int64_t j = 0; j < C; ++j) s += g[(l * R + i) * C + j] * g[(l * R + i) * C + j] + a.epsilon_1;
        r[l * R + i] = b * r[l * R + i] + (1 - b) * s / C;
      }
      for (std::int64_t j = 0; j < C; ++j) {
        double s = 0;
        for (std::int64_t i = 0; i < R; ++i) s += g[(l * R + i) * C + j] * g[(l * R + i) * C + j] + a.epsilon_1;
        c[l * C + j] = b * c[l * C + j] + (1 - b) * s / R;
      }
      double rm = 0;
      for (std::int64_t i = 0; i < R; ++i) rm += r[l * R + i];
      rm /= R;
      for (std::int64_t i = 0; i < R; ++i)
        for (std::int64_t j = 0; j < C; ++j) {
          const std::size_t e = static_cast<std::size_t>((l * R + i) * C + j);
          u[e] = g[e] / std::sqrt(r[l * R + i] / rm * c[l * C + j]);
        }
    }
  } else {
    for (std::size_t e = 0; e < n; ++e) {
      v[e] = b * v[e] + (1 - b) * (g[e] * g[e] + a.epsilon_1);
      u[e] = g[e] / std::sqrt(v[e]);
    }
  }
  double u2 = 0;
  for (double x : u) u2 += x * x;
  const double alpha = std::max(a.epsilon_2, std::sqrt(w2 / n)) * a.rho_t;
  const double denom = std::max(1.0, std::sqrt(u2 / n) / a.clip_threshold);
  for (std::size_t e = 0; e < n; ++e) w[e] -= alpha * u[e] / denom;
}

}  // namespace

TEST_CASE("adafactor's kernels give the CPU backend's bits, and both Keras's step in float64") {
  // Shapes: blocks of a rank-3 variable, fewer and more rows than the sums' 256 chunks, a long
  // row, a vector and a scalar (unfactored).
  const std::vector<Shape> shapes{{3, 5, 7}, {40, 33}, {300, 2}, {2, 1000}, {17}, {}};
  for (const Shape& shape : shapes) {
    for (double decay : {0.0, 0.003}) {
      CAPTURE(shape.size());
      CAPTURE(decay);
      const bool factored = shape.size() >= 2;
      std::int64_t n = 1;
      for (std::int64_t d : shape) n *= d;
      common::AdafactorShape s;
      s.factored = factored;
      if (factored) s.rows = shape[shape.size() - 2], s.cols = shape.back(), s.blocks = n / (s.rows * s.cols);
      else s.rows = n;
      const std::size_t un = static_cast<std::size_t>(n);
      Shape rs = shape, cs = shape;
      if (factored) rs.pop_back(), cs.erase(cs.end() - 2);
      Tensor var = make(uniform(un, -1, 1, 7), shape, float32);
      Tensor r = factored ? Tensor::zeros(rs, float32, Device::cpu()) : Tensor();
      Tensor c = factored ? Tensor::zeros(cs, float32, Device::cpu()) : Tensor();
      Tensor v = factored ? Tensor() : Tensor::zeros(var.shape(), float32, Device::cpu());
      // The emulated kernels' memory.
      auto w = storage<float>(var);
      std::vector<float> rv(static_cast<std::size_t>(s.blocks * s.rows), 0.0f), col(static_cast<std::size_t>(s.blocks * s.cols), 0.0f);
      // The float64 reference.
      std::vector<double> w64 = var.to_vector<double>(), r64(static_cast<std::size_t>(s.blocks * s.rows)),
                          c64(static_cast<std::size_t>(s.blocks * s.cols)), v64(un);
      for (int step = 1; step <= 3; ++step) {
        CAPTURE(step);
        const std::vector<double> gvals = uniform(un, -0.5, 0.5, 100 + step);
        Tensor grad = make(gvals, shape, float32);
        const auto g = storage<float>(grad);
        ops::AdafactorArgs a;
        const float t = static_cast<float>(step);
        a.beta_2_t = 1.0f - std::pow(t, -0.8f), a.rho_t = std::min(0.01f, 1.0f / std::sqrt(t));
        a.epsilon_1 = 1e-30, a.epsilon_2 = 1e-3, a.clip_threshold = 1.0, a.decay = decay;
        ops::adafactor_update(var, grad, factored ? &r : nullptr, factored ? &c : nullptr, factored ? nullptr : &v, a);

        common::AdafactorHyper h;
        h.b = static_cast<float>(a.beta_2_t), h.omb = 1.0f - h.b, h.eps1 = static_cast<float>(a.epsilon_1),
        h.eps2 = static_cast<float>(a.epsilon_2), h.rho = static_cast<float>(a.rho_t), h.clip = 1.0f,
        h.decay = static_cast<float>(decay);
        constexpr std::int64_t K = common::kSumChunks;
        const std::int64_t rows = s.blocks * s.rows, segments = 1 + (factored ? s.blocks : 0);
        std::vector<double> wrow(static_cast<std::size_t>(rows)), urow(wrow.size()),
            partial(static_cast<std::size_t>(segments * K)), totals(static_cast<std::size_t>(segments + 1));
        float* second = rv.data();  // r, or (unfactored: rows = n) v
        float* cp = factored ? col.data() : nullptr;
        k::emulate(kGrid, kBlock, [&](const k::Thread& th) { k::adafactor_rows_body(th, s, h, w.data(), g.data(), second, wrow.data()); });
        if (factored) k::emulate(kGrid, kBlock, [&](const k::Thread& th) { k::adafactor_cols_body(th, s, h, g.data(), cp); });
        k::emulate(kGrid, kBlock, [&](const k::Thread& th) { k::chunk_sums_body(th, wrow.data(), rows, 1, partial.data()); });
        if (factored)
          k::emulate(kGrid, kBlock, [&](const k::Thread& th) {
            k::chunk_sums_body(th, static_cast<const float*>(second), s.rows, s.blocks, partial.data() + K);
          });
        k::emulate(kGrid, kBlock, [&](const k::Thread& th) { k::chunk_totals_body(th, partial.data(), segments, totals.data()); });
        k::emulate(kGrid, kBlock, [&](const k::Thread& th) {
          k::adafactor_u_rows_body(th, s, g.data(), second, cp, totals.data() + 1, urow.data());
        });
        k::emulate(kGrid, kBlock, [&](const k::Thread& th) { k::chunk_sums_body(th, urow.data(), rows, 1, partial.data()); });
        k::emulate({1}, {1}, [&](const k::Thread& th) { k::chunk_totals_body(th, partial.data(), 1, totals.data() + segments); });
        k::emulate(kGrid, kBlock, [&](const k::Thread& th) {
          k::adafactor_apply_body(th, s, h, w.data(), g.data(), second, cp, totals.data());
        });
        CHECK_SAME_BITS(var, w, "adafactor var");
        if (factored) {
          CHECK_SAME_BITS(r, rv, "adafactor r");
          CHECK_SAME_BITS(c, col, "adafactor c");
        } else {
          CHECK_SAME_BITS(v, rv, "adafactor v");
        }
        adafactor_reference(w64, gvals, r64, c64, v64, s.blocks, s.rows, s.cols, factored, a);
        const std::vector<double> got = var.to_vector<double>();
        for (std::size_t e = 0; e < un; ++e) CHECK(got[e] == doctest::Approx(w64[e]).epsilon(2e-6));
      }
    }
  }
}

TEST_CASE("adafactor_update refuses slots that do not fit the variable") {
  Tensor var = Tensor::zeros({4, 3}, float32, Device::cpu()), grad = Tensor::zeros({4, 3}, float32, Device::cpu());
  Tensor r = Tensor::zeros({4}, float32, Device::cpu()), c = Tensor::zeros({3}, float32, Device::cpu());
  Tensor v = Tensor::zeros({4, 3}, float32, Device::cpu()), bad = Tensor::zeros({3}, float32, Device::cpu());
  ops::AdafactorArgs a;
  a.beta_2_t = 0.5, a.rho_t = 0.01;
  CHECK_NOTHROW(ops::adafactor_update(var, grad, &r, &c, nullptr, a));
  CHECK_THROWS_WITH_AS(ops::adafactor_update(var, grad, nullptr, nullptr, &v, a),
                       doctest::Contains("adafactor_update: a variable of rank 2 takes the slots r and c"), Error);
  CHECK_THROWS_WITH_AS(ops::adafactor_update(var, grad, &bad, &c, nullptr, a),
                       doctest::Contains("slot 'r' must be float32 of shape (4,)"), Error);
  a.clip_threshold = 0;
  CHECK_THROWS_WITH_AS(ops::adafactor_update(var, grad, &r, &c, nullptr, a), doctest::Contains("clip_threshold"), Error);
}
