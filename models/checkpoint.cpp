#include "models/checkpoint.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "models/hf.h"
#include "models/llama2c.h"
#include "models/safetensors.h"
#include "runtime/util/assets.h"

namespace flowrun {

namespace fs = std::filesystem;

void save_model_dir(const decoder& model_in, const std::string& dir) {
  auto& model = const_cast<decoder&>(model_in);
  const bool merged = model.lora_merged();
  if (merged) model.unmerge_lora();  // the file holds base and adapter apart
  fs::create_directories(dir);
  nlohmann::json j;
  j["model"] = model.config();
  j["value_head"] = model.has_value_head();
  j["lora"] = model.has_lora() ? nlohmann::json{{"lora_r", model.lora().lora_r},
                                               {"lora_alpha", model.lora().lora_alpha},
                                               {"lora_dropout", model.lora().lora_dropout},
                                               {"target_modules", model.lora().target_modules}}
                               : nlohmann::json(nullptr);
  named_tensors ts;
  for (auto& e : model.params()) ts.emplace_back(e.name, model.w().by_name.at(e.name));
  for (auto& e : model.adapter_params()) ts.emplace_back(e.name, model.w().by_name.at(e.name));
  save_safetensors((fs::path(dir) / "model.safetensors").string(), ts);
  write_text_atomic((fs::path(dir) / "flowrun_config.json").string(), j.dump(2));
  if (merged) model.merge_lora();
}

decoder load_model(const std::string& path_in) {
  fs::path p = resolve_user_path(path_in, "model");
  if (fs::is_regular_file(p)) return load_llama2c(p.string());
  if (fs::exists(p / "flowrun_config.json")) {
    std::ifstream f(p / "flowrun_config.json");
    auto j = nlohmann::json::parse(f);
    decoder m(j.at("model").get<model_config>());
    if (j.value("value_head", false)) m.add_value_head();
    if (!j["lora"].is_null()) {
      lora_config lc;
      lc.lora_r = j["lora"]["lora_r"];
      lc.lora_alpha = j["lora"]["lora_alpha"];
      lc.lora_dropout = j["lora"]["lora_dropout"];
      lc.target_modules = j["lora"]["target_modules"].get<std::vector<std::string>>();
      m.enable_lora(lc);
    }
    auto tensors = load_safetensors((p / "model.safetensors").string());
    for (auto& [name, t] : m.w().by_name) {
      auto it = tensors.find(name);
      if (it == tensors.end())
        throw std::runtime_error((p / "model.safetensors").string() + ": tensor '" + name + "' is missing");
      if (it->second.shape() != t.shape())
        throw std::runtime_error((p / "model.safetensors").string() + ": tensor '" + name + "' has shape " +
                                 shape_str(it->second.shape()) + ", the config needs " + shape_str(t.shape()));
      t.copy_from(it->second);
    }
    return m;
  }
  if (fs::exists(p / "config.json")) return load_hf(p.string());
  throw std::runtime_error(p.string() + ": not a model: expected a llama2.c .bin file, a folder with "
                                        "flowrun_config.json, or a Hugging Face folder with config.json");
}

}  // namespace flowrun
