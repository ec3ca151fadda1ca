// elementwise_bench: the model's elementwise and normalisation ops (src/model/simd_ops.h) per
// instruction-set variant, on x (rows, features) fp32: a decode row and a prefill chunk of
// Llama-3.2-1B's width by default (features 2048; RoPE as 32 heads of 64).
//
//   elementwise_bench [--rows 1,1024] [--features 2048] [--head-dim 64] [--threads 1]
//                     [--rounds 5] [--min-time 0.1]
//
// Each round times every variant the CPU runs, one after the other (interleaved, since this
// machine's speed drifts); per op and variant the best round is reported as time per call, per
// element, and the ratio to the scalar variant (the reference loops with std::exp and std::tanh).
// The in-place activations (silu, gelu_tanh) restore their input before each call, so that
// repeated calls do not drive it to subnormals; their rows include that copy, whose time is the
// `copy` row. add, modulate and gated_add run with zero y, shift, scale and gate, so that the
// values stay as they are. A second table times the RoPE tables and the timestep embedding the
// ops read (built on one thread, no variants), for the same row counts. Not a test: timing
// decides nothing.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "seqpar/core/tensor.h"
#include "seqpar/model/blocks/rope.h"
#include "seqpar/model/ops.h"
#include "simd_ops.h"

namespace {

[[noreturn]] void usage_error(const std::string& msg) {
  seqpar::bench::usage_error("elementwise_bench", msg);
}

}  // namespace

int main(int argc, char** argv) {
  namespace ms = seqpar::model_simd;
  std::vector<int64_t> rows_list = {1, 1024}, features_list = {2048};
  int64_t head_dim = 64;
  int threads = 1, rounds = 5;
  double min_time = 0.1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "elementwise_bench [--rows 1,1024] [--features 2048] [--head-dim 64] [--threads 1] "
          "[--rounds 5] [--min-time 0.1]\n");
      return 0;
    }
    if (i + 1 >= argc) usage_error(a + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (a == "--rows") {
      rows_list = seqpar::bench::parse_list("elementwise_bench", a, v);
    } else if (a == "--features") {
      features_list = seqpar::bench::parse_list("elementwise_bench", a, v);
    } else if (a == "--head-dim") {
      head_dim = seqpar::bench::parse_list("elementwise_bench", a, v).front();
    } else if (a == "--threads") {
      threads = std::atoi(v.c_str());
    } else if (a == "--rounds") {
      rounds = std::atoi(v.c_str());
    } else if (a == "--min-time") {
      min_time = seqpar::bench::parse_min_time("elementwise_bench", v);
    } else {
      usage_error("unknown option " + a + " (see --help)");
    }
  }
  if (threads < 1 || rounds < 1) usage_error("invalid value: need --threads >= 1, --rounds >= 1");
  for (int64_t f : features_list)
    if (f % head_dim != 0)
      usage_error("--features " + std::to_string(f) + " is not a multiple of --head-dim " +
                  std::to_string(head_dim));
  omp_set_num_threads(threads);

  std::vector<ms::Isa> isas;
  for (ms::Isa isa : {ms::Isa::kScalar, ms::Isa::kAvx2, ms::Isa::kAvx512})
    if (ms::cpu_has(isa)) isas.push_back(isa);
  std::printf("elementwise ops, %d thread(s), best of %d interleaved rounds\n", threads, rounds);
  std::printf("| op | rows | features | variant | us/call | ns/element | vs scalar |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int64_t rows : rows_list)
    for (int64_t f : features_list) {
      const int64_t n = rows * f, heads = f / head_dim;
      const seqpar::Tensor x = seqpar::random_normal({rows, f}, 1);
      const seqpar::Tensor b = seqpar::random_normal({rows, f}, 2);
      const seqpar::Tensor w = seqpar::random_normal({f}, 3);
      const float* xs = x.data<float>();
      std::vector<float> y(n), s(rows), zeros(n, 0.f), table(rows * head_dim);
      for (int64_t i = 0; i < rows * head_dim / 2; ++i) {
        table[2 * i] = std::cos(0.01f * static_cast<float>(i));
        table[2 * i + 1] = std::sin(0.01f * static_cast<float>(i));
      }
      std::vector<float> work(xs, xs + n);
      ms::kernels(ms::Isa::kScalar).sum_squares(xs, rows, f, s.data());
      using Op = std::function<void(const ms::Kernels&)>;
      const std::vector<std::pair<std::string, Op>> ops = {
          {"copy", [&](const ms::Kernels&) { std::memcpy(work.data(), xs, n * sizeof(float)); }},
          {"sum_squares", [&](const ms::Kernels& k) { k.sum_squares(xs, rows, f, s.data()); }},
          {"rms_norm",
           [&](const ms::Kernels& k) {
             k.rms_norm(xs, rows, f, s.data(), f, w.data<float>(), 1e-6f, y.data());
           }},
          {"layer_norm",
           [&](const ms::Kernels& k) {
             k.layer_norm(xs, rows, f, w.data<float>(), w.data<float>(), 1e-6f, y.data());
           }},
          {"silu",
           [&](const ms::Kernels& k) {
             std::memcpy(work.data(), xs, n * sizeof(float));
             k.silu(work.data(), n);
           }},
          {"gelu_tanh",
           [&](const ms::Kernels& k) {
             std::memcpy(work.data(), xs, n * sizeof(float));
             k.gelu_tanh(work.data(), n);
           }},
          {"swiglu", [&](const ms::Kernels& k) { k.swiglu(xs, b.data<float>(), n, y.data()); }},
          {"add", [&](const ms::Kernels& k) { k.add(work.data(), zeros.data(), n); }},
          {"modulate",
           [&](const ms::Kernels& k) {
             k.modulate(work.data(), rows, f, zeros.data(), zeros.data());
           }},
          {"gated_add",
           [&](const ms::Kernels& k) {
             k.gated_add(work.data(), rows, f, zeros.data(), b.data<float>());
           }},
          {"rope_halves",
           [&](const ms::Kernels& k) {
             k.rope(work.data(), rows, heads, head_dim, table.data(), true);
           }},
          {"rope_interleaved", [&](const ms::Kernels& k) {
             k.rope(work.data(), rows, heads, head_dim, table.data(), false);
           }}};
      for (const auto& [name, op] : ops) {
        std::vector<double> best(isas.size(), 1e30);
        for (int r = 0; r < rounds; ++r)
          for (size_t v = 0; v < isas.size(); ++v) {
            const ms::Kernels& kern = ms::kernels(isas[v]);
            best[v] = std::min(best[v], seqpar::bench::time_per_call([&] { op(kern); }, min_time));
          }
        for (size_t v = 0; v < isas.size(); ++v)
          std::printf("| %s | %lld | %lld | %s | %.2f | %.3f | %.2fx |\n", name.c_str(),
                      static_cast<long long>(rows), static_cast<long long>(f),
                      std::string(ms::isa_name(isas[v])).c_str(), best[v] * 1e6,
                      best[v] * 1e9 / static_cast<double>(n), best[0] / best[v]);
      }
    }
  // The tables the ops read, built once per forward pass on the calling thread (no variants):
  // RoPE for `rows` tokens, 1-D (head_dim / 2 frequencies) and 3-D (positions 0.. on a 720p Wan
  // 2.1 video's grid, 21 x 45 x 80, head_dim 128), and one timestep embedding of 256 channels.
  std::printf("\n| table | rows | us/call |\n|---|---|---|\n");
  for (int64_t rows : rows_list) {
    std::vector<int64_t> pos(rows);
    for (int64_t i = 0; i < rows; ++i) pos[i] = i;
    const std::vector<float> inv_freq = seqpar::rope_inv_freq(head_dim, 500000.0);
    const std::vector<std::pair<std::string, std::function<void()>>> tables = {
        {"rope_1d", [&] { seqpar::rope_1d(pos, inv_freq); }},
        {"rope_3d", [&] { seqpar::rope_3d(pos, {21, 45, 80}, 128, 10000.0); }},
        {"timestep_embedding", [&] { seqpar::timestep_embedding(999.f, 256); }}};
    for (const auto& [name, fn] : tables) {
      double best = 1e30;
      for (int r = 0; r < rounds; ++r)
        best = std::min(best, seqpar::bench::time_per_call(fn, min_time));
      std::printf("| %s | %lld | %.2f |\n", name.c_str(), static_cast<long long>(rows),
                  best * 1e6);
    }
  }
  return 0;
}
