// The CUDA elementwise and transpose kernels run on the host (kernels/elementwise.hpp and
// kernels/transpose.hpp through emulate / emulate_phases, 3 blocks of 32 threads so the
// grid-stride loops wrap) on arrays of the storage types, against the CPU backend on the same
// inputs, bit for bit: every op in every dtype the CPU takes, sizes 1, 7, 1000, 1025, broadcast
// shapes and scalars, NaN (quiet and signalling, both signs), inf, subnormals and out-of-range
// values. The host runs libm's exp/log/tanh/erf/pow where the device runs CUDA's (a few ulp
// apart, see kernels/elementwise.hpp); every other operation is the same on both, so the bits
// must be equal here.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>

#include "backend/backend.hpp"
#include "backend/cuda/kernels/elementwise.hpp"
#include "backend/cuda/kernels/transpose.hpp"
#include "kernel_test_util.hpp"

using namespace mpt;
using namespace mpt::kernels;
using namespace mpt::test;

namespace {

constexpr Dim kGrid{3, 1, 1}, kBlock{32, 1, 1};  // 96 threads: loops over 1000 elements wrap
const std::int64_t kSizes[] = {1, 7, 1000, 1025};
constexpr double kInf = std::numeric_limits<double>::infinity(), kNan = std::numeric_limits<double>::quiet_NaN();

template <class F> void for_float_types(F&& f) {
  f(Type<float>{}), f(Type<double>{}), f(Type<__half>{}), f(Type<__nv_bfloat16>{});
}
template <class F> void for_all_types(F&& f) {
  for_float_types(f);
  f(Type<std::int32_t>{}), f(Type<std::int64_t>{}), f(Type<std::uint8_t>{}), f(Type<bool>{});
}

template <class T> T from_bits(std::uint64_t b) {
  T v;
  std::memcpy(static_cast<void*>(&v), &b, sizeof v);  // little endian: the low bytes
  return v;
}
std::uint64_t bits_at(const void* p, std::size_t size) {
  std::uint64_t b = 0;
  std::memcpy(&b, p, size);
  return b;
}

/// True when the bits of a T are a NaN.
template <class T>
bool is_nan_bits(const unsigned char* p) {
  if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
    T v;
    std::memcpy(static_cast<void*>(&v), p, sizeof v);
    return nonfinite_bits(v) && std::isnan(static_cast<double>(load(v)));
  } else {
    return false;
  }
}

/// Counts the elements whose bits differ; reports the first. With nan_any, a NaN matches any
/// NaN: for ops where two NaNs can meet in one operation, the one whose sign and payload
/// survive is the compiler's choice (it may swap the operands of a commutative op), and the
/// GPU gives a canonical NaN anyway.
template <class T>
void expect_bits(const Vec<T>& got, const Tensor& want, const std::string& what, bool nan_any = false) {
  REQUIRE_MESSAGE(want.nbytes() == got.size() * sizeof(T), what, ": ", want.nbytes(), " bytes vs ",
                  got.size() * sizeof(T));
  const auto* w = static_cast<const unsigned char*>(want.data_ptr());
  const auto* g = reinterpret_cast<const unsigned char*>(got.data());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(g + i * sizeof(T), w + i * sizeof(T), sizeof(T)) != 0 &&
        !(nan_any && is_nan_bits<T>(g + i * sizeof(T)) && is_nan_bits<T>(w + i * sizeof(T))) && bad++ == 0)
      first = i;
  char buf[128] = "";
  if (bad)
    std::snprintf(buf, sizeof buf, " differ, first at %zu: got 0x%" PRIx64 ", CPU 0x%" PRIx64, first,
                  bits_at(g + first * sizeof(T), sizeof(T)), bits_at(w + first * sizeof(T), sizeof(T)));
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", got.size(), buf);
}

/// Special values of T: zeros, NaNs (quiet and signalling, both signs, with payloads), infs,
/// subnormals, 16-bit overflow and rounding ties, int-range edges. With `extreme`, also
/// values outside every integer range (for casts).
template <class T>
std::vector<T> specials(bool extreme) {
  std::vector<T> s;
  if constexpr (std::is_same_v<T, bool>) {
    s = {false, true};
  } else if constexpr (std::is_integral_v<T>) {
    for (double d : {0.0, 1.0, -1.0, 2.0, -7.0, 127.0, 128.0, 255.0, 256.0, -128.0, -129.0})
      s.push_back(static_cast<T>(static_cast<std::int64_t>(d)));
    if (extreme) {
      if constexpr (sizeof(T) >= 4) s.push_back(std::numeric_limits<T>::max()), s.push_back(std::numeric_limits<T>::min());
      if constexpr (sizeof(T) == 8)
        for (std::int64_t v : {std::int64_t{1} << 40, -(std::int64_t{1} << 40), (std::int64_t{1} << 53) + 1, std::int64_t{3000000000}})
          s.push_back(v);
    }
  } else {
    for (double d : {0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-3, 100.0, -100.0, 65504.0, 65519.0, 65520.0, 1e5, 1e-8,
                     1e-40, 3e38, 1.0 + 0x1p-11, 1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-8, 1.0 + 0x1p-8 + 0x1p-40,
                     kInf, -kInf, kNan, -kNan})
      s.push_back(convert_value<T>(d));
    if (extreme)
      for (double d : {300.7, -1.5, 255.5, 256.0, -0.5, 3e9, -3e9, 2147483647.9, -2147483648.9, 1e19, -1e19, 1e300})
        s.push_back(convert_value<T>(d));
    if constexpr (std::is_same_v<T, __half>)
      s.push_back(from_bits<T>(0x7c01)), s.push_back(from_bits<T>(0xfd55)), s.push_back(from_bits<T>(0x0001));
    else if constexpr (std::is_same_v<T, __nv_bfloat16>)
      s.push_back(from_bits<T>(0x7f81)), s.push_back(from_bits<T>(0xff95)), s.push_back(from_bits<T>(0x0001));
    else if constexpr (std::is_same_v<T, float>)
      s.push_back(from_bits<T>(0x7f800001)), s.push_back(from_bits<T>(0xffa00005)), s.push_back(from_bits<T>(0x7fc12345));
    else
      s.push_back(from_bits<T>(0x7ff0000000000001)), s.push_back(from_bits<T>(0xfff4000000000005)),
          s.push_back(from_bits<T>(0x7ff8123456789abc));
  }
  return s;
}

/// n values of T: the specials first (when asked), then uniform in [lo, hi] (integers floored).
template <class T>
Vec<T> values(std::int64_t n, unsigned seed, double lo, double hi, bool with_specials = true, bool extreme = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Vec<T> v(static_cast<std::size_t>(n));
  const std::vector<T> s = with_specials ? specials<T>(extreme) : std::vector<T>{};
  for (std::size_t i = 0; i < v.size(); ++i) {
    T e;
    if (i < s.size()) e = s[i];
    else if constexpr (std::is_same_v<T, bool>) e = u(rng) > 0.5 * (lo + hi);
    else if constexpr (std::is_integral_v<T>) e = static_cast<T>(static_cast<std::int64_t>(std::floor(u(rng))));
    else e = convert_value<T>(u(rng));
    std::memcpy(static_cast<void*>(v.data() + i), static_cast<const void*>(&e), sizeof(T));
  }
  return v;
}

template <class T> T signalling_nan() {
  if constexpr (std::is_same_v<T, __half>) return from_bits<T>(0x7c01);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return from_bits<T>(0x7f81);
  else if constexpr (std::is_same_v<T, float>) return from_bits<T>(0x7f800001);
  else return from_bits<T>(0x7ff0000000000001);
}

template <class T> std::string name() { return to_string(dtype_of_storage<T>()); }

// ---- fill, arange, cast -----------------------------------------------------------------------

TEST_CASE("cuda elementwise: fill matches the CPU in every dtype") {
  for_all_types([](auto tag) {
    using T = typename decltype(tag)::type;
    for (double value : {0.0, -0.0, 1.0, -2.5, 0.5, 1.0 / 3.0, 65520.0, 1e10, -1e10, 300.0, 1.0 + 0x1p-11 + 0x1p-40,
                         kInf, -kInf, kNan}) {
      Tensor want = Tensor::empty({1025}, dtype_of_storage<T>(), Device::cpu());
      cpu().fill(want, value);
      Vec<T> got(1025);
      const T v = fill_value<T>(value);
      emulate(kGrid, kBlock, [&](const Thread& t) { fill_body(t, got.data(), v, 1025); });
      expect_bits(got, want, "fill " + name<T>() + " " + std::to_string(value));
    }
  });
}

TEST_CASE("cuda elementwise: arange matches the CPU in every dtype") {
  for_all_types([](auto tag) {
    using T = typename decltype(tag)::type;
    for (std::int64_t n : kSizes)
      for (auto [start, step] : {std::pair{0.0, 1.0}, {-3.5, 0.25}, {1000.0, 0.1}, {0.1, 1.0 / 3.0}, {5.0, -1.0}}) {
        Tensor want = Tensor::empty({n}, dtype_of_storage<T>(), Device::cpu());
        cpu().arange(want, start, step);
        Vec<T> got(static_cast<std::size_t>(n));
        emulate(kGrid, kBlock, [&](const Thread& t) { arange_body(t, got.data(), start, step, n); });
        expect_bits(got, want, "arange " + name<T>() + " n=" + std::to_string(n) + " start=" + std::to_string(start));
      }
  });
}

TEST_CASE("cuda elementwise: cast matches detail::convert for every pair, NaN, inf and out of range") {
  for_all_types([](auto st) {
    using S = typename decltype(st)::type;
    for_all_types([](auto dt) {
      using D = typename decltype(dt)::type;
      for (std::int64_t n : kSizes) {
        const Vec<S> x = values<S>(n, 11, -400, 400, true, true);
        Tensor xt = host_tensor(x, {n});
        Tensor want = Tensor::empty({n}, dtype_of_storage<D>(), Device::cpu());
        cpu().cast(xt, want);
        Vec<D> got(static_cast<std::size_t>(n));
        emulate(kGrid, kBlock, [&](const Thread& t) { cast_body(t, x.data(), got.data(), n); });
        expect_bits(got, want, "cast " + name<S>() + " -> " + name<D>() + " n=" + std::to_string(n));
      }
    });
  });
}

// ---- unary ----------------------------------------------------------------------------------------

using common::for_each_unary_op;
constexpr double kParam = 0.3;  // LeakyReLU's slope, not its default; the other ops ignore it

TEST_CASE("cuda elementwise: unary matches the CPU for every op and dtype, NaN and inf included") {
  auto run = [](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_unary_op([](auto opc) {
      constexpr UnaryOp Op = decltype(opc)::value;
      if constexpr (std::is_floating_point_v<compute_t<T>> || unary_on_integers(Op)) {
        for (std::int64_t n : kSizes) {
          const Vec<T> x = values<T>(n, 3 + n, -6, 6);
          Tensor xt = host_tensor(x, {n});
          Tensor want = Tensor::empty({n}, dtype_of_storage<T>(), Device::cpu());
          cpu().unary(Op, xt, want, kParam);
          Vec<T> got(static_cast<std::size_t>(n));
          emulate(kGrid, kBlock, [&](const Thread& t) { unary_body<Op>(t, x.data(), got.data(), n, kParam); });
          // Exact NaNs for the ops that only move or negate them (relu included).
          constexpr bool exact_nan = unary_on_integers(Op);
          expect_bits(got, want, std::string("unary ") + common::unary_name(Op) + " " + name<T>() + " n=" + std::to_string(n),
                      !exact_nan);
        }
      }
    });
  };
  for_float_types(run);
  run(Type<std::int32_t>{}), run(Type<std::int64_t>{});
}

TEST_CASE("cuda elementwise: unary_backward matches the CPU for every op and float dtype") {
  for_float_types([](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_unary_op([](auto opc) {
      constexpr UnaryOp Op = decltype(opc)::value;
      for (std::int64_t n : kSizes) {
        // x with NaN/inf/signalling NaNs first; dy with its own specials, in another order.
        const Vec<T> x = values<T>(n, 5 + n, -6, 6);
        Vec<T> dy = values<T>(n, 7 + n, -3, 3);
        std::reverse(dy.begin(), dy.end());
        Tensor xt = host_tensor(x, {n}), dyt = host_tensor(dy, {n});
        Tensor yt = Tensor::empty({n}, dtype_of_storage<T>(), Device::cpu());
        cpu().unary(Op, xt, yt, kParam);
        const Vec<T> y = tensor_values<T>(yt);
        Tensor want = Tensor::empty({n}, dtype_of_storage<T>(), Device::cpu());
        cpu().unary_backward(Op, xt, yt, dyt, want, kParam);
        Vec<T> got(static_cast<std::size_t>(n));
        emulate(kGrid, kBlock, [&](const Thread& t) {
          unary_backward_body<Op>(t, x.data(), y.data(), dy.data(), got.data(), n, kParam);
        });
        constexpr bool exact_nan = Op == UnaryOp::Relu || Op == UnaryOp::Neg || Op == UnaryOp::Sign;
        expect_bits(got, want, std::string("unary_backward ") + common::unary_name(Op) + " " + name<T>() + " n=" +
                                   std::to_string(n), !exact_nan);
      }
    });
  });
}

// ---- binary, where --------------------------------------------------------------------------------

/// Shape pairs: equal, broadcast both ways, scalars, size-1 axes everywhere.
std::vector<std::pair<Shape, Shape>> shape_pairs() {
  std::vector<std::pair<Shape, Shape>> p;
  for (std::int64_t n : kSizes) p.push_back({{n}, {n}});
  p.push_back({{3, 1, 5}, {4, 5}});
  p.push_back({{4, 5}, {3, 1, 5}});
  p.push_back({{}, {2, 3, 7}});
  p.push_back({{2, 3, 7}, {}});
  p.push_back({{1025}, {1}});
  p.push_back({{2, 1, 7}, {1, 3, 1}});
  p.push_back({{5, 1, 3, 1, 2}, {3, 4, 1}});
  // Not {} with {}: CpuBackend::binary crashes in BroadcastPlan's constructor on a rank-0 output
  // (seen here: a write to a garbage address), so there is no reference to compare with.
  p.push_back({{1}, {}});
  p.push_back({{7, 1}, {1, 150}});
  return p;
}

using common::for_each_binary_op;

template <BinaryOp Op, class T>
void check_binary(const Shape& sa, const Shape& sb) {
  using O = std::conditional_t<is_comparison(Op), bool, T>;
  const Shape so = broadcast_shape(sa, sb);
  const std::int64_t na = numel_of(sa), nb = numel_of(sb);
  // Integer Pow: small bases and exponents (negative ones give 0 or, for 0, INT64_MIN via inf).
  const bool ipow = Op == BinaryOp::Pow && std::is_integral_v<T>;
  const Vec<T> a = values<T>(na, 17 + na, ipow ? -6 : -9, ipow ? 6 : 9);
  const Vec<T> b = values<T>(nb, 19 + nb, ipow ? -2 : -9, ipow ? 6 : 9);
  Tensor at = host_tensor(a, sa), bt = host_tensor(b, sb);
  Tensor want = Tensor::empty(so, dtype_of_storage<O>(), Device::cpu());
  cpu().binary(Op, at, bt, want);
  const BroadcastGeom<2> g = make_broadcast<2>(so, {&sa, &sb});
  Vec<O> got(static_cast<std::size_t>(numel_of(so)));
  emulate(kGrid, kBlock, [&](const Thread& t) { binary_body<Op>(t, a.data(), b.data(), got.data(), g); });
  expect_bits(got, want, std::string("binary ") + common::binary_name(Op) + " " + name<T>() + " " + to_string(sa) +
                             " " + to_string(sb) + (g.contiguous ? " (contiguous)" : ""),
              Op < BinaryOp::Maximum);  // arithmetic may meet two NaNs; selections are exact
}

TEST_CASE("cuda elementwise: binary matches the CPU for every op, dtype and broadcast") {
  auto run = [](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_binary_op([](auto opc) {
      for (const auto& [sa, sb] : shape_pairs()) check_binary<decltype(opc)::value, T>(sa, sb);
    });
  };
  for_float_types(run);
  run(Type<std::int32_t>{}), run(Type<std::int64_t>{});
  // broadcast_to adds a zero scalar in any dtype, bool and uint8 included.
  for (const auto& [sa, sb] : shape_pairs()) {
    check_binary<BinaryOp::Add, std::uint8_t>(sa, sb);
    check_binary<BinaryOp::Add, bool>(sa, sb);
  }
}

TEST_CASE("cuda elementwise: the broadcast geometry merges axes and keeps the equal-shape fast path") {
  const Shape a{3, 4, 5}, b{3, 4, 5}, c{3, 1, 5}, s{};
  const BroadcastGeom<2> same = make_broadcast<2>(a, {&a, &b});
  CHECK(same.contiguous);
  CHECK(same.nd == 1);
  const BroadcastGeom<2> bc = make_broadcast<2>(a, {&a, &c});
  CHECK_FALSE(bc.contiguous);
  CHECK(bc.nd == 3);
  const BroadcastGeom<2> sc = make_broadcast<2>(a, {&a, &s});
  CHECK(sc.nd == 1);
  CHECK(sc.strides[1][0] == 0);
}

TEST_CASE("cuda elementwise: where matches the CPU in every dtype and broadcast") {
  for_all_types([](auto tag) {
    using T = typename decltype(tag)::type;
    const std::vector<std::array<Shape, 3>> cases = {
        {Shape{1025}, Shape{1025}, Shape{1025}}, {Shape{7}, Shape{7}, Shape{}},     {Shape{3, 1, 5}, Shape{4, 5}, Shape{}},
        {Shape{}, Shape{3, 1, 5}, Shape{4, 1}},   {Shape{4, 5}, Shape{1}, Shape{3, 4, 5}}, {Shape{1}, Shape{1000}, Shape{1000}}};
    for (const auto& [sc, sa, sb] : cases) {
      const Shape so = broadcast_shape(broadcast_shape(sc, sa), sb);
      const Vec<bool> cond = values<bool>(numel_of(sc), 23, 0, 1, false);
      const Vec<T> a = values<T>(numel_of(sa), 29, -9, 9), b = values<T>(numel_of(sb), 31, -9, 9, false);
      Tensor ct = host_tensor(cond, sc), at = host_tensor(a, sa), bt = host_tensor(b, sb);
      Tensor want = Tensor::empty(so, dtype_of_storage<T>(), Device::cpu());
      cpu().where(ct, at, bt, want);
      const BroadcastGeom<3> g = make_broadcast<3>(so, {&sc, &sa, &sb});
      Vec<T> got(static_cast<std::size_t>(numel_of(so)));
      const auto* cp = reinterpret_cast<const std::uint8_t*>(cond.data());
      emulate(kGrid, kBlock, [&](const Thread& t) { where_body(t, cp, a.data(), b.data(), got.data(), g); });
      expect_bits(got, want, "where " + name<T>() + " " + to_string(sc) + " " + to_string(sa) + " " + to_string(sb));
    }
  });
}

// ---- has_nonfinite, one_hot ------------------------------------------------------------------------

TEST_CASE("cuda elementwise: has_nonfinite finds NaN and inf anywhere, as the CPU") {
  for_float_types([](auto tag) {
    using T = typename decltype(tag)::type;
    const std::vector<T> bad = {convert_value<T>(kNan), convert_value<T>(-kNan), convert_value<T>(kInf),
                                convert_value<T>(-kInf), signalling_nan<T>()};
    for (std::int64_t n : kSizes)
      for (int where = -1; where < 3; ++where)
        for (const T& v : bad) {
          Vec<T> x = values<T>(n, 37, -70000, 70000, false);  // 16-bit: large but finite
          for (auto& e : x)
            if (nonfinite_bits(e)) e = convert_value<T>(1.0);  // bfloat16 holds 70000; float16 overflows
          if (where >= 0) x[static_cast<std::size_t>(where == 0 ? 0 : where == 1 ? n - 1 : n / 2)] = v;
          Tensor xt = host_tensor(x, {n});
          const bool want = cpu().has_nonfinite(xt);
          CHECK(want == (where >= 0));
          unsigned flag = 0;
          emulate(kGrid, kBlock, [&](const Thread& t) { nonfinite_body(t, x.data(), n, &flag); });
          CHECK_MESSAGE((flag != 0) == want, "has_nonfinite ", name<T>(), " n=", n, " at ", where);
        }
  });
}

TEST_CASE("cuda elementwise: one_hot matches the CPU for every index and output dtype") {
  auto run = [](auto it) {
    using I = typename decltype(it)::type;
    for_all_types([](auto ot) {
      using O = typename decltype(ot)::type;
      for (std::int64_t depth : {1, 5, 33})
        for (std::int64_t n : {1, 7, 100}) {
          const Vec<I> idx = values<I>(n, 41 + depth, -2, static_cast<double>(depth + 2), false);
          Tensor it_t = host_tensor(idx, {n});
          Tensor want = Tensor::empty({n, depth}, dtype_of_storage<O>(), Device::cpu());
          cpu().one_hot(it_t, want);
          Vec<O> got(static_cast<std::size_t>(n * depth));
          const O one = convert_value<O>(1.0), zero = fill_value<O>(0.0);
          emulate(kGrid, kBlock, [&](const Thread& t) { one_hot_body(t, idx.data(), got.data(), n * depth, depth, one, zero); });
          expect_bits(got, want, "one_hot " + name<I>() + " -> " + name<O>() + " depth=" + std::to_string(depth));
        }
    });
  };
  run(Type<std::int32_t>{}), run(Type<std::int64_t>{}), run(Type<std::uint8_t>{});
}

// ---- transpose --------------------------------------------------------------------------------------

/// The device's transpose on the host: the simplified plan, then a copy, the general kernel, and
/// (where the plan allows, at any size) the tiled kernel, in batches of at most 2 matrices per
/// launch so batch_base is exercised. Returns how many kernels ran.
template <class W>
int check_transpose(const Shape& s, const std::vector<std::int64_t>& perm, DType dtype) {
  const std::int64_t n = numel_of(s);
  Vec<W> x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) x[i] = static_cast<W>(i * 2654435761u + 7);
  Tensor xt = Tensor::from_host(x.data(), x.size(), dtype, s, Device::cpu());
  Shape so(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) so[i] = s[perm[i]];
  Tensor want = Tensor::empty(so, dtype, Device::cpu());
  cpu().transpose(xt, perm, want);
  const std::string what = "transpose " + to_string(s) + " perm " + to_string(perm) + " " + to_string(dtype);
  const TransposePlan plan = simplify_transpose(s, perm);
  bool identity = true;
  for (std::size_t i = 0; i < plan.perm.size(); ++i) identity = identity && plan.perm[i] == static_cast<std::int64_t>(i);
  if (identity) {
    expect_bits(x, want, what + " (copy)");
    return 1;
  }
  const TransposeGeom g = transpose_geom(plan);
  Vec<W> got(static_cast<std::size_t>(n));
  emulate(kGrid, kBlock, [&](const Thread& t) { transpose_body(t, x.data(), got.data(), g); });
  expect_bits(got, want, what + " (general)");
  TileGeom tg;
  if (!tile_geom(plan, tg)) return 1;
  Vec<W> tiled(static_cast<std::size_t>(n));
  for (std::int64_t base = 0; base < tg.batch; base += 2) {
    tg.batch_base = base;
    const Dim grid{static_cast<unsigned>(tg.tiles_r() * tg.tiles_c()), static_cast<unsigned>(std::min<std::int64_t>(2, tg.batch - base)), 1};
    emulate_phases<W>(grid, kTileThreads, kTileShared,
                      [&](const Thread& t, W* sh) { transpose_tile_load(t, sh, x.data(), tg); },
                      [&](const Thread& t, W* sh) { transpose_tile_store(t, sh, tiled.data(), tg); });
  }
  expect_bits(tiled, want, what + " (tiled)");
  return 2;
}

TEST_CASE("cuda transpose: every permutation, tiled and general, matches the CPU") {
  struct Case {
    Shape s;
    std::vector<std::int64_t> perm;
  };
  std::vector<Case> cases = {{{7, 5}, {1, 0}},          {{37, 70}, {1, 0}},          {{1, 1025}, {1, 0}},
                             {{3, 33, 65}, {0, 2, 1}},  {{5, 2, 40}, {0, 2, 1}},     {{4, 1, 6}, {2, 1, 0}},
                             {{1, 5, 1, 3}, {3, 2, 1, 0}}, {{1, 5, 1, 3}, {0, 2, 1, 3}}, {{1}, {0}},
                             {{6, 7, 1}, {0, 2, 1}},     {{2, 3, 4, 5, 6}, {0, 1, 4, 2, 3}}};
  std::vector<std::int64_t> p = {0, 1, 2, 3};
  do cases.push_back({{2, 3, 4, 5}, p});
  while (std::next_permutation(p.begin(), p.end()));
  int tiled = 0;
  for (const Case& c : cases) {
    tiled += check_transpose<std::uint8_t>(c.s, c.perm, uint8) == 2;
    check_transpose<std::uint16_t>(c.s, c.perm, float16);
    check_transpose<std::uint32_t>(c.s, c.perm, float32);
    check_transpose<std::uint64_t>(c.s, c.perm, int64);
  }
  CHECK(tiled >= 6);  // the tiled kernel was exercised
  // The plan merges axes that stay together: [2,3,4,5] by (2,3,0,1) is a 2-D transpose.
  const TransposePlan plan = simplify_transpose({2, 3, 4, 5}, {2, 3, 0, 1});
  CHECK(plan.in_shape == std::vector<std::int64_t>{6, 20});
  CHECK(plan.perm == std::vector<std::int64_t>{1, 0});
}

}  // namespace
