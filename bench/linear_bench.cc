// linear_bench: linear() of m rows by a (n, k) weight in the checkpoint dtypes, per row count,
// on the calling thread's OpenMP team (OMP_NUM_THREADS sets it): the few-row decode product, and
// from 9 rows the converted blocks multiplied by oneDNN.
//
//   linear_bench [--m 8,9,15,16,17,32,64] [--n 8192] [--k 2048]
//                [--dtype bf16|fp16|int8|int8-channel] [--activations fp32|bf16|int8]
//                [--compare-packed ROUNDS]
//
// --compare-packed: per m, linear() with the packed product (src/model/gemm_packed.h, at any row
// count) against linear() on oneDNN's converted blocks (the packed product off), one call of each
// per round in alternating order, ROUNDS rounds in one process: each path's median GFLOP/s and
// the min / median / max of the per-round ratio (packed / oneDNN time ratio inverted: > 1, packed
// faster). Where the CPU has no packed variant (gemm_packed() null) both columns are oneDNN's.
//
// (--activations int8 needs an int8 --dtype: with int8, the activations in blocks of 32.)
// Per m: the mean time of 5 calls after a warm-up, and GFLOP/s (2·m·n·k a call). With an int8
// --dtype, first the time to quantize the weight as a load does (the mean of 3 calls), beside the
// time to widen the same weight to fp32 (convert(), a pass over it that every load makes). Not a
// test: timing decides nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gemm_packed.h"
#include "seqpar/core/cpu_isa.h"
#include "seqpar/core/tensor.h"
#include "seqpar/model/ops.h"

int main(int argc, char** argv) {
  using namespace seqpar;
  std::vector<int64_t> ms = {8, 9, 15, 16, 17, 32, 64}, ns = {8192}, ks = {2048};
  std::string dtype = "bf16";
  DType activations = DType::kF32;
  int64_t compare_rounds = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) bench::usage_error("linear_bench", a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--m") {
      ms = bench::parse_list("linear_bench", a, v);
    } else if (a == "--n") {
      ns = bench::parse_list("linear_bench", a, v);
    } else if (a == "--k") {
      ks = bench::parse_list("linear_bench", a, v);
    } else if (a == "--dtype" &&
               (v == "bf16" || v == "fp16" || v == "int8" || v == "int8-channel")) {
      dtype = v;
    } else if (a == "--compare-packed") {
      compare_rounds = bench::parse_one("linear_bench", a, v);
    } else if (a == "--activations" && (v == "fp32" || v == "bf16" || v == "int8")) {
      activations = v == "bf16" ? DType::kBF16 : v == "int8" ? DType::kI8 : DType::kF32;
    } else {
      bench::usage_error("linear_bench",
                         "usage: linear_bench [--m 8,16] [--n 8192] [--k 2048] "
                         "[--dtype bf16|fp16|int8|int8-channel] [--activations fp32|bf16|int8] "
                         "[--compare-packed ROUNDS]");
    }
  }
  if (activations == DType::kI8 && dtype != "int8-channel" && dtype != "int8")
    bench::usage_error("linear_bench", "--activations int8 needs --dtype int8 or int8-channel");
  const Tensor w16 = random_normal({ns[0], ks[0]}, 2, dtype == "fp16" ? DType::kF16 : DType::kBF16);
  const Q8Weight q8 = dtype == "int8" ? quantize_q8_0(w16, "w") : Q8Weight{};
  const Int8ChannelWeight ch =
      dtype == "int8-channel" ? quantize_int8_channel(w16, "w") : Int8ChannelWeight{};
  if (dtype == "int8" || dtype == "int8-channel") {
    auto mean_ms = [](auto&& fn) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 3; ++i) fn();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 3 * 1e3;
    };
    const double quantize = mean_ms([&] {
      if (dtype == "int8")
        (void)quantize_q8_0(w16, "w");
      else
        (void)quantize_int8_channel(w16, "w");
    });
    const double widen = mean_ms([&] { (void)w16.to(DType::kF32); });
    std::printf(
        "quantize a %lld x %lld weight: %.2f ms (%.2f ns a weight); widen it to fp32: %.2f ms\n\n",
        static_cast<long long>(ns[0]), static_cast<long long>(ks[0]), quantize,
        quantize * 1e6 / static_cast<double>(ns[0] * ks[0]), widen);
  }
  const Tensor& w = dtype == "int8" ? q8.q : dtype == "int8-channel" ? ch.q : w16;
  const Tensor& scale = dtype == "int8" ? q8.d : ch.s;
  if (compare_rounds > 0) {
    std::printf(
        "linear of m x %lld by %lld x %lld %s weights, %s activations: packed product (%s) "
        "against oneDNN on converted blocks, %lld rounds\n| m | packed GFLOP/s | oneDNN GFLOP/s "
        "| packed / oneDNN min | median | max |\n|---|---|---|---|---|---|\n",
        static_cast<long long>(ks[0]), static_cast<long long>(ns[0]), static_cast<long long>(ks[0]),
        dtype.c_str(), std::string(dtype_name(activations)).c_str(),
        model_simd::gemm_packed() ? std::string(isa_name(kernel_isa())).c_str() : "none here",
        static_cast<long long>(compare_rounds));
    const int64_t saved = model_simd::packed_max_rows();
    for (const int64_t m : ms) {
      const Tensor x = random_normal({m, ks[0]}, 1);
      auto call = [&](bool packed) {
        model_simd::set_packed_max_rows(packed ? m : 0);
        const auto t0 = std::chrono::steady_clock::now();
        (void)linear(x, w, Tensor(), scale, activations);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      bench::print_alternated(std::to_string(m), 2.0 * m * ns[0] * ks[0] * 1e-9,
                              bench::alternate(compare_rounds, call));
    }
    model_simd::set_packed_max_rows(saved);
    return 0;
  }
  std::printf(
      "linear of m x %lld by %lld x %lld %s weights, %s activations\n| m | ms/call | GFLOP/s "
      "|\n|---|---|---|\n",
      static_cast<long long>(ks[0]), static_cast<long long>(ns[0]), static_cast<long long>(ks[0]),
      dtype.c_str(), std::string(dtype_name(activations)).c_str());
  for (const int64_t m : ms) {
    const Tensor x = random_normal({m, ks[0]}, 1);
    (void)linear(x, w, Tensor(), scale, activations);  // warm-up: oneDNN primitives, buffers
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) (void)linear(x, w, Tensor(), scale, activations);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 5;
    std::printf("| %lld | %.2f | %.1f |\n", static_cast<long long>(m), s * 1e3,
                2.0 * m * ns[0] * ks[0] / s * 1e-9);
  }
  return 0;
}
