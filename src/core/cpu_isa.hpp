#pragma once
// The x86 instruction-set tier mpt's own CPU kernels run at (docs/design.md, "CPU ISA tiers").
// Every vector kernel is compiled for each tier (src/backend/cpu/isa_dispatch.hpp) and the
// process runs one: the best its CPU has, capped by MPT_CPU_ISA=baseline|avx2|avx512. The same
// cap, when set, caps oneDNN (ONEDNN_MAX_CPU_ISA, where that is not set itself) and the 16-bit
// conversions, so an AVX-512 machine measures and tests the AVX2 and baseline paths too.

namespace mpt::detail {

/// In order of capability. avx2: AVX2, FMA, F16C, BMI1/2 (x86-64-v3's vector part); avx512:
/// AVX-512 F, BW, DQ, VL, CD besides (x86-64-v4). Elsewhere than x86-64: always baseline.
enum class CpuIsa : int { baseline = 0, avx2 = 1, avx512 = 2 };

/// What this CPU has (and the OS saves the registers of).
CpuIsa hardware_cpu_isa();
/// The tier this process runs: hardware_cpu_isa() capped by MPT_CPU_ISA; decided once. An
/// unreadable MPT_CPU_ISA leaves the hardware tier here, and check_cpu_isa_setting() raises it.
CpuIsa cpu_isa();
/// mpt::Error when MPT_CPU_ISA is set to something other than baseline, avx2 or avx512 (any
/// case); called by every backend lookup of the CPU and test devices.
void check_cpu_isa_setting();
/// True when MPT_CPU_ISA is set (readably): the cap is then passed to oneDNN too.
bool cpu_isa_capped();
const char* cpu_isa_name(CpuIsa isa);

}  // namespace mpt::detail
