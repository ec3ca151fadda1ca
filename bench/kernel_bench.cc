// kernel_bench: the local flash-attention kernel's rate against oneDNN's GEMM rate measured in
// the same rounds (this machine's speed drifts, so only same-moment ratios mean anything).
//
//   kernel_bench [--seq 4096[,16384]] [--head-dim 128[,64]] [--causal 0|1|both] [--heads 1]
//                [--kv-heads H] [--batch 1] [--dtype fp32|bf16|fp16] [--rounds 3]
//                [--threads 1] [--block-q 0] [--block-k 0] [--min-time 0.3]
//                [--layout contiguous|striped|zigzag|shuffled] [--ranks 4] [--rank 1]
//                [--compare-panels ROUNDS] [--paired ROUNDS]
//
// --compare-panels: per case, the kernel with its panel products (docs/kernel.md "Panel
// products"; where the CPU's kernels are AVX2) against the kernel with oneDNN's products
// (SEQPAR_KERNEL_PANELS=0), one call of each per round in alternating order, ROUNDS rounds in one
// process: each path's median GFLOP/s and the min / median / max of the per-round ratio (> 1:
// panels faster). Instead of the table below.
//
// --paired: per case, the kernel against the GEMM 1024³ in ROUNDS rounds of one timing of each
// (each >= --min-time, which goes first alternating) in one process: each one's median GFLOP/s
// and the min / median / max of the per-round ratio of their rates, so a drift of the machine's
// speed between rounds cancels out of each ratio. Instead of the table below.
//
// --layout: queries and keys are the S tokens that rank --rank of --ranks holds of a sequence of
// S·ranks tokens (the diagonal step of ring attention), so the causal mask is by those global
// positions: striped (token i on rank i mod N) and zigzag (chunks r and 2N-1-r) exercise the
// partially masked block path with non-contiguous positions; shuffled (contiguous positions in
// random order, a different order for keys) measures the general per-element mask path.
//
// Prints a markdown table. Kernel GFLOP/s counts 4·D flops per visible score element (QKᵀ and
// PV; masked pairs are not counted). Each round times, back to back: the kernel, a GEMM with
// M = N = K = 1024 ("GEMM 1024³"), and the kernel's own two block GEMMs (Bq×Bk×D Q·Kᵀ with K
// row-major, then Bq×D×Bk P·V accumulating; "block GEMMs"; with --threads N, one pair per thread
// at once), each repeated for at least
// --min-time seconds; the table holds the best of --rounds rounds for each. The GEMMs take the
// kernel's input type where it multiplies in it: bf16 A and B (fp32 C) for --dtype bf16 on a CPU
// with AVX512-BF16 or AMX, fp32 otherwise.
// Not a test: timing never decides pass or fail.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "seqpar/attention/attention.h"
#include "seqpar/core/error.h"
#include "seqpar/core/timer.h"

namespace {

using seqpar::DType;
using seqpar::bench::Gemm;
using seqpar::bench::time_per_call;

[[noreturn]] void usage_error(const std::string& msg) {
  seqpar::bench::usage_error("kernel_bench", msg);
}

std::vector<int64_t> parse_list(const std::string& flag, const std::string& s) {
  return seqpar::bench::parse_list("kernel_bench", flag, s);
}

using seqpar::Tensor;

struct Options {
  std::vector<int64_t> seqs = {1024, 4096, 16384};
  std::vector<int64_t> head_dims = {64, 128};
  std::vector<bool> causal = {false, true};
  int64_t heads = 1, kv_heads = 0, batch = 1;
  DType dtype = DType::kF32;
  int rounds = 3;
  int threads = 1;
  int block_q = 0, block_k = 0;
  double min_time = 0.3;
  std::string layout = "contiguous";
  int64_t ranks = 4, rank = 1;
  int64_t compare_rounds = 0;
  int64_t paired_rounds = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::replace(a.begin(), a.end(), '_', '-');
    if (a == "--help" || a == "-h") {
      std::printf(
          "kernel_bench [--seq 1024,4096,16384] [--head-dim 64,128] [--causal 0|1|both]\n"
          "             [--heads 1] [--kv-heads H] [--batch 1] [--dtype fp32|bf16|fp16]\n"
          "             [--rounds 3] [--threads 1] [--block-q 0] [--block-k 0] [--min-time 0.3]\n"
          "             [--layout contiguous|striped|zigzag|shuffled] [--ranks 4] [--rank 1]\n"
          "             [--compare-panels ROUNDS] [--paired ROUNDS]\n");
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error(a + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (a == "--seq") {
      o.seqs = parse_list(a, v);
    } else if (a == "--head-dim") {
      o.head_dims = parse_list(a, v);
    } else if (a == "--causal") {
      if (v == "both") {
        o.causal = {false, true};
      } else if (v == "0" || v == "1") {
        o.causal = {v == "1"};
      } else {
        usage_error("--causal '" + v + "' is invalid; valid: 0, 1, both");
      }
    } else if (a == "--heads") {
      o.heads = parse_list(a, v)[0];
    } else if (a == "--kv-heads") {
      o.kv_heads = parse_list(a, v)[0];
    } else if (a == "--batch") {
      o.batch = parse_list(a, v)[0];
    } else if (a == "--dtype") {
      o.dtype = seqpar::bench::parse_dtype_arg("kernel_bench", v);
    } else if (a == "--rounds") {
      o.rounds = static_cast<int>(parse_list(a, v)[0]);
    } else if (a == "--threads") {
      o.threads = static_cast<int>(parse_list(a, v)[0]);
    } else if (a == "--block-q") {
      o.block_q = static_cast<int>(parse_list(a, v)[0]);
    } else if (a == "--block-k") {
      o.block_k = static_cast<int>(parse_list(a, v)[0]);
    } else if (a == "--layout") {
      if (v != "contiguous" && v != "striped" && v != "zigzag" && v != "shuffled") {
        usage_error("--layout '" + v +
                    "' is invalid; valid: contiguous, striped, zigzag, shuffled");
      }
      o.layout = v;
    } else if (a == "--ranks") {
      o.ranks = parse_list(a, v)[0];
    } else if (a == "--rank") {
      o.rank = std::atoll(v.c_str());
    } else if (a == "--compare-panels") {
      o.compare_rounds = seqpar::bench::parse_one("kernel_bench", a, v);
    } else if (a == "--paired") {
      o.paired_rounds = seqpar::bench::parse_one("kernel_bench", a, v);
    } else if (a == "--min-time") {
      o.min_time = seqpar::bench::parse_min_time("kernel_bench", v);
    } else {
      usage_error("unknown option " + a + " (see --help)");
    }
  }
  if (o.kv_heads == 0) o.kv_heads = o.heads;
  if (o.compare_rounds > 0 && o.paired_rounds > 0)
    usage_error("--compare-panels and --paired are two tables; valid: one of them");
  if (o.rank < 0 || o.rank >= o.ranks) {
    usage_error("--rank " + std::to_string(o.rank) + " is invalid; valid: 0.." +
                std::to_string(o.ranks - 1));
  }
  return o;
}

// Global positions of the n tokens rank r of `ranks` holds under a layout.
std::vector<int64_t> layout_positions(const std::string& layout, int64_t n, int64_t r,
                                      int64_t ranks) {
  std::vector<int64_t> pos(static_cast<size_t>(n));
  const int64_t half = (n + 1) / 2;
  for (int64_t i = 0; i < n; ++i) {
    if (layout == "striped") {
      pos[i] = i * ranks + r;
    } else if (layout == "zigzag") {  // chunks r and 2·ranks-1-r of length half
      pos[i] = i < half ? r * half + i : (2 * ranks - 1 - r) * half + (i - half);
    } else {
      pos[i] = r * n + i;
    }
  }
  if (layout == "shuffled") std::shuffle(pos.begin(), pos.end(), std::mt19937_64(3));
  return pos;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  omp_set_num_threads(o.threads);

  // bf16 inputs that the kernel multiplies in bf16 (oneDNN's bf16 matmul, AVX512-BF16 or AMX)
  // are measured against the same bf16 GEMMs; otherwise the references are fp32.
  const std::string info = seqpar::attention_kernel_info();
  const bool bf16_mm =
      o.dtype == DType::kBF16 && info.find("bf16 inputs: oneDNN bf16 matmul") != std::string::npos;
  const auto gemm_type = bf16_mm ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
  Gemm big(1024, 1024, 1024, 1024, 1, false, gemm_type);
  std::printf("kernel: %s\n", info.c_str());
  std::printf("threads: %d; %s (each timing >= %.2f s); GEMMs in %s; GEMM 1024^3 impl: %s\n\n",
              o.threads,
              o.compare_rounds > 0 || o.paired_rounds > 0
                  ? "rounds as below"
                  : ("best of " + std::to_string(o.rounds) + " rounds").c_str(),
              o.min_time, bf16_mm ? "bf16 (fp32 C)" : "fp32", big.impl().c_str());
  if (o.compare_rounds > 0) {
    std::printf(
        "panel products against oneDNN's, %lld rounds\n| S | D | H/Hkv | B | layout | causal | "
        "dtype | panels GFLOP/s | oneDNN GFLOP/s | panels / oneDNN min | median | max |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        static_cast<long long>(o.compare_rounds));
  } else if (o.paired_rounds > 0) {
    std::printf(
        "kernel against GEMM 1024^3, %lld rounds of one timing each\n| S | D | H/Hkv | B | "
        "layout | causal | dtype | kernel GFLOP/s | GEMM GFLOP/s | kernel / GEMM min | median | "
        "max |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        static_cast<long long>(o.paired_rounds));
  } else {
    std::printf(
        "| S | D | H/Hkv | B | layout | causal | dtype | kernel GFLOP/s | GEMM 1024^3 GFLOP/s | "
        "ratio | block GEMMs GFLOP/s | ratio |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  std::fflush(stdout);

  for (int64_t s : o.seqs) {
    for (int64_t d : o.head_dims) {
      const Tensor q = seqpar::random_normal({o.batch, s, o.heads, d}, 1, o.dtype);
      const Tensor k = seqpar::random_normal({o.batch, s, o.kv_heads, d}, 2, o.dtype);
      const Tensor v = seqpar::random_normal({o.batch, s, o.kv_heads, d}, 3, o.dtype);
      // The kernel's block GEMMs at this head dim (default Bq = Bk = 256, capped at S).
      const int64_t bq = std::min<int64_t>(o.block_q ? o.block_q : 256, s);
      const int64_t bk = std::min<int64_t>(o.block_k ? o.block_k : 256, s);
      // One pair per thread: with --threads N each thread runs its own pair at once (inside a
      // parallel region oneDNN runs single-threaded, as in the kernel).
      std::vector<std::unique_ptr<Gemm>> qk, pv;
      for (int t = 0; t < o.threads; ++t) {
        // S = Q·Kᵀ, K (bk × d) row-major; O += P·V
        qk.push_back(std::make_unique<Gemm>(bq, bk, d, 1, d, false, gemm_type));
        pv.push_back(std::make_unique<Gemm>(bq, d, bk, d, 1, true, gemm_type));
      }
      auto run_block_gemms = [&] {
        if (o.threads == 1) {
          qk[0]->run();
          pv[0]->run();
          return;
        }
#pragma omp parallel num_threads(o.threads)
        {
          const int t = omp_get_thread_num();
          qk[t]->run();
          pv[t]->run();
        }
      };
      const double block_flops = o.threads * (qk[0]->flops() + pv[0]->flops());
      const std::vector<int64_t> pos = layout_positions(o.layout, s, o.rank, o.ranks);
      std::vector<int64_t> kpos = pos;
      if (o.layout == "shuffled") std::shuffle(kpos.begin(), kpos.end(), std::mt19937_64(7));
      for (bool causal : o.causal) {
        seqpar::AttnParams p;
        p.mask.causal = causal;
        if (o.layout != "contiguous") {
          p.mask.q_pos = pos;
          p.mask.k_pos = kpos;
        }
        p.block_q = o.block_q;
        p.block_k = o.block_k;
        const double work =
            4.0 * d *
            static_cast<double>(seqpar::visible_score_elements(o.batch, o.heads, s, s, p.mask));
        char label[256];
        std::snprintf(label, sizeof label, "%lld | %lld | %lld/%lld | %lld | %s | %s | %s",
                      static_cast<long long>(s), static_cast<long long>(d),
                      static_cast<long long>(o.heads), static_cast<long long>(o.kv_heads),
                      static_cast<long long>(o.batch), o.layout.c_str(), causal ? "yes" : "no",
                      std::string(seqpar::dtype_name(o.dtype)).c_str());
        if (o.paired_rounds > 0) {
          // Seconds per flop, so that the ratio of a round is the ratio of the two rates.
          auto call = [&](bool kernel) {
            if (kernel)
              return time_per_call([&] { seqpar::flash_attention(q, k, v, p); }, o.min_time) / work;
            return time_per_call([&] { big.run(); }, o.min_time) / big.flops();
          };
          seqpar::bench::print_alternated(label, 1e-9,
                                          seqpar::bench::alternate(o.paired_rounds, call));
          continue;
        }
        if (o.compare_rounds > 0) {
          auto call = [&](bool panels) {
            if (panels) {
              unsetenv("SEQPAR_KERNEL_PANELS");
            } else {
              setenv("SEQPAR_KERNEL_PANELS", "0", 1);
            }
            const double t0 = seqpar::now_seconds();
            seqpar::flash_attention(q, k, v, p);
            return seqpar::now_seconds() - t0;
          };
          const auto result = seqpar::bench::alternate(o.compare_rounds, call);
          unsetenv("SEQPAR_KERNEL_PANELS");
          seqpar::bench::print_alternated(label, work * 1e-9, result);
          continue;
        }
        seqpar::flash_attention(q, k, v, p);  // warm-up: primitives, buffers
        double best_kernel = 0, best_big = 0, best_blk = 0;
        for (int r = 0; r < o.rounds; ++r) {
          const double tk = time_per_call([&] { seqpar::flash_attention(q, k, v, p); }, o.min_time);
          const double tb = time_per_call([&] { big.run(); }, o.min_time);
          const double tq = time_per_call(run_block_gemms, o.min_time);
          best_kernel = std::max(best_kernel, work / tk * 1e-9);
          best_big = std::max(best_big, big.flops() / tb * 1e-9);
          best_blk = std::max(best_blk, block_flops / tq * 1e-9);
        }
        std::printf("| %s | %.1f | %.1f | %.2f | %.1f | %.2f |\n", label, best_kernel, best_big,
                    best_kernel / best_big, best_blk, best_kernel / best_blk);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
