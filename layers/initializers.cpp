// Keras's initializers (keras/src/initializers) with their arguments: the arithmetic of
// constant_initializers.py and random_initializers.py on mpt's Philox streams, and their saved form.
#include "mpt/initializers.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/json_util.hpp"
#include "mpt/autograd.hpp"
#include "mpt/layers/layer.hpp"
#include "mpt/ops.hpp"

namespace mpt::initializers {

namespace {

/// The named forms of VarianceScaling.
struct Named {
  const char* cls;
  double scale;
  const char* mode;
  const char* distribution;
};
constexpr Named kNamed[] = {{"GlorotNormal", 1.0, "fan_avg", "truncated_normal"},
                            {"GlorotUniform", 1.0, "fan_avg", "uniform"},
                            {"HeNormal", 2.0, "fan_in", "truncated_normal"},
                            {"HeUniform", 2.0, "fan_in", "uniform"},
                            {"LecunNormal", 1.0, "fan_in", "truncated_normal"},
                            {"LecunUniform", 1.0, "fan_in", "uniform"}};

const Named* named(const std::string& cls) {
  for (const auto& n : kNamed)
    if (cls == n.cls) return &n;
  return nullptr;
}

bool variance_family(const std::string& cls) { return cls == "VarianceScaling" || named(cls) != nullptr; }

/// Keras's names of each class: the class name, its snake_case and Keras's aliases.
struct Name {
  const char* name;
  const char* cls;
};
constexpr Name kNames[] = {
    {"Zeros", "Zeros"}, {"zeros", "Zeros"}, {"zero", "Zeros"}, {"Ones", "Ones"}, {"ones", "Ones"}, {"one", "Ones"},
    {"Constant", "Constant"}, {"constant", "Constant"}, {"RandomNormal", "RandomNormal"},
    {"random_normal", "RandomNormal"}, {"normal", "RandomNormal"}, {"RandomUniform", "RandomUniform"},
    {"random_uniform", "RandomUniform"}, {"uniform", "RandomUniform"}, {"TruncatedNormal", "TruncatedNormal"},
    {"truncated_normal", "TruncatedNormal"}, {"VarianceScaling", "VarianceScaling"},
    {"variance_scaling", "VarianceScaling"}, {"GlorotNormal", "GlorotNormal"}, {"glorot_normal", "GlorotNormal"},
    {"GlorotUniform", "GlorotUniform"}, {"glorot_uniform", "GlorotUniform"}, {"HeNormal", "HeNormal"},
    {"he_normal", "HeNormal"}, {"HeUniform", "HeUniform"}, {"he_uniform", "HeUniform"},
    {"LecunNormal", "LecunNormal"}, {"lecun_normal", "LecunNormal"}, {"LecunUniform", "LecunUniform"},
    {"lecun_uniform", "LecunUniform"}, {"Orthogonal", "Orthogonal"}, {"orthogonal", "Orthogonal"},
    {"OrthogonalInitializer", "Orthogonal"}, {"Identity", "Identity"}, {"identity", "Identity"},
    {"IdentityInitializer", "Identity"}};

constexpr const char* kValid =
    "zeros, ones, constant, random_normal (normal), random_uniform (uniform), truncated_normal, variance_scaling, "
    "glorot_normal, glorot_uniform, he_normal, he_uniform, lecun_normal, lecun_uniform, orthogonal, identity "
    "(or Keras's class names)";

/// The class of a Keras name; "" for none.
std::string class_of(const std::string& name) {
  for (const auto& n : kNames)
    if (name == n.name) return n.cls;
  return "";
}

/// A class at Keras's default arguments.
Initializer make(const std::string& cls) {
  Initializer i;
  i.class_name = cls;
  if (const Named* n = named(cls)) {
    i.scale = n->scale, i.mode = n->mode, i.distribution = n->distribution;
  } else if (cls == "VarianceScaling") {
    i.scale = 1.0, i.mode = "fan_in", i.distribution = "truncated_normal";
  }
  return i;
}

/// The class an initializer is saved as: a named form whose scale, mode or distribution was
/// changed is a VarianceScaling.
std::string saved_class(const Initializer& i) {
  if (const Named* n = named(i.class_name))
    if (i.scale != n->scale || i.mode != n->mode || i.distribution != n->distribution) return "VarianceScaling";
  return i.class_name;
}

void check_finite(double v, const Initializer& i, const char* what) {
  MPT_CHECK(std::isfinite(v), "initializers: ", i.class_name, " ", what, " must be finite, got ", v);
}

/// std::normal samples beyond ±2 redrawn (JAX's truncated_normal(-2, 2)), in float32.
Tensor truncated_standard(const Shape& shape, std::uint64_t seed, Device device) {
  // Values beyond ±2 are redrawn from the next offsets of the stream (a fixed number of rounds,
  // ~1e-11 of them left, then clamped), all on the device.
  Tensor x = Tensor::random_normal(shape, 0.0, 1.0, seed, float32, device);
  const Tensor two = Tensor::scalar(2.0, float32, device);
  for (std::uint64_t round = 1; round <= 8; ++round) {
    Tensor redraw = Tensor::random_normal(shape, 0.0, 1.0, seed, float32, device, round);
    x = ops::where(ops::greater(ops::abs(x), two), redraw, x);
  }
  return ops::minimum(ops::maximum(x, ops::neg(two)), two);
}

/// Values computed on the host (row-major), as a tensor of `dtype` on `device`.
Tensor from_host(const std::vector<double>& v, const Shape& shape, DType dtype, Device device) {
  std::vector<float> f(v.begin(), v.end());
  Tensor t = Tensor::from_vector(f, shape, device);
  return dtype == float32 ? t : t.to(dtype);
}

/// Keras's Orthogonal: Q of the reduced QR of a normal [m, n] (m >= n) matrix, columns times
/// sign(diag(R)); Householder reflections in float64 (Q with a positive-diagonal R is unique, so
/// any QR algorithm gives it).
std::vector<double> orthogonal_columns(std::vector<double> a, std::int64_t m, std::int64_t n) {
  std::vector<std::vector<double>> vs(static_cast<std::size_t>(n));
  std::vector<double> betas(static_cast<std::size_t>(n), 0.0), rdiag(static_cast<std::size_t>(n), 0.0);
  auto at = [&](std::int64_t i, std::int64_t j) -> double& { return a[static_cast<std::size_t>(i * n + j)]; };
  for (std::int64_t k = 0; k < n; ++k) {
    double norm2 = 0;
    for (std::int64_t i = k; i < m; ++i) norm2 += at(i, k) * at(i, k);
    const double norm = std::sqrt(norm2);
    const double alpha = at(k, k) >= 0 ? -norm : norm;
    auto& v = vs[static_cast<std::size_t>(k)];
    v.assign(static_cast<std::size_t>(m - k), 0.0);
    double vnorm2 = 0;
    for (std::int64_t i = k; i < m; ++i) {
      v[static_cast<std::size_t>(i - k)] = at(i, k) - (i == k ? alpha : 0.0);
      vnorm2 += v[static_cast<std::size_t>(i - k)] * v[static_cast<std::size_t>(i - k)];
    }
    const double beta = vnorm2 > 0 ? 2.0 / vnorm2 : 0.0;
    betas[static_cast<std::size_t>(k)] = beta;
    for (std::int64_t j = k; j < n; ++j) {
      double dot = 0;
      for (std::int64_t i = k; i < m; ++i) dot += v[static_cast<std::size_t>(i - k)] * at(i, j);
      for (std::int64_t i = k; i < m; ++i) at(i, j) -= beta * dot * v[static_cast<std::size_t>(i - k)];
    }
    rdiag[static_cast<std::size_t>(k)] = at(k, k);
  }
  // Q = H_0 ... H_{n-1} [I_n; 0], applied from the last reflection.
  std::vector<double> q(static_cast<std::size_t>(m * n), 0.0);
  auto qa = [&](std::int64_t i, std::int64_t j) -> double& { return q[static_cast<std::size_t>(i * n + j)]; };
  for (std::int64_t j = 0; j < n; ++j) qa(j, j) = 1.0;
  for (std::int64_t k = n - 1; k >= 0; --k) {
    const auto& v = vs[static_cast<std::size_t>(k)];
    const double beta = betas[static_cast<std::size_t>(k)];
    if (beta == 0) continue;
    for (std::int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (std::int64_t i = k; i < m; ++i) dot += v[static_cast<std::size_t>(i - k)] * qa(i, j);
      for (std::int64_t i = k; i < m; ++i) qa(i, j) -= beta * dot * v[static_cast<std::size_t>(i - k)];
    }
  }
  for (std::int64_t j = 0; j < n; ++j) {
    const double d = rdiag[static_cast<std::size_t>(j)];
    const double s = d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;  // ops.sign: 0 at 0
    for (std::int64_t i = 0; i < m; ++i) qa(i, j) *= s;
  }
  return q;
}

Tensor orthogonal(const Initializer& init, const Shape& shape, DType dtype, std::uint64_t seed, Device device) {
  MPT_CHECK(shape.size() >= 2, "initializers: Orthogonal needs a shape of rank >= 2, got ", to_string(shape));
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  const std::int64_t cols = shape.back();
  const std::int64_t m = std::max(rows, cols), n = std::min(rows, cols);
  if (m * n == 0) return Tensor::zeros(shape, dtype, device);
  const std::vector<float> drawn = Tensor::random_normal({m, n}, 0.0, 1.0, seed, float32, device)
                                       .to(Device::cpu())
                                       .to_vector<float>();
  const std::vector<double> q = orthogonal_columns(std::vector<double>(drawn.begin(), drawn.end()), m, n);
  std::vector<double> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)  // Q [rows, cols], or Q^T when rows < cols
      out[static_cast<std::size_t>(r * cols + c)] =
          init.gain * (rows >= cols ? q[static_cast<std::size_t>(r * n + c)] : q[static_cast<std::size_t>(c * n + r)]);
  return from_host(out, shape, dtype, device);
}

nlohmann::json seed_json(const Seed& s) { return s ? nlohmann::json(*s) : nlohmann::json(nullptr); }
nlohmann::json axes_json(const Axes& a) { return a ? nlohmann::json(*a) : nlohmann::json(nullptr); }

}  // namespace

std::pair<double, double> compute_fans(const Shape& shape, const Axes& input_axes, const Axes& output_axes) {
  const auto rank = static_cast<std::int64_t>(shape.size());
  if (input_axes && output_axes) {
    auto product = [&](const std::vector<std::int64_t>& axes, const char* what) {
      double p = 1;
      for (auto a : axes) {
        MPT_CHECK(a >= -rank && a < rank, "initializers: ", what, " ", a, " is outside a shape of rank ", rank, " (",
                  to_string(shape), ")");
        p *= static_cast<double>(shape[static_cast<std::size_t>(a < 0 ? a + rank : a)]);
      }
      return p;
    };
    return {product(*input_axes, "input_axes"), product(*output_axes, "output_axes")};
  }
  if (rank == 0) return {1.0, 1.0};
  if (rank == 1) return {static_cast<double>(shape[0]), static_cast<double>(shape[0])};
  double receptive = 1;
  for (std::size_t i = 0; i + 2 < shape.size(); ++i) receptive *= static_cast<double>(shape[i]);
  return {static_cast<double>(shape[shape.size() - 2]) * receptive, static_cast<double>(shape.back()) * receptive};
}

Initializer::Initializer(const std::string& name) {
  const std::string cls = class_of(name);
  MPT_CHECK(!cls.empty(), "initializers: unknown initializer '", name, "'; valid: ", kValid);
  *this = make(cls);
}

Initializer::Initializer(const char* name) : Initializer(std::string(name ? name : "")) {}

void Initializer::check() const {
  MPT_CHECK(class_of(class_name) == class_name, "initializers: unknown initializer class '", class_name,
            "'; valid: ", kValid);
  if (class_name == "RandomNormal" || class_name == "TruncatedNormal") {
    check_finite(mean, *this, "mean");
    check_finite(stddev, *this, "stddev");
    MPT_CHECK(stddev >= 0, "initializers: ", class_name, " stddev must be >= 0, got ", stddev);
  } else if (class_name == "RandomUniform") {
    check_finite(minval, *this, "minval");
    check_finite(maxval, *this, "maxval");
  } else if (class_name == "Constant") {
    check_finite(value, *this, "value");
  } else if (variance_family(class_name)) {
    check_finite(scale, *this, "scale");
    MPT_CHECK(scale > 0, "initializers: ", class_name, " scale must be > 0, got ", scale);
    MPT_CHECK(mode == "fan_in" || mode == "fan_out" || mode == "fan_avg", "initializers: ", class_name, " mode '", mode,
              "' is not one of fan_in, fan_out, fan_avg");
    MPT_CHECK(distribution == "truncated_normal" || distribution == "untruncated_normal" || distribution == "uniform",
              "initializers: ", class_name, " distribution '", distribution,
              "' is not one of truncated_normal, untruncated_normal, uniform");
  } else if (class_name == "Orthogonal" || class_name == "Identity") {
    check_finite(gain, *this, "gain");
  }
}

Tensor Initializer::operator()(const Shape& shape, DType dtype, std::optional<std::uint64_t> unseeded_seed) const {
  check();
  const Device device = default_device();
  NoGradGuard no_grad;
  if (class_name == "Zeros") return Tensor::zeros(shape, dtype, device);
  if (class_name == "Ones") return Tensor::ones(shape, dtype, device);
  if (class_name == "Constant") return Tensor::full(shape, value, dtype, device);
  if (class_name == "Identity") {
    MPT_CHECK(shape.size() == 2, "initializers: Identity needs a 2-d shape, got ", to_string(shape));
    std::vector<double> v(static_cast<std::size_t>(shape[0] * shape[1]), 0.0);
    for (std::int64_t i = 0; i < std::min(shape[0], shape[1]); ++i) v[static_cast<std::size_t>(i * shape[1] + i)] = gain;
    return from_host(v, shape, dtype, device);
  }
  const std::uint64_t s = seed ? *seed : unseeded_seed ? *unseeded_seed : detail::next_seed();
  if (class_name == "RandomNormal") return Tensor::random_normal(shape, mean, stddev, s, dtype, device);
  if (class_name == "RandomUniform") return Tensor::random_uniform(shape, minval, maxval, s, dtype, device);
  if (class_name == "TruncatedNormal") {
    const Tensor x = ops::mul(truncated_standard(shape, s, device), Tensor::scalar(stddev, float32, device));
    return ops::add(x, Tensor::scalar(mean, float32, device)).to(dtype);
  }
  if (class_name == "Orthogonal") return orthogonal(*this, shape, dtype, s, device);
  // The VarianceScaling family, as Keras's __call__.
  const auto [fan_in, fan_out] = compute_fans(shape, input_axes, output_axes);
  double sc = scale;
  if (mode == "fan_in") sc /= std::max(1.0, fan_in);
  else if (mode == "fan_out") sc /= std::max(1.0, fan_out);
  else sc /= std::max(1.0, (fan_in + fan_out) / 2.0);
  if (distribution == "truncated_normal") {
    const double sd = std::sqrt(sc) / 0.87962566103423978;
    return ops::mul(truncated_standard(shape, s, device), Tensor::scalar(sd, float32, device)).to(dtype);
  }
  if (distribution == "untruncated_normal") return Tensor::random_normal(shape, 0.0, std::sqrt(sc), s, dtype, device);
  const double limit = std::sqrt(3.0 * sc);
  return Tensor::random_uniform(shape, -limit, limit, s, dtype, device);
}

nlohmann::json Initializer::get_config() const {
  const std::string cls = saved_class(*this);
  if (cls == "Zeros" || cls == "Ones") return nlohmann::json::object();
  if (cls == "Constant") return {{"value", value}};
  if (cls == "Identity") return gain == 1.0 ? nlohmann::json::object() : nlohmann::json{{"gain", gain}};
  if (cls == "RandomNormal" || cls == "TruncatedNormal")
    return {{"seed", seed_json(seed)}, {"mean", mean}, {"stddev", stddev}};
  if (cls == "RandomUniform") return {{"seed", seed_json(seed)}, {"minval", minval}, {"maxval", maxval}};
  if (cls == "Orthogonal") return {{"seed", seed_json(seed)}, {"gain", gain}};
  if (cls == "VarianceScaling")
    return {{"seed", seed_json(seed)}, {"scale", scale},
            {"mode", mode},            {"distribution", distribution},
            {"input_axes", axes_json(input_axes)}, {"output_axes", axes_json(output_axes)}};
  return {{"seed", seed_json(seed)}, {"input_axes", axes_json(input_axes)}, {"output_axes", axes_json(output_axes)}};
}

Initializer RandomNormal(RandomNormalOptions o) {
  Initializer i = make("RandomNormal");
  i.mean = o.mean, i.stddev = o.stddev, i.seed = o.seed;
  i.check();
  return i;
}

Initializer TruncatedNormal(RandomNormalOptions o) {
  Initializer i = make("TruncatedNormal");
  i.mean = o.mean, i.stddev = o.stddev, i.seed = o.seed;
  i.check();
  return i;
}

Initializer RandomUniform(RandomUniformOptions o) {
  Initializer i = make("RandomUniform");
  i.minval = o.minval, i.maxval = o.maxval, i.seed = o.seed;
  i.check();
  return i;
}

Initializer Zeros() { return make("Zeros"); }
Initializer Ones() { return make("Ones"); }

Initializer Constant(double value) {
  Initializer i = make("Constant");
  i.value = value;
  i.check();
  return i;
}

Initializer VarianceScaling(VarianceScalingOptions o) {
  Initializer i = make("VarianceScaling");
  i.scale = o.scale, i.mode = o.mode, i.seed = o.seed;
  i.distribution = o.distribution == "normal" ? "truncated_normal" : o.distribution;  // as Keras
  i.input_axes = std::move(o.input_axes), i.output_axes = std::move(o.output_axes);
  i.check();
  return i;
}

namespace {
Initializer named_form(const char* cls, SeedOptions o) {
  Initializer i = make(cls);
  i.seed = o.seed, i.input_axes = std::move(o.input_axes), i.output_axes = std::move(o.output_axes);
  return i;
}
}  // namespace

Initializer GlorotNormal(SeedOptions o) { return named_form("GlorotNormal", std::move(o)); }
Initializer GlorotUniform(SeedOptions o) { return named_form("GlorotUniform", std::move(o)); }
Initializer HeNormal(SeedOptions o) { return named_form("HeNormal", std::move(o)); }
Initializer HeUniform(SeedOptions o) { return named_form("HeUniform", std::move(o)); }
Initializer LecunNormal(SeedOptions o) { return named_form("LecunNormal", std::move(o)); }
Initializer LecunUniform(SeedOptions o) { return named_form("LecunUniform", std::move(o)); }

Initializer Orthogonal(OrthogonalOptions o) {
  Initializer i = make("Orthogonal");
  i.gain = o.gain, i.seed = o.seed;
  i.check();
  return i;
}

Initializer Identity(double gain) {
  Initializer i = make("Identity");
  i.gain = gain;
  i.check();
  return i;
}

nlohmann::json serialize(const Initializer& i) {
  i.check();
  return {{"module", "keras.initializers"},
          {"class_name", saved_class(i)},
          {"config", i.get_config()},
          {"registered_name", nullptr}};
}

Initializer deserialize(const nlohmann::json& v, const std::string& where) {
  if (v.is_string()) {  // Keras's initializers.get("he_uniform")
    const std::string name = v.get<std::string>();
    MPT_CHECK(!class_of(name).empty(), where, ": unknown initializer '", name, "'; valid: ", kValid);
    return Initializer(name);
  }
  MPT_CHECK(v.is_object(), where, ": expected an initializer name or object, got ", v.dump());
  const std::string given = io::as_string(io::at(v, "class_name", where), where + ", class_name");
  if (const nlohmann::json* m = io::find(v, "module"); m && !m->is_null())
    MPT_CHECK(m->is_string() && *m == "keras.initializers", where, ": initializer ", given, " from module ", m->dump(),
              " is not supported (Keras's built-in initializers only)");
  if (const nlohmann::json* r = io::find(v, "registered_name"); r && !r->is_null())
    MPT_CHECK(r->is_string() && *r == given, where, ": initializer ", given, " registered as ", r->dump(),
              " is not supported (Keras's built-in initializers only)");
  const std::string cls = class_of(given);
  MPT_CHECK(!cls.empty(), where, ": initializer class '", given, "' is not supported; valid: ", kValid);
  const nlohmann::json* c = io::find(v, "config");
  MPT_CHECK(!c || c->is_null() || c->is_object(), where, ": initializer ", given, " config must be an object, got ",
            c->dump());
  const nlohmann::json cfg = c && c->is_object() ? *c : nlohmann::json::object();
  const std::string who = where + ": initializer " + given;
  Initializer i = make(cls);
  auto number = [&](const char* key, double& out) {
    if (const nlohmann::json* x = io::find(cfg, key); x && !x->is_null()) out = io::as_double(*x, who + ", " + key);
  };
  auto text = [&](const char* key, std::string& out) {
    if (const nlohmann::json* x = io::find(cfg, key); x && !x->is_null()) out = io::as_string(*x, who + ", " + key);
  };
  auto axes = [&](const char* key, Axes& out) {
    if (const nlohmann::json* x = io::find(cfg, key); x && !x->is_null()) {
      std::vector<std::int64_t> a;
      for (const auto& e : io::as_array(*x, who + ", " + key)) a.push_back(io::as_int(e, who + ", " + key));
      out = std::move(a);
    }
  };
  if (const nlohmann::json* s = io::find(cfg, "seed"); s && !s->is_null()) {
    MPT_CHECK(s->is_number(), who, ": seed = ", s->dump(), " is not supported (an integer seed or null)");
    i.seed = io::as_uint(*s, who + ", seed");
  }
  if (cls == "Zeros" || cls == "Ones") {
    io::check_fields(cfg, {}, nlohmann::json::object(), who);
  } else if (cls == "Constant") {
    io::check_fields(cfg, {"value"}, nlohmann::json::object(), who);
    number("value", i.value);
  } else if (cls == "Identity") {
    io::check_fields(cfg, {"gain"}, nlohmann::json::object(), who);
    number("gain", i.gain);
  } else if (cls == "RandomNormal" || cls == "TruncatedNormal") {
    io::check_fields(cfg, {"seed", "mean", "stddev"}, nlohmann::json::object(), who);
    number("mean", i.mean);
    number("stddev", i.stddev);
  } else if (cls == "RandomUniform") {
    io::check_fields(cfg, {"seed", "minval", "maxval"}, nlohmann::json::object(), who);
    number("minval", i.minval);
    number("maxval", i.maxval);
  } else if (cls == "Orthogonal") {
    io::check_fields(cfg, {"seed", "gain"}, nlohmann::json::object(), who);
    number("gain", i.gain);
  } else if (cls == "VarianceScaling") {
    io::check_fields(cfg, {"seed", "scale", "mode", "distribution", "input_axes", "output_axes"},
                     nlohmann::json::object(), who);
    number("scale", i.scale);
    text("mode", i.mode);
    text("distribution", i.distribution);
    std::transform(i.distribution.begin(), i.distribution.end(), i.distribution.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    if (i.distribution == "normal") i.distribution = "truncated_normal";  // as Keras
  } else {  // the named forms
    io::check_fields(cfg, {"seed", "input_axes", "output_axes"}, nlohmann::json::object(), who);
  }
  if (variance_family(cls)) {
    axes("input_axes", i.input_axes);
    axes("output_axes", i.output_axes);
  }
  try {
    i.check();
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  return i;
}

}  // namespace mpt::initializers

namespace mpt {

Tensor initialize(const std::string& initializer, const Shape& shape, DType dtype, std::uint64_t seed) {
  return initializers::Initializer(initializer)(shape, dtype, seed);
}

}  // namespace mpt
