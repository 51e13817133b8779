// The one table of elementwise ops and activations, in the spirit of ggml's test-backend-ops:
// every op of backend/common/unary_ops.hpp and binary_ops.hpp runs forward and backward, in
// every dtype, on every device for_each_device gives (CPU, test device, cuda:0 where present),
// against float64:
//   - forward: against the row's float64 reference, written here independently of the shared
//     formulas (so a broken formula fails on every backend);
//   - backward: in float64 against central finite differences, and in every dtype against the
//     CPU's float64 backward on the same inputs;
//   - activations (a Keras name): fused into dense and conv2d, forward and gradient;
//   - binary ops: over broadcasting shape pairs, comparisons giving bool.
// The CUDA kernel bodies run the same ops on the host in tests/cuda/test_cuda_elementwise.cpp
// (bit for bit against the CPU, looping over the same op table).
//
// Which test covers an op: its row below. A new op of the table fails "has a row" until it has one.
#include <cmath>
#include <cstring>
#include <algorithm>

#include "backend/common/binary_ops.hpp"
#include "backend/common/unary_ops.hpp"
#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;  // check_close, for_each_device, random, tolerance, ...

namespace {

/// The raw patterns of a bfloat16 or float16 tensor (on the CPU), for bit-for-bit comparisons.
std::vector<std::uint16_t> bits16(const Tensor& t) {
  REQUIRE((t.dtype() == bfloat16 || t.dtype() == float16));
  const Tensor c = t.to(Device::cpu());
  std::vector<std::uint16_t> out(static_cast<std::size_t>(c.numel()));
  std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(std::uint16_t));
  return out;
}

using Vec = std::vector<double>;

struct UnaryRow {
  UnaryOp op;
  std::function<Tensor(const Tensor&)> call;  ///< the public op
  std::function<double(double)> ref;          ///< float64 reference (the op's definition)
  double lo, hi;                              ///< input range (kinks inside are fine)
  bool integers = false;                      ///< the public op takes int32/int64 too
};

double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }

const std::vector<UnaryRow>& rows() {
  static const std::vector<UnaryRow> r = {
      {UnaryOp::Linear, [](const Tensor& x) { return ops::activation(x, "linear"); }, [](double x) { return x; }, -3, 3},
      {UnaryOp::Neg, ops::neg, [](double x) { return -x; }, -3, 3, true},
      {UnaryOp::Exp, ops::exp, [](double x) { return std::exp(x); }, -3, 3},
      {UnaryOp::Log, ops::log, [](double x) { return std::log(x); }, 0.1, 5},
      {UnaryOp::Sqrt, ops::sqrt, [](double x) { return std::sqrt(x); }, 0.01, 9},
      {UnaryOp::Square, ops::square, [](double x) { return x * x; }, -3, 3, true},
      {UnaryOp::Abs, ops::abs, [](double x) { return std::abs(x); }, -3, 3, true},
      {UnaryOp::Sign, ops::sign, [](double x) { return double((x > 0) - (x < 0)); }, -3, 3, true},
      {UnaryOp::Relu, ops::relu, [](double x) { return x > 0 ? x : 0; }, -3, 3},
      {UnaryOp::Relu6, ops::relu6, [](double x) { return std::min(std::max(x, 0.0), 6.0); }, -3, 9},
      // A slope other than the default 0.2, so the parameter is seen to reach every backend.
      {UnaryOp::LeakyRelu, [](const Tensor& x) { return ops::leaky_relu(x, 0.3); },
       [](double x) { return x >= 0 ? x : 0.3 * x; }, -3, 3},
      {UnaryOp::Sigmoid, ops::sigmoid, sigmoid_ref, -6, 6},
      {UnaryOp::Tanh, ops::tanh, [](double x) { return std::tanh(x); }, -3, 3},
      {UnaryOp::Gelu, [](const Tensor& x) { return ops::gelu(x); },
       [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, -4, 4},
      {UnaryOp::GeluTanh, [](const Tensor& x) { return ops::gelu(x, /*approximate=*/true); },
       [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }, -4, 4},
      {UnaryOp::Silu, ops::silu, [](double x) { return x * sigmoid_ref(x); }, -6, 6},
  };
  return r;
}

/// The activations by Keras name, with the reference of their default parameter.
struct ActivationRow {
  std::string name;
  std::function<double(double)> ref;
};
std::vector<ActivationRow> activation_rows() {
  std::vector<ActivationRow> acts;
  for (const UnaryRow& r : rows()) {
    const char* keras = common::unary_info(r.op).keras;
    if (keras == nullptr) continue;
    auto ref = r.ref;
    if (r.op == UnaryOp::LeakyRelu) ref = [](double x) { return x >= 0 ? x : 0.2 * x; };  // Keras's default slope
    acts.push_back({keras, ref});
  }
  return acts;
}

struct BinaryRow {
  BinaryOp op;
  std::function<Tensor(const Tensor&, const Tensor&)> call;
  std::function<double(double, double)> ref;  ///< comparisons: 1 or 0
  double lo, hi;                              ///< range of both operands
};

const std::vector<BinaryRow>& binary_rows() {
  using T = const Tensor&;
  static const std::vector<BinaryRow> r = {
      {BinaryOp::Add, ops::add, std::plus<double>(), -3, 3},
      {BinaryOp::Sub, ops::sub, std::minus<double>(), -3, 3},
      {BinaryOp::Mul, ops::mul, std::multiplies<double>(), -3, 3},
      {BinaryOp::Div, ops::div, std::divides<double>(), 0.5, 3},
      {BinaryOp::Pow, [](T a, T b) { return ops::pow(a, b); }, [](double a, double b) { return std::pow(a, b); }, 0.5, 2},
      {BinaryOp::Maximum, ops::maximum, [](double a, double b) { return std::max(a, b); }, -3, 3},
      {BinaryOp::Minimum, ops::minimum, [](double a, double b) { return std::min(a, b); }, -3, 3},
      {BinaryOp::Equal, ops::equal, [](double a, double b) { return double(a == b); }, -1, 1},
      {BinaryOp::NotEqual, ops::not_equal, [](double a, double b) { return double(a != b); }, -1, 1},
      {BinaryOp::Less, ops::less, [](double a, double b) { return double(a < b); }, -1, 1},
      {BinaryOp::LessEqual, ops::less_equal, [](double a, double b) { return double(a <= b); }, -1, 1},
      {BinaryOp::Greater, ops::greater, [](double a, double b) { return double(a > b); }, -1, 1},
      {BinaryOp::GreaterEqual, ops::greater_equal, [](double a, double b) { return double(a >= b); }, -1, 1},
  };
  return r;
}

/// Shape pairs: equal, broadcast each way, scalars, size-1 axes on both sides.
const std::vector<std::pair<Shape, Shape>> kShapePairs = {
    {{4, 700}, {4, 700}}, {{4, 700}, {700}}, {{2, 1, 5}, {3, 1}}, {{3, 4}, {}}, {{}, {3, 4}}, {{5, 1}, {1, 6}}};

/// The float64 reference of a broadcasting binary op.
Vec broadcast_ref(const Tensor& a, const Tensor& b, const std::function<double(double, double)>& f) {
  const Shape o = broadcast_shape(a.shape(), b.shape());
  const Vec av = a.to_vector<double>(), bv = b.to_vector<double>();
  Vec r(static_cast<std::size_t>(numel_of(o)));
  auto index = [&](const Shape& s, std::int64_t flat) {  // flat index of o -> index into s
    std::int64_t idx = 0, stride = 1;
    for (std::size_t d = 0; d < o.size(); ++d) {
      const std::size_t od = o.size() - 1 - d;
      const std::int64_t coord = flat % o[od];
      flat /= o[od];
      if (d < s.size()) {
        const std::int64_t sd = s[s.size() - 1 - d];
        idx += (sd == 1 ? 0 : coord) * stride;
        stride *= sd;
      }
    }
    return idx;
  };
  for (std::int64_t i = 0; i < numel_of(o); ++i) r[i] = f(av[index(a.shape(), i)], bv[index(b.shape(), i)]);
  return r;
}

/// Values on a grid of 1/8 steps in [lo, hi] (exact in every dtype; comparisons meet equal pairs).
Tensor grid_values(const Shape& s, DType dt, Device dev, std::uint64_t seed, double lo, double hi) {
  Tensor u = random(s, float64, Device::cpu(), seed, 0, 1);
  Vec v = u.to_vector<double>();
  const double steps = std::floor((hi - lo) * 8);
  for (double& x : v) x = lo + std::floor(x * (steps + 1)) / 8;
  return Tensor::from_vector(v, s).to(dt).to(dev);
}

/// Weights the output so the checked scalar depends on every element differently.
Tensor weigh(const Tensor& y) {
  return ops::mul(y, Tensor::random_uniform(y.shape(), 0.5, 1.5, 99, y.dtype(), y.device()));
}

/// |actual - expected| within the dtype's tolerance of a result computed from pre-activations z
/// known to within atol_z: the activation's slope at z (by central difference) scales atol_z.
void check_activation(const Tensor& actual, const Vec& z, double atol_z, DType dt,
                      const std::function<double(double)>& f, const std::string& what) {
  const Vec got = actual.to_vector<double>();
  REQUIRE(got.size() == z.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < z.size(); ++i) {
    const double e = f(z[i]), h = 1e-4;
    const double slope = std::abs(f(z[i] + h) - f(z[i] - h)) / (2 * h);
    const double tol = tolerance(dt).atol + tolerance(dt).rtol * std::abs(e) + atol_z * std::max(1.0, slope);
    if (!(std::abs(got[i] - e) <= tol) && bad++ == 0) first = i;
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", z.size(), " differ; first at ", first, ": got ",
                bad ? got[first] : 0.0, ", expected ", bad ? f(z[first]) : 0.0);
}

}  // namespace

TEST_CASE("op table: every op of the shared tables has exactly one row") {
  auto rows_of = [](const auto& table, int op) {
    return std::count_if(table.begin(), table.end(), [&](const auto& r) { return static_cast<int>(r.op) == op; });
  };
  common::for_each_unary_op([&](auto o) {
    CHECK_MESSAGE(rows_of(rows(), static_cast<int>(o.value)) == 1, "op '", common::unary_name(o),
                  "' needs one row in rows() of tests/ops/test_op_table.cpp");
  });
  common::for_each_binary_op([&](auto o) {
    CHECK_MESSAGE(rows_of(binary_rows(), static_cast<int>(o.value)) == 1, "binary op '", common::binary_name(o),
                  "' needs one row in binary_rows() of tests/ops/test_op_table.cpp");
  });
  CHECK(rows().size() == static_cast<std::size_t>(common::kUnaryOpCount));
}

TEST_CASE("op table: forward against float64 references, every op, dtype and device") {
  for_each_device([](Device dev) {
    for (const UnaryRow& r : rows()) {
      const std::string name = common::unary_name(r.op);
      for (DType dt : float_dtypes())
        for (const Shape& shape : {Shape{3, 1500}, Shape{7}, Shape{}, Shape{0, 4}}) {  // > one block; odd; scalar; empty
          Tensor x = random(shape, dt, dev, 11, r.lo, r.hi);
          Tensor y = r.call(x);
          REQUIRE(y.dtype() == dt);
          REQUIRE(y.shape() == shape);
          Vec ref = x.to_vector<double>();
          for (double& v : ref) v = r.ref(v);
          check_close(y, ref, tolerance(dt), name + " " + to_string(dt) + " " + to_string(shape));
        }
      if (r.integers)
        for (DType dt : {int32, int64}) {
          Tensor x = Tensor::from_vector<double>({-7, -1, 0, 2, 5, 40000}, {6}).to(dt).to(dev);
          Vec ref = x.to_vector<double>();
          for (double& v : ref) v = r.ref(v);
          Tensor y = r.call(x);
          CHECK(y.dtype() == dt);
          CHECK_MESSAGE(y.to_vector<double>() == ref, name, " ", to_string(dt));
        }
    }
  });
}

TEST_CASE("op table: float32 GELU (common/float_math.hpp) is close to float64 over its whole range, lanes = scalars") {
  // 60001 points over [-15, 15]: the left tail (where ½(1 + erf) would cancel), the middle, and
  // the right; the CPU runs 16 lanes at a time, the scalar formula (the CUDA bodies') on the tail.
  std::vector<float> xs;
  for (int i = -30000; i <= 30000; ++i) xs.push_back(static_cast<float>(i) * 5e-4f);
  const Tensor x = Tensor::from_vector(xs, {static_cast<std::int64_t>(xs.size())});
  const std::vector<float> y = ops::gelu(x).to_vector<float>();
  GradientTape tape;
  Tensor xw = x;
  tape.watch(xw);
  const std::vector<float> dy = tape.gradient(ops::sum(ops::gelu(xw)), {xw})[0].to_vector<float>();
  double worst = 0, worst_grad = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double ref = v * cdf, ref_grad = cdf + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
    // Relative to the value: a few float32 ulp in the middle; in the tails the rounding of x²
    // inside exp (x² ~ 100 at |x| = 10: 6e-6 of it) bounds what float32 can do.
    const double rtol = std::abs(v) <= 3 ? 2e-6 : 2e-5;
    // Below x = -13.1 the value falls under the smallest normal float: exp flushes it to 0.
    CHECK_MESSAGE(std::abs(y[i] - ref) <= rtol * std::abs(ref) + 2.4e-38, "gelu(", v, ") = ", y[i], ", float64 ", ref);
    CHECK_MESSAGE(std::abs(dy[i] - ref_grad) <= rtol * std::abs(ref_grad) + 1e-7, "gelu'(", v, ") = ", dy[i], ", float64 ",
                  ref_grad);
    if (std::abs(ref) > 1e-30) worst = std::max(worst, std::abs(y[i] - ref) / std::abs(ref));
    if (std::abs(v) <= 3) worst_grad = std::max(worst_grad, std::abs(dy[i] - ref_grad) / (std::abs(ref_grad) + 1e-3));
    // The scalar formula gives the lanes' bits.
    const float scalar = common::unary_apply<UnaryOp::Gelu>(xs[i], 0.f);
    const float scalar_grad = common::unary_grad<UnaryOp::Gelu>(xs[i], 0.f, 1.f, 0.f);
    CHECK_MESSAGE(std::memcmp(&scalar, &y[i], sizeof scalar) == 0, "gelu(", v, "): lanes ", y[i], ", scalar ", scalar);
    CHECK_MESSAGE(std::memcmp(&scalar_grad, &dy[i], sizeof scalar) == 0, "gelu'(", v, "): lanes ", dy[i], ", scalar ",
                  scalar_grad);
  }
  MESSAGE("float32 GELU: largest relative error ", worst, " over [-15, 15]; gradient ", worst_grad, " over [-3, 3] (relative to |ref| + 1e-3)");
  // Non-finite inputs: as x Φ(x) in float64 (inf Φ(inf) = inf, -inf Φ(-inf) = NaN, NaN).
  const std::vector<float> odd = ops::gelu(Tensor::from_vector<float>({INFINITY, -INFINITY, NAN}, {3})).to_vector<float>();
  CHECK(odd[0] == INFINITY);
  CHECK(std::isnan(odd[1]));
  CHECK(std::isnan(odd[2]));
}

TEST_CASE("op table: float32 sigmoid, tanh, SiLU and tanh-GELU (common/float_math.hpp) are close to float64, lanes = scalars") {
  // 80001 points over [-100, 100], denser near 0; each op's lanes (the CPU's 16 or 8 at a time)
  // against the float64 definition and against the scalar formula (the CUDA bodies').
  std::vector<float> xs;
  for (int i = -40000; i <= 40000; ++i) {
    const double t = i / 40000.0;
    xs.push_back(static_cast<float>(100 * t * t * t));
  }
  const Tensor x = Tensor::from_vector(xs, {static_cast<std::int64_t>(xs.size())});
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  auto inner = [](double v) { return std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v); };
  struct Row {
    UnaryOp op;
    std::function<Tensor(const Tensor&)> f;
    std::function<double(double)> ref, slope;  // slope: only where the gradient runs on lanes
    double rtol, atol;
  };
  const std::vector<Row> table = {
      // e^-x leaves float32 below -87.34, where sigmoid (< 1.2e-38) is flushed to 0 (and SiLU, x
      // times it, below 1.1e-36).
      {UnaryOp::Sigmoid, ops::sigmoid, sig, nullptr, 1e-6, 1.2e-38},
      {UnaryOp::Tanh, ops::tanh, [](double v) { return std::tanh(v); }, nullptr, 1e-6, 0},
      {UnaryOp::Silu, ops::silu, [&](double v) { return v * sig(v); },
       [&](double v) { return sig(v) + v * sig(v) * (1 - sig(v)); }, 1e-6, 2e-36},
      // ½x(1 + tanh u) cancels in the left tail whatever the precision of tanh: float32 keeps
      // |x|·2^-24 there (as PyTorch's float32 formula does).
      {UnaryOp::GeluTanh, [](const Tensor& t) { return ops::gelu(t, true); },
       [&](double v) { return 0.5 * v * (1 + std::tanh(inner(v))); },
       [&](double v) {
         const double th = std::tanh(inner(v));
         return 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * v * v);
       },
       2e-6, 0},
  };
  for (const Row& r : table) {
    const std::string name = common::unary_name(r.op);
    const std::vector<float> y = r.f(x).to_vector<float>();
    std::vector<float> dy;
    if (r.slope) {
      GradientTape tape;
      Tensor xw = x;
      tape.watch(xw);
      dy = tape.gradient(ops::sum(r.f(xw)), {xw})[0].to_vector<float>();
    }
    double worst = 0;
    int bad = 0, bad_bits = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double v = xs[i], ref = r.ref(v);
      const double atol = r.op == UnaryOp::GeluTanh ? std::abs(v) * 1.2e-7 : r.atol;
      if (!(std::abs(y[i] - ref) <= r.rtol * std::abs(ref) + atol) && bad++ < 5)
        FAIL_CHECK(name, "(", v, ") = ", y[i], ", float64 ", ref);
      if (std::abs(ref) > 1e-30) worst = std::max(worst, std::abs(y[i] - ref) / std::abs(ref));
      const float scalar = common::with_unary_op(r.op, [&](auto o) { return common::unary_apply<decltype(o)::value>(xs[i], 0.f); });
      if (std::memcmp(&scalar, &y[i], sizeof scalar) != 0 && bad_bits++ < 5)
        FAIL_CHECK(name, "(", v, "): lanes ", y[i], ", scalar ", scalar);
      if (r.slope) {
        // Absolute allowances: SiLU's s + x s (1 - s) cancels near its root (x = -1.28).
        const double g = r.slope(v), gatol = r.op == UnaryOp::GeluTanh ? 2.4e-7 * (1 + v * v) : 1e-7;
        if (!(std::abs(dy[i] - g) <= 2e-6 * std::abs(g) + gatol) && bad++ < 5)
          FAIL_CHECK(name, "'(", v, ") = ", dy[i], ", float64 ", g);
        const float sg = common::with_unary_op(r.op, [&](auto o) {
          return common::unary_grad<decltype(o)::value>(xs[i], 0.f, 1.f, 0.f);
        });
        if (std::memcmp(&sg, &dy[i], sizeof sg) != 0 && bad_bits++ < 5)
          FAIL_CHECK(name, "'(", v, "): lanes ", dy[i], ", scalar ", sg);
      }
    }
    CHECK_MESSAGE(bad == 0, name);
    CHECK_MESSAGE(bad_bits == 0, name);
    MESSAGE("float32 ", name, ": largest relative error ", worst, " over [-100, 100]");
  }
  // Limits, signed zeros, NaN.
  const Tensor odd = Tensor::from_vector<float>({INFINITY, -INFINITY, NAN, -0.0f, 0.0f}, {5});
  const std::vector<float> t = ops::tanh(odd).to_vector<float>(), s = ops::sigmoid(odd).to_vector<float>();
  CHECK(t[0] == 1.0f);
  CHECK(t[1] == -1.0f);
  CHECK(std::isnan(t[2]));
  CHECK((t[3] == 0.0f && std::signbit(t[3])));
  CHECK((t[4] == 0.0f && !std::signbit(t[4])));
  CHECK(s[0] == 1.0f);
  CHECK(s[1] == 0.0f);
  CHECK(std::isnan(s[2]));
  CHECK(s[3] == 0.5f);
  CHECK(ops::sigmoid(Tensor::from_vector<float>({-100.0f, 20.0f}, {2})).to_vector<float>() == std::vector<float>{0.0f, 1.0f});
}

TEST_CASE("op table: 16-bit GELU and its gradient are the float32 arithmetic on the widened values, rounded") {
  // Every bfloat16 value in [-16, 16] and some odd ones, in a length that leaves a scalar tail;
  // against the float32 op on the widened inputs, rounded once (the bits of every lane and tail).
  std::vector<float> xs;
  for (int i = -16384; i <= 16384; ++i) xs.push_back(static_cast<float>(i) / 1024.f);
  for (float v : {INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 1e-30f}) xs.push_back(v);
  const auto n = static_cast<std::int64_t>(xs.size());
  const Tensor x16 = ops::cast(Tensor::from_vector(xs, {n}), bfloat16);
  const Tensor x32 = ops::cast(x16, float32);
  const Tensor d16 = ops::cast(Tensor::random_uniform({n}, -3, 3, 7), bfloat16);
  CHECK(bits16(ops::gelu(x16)) == bits16(ops::cast(ops::gelu(x32), bfloat16)));
  // The gradient through sum(gelu(x) · d): gelu's backward gets dy = d exactly.
  auto grad = [&](const Tensor& x, const Tensor& d) {
    GradientTape tape;
    Tensor xw = x;
    tape.watch(xw);
    return tape.gradient(ops::sum(ops::cast(ops::mul(ops::gelu(xw), d), float32)), {xw})[0];
  };
  CHECK(bits16(grad(x16, d16)) == bits16(ops::cast(grad(x32, ops::cast(d16, float32)), bfloat16)));
  // Every one of the 65,536 bit patterns (NaNs, infinities, subnormals, both zeros), bfloat16 and
  // float16: the CPU's 16-bit GELU looks its results up in tables built from the lanes.
  for (DType dt : {bfloat16, float16}) {
    CAPTURE(to_string(dt));
    Tensor all = Tensor::empty({65536}, dt, Device::cpu());
    auto* pb = static_cast<std::uint16_t*>(all.data_ptr());
    for (std::uint32_t b = 0; b < 65536; ++b) pb[b] = static_cast<std::uint16_t>(b);
    const Tensor all32 = ops::cast(all, float32);
    const Tensor y = ops::gelu(all);
    REQUIRE(y.dtype() == dt);
    CHECK(bits16(y) == bits16(ops::cast(ops::gelu(all32), dt)));
    const Tensor dall = ops::cast(Tensor::random_uniform({65536}, -3, 3, 8), dt);
    const Tensor dx = grad(all, dall);
    REQUIRE(dx.dtype() == dt);
    CHECK(bits16(dx) == bits16(ops::cast(grad(all32, ops::cast(dall, float32)), dt)));
  }
}

TEST_CASE("op table: bfloat16 add, subtract, multiply and column sums are the float32 arithmetic on the widened values, rounded") {
  // The CPU runs these on lanes that widen and round in registers (same-shape operands; sums down
  // a column): the bits of the float32 op on the widened inputs, rounded once, with infinities,
  // NaNs, overflow and a scalar tail (37 columns) in them.
  const std::int64_t rows = 129, cols = 37;
  std::vector<float> av(static_cast<std::size_t>(rows * cols)), bv(av.size());
  for (std::size_t i = 0; i < av.size(); ++i) {
    av[i] = std::ldexp(static_cast<float>(static_cast<int>(i * 7919 % 2001) - 1000), static_cast<int>(i % 23) - 14);
    bv[i] = std::ldexp(static_cast<float>(static_cast<int>(i * 104729 % 1999) - 999), static_cast<int>(i % 19) - 10);
  }
  av[5] = INFINITY, bv[6] = -INFINITY, av[7] = NAN, bv[8] = NAN, av[9] = 3e38f, bv[9] = 3e38f, av[10] = INFINITY,
  bv[10] = -INFINITY;
  for_each_device([&](Device dev) {
    const Tensor a16 = ops::cast(Tensor::from_vector(av, {rows, cols}), bfloat16).to(dev);
    const Tensor b16 = ops::cast(Tensor::from_vector(bv, {rows, cols}), bfloat16).to(dev);
    const Tensor a32 = ops::cast(a16, float32), b32 = ops::cast(b16, float32);
    CHECK(bits16(ops::add(a16, b16)) == bits16(ops::cast(ops::add(a32, b32), bfloat16)));
    CHECK(bits16(ops::sub(a16, b16)) == bits16(ops::cast(ops::sub(a32, b32), bfloat16)));
    CHECK(bits16(ops::mul(a16, b16)) == bits16(ops::cast(ops::mul(a32, b32), bfloat16)));
    // Finite columns (a sum with an infinity and a NaN in it is NaN either way) and every column.
    const Tensor f16 = ops::cast(ops::mul(ops::cast(a16, float32), Tensor::scalar(1e-3, float32, dev)), bfloat16);
    CHECK(bits16(ops::sum(f16, {0})) == bits16(ops::cast(ops::sum(ops::cast(f16, float32), {0}), bfloat16)));
    CHECK(bits16(ops::sum(a16, {0})) == bits16(ops::cast(ops::sum(a32, {0}), bfloat16)));
    CHECK(bits16(ops::mean(b16, {0})) == bits16(ops::cast(ops::mean(b32, {0}), bfloat16)));
  });
}

TEST_CASE("op table: backward against finite differences and the CPU's float64, every op, dtype and device") {
  for_each_device([](Device dev) {
    for (const UnaryRow& r : rows()) {
      const std::string name = common::unary_name(r.op);
      check_gradients(name, [&](const std::vector<Tensor>& in) { return weigh(r.call(in[0])); },
                      {random({3, 4}, float64, dev, 1, r.lo, r.hi)});
      for (DType dt : float_dtypes()) {
        Tensor x = random({2, 700}, dt, dev, 2, r.lo, r.hi), dy = random({2, 700}, dt, dev, 3, -2, 2);
        Tensor dx;
        {
          GradientTape tape;
          tape.watch(x);
          Tensor y = r.call(x);
          dx = tape.gradient(ops::sum(ops::mul(y, dy)), {x})[0];
        }
        REQUIRE(dx.dtype() == dt);
        Tensor x64 = x.to(float64).to(Device::cpu()), dy64 = dy.to(float64).to(Device::cpu()), want;
        {
          GradientTape tape;
          tape.watch(x64);
          want = tape.gradient(ops::sum(ops::mul(r.call(x64), dy64)), {x64})[0];
        }
        // Gradients read from a rounded output (sigmoid: dy·y·(1 - y)) lose |dy|·ulp to the
        // rounding of y near 1: an absolute allowance of the dtype's rtol times max |dy| = 2.
        const Tolerance tol{tolerance(dt).rtol, tolerance(dt).atol + 2 * tolerance(dt).rtol};
        check_close(dx, want.to_vector<double>(), tol, name + " backward " + to_string(dt));
      }
    }
  });
}

TEST_CASE("op table: every activation fused into dense, forward and gradient") {
  const std::int64_t rows_n = 33, in = 40, units = 24;
  for_each_device([&](Device dev) {
    for (const ActivationRow& a : activation_rows()) {
      for (DType dt : float_dtypes())
        for (bool bias : {true, false}) {
          Tensor x = random({rows_n, in}, dt, dev, 1, -1, 1), w = random({in, units}, dt, dev, 2, -0.5, 0.5);
          Tensor b = bias ? random({units}, dt, dev, 3) : Tensor();
          Tensor y = ops::dense(x, w, b, a.name);
          REQUIRE(y.shape() == Shape{rows_n, units});
          CHECK(y.dtype() == dt);
          const Vec xv = x.to_vector<double>(), wv = w.to_vector<double>();
          const Vec bv = bias ? b.to_vector<double>() : Vec(units, 0);
          Vec z(rows_n * units);
          double scale = 0;
          for (std::int64_t i = 0; i < rows_n; ++i)
            for (std::int64_t j = 0; j < units; ++j) {
              double s = bv[j], mag = std::abs(bv[j]);
              for (std::int64_t p = 0; p < in; ++p) s += xv[i * in + p] * wv[p * units + j], mag += std::abs(xv[i * in + p] * wv[p * units + j]);
              z[i * units + j] = s, scale = std::max(scale, mag);
            }
          check_activation(y, z, tolerance(dt).rtol * (scale + 2), dt, a.ref,
                           "dense " + a.name + " " + to_string(dt) + (bias ? " bias" : ""));
        }
      check_gradients("dense " + a.name,
                      [&](const std::vector<Tensor>& in) { return weigh(ops::dense(in[0], in[1], in[2], a.name)); },
                      {random({2, 3, 4}, float64, dev, 15), random({4, 5}, float64, dev, 16, -1, 1),
                       random({5}, float64, dev, 17)});
    }
  });
}

TEST_CASE("op table: every activation fused into conv2d, forward and gradient") {
  for_each_device([&](Device dev) {
    for (const ActivationRow& a : activation_rows()) {
      // 3 and 16 input channels: the CPU's small-channel direct kernels and oneDNN.
      for (std::int64_t cin : {3, 16})
        for (DType dt : float_dtypes()) {
          Tensor x = random({2, 9, 9, cin}, dt, dev, 4, -1, 1), w = random({3, 3, cin, 8}, dt, dev, 5, -0.5, 0.5);
          Tensor b = random({8}, dt, dev, 6);
          Tensor y = ops::conv2d(x, w, b, {.padding = "same", .activation = a.name});
          // The float64 CPU convolution without activation, and its magnitude for the tolerance.
          auto cpu64 = [](const Tensor& t) { return t.to(float64).to(Device::cpu()); };
          const Vec z = ops::conv2d(cpu64(x), cpu64(w), cpu64(b), {.padding = "same"}).to_vector<double>();
          const Vec mag = ops::conv2d(ops::abs(cpu64(x)), ops::abs(cpu64(w)), ops::abs(cpu64(b)), {.padding = "same"})
                              .to_vector<double>();
          const double scale = *std::max_element(mag.begin(), mag.end());
          check_activation(y, z, tolerance(dt).rtol * (scale + 2), dt, a.ref,
                           "conv2d " + a.name + " cin " + std::to_string(cin) + " " + to_string(dt));
        }
      check_gradients("conv2d " + a.name,
                      [&](const std::vector<Tensor>& in) {
                        return weigh(ops::conv2d(in[0], in[1], in[2], {.padding = "same", .activation = a.name}));
                      },
                      {random({1, 4, 4, 2}, float64, dev, 7), random({3, 3, 2, 3}, float64, dev, 8, -1, 1),
                       random({3}, float64, dev, 9)});
    }
  });
}

TEST_CASE("op table: activation names and their errors come from the table") {
  for (const ActivationRow& a : activation_rows()) CHECK_NOTHROW(ops::check_activation(a.name));
  CHECK_NOTHROW(ops::check_activation("swish"));
  CHECK_NOTHROW(ops::check_activation("softmax"));
  try {
    ops::check_activation("relu7");
    FAIL("relu7 accepted");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("relu7") != std::string::npos);
    for (const ActivationRow& a : activation_rows()) CHECK_MESSAGE(msg.find(a.name) != std::string::npos, msg);
  }
  Tensor x = Tensor::ones({2});
  CHECK_THROWS_AS(ops::leaky_relu(x, std::nan("")), Error);
}

TEST_CASE("op table: binary ops forward, broadcasting, every dtype and device") {
  for_each_device([](Device dev) {
    for (const BinaryRow& r : binary_rows()) {
      const bool cmp = common::is_comparison(r.op);
      for (DType dt : float_dtypes())
        for (const auto& [sa, sb] : kShapePairs) {
          const std::string what = std::string(common::binary_name(r.op)) + " " + to_string(dt) + " " +
                                   to_string(sa) + " with " + to_string(sb);
          Tensor a = grid_values(sa, dt, dev, 1, r.lo, r.hi), b = grid_values(sb, dt, dev, 2, r.lo, r.hi);
          Tensor y = r.call(a, b);
          REQUIRE_MESSAGE(y.shape() == broadcast_shape(sa, sb), what);
          CHECK_MESSAGE(y.dtype() == (cmp ? bool_ : dt), what);
          check_close(y.to(float64), broadcast_ref(a, b, r.ref), cmp ? Tolerance{0, 0} : tolerance(dt), what);
        }
    }
  });
}

TEST_CASE("op table: binary ops backward against finite differences and the CPU's float64") {
  for_each_device([](Device dev) {
    for (const BinaryRow& r : binary_rows()) {
      if (common::is_comparison(r.op)) continue;  // no gradient
      const std::string name = common::binary_name(r.op);
      for (const auto& [sa, sb] : {std::pair<Shape, Shape>{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{2, 1, 3}, {4, 1}}, {{3}, {}}})
        check_gradients(name + " " + to_string(sa) + " " + to_string(sb),
                        [&](const std::vector<Tensor>& in) { return weigh(r.call(in[0], in[1])); },
                        {random(sa, float64, dev, 2, r.lo, r.hi), random(sb, float64, dev, 3, r.lo, r.hi)});
      for (DType dt : float_dtypes()) {
        Tensor a = random({4, 300}, dt, dev, 4, r.lo, r.hi), b = random({300}, dt, dev, 5, r.lo, r.hi);
        Tensor dy = random({4, 300}, dt, dev, 6, -2, 2);
        std::vector<Tensor> got, want;
        {
          GradientTape tape;
          tape.watch(a), tape.watch(b);
          got = tape.gradient(ops::sum(ops::mul(r.call(a, b), dy)), {a, b});
        }
        auto cpu64 = [](const Tensor& t) { return t.to(float64).to(Device::cpu()); };
        Tensor a64 = cpu64(a), b64 = cpu64(b), dy64 = cpu64(dy);
        {
          GradientTape tape;
          tape.watch(a64), tape.watch(b64);
          want = tape.gradient(ops::sum(ops::mul(r.call(a64, b64), dy64)), {a64, b64});
        }
        // b's gradient sums 4 rows: its error grows with the sum's magnitude.
        const Tolerance tol{tolerance(dt).rtol, tolerance(dt).atol + 8 * tolerance(dt).rtol};
        check_close(got[0], want[0].to_vector<double>(), tol, name + " backward da " + to_string(dt));
        check_close(got[1], want[1].to_vector<double>(), tol, name + " backward db " + to_string(dt));
      }
    }
  });
}
