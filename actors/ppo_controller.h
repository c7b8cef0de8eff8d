// Layer 6: DeepSpeed-Chat's step-3 loop (step3 main.py; veRL's RayPPOTrainer.fit) as the
// `ppo_controller` node kind (docs/rlhf.md). One PPO iteration is four phases, run in order
// for every prompt batch the loader sends:
//
//   phase                what runs (elsewhere in the graph)               the phase ends when
//   wait_prompts         the prompt loader reads the next batch             a prompt batch arrives
//   generate_experience  generate, score x4, rewards and GAE               the experience maker's summary
//                        (DS-Chat's trainer.generate_experience)            arrives
//   train                the policy's and the critic's PPO update           both trainers' stats arrive
//                        (DS-Chat's trainer.train_rlhf)
//   report               the controller prints, signals and commits the     at once: it asks for the next
//                        checkpoint (DS-Chat's print_throughput_step3, save)  batch (`next`)
//
// A batch whose summary says it does not train (held-out, dropped, or kept for the next
// update with generation_batches > 1) goes from generate_experience to report.
//
// Ports: in `prompts` (prompt_batch), `summary` (summary), `actor_stats`, `critic_stats`
// (stats); out `generate` (prompt_batch, stamped with policy_version and checkpoint), `next`
// (tick: the iteration just reported). Settings: save_checkpoint_steps, keep_checkpoints,
// max_staleness and staleness_policy.
//
// max_staleness = S >= 1 (docs/rlhf.md "Asynchronous RLHF") overlaps the phases of successive
// batches: the next batch is asked for (`next`, naming the batch whose experience was just made)
// as soon as a batch's summary arrives, while at most S + 1 batches are between generation and
// the end of their training; the phases above then describe the oldest batch in flight, and
// reports stay in order. Each batch is stamped with max_staleness and staleness_policy too;
// the trainers' stats say which iteration they trained (the last of their experience batch),
// its staleness, whether they updated (drop: a batch staler than S is not trained) and the
// policy's version after it. Held-out batches are generated when nothing else is in flight.
// More signals: staleness (per trained batch), stale_dropped and stale_waited (running counts).
//
// What it reports: each iteration's line on standard output (formats in docs/rlhf.md),
// the console signals reward, kl, generation_tokens_per_s (training batches),
// actor_loss, critic_loss, training_tokens_per_s (updates), and the phase durations in
// seconds as signals phase_seconds/generate (the generator's own time),
// phase_seconds/score_and_experience (the rest of generate_experience), phase_seconds/train
// and phase_seconds/report, and what the generator and the policy waited per update:
// wait_seconds/generate and wait_seconds/train (the interval since the last trained batch's
// report less the generator's, the policy's own seconds on the batch); ctx.phase() names the
// phase it is in.
#pragma once

#include "runtime/actor/node.h"
#include "runtime/graph/node_kind.h"

namespace flowrun::actors {

/// Registers the `ppo_controller` kind. Throws std::invalid_argument if the name is taken.
void register_ppo_controller(graph::node_kind_registry& kinds, actor::node_factory_registry& factories);

}  // namespace flowrun::actors
