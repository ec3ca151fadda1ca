// seqpar info: what this build is and what it runs on (backends, CPU ISA, the kernel paths of
// attention, linear() and the model's elementwise and normalisation ops).
#include <cstdio>
#include <dnnl.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "seqpar/attention/attention.h"
#include "seqpar/comm/mpi.h"
#include "seqpar/core/block_cache.h"
#include "seqpar/model/ops.h"
#include "seqpar/version.h"

namespace seqpar::cli {

namespace {
std::vector<std::string> cpu_features() {
  std::vector<std::string> f;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) f.push_back("avx2");
  if (__builtin_cpu_supports("fma")) f.push_back("fma");
  if (__builtin_cpu_supports("avx512f")) f.push_back("avx512f");
  if (__builtin_cpu_supports("avx512bw")) f.push_back("avx512bw");
  if (__builtin_cpu_supports("avx512bf16")) f.push_back("avx512bf16");
#if defined(__GNUC__) && __GNUC__ >= 12
  if (__builtin_cpu_supports("amx-bf16")) f.push_back("amx-bf16");
#endif
  return f;
}
}  // namespace

void add_info_command(CLI::App& app, InfoOptions& o) {
  CLI::App* info = app.add_subcommand("info", "Print the build: backends, CPU ISA, kernel path");
  info->add_flag("--json", o.json, "print one JSON object");
}

int info_command(const InfoOptions& o) {
  const dnnl_version_t* v = dnnl_version();
  std::string onednn =
      std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  std::vector<std::string> backends = {"threads"};
  if (mpi_available()) backends.push_back("mpi");
  const auto features = cpu_features();
  const std::string kernel = attention_kernel_info();
  const std::string model_kernel = model_kernel_info();
  const auto model_ops = model_op_paths();
  const unsigned cores = std::thread::hardware_concurrency();
  const size_t cache_limit = block_cache::limit_bytes();
  // Whether large tensors are advised as huge pages, and whether this kernel grants them.
  const bool huge_pages = block_cache::huge_pages() && block_cache::huge_pages_granted();
  const block_cache::HugePages mode = block_cache::huge_pages_mode();
  const char* huge_mode = mode == block_cache::HugePages::kAuto ? "auto"
                          : mode == block_cache::HugePages::kOn ? "on"
                                                                : "off";
  if (o.json) {
    nlohmann::json j;
    j["version"] = std::string(version());
    j["backends"] = backends;
    j["cpu_features"] = features;
    j["cores"] = cores;
    j["onednn"] = onednn;
    j["kernel"] = kernel;
    j["model_kernel"] = model_kernel;
    j["tensor_cache_bytes"] = cache_limit;
    j["huge_pages"] = huge_pages;
    j["huge_pages_mode"] = huge_mode;
    j["model_ops"] = nlohmann::json::object();
    for (const auto& [op, isa] : model_ops) j["model_ops"][op] = isa;
    std::printf("%s\n", j.dump().c_str());
    return finish_output(0);
  }
  std::string b, f;
  for (const auto& x : backends) b += (b.empty() ? "" : ", ") + x;
  for (const auto& x : features) f += (f.empty() ? "" : " ") + x;
  std::printf("seqpar 0.1.0\n");
  std::printf("  backends  %s\n", b.c_str());
  std::printf("  cpu       %u cores; %s\n", cores, f.c_str());
  std::printf("  oneDNN    %s\n", onednn.c_str());
  std::printf("  kernel    %s\n", kernel.c_str());
  std::printf("  model     %s\n", model_kernel.c_str());
  std::printf("  ops       %s\n", model_op_info().c_str());
  const char* pages = mode == block_cache::HugePages::kAuto
                          ? "from 2 MiB on transparent huge pages while their first touch is fast "
                            "(SEQPAR_HUGE_PAGES=auto)"
                          : "from 2 MiB on transparent huge pages (SEQPAR_HUGE_PAGES=1)";
  if (!block_cache::huge_pages())
    pages = "small pages only (SEQPAR_HUGE_PAGES=0)";
  else if (!huge_pages)
    pages = "small pages only (this kernel's transparent huge pages are off)";
  std::printf(
      "  memory    large tensor storage kept for reuse up to %zu MiB (SEQPAR_TENSOR_CACHE_MB); "
      "%s\n",
      cache_limit >> 20, pages);
  return finish_output(0);
}

}  // namespace seqpar::cli
