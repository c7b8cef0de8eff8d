#include "actors/resume_check.h"

#include <stdexcept>

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace flowrun::actors {

nlohmann::json settings_record(const graph::node_spec& n, const std::set<std::string>& safe) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : n.settings)  // TensorBoard's settings change nothing trained: never recorded
    if (!safe.count(k) && k != actor::enable_tensorboard_setting && k != actor::tensorboard_path_setting)
      j[k] = graph::to_string(v.value);
  return j;
}

void check_resume_settings(actor::node_context& ctx, const nlohmann::json& recorded, const std::string& folder,
                           const std::set<std::string>& safe, const std::string& afresh) {
  if (!recorded.is_object()) return;
  const nlohmann::json now = settings_record(ctx.spec(), safe);
  std::vector<std::string> refused;
  for (const auto& [k, v] : now.items()) {
    const std::string then = recorded.contains(k) ? recorded[k].get<std::string>() : std::string("(not set)");
    if (then != v.get<std::string>()) refused.push_back(fmt::format("{} {} -> {}", k, then, v.get<std::string>()));
  }
  if (!refused.empty())
    throw std::runtime_error(fmt::format("node '{}': resuming from {} with settings changed: {}; set them back, or {}",
                                         ctx.name(), folder, fmt::join(refused, "; "), afresh));
}

}  // namespace flowrun::actors
