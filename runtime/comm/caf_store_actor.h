// The CAF store's key-value actor inside an actor system the caller already
// runs (layer 2; includes CAF: for runtime/actor/cluster.cpp, not for kernels
// or node code). A cluster run spawns it on main and hands its handle to every
// node over the run's own authenticated (and, when configured, TLS) CAF
// connections: the bulk plane and nodes that form communicator groups
// (node_context::rendezvous_store) rendezvous through it, with no second actor
// system, port or connection. Protocol and semantics: caf_store.h.
#pragma once

#include <chrono>
#include <memory>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "runtime/comm/store.h"

namespace flowrun::comm {

/// Spawns the key-value actor in `sys` (not published). Stop it with an exit
/// message when the run ends.
caf::actor spawn_kv_store(caf::actor_system& sys);

/// A store whose records live in the actor `kv` (spawn_kv_store, possibly in
/// another process reached through `sys`'s middleman). Each call is one
/// request from a scoped actor of `sys`: set/contains/erase wait at most
/// `op_timeout`, get waits its own timeout for the key; failures throw
/// std::runtime_error naming the op and the key. `sys` must outlive the store.
/// Throws std::invalid_argument for a null `kv`.
std::shared_ptr<store> actor_store(caf::actor_system& sys, caf::actor kv,
                                   std::chrono::milliseconds op_timeout = std::chrono::seconds(60));

}  // namespace flowrun::comm
