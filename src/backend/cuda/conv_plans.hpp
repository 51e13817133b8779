#pragma once
/// cuDNN graph-API plans for the CUDA convolutions (the twin of src/backend/cpu/conv_plans.*):
/// one operation graph per pass (conv_fprop, optionally + bias add + activation; conv_bwd_data;
/// conv_bwd_filter) over mpt's NHWC tensors, described to cuDNN through the backend C API of
/// cudnn_graph.h (no cudnn-frontend; shared machinery in cudnn_graph.hpp), and the execution
/// plans cuDNN finalizes for it.
///
/// Plans are built for a PlanTarget: a cuDNN handle (the GPU conv.cpp runs on) or a device
/// description (CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR from a JSON text, cuDNN >= 9.8 at run time),
/// which needs no GPU and no handle. The same graph code serves both, so
/// tests/cuda/test_cuda_conv_plans.cpp proves on a machine without a GPU that cuDNN plans every
/// convolution of the models for an H100 (tests/data/cuda/h100_sm90.json).
///
///   ConvKey k = conv_key(ConvPass::Forward, x.shape(), w.shape(), y.shape(), g, bfloat16);
///   int n = plan_count(k, read_file("h100_sm90.json"));   // execution plans that finalize
#include <cudnn_graph.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/cudnn_graph.hpp"

namespace mpt::cuda::conv {

enum class ConvPass : std::uint8_t { Forward, BackwardData, BackwardFilter };
const char* pass_name(ConvPass p);

/// Everything a plan depends on: the problem x [n, h, w, cin] * w [kh, kw, cin / groups, cout]
/// -> y [n, oh, ow, cout], the pass, dtypes, the fused epilogue (forward only), the weight layout
/// and the pointer alignment promised to cuDNN. The device is part of conv.cpp's cache key.
struct ConvKey {
  ConvPass pass = ConvPass::Forward;
  std::int64_t n = 0, h = 0, w = 0, cin = 0, oh = 0, ow = 0, cout = 0, kh = 0, kw = 0;
  std::int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  std::int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  /// Grouped convolution: cuDNN takes it from the filter's C dimension (cin / groups against
  /// x's cin), no attribute of the convolution descriptor.
  std::int64_t groups = 1;
  DType dtype = DType::Float32;    ///< x, w, y (forward); dy, w, dx (data); x, dy (filter)
  DType dw_dtype = DType::Float32; ///< backward filter: dw's dtype (float32 for 16-bit x allowed)
  bool bias = false;               ///< forward: bias add fused into the graph
  DType bias_dtype = DType::Float32;
  Activation act = Activation::Linear;  ///< forward: an activation cudnn_pointwise maps, fused into the graph
  bool allow_tf32 = false;         ///< float32: tensor-core (TF32) engines allowed
  /// Only engines without cuDNN's CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC (mpt::cuda::cudnn_deterministic()).
  bool deterministic = true;
  std::int64_t alignment = 16;     ///< bytes every data pointer is aligned to (power of two)
  bool operator==(const ConvKey&) const = default;
};

ConvKey conv_key(ConvPass pass, const Shape& x, const Shape& w, const Shape& y, const Conv2dGeometry& g,
                 DType dtype);
/// "fprop bfloat16 x[128,32,32,3] w[3,3,3,32] y[...] s1,1 d1,1 p1,1,1,1 +bias relu" for messages.
std::string describe(const ConvKey& k);
/// cuDNN's pointwise mode for an activation fused into a forward graph; false where cuDNN has
/// none the backend uses (conv2d then applies unary() after the graph).
bool cudnn_pointwise(Activation act, cudnnPointwiseMode_t& mode);
std::size_t hash_of(const ConvKey& k);
struct ConvKeyHash {
  std::size_t operator()(const ConvKey& k) const { return hash_of(k); }
};

/// Uids of the graph's tensors in the variant pack: x or dx, w or dw, y or dy, bias.
enum : std::int64_t { kUidX = 1, kUidW = 2, kUidY = 3, kUidBias = 4 };

// The shared cuDNN graph machinery (cudnn_graph.hpp), under the names the convolutions use.
using cudnn::Descriptor;
using cudnn::device_properties;
using cudnn::kDevicePropVersion;
using cudnn::PlanTarget;
using cudnn::runtime_version;
using cudnn::serialize_device_properties;
using cudnn::version_string;
using ConvGraph = cudnn::Graph;
using ConvPlan = cudnn::Plan;

/// Builds k's operation graph and finalizes execution plans for the engine configurations
/// cuDNN's heuristics (mode A, then fallback) propose, in their order, stopping after
/// max_plans (0: all). Empty when cuDNN supports the graph on no engine (a fused graph it
/// cannot fuse, a dtype the device lacks); other cuDNN errors throw mpt::Error naming `op`.
/// float32 without allow_tf32 skips engines that round inputs to TF32; k.deterministic skips
/// engines cuDNN notes as nondeterministic.
std::vector<ConvPlan> build_plans(const ConvKey& k, const PlanTarget& target, int max_plans,
                                  const char* op = "conv2d");

/// Device-less planning: how many execution plans finalize for k on the device that
/// device_json describes.
int plan_count(const ConvKey& k, const std::string& device_json);

}  // namespace mpt::cuda::conv
