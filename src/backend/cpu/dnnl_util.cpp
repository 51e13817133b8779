#include "backend/cpu/dnnl_util.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace mpt::cpu {
namespace {

// oneDNN 2.6 picks AMX on CPUs that report it, but AMX tile state is not usable on every
// Linux guest (seen here: SIGILL inside oneDNN's AMX kernels even after ARCH_REQ_XCOMP_PERM
// succeeds). AVX-512 BF16 is the default ceiling; MPT_ONEDNN_AMX=1 (after requesting tile
// permission) or an explicit ONEDNN_MAX_CPU_ISA lifts it.
void prepare_cpu_isa() {
  if (std::getenv("ONEDNN_MAX_CPU_ISA") || std::getenv("DNNL_MAX_CPU_ISA")) return;
  const char* amx = std::getenv("MPT_ONEDNN_AMX");
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
  if (amx && std::string(amx) == "1" && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0)
    return;
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

dnnl::stream& dnnl_stream() {
  thread_local dnnl::stream stream(dnnl_engine());
  return stream;
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
