// The one learning-rate schedule of every trainer (issue 16): the names of
// transformers.get_scheduler, used by DeepSpeed-Chat's steps 1-3, and the
// names of DeepSpeed's "scheduler" section, used by pretraining's DeepSpeed
// JSON (models/train/ds_config.h fills an lr_schedule from it).
//
// Sources:
//   transformers/optimization.py (get_scheduler): get_constant_schedule,
//     get_constant_schedule_with_warmup, get_linear_schedule_with_warmup,
//     get_cosine_schedule_with_warmup (num_cycles 0.5); a LambdaLR whose
//     update k (0-based) runs at base_lr · lr_lambda(k).
//   deepspeed/runtime/lr_schedules.py (DeepSpeed 0.19.8): WarmupLR,
//     WarmupDecayLR, WarmupCosineLR; deepspeed/runtime/engine.py steps the
//     schedule once after every applied update.
//
// Step convention, for every type: lr_at(step, base_lr) is the learning rate
// of the optimizer update that follows `step` applied (non-skipped) updates,
// i.e. of update number `step` counted from 0. For the transformers types that
// is base_lr · lr_lambda(step). For DeepSpeed's types it is get_lr() at
// last_batch_iteration = step - 1 (DeepSpeedEngine builds the schedule with
// last_batch_iteration = -1, which already writes get_lr() into the optimizer,
// and calls scheduler.step() after each applied update). Consequences:
//   - WarmupLR / WarmupDecayLR run their first two updates at warmup_min_lr,
//     and WarmupCosineLR its first update at lr 0;
//   - DeepSpeed's types raise warmup_num_steps to at least 2 (max(2, n));
//     the transformers types take it as given (0 = no warmup).
#pragma once

#include <cstdint>
#include <string>

namespace flowrun {

struct lr_schedule {
  /// transformers.get_scheduler names: "constant", "constant_with_warmup",
  /// "linear", "cosine"; DeepSpeed's: "WarmupLR", "WarmupDecayLR",
  /// "WarmupCosineLR"; "" = no schedule (base_lr throughout, DeepSpeed without
  /// a "scheduler" section).
  std::string type;
  /// Updates over which the warmup runs. transformers: num_warmup_steps (>= 0;
  /// "constant" ignores it, as get_constant_schedule does). DeepSpeed: > 0,
  /// raised to max(2, this).
  int64_t warmup_num_steps = 1000;
  /// Updates in the whole run: transformers' num_training_steps (linear and
  /// cosine decay to 0 there), DeepSpeed's total_num_steps (WarmupDecayLR,
  /// WarmupCosineLR).
  int64_t total_num_steps = 0;
  /// DeepSpeed WarmupLR / WarmupDecayLR: lr at the start of warmup (absolute).
  double warmup_min_lr = 0;
  /// DeepSpeed WarmupLR / WarmupDecayLR: lr at the end of warmup (absolute).
  /// DeepSpeed's WarmupLR takes the optimizer's lr when the key is absent (see
  /// warmup_max_lr_from_optimizer); WarmupDecayLR defaults to 0.001.
  double warmup_max_lr = 0.001;
  /// True for a WarmupLR without warmup_max_lr: lr_at uses its base_lr instead.
  bool warmup_max_lr_from_optimizer = false;
  /// DeepSpeed: "log" (its default: log(step) / log(warmup_num_steps)) or
  /// "linear". DeepSpeed takes any other value as "log" with a warning; so do
  /// we (ds_config::warnings).
  std::string warmup_type = "log";
  /// DeepSpeed WarmupCosineLR: warmup starts at warmup_min_ratio · base_lr.
  double warmup_min_ratio = 0;
  /// DeepSpeed WarmupCosineLR: the cosine ends at cos_min_ratio · base_lr.
  double cos_min_ratio = 0.0001;

  /// Learning rate of update number `step` (0-based; see the step convention
  /// above). `base_lr` is the optimizer's lr: the transformers types and
  /// WarmupCosineLR scale it, a WarmupLR without warmup_max_lr warms up to it,
  /// "" returns it unchanged; WarmupLR / WarmupDecayLR otherwise ignore it.
  /// Throws std::invalid_argument for step < 0 or an unknown type (naming the
  /// types there are).
  double lr_at(int64_t step, double base_lr) const;

  /// Whether every update runs at base_lr: no schedule (""), "constant", or "constant_with_warmup"
  /// without warmup. DeepSpeed's types always move.
  bool constant() const {
    return type.empty() || type == "constant" || (type == "constant_with_warmup" && warmup_num_steps == 0);
  }

  /// For DeepSpeed's decaying types (WarmupDecayLR, WarmupCosineLR) with total_num_steps > 0 and a run
  /// of more `updates`: "the DeepSpeed config's TYPE is over at total_num_steps = N: the steps past it
  /// train at the schedule's end (learning rate LR at step U)", U the run's last update (0-based), as
  /// DeepSpeed does (its schedule stays at its end: lr 0 for WarmupDecayLR). "" otherwise. Every trainer
  /// that takes a DeepSpeed JSON warns with it (zero_rank, DS-Chat's steps 1-2 and DPO).
  std::string past_end(int64_t updates, double base_lr) const;

  /// For a transformers type with warmup ("linear", "cosine", "constant_with_warmup") whose
  /// warmup_num_steps is at least the run's `updates` (> 0) and base_lr > 0: "num_warmup_steps = W and
  /// the run has U updates: every update is in warmup, the last at LR, P%" (P of base_lr; the
  /// run never reaches its peak rate; DS-Chat's scripts warm up over 100 updates of far longer runs).
  /// "" otherwise. DS-Chat's steps 1-3 and DPO warn with it.
  std::string all_warmup(int64_t updates, double base_lr) const;

  /// A transformers.get_scheduler schedule (DeepSpeed-Chat's
  /// --lr_scheduler_type, --num_warmup_steps and its num_training_steps).
  /// Throws std::invalid_argument naming an unknown type.
  static lr_schedule transformers(const std::string& lr_scheduler_type, int64_t num_warmup_steps,
                                  int64_t num_training_steps);
};

}  // namespace flowrun
