// Layer 6, node kinds: registering the runnable kinds of this program.
//
// Each kind is registered twice, as the runtime needs: its declaration
// (ports, settings) in a graph::node_kind_registry, which the validator and
// `flowrun kinds` / `flowrun explain` read, and its implementation in an
// actor::node_factory_registry, which the runtime uses to make the nodes.
// Every kind gets the runtime's supervision settings (restart, max_restarts).
#pragma once

#include "runtime/actor/node.h"
#include "runtime/graph/node_kind.h"

namespace flowrun::actors {

/// Registers the example pipeline's kinds (graphs/examples/generate.graph):
///   text_source  lines of a text file (blank lines skipped)      -> "text"
///   tokenizer    "text" -> "tokens" with a SentencePiece model
///   generator    "tokens" -> "text": batched generation with a llama2.c model
///   sink         "text" -> standard output or a file
/// Their declarations are the graph layer's (graph::register_example_kinds)
/// plus the supervision settings and, for generator, `batch_size` and
/// `include_prompt`. Throws std::invalid_argument if a name is taken.
void register_example_nodes(graph::node_kind_registry& kinds, actor::node_factory_registry& factories);

/// Registers every kind this program can run (today: the example kinds).
/// DS-Chat's three steps (actors/dschat_trainers.cpp, actors/ppo_nodes.cpp): sft_trainer, rm_trainer, dpo_trainer, prompt_loader,
/// ppo_controller, rollout_generator, reference_model, reward_model, critic, policy, experience_maker.
void register_rlhf_nodes(graph::node_kind_registry& kinds, actor::node_factory_registry& factories);

/// Registers the byte codecs (runtime/actor/payload_codec.h) of step 3's small message types
/// (actors/rlhf_codecs.cpp): "tick", "prompt_batch" (integer tensors only), "stats", "summary".
/// Called by register_rlhf_nodes.
void register_rlhf_codecs();
/// DS-Chat's steps 1-2 (actors/dschat_trainers.cpp; with the DPO step, actors/dpo_trainer.cpp)
/// and step 3 (actors/ppo_nodes.cpp).
void register_dschat_trainers(graph::node_kind_registry& kinds, actor::node_factory_registry& factories);
void register_dpo_trainer(graph::node_kind_registry& kinds, actor::node_factory_registry& factories);
void register_ppo_nodes(graph::node_kind_registry& kinds, actor::node_factory_registry& factories);

/// Registers pretraining with ZeRO (actors/zero_nodes.cpp): lm_batches, zero_rank.
void register_zero_nodes(graph::node_kind_registry& kinds, actor::node_factory_registry& factories);

void register_builtin_nodes(graph::node_kind_registry& kinds, actor::node_factory_registry& factories);

/// The node implementations, for tests and for programs that register them under other names.
std::unique_ptr<actor::node> make_text_source();
std::unique_ptr<actor::node> make_tokenizer();
std::unique_ptr<actor::node> make_generator();
std::unique_ptr<actor::node> make_sink();

}  // namespace flowrun::actors
