#include "seqpar/model/diffusion_family.h"

#include <array>
#include <utility>

#include "../config_json.h"
#include "seqpar/core/error.h"
#include "seqpar/core/json_limits.h"

namespace seqpar {

namespace {
constexpr std::array<std::pair<std::string_view, DiffusionFamily>, 4> kClasses = {{
    {"WanTransformer3DModel", DiffusionFamily::kWan},
    {"WanModel", DiffusionFamily::kWan},
    {"QwenImageTransformer2DModel", DiffusionFamily::kQwenImage},
    {"FluxTransformer2DModel", DiffusionFamily::kFlux},
}};
}  // namespace

std::string_view diffusion_family_name(DiffusionFamily f) {
  switch (f) {
    case DiffusionFamily::kWan:
      return "wan";
    case DiffusionFamily::kQwenImage:
      return "qwen-image";
    case DiffusionFamily::kFlux:
      return "flux";
  }
  return "";
}

DiffusionFamily diffusion_family(const std::string& dir) {
  for (const std::string& config : {dir + "/config.json", dir + "/transformer/config.json"}) {
    const std::string name = json_class_name(config);
    if (name.empty()) continue;
    for (const auto& [cls, family] : kClasses)
      if (name == cls) return family;
    std::string valid;
    for (const auto& [cls, family] : kClasses)
      valid += (valid.empty() ? "" : ", ") + std::string(cls);
    throw InvalidArgument(detail::concat(config, ": _class_name \"", quote_for_message(name),
                                         "\" is not a transformer seqpar runs; expected one of ",
                                         valid));
  }
  return DiffusionFamily::kWan;  // Wan's original layout declares no class; its reader checks
}

}  // namespace seqpar
