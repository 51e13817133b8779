// The CPU ISA tier (core/cpu_isa.hpp): MPT_CPU_ISA caps mpt's own kernels, the 16-bit
// conversions and oneDNN together. CTest runs this program with no cap, with each cap, and with
// an unreadable one (tests/CMakeLists.txt); each run checks what its environment asked for.
#include <doctest/doctest.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "backend/cpu/conv_small.hpp"
#include "backend/cpu/packed_gemm.hpp"
#include "core/cpu_isa.hpp"
#include "mpt/half.hpp"
#include "mpt/mpt.hpp"

namespace {

using mpt::detail::CpuIsa;

std::string env_cap() {
  const char* e = std::getenv("MPT_CPU_ISA");
  std::string v = e ? e : "";
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return v;
}

bool readable(const std::string& v) { return v == "baseline" || v == "avx2" || v == "avx512"; }

}  // namespace

TEST_CASE("MPT_CPU_ISA caps the tier, the conversions and oneDNN") {
  const std::string cap = env_cap();
  if (!cap.empty() && !readable(cap)) return;  // the next test case's run
  const CpuIsa hw = mpt::detail::hardware_cpu_isa();
  const CpuIsa isa = mpt::detail::cpu_isa();
  MESSAGE("hardware tier ", mpt::detail::cpu_isa_name(hw), ", running ", mpt::detail::cpu_isa_name(isa));
  CHECK(isa <= hw);
  CHECK(mpt::detail::cpu_isa_capped() == !cap.empty());
  if (cap.empty()) {
    CHECK(isa == hw);
  } else {
    const CpuIsa want = cap == "baseline" ? CpuIsa::baseline : cap == "avx2" ? CpuIsa::avx2 : CpuIsa::avx512;
    CHECK(isa == std::min(want, hw));
    CHECK(std::string(mpt::detail::cpu_isa_name(isa)) == (want <= hw ? cap : mpt::detail::cpu_isa_name(hw)));
  }
  // The conversions follow the tier: F16C is part of the avx2 tier, AVX-512 BW/VL of avx512.
  const std::string conv = mpt::conversion_isa();
  CHECK(conv == (isa == CpuIsa::avx512 ? "avx512" : isa == CpuIsa::avx2 ? "f16c" : "portable"));

  // oneDNN is capped with it once its engine exists (the first oneDNN primitive makes it: here a
  // convolution with more input channels than the direct kernel takes, at every tier).
  mpt::Tensor a = mpt::ops::conv2d(mpt::Tensor::ones({1, 3, 3, 8}), mpt::Tensor::ones({3, 3, 8, 4}));
  CHECK(a.to_vector<float>()[0] == 72.f);
  if (!cap.empty() && std::getenv("ONEDNN_MAX_CPU_ISA") == nullptr) {
    const auto effective = dnnl::get_effective_cpu_isa();
    if (isa == CpuIsa::avx2) CHECK(effective == dnnl::cpu_isa::avx2);
    if (isa == CpuIsa::baseline) CHECK(effective == dnnl::cpu_isa::sse41);
    if (isa == CpuIsa::avx512) CHECK(effective != dnnl::cpu_isa::avx512_core_amx);
  }

  // The per-tier path rule: the first-layer direct convolution runs at the avx512 tier only
  // (below it oneDNN's jit:avx2 convolutions are faster: docs/design.md).
  CHECK(mpt::cpu::small_conv_applies({8, 28, 28, 1}, {3, 3, 1, 32}, mpt::float32) == (isa == CpuIsa::avx512));
  // The packed 16-bit GEMM: above the baseline tier, for every non-empty shape (model A's first
  // layer and model D's 2048-wide ones alike); MPT_CPU_GEMM16 unset in these runs.
  if (!std::getenv("MPT_CPU_GEMM16")) {
    CHECK(mpt::cpu::packed_gemm16_applies({1, 1, 256, 512, 784}) == (isa != CpuIsa::baseline));
    CHECK(mpt::cpu::packed_gemm16_applies({1, 1, 512, 2048, 2048}) == (isa != CpuIsa::baseline));
    CHECK_FALSE(mpt::cpu::packed_gemm16_applies({1, 1, 512, 0, 2048}));
  }
  // float32 GEMMs take it at the avx2 tier only (oneDNN's are as fast or faster at avx512, and the
  // baseline has no FMA); MPT_CPU_GEMM32 unset.
  if (!std::getenv("MPT_CPU_GEMM32")) {
    CHECK(mpt::cpu::packed_gemm32_applies({1, 1, 256, 512, 784}) == (isa == CpuIsa::avx2));
    CHECK(mpt::cpu::packed_gemm32_applies({1, 1, 256, 1024, 4096}) == (isa == CpuIsa::avx2));
    CHECK_FALSE(mpt::cpu::packed_gemm32_applies({1, 1, 0, 512, 784}));
  }
}

TEST_CASE("an unreadable MPT_CPU_ISA is an mpt::Error naming it") {
  const std::string cap = env_cap();
  if (cap.empty() || readable(cap)) return;  // the other runs
  // The tier falls back to the hardware's, and the first op on the CPU raises the error.
  CHECK(mpt::detail::cpu_isa() == mpt::detail::hardware_cpu_isa());
  CHECK_THROWS_WITH_AS(mpt::ops::add(mpt::Tensor::ones({2}), mpt::Tensor::ones({2})),
                       doctest::Contains("MPT_CPU_ISA: expected baseline, avx2 or avx512, got"), mpt::Error);
}
