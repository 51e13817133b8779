// The host half of the CUDA GEMM (see matmul_plan.hpp): operand swap, layouts, epilogue choice,
// cuBLASLt descriptors, and the fallback chain when cuBLASLt refuses a plan.
#include "backend/cuda/matmul_plan.hpp"

#include <algorithm>
#include <climits>
#include <utility>

#include <cublas_api.h>

#include "backend/cuda/cuda_check.hpp"
#include "mpt/error.hpp"

namespace mpt::cuda {
namespace {

/// A 16-bit tensor-core kernel reads 16 bytes at a time from each column and batch.
bool aligned16(std::uint32_t pointer_alignment, std::int64_t ld, std::int64_t stride, std::size_t bytes) {
  return pointer_alignment >= 16 && (ld * static_cast<std::int64_t>(bytes)) % 16 == 0 &&
         (stride * static_cast<std::int64_t>(bytes)) % 16 == 0;
}

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, T value, const char* what) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value), what);
}

template <typename T>
void set(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, T value, const char* what) {
  check_cublas(cublasLtMatrixLayoutSetAttribute(layout, attr, &value, sizeof value), what);
}

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_RELU: return "RELU";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "RELU_BIAS";
    default: return "another";  // plan_matmul picks only the four above
  }
}

std::string status_name(int status) { return cublasGetStatusName(static_cast<cublasStatus_t>(status)); }

void make_layout(cublasLtMatrixLayout_t* layout, const LtMatrix& m) {
  check_cublas(cublasLtMatrixLayoutCreate(layout, m.type, m.rows, m.cols, m.ld),
               "matmul: cublasLtMatrixLayoutCreate");
  set<std::int32_t>(*layout, CUBLASLT_MATRIX_LAYOUT_ORDER, CUBLASLT_ORDER_COL,
                    "matmul: cublasLtMatrixLayoutSetAttribute(ORDER)");
  set<std::int32_t>(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, m.batch_count,
                    "matmul: cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
  set<std::int64_t>(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, m.batch_stride,
                    "matmul: cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
}

}  // namespace

cudaDataType_t cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return CUDA_R_32F;
    case DType::Float64: return CUDA_R_64F;
    case DType::Float16: return CUDA_R_16F;
    case DType::BFloat16: return CUDA_R_16BF;
    default: break;
  }
  fail("matmul: cuBLASLt takes float32, float64, float16 or bfloat16, got ", to_string(dtype));
}

std::uint32_t address_alignment(std::uintptr_t address) {
  std::uint32_t a = 1;
  while (a < 256 && address % (2 * a) == 0) a *= 2;
  return a;
}

MatmulPlan plan_matmul(const MatmulShape& s, DType dtype, bool has_bias, Activation act,
                       const PlanOptions& options, const MatmulAddresses& addresses) {
  constexpr std::int64_t kMax = INT32_MAX;  // cuBLASLt supports int32 rows, cols and ld
  MPT_CHECK(s.m >= 1 && s.n >= 1 && s.k >= 1 && s.m <= kMax && s.n <= kMax && s.k <= kMax,
            "matmul: cuBLASLt needs 1 <= M, N, K <= ", kMax, ", got M=", s.m, " N=", s.n, " K=", s.k);
  MPT_CHECK(s.batch_a >= 1 && s.batch_b >= 1 && (s.batch_a == s.batch_b || s.batch_a == 1 || s.batch_b == 1),
            "matmul: batch counts ", s.batch_a, " and ", s.batch_b, " are neither equal nor broadcast");
  const std::int64_t batch = std::max(s.batch_a, s.batch_b);
  MPT_CHECK(batch <= kMax, "matmul: cuBLASLt batch count ", batch, " exceeds ", kMax);

  MatmulPlan p;
  const cudaDataType_t type = cuda_data_type(dtype);
  p.m = static_cast<std::uint64_t>(s.n);
  p.n = static_cast<std::uint64_t>(s.m);
  p.k = static_cast<std::uint64_t>(s.k);
  // cuBLASLt's A is mpt's b: row-major [K, N] is column-major N x K (ld N), op N; row-major
  // [N, K] (transpose_b) is column-major K x N (ld K), op T.
  p.transa = s.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.a.rows = static_cast<std::uint64_t>(s.transpose_b ? s.k : s.n);
  p.a.cols = static_cast<std::uint64_t>(s.transpose_b ? s.n : s.k);
  p.a.batch_stride = s.batch_b == 1 ? 0 : s.k * s.n;
  // cuBLASLt's B is mpt's a: row-major [M, K] is column-major K x M (ld K), op N; row-major
  // [K, M] (transpose_a) is column-major M x K (ld M), op T.
  p.transb = s.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.b.rows = static_cast<std::uint64_t>(s.transpose_a ? s.m : s.k);
  p.b.cols = static_cast<std::uint64_t>(s.transpose_a ? s.k : s.m);
  p.b.batch_stride = s.batch_a == 1 ? 0 : s.m * s.k;
  // D (and C) is out: row-major [M, N] is column-major N x M (ld N).
  p.d.rows = static_cast<std::uint64_t>(s.n);
  p.d.cols = static_cast<std::uint64_t>(s.m);
  p.d.batch_stride = s.m * s.n;
  for (LtMatrix* mat : {&p.a, &p.b, &p.d}) {
    mat->type = type;
    mat->ld = static_cast<std::int64_t>(mat->rows);  // contiguous operands: columns packed
    mat->batch_count = static_cast<std::int32_t>(batch);
    MPT_CHECK(mat->ld >= static_cast<std::int64_t>(mat->rows) && mat->ld >= 1,
              "matmul: leading dimension ", mat->ld, " below the ", mat->rows, " rows");
  }
  MPT_CHECK((p.transa == CUBLAS_OP_N ? p.a.rows : p.a.cols) == p.m &&
                (p.transb == CUBLAS_OP_N ? p.b.cols : p.b.rows) == p.n &&
                (p.transa == CUBLAS_OP_N ? p.a.cols : p.a.rows) == p.k,
            "matmul: inconsistent cuBLASLt plan");  // cannot fail; guards edits above

  switch (dtype) {
    case DType::Float16:
    case DType::BFloat16:  // float32 accumulate on tensor cores, as the CPU computes
      p.compute = CUBLAS_COMPUTE_32F;
      p.scale_type = CUDA_R_32F;
      break;
    case DType::Float32:
      p.compute = options.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      p.scale_type = CUDA_R_32F;
      break;
    default:  // float64 (cuda_data_type rejected the rest)
      p.compute = CUBLAS_COMPUTE_64F;
      p.scale_type = CUDA_R_64F;
      break;
  }

  // Epilogues: bias (in D's type, as cuBLASLt requires for these types) and ReLU. cuBLASLt's
  // GELU is the tanh approximation while the CPU's is erf-based, so GELU (like sigmoid, tanh
  // and SiLU, which cuBLASLt lacks) runs as unary() afterwards.
  const bool fuse_bias = has_bias && options.fuse_epilogue && options.bias_dtype_matches;
  const bool fuse_relu = act == Activation::Relu && options.fuse_epilogue && (fuse_bias || !has_bias);
  p.epilogue = fuse_bias ? (fuse_relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                         : (fuse_relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  p.epilogue_bias = fuse_bias;
  p.bias_type = type;
  p.add_bias_after = has_bias && !fuse_bias;
  p.unary_after = act != Activation::Linear && !fuse_relu;
  if (p.unary_after) p.post_op = act;

  p.align_a = address_alignment(addresses.b);
  p.align_b = address_alignment(addresses.a);
  p.align_d = address_alignment(addresses.out);
  p.align_bias = fuse_bias ? address_alignment(addresses.bias) : 256;
  if (dtype == DType::Float16 || dtype == DType::BFloat16) {
    p.tensor_core_aligned = aligned16(p.align_a, p.a.ld, p.a.batch_stride, 2) &&
                            aligned16(p.align_b, p.b.ld, p.b.batch_stride, 2) &&
                            aligned16(p.align_d, p.d.ld, p.d.batch_stride, 2) &&
                            p.align_bias >= 16;
  }
  return p;
}

std::string plan_key(const MatmulPlan& p) {
  std::string key;
  auto add = [&key](long long v) { key += std::to_string(v) + ','; };
  for (const LtMatrix* mat : {&p.a, &p.b, &p.d}) {
    add(mat->type);
    add(static_cast<long long>(mat->rows));
    add(static_cast<long long>(mat->cols));
    add(mat->ld);
    add(mat->batch_count);
    add(mat->batch_stride);
  }
  for (long long v : {static_cast<long long>(p.transa), static_cast<long long>(p.transb),
                      static_cast<long long>(p.compute), static_cast<long long>(p.scale_type),
                      static_cast<long long>(p.epilogue), static_cast<long long>(p.bias_type),
                      static_cast<long long>(p.align_a), static_cast<long long>(p.align_b),
                      static_cast<long long>(p.align_d), static_cast<long long>(p.align_bias),
                      static_cast<long long>(p.epilogue_bias), static_cast<long long>(p.add_bias_after),
                      static_cast<long long>(p.unary_after), static_cast<long long>(p.post_op),
                      static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k)})
    add(v);
  return key;
}

LtDescriptors::~LtDescriptors() { reset(); }

LtDescriptors::LtDescriptors(LtDescriptors&& o) noexcept
    : op(std::exchange(o.op, nullptr)),
      a(std::exchange(o.a, nullptr)),
      b(std::exchange(o.b, nullptr)),
      c(std::exchange(o.c, nullptr)),
      d(std::exchange(o.d, nullptr)) {}

LtDescriptors& LtDescriptors::operator=(LtDescriptors&& o) noexcept {
  if (this != &o) {
    reset();
    op = std::exchange(o.op, nullptr);
    a = std::exchange(o.a, nullptr);
    b = std::exchange(o.b, nullptr);
    c = std::exchange(o.c, nullptr);
    d = std::exchange(o.d, nullptr);
  }
  return *this;
}

void LtDescriptors::reset() {
  // Destroy statuses are ignored: this runs in destructors, and they fail only for null.
  if (op) (void)cublasLtMatmulDescDestroy(op);
  for (cublasLtMatrixLayout_t l : {a, b, c, d})
    if (l) (void)cublasLtMatrixLayoutDestroy(l);
  op = nullptr;
  a = b = c = d = nullptr;
}

LtDescriptors make_descriptors(const MatmulPlan& p, const void* bias) {
  LtDescriptors out;
  check_cublas(cublasLtMatmulDescCreate(&out.op, p.compute, p.scale_type), "matmul: cublasLtMatmulDescCreate");
  set<std::int32_t>(out.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_HOST,
                    "matmul: cublasLtMatmulDescSetAttribute(POINTER_MODE)");
  set<std::int32_t>(out.op, CUBLASLT_MATMUL_DESC_TRANSA, p.transa, "matmul: cublasLtMatmulDescSetAttribute(TRANSA)");
  set<std::int32_t>(out.op, CUBLASLT_MATMUL_DESC_TRANSB, p.transb, "matmul: cublasLtMatmulDescSetAttribute(TRANSB)");
  set<std::uint32_t>(out.op, CUBLASLT_MATMUL_DESC_EPILOGUE, p.epilogue,
                     "matmul: cublasLtMatmulDescSetAttribute(EPILOGUE)");
  if (p.epilogue_bias) {
    set<std::int32_t>(out.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, p.bias_type,
                      "matmul: cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
    set<const void*>(out.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias,
                     "matmul: cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    // One bias [N] for every batch.
    set<std::int64_t>(out.op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, 0,
                      "matmul: cublasLtMatmulDescSetAttribute(BIAS_BATCH_STRIDE)");
  }
  make_layout(&out.a, p.a);
  make_layout(&out.b, p.b);
  make_layout(&out.c, p.d);  // C = D's layout; beta = 0 so C is never read
  make_layout(&out.d, p.d);
  return out;
}

// ---- Fallbacks ----------------------------------------------------------------------------------

bool needs_aligned_copy(std::uintptr_t address) { return address != 0 && address_alignment(address) < 16; }

bool can_fold_batch(const MatmulShape& s) {
  return s.batch_b == 1 && s.batch_a > 1 && !s.transpose_a && s.m <= INT32_MAX / s.batch_a;
}

MatmulShape attempt_shape(const MatmulShape& s, BatchMode mode) {
  switch (mode) {
    case BatchMode::Strided: return s;
    case BatchMode::Folded:  // a [batch, M, K] is a [batch*M, K]; out likewise
      return {1, 1, s.batch_a * s.m, s.n, s.k, false, s.transpose_b};
    case BatchMode::Looped: return {1, 1, s.m, s.n, s.k, s.transpose_a, s.transpose_b};
  }
  return s;
}

BatchStrides batch_strides(const MatmulShape& s) {
  return {s.batch_a == 1 ? 0 : s.m * s.k, s.batch_b == 1 ? 0 : s.k * s.n, s.m * s.n};
}

MatmulAddresses attempt_addresses(const MatmulRequest& r, const MatmulAttempt& t) {
  MatmulAddresses x = r.addresses;
  if (t.aligned_copies)
    for (std::uintptr_t* p : {&x.a, &x.b, &x.out, &x.bias})
      if (needs_aligned_copy(*p)) *p = 0;
  if (t.batch == BatchMode::Looped && std::max(r.shape.batch_a, r.shape.batch_b) > 1) {
    // Batch q starts q strides in: as aligned as the lowest set bit of base or stride (bytes).
    const auto bytes = static_cast<std::uintptr_t>(itemsize(r.dtype));
    const BatchStrides st = batch_strides(r.shape);
    x.a |= static_cast<std::uintptr_t>(st.a) * bytes;
    x.b |= static_cast<std::uintptr_t>(st.b) * bytes;
    x.out |= static_cast<std::uintptr_t>(st.out) * bytes;
  }
  return x;
}

MatmulPlan plan_attempt(const MatmulRequest& r, const MatmulAttempt& t) {
  const PlanOptions options{.allow_tf32 = r.allow_tf32,
                            .fuse_epilogue = t.fuse_epilogue,
                            .bias_dtype_matches = !r.has_bias || r.bias_dtype == r.dtype};
  return plan_matmul(attempt_shape(r.shape, t.batch), r.dtype, r.has_bias, r.act, options, attempt_addresses(r, t));
}

MatmulAttempt first_attempt(const MatmulRequest& r) {
  const MatmulAddresses& x = r.addresses;
  const bool sixteen_bit = r.dtype == DType::Float16 || r.dtype == DType::BFloat16;
  const bool unaligned = needs_aligned_copy(x.a) || needs_aligned_copy(x.b) || needs_aligned_copy(x.out) ||
                         (r.has_bias && needs_aligned_copy(x.bias));
  return MatmulAttempt{.aligned_copies = sixteen_bit && unaligned};
}

std::optional<MatmulAttempt> next_attempt(const MatmulRequest& r, const MatmulAttempt& failed, const MatmulPlan& plan) {
  MatmulAttempt next = failed;
  const MatmulAddresses& x = r.addresses;
  const bool unaligned = needs_aligned_copy(x.a) || needs_aligned_copy(x.b) || needs_aligned_copy(x.out) ||
                         (r.has_bias && needs_aligned_copy(x.bias));
  // Aligned copies, with the fused epilogue, before an unfused epilogue: unfused, a 16-bit GEMM
  // rounds to 16 bits before the bias add and the activation (twice, where the CPU rounds once;
  // on an H100 an unaligned bfloat16 dense + ReLU was off by 0.0015 so). Copies once needed stay.
  if (unaligned && !failed.aligned_copies) {
    next.aligned_copies = true;
    next.fuse_epilogue = true;
    return next;
  }
  if (failed.fuse_epilogue && plan.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    next.fuse_epilogue = false;
    return next;
  }
  // Another data layout, with the fused epilogue first again.
  next.fuse_epilogue = true;
  if (failed.batch == BatchMode::Strided && can_fold_batch(r.shape)) {
    next.batch = BatchMode::Folded;
    return next;
  }
  if (failed.batch != BatchMode::Looped && std::max(r.shape.batch_a, r.shape.batch_b) > 1) {
    next.batch = BatchMode::Looped;
    return next;
  }
  return std::nullopt;
}

std::string describe(const MatmulAttempt& t, cublasLtEpilogue_t epilogue) {
  std::string d = !t.fuse_epilogue ? "unfused (bias and activation as separate ops)"
                  : epilogue == CUBLASLT_EPILOGUE_DEFAULT ? std::string("no epilogue")
                                                          : mpt::detail::cat("epilogue ", epilogue_name(epilogue));
  if (t.aligned_copies) d += ", aligned copies";
  switch (t.batch) {
    case BatchMode::Strided: d += ", strided batch"; break;
    case BatchMode::Folded: d += ", batch folded into M"; break;
    case BatchMode::Looped: d += ", one GEMM per batch"; break;
  }
  return d;
}

std::string matmul_failure_message(const MatmulRequest& r, const std::vector<AttemptRecord>& history) {
  const MatmulShape& s = r.shape;
  const char* compute = r.dtype == DType::Float64                     ? "CUBLAS_COMPUTE_64F"
                        : r.dtype == DType::Float32 && r.allow_tf32 ? "CUBLAS_COMPUTE_32F_FAST_TF32"
                                                                      : "CUBLAS_COMPUTE_32F";
  std::string msg = mpt::detail::cat(
      "matmul on cuda:", r.device, ": cuBLASLt ran none of ", history.size(), history.size() == 1 ? " plan" : " plans",
      " for ", to_string(r.dtype), " operands (compute ", compute, ", bias ",
      r.has_bias ? to_string(r.bias_dtype) : std::string("none"), ", activation ", common::unary_name(r.act),
      ") of batch ", std::max(s.batch_a, s.batch_b), " (a ", s.batch_a, ", b ", s.batch_b, "), M=", s.m, " N=", s.n,
      " K=", s.k, ", transpose_a=", s.transpose_a ? "true" : "false", " transpose_b=", s.transpose_b ? "true" : "false",
      " (addresses a ", address_alignment(r.addresses.a), ", b ", address_alignment(r.addresses.b), ", out ",
      address_alignment(r.addresses.out), " byte aligned)");
  for (std::size_t i = 0; i < history.size(); ++i) {
    const AttemptRecord& h = history[i];
    const LtOutcome& o = h.outcome;
    msg += mpt::detail::cat(i == 0 ? ": " : "; ", describe(h.attempt, h.epilogue), ": ", o.call, " ");
    if (o.status != CUBLAS_STATUS_SUCCESS) msg += status_name(o.status);
    else if (o.found < 1) msg += "found no algorithm";
    else msg += mpt::detail::cat("gave an algorithm in state ", status_name(o.state));
  }
  return msg;
}

ChosenPlan choose_plan(const MatmulRequest& r, MatmulAttempt first, std::vector<AttemptRecord>& history,
                       const std::function<LtOutcome(const MatmulPlan&)>& try_plan) {
  for (std::optional<MatmulAttempt> t = first; t; ) {
    MatmulPlan plan = plan_attempt(r, *t);
    const LtOutcome outcome = try_plan(plan);
    if (outcome.ok()) return {*t, std::move(plan)};
    history.push_back({*t, plan.epilogue, outcome});
    t = next_attempt(r, *t, plan);
  }
  fail(matmul_failure_message(r, history));
}

}  // namespace mpt::cuda
