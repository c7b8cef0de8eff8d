#include "actors/resume_check.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/rlhf/ppo_checkpoint.h"
#include "models/safetensors.h"

namespace flowrun::actors {

namespace {

// An absolute path (every path setting is one once the graph is validated) with its symbolic links
// resolved: the same file reached from another working directory, or through another spelling of
// FLOWRUN_ASSETS (../shared/assets from /tmp, where /tmp/shared links to /work/shared), records the
// same. A path whose folders do not exist yet (an output) keeps the part that does not.
std::string same_file_spelling(const std::string& p) {
  if (p.empty() || p.front() != '/') return p;
  std::error_code ec;
  const auto c = std::filesystem::weakly_canonical(p, ec);
  return ec ? p : c.string();
}

graph::setting_value canonical_paths(graph::setting_value v) {
  if (auto* s = std::get_if<std::string>(&v)) *s = same_file_spelling(*s);
  if (auto* l = std::get_if<std::vector<std::string>>(&v))
    for (auto& s : *l) s = same_file_spelling(s);
  return v;
}

// The DeepSpeed JSON sets the optimizer, the batch and the stage, and is edited in place between
// runs: it is recorded with a fingerprint of its bytes, "PATH @fnv1a:HEX", and compared by it
// (the same file copied elsewhere is the same config; an edited one is not).
constexpr std::string_view content_setting = "deepspeed_config";
constexpr std::string_view content_mark = " @fnv1a:";

std::string with_content(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (path.empty() || !f) return path;
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return path + std::string(content_mark) + fmt::format("{:016x}", graph::fnv1a64(bytes));
}

// Two recorded values of one setting agree: by content when both carry a fingerprint, else by
// what is left without it (a record from before fingerprints holds the path alone).
bool same_value(const std::string& then, const std::string& now) {
  const auto a = then.find(content_mark), b = now.find(content_mark);
  if (a != std::string::npos && b != std::string::npos) return then.substr(a) == now.substr(b);
  auto strip = [](const std::string& s, std::size_t at) {  // keeps to_string's closing quote
    return at == std::string::npos ? s : s.substr(0, at) + s.substr(at + content_mark.size() + 16);
  };
  return strip(then, a) == strip(now, b);
}

}  // namespace

nlohmann::json settings_record(const graph::node_spec& n, const std::set<std::string>& safe) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : n.settings) {  // TensorBoard's settings change nothing trained: never recorded
    if (safe.count(k) || k == actor::enable_tensorboard_setting || k == actor::tensorboard_path_setting) continue;
    graph::setting_value value = canonical_paths(v.value);
    if (auto* s = std::get_if<std::string>(&value); s && k == content_setting) *s = with_content(*s);
    j[k] = graph::to_string(value);
  }
  return j;
}

void check_resume_settings(actor::node_context& ctx, const nlohmann::json& recorded, const std::string& folder,
                           const std::set<std::string>& safe, const std::string& afresh) {
  if (!recorded.is_object()) return;
  const nlohmann::json now = settings_record(ctx.spec(), safe);
  std::vector<std::string> refused;
  for (const auto& [k, v] : now.items()) {
    const std::string then = recorded.contains(k) ? recorded[k].get<std::string>() : std::string("(not set)");
    if (!same_value(then, v.get<std::string>()))
      refused.push_back(fmt::format("{} {} -> {}", k, then, v.get<std::string>()));
  }
  if (!refused.empty())
    throw std::runtime_error(fmt::format("node '{}': resuming from {} with settings changed: {}; set them back, or {}",
                                         ctx.name(), folder, fmt::join(refused, "; "), afresh));
}

void check_step3_settings(actor::node_context& ctx, std::set<std::string> safe) {
  if (ctx.checkpoint_dir().empty()) return;
  safe.insert({"restart", "max_restarts"});
  const std::string path = (std::filesystem::path(ctx.checkpoint_dir()) / (ctx.name() + ".settings.json")).string();
  if (!ppo::step3_committed(ctx.checkpoint_dir())) {  // step 3 starts afresh
    if (ctx.replica() != 0) return;  // one writer: replicas of a node would race on the file's temporary
    std::filesystem::create_directories(ctx.checkpoint_dir());
    write_text_atomic(path, settings_record(ctx.spec(), safe).dump(1) + "\n");
    return;
  }
  if (!std::filesystem::exists(path)) return;  // a checkpoint from before the record: accepted
  nlohmann::json recorded;
  try {
    std::ifstream f(path);
    recorded = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + " is not a settings record (" + e.what() + "): delete " + ctx.checkpoint_dir() +
                             " to start step 3 afresh");
  }
  check_resume_settings(ctx, recorded, path, safe, "delete " + ctx.checkpoint_dir() + " to start step 3 afresh");
}

}  // namespace flowrun::actors
