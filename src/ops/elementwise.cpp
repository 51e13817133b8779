#include <cmath>

#include "ops/ops_common.hpp"

namespace mpt::ops {
using namespace detail;

namespace {

Tensor unary(const char* name, UnaryOp op, const Tensor& x, bool floating_only = true,
             double param = 0.0) {
  check_defined(name, x);
  if (floating_only) check_floating(name, x);
  else MPT_CHECK(x.dtype() != bool_ && x.dtype() != uint8, name, ": not defined for ", describe(x));
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_of(x).unary(op, x, out, param);
  // Saves x and a detached y (a handle to y itself would keep its own node alive).
  autograd::record(name, {x}, {&out}, [op, param, x, y = out.detach()](const std::vector<Tensor>& g) {
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    backend_of(x).unary_backward(op, x, y, g[0], dx, param);
    return std::vector<Tensor>{dx};
  });
  return out;
}

Tensor binary_forward(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, DType out_dtype) {
  check_compatible(name, a, b);
  MPT_CHECK(a.dtype() != bool_ && a.dtype() != uint8, name, ": not defined for ", describe(a));
  Tensor out = Tensor::empty(broadcast_shape(name, a.shape(), b.shape()), out_dtype, a.device());
  backend_of(a).binary(op, a, b, out);
  return out;
}

/// Output in a's dtype; checked before a.dtype() is read, so an undefined a is named.
Tensor binary_forward(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  check_compatible(name, a, b);
  return binary_forward(name, op, a, b, a.dtype());
}

Tensor compare(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  return binary_forward(name, op, a, b, bool_);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("add", BinaryOp::Add, a, b);
  autograd::record("add", {a, b}, {&out}, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to(g[0], sa), sum_to(g[0], sb)};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("sub", BinaryOp::Sub, a, b);
  autograd::record("sub", {a, b}, {&out}, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to(g[0], sa), sum_to(neg(g[0]), sb)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("mul", BinaryOp::Mul, a, b);
  autograd::record("mul", {a, b}, {&out}, [a, b](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to(mul(g[0], b), a.shape()), sum_to(mul(g[0], a), b.shape())};
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("div", BinaryOp::Div, a, b);
  autograd::record("div", {a, b}, {&out}, [a, b](const std::vector<Tensor>& g) {
    Tensor ga = div(g[0], b);
    return std::vector<Tensor>{sum_to(ga, a.shape()), sum_to(neg(mul(ga, div(a, b))), b.shape())};
  });
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  check_floating("pow", a);
  Tensor out = binary_forward("pow", BinaryOp::Pow, a, b);
  autograd::record("pow", {a, b}, {&out}, [a, b, y = out.detach()](const std::vector<Tensor>& g) {
    // d/da = b a^(b-1); d/db = log(a) a^b (taken as 0 where a <= 0, as TensorFlow does)
    Tensor one = Tensor::scalar(1, a.dtype(), a.device());
    Tensor ga = mul(g[0], mul(b, pow(a, sub(b, one))));
    Tensor zero = Tensor::scalar(0, a.dtype(), a.device());
    Tensor safe_log = where(greater(a, zero), log(where(greater(a, zero), a, one)), zero);
    Tensor gb = mul(g[0], mul(safe_log, y));
    return std::vector<Tensor>{sum_to(ga, a.shape()), sum_to(gb, b.shape())};
  });
  return out;
}

Tensor pow(const Tensor& a, double exponent) {
  check_defined("pow", a);
  return pow(a, Tensor::scalar(exponent, a.dtype(), a.device()));
}

namespace {
Tensor extremum(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(name, op, a, b);
  autograd::record(name, {a, b}, {&out}, [a, b, op](const std::vector<Tensor>& g) {
    // The gradient goes to the selected operand; ties go to the first, as in TensorFlow.
    Tensor pick_a = op == BinaryOp::Maximum ? greater_equal(a, b) : less_equal(a, b);
    Tensor zero = Tensor::scalar(0, g[0].dtype(), g[0].device());
    return std::vector<Tensor>{sum_to(where(pick_a, g[0], zero), a.shape()),
                               sum_to(where(pick_a, zero, g[0]), b.shape())};
  });
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum("maximum", BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum("minimum", BinaryOp::Minimum, a, b); }

Tensor neg(const Tensor& x) { return unary("neg", UnaryOp::Neg, x, false); }
Tensor exp(const Tensor& x) { return unary("exp", UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary("log", UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return unary("sqrt", UnaryOp::Sqrt, x); }
Tensor square(const Tensor& x) { return unary("square", UnaryOp::Square, x, false); }
Tensor abs(const Tensor& x) { return unary("abs", UnaryOp::Abs, x, false); }
Tensor sign(const Tensor& x) { return unary("sign", UnaryOp::Sign, x, false); }
Tensor relu(const Tensor& x) { return unary("relu", UnaryOp::Relu, x); }
Tensor sigmoid(const Tensor& x) { return unary("sigmoid", UnaryOp::Sigmoid, x); }
Tensor tanh(const Tensor& x) { return unary("tanh", UnaryOp::Tanh, x); }
Tensor relu6(const Tensor& x) { return unary("relu6", UnaryOp::Relu6, x); }
Tensor leaky_relu(const Tensor& x, double negative_slope) {
  MPT_CHECK(std::isfinite(negative_slope), "leaky_relu: negative_slope must be finite, got ", negative_slope);
  return unary("leaky_relu", UnaryOp::LeakyRelu, x, true, negative_slope);
}
Tensor gelu(const Tensor& x, bool approximate) {
  return approximate ? unary("gelu", UnaryOp::GeluTanh, x) : unary("gelu", UnaryOp::Gelu, x);
}
Tensor silu(const Tensor& x) { return unary("silu", UnaryOp::Silu, x); }

void check_activation(const std::string& name) {
  if (name != "softmax") activation_from_name("activation", name);
}

Tensor activation(const Tensor& x, const std::string& name) {
  if (name == "softmax") return softmax(x);
  Activation act = activation_from_name("activation", name);
  if (act == Activation::Linear) return x;
  return unary(name.c_str(), act, x, true, common::unary_default_param(act));
}

Tensor equal(const Tensor& a, const Tensor& b) { return compare("equal", BinaryOp::Equal, a, b); }
Tensor not_equal(const Tensor& a, const Tensor& b) { return compare("not_equal", BinaryOp::NotEqual, a, b); }
Tensor less(const Tensor& a, const Tensor& b) { return compare("less", BinaryOp::Less, a, b); }
Tensor less_equal(const Tensor& a, const Tensor& b) { return compare("less_equal", BinaryOp::LessEqual, a, b); }
Tensor greater(const Tensor& a, const Tensor& b) { return compare("greater", BinaryOp::Greater, a, b); }
Tensor greater_equal(const Tensor& a, const Tensor& b) {
  return compare("greater_equal", BinaryOp::GreaterEqual, a, b);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined("where", cond, "condition");
  check_compatible("where", a, b);
  MPT_CHECK(cond.dtype() == bool_, "where: condition must be bool, got ", describe(cond));
  MPT_CHECK(cond.device() == a.device(), "where: condition on ", cond.device().str(), ", values on ",
            a.device().str());
  Shape s = broadcast_shape("where", broadcast_shape("where", cond.shape(), a.shape()), b.shape());
  Tensor out = Tensor::empty(s, a.dtype(), a.device());
  backend_of(a).where(cond, a, b, out);
  autograd::record("where", {a, b}, {&out}, [cond, sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
    Tensor zero = Tensor::scalar(0, g[0].dtype(), g[0].device());
    return std::vector<Tensor>{sum_to(where(cond, g[0], zero), sa), sum_to(where(cond, zero, g[0]), sb)};
  });
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", x);
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  backend_of(x).cast(x, out);
  if (is_floating(dtype) && is_floating(x.dtype()))
    autograd::record("cast", {x}, {&out}, [from = x.dtype()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{cast(g[0], from)};
    });
  return out;
}

bool has_nonfinite(const Tensor& x) {
  check_defined("has_nonfinite", x);
  return backend_of(x).has_nonfinite(x);
}

}  // namespace mpt::ops
