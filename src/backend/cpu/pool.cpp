// Max and average pooling over NHWC: oneDNN for float32 and bfloat16 (max pooling keeps oneDNN's
// workspace of argmax positions for backward), float16 through float32, float64 reference loops.
#include <omp.h>

#include <cstdio>
#include <limits>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/dnnl_util.hpp"

namespace mpt::cpu {
namespace {

using tag = dnnl::memory::format_tag;
using md_t = dnnl::memory::desc;

struct PoolDescs {
  md_t src, dst;
  dnnl::memory::dims strides, kernel, pad_l, pad_r;
  dnnl::algorithm alg;
};

PoolDescs pool_descs(const Shape& x, const Shape& y, const Pool2dGeometry& g, DType d) {
  PoolDescs p;
  p.src = md_t({x[0], x[3], x[1], x[2]}, dnnl_type(d), tag::nhwc);
  p.dst = md_t({y[0], y[3], y[1], y[2]}, dnnl_type(d), tag::nhwc);
  p.strides = {g.stride_h, g.stride_w};
  p.kernel = {g.pool_h, g.pool_w};
  p.pad_l = {g.pad_top, g.pad_left};
  p.pad_r = {g.pad_bottom, g.pad_right};
  p.alg = g.kind == PoolKind::Max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
  return p;
}

std::string pool_key(const char* kind, const Shape& x, const Shape& y, const Pool2dGeometry& g, DType d, bool training) {
  const int nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
  char key[256];
  std::snprintf(key, sizeof key, "%s|%lld,%lld,%lld,%lld,%lld,%lld|%d,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld|%d,%d,t%d",
                kind, (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3], (long long)y[1],
                (long long)y[2], static_cast<int>(g.kind), (long long)g.pool_h, (long long)g.pool_w,
                (long long)g.stride_h, (long long)g.stride_w, (long long)g.pad_top, (long long)g.pad_bottom,
                (long long)g.pad_left, (long long)g.pad_right, static_cast<int>(d), training, nthr);
  return key;
}

dnnl::pooling_forward::primitive_desc forward_pd(const PoolDescs& p, bool training) {
  dnnl::pooling_forward::desc desc(training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference,
                                   p.alg, p.src, p.dst, p.strides, p.kernel, p.pad_l, p.pad_r);
  return dnnl::pooling_forward::primitive_desc(desc, dnnl_engine());
}

struct ForwardPlan {
  dnnl::pooling_forward prim;
  md_t src, dst, workspace;
};
struct BackwardPlan {
  dnnl::pooling_backward prim;
  md_t diff_src, diff_dst, workspace;
};

PrimitiveCache<ForwardPlan>& forward_cache() {
  static PrimitiveCache<ForwardPlan> c;
  return c;
}
PrimitiveCache<BackwardPlan>& backward_cache() {
  static PrimitiveCache<BackwardPlan> c;
  return c;
}

bool needs_workspace(const Pool2dGeometry& g, bool training) { return training && g.kind == PoolKind::Max; }

void dnnl_pool_forward(const Tensor& x, const Pool2dGeometry& g, bool training, Tensor& out, Tensor& workspace) {
  training = needs_workspace(g, training);  // average pooling's training primitive is the inference one
  const std::string key = pool_key("fwd", x.shape(), out.shape(), g, x.dtype(), training);
  dnnl_call("pool2d", [&] {
    ForwardPlan& plan = forward_cache().get(key, [&] {
      PoolDescs d = pool_descs(x.shape(), out.shape(), g, x.dtype());
      auto pd = forward_pd(d, training);
      return ForwardPlan{dnnl::pooling_forward(pd), d.src, d.dst, training ? pd.workspace_desc() : md_t()};
    });
    auto& eng = dnnl_engine();
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(plan.src, eng, x.data_ptr())},
                                               {DNNL_ARG_DST, dnnl::memory(plan.dst, eng, out.data_ptr())}};
    if (training) {
      workspace = Tensor::empty({static_cast<std::int64_t>(plan.workspace.get_size())}, uint8, x.device());
      args.emplace(DNNL_ARG_WORKSPACE, dnnl::memory(plan.workspace, eng, workspace.data_ptr()));
    }
    plan.prim.execute(dnnl_stream(), args);
    dnnl_stream().wait();
  });
}

void dnnl_pool_backward(const Tensor& dy, const Tensor& workspace, const Pool2dGeometry& g, Tensor& dx) {
  const bool max = g.kind == PoolKind::Max;
  const std::string key = pool_key("bwd", dx.shape(), dy.shape(), g, dy.dtype(), max);
  dnnl_call("pool2d backward", [&] {
    BackwardPlan& plan = backward_cache().get(key, [&] {
      PoolDescs d = pool_descs(dx.shape(), dy.shape(), g, dy.dtype());
      auto hint = forward_pd(d, true);
      dnnl::pooling_backward::desc desc(d.alg, d.src, d.dst, d.strides, d.kernel, d.pad_l, d.pad_r);
      dnnl::pooling_backward::primitive_desc pd(desc, dnnl_engine(), hint);
      return BackwardPlan{dnnl::pooling_backward(pd), d.src, d.dst, max ? hint.workspace_desc() : md_t()};
    });
    auto& eng = dnnl_engine();
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DIFF_DST, dnnl::memory(plan.diff_dst, eng, dy.data_ptr())},
                                               {DNNL_ARG_DIFF_SRC, dnnl::memory(plan.diff_src, eng, dx.data_ptr())}};
    if (max) args.emplace(DNNL_ARG_WORKSPACE, dnnl::memory(plan.workspace, eng, workspace.data_ptr()));
    plan.prim.execute(dnnl_stream(), args);
    dnnl_stream().wait();
  });
}

// ---- float64 reference loops ----------------------------------------------------------------

struct Window {
  std::int64_t y0, y1, x0, x1;  // clipped to the input
};

Window window(const Pool2dGeometry& g, const Shape& x, std::int64_t oy, std::int64_t ox) {
  const std::int64_t y0 = oy * g.stride_h - g.pad_top, x0 = ox * g.stride_w - g.pad_left;
  return {std::max<std::int64_t>(y0, 0), std::min(y0 + g.pool_h, x[1]), std::max<std::int64_t>(x0, 0),
          std::min(x0 + g.pool_w, x[2])};
}

/// Calls f(n, oy, ox, window) for every output position, images in parallel.
template <class F>
void for_outputs(const Shape& x, const Shape& y, const Pool2dGeometry& g, F&& f) {
  parallel_for(y[0], 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t n = b; n < e; ++n)
      for (std::int64_t oy = 0; oy < y[1]; ++oy)
        for (std::int64_t ox = 0; ox < y[2]; ++ox) f(n, oy, ox, window(g, x, oy, ox));
  });
}

void reference_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& out) {
  const Shape& xs = x.shape();
  const std::int64_t H = xs[1], W = xs[2], C = xs[3];
  const double* X = x.data<double>();
  double* Y = out.data<double>();
  for_outputs(xs, out.shape(), g, [&](std::int64_t n, std::int64_t oy, std::int64_t ox, const Window& w) {
    double* o = Y + ((n * out.shape()[1] + oy) * out.shape()[2] + ox) * C;
    const double count = static_cast<double>((w.y1 - w.y0) * (w.x1 - w.x0));
    for (std::int64_t c = 0; c < C; ++c) {
      double acc = g.kind == PoolKind::Max ? -std::numeric_limits<double>::infinity() : 0.0;
      for (std::int64_t iy = w.y0; iy < w.y1; ++iy)
        for (std::int64_t ix = w.x0; ix < w.x1; ++ix) {
          const double v = X[((n * H + iy) * W + ix) * C + c];
          acc = g.kind == PoolKind::Max ? std::max(acc, v) : acc + v;
        }
      o[c] = g.kind == PoolKind::Max ? acc : acc / count;
    }
  });
}

void reference_backward(const Tensor& x, const Tensor& dy, const Pool2dGeometry& g, Tensor& dx) {
  const Shape& xs = x.shape();
  const std::int64_t H = xs[1], W = xs[2], C = xs[3];
  const double* X = x.data<double>();
  const double* DY = dy.data<double>();
  double* DX = dx.data<double>();
  std::fill(DX, DX + dx.numel(), 0.0);
  for_outputs(xs, dy.shape(), g, [&](std::int64_t n, std::int64_t oy, std::int64_t ox, const Window& w) {
    const double* d = DY + ((n * dy.shape()[1] + oy) * dy.shape()[2] + ox) * C;
    const double count = static_cast<double>((w.y1 - w.y0) * (w.x1 - w.x0));
    for (std::int64_t c = 0; c < C; ++c) {
      if (g.kind == PoolKind::Avg) {
        for (std::int64_t iy = w.y0; iy < w.y1; ++iy)
          for (std::int64_t ix = w.x0; ix < w.x1; ++ix) DX[((n * H + iy) * W + ix) * C + c] += d[c] / count;
        continue;
      }
      std::int64_t best = -1;  // the first maximum, as the forward found it
      for (std::int64_t iy = w.y0; iy < w.y1; ++iy)
        for (std::int64_t ix = w.x0; ix < w.x1; ++ix) {
          const std::int64_t at = ((n * H + iy) * W + ix) * C + c;
          if (best < 0 || X[at] > X[best]) best = at;
        }
      if (best >= 0) DX[best] += d[c];
    }
  });
}

}  // namespace

void CpuBackend::pool2d(const Tensor& x, const Pool2dGeometry& g, bool training, Tensor& out, Tensor& workspace) {
  if (out.numel() == 0) return;
  if (x.dtype() == float64) return reference_forward(x, g, out);
  if (x.dtype() == float16) {
    Tensor x32 = Tensor::empty(x.shape(), float32, x.device()), y32 = Tensor::empty(out.shape(), float32, x.device());
    cast(x, x32);
    dnnl_pool_forward(x32, g, training, y32, workspace);
    cast(y32, out);
    return;
  }
  dnnl_pool_forward(x, g, training, out, workspace);
}

void CpuBackend::pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& workspace,
                                 const Pool2dGeometry& g, Tensor& dx) {
  if (dx.numel() == 0) return;
  if (dy.numel() == 0) return fill(dx, 0.0);
  if (x.dtype() == float64) return reference_backward(x, dy, g, dx);
  const DType d = x.dtype() == float16 ? float32 : x.dtype();
  Tensor ws = workspace;
  if (g.kind == PoolKind::Max && !ws.defined()) {  // the forward ran without one: redo it in training mode
    Tensor xc = x.dtype() == d ? x : Tensor::empty(x.shape(), d, x.device());
    if (xc.data_ptr() != x.data_ptr()) cast(x, xc);
    Tensor yc = Tensor::empty(dy.shape(), d, x.device());
    dnnl_pool_forward(xc, g, true, yc, ws);
  }
  if (d != dy.dtype()) {
    Tensor dy32 = Tensor::empty(dy.shape(), float32, dy.device()), dx32 = Tensor::empty(dx.shape(), float32, dx.device());
    cast(dy, dy32);
    dnnl_pool_backward(dy32, ws, g, dx32);
    cast(dx32, dx);
    return;
  }
  dnnl_pool_backward(dy, ws, g, dx);
}

}  // namespace mpt::cpu
