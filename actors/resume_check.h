// A resume whose settings changed (issue 17): a checkpoint records the settings of the node
// that wrote it; resuming compares them with the node's settings now. A change that is safe
// (how often to print or save, where ranks talk, the ZeRO stage, gradient checkpointing, a
// longer run) is logged as a warning; any other change (a learning rate, the data, seq_length,
// the model, LoRA) is refused, naming each setting with its value then and now.
#pragma once

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/actor/node.h"

namespace flowrun::actors {

/// The node's settings as {name: value as written (graph::to_string)}, for a checkpoint.
nlohmann::json settings_record(const graph::node_spec& n);

/// Compare `recorded` (settings_record of the run that wrote `folder`) with the node's settings.
/// Changes of settings in `safe` are logged (warning); any other change throws
/// std::runtime_error: "node 'NAME': resuming from FOLDER with settings changed: lr 1e-4 -> 2e-4;
/// set them back, or start afresh (...)". A missing record (an older checkpoint) is accepted.
void check_resume_settings(actor::node_context& ctx, const nlohmann::json& recorded, const std::string& folder,
                           const std::set<std::string>& safe, const std::string& afresh);

}  // namespace flowrun::actors
