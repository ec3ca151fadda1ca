// Error bounds per kernel path (docs/kernel.md "Error bounds").
#include "seqpar/attention/error_bound.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <dnnl.hpp>
#include <string>

namespace seqpar {

namespace {

// Unit roundoff of the arithmetic: fp32 (every matmul accumulates in fp32) and bf16 (P before
// a bf16 P·V matmul).
constexpr double kUnitF32 = 0x1p-24;
constexpr double kUnitBf16 = 0x1p-8;
// Relative error of the kernel's exp2 polynomials (tests/attention Simd.Exp2Accuracy measures
// them at 2e-7 and 7.5e-5).
constexpr double kExp2Deg5 = 0x1p-22;
constexpr double kExp2Deg3 = 0x1p-13;
// The stated constant: the bounds below are sums of unit-sized terms, each at most the size of
// one rounding; their sum times 2 covers the largest errors measured (docs/kernel.md "Error
// bounds": the measured maxima sit 2-10x below the bounds).
constexpr double kSafety = 2.0;
// |lse| <= ln(keys) + the largest logit; unit-scale logits stay below this.
constexpr double kMaxLogit = 5.0;

// Mirrors the kernel's choice (src/attention/flash.cc use_bf16_matmul): a bf16 matmul where
// oneDNN's ISA includes avx512_core_bf16 and it builds one, unless SEQPAR_KERNEL_BF16_MATMUL=0.
bool bf16_matmul_available() {
  static const bool available = [] {
    const char* env = std::getenv("SEQPAR_KERNEL_BF16_MATMUL");
    if (env != nullptr && std::string(env) == "0") return false;
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto want = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    if ((isa & want) != want) return false;
    try {
      using dt = dnnl::memory::data_type;
      dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      const dnnl::memory::desc a({256, 128}, dt::bf16, dnnl::memory::dims{128, 1});
      const dnnl::memory::desc b({128, 256}, dt::bf16, dnnl::memory::dims{1, 128});
      const dnnl::memory::desc c({256, 256}, dt::f32, dnnl::memory::dims{256, 1});
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

}  // namespace

std::string_view kernel_path_name(KernelPath p) {
  switch (p) {
    case KernelPath::kF32:
      return "fp32";
    case KernelPath::kConverted:
      return "converted";
    case KernelPath::kBf16Matmul:
      return "bf16-matmul";
  }
  return "?";
}

KernelPath kernel_path(DType dtype) {
  if (dtype == DType::kF32) return KernelPath::kF32;
  if (dtype == DType::kBF16 && bf16_matmul_available()) return KernelPath::kBf16Matmul;
  return KernelPath::kConverted;
}

ErrorBound attention_error_bound(KernelPath path, int64_t keys, int64_t head_dim, double max_abs_v,
                                 double logit_scale) {
  const double g = std::max(logit_scale, 1.0);
  const double L = static_cast<double>(std::max<int64_t>(keys, 1));
  const double D = static_cast<double>(std::max<int64_t>(head_dim, 1));
  // Relative error of one weight p_j = exp(s_j - m): the exp2 polynomial, and the logit s_j (an
  // fp32 dot product of length D of unit-scale terms: sqrt(D)·u with random-sign roundings).
  const double eps_exp = path == KernelPath::kF32 ? kExp2Deg5 : kExp2Deg3;
  const double weight = eps_exp + g * std::sqrt(D) * kUnitF32;
  // out = Σ p_j·v_j / Σ p_j: the weights' error, P rounded to bf16 before P·V on the
  // bf16-matmul path (u_bf16 relative per weight; the sum l uses the fp32 p), and the fp32
  // accumulation of L terms in blocks, log2(L) levels of one rounding each; relative to max|v|.
  const double p_round = path == KernelPath::kBf16Matmul ? kUnitBf16 : 0.0;
  const double out = weight + p_round + std::log2(L + 1) * kUnitF32;
  // lse = m + ln l: the weights' error (relative in l, absolute in ln l) and the rounding of the
  // fp32 result itself, up to 2u·|lse| with |lse| <= ln L + the largest logit.
  const double lse = weight + 2 * kUnitF32 * (std::log(L) + g * kMaxLogit);
  return {kSafety * max_abs_v * out, kSafety * lse};
}

ErrorBound attention_error_bound(DType dtype, int64_t keys, int64_t head_dim, double max_abs_v,
                                 double logit_scale) {
  return attention_error_bound(kernel_path(dtype), keys, head_dim, max_abs_v, logit_scale);
}

}  // namespace seqpar
