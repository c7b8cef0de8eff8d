#include "tools/flowrun/zero_source.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
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
  if (!fs::exists(path, ec)) {
    // a DS-Chat step that finished removed its checkpoints: its done marker names the model it saved
    const fs::path p = fs::path(path).lexically_normal();
    const fs::path marker = p.parent_path() / (p.filename().string() + ".done.json");
    std::string output;
    try {
      if (fs::exists(marker, ec)) output = nlohmann::json::parse(std::ifstream(marker)).value("output", std::string());
    } catch (const std::exception&) {
    }
    if (!output.empty())
      throw std::invalid_argument(option + " " + path + ": that step finished (" + marker.string() + ") and its "
                                  "checkpoints were removed: its model is its output, " + output);
    throw std::invalid_argument(option + " " + path + ": no such folder (zero_rank's output_dir, a trainer's "
                                "CHECKPOINT_DIR/NODE, or one of their step_NNNNNNNN folders)");
  }
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
  // (the resume's note says which folder a resume would take: this command takes none)
  const std::string why = fs::exists(fs::path(path) / "latest", ec)
                              ? "its 'latest' names a step folder that is gone, damaged or malformed, so no step is "
                                "committed for certain"
                              : std::string("no committed checkpoint there (no 'latest' file)");
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
  const nlohmann::json contents =
      ck.manifests.at(0).extra.value("settings", nlohmann::json::object()).value("model (contents)", nlohmann::json());
  std::error_code ec;
  const std::string base = base_given.empty() ? recorded : resolve_user_path(base_given, "model").string();
  if (base.empty()) return "";
  if (!std::filesystem::exists(base, ec))
    throw std::invalid_argument(folder + ": the run's base model " + base +
                                (base_given.empty() ? " is gone: give it with " + opt + " BASE (the same model, moved)"
                                                    : " (" + opt + ") does not exist"));
  if (const auto changed = contents.is_null() ? std::vector<std::string>{}
                                              : actors::model_contents_changes(contents, actors::model_contents(base));
      !changed.empty())
    throw std::invalid_argument(base + " is not the base model " + folder + "'s run started from (" +
                                (changed == std::vector<std::string>{"other bytes"}
                                     ? std::string("other bytes than")
                                     : fmt::format("{}, against", fmt::join(changed, ", "))) + " the run's " +
                                (recorded.empty() ? std::string("model") : recorded) + "): " +
                                (base_given.empty() ? "it changed since the run; give the run's base with " + opt + " BASE"
                                 : !recorded.empty() && std::filesystem::exists(recorded, ec)
                                     ? "give the run's base with " + opt + ", or leave " + opt + " out for " + recorded
                                     : "give the run's base with " + opt));
  return base;
}

namespace {
// The checkpoint's adapter (its lora_config, its "adapter" group) put into `model`, a model of its config.
void put_recorded_adapter(decoder& model, const loaded_checkpoint& ck, bool freeze_base) {
  const lora_config lc = lora_config_from_record(ck.manifests.at(0).extra.at("lora_config"), ck.folder);
  model.enable_lora(lc, freeze_base);
  const tensor adapter = checkpoint_tensor(ck, "adapter", "fp32_master");
  if (!adapter.defined() || adapter.numel() != model.num_adapter_parameters())
    throw std::invalid_argument(fmt::format("{}: the adapter holds {} values, LoRA (r {}, {}) on {} needs {}", ck.folder,
                                            adapter.defined() ? adapter.numel() : 0, lc.lora_r,
                                            fmt::join(lc.target_modules, ","), model.config().summary(),
                                            model.num_adapter_parameters()));
  model.w().adapter_flat.copy_from(adapter);
}

// A LoRA run's checkpoint: the run's base (or `base_given`) with the recorded adapter merged. The base was
// never sharded (it is frozen: every rank read it whole).
decoder lora_checkpoint_model(const loaded_checkpoint& ck, const std::string& base_given, const std::string& opt) {
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
                                opt + " BASE (step 3's policy: the step-1 model it started from, the output "
                                "CHECKPOINT_DIR/sft.done.json names)");
  decoder model = load_model(base);
  // step 3's trainers record the weights they started from (init_weights), not their model's path: a wrong base
  // (the pretrained model instead of step 1's) merged without a word
  if (const std::string was = extra.value("init_weights", std::string());
      !was.empty() && weights_fingerprint(model) != was)
    throw std::invalid_argument(base + " is not the model " + folder + "'s run started from (its weights differ from "
                                "the run's init_weights record): give that model with " + opt +
                                " BASE (step 3's policy: the step-1 output CHECKPOINT_DIR/sft.done.json names)");
  put_recorded_adapter(model, ck, /*freeze_base=*/true);
  spdlog::info("{} + the LoRA adapter of {} (step {}; r {}, lora_alpha {}, {}), merged", base, folder, ck.step,
               lc.lora_r, lc.lora_alpha, fmt::join(lc.target_modules, ","));
  return merged_copy(model);  // the merged weights alone, as the trainers save them
}
}  // namespace

decoder zero_checkpoint_model(const loaded_checkpoint& ck, const std::string& base_given, const std::string& base_option) {
  const auto& extra = ck.manifests.at(0).extra;
  if (!extra.contains("model_config"))
    throw std::invalid_argument(ck.folder + ": the manifest records no model (model_config): a checkpoint from before "
                                "flowrun recorded it; the trainer's output, or export_hf of a rerun, holds the model");
  if (extra.value("value_head", false))  // a reward model's or critic's: no language-model format holds v_head
    throw std::invalid_argument(ck.folder + " is a value model's checkpoint (a reward model or critic: it has a "
                                "v_head), which no language-model format holds: its trainer's output folder holds it "
                                "when the step finishes (a stopped run: the same command resumes it to its end)");
  if (ck.full.count("base") == 0) return lora_checkpoint_model(ck, base_given, base_option);
  decoder model(extra.at("model_config").get<model_config>());
  const tensor full = checkpoint_tensor(ck, "base", "fp32_master");
  if (full.numel() != model.num_parameters())
    throw std::invalid_argument(fmt::format("{}: the checkpoint holds {} parameters, its model_config makes {}",
                                            ck.folder, full.numel(), model.num_parameters()));
  model.w().flat.copy_from(full);
  if (extra.contains("lora_config")) {  // LoRA beside a base that trains too (DS-Chat's lora_dim without
    // only_optimize_lora): the adapter merged, as the trainers' outputs are (DS-Chat's convert_lora_to_linear_layer)
    put_recorded_adapter(model, ck, /*freeze_base=*/false);
    return merged_copy(model);  // the merged weights alone, as the trainers save them
  }
  return model;
}

decoder zero_checkpoint_adapter(const loaded_checkpoint& ck) {
  const auto& extra = ck.manifests.at(0).extra;
  if (!extra.contains("lora_config") || !extra.contains("model_config"))
    throw std::invalid_argument(ck.folder + " holds no LoRA adapter: --to hf or llama2c writes its model");
  if (ck.full.count("base") > 0)
    throw std::invalid_argument(ck.folder + " trained its base beside the adapter (DS-Chat's lora_dim without "
                                "only_optimize_lora), so the adapter alone is not the model: --to hf or llama2c writes "
                                "it merged (only_optimize_lora = true, or zero_rank's use_lora, train the adapter alone)");
  if (extra.value("value_head", false))
    throw std::invalid_argument(ck.folder + " is a value model's checkpoint (a v_head beside the adapter): its trainer's "
                                "output folder holds it when the step finishes");
  // the adapter's layout follows the model's config alone: no base weight is read
  decoder model(extra.at("model_config").get<model_config>());
  put_recorded_adapter(model, ck, /*freeze_base=*/true);
  return model;
}

}  // namespace flowrun::cli
