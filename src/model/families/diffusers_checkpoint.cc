#include "diffusers_checkpoint.h"

#include <set>

#include "seqpar/core/files.h"
#include "seqpar/core/json_limits.h"

namespace seqpar {

SafetensorsFiles open_diffusers_weights(const std::string& dir, const std::string& config,
                                        const std::vector<WeightStore::Spec>& params,
                                        const StoredName& stored, const std::string& model) {
  const std::string single = dir + "/diffusion_pytorch_model.safetensors";
  const std::string index = single + ".index.json";
  SafetensorsFiles tensors;
  if (files::is_regular_file(single)) {
    auto f = std::make_shared<const SafetensorsFile>(single);
    for (const std::string& n : f->names()) tensors.emplace(n, f);
  } else {
    SEQPAR_FILE_CHECK(files::is_regular_file(index), dir,
                      ": holds no weights; expected diffusion_pytorch_model.safetensors or "
                      "diffusion_pytorch_model.safetensors.index.json");
    tensors = open_safetensors_index(index, dir);
  }
  std::set<std::string> expected;
  for (const WeightStore::Spec& s : params) {
    const std::string name = stored(s.name);
    auto it = tensors.find(name);
    SEQPAR_FILE_CHECK(it != tensors.end(), dir, ": tensor '", name, "' is missing; expected shape ",
                      shape_text(s.shape));
    const std::vector<int64_t>& have = it->second->entry(name).shape;
    SEQPAR_FILE_CHECK(have == s.shape, dir, ": tensor '", name, "' has shape ", shape_text(have),
                      "; expected ", shape_text(s.shape), " (from ", config, ")");
    expected.insert(name);
  }
  for (const auto& [n, f] : tensors)
    SEQPAR_FILE_CHECK(expected.count(n), dir, ": tensor '", quote_for_message(n),
                      "' is not part of a ", model, " of this config");
  return tensors;
}

WeightStore map_diffusers_weights(const SafetensorsFiles& files,
                                  const std::vector<WeightStore::Spec>& params,
                                  const StoredName& stored) {
  WeightStore ws;
  for (const WeightStore::Spec& s : params) {
    const std::string name = stored(s.name);
    ws.map(s.name, files.at(name), name);
  }
  return ws;
}

std::string diffusers_ffn_name(const std::string& name, std::initializer_list<const char*> ffns) {
  for (const char* ffn : ffns) {
    const size_t at = name.find(ffn);
    if (at == std::string::npos) continue;
    const size_t rest = at + std::string(ffn).size();
    if (name.compare(rest, 2, "0.") == 0)
      return name.substr(0, rest) + "net.0.proj." + name.substr(rest + 2);
    if (name.compare(rest, 2, "2.") == 0)
      return name.substr(0, rest) + "net.2." + name.substr(rest + 2);
  }
  return name;
}

}  // namespace seqpar
