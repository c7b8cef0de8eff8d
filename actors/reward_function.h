// The `reward_function` node kind: rule-based rewards for step-3 rollouts (actors/reward_function.cpp).
#pragma once

#include "runtime/actor/node.h"
#include "runtime/graph/node_kind.h"

namespace flowrun::actors {

/// Registers the `reward_function` kind. Throws std::invalid_argument if the name is taken.
void register_reward_function(graph::node_kind_registry& kinds, actor::node_factory_registry& factories);

}  // namespace flowrun::actors
