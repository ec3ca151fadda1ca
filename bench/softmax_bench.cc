// softmax_bench: the attention kernel's online softmax (src/attention/simd.h) per instruction-set
// variant, on one tile of scores (Bq rows of Bk keys), beside the tile's two block GEMMs (Q·Kᵀ and
// P·V at head dim D, oneDNN, one thread) timed in the same round: the softmax's share of what the
// kernel spends on a tile.
//
//   softmax_bench [--block-q 256] [--block-k 256] [--head-dim 128] [--rounds 5] [--min-time 0.1]
//
// Scores are normal with standard deviation sqrt(D) (q·k of unit-normal q and k), scaled by
// log2(e)/sqrt(D); the row state comes from one untimed pass, so the timed passes see the common
// case (the running max does not move). Every pass first restores the tile from a copy; that copy
// is timed alone (`copy`) and subtracted. Rows: the fp32 update (exp2 degree 5, P over S), the
// bf16 one (degree 3, P to bf16), and exp2 alone over the tile's Bq·Bk elements (degree 5). Not a
// test: timing decides nothing.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "simd.h"

namespace {

namespace simd = seqpar::attn_simd;
using seqpar::bench::Gemm;
using seqpar::bench::time_per_call;

[[noreturn]] void usage_error(const std::string& msg) {
  seqpar::bench::usage_error("softmax_bench", msg);
}

struct Tile {
  int64_t rows, d, ld;
  std::vector<float> s0, s, o, m;
  std::vector<double> l;
  std::vector<uint16_t> p16;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t bq = 256, bk = 256, d = 128;
  int rounds = 5;
  double min_time = 0.1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "softmax_bench [--block-q 256] [--block-k 256] [--head-dim 128] [--rounds 5] "
          "[--min-time 0.1]\n");
      return 0;
    }
    if (i + 1 >= argc) usage_error(a + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (a == "--block-q") {
      bq = seqpar::bench::parse_list("softmax_bench", a, v)[0];
    } else if (a == "--block-k") {
      bk = seqpar::bench::parse_list("softmax_bench", a, v)[0];
    } else if (a == "--head-dim") {
      d = seqpar::bench::parse_list("softmax_bench", a, v)[0];
    } else if (a == "--rounds") {
      rounds = static_cast<int>(seqpar::bench::parse_list("softmax_bench", a, v)[0]);
    } else if (a == "--min-time") {
      min_time = seqpar::bench::parse_min_time("softmax_bench", v);
    } else {
      usage_error("unknown option " + a + " (see --help)");
    }
  }
  if (bq < 1 || bk < 1 || d < 1 || rounds < 1) {
    usage_error("--block-q, --block-k, --head-dim and --rounds must be >= 1");
  }

  omp_set_num_threads(1);  // oneDNN's block GEMMs on one thread, as in the kernel

  Tile t{bq, d, simd::round_up_row(bk), {}, {}, {}, {}, {}, {}};
  t.s0.resize(t.rows * t.ld);
  std::mt19937 rng(1);
  std::normal_distribution<float> score(0.f, std::sqrt(static_cast<float>(d)));
  for (float& x : t.s0) x = score(rng);
  t.s = t.s0;
  const float c = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(d)));
  t.o.assign(t.rows * d, 0.f);
  t.p16.resize(t.rows * t.ld);

  Gemm qk(bq, bk, d, 1, d, false);  // S = Q·Kᵀ, K (bk × d) row-major
  Gemm pv(bq, d, bk, d, 1, true);   // O += P·V
  const double scores = static_cast<double>(bq) * bk;

  struct Row {
    std::string name;
    std::function<void(const simd::Kernels&)> pass;
  };
  auto restore = [&] { std::memcpy(t.s.data(), t.s0.data(), t.s0.size() * sizeof(float)); };
  auto reset_state = [&](const simd::Kernels& k, bool bf16) {
    t.s = t.s0;
    t.m.assign(t.rows, -std::numeric_limits<float>::infinity());
    t.l.assign(t.rows, 0.0);
    for (int64_t r = 0; r < t.rows; ++r) {
      float* srow = t.s.data() + r * t.ld;
      if (bf16) {
        k.row_update_bf16_deg3(srow, t.p16.data() + r * t.ld, 0, bk, bk, c, &t.m[r], &t.l[r],
                               t.o.data() + r * d, d);
      } else {
        k.row_update_deg5(srow, 0, bk, bk, c, &t.m[r], &t.l[r], t.o.data() + r * d, d);
      }
    }
  };
  const std::vector<Row> rows = {
      {"row update fp32 (deg 5)",
       [&](const simd::Kernels& k) {
         restore();
         for (int64_t r = 0; r < t.rows; ++r) {
           k.row_update_deg5(t.s.data() + r * t.ld, 0, bk, bk, c, &t.m[r], &t.l[r],
                             t.o.data() + r * d, d);
         }
       }},
      {"row update, P to bf16 (deg 3)",
       [&](const simd::Kernels& k) {
         restore();
         for (int64_t r = 0; r < t.rows; ++r) {
           k.row_update_bf16_deg3(t.s.data() + r * t.ld, t.p16.data() + r * t.ld, 0, bk, bk, c,
                                  &t.m[r], &t.l[r], t.o.data() + r * d, d);
         }
       }},
      {"exp2 (deg 5)",
       [&](const simd::Kernels& k) {
         restore();
         k.exp2_deg5(t.s0.data(), t.s.data(), static_cast<int64_t>(t.s0.size()));
       }},
  };

  std::vector<simd::Isa> isas;
  for (simd::Isa isa : {simd::Isa::kScalar, simd::Isa::kAvx2, simd::Isa::kAvx512}) {
    if (simd::cpu_has(isa)) isas.push_back(isa);
  }
  // best[row][isa], seconds per pass without the copy; gemm: the two block GEMMs.
  std::vector<std::vector<double>> best(rows.size(), std::vector<double>(isas.size(), 1e30));
  double best_copy = 1e30, best_gemm = 1e30;
  for (int round = 0; round < rounds; ++round) {
    best_copy = std::min(best_copy, time_per_call(restore, min_time));
    best_gemm = std::min(best_gemm, time_per_call(
                                        [&] {
                                          qk.run();
                                          pv.run();
                                        },
                                        min_time));
    for (size_t x = 0; x < isas.size(); ++x) {
      const simd::Kernels& k = simd::kernels(isas[x]);
      for (size_t r = 0; r < rows.size(); ++r) {
        reset_state(k, r == 1);
        best[r][x] = std::min(best[r][x], time_per_call([&] { rows[r].pass(k); }, min_time));
      }
    }
  }

  std::printf("tile: %lld x %lld scores, head dim %lld; best of %d rounds (each >= %.2f s)\n",
              static_cast<long long>(bq), static_cast<long long>(bk), static_cast<long long>(d),
              rounds, min_time);
  std::printf(
      "block GEMMs (Q·Kᵀ and P·V, oneDNN fp32, one thread): %.1f us, %.1f GFLOP/s; copy: "
      "%.2f us\n\n",
      best_gemm * 1e6, (qk.flops() + pv.flops()) / best_gemm * 1e-9, best_copy * 1e6);
  std::printf("| op | variant | us per tile | ns per score | / block GEMMs |\n");
  std::printf("|---|---|---|---|---|\n");
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t x = 0; x < isas.size(); ++x) {
      const double sec = std::max(best[r][x] - best_copy, 0.0);
      std::printf("| %s | %s | %.2f | %.3f | %.3f |\n", rows[r].name.c_str(),
                  std::string(simd::isa_name(isas[x])).c_str(), sec * 1e6, sec / scores * 1e9,
                  sec / best_gemm);
    }
  }
  return 0;
}
