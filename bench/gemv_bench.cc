// gemv_bench: the decode product of linear() (src/model/simd_ops.h) per instruction-set variant,
// y (m, n) = x (m, k) · w (n, k, bf16, fp16 or Q8_0 int8)ᵀ, at Llama-3.2-1B decode shapes by
// default (k 2048; n 8192 = the FFN's up/gate, n 2048 = q/o; m 1).
//
//   gemv_bench [--k 2048] [--n 8192,2048] [--m 1] [--dtype bf16] [--threads 1] [--rounds 5]
//              [--min-time 0.2]
//
// Each round times every variant the CPU runs, one after the other (interleaved, since this
// machine's speed drifts); per variant the best round is reported as time, GB/s of weights read
// (n·k·2 bytes a call) and the ratio to the scalar variant. Not a test: timing decides nothing.
//
//   gemv_bench --dtype int8 --activations int8 [--m 16,64,256] ...
//
// times instead the int8 x Q8_0 product of every vector variant the CPU runs (src/model/gemm_q8.h:
// the activations quantized and packed, then multiplied, as linear() takes them past 5 rows)
// beside linear() on the same Q8_0 weight with fp32 activations, as G operations/s (2·m·n·k a
// call) and the ratio to that fp32 row.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gemm_q8.h"
#include "seqpar/core/dtype.h"
#include "seqpar/core/tensor.h"
#include "seqpar/model/ops.h"
#include "simd_ops.h"

namespace {

[[noreturn]] void usage_error(const std::string& msg) {
  seqpar::bench::usage_error("gemv_bench", msg);
}

// The int8 x Q8_0 product per vector variant beside linear() with fp32 activations.
int q8_int8_table(const std::vector<int64_t>& ks, const std::vector<int64_t>& ns,
                  const std::vector<int64_t>& ms_rows, int threads, int rounds, double min_time) {
  namespace ms = seqpar::model_simd;
  const std::vector<ms::GemmQ8Variant> variants = ms::gemm_q8_variants();
  std::printf("int8 activations x Q8_0 weights, %d thread(s), best of %d interleaved rounds\n",
              threads, rounds);
  std::printf("| m | k | n | product | ms/call | G op/s | vs fp32 activations |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int64_t m : ms_rows)
    for (int64_t k : ks)
      for (int64_t n : ns) {
        const seqpar::Tensor x = seqpar::random_normal({m, k}, 1);
        const seqpar::Q8Weight wq =
            seqpar::quantize_q8_0(seqpar::random_normal({n, k}, 2, seqpar::DType::kBF16), "w");
        std::vector<float> y(m * n);
        ms::Q8Rows rows;
        std::vector<double> best(variants.size() + 1, 1e30);  // the last: fp32 activations
        for (int r = 0; r < rounds; ++r)
          for (size_t v = 0; v <= variants.size(); ++v)
            best[v] = std::min(
                best[v], seqpar::bench::time_per_call(
                             [&] {
                               if (v == variants.size()) {
                                 (void)seqpar::linear(x, wq.q, seqpar::Tensor(), wq.d);
                                 return;
                               }
                               ms::quantize_q8_rows(x.data<float>(), m, k, rows,
                                                    variants[v].layout);
                               variants[v].gemm(rows, wq.q.data<int8_t>(), wq.d.data<uint16_t>(), n,
                                                nullptr, y.data(), n);
                             },
                             min_time));
        for (size_t v = 0; v <= variants.size(); ++v)
          std::printf("| %lld | %lld | %lld | %s | %.3f | %.1f | %.2fx |\n",
                      static_cast<long long>(m), static_cast<long long>(k),
                      static_cast<long long>(n),
                      v == variants.size() ? "fp32 activations (linear)" : variants[v].name,
                      best[v] * 1e3, 2.0 * m * n * k / best[v] * 1e-9, best.back() / best[v]);
      }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace ms = seqpar::model_simd;
  std::vector<int64_t> ks = {2048}, ns = {8192, 2048}, ms_rows = {1};
  seqpar::DType dtype = seqpar::DType::kBF16;
  bool channel = false;  // int8-channel: per-channel int8 (gemv_i8_channel), else Q8_0
  bool int8_activations = false;
  int threads = 1, rounds = 5;
  double min_time = 0.2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "gemv_bench [--k 2048] [--n 8192,2048] [--m 1] [--dtype bf16|fp16|int8|int8-channel] "
          "[--activations fp32|int8] [--threads 1] [--rounds 5] [--min-time 0.2]\n");
      return 0;
    }
    if (i + 1 >= argc) usage_error(a + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (a == "--k") {
      ks = seqpar::bench::parse_list("gemv_bench", a, v);
    } else if (a == "--n") {
      ns = seqpar::bench::parse_list("gemv_bench", a, v);
    } else if (a == "--m") {
      ms_rows = seqpar::bench::parse_list("gemv_bench", a, v);
    } else if (a == "--dtype") {
      dtype = v == "fp16"                          ? seqpar::DType::kF16
              : v == "int8" || v == "int8-channel" ? seqpar::DType::kI8
                                                   : seqpar::DType::kBF16;
      channel = v == "int8-channel";
      if (v != "fp16" && v != "bf16" && v != "int8" && v != "int8-channel")
        usage_error("--dtype '" + v + "' is invalid; valid: bf16, fp16, int8, int8-channel");
    } else if (a == "--activations") {
      if (v != "fp32" && v != "int8")
        usage_error("--activations '" + v + "' is invalid; valid: fp32, int8");
      int8_activations = v == "int8";
    } else if (a == "--threads") {
      threads = std::atoi(v.c_str());
    } else if (a == "--rounds") {
      rounds = std::atoi(v.c_str());
    } else if (a == "--min-time") {
      min_time = seqpar::bench::parse_min_time("gemv_bench", v);
    } else {
      usage_error("unknown option " + a + " (see --help)");
    }
  }
  if (threads < 1 || rounds < 1 || !(min_time > 0))
    usage_error("invalid value: need --threads >= 1, --rounds >= 1, --min-time > 0");
  for (int64_t m : ms_rows)
    if (m < 1) usage_error("--m " + std::to_string(m) + ": at least 1");
  if (int8_activations && (dtype != seqpar::DType::kI8 || channel))
    usage_error("--activations int8 needs --dtype int8 (Q8_0)");
  omp_set_num_threads(threads);
  if (int8_activations) return q8_int8_table(ks, ns, ms_rows, threads, rounds, min_time);

  std::vector<ms::Isa> isas;
  for (ms::Isa isa : {ms::Isa::kScalar, ms::Isa::kAvx2, ms::Isa::kAvx512})
    if (ms::cpu_has(isa)) isas.push_back(isa);
  std::printf("gemv %s weights, %d thread(s), best of %d interleaved rounds\n",
              channel ? "int8-channel" : std::string(seqpar::dtype_name(dtype)).c_str(), threads,
              rounds);
  std::printf("| m | k | n | variant | us/call | GB/s of weights | vs scalar |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int64_t m : ms_rows)
    for (int64_t k : ks)
      for (int64_t n : ns) {
        const seqpar::Tensor x = seqpar::random_normal({m, k}, 1);
        const bool q8 = dtype == seqpar::DType::kI8;
        const seqpar::Tensor w =
            seqpar::random_normal({n, k}, 2, q8 ? seqpar::DType::kBF16 : dtype);
        const seqpar::Q8Weight wq =
            q8 && !channel ? seqpar::quantize_q8_0(w, "w") : seqpar::Q8Weight{};
        const seqpar::Int8ChannelWeight wc =
            channel ? seqpar::quantize_int8_channel(w, "w") : seqpar::Int8ChannelWeight{};
        std::vector<float> y(m * n);
        const auto* wp = static_cast<const uint16_t*>(w.raw());
        std::vector<double> best(isas.size(), 1e30);
        for (int r = 0; r < rounds; ++r)
          for (size_t v = 0; v < isas.size(); ++v) {
            const ms::Kernels& kern = ms::kernels(isas[v]);
            const ms::Gemv16 f = dtype == seqpar::DType::kBF16 ? kern.gemv_bf16 : kern.gemv_f16;
            const double t = seqpar::bench::time_per_call(
                [&] {
                  if (channel) {
                    kern.gemv_i8_channel(x.data<float>(), m, k, wc.q.data<int8_t>(),
                                         wc.s.data<float>(), n, nullptr, y.data());
                  } else if (q8) {
                    kern.gemv_q8(x.data<float>(), m, k, wq.q.data<int8_t>(), wq.d.data<uint16_t>(),
                                 n, nullptr, y.data());
                  } else {
                    f(x.data<float>(), m, k, wp, n, nullptr, y.data());
                  }
                },
                min_time);
            best[v] = std::min(best[v], t);
          }
        for (size_t v = 0; v < isas.size(); ++v)
          std::printf("| %lld | %lld | %lld | %s | %.1f | %.1f | %.2fx |\n",
                      static_cast<long long>(m), static_cast<long long>(k),
                      static_cast<long long>(n), std::string(ms::isa_name(isas[v])).c_str(),
                      best[v] * 1e6,
                      (channel ? 1.0 + 4.0 / k
                       : q8    ? 34.0 / 32
                               : 2.0) *
                          n * k / best[v] * 1e-9,
                      best[0] / best[v]);
      }
  return 0;
}
