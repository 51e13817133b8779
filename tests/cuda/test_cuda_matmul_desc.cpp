// The CUDA GEMM's host half without a GPU: the plan that maps a row-major matmul onto cuBLASLt's
// column-major one (checked against hand-derived numbers, and by running the plan's column-major
// GEMM on host arrays against the CPU backend), the epilogue and type choices, the real
// cuBLASLt descriptors read back attribute by attribute, and the fallback chain when cuBLASLt
// refuses a plan (the heuristic simulated; its fallback plans run on host arrays too).
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>

#include "backend/backend.hpp"
#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/matmul_plan.hpp"
#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;
using namespace mpt::cuda;

namespace {

struct DtypeCase {
  DType dtype;
  bool tf32;
  const char* name;
};
const DtypeCase kDtypes[] = {{float32, false, "float32"},
                             {float32, true, "float32+tf32"},
                             {float16, false, "float16"},
                             {bfloat16, false, "bfloat16"},
                             {float64, false, "float64"}};
/// Every activation of the op table (the ones a Keras name selects).
std::vector<Activation> all_activations() {
  std::vector<Activation> acts;
  for (int i = 0; i < common::kUnaryOpCount; ++i)
    if (common::kUnaryInfo[i].keras != nullptr) acts.push_back(static_cast<Activation>(i));
  return acts;
}
const std::vector<Activation> kActs = all_activations();

/// The shared formulas (the plans' layout is under test here, not the formulas).
double activate(UnaryOp op, double v) { return common::activate(op, v); }

/// Runs the plan as cuBLASLt would: D = op(A) . op(B) column-major with the plan's transposes,
/// leading dimensions and batch strides, A = `lt_a` (mpt's b), B = `lt_b` (mpt's a); then the
/// epilogue and the post-ops. An index outside a buffer reads NaN, so a wrong plan fails.
std::vector<double> run_plan(const MatmulPlan& p, const std::vector<double>& lt_a, const std::vector<double>& lt_b,
                             const std::vector<double>& bias, std::size_t out_size) {
  auto at = [](const std::vector<double>& v, std::int64_t i) {
    return i >= 0 && i < static_cast<std::int64_t>(v.size()) ? v[static_cast<std::size_t>(i)]
                                                             : std::numeric_limits<double>::quiet_NaN();
  };
  std::vector<double> d(out_size, std::numeric_limits<double>::quiet_NaN());
  const auto m = static_cast<std::int64_t>(p.m), n = static_cast<std::int64_t>(p.n), k = static_cast<std::int64_t>(p.k);
  for (std::int64_t q = 0; q < p.d.batch_count; ++q) {
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (std::int64_t l = 0; l < k; ++l) {
          const double av = at(lt_a, q * p.a.batch_stride + (p.transa == CUBLAS_OP_N ? i + l * p.a.ld : l + i * p.a.ld));
          const double bv = at(lt_b, q * p.b.batch_stride + (p.transb == CUBLAS_OP_N ? l + j * p.b.ld : j + l * p.b.ld));
          acc += av * bv;
        }
        if (p.epilogue_bias || p.add_bias_after) acc += at(bias, i);  // bias runs along D's rows
        if (p.epilogue == CUBLASLT_EPILOGUE_RELU || p.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS) acc = acc > 0 ? acc : 0;
        if (p.unary_after) acc = activate(p.post_op, acc);
        const std::int64_t o = q * p.d.batch_stride + i + j * p.d.ld;
        if (o >= 0 && o < static_cast<std::int64_t>(d.size())) d[static_cast<std::size_t>(o)] = acc;
      }
    }
  }
  return d;
}

struct Problem {
  Shape batch_a, batch_b;  // leading axes of a and b
  std::int64_t m, n, k;
};

Shape operand_shape(const Shape& batch, std::int64_t rows, std::int64_t cols) {
  Shape s = batch;
  s.push_back(rows);
  s.push_back(cols);
  return s;
}

std::int64_t product(const Shape& s) {
  std::int64_t p = 1;
  for (auto v : s) p *= v;
  return p;
}

/// The CPU backend's float64 matmul and the plan's interpretation on the same data; true when
/// they agree (CHECKs the values too when `expect_equal`).
bool plan_matches_cpu(const Problem& pr, bool ta, bool tb, bool has_bias, Activation act, DType dtype,
                      const PlanOptions& options, bool expect_equal, std::uint64_t seed, bool break_swap = false) {
  const Shape sa = operand_shape(pr.batch_a, ta ? pr.k : pr.m, ta ? pr.m : pr.k);
  const Shape sb = operand_shape(pr.batch_b, tb ? pr.n : pr.k, tb ? pr.k : pr.n);
  Tensor a = random(sa, float64, Device::cpu(), seed);
  Tensor b = random(sb, float64, Device::cpu(), seed + 1);
  Tensor bias = has_bias ? random({pr.n}, float64, Device::cpu(), seed + 2) : Tensor();
  Shape so = operand_shape(pr.batch_a.empty() ? pr.batch_b : pr.batch_a, pr.m, pr.n);
  Tensor out = Tensor::empty(so, float64, Device::cpu());
  detail::backend(Device::cpu()).matmul(a, b, ta, tb, bias, act, out);

  const MatmulShape shape{product(pr.batch_a), product(pr.batch_b), pr.m, pr.n, pr.k, ta, tb};
  const MatmulPlan plan = plan_matmul(shape, dtype, has_bias, act, options);
  std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  std::vector<double> got = break_swap ? run_plan(plan, va, vb, has_bias ? bias.to_vector<double>() : std::vector<double>{},
                                                  static_cast<std::size_t>(out.numel()))
                                       : run_plan(plan, vb, va, has_bias ? bias.to_vector<double>() : std::vector<double>{},
                                                  static_cast<std::size_t>(out.numel()));
  const std::vector<double> want = out.to_vector<double>();
  const Tolerance tol = tolerance(float64);
  bool same = got.size() == want.size();
  for (std::size_t i = 0; same && i < got.size(); ++i)
    same = std::abs(got[i] - want[i]) <= tol.atol + tol.rtol * std::abs(want[i]);
  if (expect_equal) check_close(got, want, tol, "plan vs CPU matmul");
  return same;
}

template <typename T>
T desc_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr) {
  T v{};
  std::size_t written = 0;
  check_cublas(cublasLtMatmulDescGetAttribute(d, attr, &v, sizeof v, &written), "test: cublasLtMatmulDescGetAttribute");
  CHECK(written == sizeof v);
  return v;
}

template <typename T>
T layout_attr(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr) {
  T v{};
  std::size_t written = 0;
  check_cublas(cublasLtMatrixLayoutGetAttribute(l, attr, &v, sizeof v, &written),
               "test: cublasLtMatrixLayoutGetAttribute");
  CHECK(written == sizeof v);
  return v;
}

void check_layout(cublasLtMatrixLayout_t l, const LtMatrix& m) {
  REQUIRE(l != nullptr);
  CHECK(layout_attr<std::uint32_t>(l, CUBLASLT_MATRIX_LAYOUT_TYPE) == static_cast<std::uint32_t>(m.type));
  CHECK(layout_attr<std::int32_t>(l, CUBLASLT_MATRIX_LAYOUT_ORDER) == CUBLASLT_ORDER_COL);
  CHECK(layout_attr<std::uint64_t>(l, CUBLASLT_MATRIX_LAYOUT_ROWS) == m.rows);
  CHECK(layout_attr<std::uint64_t>(l, CUBLASLT_MATRIX_LAYOUT_COLS) == m.cols);
  CHECK(layout_attr<std::int64_t>(l, CUBLASLT_MATRIX_LAYOUT_LD) == m.ld);
  CHECK(layout_attr<std::int32_t>(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) == m.batch_count);
  CHECK(layout_attr<std::int64_t>(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) == m.batch_stride);
}

void check_descriptors(const MatmulPlan& p, const LtDescriptors& d, const void* bias) {
  REQUIRE(d.op != nullptr);
  CHECK(desc_attr<std::int32_t>(d.op, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE) == p.compute);
  CHECK(desc_attr<std::int32_t>(d.op, CUBLASLT_MATMUL_DESC_SCALE_TYPE) == p.scale_type);
  CHECK(desc_attr<std::int32_t>(d.op, CUBLASLT_MATMUL_DESC_POINTER_MODE) == CUBLASLT_POINTER_MODE_HOST);
  CHECK(desc_attr<std::int32_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSA) == p.transa);
  CHECK(desc_attr<std::int32_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSB) == p.transb);
  CHECK(desc_attr<std::uint32_t>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE) == static_cast<std::uint32_t>(p.epilogue));
  CHECK(desc_attr<const void*>(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER) == (p.epilogue_bias ? bias : nullptr));
  if (p.epilogue_bias) {
    CHECK(desc_attr<std::int32_t>(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) == p.bias_type);
    CHECK(desc_attr<std::int64_t>(d.op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE) == 0);
  }
  check_layout(d.a, p.a);
  check_layout(d.b, p.b);
  check_layout(d.c, p.d);
  check_layout(d.d, p.d);
}

const Problem kProblems[] = {
    {{}, {}, 3, 5, 7},           // odd, nothing square
    {{}, {}, 1, 1, 1},           // a dot product
    {{}, {}, 16, 8, 24},         // tensor-core friendly
    {{4}, {4}, 3, 5, 2},         // batched
    {{2, 3}, {2, 3}, 5, 3, 4},   // two batch axes
    {{6}, {}, 7, 3, 5},          // broadcast b (dense over [batch, rows, in])
    {{}, {3}, 2, 9, 5},          // broadcast a
};

/// Calls f(problem, ta, tb, has_bias, act) for every problem, transposition, bias and activation.
template <class F>
void for_each_case(F&& f) {
  for (const Problem& pr : kProblems)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool has_bias : {false, true})
          for (Activation act : kActs) f(pr, ta, tb, has_bias, act);
}

}  // namespace

TEST_CASE("plan_matmul swaps operands: hand-derived dims, leading dimensions and strides") {
  // Row-major out [M,N] = a [M,K] . b [K,N] is column-major out^T (N x M) = b^T (N x K) . a^T.
  const MatmulShape s{1, 1, 3, 5, 7, false, false};
  MatmulPlan p = plan_matmul(s, float32, false, Activation::Linear, false);
  CHECK(p.transa == CUBLAS_OP_N);
  CHECK(p.transb == CUBLAS_OP_N);
  CHECK((p.m == 5 && p.n == 3 && p.k == 7));
  CHECK((p.a.rows == 5 && p.a.cols == 7 && p.a.ld == 5));  // b [7,5] row-major
  CHECK((p.b.rows == 7 && p.b.cols == 3 && p.b.ld == 7));  // a [3,7] row-major
  CHECK((p.d.rows == 5 && p.d.cols == 3 && p.d.ld == 5));
  CHECK((p.a.batch_count == 1 && p.b.batch_count == 1 && p.d.batch_count == 1));

  // a stored [K,M] = [7,3], b stored [N,K] = [5,7].
  p = plan_matmul({1, 1, 3, 5, 7, true, true}, float32, false, Activation::Linear, false);
  CHECK(p.transa == CUBLAS_OP_T);
  CHECK(p.transb == CUBLAS_OP_T);
  CHECK((p.m == 5 && p.n == 3 && p.k == 7));
  CHECK((p.a.rows == 7 && p.a.cols == 5 && p.a.ld == 7));
  CHECK((p.b.rows == 3 && p.b.cols == 7 && p.b.ld == 3));
  CHECK((p.d.rows == 5 && p.d.cols == 3 && p.d.ld == 5));

  p = plan_matmul({1, 1, 3, 5, 7, true, false}, float32, false, Activation::Linear, false);
  CHECK((p.transa == CUBLAS_OP_N && p.transb == CUBLAS_OP_T && p.a.ld == 5 && p.b.ld == 3));
  p = plan_matmul({1, 1, 3, 5, 7, false, true}, float32, false, Activation::Linear, false);
  CHECK((p.transa == CUBLAS_OP_T && p.transb == CUBLAS_OP_N && p.a.ld == 7 && p.b.ld == 7));

  // Batched: every layout carries the batch; strides are the matrix sizes.
  p = plan_matmul({4, 4, 3, 5, 7, false, false}, float16, false, Activation::Linear, false);
  CHECK((p.a.batch_count == 4 && p.b.batch_count == 4 && p.d.batch_count == 4));
  CHECK((p.a.batch_stride == 35 && p.b.batch_stride == 21 && p.d.batch_stride == 15));
  // Broadcast b: stride 0 re-reads the one matrix for every batch; likewise a broadcast a.
  p = plan_matmul({4, 1, 3, 5, 7, false, false}, bfloat16, false, Activation::Linear, false);
  CHECK((p.a.batch_count == 4 && p.a.batch_stride == 0 && p.b.batch_stride == 21 && p.d.batch_stride == 15));
  p = plan_matmul({1, 3, 3, 5, 7, false, true}, float64, false, Activation::Linear, false);
  CHECK((p.b.batch_count == 3 && p.b.batch_stride == 0 && p.a.batch_stride == 35 && p.d.batch_stride == 15));
}

TEST_CASE("plan_matmul picks compute, scale and data types per dtype") {
  const MatmulShape s{1, 1, 8, 8, 8, false, false};
  struct Want {
    DType dtype;
    bool tf32;
    cublasComputeType_t compute;
    cudaDataType_t scale, data;
  };
  for (const Want& w : {Want{float32, false, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F},
                        Want{float32, true, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_32F},
                        Want{float16, false, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16F},
                        Want{float16, true, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16F},  // TF32 is float32's only
                        Want{bfloat16, false, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF},
                        Want{float64, false, CUBLAS_COMPUTE_64F, CUDA_R_64F, CUDA_R_64F},
                        Want{float64, true, CUBLAS_COMPUTE_64F, CUDA_R_64F, CUDA_R_64F}}) {
    CAPTURE(to_string(w.dtype));
    CAPTURE(w.tf32);
    const MatmulPlan p = plan_matmul(s, w.dtype, true, Activation::Relu, w.tf32);
    CHECK(p.compute == w.compute);
    CHECK(p.scale_type == w.scale);
    CHECK((p.a.type == w.data && p.b.type == w.data && p.d.type == w.data && p.bias_type == w.data));
  }
  CHECK(contains(error_of([&] { plan_matmul(s, int32, false, Activation::Linear, false); }), "matmul: cuBLASLt takes"));
}

TEST_CASE("plan_matmul fuses bias and ReLU, and leaves GELU (erf on the CPU), sigmoid, tanh, SiLU to unary") {
  const MatmulShape s{2, 1, 5, 3, 4, false, true};
  for (const DtypeCase& dc : kDtypes) {
    for (Activation act : kActs) {
      for (bool has_bias : {false, true}) {
        CAPTURE(dc.name);
        CAPTURE(static_cast<int>(act));
        CAPTURE(has_bias);
        MatmulPlan p = plan_matmul(s, dc.dtype, has_bias, act, dc.tf32);
        const bool relu = act == Activation::Relu;
        const cublasLtEpilogue_t want = has_bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                                 : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
        CHECK(p.epilogue == want);
        CHECK(p.epilogue_bias == has_bias);
        CHECK_FALSE(p.add_bias_after);
        CHECK(p.unary_after == (act != Activation::Linear && !relu));
        if (p.unary_after) CHECK(p.post_op == act);
        CHECK(p.epilogue != CUBLASLT_EPILOGUE_GELU);
        CHECK(p.epilogue != CUBLASLT_EPILOGUE_GELU_BIAS);

        // The fallback when cuBLASLt has no fused algorithm: plain GEMM, then add, then unary.
        p = plan_matmul(s, dc.dtype, has_bias, act, PlanOptions{.allow_tf32 = dc.tf32, .fuse_epilogue = false});
        CHECK(p.epilogue == CUBLASLT_EPILOGUE_DEFAULT);
        CHECK((!p.epilogue_bias && p.add_bias_after == has_bias));
        CHECK(p.unary_after == (act != Activation::Linear));
        // A bias of another dtype cannot enter the epilogue; ReLU must then wait for the add.
        p = plan_matmul(s, dc.dtype, has_bias, act,
                        PlanOptions{.allow_tf32 = dc.tf32, .fuse_epilogue = true, .bias_dtype_matches = false});
        CHECK(p.add_bias_after == has_bias);
        CHECK(p.epilogue == (relu && !has_bias ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT));
      }
    }
  }
}

TEST_CASE("the plan's column-major GEMM equals the CPU backend's matmul on the same data") {
  std::uint64_t seed = 100;
  for_each_case([&](const Problem& pr, bool ta, bool tb, bool has_bias, Activation act) {
    for (const DtypeCase& dc : kDtypes) {
      CAPTURE(pr.m);
      CAPTURE(pr.n);
      CAPTURE(pr.k);
      CAPTURE(product(pr.batch_a));
      CAPTURE(product(pr.batch_b));
      CAPTURE(ta);
      CAPTURE(tb);
      CAPTURE(has_bias);
      CAPTURE(static_cast<int>(act));
      CAPTURE(dc.name);
      plan_matches_cpu(pr, ta, tb, has_bias, act, dc.dtype, PlanOptions{.allow_tf32 = dc.tf32}, true, seed);
      plan_matches_cpu(pr, ta, tb, has_bias, act, dc.dtype, PlanOptions{.allow_tf32 = dc.tf32, .fuse_epilogue = false},
                       true, seed);
    }
    seed += 3;
  });
}

TEST_CASE("negative control: without the operand swap the interpretation differs from the CPU") {
  // Feeding a as cuBLASLt's A (the naive row-major mistake) must not pass the comparison.
  for (const Problem& pr : kProblems) {
    if (pr.m == 1 && pr.n == 1 && pr.k == 1) continue;  // a 1x1x1 product commutes
    CAPTURE(pr.m);
    CHECK_FALSE(plan_matches_cpu(pr, false, false, false, Activation::Linear, float32, {}, false, 7, true));
  }
}

TEST_CASE("the real cuBLASLt descriptors hold every attribute of the plan") {
  const void* fake_bias = reinterpret_cast<const void*>(std::uintptr_t{0x7f0000001000});
  int checked = 0;
  for_each_case([&](const Problem& pr, bool ta, bool tb, bool has_bias, Activation act) {
    for (const DtypeCase& dc : kDtypes)
      for (bool fuse : {true, false}) {
        const MatmulShape s{product(pr.batch_a), product(pr.batch_b), pr.m, pr.n, pr.k, ta, tb};
        const MatmulPlan p =
            plan_matmul(s, dc.dtype, has_bias, act, PlanOptions{.allow_tf32 = dc.tf32, .fuse_epilogue = fuse});
        LtDescriptors d = make_descriptors(p, has_bias ? fake_bias : nullptr);
        check_descriptors(p, d, fake_bias);
        ++checked;
      }
  });
  MESSAGE("descriptor sets checked: ", checked);

  // Moving hands the descriptors over; the moved-from object owns nothing.
  LtDescriptors d = make_descriptors(plan_matmul({1, 1, 3, 5, 7}, float16, true, Activation::Relu, false), fake_bias);
  LtDescriptors e = std::move(d);
  CHECK((d.op == nullptr && d.a == nullptr && d.d == nullptr));
  CHECK(desc_attr<std::uint32_t>(e.op, CUBLASLT_MATMUL_DESC_EPILOGUE) == CUBLASLT_EPILOGUE_RELU_BIAS);
}

TEST_CASE("negative control: cuBLASLt rejects attributes of the wrong size, and check_cublas names the call") {
  LtDescriptors d = make_descriptors(plan_matmul({1, 1, 3, 5, 7}, float32, false, Activation::Linear, false));
  const std::int64_t wide = CUBLAS_OP_T;  // TRANSA is an int32
  const int s1 = cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide);
  CHECK(s1 == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(desc_attr<std::int32_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSA) == CUBLAS_OP_N);  // unchanged
  const std::int32_t narrow = 64;  // LD is an int64
  const int s2 = cublasLtMatrixLayoutSetAttribute(d.a, CUBLASLT_MATRIX_LAYOUT_LD, &narrow, sizeof narrow);
  CHECK(s2 == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(layout_attr<std::int64_t>(d.a, CUBLASLT_MATRIX_LAYOUT_LD) == 5);
  std::int32_t small = 0;  // reading an int64 attribute into 4 bytes fails too
  std::size_t written = 0;
  CHECK(cublasLtMatrixLayoutGetAttribute(d.a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &small, sizeof small,
                                         &written) == CUBLAS_STATUS_INVALID_VALUE);
  const std::string msg = error_of([&] { check_cublas(s1, "matmul: cublasLtMatmulDescSetAttribute(TRANSA)"); });
  CHECK(contains(msg, "matmul: cublasLtMatmulDescSetAttribute(TRANSA)"));
  CHECK(contains(msg, "CUBLAS_STATUS_INVALID_VALUE"));
}

TEST_CASE("alignment: the heuristic is told each pointer's alignment; 16-bit tensor-core alignment") {
  CHECK(address_alignment(0) == 256);
  CHECK(address_alignment(0x7f0000001000) == 256);
  CHECK(address_alignment(0x1010) == 16);
  CHECK(address_alignment(0x1008) == 8);
  CHECK(address_alignment(0x1002) == 2);
  CHECK(address_alignment(0x1001) == 1);

  const MatmulShape s{1, 1, 16, 8, 24, false, false};
  const MatmulAddresses aligned{0x10000, 0x20000, 0x30000, 0x40000};
  MatmulPlan p = plan_matmul(s, float16, true, Activation::Linear, {}, aligned);
  CHECK((p.align_a == 256 && p.align_b == 256 && p.align_d == 256 && p.align_bias == 256));
  CHECK(p.tensor_core_aligned);
  // cuBLASLt's A is b, its B is a: the alignments follow the swap.
  p = plan_matmul(s, float16, true, Activation::Linear, {}, {0x10002, 0x20008, 0x30010, 0x40004});
  CHECK((p.align_a == 8 && p.align_b == 2 && p.align_d == 16 && p.align_bias == 4));
  CHECK_FALSE(p.tensor_core_aligned);
  // A leading dimension of 5 halfs (10 bytes) breaks 16-byte column alignment (N for b and out,
  // K for a, M for a transposed a); an odd M alone does not.
  CHECK_FALSE(plan_matmul({1, 1, 16, 5, 24}, bfloat16, false, Activation::Linear, {}, aligned).tensor_core_aligned);
  CHECK_FALSE(plan_matmul({3, 3, 8, 8, 4}, float16, false, Activation::Linear, {}, aligned).tensor_core_aligned);
  CHECK_FALSE(plan_matmul({3, 3, 3, 8, 8, true}, float16, false, Activation::Linear, {}, aligned).tensor_core_aligned);
  CHECK(plan_matmul({3, 3, 3, 8, 8}, float16, false, Activation::Linear, {}, aligned).tensor_core_aligned);
  CHECK(plan_matmul({3, 1, 3, 5, 7}, float32, false, Activation::Linear, {}, aligned).tensor_core_aligned);  // 16-bit only
  // The heuristic's answer depends on alignment and epilogue, so the cache key does too.
  const std::string k0 = plan_key(plan_matmul(s, float16, true, Activation::Relu, {}, aligned));
  CHECK(k0 == plan_key(plan_matmul(s, float16, true, Activation::Relu, {}, aligned)));
  CHECK(k0 != plan_key(plan_matmul(s, float16, true, Activation::Relu, {}, {0x10008, 0x20000, 0x30000, 0x40000})));
  CHECK(k0 != plan_key(plan_matmul(s, float16, true, Activation::Linear, {}, aligned)));
  CHECK(k0 != plan_key(plan_matmul(s, bfloat16, true, Activation::Relu, {}, aligned)));
  CHECK(k0 != plan_key(plan_matmul({1, 1, 16, 8, 24, true, false}, float16, true, Activation::Relu, {}, aligned)));
  CHECK(plan_key(plan_matmul(s, float32, false, Activation::Linear, false)) !=
        plan_key(plan_matmul(s, float32, false, Activation::Linear, true)));
}

TEST_CASE("plan_key: plans that share a key run the same post-ops") {
  // matmul.cpp caches a whole plan under its key. On an H100 a dense with sigmoid ran the cached
  // plan of the same GEMM without activation (the key left out the post-ops), and returned the
  // pre-activation. Every (activation, bias, fused or not) of one shape: equal keys only for
  // plans equal in everything the run reads.
  const MatmulShape s{1, 1, 16, 8, 24};
  const MatmulAddresses aligned{0x10000, 0x20000, 0x30000, 0x40000};
  std::map<std::string, MatmulPlan> seen;
  for (DType d : {float32, float16, bfloat16, float64})
    for (Activation act : {Activation::Linear, Activation::Relu, Activation::Sigmoid, Activation::Tanh,
                           Activation::Gelu, Activation::Silu})
      for (bool bias : {false, true})
        for (bool fuse : {true, false}) {
          const MatmulPlan p = plan_matmul(s, d, bias, act, PlanOptions{.fuse_epilogue = fuse}, aligned);
          const auto [it, fresh] = seen.emplace(plan_key(p), p);
          if (fresh) continue;
          const MatmulPlan& q = it->second;
          CAPTURE(to_string(d));
          CAPTURE(static_cast<int>(act));
          CHECK(q.epilogue == p.epilogue);
          CHECK(q.epilogue_bias == p.epilogue_bias);
          CHECK(q.add_bias_after == p.add_bias_after);
          CHECK(q.unary_after == p.unary_after);
          CHECK((!p.unary_after || q.post_op == p.post_op));
        }
  // Activations applied after the GEMM are told apart by the key.
  CHECK(plan_key(plan_matmul(s, float32, true, Activation::Sigmoid, {}, aligned)) !=
        plan_key(plan_matmul(s, float32, true, Activation::Tanh, {}, aligned)));
  CHECK(plan_key(plan_matmul(s, float32, true, Activation::Sigmoid, {}, aligned)) !=
        plan_key(plan_matmul(s, float32, true, Activation::Linear, {}, aligned)));
}

TEST_CASE("plan_matmul rejects shapes cuBLASLt cannot take") {
  CHECK(contains(error_of([] { plan_matmul({1, 1, 0, 3, 4}, float32, false, Activation::Linear, false); }),
                 "matmul: cuBLASLt needs 1 <= M, N, K"));
  CHECK(contains(error_of([] { plan_matmul({1, 1, 3, 3, std::int64_t{1} << 31}, float32, false, Activation::Linear,
                                           false); }),
                 "matmul: cuBLASLt needs"));
  CHECK(contains(error_of([] { plan_matmul({2, 3, 3, 3, 3}, float32, false, Activation::Linear, false); }),
                 "neither equal nor broadcast"));
}

// ---- Fallbacks when cuBLASLt refuses a plan (the heuristic is simulated: it needs a GPU) -------

namespace {

/// A simulated heuristic: refuses (with `status`, or found = 0 when status is SUCCESS) every
/// plan `refuse` says, accepts the rest; records the plans it saw.
struct FakeHeuristic {
  std::function<bool(const MatmulPlan&)> refuse;
  int status = CUBLAS_STATUS_NOT_SUPPORTED;
  std::vector<MatmulPlan> seen;
  LtOutcome operator()(const MatmulPlan& p) {
    seen.push_back(p);
    if (refuse(p)) return LtOutcome{"cublasLtMatmulAlgoGetHeuristic", status, 0, CUBLAS_STATUS_SUCCESS};
    return LtOutcome{"cublasLtMatmulAlgoGetHeuristic", CUBLAS_STATUS_SUCCESS, 1, CUBLAS_STATUS_SUCCESS};
  }
};

bool has_stride0_batch(const MatmulPlan& p) {
  return (p.a.batch_count > 1 && p.a.batch_stride == 0) || (p.b.batch_count > 1 && p.b.batch_stride == 0);
}

ChosenPlan choose(const MatmulRequest& r, FakeHeuristic& h, std::vector<AttemptRecord>& history) {
  return choose_plan(r, first_attempt(r), history, [&h](const MatmulPlan& p) { return h(p); });
}

/// Every attempt next_attempt gives from the first until none is left (as if all were refused).
std::vector<MatmulAttempt> whole_chain(const MatmulRequest& r) {
  std::vector<MatmulAttempt> chain;
  for (std::optional<MatmulAttempt> t = first_attempt(r); t; t = next_attempt(r, *t, plan_attempt(r, *t))) {
    chain.push_back(*t);
    if (chain.size() > 16) break;  // a cycle: fails the size check below
  }
  return chain;
}

std::vector<double> piece(const std::vector<double>& v, std::int64_t offset, std::int64_t n) {
  std::vector<double> out(static_cast<std::size_t>(n), std::numeric_limits<double>::quiet_NaN());
  for (std::int64_t i = 0; i < n; ++i)
    if (offset + i < static_cast<std::int64_t>(v.size())) out[static_cast<std::size_t>(i)] = v[static_cast<std::size_t>(offset + i)];
  return out;
}

/// The chosen attempt run as matmul.cpp runs it (one GEMM, or one per batch at batch_strides),
/// on the row-major a and b.
std::vector<double> run_chosen(const MatmulRequest& r, const ChosenPlan& c, const std::vector<double>& va,
                               const std::vector<double>& vb, const std::vector<double>& bias, std::size_t out_size) {
  if (c.attempt.batch != BatchMode::Looped) return run_plan(c.plan, vb, va, bias, out_size);
  const MatmulShape& s = r.shape;
  const BatchStrides st = batch_strides(s);
  std::vector<double> out(out_size, std::numeric_limits<double>::quiet_NaN());
  for (std::int64_t q = 0; q < std::max(s.batch_a, s.batch_b); ++q) {
    const auto d = run_plan(c.plan, piece(vb, q * st.b, s.k * s.n), piece(va, q * st.a, s.m * s.k), bias,
                            static_cast<std::size_t>(s.m * s.n));
    std::copy(d.begin(), d.end(), out.begin() + q * st.out);
  }
  return out;
}

}  // namespace

TEST_CASE("fallback chain: float64 with a bias and ReLU epilogue falls back to the unfused GEMM") {
  const MatmulRequest r{.shape = {1, 1, 5, 3, 4, false, true}, .dtype = float64, .has_bias = true,
                        .bias_dtype = float64, .act = Activation::Relu};
  // cuBLASLt without epilogues for double: every fused plan refused.
  FakeHeuristic h{.refuse = [](const MatmulPlan& p) {
    return p.compute == CUBLAS_COMPUTE_64F && p.epilogue != CUBLASLT_EPILOGUE_DEFAULT;
  }};
  std::vector<AttemptRecord> history;
  const ChosenPlan c = choose(r, h, history);
  CHECK(c.attempt == MatmulAttempt{.fuse_epilogue = false});
  CHECK(c.plan.epilogue == CUBLASLT_EPILOGUE_DEFAULT);
  CHECK((c.plan.add_bias_after && c.plan.unary_after && c.plan.post_op == UnaryOp::Relu));
  REQUIRE(history.size() == 1);
  CHECK(history[0].epilogue == CUBLASLT_EPILOGUE_RELU_BIAS);
  CHECK(history[0].outcome.status == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(h.seen.size() == 2);

  // The heuristic's other way of saying no (success, no algorithm) is the same refusal.
  FakeHeuristic none{.refuse = h.refuse, .status = CUBLAS_STATUS_SUCCESS};
  history.clear();
  CHECK(choose(r, none, history).attempt == MatmulAttempt{.fuse_epilogue = false});
  CHECK((history.size() == 1 && history[0].outcome.found == 0));

  // Without a batch and with aligned operands nothing follows the unfused GEMM.
  CHECK(whole_chain(r) == std::vector<MatmulAttempt>{{}, {.fuse_epilogue = false}});
  // float64 without bias or activation has no epilogue to drop: one attempt.
  MatmulRequest plain = r;
  plain.has_bias = false;
  plain.act = Activation::Linear;
  CHECK(whole_chain(plain).size() == 1);
}

TEST_CASE("fallback chain: a stride-0 broadcast batch folds into M or loops over the batch") {
  // cuBLASLt refusing a batch stride of 0 (a batch of 1 broadcast against 4).
  FakeHeuristic h{.refuse = has_stride0_batch, .status = CUBLAS_STATUS_INVALID_VALUE};
  const MatmulRequest folds{.shape = {4, 1, 5, 3, 4, false, true}, .dtype = float16, .has_bias = true,
                            .bias_dtype = float16, .act = Activation::Relu};
  CHECK(has_stride0_batch(plan_attempt(folds, {})));
  std::vector<AttemptRecord> history;
  ChosenPlan c = choose(folds, h, history);
  // Fused, then unfused, strided; then fused again with b's one matrix under a [4*5, 4] a.
  CHECK(c.attempt == MatmulAttempt{.batch = BatchMode::Folded});
  CHECK(c.plan.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS);
  CHECK((c.plan.n == 20 && c.plan.m == 3 && c.plan.k == 4 && c.plan.d.batch_count == 1));
  REQUIRE(history.size() == 2);
  CHECK((history[0].attempt == MatmulAttempt{} && history[1].attempt == MatmulAttempt{.fuse_epilogue = false}));
  CHECK(whole_chain(folds) == std::vector<MatmulAttempt>{{},
                                                         {.fuse_epilogue = false},
                                                         {.batch = BatchMode::Folded},
                                                         {.fuse_epilogue = false, .batch = BatchMode::Folded},
                                                         {.batch = BatchMode::Looped},
                                                         {.fuse_epilogue = false, .batch = BatchMode::Looped}});

  // A broadcast a (or a transposed a under a broadcast b) cannot fold: one GEMM per batch.
  for (const MatmulShape& s : {MatmulShape{1, 3, 5, 3, 4, false, false}, MatmulShape{3, 1, 5, 3, 4, true, false}}) {
    CAPTURE(s.batch_a);
    const MatmulRequest r{.shape = s, .dtype = bfloat16, .act = Activation::Linear};
    CHECK_FALSE(can_fold_batch(s));
    history.clear();
    c = choose(r, h, history);
    CHECK(c.attempt == MatmulAttempt{.batch = BatchMode::Looped});  // no epilogue: nothing to unfuse
    CHECK((c.plan.a.batch_count == 1 && c.plan.m == 3 && c.plan.n == 5));
    CHECK(history.size() == 1);
  }
  CHECK(batch_strides({1, 3, 5, 3, 4}).a == 0);
  CHECK(batch_strides({1, 3, 5, 3, 4}).b == 12);
  CHECK(batch_strides({1, 3, 5, 3, 4}).out == 15);
  CHECK_FALSE(can_fold_batch({std::int64_t{1} << 20, 1, 1 << 12, 3, 4}));  // batch*M over int32
}

TEST_CASE("fallback plans compute the CPU backend's matmul: folded batch and one GEMM per batch") {
  std::uint64_t seed = 500;
  int folded = 0, looped = 0;
  for_each_case([&](const Problem& pr, bool ta, bool tb, bool has_bias, Activation act) {
    const MatmulShape s{product(pr.batch_a), product(pr.batch_b), pr.m, pr.n, pr.k, ta, tb};
    if (std::max(s.batch_a, s.batch_b) == 1) return;
    for (BatchMode mode : {BatchMode::Folded, BatchMode::Looped}) {
      if (mode == BatchMode::Folded && !can_fold_batch(s)) continue;
      for (bool fuse : {true, false}) {
        CAPTURE(s.batch_a);
        CAPTURE(s.batch_b);
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(has_bias);
        CAPTURE(static_cast<int>(act));
        CAPTURE(static_cast<int>(mode));
        const MatmulRequest r{.shape = s, .dtype = float32, .has_bias = has_bias, .bias_dtype = float32, .act = act};
        const MatmulAttempt t{.fuse_epilogue = fuse, .batch = mode};
        const ChosenPlan c{t, plan_attempt(r, t)};
        const Shape sa = operand_shape(pr.batch_a, ta ? pr.k : pr.m, ta ? pr.m : pr.k);
        const Shape sb = operand_shape(pr.batch_b, tb ? pr.n : pr.k, tb ? pr.k : pr.n);
        Tensor a = random(sa, float64, Device::cpu(), seed);
        Tensor b = random(sb, float64, Device::cpu(), seed + 1);
        Tensor bias = has_bias ? random({pr.n}, float64, Device::cpu(), seed + 2) : Tensor();
        Tensor out = Tensor::empty(operand_shape(pr.batch_a.empty() ? pr.batch_b : pr.batch_a, pr.m, pr.n), float64,
                                   Device::cpu());
        detail::backend(Device::cpu()).matmul(a, b, ta, tb, bias, act, out);
        const auto got = run_chosen(r, c, a.to_vector<double>(), b.to_vector<double>(),
                                    has_bias ? bias.to_vector<double>() : std::vector<double>{},
                                    static_cast<std::size_t>(out.numel()));
        check_close(got, out.to_vector<double>(), tolerance(float64), "fallback plan vs CPU matmul");
        ++(mode == BatchMode::Folded ? folded : looped);
        seed += 3;
      }
    }
  });
  CHECK(folded > 0);
  CHECK(looped > 0);
}

TEST_CASE("fallback chain: unaligned 16-bit pointers get aligned copies; a loop keeps its strides' alignment") {
  // Copies first for 16-bit under 16 bytes (bias included), never for float32 or aligned pointers.
  const MatmulRequest odd16{.shape = {1, 1, 16, 8, 24}, .dtype = bfloat16, .has_bias = true, .bias_dtype = bfloat16,
                            .act = Activation::Relu, .addresses = {0x10002, 0x20000, 0x30000, 0x40000}};
  CHECK(first_attempt(odd16) == MatmulAttempt{.aligned_copies = true});
  MatmulRequest odd_bias = odd16;
  odd_bias.addresses = {0x10000, 0x20000, 0x30000, 0x40008};
  CHECK(first_attempt(odd_bias) == MatmulAttempt{.aligned_copies = true});
  odd_bias.has_bias = false;
  CHECK(first_attempt(odd_bias) == MatmulAttempt{});
  MatmulRequest odd32 = odd16;
  odd32.dtype = float32;
  odd32.bias_dtype = float32;
  CHECK(first_attempt(odd32) == MatmulAttempt{});
  CHECK(needs_aligned_copy(0x1002));
  CHECK(needs_aligned_copy(0x1008));
  CHECK_FALSE(needs_aligned_copy(0x1010));
  CHECK_FALSE(needs_aligned_copy(0));  // no operand (a missing bias)
  // a at 2 bytes (a slice at an odd half), out at 8: cuBLASLt refusing 16-bit operands under 16 bytes.
  const MatmulRequest r{.shape = {1, 1, 16, 8, 24}, .dtype = float16, .has_bias = true, .bias_dtype = float16,
                        .act = Activation::Relu, .addresses = {0x10002, 0x20000, 0x30008, 0x40000}};
  FakeHeuristic h{.refuse = [](const MatmulPlan& p) {
    return std::min({p.align_a, p.align_b, p.align_d, p.align_bias}) < 16;
  }};
  std::vector<AttemptRecord> history;
  const ChosenPlan c = choose(r, h, history);
  CHECK(c.attempt == MatmulAttempt{.aligned_copies = true});
  CHECK(c.plan.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS);
  CHECK((c.plan.align_a == 256 && c.plan.align_b == 256 && c.plan.align_d == 256));  // a is cuBLASLt's B
  CHECK(history.empty());  // 16-bit operands under 16 bytes aligned start with copies (first_attempt)
  // Where the copies' fused epilogue is refused too, the epilogue is unfused on the copies.
  FakeHeuristic no_epilogue{.refuse = [](const MatmulPlan& p) {
    return std::min({p.align_a, p.align_b, p.align_d, p.align_bias}) < 16 || p.epilogue != CUBLASLT_EPILOGUE_DEFAULT;
  }};
  history.clear();
  CHECK(choose(r, no_epilogue, history).attempt == MatmulAttempt{.fuse_epilogue = false, .aligned_copies = true});

  // In a loop, batch q of a starts q * M*K elements in: 3*4 halfs = 24 bytes, so 8-byte aligned.
  const MatmulRequest loop{.shape = {2, 1, 3, 8, 4, true, false}, .dtype = float16,
                           .addresses = {0x10000, 0x20000, 0x30000, 0}};
  const MatmulAddresses x = attempt_addresses(loop, {.batch = BatchMode::Looped});
  CHECK(address_alignment(x.a) == 8);
  CHECK(address_alignment(x.b) == 256);  // broadcast: the same matrix every time
  CHECK(address_alignment(x.out) == 16);  // 3*8 halfs = 48 bytes
  CHECK(whole_chain(loop) == std::vector<MatmulAttempt>{{}, {.batch = BatchMode::Looped}});
}

TEST_CASE("fallback chain: every chain ends, without repeats, in an mpt::Error naming op, shape, dtypes and statuses") {
  const MatmulAddresses odd{0x10002, 0x20000, 0x30000, 0x40000};
  for_each_case([&](const Problem& pr, bool ta, bool tb, bool has_bias, Activation act) {
    for (const DtypeCase& dc : kDtypes)
      for (const MatmulAddresses& addresses : {MatmulAddresses{}, odd}) {
        const MatmulRequest r{.shape = {product(pr.batch_a), product(pr.batch_b), pr.m, pr.n, pr.k, ta, tb},
                              .dtype = dc.dtype, .has_bias = has_bias, .bias_dtype = dc.dtype, .act = act,
                              .allow_tf32 = dc.tf32, .addresses = addresses};
        const auto chain = whole_chain(r);
        REQUIRE(chain.size() <= 8);
        for (std::size_t i = 0; i < chain.size(); ++i)
          for (std::size_t j = 0; j < i; ++j) CHECK_FALSE(chain[i] == chain[j]);
        FakeHeuristic all{.refuse = [](const MatmulPlan&) { return true; }};
        std::vector<AttemptRecord> history;
        const std::string err = error_of([&] { choose(r, all, history); });
        CHECK(history.size() == chain.size());
        CHECK(contains(err, "matmul on cuda:0: cuBLASLt ran none of " + std::to_string(chain.size())));
      }
  });

  // A broadcast b under bias and ReLU, each attempt refused differently, as the heuristic may.
  const MatmulRequest r{.shape = {4, 1, 5, 3, 4, false, true}, .dtype = float16, .has_bias = true,
                        .bias_dtype = float16, .act = Activation::Relu, .device = 1};
  const LtOutcome outcomes[] = {{"cublasLtMatmulAlgoGetHeuristic", CUBLAS_STATUS_NOT_SUPPORTED, 0, 0},
                                {"cublasLtMatmulAlgoGetHeuristic", CUBLAS_STATUS_SUCCESS, 0, 0},
                                {"cublasLtMatmulAlgoGetHeuristic", CUBLAS_STATUS_INVALID_VALUE, 0, 0},
                                {"cublasLtMatmulAlgoGetHeuristic", CUBLAS_STATUS_SUCCESS, 1, CUBLAS_STATUS_NOT_SUPPORTED},
                                {"cublasLtMatmulAlgoGetHeuristic", CUBLAS_STATUS_NOT_SUPPORTED, 0, 0},
                                {"cublasLtMatmulAlgoGetHeuristic", CUBLAS_STATUS_NOT_SUPPORTED, 0, 0}};
  std::vector<AttemptRecord> history;
  std::size_t calls = 0;
  const std::string err = error_of([&] {
    choose_plan(r, {}, history, [&](const MatmulPlan&) { return outcomes[std::min<std::size_t>(calls++, 5)]; });
  });
  CHECK(calls == 6);
  CHECK(err ==
        "matmul on cuda:1: cuBLASLt ran none of 6 plans for float16 operands (compute CUBLAS_COMPUTE_32F, bias "
        "float16, activation relu) of batch 4 (a 4, b 1), M=5 N=3 K=4, transpose_a=false transpose_b=true "
        "(addresses a 256, b 256, out 256 byte aligned): "
        "epilogue RELU_BIAS, strided batch: cublasLtMatmulAlgoGetHeuristic CUBLAS_STATUS_NOT_SUPPORTED; "
        "unfused (bias and activation as separate ops), strided batch: cublasLtMatmulAlgoGetHeuristic found no "
        "algorithm; "
        "epilogue RELU_BIAS, batch folded into M: cublasLtMatmulAlgoGetHeuristic CUBLAS_STATUS_INVALID_VALUE; "
        "unfused (bias and activation as separate ops), batch folded into M: cublasLtMatmulAlgoGetHeuristic gave an "
        "algorithm in state CUBLAS_STATUS_NOT_SUPPORTED; "
        "epilogue RELU_BIAS, one GEMM per batch: cublasLtMatmulAlgoGetHeuristic CUBLAS_STATUS_NOT_SUPPORTED; "
        "unfused (bias and activation as separate ops), one GEMM per batch: cublasLtMatmulAlgoGetHeuristic "
        "CUBLAS_STATUS_NOT_SUPPORTED");
  // A launch refused after the heuristic accepted (matmul.cpp records it the same way).
  const MatmulRequest one{.shape = {1, 1, 2, 3, 4, true, false}, .dtype = float64, .act = Activation::Linear,
                          .addresses = {0x1008, 0x2000, 0x3000, 0}};
  CHECK(matmul_failure_message(one, {{MatmulAttempt{}, CUBLASLT_EPILOGUE_DEFAULT,
                                      LtOutcome{"cublasLtMatmul", CUBLAS_STATUS_INVALID_VALUE, 1, 0}}}) ==
        "matmul on cuda:0: cuBLASLt ran none of 1 plan for float64 operands (compute CUBLAS_COMPUTE_64F, bias none, "
        "activation linear) of batch 1 (a 1, b 1), M=2 N=3 K=4, transpose_a=true transpose_b=false (addresses a 8, "
        "b 256, out 256 byte aligned): no epilogue, strided batch: cublasLtMatmul CUBLAS_STATUS_INVALID_VALUE");
}
