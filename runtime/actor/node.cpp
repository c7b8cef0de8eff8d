#include "runtime/actor/node.h"

#include <filesystem>

#include <stdexcept>

namespace flowrun::actor {

std::string_view to_string(stop_reason r) {
  switch (r) {
    case stop_reason::running: return "running";
    case stop_reason::completed: return "completed";
    case stop_reason::interrupted: return "interrupted";
    case stop_reason::failed: return "failed";
  }
  return "?";
}

std::optional<restart_policy::mode> parse_restart_mode(std::string_view s) {
  if (s == "never") return restart_policy::mode::never;
  if (s == "on-failure" || s == "on_failure") return restart_policy::mode::on_failure;
  return std::nullopt;
}

void node_factory_registry::add(std::string kind, node_factory factory) {
  if (!factory) throw std::invalid_argument("node_factory_registry: empty factory for kind '" + kind + "'");
  if (factories_.count(kind)) throw std::invalid_argument("node_factory_registry: kind '" + kind + "' has a factory already");
  factories_.emplace(std::move(kind), std::move(factory));
}

const node_factory* node_factory_registry::find(std::string_view kind) const {
  auto it = factories_.find(kind);
  return it == factories_.end() ? nullptr : &it->second;
}

std::vector<std::string> node_factory_registry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : factories_) out.push_back(name);
  return out;
}

graph::node_kind with_supervision_settings(graph::node_kind kind) {
  using T = graph::setting_type;
  if (!kind.find_setting(restart_setting))
    kind.option(std::string(restart_setting), T::string, std::string("never"),
                "supervision: \"never\" (a failure stops the run) or \"on-failure\" (restart the replica "
                "with a fresh object and retry the failed call)");
  if (!kind.find_setting(max_restarts_setting))
    kind.option(std::string(max_restarts_setting), T::int_, std::int64_t{3},
                "supervision: restarts allowed per replica with restart = \"on-failure\"")
        .at_least(0);
  return kind;
}

graph::node_kind& add_tensorboard_settings(graph::node_kind& kind) {
  using T = graph::setting_type;
  kind.option(std::string(enable_tensorboard_setting), T::bool_, false,
              "write the node's training signals (loss, lr, reward, KL, tokens/s, phase times) as TensorBoard "
              "event files into tensorboard_path/NODE (DeepSpeed-Chat's --enable_tensorboard)")
      .option(std::string(tensorboard_path_setting), T::output, std::string(""),
              "the folder of the event files when enable_tensorboard is set (DeepSpeed-Chat's --tensorboard_path); "
              "`tensorboard --logdir` on it shows one run per node");
  return kind;
}

namespace {

// The kind's own check, then: enable_tensorboard = true needs a tensorboard_path.
void add_tensorboard_check(graph::node_kind& kind) {
  kind.check = [own = std::move(kind.check)](const graph::node_spec& n, const graph::graph_spec& g) {
    std::vector<graph::node_kind::problem> problems;
    if (own) problems = own(n, g);
    const auto* on = n.find_setting(enable_tensorboard_setting);
    if (!on || !std::get_if<bool>(&on->value) || !std::get<bool>(on->value)) return problems;
    const auto* p = n.find_setting(tensorboard_path_setting);
    const auto* dir = p ? std::get_if<std::string>(&p->value) : nullptr;
    if (!dir || dir->empty())
      problems.push_back({std::string(enable_tensorboard_setting),
                          "node '" + n.name + "': enable_tensorboard = true needs tensorboard_path = \"FOLDER\" (where "
                          "the event files go; each node writes into FOLDER/" + n.name + ")",
                          "set tensorboard_path = \"FOLDER\", or enable_tensorboard = false"});
    // a path that is a file (or whose node folder is one): caught here, exit 2, not at start after the graph began
    std::error_code ec;
    if (dir && !dir->empty())
      for (const std::filesystem::path& f : {std::filesystem::path(*dir), std::filesystem::path(*dir) / n.name})
        if (std::filesystem::exists(f, ec) && !std::filesystem::is_directory(f, ec)) {
          problems.push_back({std::string(tensorboard_path_setting),
                              "node '" + n.name + "': tensorboard_path = \"" + *dir + "\": " + f.string() +
                                  " is a file, not a folder (the event files go into " +
                                  (std::filesystem::path(*dir) / n.name).string() + "/)",
                              "give tensorboard_path a folder, or a path that does not exist yet"});
          break;
        }
    return problems;
  };
}

}  // namespace

void register_node_kind(graph::node_kind_registry& kinds, node_factory_registry& factories, graph::node_kind kind,
                        node_factory factory) {
  std::string name = kind.name;
  if (kind.find_setting(enable_tensorboard_setting)) add_tensorboard_check(kind);
  if (factories.find(name)) throw std::invalid_argument("node_factory_registry: kind '" + name + "' has a factory already");
  kinds.register_kind(with_supervision_settings(std::move(kind)));
  factories.add(std::move(name), std::move(factory));
}

}  // namespace flowrun::actor
