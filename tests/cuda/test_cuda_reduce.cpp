// The CUDA reduction, softmax, cross-entropy, gather, pad and random kernels run on the host
// (kernels/*.hpp through emulate / emulate_phases, on arrays of the storage types) against the
// CPU backend. Exact: argmax, max/min, integer sums, gather_rows, pad and random. Float sums,
// softmax and cross-entropy: the GPU adds a row in a tree, the CPU in order, so they agree
// within the float32 (float64) summation-order bound 2 (n + 8) eps |terms|, plus one unit in
// the last place of a 16-bit output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>

#include "backend/backend.hpp"
#include "backend/cuda/kernels/gather.hpp"
#include "backend/cuda/kernels/image.hpp"
#include "backend/cuda/kernels/random.hpp"
#include "backend/cuda/kernels/reduce.hpp"
#include "backend/cuda/kernels/softmax.hpp"
#include "kernel_test_util.hpp"

using namespace mpt;
using namespace mpt::kernels;
using namespace mpt::test;

namespace {

template <class T> double as_double(T v) { return static_cast<double>(load(v)); }

/// Relative size of one unit in the last place of a 16-bit type (0 for wider types).
template <class T> double out_ulp() {
  if constexpr (std::is_same_v<T, __half>) return 0x1p-10;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return 0x1p-7;
  else return 0;
}
template <class C> double eps_of() { return std::is_same_v<C, double> ? 0x1p-52 : 0x1p-23; }

template <class T>
Vec<T> random_data(std::int64_t count, double lo, double hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Vec<T> v(static_cast<std::size_t>(count));
  for (auto& e : v) {
    const double d = u(rng);
    if constexpr (std::is_integral_v<T>) e = static_cast<T>(std::floor(d));
    else e = store_double<T>(d);
  }
  return v;
}

/// Phases for kReduceTreeSteps tree steps: step(t, sh, ty/2), step(t, sh, ty/4), ..., no-ops
/// (half = 0) beyond log2(ty), as the device's loop stops.
template <class Step>
auto tree_phases(unsigned ty, Step step) {
  return [&]<std::size_t... K>(std::index_sequence<K...>) {
    return std::make_tuple([=](const Thread& t, auto* sh) { step(t, sh, ty >> (K + 1)); }...);
  }(std::make_index_sequence<kReduceTreeSteps>{});
}
template <class P>
auto phase(P p) {
  return std::make_tuple(p);
}

/// Emulates a tiled launch over all tiles of g in chunks of at most `chunk` blocks (so
/// tile_base is exercised), shared memory of `regions` block-sized regions of S.
template <class S, class Make>
void run_tiles(ReduceGeom g, std::int64_t chunk, int regions, Make make_phases) {
  for (std::int64_t base = 0; base < g.tiles(); base += chunk) {
    g.tile_base = base;
    const auto blocks = static_cast<unsigned>(std::min(chunk, g.tiles() - base));
    std::apply([&](auto&&... p) { emulate_phases<S>(Dim{blocks, 1, 1}, g.threads(), regions * g.threads(), p...); },
               make_phases(g));
  }
}

/// A shape with the reduced axis first, in the middle or last, and its [outer, n, inner].
struct Case {
  Shape shape;
  std::int64_t axis, outer, n, inner;
};
std::vector<Case> cases() {
  std::vector<Case> cs;
  for (std::int64_t n : {1, 7, 1000, 1025}) {
    cs.push_back({{n}, 0, 1, n, 1});
    cs.push_back({{n, 6}, 0, 1, n, 6});          // first
    cs.push_back({{3, n, 5}, 1, 3, n, 5});       // middle
    cs.push_back({{2, n, 37}, 1, 2, n, 37});     // middle, a partial tile of 32+ columns
    cs.push_back({{5, n}, 1, 5, n, 1});          // last
  }
  return cs;
}

/// Values compared by close(): each test case checks it compared something.
std::int64_t g_compared = 0;

/// a within tol of e, NaN matching NaN, inf matching the same inf.
bool close(double a, double e, double tol) {
  ++g_compared;
  if (std::isnan(e) || std::isnan(a)) return std::isnan(e) && std::isnan(a);
  if (std::isinf(e) || std::isinf(a)) return a == e;
  return std::abs(a - e) <= tol;
}

// ---- reduce -----------------------------------------------------------------------------------

/// One emulated pass of reduce_kernel over [outer, n, inner] (reduce.cu's reduce_pass).
template <class T, class O>
void reduce_pass(ReduceOp op, const T* x, O* out, std::int64_t outer, std::int64_t n, std::int64_t inner,
                 std::int64_t mean_count, unsigned threads) {
  using C = compute_t<T>;
  ReduceGeom g0 = reduce_geom(outer, n, inner, threads);
  g0.mean_count = mean_count;
  run_tiles<C>(g0, 3, 1, [&](const ReduceGeom& g) {
    return std::tuple_cat(
        phase([&](const Thread& t, C* sh) { reduce_partial(t, sh, x, op, g); }),
        tree_phases(g.ty, [&](const Thread& t, C* sh, unsigned h) { reduce_step(t, sh, op, g, h); }),
        phase([&](const Thread& t, C* sh) { reduce_finish(t, sh, out, op, g); }));
  });
}

/// The passes reduce.cu's CudaBackend::reduce launches: one, or the split's three (runs, rest,
/// partials) through float32/float64 partials.
template <class T, class O>
void emulate_reduce(ReduceOp op, const T* x, O* out, std::int64_t outer, std::int64_t n, std::int64_t inner,
                    unsigned threads) {
  using C = compute_t<T>;
  const ReduceSplit split = reduce_split(outer, n, inner, !std::is_integral_v<C>);
  if (split.splits == 1) return reduce_pass<T, O>(op, x, out, outer, n, inner, 0, threads);
  Vec<C> partial(static_cast<std::size_t>(split.partial_rows() * inner));
  const ReduceOp first = op == ReduceOp::Mean ? ReduceOp::Sum : op;
  reduce_pass<T, C>(first, x, partial.data(), split.splits, split.run, inner, 0, threads);
  if (split.rest > 0)
    reduce_pass<T, C>(first, x + split.splits * split.run * inner, partial.data() + split.splits * inner, 1, split.rest,
                      inner, 0, threads);
  reduce_pass<C, O>(op, partial.data(), out, 1, split.partial_rows(), inner, n, threads);
}

template <class T, class O>
void check_reduce(ReduceOp op, const Case& c, unsigned threads, bool with_nan) {
  using C = compute_t<T>;
  auto x = std::is_same_v<T, bool> ? random_data<T>(c.outer * c.n * c.inner, 0, 2, 7)
           : std::is_integral_v<T> ? random_data<T>(c.outer * c.n * c.inner, std::is_same_v<T, std::uint8_t> ? 0 : -50, 50, 7)
                                   : random_data<T>(c.outer * c.n * c.inner, -2, 2, 7);
  if constexpr (!std::is_integral_v<T>)
    if (with_nan && x.size() > 3) x[x.size() / 2] = store_double<T>(NAN);
  Shape os = c.shape;
  os[c.axis] = 1;
  Tensor ref = Tensor::empty(os, dtype_of_storage<O>(), Device::cpu());
  cpu().reduce(op, host_tensor(x, c.shape), c.axis, ref);
  const auto expect = tensor_values<O>(ref);

  Vec<O> got(static_cast<std::size_t>(c.outer * c.inner));
  emulate_reduce<T, O>(op, x.data(), got.data(), c.outer, c.n, c.inner, threads);

  const bool exact = std::is_integral_v<C> || op == ReduceOp::Max || op == ReduceOp::Min;
  for (std::int64_t o = 0; o < c.outer; ++o)
    for (std::int64_t j = 0; j < c.inner; ++j) {
      const std::size_t k = static_cast<std::size_t>(o * c.inner + j);
      double sum_abs = 0;
      for (std::int64_t i = 0; i < c.n; ++i) sum_abs += std::abs(as_double(x[(o * c.n + i) * c.inner + j]));
      if (op == ReduceOp::Mean) sum_abs /= static_cast<double>(c.n);
      const double e = as_double(expect[k]), a = as_double(got[k]);
      const double tol = exact ? 0 : 2.0 * (c.n + 8) * eps_of<C>() * sum_abs + out_ulp<O>() * std::abs(e);
      if (!close(a, e, tol)) {
        FAIL_CHECK("reduce op ", int(op), " ", to_string(dtype_of_storage<T>()), "->", to_string(dtype_of_storage<O>()),
                   " shape ", to_string(c.shape), " axis ", c.axis, " threads ", threads, " at ", k, ": ", a, " vs ", e);
        return;
      }
    }
}

template <class T>
void check_reduce_dtype() {
  using C = compute_t<T>;
  using Wide = std::conditional_t<std::is_same_v<C, double>, double, std::conditional_t<std::is_integral_v<C>, std::int64_t, float>>;
  for (const Case& c : cases())
    for (unsigned threads : {256u, 32u})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
        if (std::is_same_v<T, bool> && (op == ReduceOp::Sum || op == ReduceOp::Mean)) continue;
        const bool narrow_sum = (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, bool>) &&
                                (op == ReduceOp::Sum || op == ReduceOp::Mean);
        if (!narrow_sum) check_reduce<T, T>(op, c, threads, false);  // uint8 sums would wrap
        check_reduce<T, Wide>(op, c, threads, false);
        if constexpr (std::is_same_v<C, float>) {
          check_reduce<T, float>(op, c, threads, true);  // NaN propagates
          check_reduce<float, T>(op, c, threads, false);  // float32 intermediate to a 16-bit output
        }
      }
}

TEST_CASE("cuda reduce: sum/mean/max/min per dtype, axis and size match the CPU") {
  const std::int64_t before = g_compared;
  check_reduce_dtype<float>();
  check_reduce_dtype<double>();
  check_reduce_dtype<__half>();
  check_reduce_dtype<__nv_bfloat16>();
  check_reduce_dtype<std::int32_t>();
  check_reduce_dtype<std::int64_t>();
  check_reduce_dtype<std::uint8_t>();
  check_reduce_dtype<bool>();
  const std::string compared = std::to_string(g_compared - before) + " values compared";
  MESSAGE(compared);
  CHECK(g_compared - before > 1000);
}

TEST_CASE("cuda reduce: a long leading axis splits across blocks and matches the CPU") {
  // A bias gradient ([N*H*W, C] summed over rows) was one block per 32 columns: 11 ms for
  // [692224, 32] on an H100. Split into runs (and a rest) through float32 partials.
  const ReduceSplit s = reduce_split(1, 692224, 32, true);
  CHECK(s.splits >= 64);
  CHECK(s.splits * s.run + s.rest == 692224);
  CHECK(s.run >= kReduceSplitRows);
  CHECK(reduce_split(1, 692224, 32, false).splits == 1);    // integers: one pass, exact as before
  CHECK(reduce_split(2, 692224, 32, true).splits == 1);     // outer > 1: runs would not be contiguous
  CHECK(reduce_split(1, 1000, 32, true).splits == 1);       // short axis
  CHECK(reduce_split(1, 692224, 8192, true).splits == 1);   // enough tiles already
  const std::int64_t before = g_compared;
  for (const Case& c : {Case{{9001, 6}, 0, 1, 9001, 6}, Case{{12288, 37}, 0, 1, 12288, 37}, Case{{20000}, 0, 1, 20000, 1}}) {
    REQUIRE(reduce_split(c.outer, c.n, c.inner, true).splits > 1);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
      check_reduce<float, float>(op, c, 256, false);
      check_reduce<float, float>(op, c, 256, true);  // NaN in one run reaches the result
      check_reduce<double, double>(op, c, 256, false);
      check_reduce<__half, __half>(op, c, 256, false);
      check_reduce<__nv_bfloat16, float>(op, c, 256, false);
    }
  }
  CHECK(g_compared - before > 500);
}

// ---- argmax -----------------------------------------------------------------------------------

template <class T>
void check_argmax(const Case& c, unsigned threads, int nan_mode) {
  using C = compute_t<T>;
  // Few distinct values: many ties, so "first index of the maximum" is tested.
  auto x = std::is_same_v<T, bool> ? random_data<T>(c.outer * c.n * c.inner, 0, 2, 11)
                                   : random_data<T>(c.outer * c.n * c.inner, 0, 4, 11);
  if constexpr (!std::is_integral_v<T>) {
    if (nan_mode >= 1 && x.size() > 4) x[x.size() / 3] = store_double<T>(NAN);
    if (nan_mode >= 2 && x.size() > 4) x[x.size() - 2] = store_double<T>(NAN);
    if (nan_mode == 3)
      for (auto& v : x) v = store_double<T>(-INFINITY);  // all equal: index 0
  }
  Shape os = c.shape;
  os[c.axis] = 1;
  Tensor ref = Tensor::empty(os, int64, Device::cpu());
  cpu().argmax(host_tensor(x, c.shape), c.axis, ref);
  const auto expect = tensor_values<std::int64_t>(ref);
  Vec<std::int64_t> got(expect.size(), -7);
  run_tiles<ArgPair<C>>(reduce_geom(c.outer, c.n, c.inner, threads), 4, 1, [&](const ReduceGeom& g) {
    return std::tuple_cat(
        phase([&](const Thread& t, ArgPair<C>* sh) { argmax_partial(t, sh, x.data(), g); }),
        tree_phases(g.ty, [&](const Thread& t, ArgPair<C>* sh, unsigned h) { argmax_step(t, sh, g, h); }),
        phase([&](const Thread& t, ArgPair<C>* sh) { argmax_finish(t, sh, got.data(), g); }));
  });
  INFO("argmax ", to_string(dtype_of_storage<T>()), " shape ", to_string(c.shape), " axis ", c.axis, " threads ",
       threads, " nan_mode ", nan_mode);
  CHECK(got == expect);
}

TEST_CASE("cuda argmax: the CPU's first maximum and NaN rule, bit for bit") {
  for (const Case& c : cases())
    for (unsigned threads : {256u, 64u}) {
      for (int nan_mode : {0, 1, 2, 3}) {
        check_argmax<float>(c, threads, nan_mode);
        check_argmax<double>(c, threads, nan_mode);
        check_argmax<__half>(c, threads, nan_mode);
        check_argmax<__nv_bfloat16>(c, threads, nan_mode);
      }
      check_argmax<std::int32_t>(c, threads, 0);
      check_argmax<std::int64_t>(c, threads, 0);
      check_argmax<std::uint8_t>(c, threads, 0);
      check_argmax<bool>(c, threads, 0);
    }
}

// ---- softmax ----------------------------------------------------------------------------------

template <class T>
void check_softmax(const Case& c, unsigned threads, bool log) {
  using C = compute_t<T>;
  const auto x = random_data<T>(c.outer * c.n * c.inner, -4, 4, 3);
  Tensor ref = Tensor::empty(c.shape, dtype_of_storage<T>(), Device::cpu());
  cpu().softmax(host_tensor(x, c.shape), c.axis, log, ref);
  const auto expect = tensor_values<T>(ref);
  Vec<T> got(x.size());
  run_tiles<C>(reduce_geom(c.outer, c.n, c.inner, threads), 5, 2, [&](const ReduceGeom& g) {
    return std::tuple_cat(
        phase([&](const Thread& t, C* sh) { softmax_max_partial(t, sh, x.data(), g); }),
        tree_phases(g.ty, [&](const Thread& t, C* sh, unsigned h) { region_step(t, sh, g, 0, h, MaxOp{}); }),
        phase([&](const Thread& t, C* sh) { softmax_sum_partial(t, sh, x.data(), g); }),
        tree_phases(g.ty, [&](const Thread& t, C* sh, unsigned h) { region_step(t, sh, g, 1, h, SumOp{}); }),
        phase([&](const Thread& t, C* sh) { softmax_write(t, sh, x.data(), got.data(), log, g); }));
  });
  // exp terms are at most 1 after the max shift: sum order moves the result by n eps relative.
  const double k = 2.0 * (c.n + 8) * eps_of<C>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double e = as_double(expect[i]), a = as_double(got[i]);
    const double tol = k * (1 + std::abs(e)) + out_ulp<T>() * std::abs(e) + (out_ulp<T>() ? 1e-7 : 0);
    if (!close(a, e, tol)) {
      FAIL_CHECK(std::string(log ? "log_softmax " : "softmax "), to_string(dtype_of_storage<T>()), " shape ", to_string(c.shape),
                 " axis ", c.axis, " threads ", threads, " at ", i, ": ", a, " vs ", e);
      return;
    }
  }

  // Backward, with dy in the same dtype and (for 16-bit) in float32, as the CPU accepts.
  const auto dy = random_data<T>(static_cast<std::int64_t>(x.size()), -1, 1, 5);
  const auto dy32 = random_data<float>(static_cast<std::int64_t>(x.size()), -1, 1, 5);
  for (int dy_kind = 0; dy_kind < 2; ++dy_kind) {
    const void* dyp = dy_kind == 0 ? static_cast<const void*>(dy.data()) : dy32.data();
    const DType dyd = dy_kind == 0 ? dtype_of_storage<T>() : float32;
    Tensor dref = Tensor::empty(c.shape, dtype_of_storage<T>(), Device::cpu());
    cpu().softmax_backward(ref, dy_kind == 0 ? host_tensor(dy, c.shape) : host_tensor(dy32, c.shape), c.axis, log,
                           dref);
    const auto dexpect = tensor_values<T>(dref);
    Vec<T> dgot(x.size());
    run_tiles<C>(reduce_geom(c.outer, c.n, c.inner, threads), 5, 1, [&](const ReduceGeom& g) {
      return std::tuple_cat(
          phase([&](const Thread& t, C* sh) { softmax_backward_partial(t, sh, expect.data(), dyp, dyd, log, g); }),
          tree_phases(g.ty, [&](const Thread& t, C* sh, unsigned h) { region_step(t, sh, g, 0, h, SumOp{}); }),
          phase([&](const Thread& t, C* sh) {
            softmax_backward_write(t, sh, expect.data(), dyp, dyd, dgot.data(), log, g);
          }));
    });
    // |dx error| <= |y or exp(y)| * (error of the row sum) <= n eps * sum |dy| (|y| <= 1 or exp(y) <= 1).
    for (std::int64_t o = 0; o < c.outer; ++o)
      for (std::int64_t j = 0; j < c.inner; ++j) {
        double row = 0;
        for (std::int64_t i = 0; i < c.n; ++i) row += std::abs(load_dyn<double>(dyp, dyd, (o * c.n + i) * c.inner + j));
        for (std::int64_t i = 0; i < c.n; ++i) {
          const auto q = static_cast<std::size_t>((o * c.n + i) * c.inner + j);
          const double e = as_double(dexpect[q]), a = as_double(dgot[q]);
          const double tol = k * (1 + row + std::abs(e)) + out_ulp<T>() * std::abs(e) + (out_ulp<T>() ? 1e-7 : 0);
          if (!close(a, e, tol)) {
            FAIL_CHECK(std::string(log ? "log_softmax" : "softmax"), " backward ", to_string(dtype_of_storage<T>()), " dy ",
                       to_string(dyd), " shape ", to_string(c.shape), " axis ", c.axis, " at ", q, ": ", a, " vs ", e);
            return;
          }
        }
      }
  }
}

TEST_CASE("cuda softmax and log-softmax, forward and backward, match the CPU") {
  const std::int64_t before = g_compared;
  for (const Case& c : cases())
    for (unsigned threads : {256u, 32u})
      for (bool log : {false, true}) {
        check_softmax<float>(c, threads, log);
        check_softmax<double>(c, threads, log);
        check_softmax<__half>(c, threads, log);
        check_softmax<__nv_bfloat16>(c, threads, log);
      }
  const std::string compared = std::to_string(g_compared - before) + " values compared";
  MESSAGE(compared);
  CHECK(g_compared - before > 1000);
}

// ---- cross-entropy ----------------------------------------------------------------------------

/// labels: 0 int32 ids, 1 int64 ids (one out of range), 2 uint8 ids, 3 float32 targets,
/// 4 float64 targets, 5 float16 targets.
template <class T>
void check_cross_entropy(std::int64_t rows, std::int64_t n, unsigned threads, bool from_logits, int label_kind) {
  using C = compute_t<T>;
  const auto x = from_logits ? random_data<T>(rows * n, -3, 3, 21) : random_data<T>(rows * n, 0.001, 1, 21);
  Vec<std::int32_t> ids32(static_cast<std::size_t>(rows));
  Vec<std::int64_t> ids64(ids32.size());
  Vec<std::uint8_t> ids8(ids32.size());
  std::mt19937 rng(5);
  for (std::size_t r = 0; r < ids32.size(); ++r) {
    ids32[r] = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(std::min<std::int64_t>(n, 256)));
    ids64[r] = ids32[r], ids8[r] = static_cast<std::uint8_t>(ids32[r]);
  }
  if (rows > 2) ids64[1] = n;  // out of range: that row is NaN
  // Targets: a distribution per row (some rows summing to 2, so sum(t) matters in the gradient).
  auto t64 = random_data<double>(rows * n, 0, 1, 9);
  for (std::int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += t64[r * n + i];
    for (std::int64_t i = 0; i < n; ++i) t64[r * n + i] *= (r % 2 ? 2.0 : 1.0) / s;
  }
  Vec<float> t32(t64.size());
  Vec<__half> t16(t64.size());
  for (std::size_t i = 0; i < t64.size(); ++i) t32[i] = static_cast<float>(t64[i]), t16[i] = store_double<__half>(t64[i]);
  Tensor lab;
  Labels l{};
  switch (label_kind) {
    case 0: lab = host_tensor(ids32, {rows}), l = {ids32.data(), int32, true}; break;
    case 1: lab = host_tensor(ids64, {rows}), l = {ids64.data(), int64, true}; break;
    case 2: lab = host_tensor(ids8, {rows}), l = {ids8.data(), uint8, true}; break;
    case 3: lab = host_tensor(t32, {rows, n}), l = {t32.data(), float32, false}; break;
    case 4: lab = host_tensor(t64, {rows, n}), l = {t64.data(), float64, false}; break;
    default: lab = host_tensor(t16, {rows, n}), l = {t16.data(), float16, false}; break;
  }
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Tensor xt = host_tensor(x, {rows, n});
  Tensor ref = Tensor::empty({rows}, dtype_of_storage<L>(), Device::cpu());
  cpu().cross_entropy(xt, lab, from_logits, ref);
  const auto expect = tensor_values<L>(ref);
  Vec<L> got(expect.size());
  const ReduceGeom g0 = reduce_geom(rows, n, 1, threads);
  // Both passes start alike: the row max (logits) or the row sum (probabilities) in region 0.
  auto row_stat_phases = [&](const ReduceGeom& g) {
    return std::tuple_cat(phase([&](const Thread& t, C* sh) {
                            if (from_logits) softmax_max_partial(t, sh, x.data(), g);
                            else xent_psum_partial(t, sh, x.data(), g);
                          }),
                          tree_phases(g.ty, [&](const Thread& t, C* sh, unsigned h) {
                            if (from_logits) region_step(t, sh, g, 0, h, MaxOp{});
                            else region_step(t, sh, g, 0, h, SumOp{});
                          }));
  };
  run_tiles<C>(g0, 3, 3, [&](const ReduceGeom& g) {
    return std::tuple_cat(
        row_stat_phases(g),
        phase([&](const Thread& t, C* sh) {
          if (from_logits) softmax_sum_partial(t, sh, x.data(), g);
        }),
        tree_phases(g.ty, [&](const Thread& t, C* sh, unsigned h) {
          if (from_logits) region_step(t, sh, g, 1, h, SumOp{});
        }),
        phase([&](const Thread& t, C* sh) { xent_loss_partial(t, sh, x.data(), l, from_logits, g); }),
        tree_phases(g.ty, [&](const Thread& t, C* sh, unsigned h) { region_step(t, sh, g, 2, h, SumOp{}); }),
        phase([&](const Thread& t, C* sh) { xent_loss_write(t, sh, got.data(), g); }));
  });
  const double k = 2.0 * (n + 16) * eps_of<C>();
  std::string what = std::string(from_logits ? "logits " : "probabilities ") + to_string(dtype_of_storage<T>()) +
                     " labels " + std::to_string(label_kind) + " rows " + std::to_string(rows) + " n " +
                     std::to_string(n) + " threads " + std::to_string(threads);
  for (std::int64_t r = 0; r < rows; ++r) {
    double tsum = 0;
    for (std::int64_t i = 0; i < n; ++i) tsum += std::abs(l.sparse ? 1.0 : t64[r * n + i]);
    // |log q| <= 20 here (q >= 1e-7 or |x - lse| <= 3 + 3 + log n).
    const double tol = k * (1 + std::abs(expect[r]) + 20 * tsum);
    if (!close(got[r], expect[r], tol)) {
      FAIL_CHECK("cross_entropy ", what, " row ", r, ": ", got[r], " vs ", expect[r]);
      return;
    }
  }

  // Backward with dloss in the loss dtype.
  const auto dloss = random_data<L>(rows, 0.5, 2, 13);
  Tensor dref = Tensor::empty({rows, n}, dtype_of_storage<T>(), Device::cpu());
  cpu().cross_entropy_backward(xt, lab, from_logits, host_tensor(dloss, {rows}), dref);
  const auto dexpect = tensor_values<T>(dref);
  Vec<T> dgot(x.size());
  run_tiles<C>(g0, 3, 3, [&](const ReduceGeom& g) {
    return std::tuple_cat(
        row_stat_phases(g),
        phase([&](const Thread& t, C* sh) {
          if (from_logits) xent_grad_sums_partial(t, sh, x.data(), l, g);
          else xent_grad_dot_partial(t, sh, x.data(), l, g);
        }),
        tree_phases(g.ty, [&](const Thread& t, C* sh, unsigned h) {
          region_step(t, sh, g, 1, h, SumOp{});
          if (from_logits) region_step(t, sh, g, 2, h, SumOp{});
        }),
        phase([&](const Thread& t, C* sh) {
          xent_grad_write(t, sh, x.data(), l, from_logits, dloss.data(), dtype_of_storage<L>(), dgot.data(), g);
        }));
  });
  for (std::int64_t r = 0; r < rows; ++r) {
    double tsum = 0, psum = 0, dqsum = 0, rowmax = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      tsum += std::abs(l.sparse ? (i == 0) : t64[r * n + i]);
      psum += as_double(x[r * n + i]);
      rowmax = std::max(rowmax, std::abs(as_double(dexpect[r * n + i])));
    }
    for (std::int64_t i = 0; i < n; ++i)
      dqsum += std::abs(l.sparse ? 1.0 : t64[r * n + i]) * psum / std::max(1e-7, as_double(x[r * n + i]));
    // Logits: dx = g (softmax * sum(t) - t); probabilities: dx = g (dq - dot) / s, the row sums
    // (s, dot, max, sum-exp, sum(t)) each off by about n eps of their terms.
    const double scale = as_double(dloss[r]) * (from_logits ? (1 + tsum) : (1 + tsum + dqsum / n) / psum);
    for (std::int64_t i = 0; i < n; ++i) {
      const double e = as_double(dexpect[r * n + i]), a = as_double(dgot[r * n + i]);
      const double tol = k * (std::abs(e) + scale + rowmax) + out_ulp<T>() * std::abs(e) + (out_ulp<T>() ? 1e-7 : 0);
      if (!close(a, e, tol)) {
        FAIL_CHECK("cross_entropy_backward ", what, " at ", r, ",", i, ": ", a, " vs ", e);
        return;
      }
    }
  }
}

TEST_CASE("cuda cross-entropy from logits and probabilities, every label kind, matches the CPU") {
  const std::int64_t before = g_compared;
  for (std::int64_t n : {1, 7, 1000, 1025})
    for (std::int64_t rows : {1, 5})
      for (unsigned threads : {256u, 32u})
        for (bool from_logits : {true, false})
          for (int label_kind = 0; label_kind < 6; ++label_kind) {
            check_cross_entropy<float>(rows, n, threads, from_logits, label_kind);
            check_cross_entropy<double>(rows, n, threads, from_logits, label_kind);
            check_cross_entropy<__half>(rows, n, threads, from_logits, label_kind);
            check_cross_entropy<__nv_bfloat16>(rows, n, threads, from_logits, label_kind);
          }
  const std::string compared = std::to_string(g_compared - before) + " values compared";
  MESSAGE(compared);
  CHECK(g_compared - before > 1000);
}

// ---- gather_rows and pad ----------------------------------------------------------------------

template <class W>
void check_gather_words(const std::vector<std::uint8_t>& x, std::size_t row, const Vec<std::int64_t>& idx,
                        const std::vector<std::uint8_t>& expect) {
  if (row % sizeof(W) != 0) return;
  const auto row_words = static_cast<std::int64_t>(row / sizeof(W));
  std::vector<W> xs(x.size() / sizeof(W)), out(idx.size() * static_cast<std::size_t>(row_words));
  std::memcpy(xs.data(), x.data(), x.size());
  emulate(Dim{3, 1, 1}, Dim{32, 1, 1}, [&](const Thread& t) {
    gather_rows_body(t, xs.data(), idx.data(), out.data(), static_cast<std::int64_t>(idx.size()), row_words,
                     static_cast<std::int64_t>(x.size() / row));
  });
  INFO("gather_rows word ", sizeof(W), " row bytes ", row);
  CHECK(std::memcmp(out.data(), expect.data(), expect.size()) == 0);
}

TEST_CASE("cuda gather_rows copies the CPU's rows bit for bit, every word size") {
  struct G {
    DType d;
    Shape s;
  };
  for (const G& gcase : {G{float32, {50, 5}}, G{float16, {40, 3}}, G{uint8, {30, 7}}, G{float64, {20, 2}},
                         G{bfloat16, {33, 4, 2}}, G{int64, {9, 1}}, G{float32, {1025, 1}}}) {
    const std::int64_t rows = gcase.s[0];
    Tensor x = Tensor::empty(gcase.s, gcase.d, Device::cpu());
    std::mt19937 rng(1);
    auto* xb = static_cast<std::uint8_t*>(x.data_ptr());
    for (std::size_t i = 0; i < x.nbytes(); ++i) xb[i] = static_cast<std::uint8_t>(rng());
    Vec<std::int64_t> idx;
    for (int k = 0; k < 1000; ++k) idx.push_back(static_cast<std::int64_t>(rng() % static_cast<unsigned>(rows)));
    Tensor it = host_tensor(idx, {static_cast<std::int64_t>(idx.size())});
    Shape os = gcase.s;
    os[0] = static_cast<std::int64_t>(idx.size());
    Tensor ref = Tensor::empty(os, gcase.d, Device::cpu());
    cpu().gather_rows(x, it, ref);
    const std::vector<std::uint8_t> xv(xb, xb + x.nbytes());
    const auto* rb = static_cast<const std::uint8_t*>(ref.data_ptr());
    const std::vector<std::uint8_t> expect(rb, rb + ref.nbytes());
    const std::size_t row = x.nbytes() / static_cast<std::size_t>(rows);
    check_gather_words<std::uint8_t>(xv, row, idx, expect);
    check_gather_words<std::uint16_t>(xv, row, idx, expect);
    check_gather_words<std::uint32_t>(xv, row, idx, expect);
    check_gather_words<std::uint64_t>(xv, row, idx, expect);
    check_gather_words<uint4>(xv, row, idx, expect);
  }
}

TEST_CASE("cuda gather_rows gives zero rows for indices outside x, never reading outside it") {
  // 4 rows of 2 floats, after them a guard row the body must never copy.
  std::vector<float> x{1, 2, 3, 4, 5, 6, 7, 8, 99, 99};
  const Vec<std::int64_t> idx{2, -1, 4, std::int64_t{1} << 40, 0, -(std::int64_t{1} << 62), 3};
  std::vector<float> out(idx.size() * 2, -1.0f);
  emulate(Dim{2, 1, 1}, Dim{4, 1, 1}, [&](const Thread& t) {
    gather_rows_body(t, x.data(), idx.data(), out.data(), static_cast<std::int64_t>(idx.size()), 2, 4);
  });
  CHECK(out == std::vector<float>{5, 6, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 7, 8});
}

/// The scatter-add body against the CPU's scatter_add_rows, bit for bit: src of storage type S,
/// accumulated in C, with repeated ids, on a grid smaller and larger than the columns.
template <class S, class C>
void check_scatter_add(std::int64_t rows, std::int64_t width, std::int64_t count) {
  std::mt19937 rng(5);
  Tensor src = Tensor::random_uniform({count, width}, -2, 2, 3, float32, Device::cpu()).to(dtype_of_storage<S>());
  Vec<std::int64_t> idx;
  for (std::int64_t k = 0; k < count; ++k) idx.push_back(static_cast<std::int64_t>(rng() % static_cast<unsigned>(rows)));
  Tensor it = host_tensor(idx, {count});
  Tensor start = Tensor::random_uniform({rows, width}, -1, 1, 4, dtype_of_storage<C>(), Device::cpu());
  Tensor want = start.copy();
  cpu().scatter_add_rows(src, it, want);
  const Vec<S> sv = tensor_values<S>(src);
  for (unsigned grid : {1u, 3u})
    for (unsigned block : {7u, 64u}) {
      Vec<C> got = tensor_values<C>(start);
      emulate(Dim{grid, 1, 1}, Dim{block, 1, 1}, [&](const Thread& t) {
        scatter_add_rows_body(t, sv.data(), idx.data(), got.data(), count, width);
      });
      INFO("scatter_add_rows ", to_string(dtype_of_storage<S>()), " -> ", to_string(dtype_of_storage<C>()), " width ",
           width, " grid ", grid, " block ", block);
      CHECK(std::memcmp(got.data(), want.data_ptr(), want.nbytes()) == 0);
    }
}

TEST_CASE("cuda scatter_add_rows adds the CPU's rows in the CPU's order, bit for bit") {
  check_scatter_add<float, float>(7, 5, 40);
  check_scatter_add<__nv_bfloat16, float>(11, 130, 300);
  check_scatter_add<__half, float>(3, 1, 17);
  check_scatter_add<double, double>(9, 33, 64);
}

template <class W>
void check_pad(const Shape& xs, const std::vector<std::int64_t>& offset, const Shape& os) {
  const DType d = sizeof(W) == 1 ? uint8 : sizeof(W) == 2 ? bfloat16 : sizeof(W) == 4 ? float32 : float64;
  Tensor x = Tensor::empty(xs, d, Device::cpu());
  std::mt19937 rng(3);
  auto* xb = static_cast<std::uint8_t*>(x.data_ptr());
  for (std::size_t i = 0; i < x.nbytes(); ++i) xb[i] = static_cast<std::uint8_t>(rng() | 1);  // no zero bytes
  Tensor ref = Tensor::empty(os, d, Device::cpu());
  cpu().pad(x, offset, ref);
  PadGeom g;
  g.nd = static_cast<int>(os.size());
  for (int k = 0; k < g.nd; ++k) g.out_shape[k] = os[k], g.in_shape[k] = xs[k], g.offset[k] = offset[k];
  std::vector<W> got(static_cast<std::size_t>(ref.numel()), W(0x5a));
  emulate(Dim{3, 1, 1}, Dim{32, 1, 1},
          [&](const Thread& t) { pad_body(t, static_cast<const W*>(x.data_ptr()), got.data(), ref.numel(), g); });
  INFO("pad ", to_string(xs), " -> ", to_string(os), " word ", sizeof(W));
  CHECK(std::memcmp(got.data(), ref.data_ptr(), ref.nbytes()) == 0);
}

TEST_CASE("cuda pad pads and crops as the CPU, bit for bit") {
  auto all = [](const Shape& xs, const std::vector<std::int64_t>& off, const Shape& os) {
    check_pad<std::uint8_t>(xs, off, os);
    check_pad<std::uint16_t>(xs, off, os);
    check_pad<std::uint32_t>(xs, off, os);
    check_pad<std::uint64_t>(xs, off, os);
  };
  all({2, 5, 7, 3}, {0, 1, 2, 0}, {2, 8, 10, 3});     // conv 'same' padding
  all({2, 8, 10, 3}, {0, -1, -2, 0}, {2, 5, 7, 3});   // its gradient crops
  all({3, 9, 11, 2}, {0, -2, 3, 0}, {3, 6, 13, 2});   // crop one axis, pad another
  all({4, 7}, {1, -3}, {7, 9});                       // shifted both ways
  all({4, 7}, {9, 0}, {5, 7});                        // entirely outside: zeros
  all({1025}, {-1}, {1000});
  all({}, {}, {});                                    // rank 0
}

// ---- random -----------------------------------------------------------------------------------

template <class T>
void check_random(Backend::Distribution dist, std::int64_t n, std::uint64_t seed, std::uint64_t offset) {
  const double a = dist == Backend::Distribution::Normal ? 0.5 : -3.0;
  const double b = dist == Backend::Distribution::Normal ? 2.0 : 5.0;
  Tensor ref = Tensor::empty({n}, dtype_of_storage<T>(), Device::cpu());
  cpu().random(dist, a, b, seed, offset, ref);
  Vec<T> got(static_cast<std::size_t>(n));
  emulate(Dim{3, 1, 1}, Dim{32, 1, 1}, [&](const Thread& t) {
    random_body(t, got.data(), n, dist == Backend::Distribution::Normal, a, b, seed, offset);
  });
  INFO("random ", (dist == Backend::Distribution::Normal ? "normal " : "uniform "), to_string(dtype_of_storage<T>()),
       " n ", n, " seed ", seed, " offset ", offset);
  CHECK(std::memcmp(got.data(), ref.data_ptr(), ref.nbytes()) == 0);
}

TEST_CASE("cuda random gives the CPU's Philox bits in every dtype") {
  for (auto dist : {Backend::Distribution::Uniform, Backend::Distribution::Normal})
    for (std::int64_t n : {1, 7, 1000, 1025})
      for (auto [seed, offset] : {std::pair<std::uint64_t, std::uint64_t>{42, 7}, {0x123456789abcull, 0xfeedface12ull}}) {
        check_random<float>(dist, n, seed, offset);
        check_random<double>(dist, n, seed, offset);
        check_random<__half>(dist, n, seed, offset);
        check_random<__nv_bfloat16>(dist, n, seed, offset);
        check_random<std::int32_t>(dist, n, seed, offset);
      }
  // Many 16-bit values where rounding twice (double -> float -> half) would differ.
  check_random<__half>(Backend::Distribution::Uniform, 100000, 9, 0);
  check_random<__nv_bfloat16>(Backend::Distribution::Normal, 100000, 9, 0);
}

}  // namespace

/// The resampling body against the CPU's affine_transform, bit for bit: storage type T, every
/// interpolation and fill mode, projective rows, an output size other than the input's.
template <class T>
void check_affine(common::Interpolation interp, common::FillMode mode) {
  using C = compute_t<T>;
  const Shape is{2, 5, 6, 3}, os{2, 4, 7, 3};
  Tensor x = Tensor::random_uniform(is, -2, 2, 9, float32, Device::cpu()).to(dtype_of_storage<T>());
  const DType cd = std::is_same_v<T, double> ? float64 : float32;
  Tensor t = Tensor::from_vector(std::vector<double>{0.9, -0.3, 1.2, 0.25, 1.1, -0.8, 0.03, -0.02,  //
                                                     1.3, 0.0, -1.7, 0.0, 0.7, 0.9, 0.0, 0.0},
                                 {2, 8}, Device::cpu())
                 .to(cd);
  const common::ImageTransform how{interp, mode, -0.75};
  Tensor want = Tensor::empty(os, x.dtype(), Device::cpu());
  cpu().affine_transform(x, t, how, want);
  const Vec<T> xv = tensor_values<T>(x);
  const Vec<C> tv = tensor_values<C>(t);
  Vec<T> got(static_cast<std::size_t>(want.numel()));
  const ImageGeom g{is[0], is[1], is[2], is[3], os[1], os[2]};
  emulate(Dim{3, 1, 1}, Dim{16, 1, 1}, [&](const Thread& th) {
    affine_transform_body<T, C>(th, xv.data(), tv.data(), got.data(), g, interp, mode, C(-0.75));
  });
  INFO("affine_transform ", to_string(x.dtype()), " interpolation ", static_cast<int>(interp), " fill ",
       static_cast<int>(mode));
  CHECK(std::memcmp(static_cast<const void*>(got.data()), want.data_ptr(), want.nbytes()) == 0);
}

TEST_CASE("cuda affine_transform resamples as the CPU, bit for bit") {
  using common::FillMode;
  for (auto interp : {common::Interpolation::Bilinear, common::Interpolation::Nearest})
    for (auto mode : {FillMode::Constant, FillMode::Nearest, FillMode::Wrap, FillMode::Mirror, FillMode::Reflect}) {
      check_affine<float>(interp, mode);
      check_affine<double>(interp, mode);
      check_affine<__half>(interp, mode);
      check_affine<__nv_bfloat16>(interp, mode);
    }
}
