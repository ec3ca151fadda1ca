// llama_bench: prefill and decode throughput of a Hugging Face Llama directory (by default Llama
// 3.2 1B's config with seeded weights, written once as a bf16 checkpoint) on 1 and 2 ranks,
// beside this machine's oneDNN fp32 GEMM rate (at the prefill's FFN shape) and streaming read
// rate, both measured in the same run.
//   llama_bench [--dir DIR] [--prompt 512] [--decode 16] [--weights checkpoint,int8] [--json]
// --weights: the matrices as stored, and/or quantized to int8 at load (Q8_0, ops.h), each mesh run
// with each in turn.
// Prefill FLOPs: 2 x (the layers' matrix parameters) x prompt tokens, plus causal attention
// (4·head_dim·heads per unmasked score, P(P+1)/2 scores a layer), plus lm_head on the last
// token. Decode bytes a token: every weight as held (its stored dtype; int8: 34 bytes a block of
// 32 matrix weights), plus the fp32 K/V cache read.
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
  bool int8 = false;
  double prefill_s = 0, decode_s_per_token = 0;
};

Result run_mesh(const CausalLmCheckpoint& ck, MeshShape shape, Strategy strategy,
                const std::vector<int32_t>& prompt, int decode, bool int8) {
  const int n = shape.world();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Result r;
  r.mesh = mesh_shape_text(shape);
  r.int8 = int8;
  ThreadWorld::run(n, [&](Communicator& world) {
    omp_set_num_threads(std::max(1, cores / n));
    MeshComms mc(world, shape);
    ParallelConfig config;
    config.mesh = shape;
    config.strategy = strategy;
    config.layout = Layout::kZigzag;
    ParallelContext ctx = model_context(mc, config);
    WeightStore mine = ck.weights;
    mine.set_int8_matrices(int8);
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
  std::vector<bool> weights = {false};  // int8 or not
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
    } else if (a == "--weights") {
      const std::string v = value();
      if (v != "checkpoint" && v != "int8" && v != "checkpoint,int8")
        seqpar::bench::usage_error("llama_bench", "--weights: checkpoint, int8 or checkpoint,int8");
      weights.clear();
      if (v.find("checkpoint") != std::string::npos) weights.push_back(false);
      if (v.find("int8") != std::string::npos) weights.push_back(true);
    } else if (a == "--json") {
      json = true;
    } else {
      seqpar::bench::usage_error("llama_bench",
                                 "usage: llama_bench [--dir DIR] [--prompt 512] [--decode 16] "
                                 "[--weights checkpoint,int8] [--json]");
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
  const double read_gbs = seqpar::bench::read_rate_gbs(int64_t{1} << 30, cores, 3, 0.5);

  const int64_t hd = m.head_dim, q = m.heads * hd, kv = m.kv_heads * hd;
  const double layer_params = static_cast<double>(m.layers) *
                              (m.hidden * (2.0 * q + 2.0 * kv) + 3.0 * m.hidden * m.ffn_dim);
  const double flops = 2.0 * layer_params * P + 2.0 * m.vocab * m.hidden +
                       m.layers * 4.0 * hd * m.heads * P * (P + 1) / 2;
  // Bytes a decode token reads: every weight (stored dtype) and the fp32 K/V of the context
  // (at its mean length over the decode).
  const double matrix_params =
      layer_params + static_cast<double>(m.vocab) * m.hidden * (m.tie_embeddings ? 1 : 2);
  const double stored_bytes = static_cast<double>(ck.file_bytes);
  const double int8_bytes =
      stored_bytes - matrix_params * (stored_bytes / m.params) + matrix_params * 34.0 / 32.0;
  const double kv_bytes = 2.0 * m.layers * kv * 4 * (P + decode / 2.0);

  std::vector<int32_t> prompt(P);
  for (int64_t i = 0; i < P; ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % m.vocab);
  std::vector<Result> results;
  for (const MeshShape shape :
       {MeshShape{1, 1, 1, 1}, MeshShape{1, 2, 1, 1}, MeshShape{1, 1, 2, 1}})
    for (const bool int8 : weights)
      results.push_back(run_mesh(ck, shape, Strategy::kRing, prompt, decode, int8));

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
        "| mesh | weights | prefill tok/s | prefill GFLOP/s | of GEMM | decode tok/s "
        "| decode GB/s | of read |\n|---|---|---|---|---|---|---|---|\n");
  }
  for (const Result& r : results) {
    const double pf = flops / r.prefill_s * 1e-9;
    const double gbs =
        ((r.int8 ? int8_bytes : stored_bytes) + kv_bytes) / r.decode_s_per_token * 1e-9;
    const char* held = r.int8 ? "int8" : "checkpoint";
    if (json) {
      std::printf(
          "{\"mesh\": \"%s\", \"weights\": \"%s\", \"prompt\": %lld, \"decode\": %lld, "
          "\"prefill_tokens_per_s\": %.2f, "
          "\"prefill_gflops\": %.2f, \"gemm_gflops\": %.2f, \"prefill_of_gemm\": %.3f, "
          "\"decode_tokens_per_s\": %.3f, \"decode_gb_per_s\": %.3f, \"read_gb_per_s\": %.3f, "
          "\"decode_of_read\": %.3f}\n",
          r.mesh.c_str(), held, static_cast<long long>(P), static_cast<long long>(decode),
          P / r.prefill_s, pf, gemm_gflops, pf / gemm_gflops, 1 / r.decode_s_per_token, gbs,
          read_gbs, gbs / read_gbs);
    } else {
      std::printf("| %s | %s | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f |\n", r.mesh.c_str(), held,
                  P / r.prefill_s, pf, pf / gemm_gflops, 1 / r.decode_s_per_token, gbs,
                  gbs / read_gbs);
    }
  }
  return 0;
}
