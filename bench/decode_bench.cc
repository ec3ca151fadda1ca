// decode_bench: the local kernel on decode shapes (a few queries over a long K/V cache), where
// reading K/V from memory is the cost. Reports the kernel's K/V read rate beside this machine's
// streaming read rate measured in the same rounds (a sum over a buffer as large as the K/V).
//
//   decode_bench [--cached 131072[,...]] [--new 4] [--heads 32] [--kv-heads 8] [--head-dim 128]
//                [--dtype bf16|fp32|fp16] [--threads 1] [--block-k 0] [--rounds 3]
//                [--min-time 0.3]
//
// Prints a markdown table: time per call, K/V GB/s (K and V bytes of the cache / time), the
// streaming read GB/s, their ratio, GFLOP/s (4·D flops per score element), and in the same
// rounds the kernel with oneDNN's matmuls instead of its few-row loops (SEQPAR_KERNEL_SMALL_MM=0)
// and the speedup over it. Not a test.

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
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
using seqpar::bench::time_per_call;

[[noreturn]] void usage_error(const std::string& msg) {
  seqpar::bench::usage_error("decode_bench", msg);
}

std::vector<int64_t> parse_list(const std::string& flag, const std::string& s) {
  return seqpar::bench::parse_list("decode_bench", flag, s);
}

using seqpar::Tensor;

struct Options {
  std::vector<int64_t> cached = {131072};
  int64_t fresh = 4, heads = 32, kv_heads = 8, head_dim = 128;
  DType dtype = DType::kBF16;
  int threads = 1, rounds = 3, block_k = 0;
  double min_time = 0.3;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::replace(a.begin(), a.end(), '_', '-');
    if (a == "--help" || a == "-h") {
      std::printf(
          "decode_bench [--cached 131072[,...]] [--new 4] [--heads 32] [--kv-heads 8]\n"
          "             [--head-dim 128] [--dtype bf16|fp32|fp16] [--threads 1] [--block-k 0]\n"
          "             [--rounds 3] [--min-time 0.3]\n");
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error(a + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (a == "--cached") {
      o.cached = parse_list(a, v);
    } else if (a == "--new") {
      o.fresh = parse_list(a, v)[0];
    } else if (a == "--heads") {
      o.heads = parse_list(a, v)[0];
    } else if (a == "--kv-heads") {
      o.kv_heads = parse_list(a, v)[0];
    } else if (a == "--head-dim") {
      o.head_dim = parse_list(a, v)[0];
    } else if (a == "--dtype") {
      o.dtype = seqpar::bench::parse_dtype_arg("decode_bench", v);
    } else if (a == "--threads") {
      o.threads = static_cast<int>(parse_list(a, v)[0]);
    } else if (a == "--block-k") {
      o.block_k = static_cast<int>(parse_list(a, v)[0]);
    } else if (a == "--rounds") {
      o.rounds = static_cast<int>(parse_list(a, v)[0]);
    } else if (a == "--min-time") {
      o.min_time = seqpar::bench::parse_min_time("decode_bench", v);
    } else {
      usage_error("unknown option " + a + " (see --help)");
    }
  }
  if (o.heads % o.kv_heads != 0) {
    usage_error("--heads " + std::to_string(o.heads) + " is not a multiple of --kv-heads " +
                std::to_string(o.kv_heads));
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  omp_set_num_threads(o.threads);
  std::printf("kernel: %s\n", seqpar::attention_kernel_info().c_str());
  std::printf("threads: %d; best of %d rounds (each timing >= %.2f s)\n\n", o.threads, o.rounds,
              o.min_time);
  std::printf(
      "| cached | new | H/Hkv | D | dtype | ms per call | K/V GB/s | stream read GB/s | ratio | "
      "GFLOP/s | ms with oneDNN matmuls | speedup |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  const int64_t d = o.head_dim;
  for (int64_t s : o.cached) {
    const Tensor q = seqpar::random_normal({1, o.fresh, o.heads, d}, 1, o.dtype);
    const Tensor k = seqpar::random_normal({1, s, o.kv_heads, d}, 2, o.dtype);
    const Tensor v = seqpar::random_normal({1, s, o.kv_heads, d}, 3, o.dtype);
    const double kv_bytes = static_cast<double>(k.nbytes() + v.nbytes());
    std::vector<uint64_t> buf(static_cast<size_t>(kv_bytes / 8), 1);
    seqpar::AttnParams p;  // every new token sees the whole cache
    p.block_k = o.block_k;
    const double flops = 4.0 * d * o.heads * o.fresh * static_cast<double>(s);
    seqpar::flash_attention(q, k, v, p);  // warm-up
    volatile uint64_t sink = 0;
    double best_k = 1e30, best_r = 1e30, best_dnnl = 1e30;
    for (int r = 0; r < o.rounds; ++r) {
      best_k =
          std::min(best_k, time_per_call([&] { seqpar::flash_attention(q, k, v, p); }, o.min_time));
      setenv("SEQPAR_KERNEL_SMALL_MM", "0", 1);
      best_dnnl = std::min(best_dnnl,
                           time_per_call([&] { seqpar::flash_attention(q, k, v, p); }, o.min_time));
      unsetenv("SEQPAR_KERNEL_SMALL_MM");
      best_r = std::min(
          best_r, time_per_call(
                      [&] {
                        sink = sink + seqpar::bench::stream_read(
                                          buf.data(), static_cast<int64_t>(buf.size()), o.threads);
                      },
                      o.min_time));
    }
    const double kv_rate = kv_bytes / best_k * 1e-9, read_rate = kv_bytes / best_r * 1e-9;
    std::printf(
        "| %lld | %lld | %lld/%lld | %lld | %s | %.2f | %.2f | %.2f | %.2f | %.1f | %.2f | %.2fx "
        "|\n",
        static_cast<long long>(s), static_cast<long long>(o.fresh), static_cast<long long>(o.heads),
        static_cast<long long>(o.kv_heads), static_cast<long long>(d),
        std::string(seqpar::dtype_name(o.dtype)).c_str(), best_k * 1e3, kv_rate, read_rate,
        kv_rate / read_rate, flops / best_k * 1e-9, best_dnnl * 1e3, best_dnnl / best_k);
    std::fflush(stdout);
  }
  return 0;
}
