// The instruction sets seqpar's CPU kernels come in (the attention kernel, the model's dense
// products, dtype widening), what this CPU runs, and the one choice they share: the widest the
// CPU runs, capped by the environment variable SEQPAR_KERNEL_ISA (scalar|avx2|avx512) for tests
// and comparisons. One binary runs everywhere: variants are compiled under per-function target
// attributes, never -march=native.
// Thread-safety: pure functions; the CPU is asked once.
#pragma once

#include <string_view>

namespace seqpar {

// Ordered: a wider set includes the narrower ones.
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

std::string_view isa_name(Isa isa);  // "scalar", "avx2", "avx512"
// The CPU (and OS) can run the variant: AVX2 with FMA and F16C; AVX-512 F, BW, DQ and VL.
bool cpu_has(Isa isa);
Isa best_isa();  // the widest variant this CPU runs
// AVX-VNNI: vpdpbusd on 256-bit vectors, VEX-encoded (Intel's cores since Alder Lake and Sapphire
// Rapids, AMD's since Zen 5), with AVX2 (CPUID leaf 7, subleaf 1, EAX bit 4; not every compiler's
// __builtin_cpu_supports names it).
bool cpu_has_avx_vnni();
// AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25; not every compiler's
// __builtin_cpu_supports names them). The OS must still grant the tile state (arch_prctl on
// Linux), which the caller asks for.
bool cpu_has_amx_int8();
// InvalidArgument naming the variant and the widest valid one unless cpu_has(isa).
void check_cpu_has(Isa isa);
// The name as SEQPAR_KERNEL_ISA and tests give it; InvalidArgument listing the valid ones.
Isa parse_isa(std::string_view name);
// SEQPAR_KERNEL_ISA capped at best_isa(), or best_isa() when unset.
Isa kernel_isa();

}  // namespace seqpar
