#include "seqpar/core/cpu_isa.h"

#include <algorithm>
#include <cstdlib>

#include "seqpar/core/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#define SEQPAR_X86 1
#else
#define SEQPAR_X86 0
#endif

namespace seqpar {

namespace {

#if SEQPAR_X86
// F16C from CPUID leaf 1 (ECX bit 29): not every compiler's __builtin_cpu_supports names it. The
// AVX check beside it covers the OS's support for the YMM state. Read once: CPUID is slow, and in
// a virtual machine it traps to the hypervisor, while the kernels ask on every call.
bool cpu_has_f16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  }();
  return has;
}
#endif

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
#if SEQPAR_X86
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::kAvx512:
      return cpu_has(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#else
    default:
      return false;
#endif
  }
  return false;
}

bool cpu_has_avx_vnni() {
#if SEQPAR_X86
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return cpu_has(Isa::kAvx2) && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4)) != 0;
  }();
  return has;
#else
  return false;
#endif
}

bool cpu_has_amx_int8() {
#if SEQPAR_X86
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const unsigned amx = (1u << 24) | (1u << 25);  // AMX-TILE, AMX-INT8
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & amx) == amx;
  }();
  return has;
#else
  return false;
#endif
}

Isa best_isa() {
  static const Isa best = cpu_has(Isa::kAvx512) ? Isa::kAvx512
                          : cpu_has(Isa::kAvx2) ? Isa::kAvx2
                                                : Isa::kScalar;
  return best;
}

void check_cpu_has(Isa isa) {
  if (!cpu_has(isa))
    throw InvalidArgument(detail::concat("kernel ISA '", isa_name(isa),
                                         "' is not supported by this CPU; valid: up to ",
                                         isa_name(best_isa())));
}

Isa parse_isa(std::string_view name) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (name == isa_name(isa)) return isa;
  throw InvalidArgument(
      detail::concat("SEQPAR_KERNEL_ISA '", name, "' is unknown; valid: scalar, avx2, avx512"));
}

Isa kernel_isa() {
  const char* env = std::getenv("SEQPAR_KERNEL_ISA");
  if (env == nullptr || *env == '\0') return best_isa();
  return std::min(parse_isa(env), best_isa());
}

}  // namespace seqpar
