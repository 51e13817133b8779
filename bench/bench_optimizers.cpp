// The fused optimizer updates against the same Keras formulas composed from mpt::ops (one op per
// term, as Keras's update_step is written): ms per step on a model-sized list of float32
// variables, the fused step's memory traffic in GB/s, and the ratio composed / fused, measured in
// one run. Every built-in optimizer but Adafactor updates each variable in one pass over the
// variable, its gradient and its slots; Adafactor's fused step makes four (its row and column
// means and two RMSs need them).
//
//   ./bench_optimizers [--n 4194304] [--reps 11] [--threads 2]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

using namespace mpt;
namespace opt = mpt::optimizers;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median_ms(int reps, const std::function<void()>& f) {
  f();  // warm-up: slots, pages, thread pool
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now();
    f();
    t.push_back((now() - t0) * 1e3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Tensor s(double v) { return Tensor::scalar(v, float32, Device::cpu()); }

/// One step of the Keras formula for every variable, each term an mpt op (slots: per variable).
using Composed = std::function<void(std::vector<Tensor>& w, const std::vector<Tensor>& g,
                                    std::vector<std::vector<Tensor>>& slots, int t)>;

struct Case {
  const char* name;
  std::function<std::shared_ptr<opt::Optimizer>()> make;
  int slots;  // float32 slots per variable (the fused pass reads and writes each)
  Composed composed;
};

}  // namespace

int main(int argc, char** argv) {
  std::int64_t n = 1 << 22;
  int reps = 11, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--n")) n = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_optimizers: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  try {
    set_num_threads(threads);
    // A model-sized list: a few large kernels and their biases (about n parameters).
    std::vector<Shape> shapes;
    for (std::int64_t left = n; left > 0;) {
      const std::int64_t rows = std::min<std::int64_t>(1024, std::max<std::int64_t>(1, left / 1024));
      shapes.push_back({rows, 1024});
      shapes.push_back({1024});
      left -= rows * 1024 + 1024;
    }
    std::int64_t params = 0;
    for (const auto& sh : shapes) params += sh[0] * (sh.size() > 1 ? sh[1] : 1);

    constexpr double b1 = 0.9, b2 = 0.999, eps = 1e-7, lr = 1e-3;
    std::vector<Case> cases = {
        {"SGD momentum", [] { return opt::SGD({.learning_rate = lr, .momentum = 0.9}); }, 1,
         [&](auto& w, const auto& g, auto& sl, int) {
           for (std::size_t i = 0; i < w.size(); ++i) {
             sl[i][0] = ops::sub(ops::mul(sl[i][0], s(0.9)), ops::mul(g[i], s(lr)));
             w[i] = ops::add(w[i], sl[i][0]);
           }
         }},
        {"Adam", [] { return opt::Adam({.learning_rate = lr}); }, 2,
         [&](auto& w, const auto& g, auto& sl, int t) {
           const double alpha = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
           for (std::size_t i = 0; i < w.size(); ++i) {
             sl[i][0] = ops::add(sl[i][0], ops::mul(ops::sub(g[i], sl[i][0]), s(1 - b1)));
             sl[i][1] = ops::add(sl[i][1], ops::mul(ops::sub(ops::square(g[i]), sl[i][1]), s(1 - b2)));
             w[i] = ops::sub(w[i], ops::div(ops::mul(sl[i][0], s(alpha)), ops::add(ops::sqrt(sl[i][1]), s(eps))));
           }
         }},
        {"AdamW", [] { return opt::AdamW({.learning_rate = lr, .weight_decay = 0.01}); }, 2,
         [&](auto& w, const auto& g, auto& sl, int t) {
           const double alpha = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
           for (std::size_t i = 0; i < w.size(); ++i) {
             w[i] = ops::sub(w[i], ops::mul(w[i], s(0.01 * lr)));
             sl[i][0] = ops::add(sl[i][0], ops::mul(ops::sub(g[i], sl[i][0]), s(1 - b1)));
             sl[i][1] = ops::add(sl[i][1], ops::mul(ops::sub(ops::square(g[i]), sl[i][1]), s(1 - b2)));
             w[i] = ops::sub(w[i], ops::div(ops::mul(sl[i][0], s(alpha)), ops::add(ops::sqrt(sl[i][1]), s(eps))));
           }
         }},
        {"Nadam", [] { return opt::Nadam({.learning_rate = lr}); }, 2,
         [&](auto& w, const auto& g, auto& sl, int t) {
           const double u_t = b1 * (1 - 0.5 * std::pow(0.96, t)), u_next = b1 * (1 - 0.5 * std::pow(0.96, t + 1));
           const double prod = std::pow(b1 * 0.75, t), prod_next = prod * u_next;  // stand-ins: same op count
           for (std::size_t i = 0; i < w.size(); ++i) {
             sl[i][0] = ops::add(sl[i][0], ops::mul(ops::sub(g[i], sl[i][0]), s(1 - b1)));
             sl[i][1] = ops::add(sl[i][1], ops::mul(ops::sub(ops::square(g[i]), sl[i][1]), s(1 - b2)));
             const Tensor m_hat = ops::add(ops::div(ops::mul(s(u_next), sl[i][0]), s(1 - prod_next)),
                                           ops::div(ops::mul(s(1 - u_t), g[i]), s(1 - prod)));
             const Tensor v_hat = ops::div(sl[i][1], s(1 - std::pow(b2, t)));
             w[i] = ops::sub(w[i], ops::div(ops::mul(m_hat, s(lr)), ops::add(ops::sqrt(v_hat), s(eps))));
           }
         }},
        {"Adamax", [] { return opt::Adamax({.learning_rate = lr}); }, 2,
         [&](auto& w, const auto& g, auto& sl, int t) {
           for (std::size_t i = 0; i < w.size(); ++i) {
             sl[i][0] = ops::add(sl[i][0], ops::mul(ops::sub(g[i], sl[i][0]), s(1 - b1)));
             sl[i][1] = ops::maximum(ops::mul(s(b2), sl[i][1]), ops::abs(g[i]));
             w[i] = ops::sub(w[i], ops::div(ops::mul(s(lr), sl[i][0]),
                                            ops::mul(s(1 - std::pow(b1, t)), ops::add(sl[i][1], s(eps)))));
           }
         }},
        {"Adagrad", [] { return opt::Adagrad({.learning_rate = lr}); }, 1,
         [&](auto& w, const auto& g, auto& sl, int) {
           for (std::size_t i = 0; i < w.size(); ++i) {
             sl[i][0] = ops::add(sl[i][0], ops::square(g[i]));
             w[i] = ops::sub(w[i], ops::div(ops::mul(s(lr), g[i]), ops::sqrt(ops::add(sl[i][0], s(eps)))));
           }
         }},
        {"Lion", [] { return opt::Lion({.learning_rate = lr}); }, 1,
         [&](auto& w, const auto& g, auto& sl, int) {
           for (std::size_t i = 0; i < w.size(); ++i) {
             w[i] = ops::sub(w[i], ops::mul(s(lr), ops::sign(ops::add(ops::mul(sl[i][0], s(0.9)),
                                                                         ops::mul(g[i], s(0.1))))));
             sl[i][0] = ops::add(ops::mul(sl[i][0], s(0.99)), ops::mul(g[i], s(0.01)));
           }
         }},
    };

    std::printf("%lld parameters in %zu float32 variables, %d threads, median of %d steps\n",
                static_cast<long long>(params), shapes.size(), threads, reps);
    std::printf("%-13s %10s %9s %14s %9s\n", "optimizer", "fused ms", "GB/s", "mpt::ops ms", "ratio");
    for (const Case& c : cases) {
      std::vector<Variable> vars;
      std::vector<Tensor> grads, w;
      std::vector<std::vector<Tensor>> slots;
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        vars.emplace_back(Tensor::random_uniform(shapes[i], -1, 1, 10 + i, float32, Device::cpu()), "v" + std::to_string(i));
        grads.push_back(Tensor::random_uniform(shapes[i], -1e-3, 1e-3, 100 + i, float32, Device::cpu()));
        w.push_back(vars.back().value().copy());
        slots.emplace_back();
        for (int k = 0; k < c.slots; ++k) slots.back().push_back(Tensor::zeros(shapes[i], float32, Device::cpu()));
      }
      auto o = c.make();
      o->build(vars);
      const double fused = median_ms(reps, [&] { o->apply_gradients(grads, vars); });
      int t = 1;
      const double composed = median_ms(reps, [&] { c.composed(w, grads, slots, t++); });
      // The fused pass reads the variable, the gradient and each slot, and writes the variable and each slot.
      const double bytes = 4.0 * static_cast<double>(params) * (3 + 2 * c.slots);
      std::printf("%-13s %10.2f %9.1f %14.2f %8.2fx\n", c.name, fused, bytes / (fused * 1e-3) / 1e9, composed,
                  composed / fused);
    }
    {  // Adafactor: its slots are r and c (matrices) or v; composed as Keras's update_step.
      std::vector<Variable> vars;
      std::vector<Tensor> grads, w;
      std::vector<std::vector<Tensor>> slots;  // {r, c} or {v}
      std::int64_t slot_elems = 0;
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        const Shape& sh = shapes[i];
        vars.emplace_back(Tensor::random_uniform(sh, -1, 1, 10 + i, float32, Device::cpu()), "v" + std::to_string(i));
        grads.push_back(Tensor::random_uniform(sh, -1e-3, 1e-3, 100 + i, float32, Device::cpu()));
        w.push_back(vars.back().value().copy());
        if (sh.size() >= 2) {
          Shape rs = sh, cs = sh;
          rs.pop_back();
          cs.erase(cs.end() - 2);
          slots.push_back({Tensor::zeros(rs, float32, Device::cpu()), Tensor::zeros(cs, float32, Device::cpu())});
        } else {
          slots.push_back({Tensor::zeros(sh, float32, Device::cpu())});
        }
        for (const Tensor& t : slots.back()) slot_elems += t.numel();
      }
      auto o = opt::Adafactor({.learning_rate = lr});
      o->build(vars);
      const double fused = median_ms(reps, [&] { o->apply_gradients(grads, vars); });
      int t = 1;
      auto rms = [](const Tensor& x) { return ops::sqrt(ops::mean(ops::square(x))); };
      const double composed = median_ms(reps, [&] {
        const float tf = static_cast<float>(t++);
        const double rho = std::min<double>(lr, 1 / std::sqrt(tf)), b = 1 - std::pow(tf, -0.8f);
        for (std::size_t i = 0; i < w.size(); ++i) {
          const Tensor alpha = ops::mul(ops::maximum(s(1e-3), rms(w[i])), s(rho));
          const Tensor reg = ops::add(ops::square(grads[i]), s(1e-30));
          Tensor v;
          if (slots[i].size() == 2) {
            Tensor& r = slots[i][0];
            Tensor& c = slots[i][1];
            r = ops::add(ops::mul(s(b), r), ops::mul(s(1 - b), ops::mean(reg, {-1})));
            c = ops::add(ops::mul(s(b), c), ops::mul(s(1 - b), ops::mean(reg, {-2})));
            Shape rs = r.shape(), cs = c.shape();
            rs.push_back(1);
            cs.insert(cs.end() - 1, 1);
            v = ops::mul(ops::reshape(ops::div(r, ops::mean(r, {-1}, true)), rs), ops::reshape(c, cs));
          } else {
            slots[i][0] = ops::add(ops::mul(s(b), slots[i][0]), ops::mul(s(1 - b), reg));
            v = slots[i][0];
          }
          const Tensor u = ops::div(grads[i], ops::sqrt(v));
          const Tensor u_hat = ops::div(u, ops::maximum(s(1), ops::div(rms(u), s(1))));
          w[i] = ops::sub(w[i], ops::mul(alpha, u_hat));
        }
      });
      // The fused step's passes: rows read the variable and gradient, columns the gradient, u rows
      // the gradient, the update the variable and gradient and writes the variable; the slots
      // (small) are read and written.
      const double bytes = 4.0 * (7.0 * static_cast<double>(params) + 3.0 * static_cast<double>(slot_elems));
      std::printf("%-13s %10.2f %9.1f %14.2f %8.2fx\n", "Adafactor", fused, bytes / (fused * 1e-3) / 1e9, composed,
                  composed / fused);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_optimizers: %s\n", e.what());
    return 1;
  }
  return 0;
}
