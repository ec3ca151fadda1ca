// llama_bench: prefill and decode throughput of a Hugging Face Llama directory (by default Llama
// 3.2 1B's config with seeded weights, written once as a bf16 checkpoint) on 1 and 2 ranks,
// beside this machine's oneDNN fp32 GEMM rate (at the prefill's FFN shape) and streaming read
// rate, both measured in the same run.
//   llama_bench [--dir DIR] [--prompt 512] [--decode 16] [--json]
// Prefill FLOPs: 2 x (the layers' matrix parameters) x prompt tokens, plus causal attention
// (4·head_dim·heads per unmasked score, P(P+1)/2 scores a layer), plus lm_head on the last
// token. Decode bytes a token: every weight in its stored dtype, plus the fp32 K/V cache read.
// Not a test: nothing here passes or fails.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "seqpar/comm/threads.h"
#include "seqpar/model/causal_lm.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/llama.h"
#include "seqpar/model/model_run.h"
#include "seqpar/parallel/mesh.h"

namespace {

using namespace seqpar;

struct Result {
  std::string mesh;
  double prefill_s = 0, decode_s_per_token = 0;
};

Result run_mesh(const CausalLmCheckpoint& ck, MeshShape shape, Strategy strategy,
                const std::vector<int32_t>& prompt, int decode) {
  const int n = shape.world();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Result r;
  r.mesh = mesh_shape_text(shape);
  ThreadWorld::run(n, [&](Communicator& world) {
    omp_set_num_threads(std::max(1, cores / n));
    MeshComms mc(world, shape);
    ParallelConfig config;
    config.mesh = shape;
    config.strategy = strategy;
    config.layout = Layout::kZigzag;
    ParallelContext ctx = model_context(mc, config);
    WeightStore mine = ck.weights;
    Decoder dec(ck.config, mine, ctx);
    mine = WeightStore();
    Decoder::Options opts;
    opts.max_new_tokens = decode + 1;
    (void)dec.generate(prompt, opts, ctx);  // warm-up: oneDNN primitives, first touches
    const Decoder::Output out = dec.generate(prompt, opts, ctx);
    const double prefill = world.all_reduce_max(out.prefill_seconds);
    const double dec_s = world.all_reduce_max(out.decode_seconds);
    if (world.rank() == 0) {
      r.prefill_s = prefill;
      r.decode_s_per_token = dec_s / decode;
    }
  });
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/seqpar_llama3.2-1b_bf16";
  int64_t P = 512, decode = 16;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) seqpar::bench::usage_error("llama_bench", a + " needs a value");
      return argv[++i];
    };
    if (a == "--dir") {
      dir = value();
    } else if (a == "--prompt") {
      P = seqpar::bench::parse_list("llama_bench", a, value())[0];
    } else if (a == "--decode") {
      decode = seqpar::bench::parse_list("llama_bench", a, value())[0];
    } else if (a == "--json") {
      json = true;
    } else {
      seqpar::bench::usage_error("llama_bench",
                                 "usage: llama_bench [--dir DIR] [--prompt 512] [--decode 16] "
                                 "[--json]");
    }
  }
  if (!std::filesystem::exists(dir + "/config.json")) {
    const DecoderConfig& m = decoder_preset("llama3.2-1b");
    std::fprintf(stderr, "llama_bench: writing %s (%s, seeded, bf16)\n", dir.c_str(),
                 m.name.c_str());
    write_llama_checkpoint(dir, m, WeightStore::random(Decoder::parameters(m), 1), DType::kBF16,
                           int64_t{1} << 30);
  }
  const CausalLmCheckpoint ck = open_causal_lm(dir);
  const DecoderConfig& m = ck.config;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  // The machine's rates, on every core: fp32 GEMM at the FFN's prefill shape, streaming read.
  omp_set_num_threads(cores);
  seqpar::bench::Gemm gemm(P, m.ffn_dim, m.hidden, 1, m.hidden, false);
  double gemm_gflops = 0;
  for (int round = 0; round < 3; ++round)
    gemm_gflops = std::max(
        gemm_gflops, gemm.flops() / seqpar::bench::time_per_call([&] { gemm.run(); }, 0.5) * 1e-9);
  std::vector<uint64_t> buf((int64_t{1} << 30) / 8, 1);
  volatile uint64_t sink = 0;
  double read_gbs = 0;
  for (int round = 0; round < 3; ++round)
    read_gbs = std::max(
        read_gbs, 1.0 * (int64_t{1} << 30) /
                      seqpar::bench::time_per_call(
                          [&] {
                            sink = sink + seqpar::bench::stream_read(
                                              buf.data(), static_cast<int64_t>(buf.size()), cores);
                          },
                          0.5) *
                      1e-9);
  buf = {};

  const int64_t hd = m.head_dim, q = m.heads * hd, kv = m.kv_heads * hd;
  const double layer_params = static_cast<double>(m.layers) *
                              (m.hidden * (2.0 * q + 2.0 * kv) + 3.0 * m.hidden * m.ffn_dim);
  const double flops = 2.0 * layer_params * P + 2.0 * m.vocab * m.hidden +
                       m.layers * 4.0 * hd * m.heads * P * (P + 1) / 2;
  // Bytes a decode token reads: every weight (stored dtype) and the fp32 K/V of the context
  // (at its mean length over the decode).
  const double weight_bytes = static_cast<double>(ck.file_bytes);
  const double kv_bytes = 2.0 * m.layers * kv * 4 * (P + decode / 2.0);

  std::vector<int32_t> prompt(P);
  for (int64_t i = 0; i < P; ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % m.vocab);
  std::vector<Result> results;
  results.push_back(run_mesh(ck, {1, 1, 1, 1}, Strategy::kRing, prompt, decode));
  results.push_back(run_mesh(ck, {1, 2, 1, 1}, Strategy::kRing, prompt, decode));
  results.push_back(run_mesh(ck, {1, 1, 2, 1}, Strategy::kRing, prompt, decode));

  if (!json) {
    std::printf(
        "llama_bench: %s, %lld parameters, %s weights, prompt %lld, decode %lld, %d cores\n",
        dir.c_str(), static_cast<long long>(m.params),
        std::string(dtype_name(ck.weights.dtype("layers.0.mlp.up_proj.weight"))).c_str(),
        static_cast<long long>(P), static_cast<long long>(decode), cores);
    std::printf("oneDNN fp32 GEMM %lldx%lldx%lld: %.1f GFLOP/s; streaming read %.1f GB/s\n",
                static_cast<long long>(P), static_cast<long long>(m.ffn_dim),
                static_cast<long long>(m.hidden), gemm_gflops, read_gbs);
    std::printf(
        "| mesh | prefill tok/s | prefill GFLOP/s | of GEMM | decode tok/s | decode GB/s "
        "| of read |\n|---|---|---|---|---|---|---|\n");
  }
  for (const Result& r : results) {
    const double pf = flops / r.prefill_s * 1e-9;
    const double gbs = (weight_bytes + kv_bytes) / r.decode_s_per_token * 1e-9;
    if (json) {
      std::printf(
          "{\"mesh\": \"%s\", \"prompt\": %lld, \"decode\": %lld, \"prefill_tokens_per_s\": %.2f, "
          "\"prefill_gflops\": %.2f, \"gemm_gflops\": %.2f, \"prefill_of_gemm\": %.3f, "
          "\"decode_tokens_per_s\": %.3f, \"decode_gb_per_s\": %.3f, \"read_gb_per_s\": %.3f, "
          "\"decode_of_read\": %.3f}\n",
          r.mesh.c_str(), static_cast<long long>(P), static_cast<long long>(decode),
          P / r.prefill_s, pf, gemm_gflops, pf / gemm_gflops, 1 / r.decode_s_per_token, gbs,
          read_gbs, gbs / read_gbs);
    } else {
      std::printf("| %s | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f |\n", r.mesh.c_str(),
                  P / r.prefill_s, pf, pf / gemm_gflops, 1 / r.decode_s_per_token, gbs,
                  gbs / read_gbs);
    }
  }
  return 0;
}
