#include "tools/flowrun/zero_source.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/resume_check.h"
#include "models/adapter.h"
#include "models/checkpoint.h"
#include "models/config.h"
#include "models/train/engine_checkpoint.h"
#include "runtime/util/assets.h"

namespace flowrun::cli {

std::string zero_step_folder(const std::string& path, const std::string& option) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw std::invalid_argument(option + " " + path + ": no such folder (zero_rank's output_dir, or one of its "
                                "step_NNNNNNNN folders)");
  // a step folder (manifests), or an output_dir whose `latest` names one that is there: a resume would take the
  // newest that verifies where `latest` cannot say, but a model read from a checkpoint is the one the user names
  // (DeepSpeed's zero_to_fp32.py stops too): any doubt is an error naming the step folders to choose from
  if (is_checkpoint(path) && !fs::exists(fs::path(path) / "latest", ec)) return path;
  std::string note, folder;
  try {
    folder = latest_checkpoint(path, &note);
  } catch (const std::exception& e) {
    note = e.what();
    folder.clear();
  }
  if (!folder.empty() && note.empty()) return folder;
  std::vector<std::string> steps, nodes;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (!e.is_directory()) continue;
    if (e.path().filename().string().rfind("step_", 0) == 0) steps.push_back(e.path().string());
    else if (is_checkpoint(e.path().string())) nodes.push_back(e.path().string());  // a graph's checkpoint_dir
  }
  std::sort(steps.begin(), steps.end());
  std::sort(nodes.begin(), nodes.end());
  if (steps.empty() && nodes.empty())  // (the resume's advice in `note`, "start fresh", is not this command's)
    throw std::invalid_argument(option + " " + path + ": no step folder there to read (zero_rank's output_dir, or a "
                                "trainer's CHECKPOINT_DIR/NODE, holds step_NNNNNNNN folders)");
  const std::string why = !note.empty() ? note : std::string("no committed checkpoint there (no 'latest' file)");
  throw std::invalid_argument(
      option + " " + path + ": " + why +
      (!steps.empty()   ? "; it holds " + std::to_string(steps.size()) + " step folder(s): pass the one you mean, e.g. " +
                              option + " " + steps.back()
       : !nodes.empty() ? "; it is a graph's checkpoint_dir, holding the checkpoints of " + std::to_string(nodes.size()) +
                              " node(s): pass one, e.g. " + option + " " + nodes.front()
                        : std::string()));
}

std::string zero_run_model(const loaded_checkpoint& ck) {
  const nlohmann::json settings = ck.manifests.at(0).extra.value("settings", nlohmann::json::object());
  try {  // the setting as the graph spells it: a quoted string (graph::to_string), which JSON reads
    return nlohmann::json::parse(settings.value("model", std::string("\"\""))).get<std::string>();
  } catch (const nlohmann::json::exception&) {  // not a string: no model named
    return "";
  }
}

std::string zero_run_tokenizer(const loaded_checkpoint& ck, const std::string& path) {
  const nlohmann::json settings = ck.manifests.at(0).extra.value("settings", nlohmann::json::object());
  std::error_code ec;
  std::string tok, contents;
  try {  // a trainer's own tokenizer setting (sft_trainer's), as the graph spells it
    tok = nlohmann::json::parse(settings.value("tokenizer", std::string("\"\""))).get<std::string>();
    contents = settings.value("tokenizer (contents)", std::string());
  } catch (const nlohmann::json::exception&) {
  }
  if (tok.empty() || !std::filesystem::exists(tok, ec))
    tok = run_data_tokenizer(path, &contents);  // zero_rank's: its data node's, from the record in output_dir
  // a tokenizer edited since the run would write or read the model's ids as other text
  if (!tok.empty() && !contents.empty() && actors::tokenizer_fingerprint(tok) != contents)
    throw std::invalid_argument("the tokenizer the run trained with, " + tok + ", changed since the run (other bytes "
                                "than its record): give that tokenizer as it was with --tokenizer");
  return tok;
}

std::string zero_run_base(const loaded_checkpoint& ck, const std::string& base_given, const std::string& opt) {
  const std::string& folder = ck.folder;
  const std::string recorded = zero_run_model(ck);
  const std::string fingerprint =
      ck.manifests.at(0).extra.value("settings", nlohmann::json::object()).value("model (contents)", std::string());
  std::error_code ec;
  const std::string base = base_given.empty() ? recorded : resolve_user_path(base_given, "model").string();
  if (base.empty()) return "";
  if (!std::filesystem::exists(base, ec))
    throw std::invalid_argument(folder + ": the run's base model " + base +
                                (base_given.empty() ? " is gone: give it with " + opt + " BASE (the same model, moved)"
                                                    : " (" + opt + ") does not exist"));
  if (!fingerprint.empty() && actors::model_fingerprint(base) != fingerprint)
    throw std::invalid_argument(base + " is not the base model " + folder + "'s run started from (other bytes than the run's " +
                                (recorded.empty() ? std::string("model") : recorded) + "): " +
                                (base_given.empty() ? "it changed since the run; give the run's base with " + opt + " BASE"
                                 : !recorded.empty() && std::filesystem::exists(recorded, ec)
                                     ? "give the run's base with " + opt + ", or leave " + opt + " out for " + recorded
                                     : "give the run's base with " + opt));
  return base;
}

namespace {
// A LoRA run's checkpoint: the run's base (or `base_given`) with the recorded adapter merged. The base was
// never sharded (it is frozen: every rank read it whole).
decoder lora_checkpoint_model(const loaded_checkpoint& ck, const std::string& base_given, const std::string& opt,
                              bool merge) {
  const auto& extra = ck.manifests.at(0).extra;
  const std::string& folder = ck.folder;
  if (!extra.contains("lora_config"))  // written before the manifest recorded the adapter's config
    throw std::invalid_argument(folder + " holds only LoRA weights and no record of their config (a checkpoint "
                                "from before flowrun kept it): use the base model and the run's adapter (its "
                                "save_lora folder): --model BASE --lora ADAPTER");
  const lora_config lc = lora_config_from_record(extra.at("lora_config"), folder);
  const std::string base = zero_run_base(ck, base_given, opt);
  if (base.empty())
    throw std::invalid_argument(folder + " holds only LoRA weights and names no base model: give the run's base with " +
                                opt + " BASE");
  decoder model = load_model(base);
  model.enable_lora(lc, /*freeze_base=*/true);
  const tensor adapter = checkpoint_tensor(ck, "adapter", "fp32_master");
  if (!adapter.defined() || adapter.numel() != model.num_adapter_parameters())
    throw std::invalid_argument(fmt::format("{}: the adapter holds {} values, LoRA (r {}, {}) on {} needs {}", folder,
                                            adapter.defined() ? adapter.numel() : 0, lc.lora_r,
                                            fmt::join(lc.target_modules, ","), base, model.num_adapter_parameters()));
  model.w().adapter_flat.copy_from(adapter);
  if (!merge) return model;  // base + adapter, as the run held them
  model.merge_lora();  // W + (alpha / r) B A: one product per Linear
  spdlog::info("{} + the LoRA adapter of {} (step {}; r {}, lora_alpha {}, {}), merged", base, folder, ck.step,
               lc.lora_r, lc.lora_alpha, fmt::join(lc.target_modules, ","));
  decoder merged(model.config());  // the merged weights alone, as save_pretrained of PEFT's merge_and_unload
  merged.w().flat.copy_from(model.w().flat);
  return merged;
}
}  // namespace

decoder zero_checkpoint_model(const loaded_checkpoint& ck, const std::string& base_given, const std::string& base_option) {
  const auto& extra = ck.manifests.at(0).extra;
  if (!extra.contains("model_config"))
    throw std::invalid_argument(ck.folder + ": the manifest records no model (model_config): a checkpoint from before "
                                "flowrun recorded it; the trainer's output, or export_hf of a rerun, holds the model");
  if (extra.value("value_head", false))  // a reward model's or critic's: no language-model format holds v_head
    throw std::invalid_argument(ck.folder + " is a value model's checkpoint (a reward model or critic: it has a "
                                "v_head): its trainer's output folder holds it; this reads language models");
  if (ck.full.count("base") == 0) return lora_checkpoint_model(ck, base_given, base_option, /*merge=*/true);
  decoder model(extra.at("model_config").get<model_config>());
  const tensor full = checkpoint_tensor(ck, "base", "fp32_master");
  if (full.numel() != model.num_parameters())
    throw std::invalid_argument(fmt::format("{}: the checkpoint holds {} parameters, its model_config makes {}",
                                            ck.folder, full.numel(), model.num_parameters()));
  model.w().flat.copy_from(full);
  if (extra.contains("lora_config")) {  // LoRA beside a base that trains too (DS-Chat's lora_dim without
    // only_optimize_lora): the adapter merged, as the trainers' outputs are (DS-Chat's convert_lora_to_linear_layer)
    const lora_config lc = lora_config_from_record(extra.at("lora_config"), ck.folder);
    model.enable_lora(lc, /*freeze_base=*/false);
    const tensor adapter = checkpoint_tensor(ck, "adapter", "fp32_master");
    if (!adapter.defined() || adapter.numel() != model.num_adapter_parameters())
      throw std::invalid_argument(fmt::format("{}: the adapter holds {} values, its lora_config makes {}", ck.folder,
                                              adapter.defined() ? adapter.numel() : 0, model.num_adapter_parameters()));
    model.w().adapter_flat.copy_from(adapter);
    model.merge_lora();
    decoder merged(model.config());  // the merged weights alone, as the trainers save them
    merged.w().flat.copy_from(model.w().flat);
    return merged;
  }
  return model;
}

decoder zero_checkpoint_adapter(const loaded_checkpoint& ck, const std::string& base_given, const std::string& base_option) {
  const auto& extra = ck.manifests.at(0).extra;
  if (!extra.contains("lora_config") || ck.full.count("base") > 0 || extra.value("value_head", false))
    throw std::invalid_argument(ck.folder + " is not a LoRA run's checkpoint (use_lora: the adapter alone, beside a "
                                "frozen base): only such an adapter is a PEFT adapter of its base");
  return lora_checkpoint_model(ck, base_given, base_option, /*merge=*/false);
}

}  // namespace flowrun::cli
