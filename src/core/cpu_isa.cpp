#include "core/cpu_isa.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "mpt/error.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MPT_ISA_X86 1
#include <cpuid.h>
#endif

namespace mpt::detail {
namespace {

constexpr const char* kNames[] = {"baseline", "avx2", "avx512"};

CpuIsa detect() {
#ifdef MPT_ISA_X86
  __builtin_cpu_init();
  // __builtin_cpu_supports' AVX bits include the XGETBV check that the OS saves the registers.
  // F16C through CPUID: clang's __builtin_cpu_supports does not know it.
  unsigned a, b, c, d;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c &&
                    __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512cd");
  return avx512 ? CpuIsa::avx512 : avx2 ? CpuIsa::avx2 : CpuIsa::baseline;
#else
  return CpuIsa::baseline;
#endif
}

struct Setting {
  CpuIsa hardware = CpuIsa::baseline;
  CpuIsa active = CpuIsa::baseline;
  bool capped = false;
  std::string error;  // an unreadable MPT_CPU_ISA
};

Setting read_setting() {
  Setting s;
  s.hardware = s.active = detect();
  const char* env = std::getenv("MPT_CPU_ISA");
  if (env == nullptr || *env == '\0') return s;
  std::string v(env);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (int i = 0; i < 3; ++i) {
    if (v == kNames[i]) {
      s.active = static_cast<CpuIsa>(std::min(i, static_cast<int>(s.hardware)));
      s.capped = true;
      return s;
    }
  }
  s.error = "MPT_CPU_ISA: expected baseline, avx2 or avx512, got '" + std::string(env) + "'";
  return s;
}

const Setting& setting() {
  static const Setting s = read_setting();
  return s;
}

}  // namespace

CpuIsa hardware_cpu_isa() { return setting().hardware; }
CpuIsa cpu_isa() { return setting().active; }
bool cpu_isa_capped() { return setting().capped; }
const char* cpu_isa_name(CpuIsa isa) { return kNames[static_cast<int>(isa)]; }

void check_cpu_isa_setting() {
  if (!setting().error.empty()) throw Error(setting().error);
}

}  // namespace mpt::detail
