#include "backend/cpu/dnnl_util.hpp"

#include "core/cpu_isa.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__linux__) && defined(__x86_64__)
#include <dlfcn.h>

// oneDNN 2.6 takes the AMX palette id from CPUID leaf 0x1D, which some hypervisors (Firecracker
// caps the basic CPUID range at 0x1C) do not expose: every tile config it loads then has
// palette_id 0, LDTILECFG leaves the tiles unconfigured and the first TILEZERO raises #UD (SIGILL).
// oneDNN calls this exported function through its PLT, so this definition replaces its own and
// loads palette 1 (the only one AMX has) where oneDNN wrote 0.
// (Inline asm with a 64-byte memory operand: GCC 12's _tile_loadconfig lets it drop most of the copy.)
namespace dnnl::impl::cpu::x64 {
void amx_tile_configure(const char palette[64]) {
  struct TileConfig {
    unsigned char bytes[64];
  } cfg;
  std::memcpy(cfg.bytes, palette, sizeof cfg.bytes);
  if (cfg.bytes[0] == 0) cfg.bytes[0] = 1;
  asm volatile("ldtilecfg %0" : : "m"(cfg));
}
}  // namespace dnnl::impl::cpu::x64
// The definition above by a name that cannot be preempted, to check which one oneDNN binds to.
extern "C" void mpt_amx_tile_configure(const char*)
    __attribute__((alias("_ZN4dnnl4impl3cpu3x6418amx_tile_configureEPKc"), visibility("hidden")));
#endif

namespace mpt::cpu {
namespace {

bool amx_on = false;  // set once, before the engine exists

// oneDNN 2.6 picks AMX on CPUs that report it; without the amx_tile_configure fix above its AMX
// kernels die with SIGILL on guests that hide CPUID leaf 0x1D. AMX is used when the fix is in
// effect and tile permission is granted; otherwise (or with MPT_ONEDNN_AMX=0) oneDNN is capped at
// AVX-512 BF16. An explicit ONEDNN_MAX_CPU_ISA wins over both. MPT_CPU_ISA (core/cpu_isa.hpp)
// caps oneDNN at the same tier (avx512: AVX-512 BF16, so no AMX; avx2: AVX2; baseline: SSE4.1,
// oneDNN's lowest).
void prepare_cpu_isa() {
  if (std::getenv("ONEDNN_MAX_CPU_ISA") || std::getenv("DNNL_MAX_CPU_ISA")) return;
  if (detail::cpu_isa_capped()) {
    const detail::CpuIsa isa = detail::cpu_isa();
    try {
      dnnl::set_max_cpu_isa(isa == detail::CpuIsa::avx512 ? dnnl::cpu_isa::avx512_core_bf16
                            : isa == detail::CpuIsa::avx2 ? dnnl::cpu_isa::avx2
                                                          : dnnl::cpu_isa::sse41);
    } catch (const dnnl::error&) {  // already fixed by an earlier primitive: keep it
    }
    return;
  }
  const char* amx = std::getenv("MPT_ONEDNN_AMX");
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
  // Only where oneDNN binds to the amx_tile_configure above (not when its own comes first in lookup).
  const bool palette_fixed = dlsym(RTLD_DEFAULT, "_ZN4dnnl4impl3cpu3x6418amx_tile_configureEPKc") ==
                             reinterpret_cast<void*>(&mpt_amx_tile_configure);
  if (!(amx && std::string(amx) == "0") && palette_fixed &&
      syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0) {
    unsigned a, b, c, d;  // CPUID.(7,0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE
    amx_on = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1);
    return;
  }
#endif
  try {
    dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_bf16);
  } catch (const dnnl::error&) {  // already fixed by an earlier primitive: keep it
  }
}

}  // namespace

dnnl::engine& dnnl_engine() {
  static dnnl::engine engine = [] {
    prepare_cpu_isa();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

bool amx_enabled() {
  dnnl_engine();
  return amx_on;
}

bool dnnl_has_bf16() {
  static const bool has = [] {
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc md({16, 16}, dt::bf16, dnnl::memory::format_tag::ab);
    try {
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(md, md, md), dnnl_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return has;
}

bool bf16_dot_full_rate() {
  static const bool full = [] {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    unsigned a, b, c, d;  // CPUID.(7,1):EAX bit 5 AVX512_BF16
    return detail::cpu_isa() == detail::CpuIsa::avx512 && __builtin_cpu_is("amd") && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1) && dnnl_has_bf16();
#else
    return false;
#endif
  }();
  return full;
}

bool bf16_gemm_native() {
  static const bool native = [] {
    if (!dnnl_has_bf16()) return false;
    const char* e = std::getenv("MPT_CPU_BF16_MATMUL");
    if (e && !std::strcmp(e, "native")) return true;
    if (e && !std::strcmp(e, "float32")) return false;
    return amx_enabled() || bf16_dot_full_rate();
  }();
  return native;
}

dnnl::stream& dnnl_stream() {
  thread_local dnnl::stream stream(dnnl_engine());
  return stream;
}

dnnl::primitive_attr activation_attr(Activation act) {
  using alg = dnnl::algorithm;
  const float p = static_cast<float>(common::unary_default_param(act));
  alg a = alg::undef;
  float alpha = 0.f, beta = 0.f;
  switch (act) {
    case UnaryOp::Linear: return {};
    case UnaryOp::Exp: a = alg::eltwise_exp; break;
    case UnaryOp::Relu: a = alg::eltwise_relu; break;
    case UnaryOp::Relu6: a = alg::eltwise_clip_v2, beta = 6.f; break;
    case UnaryOp::LeakyRelu: a = alg::eltwise_relu, alpha = p; break;
    case UnaryOp::Sigmoid: a = alg::eltwise_logistic; break;
    case UnaryOp::Tanh: a = alg::eltwise_tanh; break;
    case UnaryOp::Gelu: a = alg::eltwise_gelu_erf; break;
    case UnaryOp::GeluTanh: a = alg::eltwise_gelu_tanh; break;
    case UnaryOp::Silu: a = alg::eltwise_swish, alpha = 1.f; break;
    case UnaryOp::Neg: case UnaryOp::Log: case UnaryOp::Sqrt: case UnaryOp::Square: case UnaryOp::Abs:
    case UnaryOp::Sign:
      fail("oneDNN epilogue: ", common::unary_name(act), " is not an activation");
  }
  dnnl::post_ops po;
  po.append_eltwise(1.f, a, alpha, beta);
  dnnl::primitive_attr attr;
  attr.set_post_ops(po);
  return attr;
}

dnnl::memory::data_type dnnl_type(DType d) {
  using dt = dnnl::memory::data_type;
  switch (d) {
    case DType::Float32: return dt::f32;
    case DType::BFloat16: return dt::bf16;
    case DType::Float16: return dt::f16;
    case DType::Int32: return dt::s32;
    case DType::UInt8: return dt::u8;
    default: fail("oneDNN: no oneDNN data type for ", to_string(d));
  }
}

}  // namespace mpt::cpu
