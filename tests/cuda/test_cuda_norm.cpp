// The CUDA batch- and layer-normalization kernels (src/backend/cuda/kernels/batch_norm.hpp and
// layer_norm.hpp) run on the host through emulate / emulate_phases, launched as the .cu files
// launch them (small grids too, so the row loops wrap and the float32 blocks flush), on host
// arrays of the storage types, against the CPU backend: statistics within a tight float32
// tolerance (float64: 1e-12), elementwise results within 1 ulp of the storage type plus a float32
// tolerance (both sides compute in float32 with the same coefficients, so they differ only by
// summation order and FMA contraction).
#include <cmath>
#include <cstring>
#include <functional>
#include <iomanip>
#include <utility>

#include "backend/backend.hpp"
#include "backend/cuda/kernels/batch_norm.hpp"
#include "backend/cuda/kernels/layer_norm.hpp"
#include "kernel_test_util.hpp"

using namespace mpt;
using namespace mpt::kernels;
using namespace mpt::test;

namespace {

// ---- host arrays -------------------------------------------------------------------------------

template <class T>
std::vector<double> wide(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(load(v[i]));
  return out;
}

std::vector<double> wide(const Tensor& t) { return t.to(float64).to_vector<double>(); }

/// An array of n copies of NaN as T: any element a kernel fails to write shows.
template <class T>
std::vector<T> poisoned(std::int64_t n) {
  return std::vector<T>(static_cast<std::size_t>(n), store<T>(std::nan("")));
}

/// One unit in the last place of storage type T at e.
template <class T>
double ulp(double e) {
  int digits = 53, min_exp = -1022;
  if constexpr (std::is_same_v<T, __half>) digits = 11, min_exp = -14;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) digits = 8, min_exp = -126;
  else if constexpr (std::is_same_v<T, float>) digits = 24, min_exp = -126;
  const int ex = e == 0 ? min_exp : std::max(std::ilogb(e), min_exp);
  return std::ldexp(1.0, ex - (digits - 1));
}

/// Relative tolerance of the compute type: float32, or float64 for float64 data.
template <class T>
double compute_rtol() {
  return std::is_same_v<T, double> ? 1e-12 : 2e-6;
}

/// |a - e| <= ulps * ulp_T(e) + rtol * (|e| + scale) elementwise (scale: the size of the terms
/// that cancelled into e, so a sum's rounding is judged against what was summed).
template <class T>
void expect_close(const std::string& what, const std::vector<double>& a, const std::vector<double>& e, double ulps,
                  double rtol, double scale = 1.0) {
  REQUIRE(a.size() == e.size());
  std::int64_t bad = 0, first = -1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double tol = ulps * ulp<T>(e[i]) + rtol * (std::fabs(e[i]) + scale);
    if (!(std::fabs(a[i] - e[i]) <= tol)) {
      if (first < 0) first = static_cast<std::int64_t>(i);
      ++bad;
    }
  }
  INFO(std::setprecision(10), what, ": ", bad, " of ", a.size(), " differ; first at ", first, ": ",
       first >= 0 ? a[first] : 0.0, " vs CPU ", first >= 0 ? e[first] : 0.0);
  CHECK(bad == 0);
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// ---- launches as the .cu files make them -------------------------------------------------------

/// Runs first, the kTreeSteps tree steps, then last, for every block (shared: 2 * block doubles).
template <class First, class Step, class Last, std::size_t... I>
void run_tree(Dim grid, unsigned block, First first, Step step, Last last, std::index_sequence<I...>) {
  emulate_phases<double>(grid, block, 2 * std::size_t{block}, first,
                         [&step](const Thread& t, double* sh) { step(t, sh, static_cast<int>(I)); }..., last);
}
template <class First, class Step, class Last>
void run_tree(Dim grid, unsigned block, First first, Step step, Last last) {
  run_tree(grid, block, first, step, last, std::make_index_sequence<kTreeSteps>{});
}

/// A launch of the [rows, C] kernels: block threads, gy row blocks (0: row_blocks as the device).
struct Launch {
  unsigned block;
  unsigned gy;
};
const Launch kLaunches[] = {{kNormThreads, 0}, {32, 3}, {32, 1}, {64, 2}};

struct Tile {
  std::int64_t cw;
  Dim grid;
};
Tile tile_for(std::int64_t rows, std::int64_t cols, Launch l) {
  const std::int64_t cw = channel_tile(cols, l.block), tiles = (cols + cw - 1) / cw;
  const unsigned gy = l.gy ? l.gy : row_blocks(rows, l.block / cw, tiles);
  return {cw, Dim{static_cast<unsigned>(tiles), gy, 1}};
}

/// column_sums_kernel then the partials, [grid.y][2][C].
template <class C, class Term>
std::vector<double> column_sums(const Term& term, std::int64_t rows, std::int64_t cols, Launch l, const Tile& tl) {
  std::vector<double> part(static_cast<std::size_t>(tl.grid.y * 2 * cols), std::nan(""));
  run_tree(
      tl.grid, l.block, [&](const Thread& t, double* sh) { column_sums_phase<C>(t, sh, term, rows, cols, tl.cw); },
      [&](const Thread& t, double* sh, int step) { column_sums_step(t, sh, cols, tl.cw, step); },
      [&](const Thread& t, double* sh) { column_sums_store(t, sh, part.data(), cols, tl.cw); });
  return part;
}

/// A small grid for the per-channel kernels, so their loops wrap: 2 blocks of 32 threads.
const Dim kSmallGrid{2, 1, 1}, kSmallBlock{32, 1, 1};

template <class P>
const P* ptr_or_null(const std::vector<P>& v) {
  return v.empty() ? nullptr : v.data();
}

template <class P>
std::vector<P> values(const Tensor& t) {
  return t.defined() ? t.to_vector<P>() : std::vector<P>{};
}

const std::int64_t kRows[] = {1, 37, 1000};
const std::int64_t kCols[] = {1, 3, 64, 130};

std::string describe_case(DType d, std::int64_t rows, std::int64_t cols, Launch l) {
  return to_string(d) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "] block " +
         std::to_string(l.block) + " gy " + std::to_string(l.gy);
}

}  // namespace

TEST_CASE("cuda batch_norm_stats kernels match the CPU's statistics") {
  for (DType d : {float32, float16, bfloat16, float64})
    dispatch_float(d, "test", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using P = compute_t<T>;
      for (std::int64_t rows : kRows)
        for (std::int64_t cols : kCols)
          for (Launch l : kLaunches) {
            INFO(describe_case(d, rows, cols, l));
            // Off-centre data: the first-row shift is what keeps float32 sums accurate.
            Tensor x = test::random({rows, cols}, d, Device::cpu(), 11 + rows + cols, 3.0, 7.0);
            Tensor mean = Tensor::empty({cols}, dtype_of<P>(), Device::cpu());
            Tensor var = Tensor::empty({cols}, dtype_of<P>(), Device::cpu());
            cpu().batch_norm_stats(x, mean, var);

            const Vec<T> hx = tensor_values<T>(x);
            const Tile tl = tile_for(rows, cols, l);
            const auto part = column_sums<P>(StatsTerm<T>{hx.data(), cols}, rows, cols, l, tl);
            std::vector<P> m(cols, P(NAN)), v(cols, P(NAN));
            emulate(kSmallGrid, kSmallBlock, [&](const Thread& t) {
              stats_finalize_body(t, hx.data(), part.data(), tl.grid.y, rows, cols, m.data(), v.data());
            });
            // Against the exact statistics (the float64 CPU path on the same values): float32's
            // rounding of the result and of 32-row blocks. Against the CPU's float32 statistics:
            // that plus the CPU's own rounding, its float32 blocks being up to 4096 rows long.
            Tensor m64 = Tensor::empty({cols}, float64, Device::cpu()), v64 = Tensor::empty({cols}, float64, Device::cpu());
            cpu().batch_norm_stats(x.to(float64), m64, v64);
            expect_close<P>("mean vs exact", wide(m), wide(m64), 0, compute_rtol<T>() / 2);
            expect_close<P>("var vs exact", wide(v), wide(v64), 0, compute_rtol<T>() / 2);
            const double cpu_rtol = std::is_same_v<T, double> ? 1e-12 : 2e-5;
            expect_close<P>("mean", wide(m), wide(mean), 0, cpu_rtol);
            expect_close<P>("var", wide(v), wide(var), 0, cpu_rtol);
          }
    });
}

namespace {

/// Random running statistics and (when asked) gamma/beta of C channels, in P's dtype.
struct Params {
  Tensor mean, var, gamma, beta;
};
Params params(std::int64_t cols, DType pd, bool affine, std::uint64_t seed) {
  Params p;
  p.mean = test::random({cols}, pd, Device::cpu(), seed, -0.5, 0.5);
  p.var = test::random({cols}, pd, Device::cpu(), seed + 1, 0.5, 2.0);
  if (affine) {
    p.gamma = test::random({cols}, pd, Device::cpu(), seed + 2, 0.5, 1.5);
    p.beta = test::random({cols}, pd, Device::cpu(), seed + 3, -0.5, 0.5);
  }
  return p;
}

/// coefficients_body on the host, as the .cu launches it, into k [4][C].
template <class C>
std::vector<C> coefficients(const Params& p, double eps, std::int64_t cols) {
  const auto m = values<C>(p.mean), v = values<C>(p.var), g = values<C>(p.gamma), b = values<C>(p.beta);
  std::vector<C> k(static_cast<std::size_t>(4 * cols), C(NAN));
  emulate(kSmallGrid, kSmallBlock, [&](const Thread& t) {
    coefficients_body(t, m.data(), v.data(), ptr_or_null(g), ptr_or_null(b), eps, cols, k.data());
  });
  return k;
}

const double kEps = 1e-3;

}  // namespace

TEST_CASE("cuda batch_norm kernels match the CPU, with and without gamma/beta and ReLU") {
  for (DType d : {float32, float16, bfloat16, float64})
    dispatch_float(d, "test", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      for (std::int64_t rows : kRows)
        for (std::int64_t cols : kCols)
          for (Launch l : kLaunches)
            for (int affine : {0, 1, 2})  // none, gamma and beta, gamma only
              for (bool relu : {false, true}) {
                INFO(describe_case(d, rows, cols, l), " affine ", affine, " relu ", relu);
                Tensor x = test::random({rows, cols}, d, Device::cpu(), 5 + rows * cols);
                Params p = params(cols, dtype_of<C>(), affine != 0, 100 + cols);
                if (affine == 2) p.beta = Tensor();
                Tensor y = Tensor::empty({rows, cols}, d, Device::cpu());
                const Activation act = relu ? Activation::Relu : Activation::Linear;
                cpu().batch_norm(x, p.mean, p.var, p.gamma, p.beta, kEps, act, y);

                const Vec<T> hx = tensor_values<T>(x);
                const auto k = coefficients<C>(p, kEps, cols);
                const Tile tl = tile_for(rows, cols, l);
                auto hy = poisoned<T>(rows * cols);
                emulate(tl.grid, Dim{l.block, 1, 1}, [&](const Thread& t) {
                  if (relu) forward_body<T, true>(t, hx.data(), k.data(), rows, cols, tl.cw, hy.data());
                  else forward_body<T, false>(t, hx.data(), k.data(), rows, cols, tl.cw, hy.data());
                });
                expect_close<T>("y", wide(hy), wide(y), 1, compute_rtol<T>());
              }
    });
}

TEST_CASE("cuda batch_norm_backward kernels match the CPU: batch and fixed statistics, ReLU, gamma/beta") {
  for (DType d : {float32, float16, bfloat16, float64})
    dispatch_float(d, "test", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = compute_t<T>;
      for (std::int64_t rows : kRows)
        for (std::int64_t cols : kCols)
          for (Launch l : kLaunches)
            for (bool batch_stats : {true, false})
              for (bool affine : {false, true})
                for (bool relu : {false, true})
                  for (bool want_dx : {true, false}) {
                    INFO(describe_case(d, rows, cols, l), " batch_stats ", batch_stats, " affine ", affine, " relu ",
                         relu, " dx ", want_dx);
                    Tensor x = test::random({rows, cols}, d, Device::cpu(), 7 + rows + 3 * cols);
                    Tensor dy = test::random({rows, cols}, d, Device::cpu(), 8 + rows + 5 * cols);
                    Params p = params(cols, dtype_of<C>(), affine, 200 + cols);
                    if (batch_stats) cpu().batch_norm_stats(x, p.mean, p.var);
                    const Activation act = relu ? Activation::Relu : Activation::Linear;
                    Tensor dx = want_dx ? Tensor::empty({rows, cols}, d, Device::cpu()) : Tensor();
                    // Parameter gradients where there are parameters; none at all (part null) when
                    // the statistics are fixed and there is no affine.
                    Tensor dg = affine ? Tensor::empty({cols}, dtype_of<C>(), Device::cpu()) : Tensor();
                    Tensor db = affine ? Tensor::empty({cols}, dtype_of<C>(), Device::cpu()) : Tensor();
                    if (!want_dx && !affine) continue;
                    cpu().batch_norm_backward(x, dy, p.mean, p.var, p.gamma, p.beta, kEps, batch_stats, act, dx, dg,
                                              db);

                    const Vec<T> hx = tensor_values<T>(x), hd = tensor_values<T>(dy);
                    const auto k = coefficients<C>(p, kEps, cols);
                    const Tile tl = tile_for(rows, cols, l);
                    std::vector<double> part;
                    if (batch_stats || affine) {
                      if (relu) part = column_sums<C>(GradTerm<T, true>{hx.data(), hd.data(), k.data(), cols}, rows, cols, l, tl);
                      else part = column_sums<C>(GradTerm<T, false>{hx.data(), hd.data(), k.data(), cols}, rows, cols, l, tl);
                    }
                    std::vector<C> hg(affine ? cols : 0, C(NAN)), hb(affine ? cols : 0, C(NAN));
                    std::vector<C> coef(static_cast<std::size_t>(3 * cols), C(NAN));
                    emulate(kSmallGrid, kSmallBlock, [&](const Thread& t) {
                      grad_finalize_body(t, part.empty() ? nullptr : part.data(), tl.grid.y, rows, cols, k.data(),
                                         batch_stats, affine ? hg.data() : nullptr, affine ? hb.data() : nullptr,
                                         coef.data());
                    });
                    if (affine) {
                      // Sums over the rows: judged against the size of what was summed.
                      const double scale = static_cast<double>(rows) * 4;
                      expect_close<C>("dgamma", wide(hg), wide(dg), 0, compute_rtol<T>(), scale);
                      expect_close<C>("dbeta", wide(hb), wide(db), 0, compute_rtol<T>(), scale);
                    }
                    if (!want_dx) continue;
                    auto hdx = poisoned<T>(rows * cols);
                    emulate(tl.grid, Dim{l.block, 1, 1}, [&](const Thread& t) {
                      if (relu) grad_input_body<T, true>(t, hx.data(), hd.data(), k.data(), coef.data(), rows, cols, tl.cw, hdx.data());
                      else grad_input_body<T, false>(t, hx.data(), hd.data(), k.data(), coef.data(), rows, cols, tl.cw, hdx.data());
                    });
                    const auto e = wide(dx);
                    // dx = a * dy + b * x + d0: b and d0 come from sums, so judge against the terms.
                    expect_close<T>("dx", wide(hdx), e, 1, compute_rtol<T>(), 4 * std::max(1.0, max_abs(e)));
                  }
    });
}

namespace {
const std::int64_t kLnRows[] = {1, 37, 300};
const std::int64_t kLnDims[] = {1, 5, 1000};
const unsigned kLnBlocks[] = {kNormThreads, 32, 96};
}  // namespace

TEST_CASE("cuda layer_norm kernels match the CPU, with and without gamma/beta") {
  for (DType d : {float32, float16, bfloat16, float64})
    dispatch_float(d, "test", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using P = compute_t<T>;
      for (std::int64_t rows : kLnRows)
        for (std::int64_t dim : kLnDims)
          for (unsigned block : kLnBlocks)
            for (bool affine : {false, true}) {
              INFO(to_string(d), " [", rows, ", ", dim, "] block ", block, " affine ", affine);
              Tensor x = test::random({rows, dim}, d, Device::cpu(), 3 + rows + dim, 1.0, 4.0);
              Tensor gamma, beta;
              if (affine) {
                gamma = test::random({dim}, dtype_of<P>(), Device::cpu(), 40, 0.5, 1.5);
                beta = test::random({dim}, dtype_of<P>(), Device::cpu(), 41, -0.5, 0.5);
              }
              Tensor y = Tensor::empty({rows, dim}, d, Device::cpu());
              Tensor mean = Tensor::empty({rows}, dtype_of<P>(), Device::cpu());
              Tensor rstd = Tensor::empty({rows}, dtype_of<P>(), Device::cpu());
              cpu().layer_norm(x, gamma, beta, kEps, y, mean, rstd);

              const Vec<T> hx = tensor_values<T>(x);
              const auto g = values<P>(gamma), b = values<P>(beta);
              auto hy = poisoned<T>(rows * dim);
              std::vector<P> hm(rows, P(NAN)), hr(rows, P(NAN));
              auto tree = [](int lo, int hi) {
                return [lo, hi](const Thread& t, double* sh, int step) { row_tree_step(t, sh, step, lo, hi); };
              };
              // The forward kernel's phases: sum, tree (half 0), deviations, tree (half 1), store.
              // run_tree holds one tree, so the first tree runs inside an outer run of phases.
              auto steps = [&](auto step, std::size_t i) { return [step, i](const Thread& t, double* sh) { step(t, sh, int(i)); }; };
              auto t0 = tree(0, 1), t1 = tree(1, 2);
              emulate_phases<double>(
                  Dim{static_cast<unsigned>(rows), 1, 1}, block, 2 * std::size_t{block},
                  [&](const Thread& t, double* sh) { ln_sum_phase(t, sh, hx.data(), dim); }, steps(t0, 0),
                  steps(t0, 1), steps(t0, 2), steps(t0, 3), steps(t0, 4), steps(t0, 5), steps(t0, 6), steps(t0, 7),
                  [&](const Thread& t, double* sh) { ln_deviation_phase(t, sh, hx.data(), dim); }, steps(t1, 0),
                  steps(t1, 1), steps(t1, 2), steps(t1, 3), steps(t1, 4), steps(t1, 5), steps(t1, 6), steps(t1, 7),
                  [&](const Thread& t, double* sh) {
                    ln_forward_phase(t, sh, hx.data(), ptr_or_null(g), ptr_or_null(b), kEps, dim, hy.data(),
                                     hm.data(), hr.data());
                  });
              static_assert(kTreeSteps == 8, "the phase list above spells out 8 tree steps");
              expect_close<P>("mean", wide(hm), wide(mean), 0, compute_rtol<T>() / 2);
              expect_close<P>("rstd", wide(hr), wide(rstd), 0, compute_rtol<T>() / 2);
              expect_close<T>("y", wide(hy), wide(y), 1, compute_rtol<T>());
            }
    });
}

TEST_CASE("cuda layer_norm_backward kernels match the CPU: dx, dgamma, dbeta") {
  for (DType d : {float32, float16, bfloat16, float64})
    dispatch_float(d, "test", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using P = compute_t<T>;
      for (std::int64_t rows : kLnRows)
        for (std::int64_t dim : kLnDims)
          for (unsigned block : kLnBlocks)
            for (bool affine : {false, true}) {
              INFO(to_string(d), " [", rows, ", ", dim, "] block ", block, " affine ", affine);
              Tensor x = test::random({rows, dim}, d, Device::cpu(), 13 + rows + dim);
              Tensor dy = test::random({rows, dim}, d, Device::cpu(), 14 + rows + dim);
              Tensor gamma = affine ? test::random({dim}, dtype_of<P>(), Device::cpu(), 42, 0.5, 1.5) : Tensor();
              Tensor y = Tensor::empty({rows, dim}, d, Device::cpu());
              Tensor mean = Tensor::empty({rows}, dtype_of<P>(), Device::cpu());
              Tensor rstd = Tensor::empty({rows}, dtype_of<P>(), Device::cpu());
              cpu().layer_norm(x, gamma, Tensor(), kEps, y, mean, rstd);
              Tensor dx = Tensor::empty({rows, dim}, d, Device::cpu());
              Tensor dg = Tensor::empty({dim}, dtype_of<P>(), Device::cpu());
              Tensor db = Tensor::empty({dim}, dtype_of<P>(), Device::cpu());
              cpu().layer_norm_backward(x, dy, mean, rstd, gamma, dx, dg, db);

              const Vec<T> hx = tensor_values<T>(x), hd = tensor_values<T>(dy);
              const auto g = values<P>(gamma), m = values<P>(mean), r = values<P>(rstd);
              auto hdx = poisoned<T>(rows * dim);
              run_tree(
                  Dim{static_cast<unsigned>(rows), 1, 1}, block,
                  [&](const Thread& t, double* sh) {
                    ln_grad_sums_phase(t, sh, hx.data(), hd.data(), m.data(), r.data(), ptr_or_null(g), dim);
                  },
                  [](const Thread& t, double* sh, int step) { row_tree_step(t, sh, step, 0, 2); },
                  [&](const Thread& t, double* sh) {
                    ln_grad_input_phase(t, sh, hx.data(), hd.data(), m.data(), r.data(), ptr_or_null(g), dim,
                                        hdx.data());
                  });
              const auto e = wide(dx);
              // dx subtracts row means of gg and gg * xhat: judged against the terms' size.
              expect_close<T>("dx", wide(hdx), e, 1, compute_rtol<T>(), 4 * std::max(1.0, max_abs(e)));

              const Launch l{block, block == 32 ? 3u : 0u};
              const Tile tl = tile_for(rows, dim, l);
              const auto part = column_sums<P>(LayerNormParamTerm<T, P>{hx.data(), hd.data(), m.data(), r.data(), dim},
                                               rows, dim, l, tl);
              std::vector<P> hg(dim, P(NAN)), hb(dim, P(NAN));
              emulate(kSmallGrid, kSmallBlock, [&](const Thread& t) {
                ln_params_finalize_body(t, part.data(), tl.grid.y, dim, hg.data(), hb.data());
              });
              const double scale = static_cast<double>(rows) * 4;
              expect_close<P>("dgamma", wide(hg), wide(dg), 0, compute_rtol<T>(), scale);
              expect_close<P>("dbeta", wide(hb), wide(db), 0, compute_rtol<T>(), scale);
            }
    });
}
