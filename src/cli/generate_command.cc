// seqpar generate: greedy decoding of a Hugging Face causal LM directory (Llama, Qwen2, Qwen3) on a
// tp x ring x ulysses mesh.
// Prompt token ids in (a list, or a text / .npy / .safetensors file), tokens and logits out.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "mesh_run.h"
#include "prompt_ids.h"
#include "seqpar/core/json_limits.h"
#include "seqpar/core/process_memory.h"
#include "seqpar/core/timer.h"
#include "seqpar/core/trace.h"
#include "seqpar/model/causal_lm.h"
#include "seqpar/model/decoder.h"
#include "seqpar/model/model_run.h"
#include "seqpar/model/safetensors.h"
#include "trace_file.h"

namespace seqpar::cli {

namespace {

using nlohmann::json;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<int64_t> prompt_ids(const GenerateOptions& o) {
  SEQPAR_ARG_CHECK(o.prompt_ids.empty() != o.prompt_ids_file.empty(),
                   "give the prompt as one of --prompt-ids 1,2,3 or --prompt-ids-file FILE");
  if (!o.prompt_ids.empty()) return parse_id_text("--prompt-ids", o.prompt_ids);
  const std::string& f = o.prompt_ids_file;
  if (ends_with(f, ".safetensors")) return read_safetensors_ids("--prompt-ids-file", f);
  if (ends_with(f, ".npy")) return read_npy_ids("--prompt-ids-file", f);
  return parse_id_text("--prompt-ids-file " + f, read_file("--prompt-ids-file", f));
}

// Everything checked before a rank starts.
struct Prepared {
  CausalLmCheckpoint ck;
  ParallelConfig mesh;
  std::vector<int32_t> prompt;
  std::vector<std::vector<int32_t>> turns;      // --turn-ids
  Decoder::Options chunking;                    // --prefill-chunk, --chunk-strategy, --hardware
  std::vector<std::vector<int32_t>> documents;  // --document-ids: packed, prefill only
};

// --document-ids: packed documents prefilled together, nothing decoded after (one cache per
// document is not supported). The checks of the prompt's path, said of the documents.
void prepare_documents(const GenerateOptions& o, Prepared& p) {
  SEQPAR_ARG_CHECK(o.prompt_ids.empty() && o.prompt_ids_file.empty(),
                   "give one prompt (--prompt-ids or --prompt-ids-file) or packed documents ",
                   "(--document-ids, repeated), not both");
  SEQPAR_ARG_CHECK(o.turn_ids.empty(), "--turn-ids continue one prompt's cache; --document-ids ",
                   "prefill packed documents and decode nothing after them (several sequences' ",
                   "caches are not supported)");
  SEQPAR_ARG_CHECK(!o.max_new_tokens_given || o.max_new_tokens == 1, "--max-new-tokens ",
                   o.max_new_tokens, " with --document-ids: the packed prefill gives each ",
                   "document's next token, and decoding after it is not supported; valid: 1 (or ",
                   "leave it out)");
  SEQPAR_ARG_CHECK(o.prefill_chunk == 0, "--prefill-chunk splits one prompt over its cache; ",
                   "--document-ids prefill in one pass: leave it out");
  p.ck = open_causal_lm(o.model);
  const DecoderConfig& m = p.ck.config;
  CausalLmRunNames names;
  names.tp = "--tp";
  names.int8 = "--weights-dtype int8";
  check_causal_lm_tp(p.ck, p.mesh.mesh.tp, names);
  if (o.weights_dtype == "int8") check_causal_lm_int8(p.ck, p.mesh.mesh.tp, names);
  int64_t total = 0, longest = 0;
  for (size_t i = 0; i < o.document_ids.size(); ++i) {
    const std::string which = detail::concat("--document-ids[", i, "]");
    const std::vector<int64_t> ids = parse_id_text(which, o.document_ids[i]);
    names.prompt = which;
    names.token = which + " token";
    // An empty one is check_documents' to refuse.
    p.documents.push_back(ids.empty() ? std::vector<int32_t>{}
                                      : check_causal_lm_prompt(p.ck, ids, 1, true, names));
    total = limits::checked_add(total, static_cast<int64_t>(ids.size()), "--document-ids tokens");
    longest = std::max(longest, static_cast<int64_t>(ids.size()));
  }
  (void)Decoder::check_documents(m, p.mesh, p.documents, o.allow_long_context,
                                 {"--document-ids", "--allow-long-context"});
  if (m.max_positions > 0 && longest > m.max_positions && reporting_rank())
    std::fprintf(stderr,
                 "seqpar: warning: a document of %lld positions exceeds max_position_embeddings "
                 "%lld of %s/config.json (--allow-long-context); the model was not trained for "
                 "them\n",
                 static_cast<long long>(longest), static_cast<long long>(m.max_positions),
                 o.model.c_str());
  const int64_t D = static_cast<int64_t>(p.documents.size());
  // No cache is kept; the prefill's keys and values of a rank's share of the tokens.
  const int64_t sp = p.mesh.mesh.sp();
  const CausalLmMemory need = causal_lm_memory(p.ck, p.mesh, total, (total + sp - 1) / sp, D);
  limits::check_ranks_fit_memory(
      detail::concat("generate with ", o.model, " (", limits::bytes_text(p.ck.file_bytes),
                     " of weights, --tp ", p.mesh.mesh.tp, ", ", D, " packed documents of ", total,
                     " tokens)"),
      need.weights + need.run, p.mesh.mesh.world(), o.backend);
}

Prepared prepare(const GenerateOptions& o, int world) {
  Prepared p;
  limits::check_range("--max-new-tokens", o.max_new_tokens, 1, limits::kMaxSteps);
  SEQPAR_ARG_CHECK(!o.model.empty(), "--model is required: a Hugging Face model directory");
  p.mesh = resolve_mesh(o, world);
  // generate has no --cfg: a cfg degree comes from the parallel-config file.
  SEQPAR_FILE_CHECK(p.mesh.mesh.cfg == 1, "--parallel-config ", o.parallel_config,
                    ": cfg_parallel_size ", p.mesh.mesh.cfg,
                    " runs a diffusion model's two guidance branches side by side; a causal LM "
                    "takes 1");
  SEQPAR_ARG_CHECK(weight_format_named(o.weights_dtype).has_value(), "--weights-dtype '",
                   o.weights_dtype, "' is unknown; valid: ", weight_format_names());
  SEQPAR_ARG_CHECK(activations_flag(o.activations) != DType::kI8 ||
                       weight_format_named(o.weights_dtype) != WeightFormat::kCheckpoint,
                   "--activations int8 multiplies int8 by int8 and needs --weights-dtype int8 or "
                   "int8-channel; valid with --weights-dtype ",
                   o.weights_dtype, ": fp32, bf16");
  (void)kv_cache_flag(o);
  if (!o.document_ids.empty()) {
    SEQPAR_ARG_CHECK(o.kv_cache_dtype == "fp32", "--kv-cache-dtype ", o.kv_cache_dtype,
                     " with --document-ids: a packed prefill keeps no cache; leave it out");
    prepare_documents(o, p);
    return p;
  }
  const std::vector<int64_t> ids = prompt_ids(o);
  p.ck = open_causal_lm(o.model);
  const DecoderConfig& m = p.ck.config;
  const std::string config = o.model + "/config.json";
  CausalLmRunNames names;
  names.prompt = o.prompt_ids.empty() ? "--prompt-ids-file" : "--prompt-ids";
  names.max_new_tokens = "--max-new-tokens";
  names.tp = "--tp";
  names.allow_long_context = "--allow-long-context";
  p.prompt = check_causal_lm_prompt(p.ck, ids, o.max_new_tokens, o.allow_long_context, names);
  // Positions 0 .. P + N - 2 enter the model (the last new token is not fed back); each chat
  // turn adds its tokens and N more.
  int64_t last = static_cast<int64_t>(ids.size()) + o.max_new_tokens - 1;
  limits::check_range("--turn-ids (turns)", static_cast<int64_t>(o.turn_ids.size()), 0,
                      limits::kMaxSteps);
  for (const std::string& text : o.turn_ids) {
    names.prompt = "--turn-ids";
    names.token = "--turn-ids token";
    p.turns.push_back(check_causal_lm_prompt(p.ck, parse_id_text("--turn-ids", text),
                                             o.max_new_tokens, true, names));
    last += static_cast<int64_t>(p.turns.back().size()) + o.max_new_tokens;
  }
  SEQPAR_ARG_CHECK(p.turns.empty() || last <= m.max_positions || o.allow_long_context,
                   "the prompt, ", p.turns.size(), " turns and their tokens need ", last,
                   " positions, beyond max_position_embeddings ", m.max_positions, " of ", config,
                   "; shorten them, or pass --allow-long-context");
  if (last > m.max_positions && reporting_rank())
    std::fprintf(stderr,
                 "seqpar: warning: %lld positions exceed max_position_embeddings %lld of %s "
                 "(--allow-long-context); the model was not trained for them\n",
                 static_cast<long long>(last), static_cast<long long>(m.max_positions),
                 config.c_str());
  check_causal_lm_tp(p.ck, p.mesh.mesh.tp, names);
  names.int8 = "--weights-dtype int8";
  if (o.weights_dtype == "int8") check_causal_lm_int8(p.ck, p.mesh.mesh.tp, names);
  apply_chunk_flags(o, p.chunking);
  const int64_t prompt = static_cast<int64_t>(ids.size());
  // Checked here, before any rank runs, so that under MPI one line says it. (With
  // --prefill-chunk the first chunk takes at least one token per rank, so the same holds.)
  const int sp = p.mesh.mesh.sp();
  SEQPAR_ARG_CHECK(prompt >= sp, o.prompt_ids.empty() ? "--prompt-ids-file" : "--prompt-ids",
                   " holds ", prompt, " tokens, fewer than the ", sp,
                   " sequence-parallel ranks (--ring-degree x --ulysses-degree); every rank needs "
                   "a token, --pad or not: use at most ",
                   prompt, " ranks, or a longer prompt");
  // Every rank on this machine, before any weight is read; the K/V cache of the rank that holds
  // the most tokens.
  Decoder::Options run = p.chunking;
  run.max_new_tokens = o.max_new_tokens;
  run.next_turns = p.turns;
  const Decoder::Footprint at_most = Decoder::footprint(run, prompt, p.mesh);
  const CausalLmMemory need =
      causal_lm_memory(p.ck, p.mesh, at_most.first_chunk, at_most.cached,
                       o.max_new_tokens * (1 + p.turns.size()), p.chunking.kv_cache);
  limits::check_ranks_fit_memory(
      detail::concat("generate with ", o.model, " (", limits::bytes_text(p.ck.file_bytes),
                     " of weights, --tp ", p.mesh.mesh.tp, ", ", last, " positions)"),
      need.weights + need.run, p.mesh.mesh.world(), o.backend);
  return p;
}

// What the run produced (rank 0), and per-rank measures.
struct Generated {
  Decoder::Output out;
  Decoder::DocumentsOutput docs;                                           // --document-ids
  double prefill_seconds = 0, decode_seconds = 0;                          // slowest rank
  std::vector<int64_t> weight_bytes, resident_bytes, peak_resident_bytes;  // per rank
  std::vector<int64_t> kv_cache_bytes;  // per rank: the storage its layers' K/V caches hold
  int64_t bytes_sent = 0;                                                  // rank 0, all groups
  std::string trace_error;  // --trace could not be written (the report still prints)
};

Decoder::Output generate_prompt(Communicator& world, const GenerateOptions& o, const Prepared& p,
                                Decoder& dec, ParallelContext& ctx, MeshComms& mc);

// --trace: recording starts on every rank after the weights are loaded, so the timeline holds
// the prefill and the decoded tokens; `trace_out` is rank 0's file (null on the others).
Generated run_rank(Communicator& world, const GenerateOptions& o, const Prepared& p,
                   WeightStore& weights, OutputFile* trace_out) {
  MeshComms mc(world, p.mesh.mesh);
  ParallelContext ctx = model_context(mc, p.mesh);
  weights.set_weight_format(*weight_format_named(o.weights_dtype));
  weights.set_activations(activations_flag(o.activations));
  Decoder dec(p.ck.config, weights, ctx);
  const int64_t weight_bytes = weights.bytes_read();
  weights = WeightStore();  // the last rank to let go unmaps the files
  Generated g;
  if (!o.trace.empty()) {
    trace::set_rank(world.rank());
    world.barrier();
    // One recorder per process: on threads rank 0 clears it for all.
    if (world.backend() == "mpi" || world.rank() == 0) trace::start();
    world.barrier();
  }
  if (!p.documents.empty()) {
    world.barrier();
    mc.reset_stats();
    g.docs = dec.prefill_documents(p.documents, ctx);
    g.prefill_seconds = world.all_reduce_max(g.docs.prefill_seconds);
  } else {
    g.out = generate_prompt(world, o, p, dec, ctx, mc);
    g.prefill_seconds = world.all_reduce_max(g.out.prefill_seconds);
    g.decode_seconds = world.all_reduce_max(g.out.decode_seconds);
  }
  if (!o.trace.empty()) write_trace(world, trace_out, &g.trace_error);
  g.bytes_sent = mc.stats().total_sent();
  const int64_t mine[4] = {weight_bytes, resident_bytes(), peak_resident_bytes(),
                           dec.kv_cache_use().bytes};
  std::vector<int64_t> all(4 * world.size());
  world.all_gather(mine, sizeof(mine), all.data());
  for (int r = 0; r < world.size(); ++r) {
    g.weight_bytes.push_back(all[4 * r]);
    g.resident_bytes.push_back(all[4 * r + 1]);
    g.peak_resident_bytes.push_back(all[4 * r + 2]);
    g.kv_cache_bytes.push_back(all[4 * r + 3]);
  }
  return g;
}

// The prompt (and its turns): prefill, then greedy decode.
Decoder::Output generate_prompt(Communicator& world, const GenerateOptions& o, const Prepared& p,
                                Decoder& dec, ParallelContext& ctx, MeshComms& mc) {
  Decoder::Options opts = p.chunking;
  opts.max_new_tokens = o.max_new_tokens;
  if (!o.ignore_eos) opts.stop_tokens = p.ck.eos_token_ids;
  opts.next_turns = p.turns;
  const bool progress = world.rank() == 0 && !o.quiet && !o.json;
  double last_report = 0;
  if (progress)
    opts.on_token = [&](int64_t tokens, double prefill_s, double decode_s) {
      if (tokens == 1) {
        std::fprintf(stderr, "seqpar generate: prefill of %zu tokens in %.3f s (%.1f tokens/s)\n",
                     p.prompt.size(), prefill_s, p.prompt.size() / std::max(prefill_s, 1e-9));
      } else if (decode_s - last_report >= 1.0 || tokens == o.max_new_tokens) {
        last_report = decode_s;
        std::fprintf(stderr, "seqpar generate: %lld/%lld tokens, %.2f tokens/s\n",
                     static_cast<long long>(tokens), static_cast<long long>(o.max_new_tokens),
                     (tokens - 1) / std::max(decode_s, 1e-9));
      }
    };
  world.barrier();
  mc.reset_stats();
  return dec.generate(p.prompt, opts, ctx);
}

// tokens (I64 [N]) and logits (F32 [N, vocab]) as safetensors bytes.
std::string output_file_bytes(const std::vector<int32_t>& tokens, const std::vector<Tensor>& logits,
                              int64_t vocab) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t tb = 8 * n, lb = 4 * n * vocab;
  json h;
  h["tokens"] = {{"dtype", "I64"}, {"shape", {n}}, {"data_offsets", {0, tb}}};
  h["logits"] = {{"dtype", "F32"}, {"shape", {n, vocab}}, {"data_offsets", {tb, tb + lb}}};
  h["__metadata__"] = {{"format", "pt"}};
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(bytes.data(), &len, 8);
  bytes += header;
  for (int32_t t : tokens) {
    const int64_t v = t;
    bytes.append(reinterpret_cast<const char*>(&v), 8);
  }
  for (const Tensor& l : logits) bytes.append(static_cast<const char*>(l.raw()), 4 * vocab);
  return bytes;
}

json list_json(const std::vector<int64_t>& v) { return json(v); }

// The JSON fields every generate report has: the model, the precision, the mesh, the bytes and
// memory per rank, the output file.
json run_json(const GenerateOptions& o, const Prepared& p, const Generated& g,
              const std::string& backend) {
  json j;
  j["model"] = o.model;
  j["family"] = p.ck.family->name;
  j["weights_dtype"] = o.weights_dtype;
  j["activations"] = o.activations;
  j["kv_cache_dtype"] = o.kv_cache_dtype;
  add_mesh_json(j, p.mesh, backend, /*with_cfg=*/false);
  j["bytes_sent_rank0"] = g.bytes_sent;
  j["weight_bytes_per_rank"] = list_json(g.weight_bytes);
  // Under threads every rank reports the one process's.
  j["resident_bytes_per_rank"] = list_json(g.resident_bytes);
  j["peak_resident_bytes_per_rank"] = list_json(g.peak_resident_bytes);
  j["kv_cache_bytes_per_rank"] = list_json(g.kv_cache_bytes);
  if (!o.output.empty()) j["output"] = o.output;
  if (!o.trace.empty()) j["trace"] = o.trace;
  return j;
}

// --document-ids: each document's next token (and logits to --output).
int report_documents(const GenerateOptions& o, const Prepared& p, const Generated& g,
                     const std::string& backend, OutputFile* file) {
  const Decoder::DocumentsOutput& docs = g.docs;
  if (file) file->write(output_file_bytes(docs.tokens, docs.logits, p.ck.config.vocab));
  std::vector<int64_t> lens;
  int64_t total = 0;
  for (const auto& d : p.documents) {
    lens.push_back(static_cast<int64_t>(d.size()));
    total += lens.back();
  }
  if (o.json) {
    json j = run_json(o, p, g, backend);
    j["tokens"] = docs.tokens;
    j["documents"] = lens.size();
    j["document_tokens"] = lens;
    j["prompt_tokens"] = total;
    j["new_tokens"] = docs.tokens.size();
    j["prefill_seconds"] = g.prefill_seconds;
    j["prefill_tokens_per_second"] = total / std::max(g.prefill_seconds, 1e-12);
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("seqpar generate: %s on %s, %s backend, %s attention, %s layout%s\n",
                o.model.c_str(), mesh_shape_text(p.mesh.mesh).c_str(), backend.c_str(),
                std::string(strategy_name(p.mesh.strategy)).c_str(),
                std::string(layout_name(p.mesh.layout)).c_str(), p.mesh.pad ? ", padded" : "");
    std::printf("  documents %zu packed, %lld tokens, prefill %.4f s (%.1f tokens/s)\n",
                lens.size(), static_cast<long long>(total), g.prefill_seconds,
                total / std::max(g.prefill_seconds, 1e-12));
    std::printf("  tokens   ");
    for (int32_t t : docs.tokens) std::printf(" %d", t);
    std::printf("  (each document's next token)\n");
    if (!o.output.empty()) std::printf("  wrote     %s\n", o.output.c_str());
    if (!o.trace.empty()) std::printf("  trace     %s\n", o.trace.c_str());
  }
  return 0;
}

int report_prompt(const GenerateOptions& o, const Prepared& p, const Generated& g,
                  const std::string& backend, OutputFile* file) {
  const auto& out = g.out;
  const int64_t n = static_cast<int64_t>(out.tokens.size());
  const int64_t P = static_cast<int64_t>(p.prompt.size());
  if (file) file->write(output_file_bytes(out.tokens, out.logits, p.ck.config.vocab));
  const double per_token = n > 1 ? g.decode_seconds / static_cast<double>(n - 1) : 0;
  if (o.json) {
    json j = run_json(o, p, g, backend);
    j["tokens"] = out.tokens;
    j["prompt_tokens"] = P;
    j["new_tokens"] = n;
    j["stopped_at_eos"] = out.stopped;
    j["prefill_seconds"] = g.prefill_seconds;
    j["prefill_tokens_per_second"] = P / std::max(g.prefill_seconds, 1e-12);
    j["decode_seconds"] = g.decode_seconds;
    j["decode_seconds_per_token"] = n > 1 ? json(per_token) : json(nullptr);
    j["decode_tokens_per_second"] = n > 1 ? json(1.0 / std::max(per_token, 1e-12)) : json(nullptr);
    j["tokens_per_second"] = n / std::max(g.prefill_seconds + g.decode_seconds, 1e-12);
    j["prefill_chunks"] = chunks_json(out.chunks);
    // Per turn (the prompt, then each --turn-ids): its prompt tokens and the tokens generated.
    json turns = json::array();
    for (size_t t = 0, at = 0; t < out.turn_tokens.size(); ++t) {
      const size_t count = static_cast<size_t>(out.turn_tokens[t]);
      turns.push_back({{"prompt_tokens", t == 0 ? p.prompt.size() : p.turns[t - 1].size()},
                       {"tokens", std::vector<int32_t>(out.tokens.begin() + at,
                                                       out.tokens.begin() + at + count)}});
      at += count;
    }
    j["turns"] = turns;
    j["hardware"] = o.hardware;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("seqpar generate: %s on %s, %s backend, %s attention, %s layout%s\n",
                o.model.c_str(), mesh_shape_text(p.mesh.mesh).c_str(), backend.c_str(),
                std::string(strategy_name(p.mesh.strategy)).c_str(),
                std::string(layout_name(p.mesh.layout)).c_str(), p.mesh.pad ? ", padded" : "");
    std::printf("  prompt   %lld tokens, prefill %.4f s (%.1f tokens/s)\n",
                static_cast<long long>(P), g.prefill_seconds,
                P / std::max(g.prefill_seconds, 1e-12));
    if (n > 1)
      std::printf("  decode   %lld tokens, %.4f s a token (%.2f tokens/s)%s\n",
                  static_cast<long long>(n - 1), per_token, 1.0 / std::max(per_token, 1e-12),
                  out.stopped ? ", stopped at eos" : "");
    std::printf("  tokens  ");
    for (int32_t t : out.tokens) std::printf(" %d", t);
    std::printf("\n");
    if (!o.output.empty()) std::printf("  wrote    %s\n", o.output.c_str());
    if (!o.trace.empty()) std::printf("  trace    %s\n", o.trace.c_str());
  }
  return 0;
}

// The report (the prompt's or the documents'); a --trace that could not be written is one more
// line, and exit code 1.
int report(const GenerateOptions& o, const Prepared& p, const Generated& g,
           const std::string& backend, OutputFile* file) {
  const int code = p.documents.empty() ? report_prompt(o, p, g, backend, file)
                                       : report_documents(o, p, g, backend, file);
  if (g.trace_error.empty()) return code;
  std::fprintf(stderr, "seqpar: error: %s\n", g.trace_error.c_str());
  return 1;
}

int run_generate(const GenerateOptions& o) {
  if (o.backend != "mpi") {
    Prepared p = prepare(o, 0);
    std::unique_ptr<OutputFile> file, trace_out;
    if (!o.output.empty()) file = std::make_unique<OutputFile>("--output", o.output);
    if (!o.trace.empty()) trace_out = std::make_unique<OutputFile>("--trace", o.trace);
    const int n = p.mesh.mesh.world();
    // Each rank its own store (a rank's bytes_read counts its reads alone); the files stay
    // mapped until the last rank has loaded its share.
    std::vector<WeightStore> stores(n, p.ck.weights);
    p.ck.weights = WeightStore();
    Generated g;
    run_on_threads(n, [&](Communicator& world) {
      Generated mine = run_rank(world, o, p, stores[world.rank()],
                                world.rank() == 0 ? trace_out.get() : nullptr);
      if (world.rank() == 0) g = std::move(mine);
    });
    return finish_output(report(o, p, g, "threads", file.get()));
  }
  Prepared p;
  std::unique_ptr<OutputFile> file, trace_out;
  return run_on_mpi(
      o.json, [&](int world_size) { p = prepare(o, world_size); },
      [&](Communicator& world) {
        // Rank 0 opens the outputs before any other collective; a refused one ends every rank.
        if (!o.output.empty() || !o.trace.empty())
          if (const int code = on_rank0_first(world, o.json, [&] {
                if (!o.output.empty()) file = std::make_unique<OutputFile>("--output", o.output);
                if (!o.trace.empty()) trace_out = std::make_unique<OutputFile>("--trace", o.trace);
              }))
            return code;
        Generated g = run_rank(world, o, p, p.ck.weights, trace_out.get());
        // A failed write of the output is one line, as on threads (not rank 0's abort).
        int code = 0;
        if (const int failed =
                on_rank0_first(world, o.json, [&] { code = report(o, p, g, "mpi", file.get()); }))
          return failed;
        return code;
      });
}

}  // namespace

const char* const kActivationsHelp =
    "fp32 | bf16 | int8: the linear layers' inputs as computed, or rounded to bf16 first (with "
    "bf16 or int8-channel weights: oneDNN's bf16 matmul where the CPU has AVX512-BF16 or AMX, as "
    "llama.cpp multiplies BF16 weights), or quantized to int8 (generate with int8 weights: per row "
    "with --weights-dtype int8-channel, oneDNN's int8 matmul, VNNI where the CPU has it; per block "
    "of 32 with --weights-dtype int8, as llama.cpp multiplies Q8_0, in int8 with AVX512-VNNI); "
    "seqpar info names the paths";

DType activations_flag(const std::string& value, bool int8_allowed) {
  const std::optional<DType> d = activations_named(value);
  SEQPAR_ARG_CHECK(d.has_value(), "--activations '", value,
                   "' is unknown; valid: ", activations_names());
  SEQPAR_ARG_CHECK(*d != DType::kI8 || int8_allowed,
                   "--activations int8 needs int8 weights, which denoise does not load; valid "
                   "here: fp32, bf16");
  return *d;
}

void add_generate_command(CLI::App& app, GenerateOptions& o) {
  CLI::App* g = app.add_subcommand(
      "generate",
      "Greedy decoding of a Hugging Face causal LM directory (Llama, Qwen2, Qwen3) on a tp x "
      "ring x ulysses mesh");
  g->add_option("--model", o.model, "Hugging Face model directory (config.json, safetensors)");
  g->add_option("--prompt-ids,--prompt_ids", o.prompt_ids, "prompt token ids: 1,2,3");
  g->add_option("--prompt-ids-file,--prompt_ids_file", o.prompt_ids_file,
                "prompt token ids: text (commas or whitespace), .npy or .safetensors integers");
  g->add_option("--max-new-tokens,--max_new_tokens", o.max_new_tokens, "tokens to generate")
      ->each([&o](const std::string&) { o.max_new_tokens_given = true; });
  add_mesh_flags(g, o, false);
  g->add_flag("--ignore-eos,--ignore_eos", o.ignore_eos, "do not stop at eos_token_id");
  g->add_flag("--allow-long-context,--allow_long_context", o.allow_long_context,
              "run past max_position_embeddings (with a warning)");
  g->add_option("--output", o.output,
                "safetensors file: tokens (I64 [N]) and logits (F32 [N, vocab])");
  g->add_option("--trace", o.trace,
                "write a Chrome/Perfetto trace (JSON) of the prefill and the decoded tokens");
  add_chunk_flags(g, o);
  g->add_option("--weights-dtype,--weights_dtype", o.weights_dtype,
                "checkpoint | int8 | int8-channel: the matrices as the checkpoint stores them, "
                "or quantized at load to int8: blocks of 32 with an fp16 scale each (int8: "
                "llama.cpp's Q8_0), or one fp32 scale per output row (int8-channel)");
  g->add_option("--activations", o.activations, kActivationsHelp);
  g->add_option("--turn-ids,--turn_ids", o.turn_ids,
                "a chat turn: token ids appended after the tokens generated so far, over the "
                "cache (in chunks of --prefill-chunk); then --max-new-tokens more (repeatable)")
      ->allow_extra_args(false);
  g->add_option("--document-ids,--document_ids", o.document_ids,
                "a document's token ids (repeatable): the documents packed into one sequence and "
                "prefilled together, each attending itself with positions from 0; prints each "
                "one's next token, decodes nothing after")
      ->allow_extra_args(false);
  g->add_flag("--json", o.json, "print one JSON object");
  g->add_flag("--quiet", o.quiet, "no progress on stderr");
  guard_integer_options(g);
}

int generate_command(const GenerateOptions& o) {
  return with_json_errors(o.json, [&] { return run_generate(o); });
}

}  // namespace seqpar::cli
