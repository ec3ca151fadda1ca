// The diffusion transformers seqpar runs, told apart by the class name a checkpoint's config
// declares (diffusers' "_class_name"), for the callers that take any of them (seqpar denoise).
// Thread-safety: reentrant.
#pragma once

#include <string>
#include <string_view>

namespace seqpar {

enum class DiffusionFamily { kWan, kQwenImage, kFlux };

std::string_view diffusion_family_name(DiffusionFamily f);

// The family of checkpoint directory `dir` by the class its config.json or transformer/config.json
// declares: WanTransformer3DModel or WanModel (or none: Wan's original layout) -> kWan,
// QwenImageTransformer2DModel -> kQwenImage, FluxTransformer2DModel -> kFlux. InvalidArgument in
// one line naming the class and the ones seqpar runs for any other class; the family's reader
// checks the rest.
DiffusionFamily diffusion_family(const std::string& dir);

}  // namespace seqpar
