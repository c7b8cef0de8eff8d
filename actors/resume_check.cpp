#include "actors/resume_check.h"

#include "models/rlhf/dschat_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/rank_group.h"
#include "models/adapter.h"
#include "models/checkpoint.h"
#include "models/rlhf/ppo_checkpoint.h"
#include "models/safetensors.h"
#include "models/tokenizer.h"
#include "runtime/util/same_path.h"

namespace flowrun::actors {

namespace {

// An absolute path (every path setting is one once the graph is validated) with its symbolic links
// resolved: the same file reached from another working directory, or through another spelling of
// FLOWRUN_ASSETS (../shared/assets from /tmp, where /tmp/shared links to /work/shared), records the
// same. A path whose folders do not exist yet (an output) keeps the part that does not.
std::string same_file_spelling(const std::string& p) {
  if (p.empty() || p.front() != '/') return p;  // not a path (a model type, a name)
  return same_path_key(p);
}

graph::setting_value canonical_paths(graph::setting_value v) {
  if (auto* s = std::get_if<std::string>(&v)) *s = same_file_spelling(*s);
  if (auto* l = std::get_if<std::vector<std::string>>(&v))
    for (auto& s : *l) s = same_file_spelling(s);
  return v;
}

// Files recorded by their contents beside their path, under "NAME (contents)", and compared by
// them when both records have them (the same file copied elsewhere is the same; one edited in
// place is not): the DeepSpeed JSON, parsed, without the keys a resume may change (printing, the
// schedule's length for a longer run, the ZeRO stage: zero_rank resumes at another), so that a
// change names its keys; a tokenizer file by a fingerprint of its bytes.
constexpr std::string_view contents_suffix = " (contents)";

// FNV-1a of a data file's bytes (graph::fnv1a64's, read in chunks: a pretraining corpus may be
// gigabytes), once per process for a file of the same size and modification time, since a node records
// its settings at every checkpoint.
std::string data_fingerprint(const std::string& path) {
  static std::mutex m;
  static std::map<std::string, std::string> cache;  // "path size mtime" -> fingerprint
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  const auto mtime = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  const std::string key = fmt::format("{} {} {}", path, size, mtime);
  {
    std::lock_guard<std::mutex> lock(m);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  std::ifstream f(path, std::ios::binary);
  std::vector<char> buf(1 << 20);
  std::uint64_t h = graph::fnv1a64_basis;
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h = graph::fnv1a64(std::string_view(buf.data(), static_cast<size_t>(f.gcount())), h);
  }
  std::string fp = fmt::format("fnv1a:{:016x}", h);
  std::lock_guard<std::mutex> lock(m);
  cache[key] = fp;
  return fp;
}

// The regular files directly in folder `dir`, each by its name and data_fingerprint: {"config.json": "fnv1a:...", ...}.
nlohmann::json folder_files(const std::string& dir) {
  std::error_code ec;
  nlohmann::json files = nlohmann::json::object();
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) files[e.path().filename().string()] = data_fingerprint(e.path().string());
  return files;
}

// One fingerprint of `files` (folder_files) but those `keep` leaves out (none when empty): an FNV-1a over each
// one's "name fingerprint", in order.
std::string files_fingerprint(const nlohmann::json& files, const std::set<std::string>& keep = {}) {
  std::vector<std::string> parts;
  for (const auto& [name, fp] : files.items())
    if (keep.empty() || keep.count(name)) parts.push_back(name + " " + fp.get<std::string>());
  std::sort(parts.begin(), parts.end());
  return fmt::format("fnv1a:{:016x}", graph::fnv1a64(fmt::format("{}", fmt::join(parts, "\n"))));
}

// A folder by the files directly in it that `keep` takes (all when empty), as one fingerprint.
std::string folder_fingerprint(const std::string& dir, const std::set<std::string>& keep = {}) {
  return files_fingerprint(folder_files(dir), keep);
}

// The kinds whose `model` is recorded by its contents: DS-Chat's steps 1 and 2 and DPO, whose model file
// may be another step's output, rewritten by a later run, and pretraining's ranks (a LoRA checkpoint holds
// the adapter only: resumed on a replaced base, it trained on another model). Step 3's trainers compare
// the weights they start from themselves (ppo_nodes.cpp, init_weights).
bool records_model_contents(const graph::node_spec& n) {
  return n.kind == "sft_trainer" || n.kind == "rm_trainer" || n.kind == "dpo_trainer" || n.kind == "zero_rank";
}

// The batch triple of a DeepSpeed JSON's contents: where the trainer says so (zero_rank: its data node
// cuts global batches, and it compares the resolved global batch itself), the micro-batch and
// accumulation are only a split of the global batch over the ranks, which a resume may change as it
// may change the ranks, and train_batch_size may be written or resolved
void strip_batch_triple(nlohmann::json& j) {
  for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) j.erase(k);
}

// A setting's value as a resume compares it (settings_record's spelling: graph::to_string): lora_target_modules
// as a set, since PEFT matches each name and the order and spaces of the list mean nothing ("v_proj, q_proj"
// is "q_proj,v_proj"); every other setting as written.
std::string compared_value(const std::string& key, const std::string& written) {
  if (key != "lora_target_modules") return written;
  try {  // the one reading of the setting (make_lora_config's), as a set
    const auto modules =
        make_lora_config(1, 1.0f, 0.0f, nlohmann::json::parse(written).get<std::string>(), 0).target_modules;
    return fmt::format("{}", fmt::join(std::set<std::string>(modules.begin(), modules.end()), ","));
  } catch (const std::exception&) {  // not a list of modules: as written
    return written;
  }
}

nlohmann::json contents_of(std::string_view key, const std::string& path, bool batch_split_safe = false) {
  std::error_code ec;
  // a tokenizer folder (an HF model's, or one holding tokenizer.json): the files a tokenizer is read from, by
  // name and bytes (the folder's path alone let a resume go on with another tokenizer copied into it)
  if (key == "tokenizer" && !path.empty() && std::filesystem::is_directory(path, ec)) {
    static const std::set<std::string> names(tokenizer_file_names().begin(), tokenizer_file_names().end());
    return folder_fingerprint(path, names);
  }
  // a LoRA adapter folder to continue from (zero_rank's lora_pretrained): its config and weights by their bytes, so
  // the same adapter moved elsewhere resumes (its path alone refused the move; the checkpoint holds the trained
  // adapter, and the folder gives its start and config)
  if (key == "lora_pretrained" && !path.empty() && std::filesystem::is_directory(path, ec))
    return folder_fingerprint(path, {"adapter_config.json", "adapter_model.safetensors"});
  if (path.empty() || !std::filesystem::is_regular_file(path, ec)) return nullptr;
  // the training data: a file edited in place between a run and its resume would train on other rows
  // (or the same rows in another order) from the resumed position on
  if (key == "data" || key == "unsup_data") return data_fingerprint(path);
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (key == "deepspeed_config") {
    auto j = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return fmt::format("fnv1a:{:016x}", graph::fnv1a64(bytes));
    for (const char* safe : {"/steps_per_print", "/wall_clock_breakdown", "/scheduler/params/total_num_steps",
                             "/zero_optimization/stage", "/tensorboard", "/flops_profiler", "/comms_logger",
                             "/csv_monitor", "/wandb"}) {
      const nlohmann::json::json_pointer p(safe);
      if (j.contains(p)) j.at(p.parent_pointer()).erase(p.back());
    }
    if (batch_split_safe) strip_batch_triple(j);
    return j;
  }
  if (key == "tokenizer") return fmt::format("fnv1a:{:016x}", graph::fnv1a64(bytes));
  return nullptr;
}

}  // namespace

nlohmann::json model_contents(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) ? nlohmann::json(data_fingerprint(path)) : folder_files(path);
}

std::vector<std::string> model_contents_changes(const nlohmann::json& then, const nlohmann::json& now) {
  if (then.is_object() && now.is_object()) {  // two folders: the files a model is read from, by name
    std::vector<std::string> changes;
    for (const auto& [name, fp] : now.items())
      if (is_model_file(name) && (!then.contains(name) || then[name] != fp))
        changes.push_back(name + (then.contains(name) ? " changed" : " added"));
    for (const auto& [name, fp] : then.items())
      if (is_model_file(name) && !now.contains(name)) changes.push_back(name + " gone");
    return changes;
  }
  // a record from before the files were named: one fingerprint over every file of the folder
  if (then.is_string() && now.is_object()) return files_fingerprint(now) == then ? std::vector<std::string>{}
                                                                                    : std::vector<std::string>{"other bytes"};
  return then == now ? std::vector<std::string>{} : std::vector<std::string>{"other bytes"};
}

std::string tokenizer_fingerprint(const std::string& path) {
  const nlohmann::json c = contents_of("tokenizer", path);
  return c.is_string() ? c.get<std::string>() : std::string();
}

nlohmann::json settings_record(const graph::node_spec& n, const std::set<std::string>& safe) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : n.settings) {  // TensorBoard's and supervision's settings change nothing trained: never recorded
    if (safe.count(k) || k == actor::enable_tensorboard_setting || k == actor::tensorboard_path_setting ||
        k == actor::restart_setting || k == actor::max_restarts_setting || rank_group_setting_names().count(k))
      continue;
    const graph::setting_value value = canonical_paths(v.value);
    j[k] = graph::to_string(value);
    if (const auto* path = std::get_if<std::string>(&value))
      if (auto c = contents_of(k, *path, safe.count(std::string(ds_batch_split_safe)) > 0); !c.is_null())
        j[k + std::string(contents_suffix)] = std::move(c);
    // (a model is never trained in place: an output at the model's path is refused when the graph is checked)
    if (const auto* path = std::get_if<std::string>(&value); path && k == "model" && records_model_contents(n)) {
      std::error_code ec;
      if (!path->empty() && std::filesystem::exists(*path, ec))
        j[k + std::string(contents_suffix)] = model_contents(*path);
    }
    if (const auto* paths = std::get_if<std::vector<std::string>>(&value); paths && k == "mix_data") {
      nlohmann::json all = nlohmann::json::array();  // each blended file by its contents, in order
      for (const auto& p : *paths) all.push_back(contents_of("data", p));
      if (!paths->empty()) j[k + std::string(contents_suffix)] = std::move(all);
    }
  }
  if (n.find_setting("data_split") && !safe.count("data_split")) j["data_split_order"] = dschat::split_order;
  return j;
}

nlohmann::json with_newer_defaults(nlohmann::json recorded, const nlohmann::json& now, const graph::node_spec& n) {
  if (!recorded.is_object()) return recorded;
  for (const auto& [k, v] : now.items())
    if (!recorded.contains(k))
      if (const auto* w = n.find_setting(k); w && w->from_default) recorded[k] = v;
  return recorded;
}

std::vector<std::string> settings_changes(const nlohmann::json& recorded, const nlohmann::json& now) {
  std::vector<std::string> refused;
  if (!recorded.is_object()) return refused;
  for (const auto& [k, v] : now.items()) {
    if (const auto at = k.rfind(contents_suffix); at != std::string::npos && at + contents_suffix.size() == k.size()) {
      if (!recorded.contains(k) || recorded[k] == v) continue;  // no contents then: the path decides
      const std::string name = k.substr(0, at);
      const nlohmann::json& then = recorded[k];
      const auto path = [&](const nlohmann::json& r) {
        return r.contains(name) && r[name].is_string() ? r[name].get<std::string>() : std::string();
      };
      if (name == "model") {  // a model file, or a folder's model files by name (a README added is no change)
        const auto changed = model_contents_changes(then, v);
        if (changed.empty()) continue;
        const std::string from = path(recorded), to = path(now), what = fmt::format("{}", fmt::join(changed, ", "));
        refused.push_back(from == to || from.empty()
                              ? (what == "other bytes" ? fmt::format("model: the bytes of {} changed", to)
                                                       : fmt::format("model: {} changed ({})", to, what))
                              : fmt::format("model {} -> {} ({})", from, to, what));
        continue;
      }
      if (!then.is_object() || !v.is_object()) {
        // the file by its path then and now: another file elsewhere, or the same path with other bytes
        const std::string from = path(recorded), to = path(now);
        refused.push_back(from == to || from.empty() ? fmt::format("{}: the bytes of {} changed", name, to)
                                                     : fmt::format("{} {} -> {} (other bytes)", name, from, to));
        continue;
      }
      const auto a = then.flatten(), b = v.flatten();  // the DeepSpeed JSON: name the keys that differ
      for (const auto& [key, val] : b.items())
        if (!a.contains(key) || a[key] != val)
          refused.push_back(fmt::format("{} {} {} -> {}", name, key, a.contains(key) ? a[key].dump() : "(not set)",
                                        val.dump()));
      for (const auto& [key, val] : a.items())
        if (!b.contains(key)) refused.push_back(fmt::format("{} {} {} -> (not set)", name, key, val.dump()));
      continue;
    }
    const std::string c = k + std::string(contents_suffix);
    if (recorded.contains(c) && now.contains(c)) continue;  // compared by contents: the same file elsewhere is fine
    const std::string then = recorded.contains(k) ? recorded[k].get<std::string>() : std::string("(not set)");
    if (compared_value(k, then) != compared_value(k, v.get<std::string>()))
      refused.push_back(fmt::format("{} {} -> {}", k, then, v.get<std::string>()));
  }
  return refused;
}

void check_resume_settings(actor::node_context& ctx, const nlohmann::json& recorded, const std::string& folder,
                           const std::set<std::string>& safe, const std::string& afresh) {
  nlohmann::json then = recorded;  // a record written before the triple was left out: compared alike
  const std::string ds = "deepspeed_config" + std::string(contents_suffix);
  if (safe.count(std::string(ds_batch_split_safe)) && then.is_object() && then.contains(ds) && then[ds].is_object())
    strip_batch_triple(then[ds]);
  const nlohmann::json now = settings_record(ctx.spec(), safe);
  const auto refused = settings_changes(with_newer_defaults(then, now, ctx.spec()), now);
  if (!refused.empty())
    throw std::runtime_error(fmt::format("node '{}': resuming from {} with settings changed: {}; set them back, or {}",
                                         ctx.name(), folder, fmt::join(refused, "; "), afresh));
}

void check_step3_settings(actor::node_context& ctx, std::set<std::string> safe) {
  if (ctx.checkpoint_dir().empty()) return;
  const std::string path = (std::filesystem::path(ctx.checkpoint_dir()) / (ctx.name() + ".settings.json")).string();
  const bool resuming = ppo::step3_committed(ctx.checkpoint_dir());
  // step 3 starts afresh, or resumes a checkpoint from before the records (accepted, and recorded from now)
  if (!resuming || !std::filesystem::exists(path)) {
    if (ctx.replica() != 0) return;  // one writer: replicas of a node would race on the file's temporary
    std::filesystem::create_directories(ctx.checkpoint_dir());
    nlohmann::json record = settings_record(ctx.spec(), safe);
    record[std::string(node_seed_key)] = std::to_string(ctx.seed());  // replica 0's: [graph] seed's share
    write_text_atomic(path, record.dump(1) + "\n");
    if (resuming)
      ctx.log().info("{} holds no record of this node's settings (a checkpoint from before records): the settings "
                     "of this run are recorded now, and later resumes compare with them",
                     ctx.checkpoint_dir());
    return;
  }
  nlohmann::json recorded;
  try {
    std::ifstream f(path);
    recorded = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + " is not a settings record (" + e.what() + "): delete " + ctx.checkpoint_dir() +
                             " to start step 3 afresh");
  }
  // the node's seed (the generator samples with it) comes from [graph] seed: a resume with another one went on
  // as neither run would (replica 0 compares: the others' seeds differ from its own by design)
  if (const auto it = recorded.find(node_seed_key); it != recorded.end()) {
    if (ctx.replica() == 0 && it->is_string() && it->get<std::string>() != std::to_string(ctx.seed()))
      throw std::runtime_error("node '" + ctx.name() + "': resuming from " + path + " with [graph] seed changed (this "
                               "node's seed " + it->get<std::string>() + " -> " + std::to_string(ctx.seed()) +
                               "): set the graph's seed back, or delete " + ctx.checkpoint_dir() +
                               " to start step 3 afresh");
    recorded.erase(it);
  }
  check_resume_settings(ctx, recorded, path, safe, "delete " + ctx.checkpoint_dir() + " to start step 3 afresh");
}

}  // namespace flowrun::actors
