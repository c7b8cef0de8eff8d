// A zero_engine's optimizer state as shard-checkpoint groups (shard_checkpoint.h), and back:
// the one way every trainer saves and restores it (sft_trainer and rm_trainer, the PPO policy
// and critic, zero_rank). Each node adds its own state around it (data position, RNG, EMA).
//
// Groups written:
//   "base"    this rank's share of the base model (owned_ranges of the flat buffer):
//             fp32_master, exp_avg, exp_avg_sq; only when the base trains (not LoRA-only)
//   "adapter" the LoRA adapters and value head that train beside a frozen base (replicated:
//             rank 0 writes them), the same three tensors
// Manifest fields: zero_stage, extra.optimizer_steps (fewer than the updates when fp16 skipped
// some), and with an fp16 loss scaler its scale, good steps and extra.loss_scale_hysteresis_left;
// the model the groups hold: extra.model_config, extra.lora_config (lora_config_record, with LoRA)
// and extra.value_head (tools/flowrun/zero_source.h rebuilds the model from them).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "models/train/shard_checkpoint.h"
#include "models/train/zero.h"

namespace flowrun {

/// The groups holding `eng`'s state on rank `rank`; fills `m`'s optimizer fields (see above).
std::vector<shard_group> engine_state_groups(const zero_engine& eng, const decoder& model, int rank,
                                             shard_manifest& m);

/// Restores what engine_state_groups saved, from `ck` (load_checkpoint reassembles the full
/// buffers, so any world size and stage re-slice them). A missing optimizer_steps counts as the
/// manifest's step.
void restore_engine_state(zero_engine& eng, const loaded_checkpoint& ck);

/// The config_hash of a DS-Chat trainer's checkpoint (steps 1-3): the model's config with its
/// LoRA, value head and whether the base trains, so a resume onto another model is refused.
std::string trainer_config_hash(const decoder& model);

/// A fingerprint of `model`'s weights as they are now (the base parameters and the value head;
/// not LoRA): bytes_fingerprint (16 hex digits, FNV-1a 64) of the element count and at most 2^20
/// elements read at an even stride (so a 7 B model costs a copy only when it is not on the CPU).
/// Step 3 records its initial models' fingerprints in its checkpoints and refuses a resume onto
/// different initial weights (step 1 or 2 retrained since, or another file), which no setting shows.
std::string weights_fingerprint(const decoder& model);

/// The reassembled tensor `group`.`name` of `ck` (e.g. "base", "ema"); undefined when absent.
tensor checkpoint_tensor(const loaded_checkpoint& ck, std::string_view group, std::string_view name);

}  // namespace flowrun
