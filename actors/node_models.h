// The one way a node loads a model file or folder (issue 17: "every model a node loads is
// logged with its path and modification time"), so that a run's log says which file each
// step read — e.g. that step 3 read the reward model step 2 just wrote.
#pragma once

#include <string>

#include "models/decoder.h"
#include "runtime/actor/node.h"

namespace flowrun::actors {

/// load_model(path) (models/checkpoint.h: llama2.c, flowrun or HF), after an info line on the
/// node's log: "loading model PATH (modified 2026-12-01 17:12:03 UTC)"; for a folder the time
/// is its newest file's. Throws what load_model throws.
decoder load_node_model(actor::node_context& ctx, const std::string& path);

/// "PATH (modified YYYY-MM-DD HH:MM:SS UTC)", the newest file's time for a folder; "PATH" if unreadable.
std::string describe_model_file(const std::string& path);

}  // namespace flowrun::actors
