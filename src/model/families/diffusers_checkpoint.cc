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

std::array<int64_t, 3> read_axes_dims_rope(const ConfigJson& c, int64_t head_dim,
                                           std::array<int64_t, 3> axes) {
  const std::string& path = c.path();
  if (c.has("axes_dims_rope")) {
    const nlohmann::json& a = c.at("axes_dims_rope");
    SEQPAR_FILE_CHECK(a.is_array() && a.size() == 3, path, ": axes_dims_rope is ", json_excerpt(a),
                      "; expected three even integers");
    for (int i = 0; i < 3; ++i)
      axes[i] = c.integer_of(a[i], "axes_dims_rope[" + std::to_string(i) + "]", 2, 1024);
  }
  for (const int64_t a : axes)
    SEQPAR_FILE_CHECK(a % 2 == 0, path, ": axes_dims_rope ", shape_text(axes),
                      " holds an odd width; expected even ones (RoPE pairs)");
  SEQPAR_FILE_CHECK(axes[0] + axes[1] + axes[2] == head_dim, path, ": axes_dims_rope ",
                    shape_text(axes), " sums to ", axes[0] + axes[1] + axes[2],
                    "; expected attention_head_dim ", head_dim);
  return axes;
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
