// The CUDA convolutions' cuDNN graphs planned without a GPU (src/backend/cuda/conv_plans.hpp):
// for every convolution of models B and C (bench/bench_gpu.cpp, bench/bench_conv.cpp,
// examples/fashion_mnist_cnn.cpp) and examples/resnet_cifar.cpp, at the batch sizes they use,
// cuDNN 9 builds the forward, backward-data and backward-filter graphs in float32, float16 and
// bfloat16 and finalizes at least one execution plan for an H100 SXM described by
// tests/data/cuda/h100_sm90.json (cuDNN's own serialization of an H100 80GB HBM3, written by
// `cuda_versions --device-json` on the GPU machine on 2026-11-26; a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR from JSON: no handle, no
// GPU). Negative control: bfloat16 on an sm_75 (T4) description gets no plan (cuDNN's bfloat16
// needs compute capability 8.0).
//
// The checks hold for any cuDNN >= 9.8 (device descriptions need 9.8: on an older runtime the
// tests say so and check only that device_properties reports it): "at least one plan", and
// counts compared only where one filter admits a superset of another's engines. How many
// engines a version has, and which it ranks first, are reported (MESSAGE, WARN), not asserted.
#include <cudnn_graph.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/conv_plans.hpp"
#include "cuda/device_descriptions.hpp"

using namespace mpt;
using namespace mpt::test;
using namespace mpt::cuda::conv;

namespace {


/// True when the cuDNN loaded has device descriptions (>= 9.8). Otherwise says so, checks that
/// device_properties throws an mpt::Error naming the runtime, and the caller skips its checks.
bool have_device_descriptions() {
  const std::size_t v = runtime_version();
  if (v >= kDevicePropVersion) return true;
  MESSAGE("cuDNN ", version_string(v), " loaded (< 9.8): no device descriptions, description-based checks skipped");
  const std::string err = error_of([] { device_properties(h100()); });
  CHECK(contains(err, "9.8"));
  CHECK(contains(err, version_string(v)));
  return false;
}

/// The numerical notes of the engine a plan runs, read back from the plan through cuDNN: the
/// plan's engine configuration, that configuration's engine, the engine's notes.
std::vector<cudnnBackendNumericalNote_t> engine_notes(const ConvPlan& p) {
  Descriptor cfg(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "test: engine config");
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "test: engine");
  cudnnBackendDescriptor_t c = cfg.get(), e = engine.get();
  std::int64_t n = 0;
  REQUIRE(cudnnBackendGetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &c) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnBackendGetAttribute(c, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e) ==
          CUDNN_STATUS_SUCCESS);
  std::vector<cudnnBackendNumericalNote_t> notes(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  REQUIRE(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                   static_cast<std::int64_t>(notes.size()), &n, notes.data()) == CUDNN_STATUS_SUCCESS);
  notes.resize(static_cast<std::size_t>(n));
  return notes;
}

/// How many of the plans run an engine noted `note`.
int count_noted(const std::vector<ConvPlan>& plans, cudnnBackendNumericalNote_t note) {
  int count = 0;
  for (const ConvPlan& p : plans) {
    const auto notes = engine_notes(p);
    count += std::find(notes.begin(), notes.end(), note) != notes.end();
  }
  return count;
}

/// One Conv2D as a model creates it: Keras 'same' (output ceil(in / stride), the odd padding row
/// at the bottom/right) or 'valid', as src/ops/conv.cpp computes it.
struct ConvLayer {
  const char* where;
  std::int64_t n, h, w, cin, cout, k, stride;
  bool same;
  std::int64_t dilation = 1;
  bool bias = false;
  Activation act = Activation::Linear;
  std::int64_t groups = 1;  ///< grouped (Conv2D groups) or depthwise (groups == cin)
};

struct Problem {
  Shape x, w, y;
  Conv2dGeometry g;
};

Problem problem(const ConvLayer& l) {
  Problem p;
  const std::int64_t eff = (l.k - 1) * l.dilation + 1;
  auto axis = [&](std::int64_t in, std::int64_t& out, std::int64_t& lo, std::int64_t& hi) {
    if (l.same) {
      out = (in + l.stride - 1) / l.stride;
      const std::int64_t total = std::max<std::int64_t>((out - 1) * l.stride + eff - in, 0);
      lo = total / 2, hi = total - lo;
    } else {
      out = (in - eff) / l.stride + 1, lo = hi = 0;
    }
  };
  std::int64_t oh, ow;
  axis(l.h, oh, p.g.pad_top, p.g.pad_bottom);
  axis(l.w, ow, p.g.pad_left, p.g.pad_right);
  p.g.stride_h = p.g.stride_w = l.stride;
  p.g.dilation_h = p.g.dilation_w = l.dilation;
  p.g.groups = l.groups;
  p.x = {l.n, l.h, l.w, l.cin};
  p.w = {l.k, l.k, l.cin / l.groups, l.cout};
  p.y = {l.n, oh, ow, l.cout};
  return p;
}

/// Every distinct convolution of the models, at each batch size they run.
std::vector<ConvLayer> model_layers() {
  std::vector<ConvLayer> out;
  const Activation relu = Activation::Relu;
  // Model C (Fashion-MNIST CNN): 28x28x1, Conv 32 3x3 relu, pool, Conv 64 3x3 relu ('valid', bias).
  // Batch 128 (fashion_mnist_cnn, bench_conv), 1024 (bench_gpu), 512 (evaluate).
  for (std::int64_t n : {128, 512, 1024}) {
    out.push_back({"C conv1", n, 28, 28, 1, 32, 3, 1, false, 1, true, relu});
    out.push_back({"C conv2", n, 13, 13, 32, 64, 3, 1, false, 1, true, relu});
  }
  // Model B of bench_gpu (CIFAR CNN): 32x32x3, Conv 32 3x3 relu, pool, Conv 64 3x3 relu.
  for (std::int64_t n : {128, 1024}) {
    out.push_back({"B(gpu) conv1", n, 32, 32, 3, 32, 3, 1, false, 1, true, relu});
    out.push_back({"B(gpu) conv2", n, 15, 15, 32, 64, 3, 1, false, 1, true, relu});
  }
  // Model B of bench_conv and resnet_cifar (small ResNets, 'same', no bias; BN follows): the
  // stem, 32-channel blocks, the stride-2 3x3 (asymmetric 'same': 0 rows above, 1 below), its
  // 1x1 stride-2 shortcut (resnet_cifar) and the 64-channel blocks at 16x16. Batch 128 (fit),
  // 256 (resnet_cifar's evaluate) and 20 (the last, partial batch of 4500 training images).
  for (std::int64_t n : {128, 256, 20}) {
    out.push_back({"ResNet stem", n, 32, 32, 3, 32, 3, 1, true});
    out.push_back({"ResNet block32", n, 32, 32, 32, 32, 3, 1, true});
    out.push_back({"ResNet down 3x3/2", n, 32, 32, 32, 64, 3, 2, true});
    out.push_back({"ResNet shortcut 1x1/2", n, 32, 32, 32, 64, 1, 2, true});
    out.push_back({"ResNet block64", n, 16, 16, 64, 64, 3, 1, true});
  }
  // Conv2D's dilation_rate: a dilated 'same' 3x3 (rate 2) on the 32-channel blocks' shape.
  out.push_back({"dilated 3x3 rate 2", 128, 32, 32, 32, 32, 3, 1, true, 2});
  return out;
}

const DType kDtypes[] = {float32, float16, bfloat16};
const ConvPass kPasses[] = {ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter};

ConvKey key_of(const ConvLayer& l, ConvPass pass, DType d) {
  const Problem p = problem(l);
  return conv_key(pass, p.x, p.w, p.y, p.g, d);
}

}  // namespace

TEST_CASE("cuda conv plans: cuDNN versions") {
  CHECK(version_string(91900) == "9.19.0");
  CHECK(version_string(90801) == "9.8.1");
  const std::size_t v = runtime_version();
  MESSAGE("cuDNN ", version_string(v), " loaded, ", version_string(CUDNN_VERSION), " headers");
  CHECK(v / 10000 == CUDNN_MAJOR);  // libcudnn.so.9: the same major version
}

TEST_CASE("cuda conv plans: the H100 description loads and round-trips through cuDNN") {
  if (!have_device_descriptions()) return;
  const auto props = device_properties(h100());
  REQUIRE(props);
  CHECK(*props);
  // A description missing a key is an mpt::Error naming it (cuDNN's own message).
  const std::string err = error_of([] { device_properties(R"({"deviceName":"x"})"); });
  CHECK(contains(err, "device properties"));
  WARN(contains(err, "maxGridSize"));  // cuDNN's own message (9.19's words), passed on
}

TEST_CASE("cuda conv plans: geometry of the models' layers") {
  // The stride-2 'same' 3x3 pads 0 above and 1 below (Keras/TensorFlow), the 1x1 not at all.
  const Problem down = problem({"", 128, 32, 32, 32, 64, 3, 2, true});
  CHECK(down.y == Shape{128, 16, 16, 64});
  CHECK(down.g.pad_top == 0);
  CHECK(down.g.pad_bottom == 1);
  CHECK(down.g.pad_left == 0);
  CHECK(down.g.pad_right == 1);
  const Problem sc = problem({"", 128, 32, 32, 32, 64, 1, 2, true});
  CHECK(sc.y == Shape{128, 16, 16, 64});
  CHECK(sc.g.pad_top + sc.g.pad_bottom + sc.g.pad_left + sc.g.pad_right == 0);
  const Problem c2 = problem({"", 128, 13, 13, 32, 64, 3, 1, false});
  CHECK(c2.y == Shape{128, 11, 11, 64});
}

TEST_CASE("cuda conv plans: every convolution of models B, C and resnet_cifar plans on an H100") {
  if (!have_device_descriptions()) return;
  const PlanTarget target{nullptr, device_properties(h100())};
  int graphs = 0, min_count = 1 << 30;
  for (const ConvLayer& l : model_layers())
    for (DType d : kDtypes)
      for (ConvPass pass : kPasses) {
        ConvKey k = key_of(l, pass, d);
        const int n = static_cast<int>(build_plans(k, target, 0).size());
        MESSAGE(std::string(l.where), ": ", describe(k), ": ", n, " plans");
        CHECK_MESSAGE(n >= 1, std::string(l.where), ": ", describe(k));
        // The graph conv.cpp runs for the layer's forward: bias and activation fused.
        if (pass == ConvPass::Forward && (l.bias || l.act != Activation::Linear)) {
          k.bias = l.bias;
          k.act = l.act;
          const int f = static_cast<int>(build_plans(k, target, 0).size());
          MESSAGE(std::string(l.where), ": ", describe(k), ": ", f, " plans");
          if (d != float32) CHECK_MESSAGE(f >= 1, std::string(l.where), ": fused ", describe(k));
          ++graphs;
        }
        min_count = std::min(min_count, n);
        ++graphs;
      }
  MESSAGE(graphs, " graphs planned; fewest plans for one: ", min_count);
}

TEST_CASE("cuda conv plans: grouped and depthwise convolutions plan on an H100") {
  // Conv2D(groups) and DepthwiseConv2D: the filter's C is cin / groups (conv_plans.cpp, filter()),
  // every pass in every dtype, and the forward with its bias + ReLU fused where cuDNN fuses it.
  if (!have_device_descriptions()) return;
  const PlanTarget target{nullptr, device_properties(h100())};
  const Activation relu = Activation::Relu;
  const std::vector<ConvLayer> layers = {
      {"depthwise 3x3 (MobileNet block)", 128, 32, 32, 32, 32, 3, 1, true, 1, true, relu, 32},
      {"depthwise 3x3/2", 128, 32, 32, 32, 32, 3, 2, true, 1, false, Activation::Linear, 32},
      {"depthwise 3x3 multiplier 2", 64, 16, 16, 16, 32, 3, 1, false, 1, true, relu, 16},
      {"grouped 3x3, 4 groups", 128, 16, 16, 64, 64, 3, 1, true, 1, true, relu, 4},
      {"grouped 1x1, 2 groups", 128, 16, 16, 64, 128, 1, 1, false, 1, false, Activation::Linear, 2},
  };
  for (const ConvLayer& l : layers)
    for (DType d : kDtypes)
      for (ConvPass pass : kPasses) {
        ConvKey k = key_of(l, pass, d);
        CHECK(k.groups == l.groups);
        REQUIRE(describe(k).find(" groups " + std::to_string(l.groups)) != std::string::npos);
        const int n = static_cast<int>(build_plans(k, target, 0).size());
        MESSAGE(std::string(l.where), ": ", describe(k), ": ", n, " plans");
        CHECK_MESSAGE(n >= 1, std::string(l.where), ": ", describe(k));
        if (pass == ConvPass::Forward && l.bias) {
          k.bias = true;
          k.act = l.act;
          const int f = static_cast<int>(build_plans(k, target, 0).size());
          // Reported: where cuDNN has no fused engine, conv.cpp runs conv, then bias and activation.
          MESSAGE(std::string(l.where), ": fused ", describe(k), ": ", f, " plans");
        }
      }
  // The group count is part of the key: a grouped problem never finds an ungrouped plan.
  const ConvLayer plain{"plain", 128, 32, 32, 32, 32, 3, 1, true};
  ConvLayer grouped = plain;
  grouped.groups = 32;
  const ConvKey a = key_of(plain, ConvPass::Forward, float16), b = key_of(grouped, ConvPass::Forward, float16);
  CHECK_FALSE(a == b);
  CHECK(hash_of(a) != hash_of(b));
}

TEST_CASE("cuda conv plans: fused bias + ReLU forward graphs plan in 16-bit") {
  if (!have_device_descriptions()) return;
  const PlanTarget target{nullptr, device_properties(h100())};
  for (DType d : {float16, bfloat16}) {
    // Every activation cuDNN fuses (cudnn_pointwise); the others run as unary() after the graph.
    std::vector<Activation> fused;
    common::for_each_unary_op([&](auto o) {
      cudnnPointwiseMode_t mode{};
      if (cudnn_pointwise(o, mode)) fused.push_back(o);
    });
    CHECK(fused.size() == 3);  // relu, sigmoid, tanh
    for (Activation act : fused) {
      ConvKey k = key_of({"C conv2", 128, 13, 13, 32, 64, 3, 1, false}, ConvPass::Forward, d);
      k.bias = true;
      k.bias_dtype = d;
      k.act = act;
      const int n = static_cast<int>(build_plans(k, target, 0).size());
      MESSAGE(describe(k), ": ", n, " plans");
      if (act == Activation::Relu) CHECK(n >= 1);
    }
    // Bias alone plans; an activation without a bias add does not (cuDNN 9.19's runtime-fusion
    // engines want conv -> add -> activation), so conv.cpp runs that one as conv + unary().
    ConvKey b = key_of({"B(gpu) conv2", 1024, 15, 15, 32, 64, 3, 1, false}, ConvPass::Forward, d);
    b.bias = true;
    const int nb = static_cast<int>(build_plans(b, target, 0).size());
    MESSAGE(describe(b), ": ", nb, " plans");
    CHECK(nb >= 1);
    ConvKey r = key_of({"ResNet block32", 128, 32, 32, 32, 32, 3, 1, true}, ConvPass::Forward, d);
    r.act = Activation::Relu;
    const int nr = static_cast<int>(build_plans(r, target, 0).size());
    MESSAGE(describe(r), ": ", nr, " plans (conv.cpp falls back to conv + unary)");
  }
}

TEST_CASE("cuda conv plans: 16-bit weight gradients into a float32 dw (reported), and float64") {
  if (!have_device_descriptions()) return;
  const PlanTarget target{nullptr, device_properties(h100())};
  for (DType d : {float16, bfloat16}) {
    ConvKey k = key_of({"ResNet block32", 128, 32, 32, 32, 32, 3, 1, true}, ConvPass::BackwardFilter, d);
    k.dw_dtype = float32;
    const int n = static_cast<int>(build_plans(k, target, 0).size());
    // cuDNN 9.19 has no engine for this mix: conv.cpp stages x and dy in float32 instead.
    MESSAGE(describe(k), ": ", n, " plans");
  }
  for (ConvPass pass : kPasses) {
    const ConvKey k = key_of({"ResNet down 3x3/2", 128, 32, 32, 32, 64, 3, 2, true}, pass, float64);
    const int n = static_cast<int>(build_plans(k, target, 0).size());
    MESSAGE(describe(k), ": ", n, " plans");
    CHECK(n >= 1);
  }
}

// Not tested here, and not done: describing mpt's [kh, kw, Cin, Cout] weights to cuDNN in place
// by their strides. cuDNN 9.19 plans that description as it plans a KRSC copy, and then on an H100
// computes as if the weights were KRSC (every convolution of test_conv_ops wrong on cuda:0,
// 2026-11-26): a plan that finalizes proves nothing about the layout its kernels read. conv.cpp
// passes a KRSC copy, and only the GPU run of test_conv_ops can check the numbers.

TEST_CASE("cuda conv plans: a plan owns the engine config, graph and description it refers to") {
  if (!have_device_descriptions()) return;
  const ConvKey k = key_of({"ResNet block32", 128, 32, 32, 32, 32, 3, 1, true}, ConvPass::BackwardData, bfloat16);
  std::vector<ConvPlan> plans;
  std::weak_ptr<const Descriptor> description;
  {
    const PlanTarget target{nullptr, device_properties(h100())};
    description = target.device_prop;
    plans = build_plans(k, target, 0);
  }  // the caller's description, and build_plans' graph and engine configs, are out of scope
  REQUIRE(plans.size() >= 1);
  CHECK(!description.expired());  // held through the plans' graph
  for (const ConvPlan& p : plans) {
    CHECK(p.config);
    CHECK(p.graph == plans[0].graph);  // one graph, shared
    std::int64_t n = 0, workspace = -1;
    CHECK(cudnnBackendGetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                   &workspace) == CUDNN_STATUS_SUCCESS);
    CHECK(workspace == p.workspace);
    CHECK(engine_notes(p).size() <= CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  }
  plans.clear();
  CHECK(description.expired());  // and released with the last plan
}

TEST_CASE("cuda conv plans: strict float32 leaves out TF32 engines") {
  if (!have_device_descriptions()) return;
  const PlanTarget target{nullptr, device_properties(h100())};
  ConvKey k = key_of({"ResNet block32", 128, 32, 32, 32, 32, 3, 1, true}, ConvPass::Forward, float32);
  const auto strict = build_plans(k, target, 0);
  k.allow_tf32 = true;
  const auto tf32 = build_plans(k, target, 0);
  MESSAGE("float32 fprop: ", strict.size(), " plans strict, ", tf32.size(), " with TF32 allowed");
  CHECK(strict.size() >= 1);
  CHECK(count_noted(strict, CUDNN_NUMERICAL_NOTE_TENSOR_CORE) == 0);
  CHECK(count_noted(strict, CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) == 0);
  // Allowing TF32 only removes a filter: never fewer engines. More (tensor-core engines for
  // float32) is what an H100 has with cuDNN 9.19, reported rather than asserted for every version.
  CHECK(tf32.size() >= strict.size());
  WARN(tf32.size() > strict.size());
}

TEST_CASE("cuda conv plans: deterministic engines only, unless nondeterminism is allowed") {
  if (!have_device_descriptions()) return;
  const PlanTarget target{nullptr, device_properties(h100())};
  int nondeterministic_engines = 0;
  for (const ConvLayer& l : {ConvLayer{"ResNet block32", 128, 32, 32, 32, 32, 3, 1, true},
                             ConvLayer{"C conv2", 1024, 13, 13, 32, 64, 3, 1, false}})
    for (DType d : kDtypes)
      for (ConvPass pass : kPasses) {
        ConvKey k = key_of(l, pass, d);
        REQUIRE(k.deterministic);  // the default, as mpt::cuda::cudnn_deterministic()
        const std::string what = std::string(l.where) + ": " + describe(k);
        const auto det = build_plans(k, target, 0);
        k.deterministic = false;
        const auto any = build_plans(k, target, 0);
        const int noted = count_noted(any, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
        MESSAGE(what, ": ", det.size(), " deterministic plans, ", any.size(), " in all (", noted,
                " of nondeterministic engines)");
        CHECK_MESSAGE(det.size() >= 1, what);
        CHECK(count_noted(det, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) == 0);
        CHECK(any.size() >= det.size());
        nondeterministic_engines += noted;
      }
  // Without any nondeterministic engine on offer the filter above proved nothing (cuDNN 9.19
  // offers some for float32 data and weight gradients): reported, as which engines exist is the
  // version's.
  MESSAGE(nondeterministic_engines, " plans of nondeterministic engines left out by default");
  WARN(nondeterministic_engines > 0);
}

TEST_CASE("cuda conv plans: negative control, bfloat16 on an sm_75 description plans nothing") {
  if (!have_device_descriptions()) return;
  const ConvLayer l{"ResNet block32", 128, 32, 32, 32, 32, 3, 1, true};
  for (ConvPass pass : kPasses) {
    const ConvKey bf = key_of(l, pass, bfloat16);
    const int n_t4 = plan_count(bf, kT4), n_h100 = plan_count(bf, h100());
    MESSAGE(describe(bf), ": ", n_t4, " plans on sm_75, ", n_h100, " on sm_90");
    CHECK(n_t4 == 0);
    CHECK(n_h100 >= 1);
    // float16 does plan on the T4: the description, not the graph, rules bfloat16 out.
    CHECK(plan_count(key_of(l, pass, float16), kT4) >= 1);
  }
}
