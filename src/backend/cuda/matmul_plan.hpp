#pragma once
/// The host half of the CUDA GEMM: how a row-major mpt matmul maps onto cuBLASLt's column-major
/// one, and the cuBLASLt descriptors that say so. Nothing here needs a GPU (descriptor creation
/// works without one), so tests/cuda/test_cuda_matmul_desc.cpp checks it all on the CPU;
/// matmul.cpp adds the handle, the heuristic and the launch.
///
///   MatmulPlan p = plan_matmul({.batch_a = 4, .m = 128, .n = 64, .k = 32}, float16, true,
///                              Activation::Relu, false);
///   LtDescriptors d = make_descriptors(p, bias_ptr);   // epilogue RELU_BIAS, A = b, B = a
#include <cublasLt.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/backend.hpp"

namespace mpt::cuda {

/// A matmul as the backend receives it: out [batch, M, N] = op(a) [batch_a, M, K] . op(b)
/// [batch_b, K, N]; a batch of 1 is broadcast when the other side has more.
struct MatmulShape {
  std::int64_t batch_a = 1, batch_b = 1, m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
};

/// Device addresses of the operands: their alignment decides which kernels cuBLASLt may use.
/// Zero (the default) counts as fully aligned.
struct MatmulAddresses {
  std::uintptr_t a = 0, b = 0, out = 0, bias = 0;
};

/// One column-major matrix (cuBLASLt's view) as stored: rows x cols with leading dimension ld,
/// batch_count matrices batch_stride elements apart (0: the same matrix for every batch).
struct LtMatrix {
  cudaDataType_t type = CUDA_R_32F;
  std::uint64_t rows = 0, cols = 0;
  std::int64_t ld = 0;
  std::int32_t batch_count = 1;
  std::int64_t batch_stride = 0;
};

/// Which mpt operand feeds cuBLASLt's A and B. Row-major C = op(a).op(b) is the column-major
/// C^T = op(b)^T . op(a)^T, so cuBLASLt's A is mpt's b and its B is mpt's a (always swapped).
struct MatmulPlan {
  // cuBLASLt's problem: D (m x n) = op(A) (m x k) . op(B) (k x n), m = mpt's N, n = mpt's M.
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  std::uint64_t m = 0, n = 0, k = 0;
  LtMatrix a, b, d;  ///< a: mpt's b; b: mpt's a; d (also C, beta = 0): out
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = CUDA_R_32F;  ///< type of alpha and beta
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  cudaDataType_t bias_type = CUDA_R_32F;  ///< meaningful when the epilogue adds bias
  bool epilogue_bias = false;             ///< bias added by the epilogue
  bool add_bias_after = false;            ///< bias added by binary(Add) after the GEMM
  bool unary_after = false;               ///< activation applied by unary(post_op, out, out)
  UnaryOp post_op = UnaryOp::Relu;
  // Alignment (bytes, a power of two, at most 256) the heuristic is told for A, B, C/D.
  std::uint32_t align_a = 256, align_b = 256, align_d = 256;
  std::uint32_t align_bias = 256;  ///< the heuristic reads the bias pointer's alignment too
  /// 16-bit only: every pointer, leading dimension and batch stride 16-byte aligned, so
  /// tensor-core kernels need no fallback (cuBLASLt still runs otherwise, slower).
  bool tensor_core_aligned = true;
};

struct PlanOptions {
  bool allow_tf32 = false;
  /// false: no bias/activation epilogue (bias and activation run as separate ops afterwards),
  /// the fallback when cuBLASLt has no algorithm for the fused epilogue.
  bool fuse_epilogue = true;
  /// Bias dtype when it differs from the operands' (the epilogue then cannot take it).
  bool bias_dtype_matches = true;
};

/// cuBLASLt's data type for an mpt floating dtype; mpt::Error for the others.
cudaDataType_t cuda_data_type(DType dtype);

/// The largest power of two (at most 256) dividing `address`; 256 for 0.
std::uint32_t address_alignment(std::uintptr_t address);

/// Maps the matmul onto cuBLASLt: operand swap, transposes, dims, leading dimensions, batch
/// strides, compute/scale/data types, epilogue and the post-ops left to other kernels.
/// mpt::Error for an unsupported dtype, a negative or too large dimension, or an ld < rows.
MatmulPlan plan_matmul(const MatmulShape& shape, DType dtype, bool has_bias, Activation act,
                       const PlanOptions& options = {}, const MatmulAddresses& addresses = {});
inline MatmulPlan plan_matmul(const MatmulShape& shape, DType dtype, bool has_bias, Activation act,
                              bool allow_tf32) {
  return plan_matmul(shape, dtype, has_bias, act, PlanOptions{.allow_tf32 = allow_tf32});
}

/// Everything the plan's heuristic result and its run depend on (the cache key, without the
/// device): the matrices, types, epilogue and alignments, and the post-ops (bias added after,
/// activation applied after). matmul.cpp caches the whole plan under this key, so two requests
/// that differ in any field the launch or the post-ops read must not share it.
std::string plan_key(const MatmulPlan& plan);

/// Owning cuBLASLt descriptors of one plan (destroyed with it; movable, not copyable).
class LtDescriptors {
 public:
  LtDescriptors() = default;
  ~LtDescriptors();
  LtDescriptors(LtDescriptors&& o) noexcept;
  LtDescriptors& operator=(LtDescriptors&& o) noexcept;
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;

  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;

 private:
  void reset();
};

/// Creates the matmul descriptor and the A, B, C and D layouts with every attribute of the plan
/// set (bias pointer included when the epilogue adds bias). Each status through check_cublas.
LtDescriptors make_descriptors(const MatmulPlan& plan, const void* bias = nullptr);

// ---- Fallbacks: what runs when cuBLASLt refuses a plan ----------------------------------------
//
// A matmul is tried as a chain of attempts until cuBLASLt has an algorithm for one (and runs it):
// the fused epilogue first, then the same GEMM unfused (bias and activation as separate ops);
// then, each again fused first, with under-16-byte-aligned operands copied to fresh buffers,
// with a broadcast b folded into M (one GEMM of batch*M rows), and with one GEMM per batch. When
// none is left, mpt::Error names the shape, the dtypes and every attempt's cuBLASLt status.
//
// 16-bit operands under 16 bytes aligned start with aligned copies (first_attempt).
//
//   std::vector<AttemptRecord> history;
//   ChosenPlan c = choose_plan(request, first_attempt(request), history, [&](const MatmulPlan& p) { return heuristic(p); });

/// How the batch of one attempt runs.
enum class BatchMode : std::uint8_t {
  Strided,  ///< one strided-batched GEMM; a broadcast operand has batch stride 0
  Folded,   ///< broadcast b and an untransposed a: the batch folded into M, one GEMM
  Looped,   ///< one GEMM per batch, each operand's pointer advanced by its batch stride
};

struct MatmulAttempt {
  bool fuse_epilogue = true;
  /// Operands (bias and output too) whose address is under 16-byte aligned are copied into
  /// fresh buffers, which the allocator aligns to 256 bytes (the output is copied back).
  bool aligned_copies = false;
  BatchMode batch = BatchMode::Strided;
  friend bool operator==(const MatmulAttempt&, const MatmulAttempt&) = default;
};

/// Everything about one matmul call that decides its plans (and names it in errors).
struct MatmulRequest {
  MatmulShape shape;
  DType dtype = DType::Float32;
  bool has_bias = false;
  DType bias_dtype = DType::Float32;  ///< meaningful with has_bias
  Activation act = Activation::Linear;
  bool allow_tf32 = false;
  MatmulAddresses addresses;
  int device = 0;  ///< the GPU's index, for messages
};

/// What cuBLASLt answered for one plan: the status of `call`, and for the heuristic the number
/// of algorithms it returned and the first one's state.
struct LtOutcome {
  const char* call = "cublasLtMatmulAlgoGetHeuristic";
  int status = 0;  ///< CUBLAS_STATUS_SUCCESS
  int found = 0;
  int state = 0;
  bool ok() const { return status == CUBLAS_STATUS_SUCCESS && found > 0 && state == CUBLAS_STATUS_SUCCESS; }
};

/// One refused attempt, for the final error.
struct AttemptRecord {
  MatmulAttempt attempt;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  LtOutcome outcome;
};

/// An operand address this attempt copies (under 16-byte aligned, not null) when aligned_copies.
bool needs_aligned_copy(std::uintptr_t address);

/// Whether a broadcast b can fold into M: b has batch 1, a has more and is not transposed, and
/// batch*M stays within cuBLASLt's int32.
bool can_fold_batch(const MatmulShape& s);

/// The shape one GEMM of the attempt computes: the request's (Strided), the batch folded into
/// M (Folded), one batch of the loop (Looped).
MatmulShape attempt_shape(const MatmulShape& s, BatchMode mode);

/// Element offsets between consecutive batches of a loop: a's and b's (0 when broadcast), out's.
struct BatchStrides {
  std::int64_t a = 0, b = 0, out = 0;
};
BatchStrides batch_strides(const MatmulShape& s);

/// The addresses the attempt's GEMM(s) read and write, for their alignment: copied operands are
/// fully aligned; in a loop each is as aligned as both its base and its batch stride in bytes.
MatmulAddresses attempt_addresses(const MatmulRequest& r, const MatmulAttempt& attempt);

/// The attempt's plan (plan_matmul of its shape, options and addresses).
MatmulPlan plan_attempt(const MatmulRequest& r, const MatmulAttempt& attempt);

/// Where the chain starts: the fused epilogue on the operands as they are, except that 16-bit
/// operands under 16 bytes aligned are copied first. cuBLASLt accepts them in place, but on an
/// H100 its kernel for an unaligned bfloat16 GEMM with bias and ReLU was off by 0.0015 where
/// the aligned kernels round once (2026-11-26); the copies give the aligned kernels.
MatmulAttempt first_attempt(const MatmulRequest& r);

/// The attempt after `failed`, whose plan `plan` cuBLASLt refused: unfused when the plan fused
/// an epilogue; else the next way to lay out the data (aligned copies when an operand is under
/// 16-byte aligned, the folded batch for a broadcast b, the loop for any batch), fused again
/// first. nullopt when none is left.
std::optional<MatmulAttempt> next_attempt(const MatmulRequest& r, const MatmulAttempt& failed, const MatmulPlan& plan);

/// The mpt::Error text when every attempt failed: the op, the shape (batches, M, N, K,
/// transposes), dtypes, activation, device and each attempt with its cuBLASLt status.
std::string matmul_failure_message(const MatmulRequest& r, const std::vector<AttemptRecord>& history);

/// "fused RELU_BIAS, strided batch" and the like.
std::string describe(const MatmulAttempt& attempt, cublasLtEpilogue_t epilogue);

struct ChosenPlan {
  MatmulAttempt attempt;
  MatmulPlan plan;
};

/// From `first` along next_attempt, the first attempt whose plan `try_plan` accepts (on a GPU:
/// the heuristic found an algorithm). Each refusal is appended to `history`; when none is left,
/// mpt::Error with matmul_failure_message.
ChosenPlan choose_plan(const MatmulRequest& r, MatmulAttempt first, std::vector<AttemptRecord>& history,
                       const std::function<LtOutcome(const MatmulPlan&)>& try_plan);

}  // namespace mpt::cuda
