#include "mpt/nn_ops.hpp"
#include "ops/ops_common.hpp"
#include "ops/spatial.hpp"

namespace mpt::ops {
using namespace detail;

namespace {

std::string size2(const IntPair& s) { return std::to_string(s[0]) + "x" + std::to_string(s[1]); }

/// The smallest window and leading padding that cover the same input pixels for every output
/// (padding never counts: max ignores it, avg leaves it out), so huge 'same' windows cost
/// nothing and their positions fit the kernels' counters. n: input size, m: outputs.
void tighten(std::int64_t n, std::int64_t m, std::int64_t stride, std::int64_t& pool, std::int64_t& pad_lo) {
  const std::int64_t last_start = (m - 1) * stride;  // < n: no overflow
  if (last_start <= pad_lo) {  // every window starts at or before pixel 0: start the last one there
    pool -= pad_lo - last_start;
    pad_lo = last_start;
  }
  pool = std::min(pool, n + pad_lo);  // windows never reach past the input's end
}

Tensor pool(const char* name, PoolKind kind, const Tensor& x, IntPair size, const Pool2dOptions& o) {
  check_floating(name, x);
  MPT_CHECK(x.dim() == 4, name, ": input must be 4-d [batch, height, width, channels], got ", describe(x));
  const IntPair strides = o.strides.value_or(size);
  MPT_CHECK(size[0] >= 1 && size[1] >= 1, name, ": pool size must be positive, got ", size2(size));
  MPT_CHECK(strides[0] >= 1 && strides[1] >= 1, name, ": strides must be positive, got ", size2(strides));
  const bool same = parse_padding(name, o.padding);
  const Shape& s = x.shape();
  MPT_CHECK(same || (size[0] <= s[1] && size[1] <= s[2]), name, ": pool size ", size2(size),
            " is larger than the input ", size2({s[1], s[2]}), " with 'valid' padding (input ", describe(x), ")");
  const SpatialAxis h = spatial_axis(s[1], size[0], strides[0], same), w = spatial_axis(s[2], size[1], strides[1], same);
  Pool2dGeometry g;
  g.kind = kind;
  g.pool_h = size[0], g.pool_w = size[1], g.stride_h = strides[0], g.stride_w = strides[1];
  g.pad_top = h.pad_lo, g.pad_bottom = h.pad_hi, g.pad_left = w.pad_lo, g.pad_right = w.pad_hi;
  if (h.out > 0 && w.out > 0) {
    tighten(s[1], h.out, g.stride_h, g.pool_h, g.pad_top);
    tighten(s[2], w.out, g.stride_w, g.pool_w, g.pad_left);
    g.pad_bottom = std::max<std::int64_t>(0, (h.out - 1) * g.stride_h + g.pool_h - s[1] - g.pad_top);
    g.pad_right = std::max<std::int64_t>(0, (w.out - 1) * g.stride_w + g.pool_w - s[2] - g.pad_left);
  }
  // Max pooling remembers the window position of each maximum in 16 bits.
  MPT_CHECK(kind != PoolKind::Max || g.pool_h * g.pool_w <= 65536, name, ": pool size ", size2(size),
            " has more than 65536 positions per window over input ", describe(x), " (at most 256x256 are supported)");
  Tensor out = Tensor::empty({s[0], h.out, w.out, s[3]}, x.dtype(), x.device());
  Tensor workspace;
  const bool training = autograd::is_recording() && x.requires_grad();
  backend_of(x).pool2d(x, g, training, out, workspace);
  autograd::record(name, {x}, {&out}, [x = x.detach(), y = out.detach(), workspace, g](const std::vector<Tensor>& gr) {
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    backend_of(x).pool2d_backward(x, y, gr[0], workspace, g, dx);
    return std::vector<Tensor>{dx};
  });
  return out;
}

}  // namespace

Tensor max_pool2d(const Tensor& x, IntPair pool_size, Pool2dOptions o) {
  return pool("max_pool2d", PoolKind::Max, x, pool_size, o);
}

Tensor avg_pool2d(const Tensor& x, IntPair pool_size, Pool2dOptions o) {
  return pool("avg_pool2d", PoolKind::Avg, x, pool_size, o);
}

Tensor global_avg_pool2d(const Tensor& x, bool keepdims) {
  check_floating("global_avg_pool2d", x);
  MPT_CHECK(x.dim() == 4, "global_avg_pool2d: input must be 4-d [batch, height, width, channels], got ", describe(x));
  MPT_CHECK(x.shape()[1] > 0 && x.shape()[2] > 0, "global_avg_pool2d: empty image in ", describe(x));
  return mean(x, {1, 2}, keepdims);
}

}  // namespace mpt::ops
