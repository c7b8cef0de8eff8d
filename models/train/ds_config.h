// DeepSpeed's JSON configuration ("ds_config.json"), read as DeepSpeed reads it
// (issue #5): the batch triple, gradient clipping, ZeRO stage, fp16/bf16 with
// fp16's dynamic loss scaling, the Adam/AdamW optimizer and the WarmupLR,
// WarmupDecayLR and WarmupCosineLR schedules. Keys that do not apply to
// flowrun are kept in ds_config::ignored_keys for the caller to report once.
//
// Semantics follow DeepSpeed 0.19.8 (deepspeedai/DeepSpeed):
//   deepspeed/runtime/config.py          batch triple, optimizer and scheduler names
//   deepspeed/runtime/constants.py       defaults (gradient_clipping 1.0)
//   deepspeed/runtime/precision_config.py fp16 / bf16 sections
//   deepspeed/runtime/zero/config.py     zero_optimization
//   deepspeed/runtime/engine.py          _configure_basic_optimizer (Adam vs AdamW),
//                                        _take_model_step (when the scheduler steps)
//   deepspeed/runtime/lr_schedules.py    WarmupLR, WarmupDecayLR, WarmupCosineLR
//   deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler (ZeRO stages 1-3)
//   deepspeed/runtime/fp16/fused_optimizer.py FP16_Optimizer._update_scale (no ZeRO)
// The reference numbers in tests/fixtures/ds/*.json were produced by that
// DeepSpeed (tests/fixtures/ds/make_ds_reference.py).
//
// No CAF here (layer 3).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "models/train/lr_schedule.h"

namespace flowrun {

/// The DeepSpeed release whose config semantics this file reproduces.
inline constexpr const char* ds_reference_version = "0.19.8";

/// How parse_ds_config treats our own settings and HF Trainer's "auto" values.
struct ds_parse_options {
  /// Key path -> JSON text, written into the config before it is read (our
  /// key=value settings, e.g. {"train_micro_batch_size_per_gpu", "8"},
  /// {"optimizer.params.betas", "[0.9, 0.95]"}, {"scheduler.type", "WarmupLR"}).
  /// Text that is not JSON is taken as a string. Missing objects on the path
  /// are created. Errors about an overridden key name the override.
  std::map<std::string, std::string> overrides;
  /// Key path -> JSON text used where the config says "auto" (HF Trainer's
  /// DeepSpeed integration fills these in from its own arguments; flowrun's
  /// trainer nodes from their settings: actors/dschat_common.h hf_auto_values).
  /// An "auto" read without an entry here is an error naming every such key.
  std::map<std::string, std::string> auto_values;
};

/// A DeepSpeed config, resolved for one world size.
struct ds_config {
  /// Global batch (samples per optimizer update over all ranks).
  int64_t train_batch_size = 0;
  /// Samples per micro-batch per rank.
  int64_t train_micro_batch_size_per_gpu = 0;
  /// Micro-batches accumulated per optimizer update.
  int64_t gradient_accumulation_steps = 0;
  /// Data-parallel ranks the triple was resolved for:
  /// train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size.
  int world_size = 1;

  /// Max global gradient norm; <= 0: no clipping. DeepSpeed 0.19.8 defaults to
  /// 1.0 when the key is absent (older releases: 0.0).
  double gradient_clipping = 1.0;

  /// zero_optimization.stage, 0..3 ("zero_optimization": true is the
  /// deprecated form of stage 1). Every other zero_optimization key is ignored.
  int zero_stage = 0;
  /// zero_optimization.offload_optimizer.device / offload_param.device:
  /// "none", "cpu" or "nvme" (informational: flowrun does not offload; the
  /// offload keys are also listed in ignored_keys).
  std::string offload_optimizer_device = "none";
  std::string offload_param_device = "none";

  /// bf16.enabled ("bfloat16" is DeepSpeed's old name for the section).
  bool bf16 = false;
  /// fp16.enabled. fp16 and bf16 together are an error, as in DeepSpeed.
  bool fp16 = false;
  /// fp16.loss_scale: 0 = dynamic loss scaling, > 0 = this static scale.
  double loss_scale = 0;
  /// fp16.initial_scale_power: the dynamic scale starts at 2^this.
  int initial_scale_power = 16;
  /// fp16.loss_scale_window: clean updates before the scale doubles (> 0).
  int64_t loss_scale_window = 1000;
  /// fp16.hysteresis: overflows tolerated before the scale halves (> 0; ZeRO
  /// stages 1-3 only, see dynamic_loss_scaler).
  int64_t hysteresis = 2;
  /// fp16.consecutive_hysteresis: refill the hysteresis on every clean update.
  bool consecutive_hysteresis = false;
  /// fp16.min_loss_scale: the dynamic scale's floor (> 0).
  double min_loss_scale = 1;

  /// True when the config has an "optimizer" section (else the defaults below).
  bool optimizer_given = false;
  /// "AdamW" (decoupled weight decay) or "Adam" (L2: weight_decay * param is
  /// added to the gradient). DeepSpeed's "Adam" runs AdamW unless
  /// params.adam_w_mode is false (engine.py _configure_basic_optimizer); so
  /// {"type": "Adam"} gives "AdamW" here, {"type": "Adam", "params":
  /// {"adam_w_mode": false}} gives "Adam". Type names are case-insensitive.
  std::string optimizer_type = "AdamW";
  /// optimizer.params.torch_adam: torch.optim.Adam/AdamW instead of
  /// DeepSpeed's FusedAdam (only the weight_decay default differs for us).
  bool torch_adam = false;
  /// optimizer.params.bias_correction (FusedAdam; default true).
  bool bias_correction = true;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  /// Default 0 (DeepSpeed's FusedAdam / DeepSpeedCPUAdam), 0.01 with
  /// torch_adam and AdamW (torch.optim.AdamW's default).
  double weight_decay = 0.0;

  /// The "scheduler" section (type "" without one): models/train/lr_schedule.h holds
  /// DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR and their step convention.
  lr_schedule scheduler;

  /// Key paths present in the config that flowrun does not act on (e.g.
  /// "steps_per_print", "zero_optimization.overlap_comm",
  /// "zero_optimization.stage3_max_live_parameters", "hybrid_engine"), in
  /// file order. The caller reports them once (ignored_keys_warning()).
  std::vector<std::string> ignored_keys;
  /// A top-level ignored key a letter or two from a key flowrun reads: a likely typo.
  struct typo {
    std::string key;      ///< as written ("train_batch_sizee")
    std::string nearest;  ///< the key flowrun reads it is close to ("train_batch_size")
    std::string place;    ///< "file:line:col" of the key
    /// "FILE:L:C: \"KEY\" is not read: did you mean \"NEAREST\"?"
    std::string str() const { return place + ": \"" + key + "\" is not read: did you mean \"" + nearest + "\"?"; }
    bool operator==(const typo&) const = default;
  };
  /// The top-level ignored keys a letter or two from a key flowrun reads (ds_config_top_level_keys), in file
  /// order: likely typos, for the caller to warn about (a key that names a section another one overrides,
  /// bfloat16 beside bf16, is not one). A batch triple that does not resolve names them in its error.
  std::vector<typo> likely_typos;
  /// Things DeepSpeed would log as warnings (deprecated forms, an unknown
  /// warmup_type, total_num_steps < warmup_num_steps).
  std::vector<std::string> warnings;
  /// The keys whose "auto" came from ds_parse_options::auto_values, as "key=value", in the order read.
  std::vector<std::string> auto_filled;
  /// Whether `key` (a dotted path, "scheduler.params.total_num_steps") was "auto", filled from the node.
  bool filled_auto(std::string_view key) const {
    return std::any_of(auto_filled.begin(), auto_filled.end(), [&](const std::string& k) {
      return k.size() > key.size() && k.compare(0, key.size(), key) == 0 && k[key.size()] == '=';
    });
  }
  /// The file (or "<string>") the config came from.
  std::string where;

  /// scheduler.lr_at(step, lr).
  double lr_at(int64_t step) const { return scheduler.lr_at(step, lr); }
  /// One line naming the ignored keys, or "" when there are none.
  std::string ignored_keys_warning() const;
  /// A one-line summary of the resolved settings (for logs).
  std::string summary() const;
};

/// Parses DeepSpeed's JSON config text for `world_size` data-parallel ranks.
///
/// JSON with // and /* */ comments (DeepSpeed reads files with hjson; other
/// hjson extensions are not accepted). Duplicate keys are an error, as in
/// DeepSpeed. A null value counts as absent.
///
/// The batch triple is resolved exactly as DeepSpeedConfig
/// (_set_batch_related_parameters, then _batch_assertion): all three given ->
/// checked; train_batch_size and micro -> gas = train // micro // world;
/// train_batch_size and gas -> micro = train // world // gas; micro and gas ->
/// train = micro * gas * world; only train_batch_size -> gas 1, micro = train //
/// world; only micro -> gas 1, train = micro * world; otherwise an error. Then
/// each must be > 0 and train == micro * gas * world_size.
///
/// Throws std::invalid_argument whose message starts with the place
/// ("file:line:column: key.path: ...", the position of the key, or of the
/// override that set it) and says what was found and what is allowed, e.g.
/// "zero_optimization.stage must be 0, 1, 2 or 3". Errors: not JSON (with the
/// line:column of the syntax error); world_size < 1; a wrongly typed value;
/// "auto" without an entry in options.auto_values; an unresolvable or
/// inconsistent batch triple; zero_optimization.stage outside 0..3; fp16 and
/// bf16 both enabled; bad fp16 settings (loss_scale < 0, loss_scale_window,
/// hysteresis or min_loss_scale <= 0 with dynamic scaling); an optimizer other
/// than Adam/AdamW; optimizer.params.max_grad_norm (DeepSpeed wants
/// gradient_clipping) or amsgrad true; a scheduler other than WarmupLR,
/// WarmupDecayLR, WarmupCosineLR; missing total_num_steps; warmup_num_steps <= 0;
/// keys an optimizer, scheduler, fp16 or bf16 section does not take (DeepSpeed
/// rejects those too); per-param-group lists.
ds_config parse_ds_config(const std::string& json_text, int world_size,
                          const std::string& where = "<string>",
                          const ds_parse_options& options = {});

/// The top-level keys parse_ds_config acts on (the batch triple, gradient_clipping, zero_optimization,
/// fp16, bf16, bfloat16, optimizer, scheduler): any other top-level key lands in ignored_keys.
const std::vector<std::string>& ds_config_top_level_keys();

/// Reads the file at `path` and parses it (ds_config::where = path). A file
/// that cannot be read is an std::invalid_argument naming it.
ds_config load_ds_config(const std::string& path, int world_size, const ds_parse_options& options = {});

/// fp16 loss scaling as DeepSpeed does it.
///
/// With ZeRO stages 1-3 this is DeepSpeed's DynamicLossScaler.update_scale: an
/// overflow uses up one unit of hysteresis, and only when none is left (or
/// hysteresis is 1) halves the scale (not below min_loss_scale); an overflow at
/// min_loss_scale with no hysteresis left is fatal (std::runtime_error, as
/// DeepSpeed's "Current loss scale already at minimum"). A clean update refills
/// the hysteresis if consecutive_hysteresis. The scale doubles on a clean update
/// once good_steps() (clean updates since the last overflow) is a positive
/// multiple of loss_scale_window, which also refills the hysteresis. There is
/// no upper bound.
/// With ZeRO stage 0 it is FP16_Optimizer._update_scale: the same doubling,
/// but every overflow halves the scale (no hysteresis) and the floor is not fatal.
/// With fp16.loss_scale > 0 the scale is that constant; without fp16 it is 1.
/// In every case an overflowing update is skipped (not applied, and the lr
/// schedule does not advance).
class dynamic_loss_scaler {
 public:
  explicit dynamic_loss_scaler(const ds_config& cfg);

  /// Multiply the loss by this before backward; divide the gradients by it.
  double scale() const { return scale_; }
  /// True for fp16 with loss_scale 0.
  bool dynamic() const { return dynamic_; }
  /// True when the ZeRO (hysteresis) rule applies, false for stage 0's rule.
  bool uses_hysteresis() const { return use_hysteresis_; }

  /// Once per optimizer update, after checking the (unscaled) gradients for
  /// inf/NaN. Returns true when this update must be skipped (== overflow).
  /// Throws std::runtime_error at the floor (ZeRO rule, see above).
  bool update(bool overflow);

  /// Clean updates since the last overflow (or since the start); DeepSpeed's
  /// cur_iter - last_overflow_iter - 1.
  int64_t good_steps() const { return good_steps_; }
  /// Overflows still tolerated before the next halving (DeepSpeed's
  /// cur_hysteresis); always fp16.hysteresis under stage 0's rule.
  int64_t hysteresis_left() const { return hysteresis_left_; }

  /// Updates skipped for overflowed gradients since this scaler was made (not checkpointed: the
  /// trainers report each as it happens, trainer_engine::report_overflows).
  int64_t overflows() const { return overflows_; }

  /// Restores checkpointed state (scale(), good_steps(), hysteresis_left()) of
  /// a dynamic scaler; a static or absent scale stays as the config says.
  /// Throws std::invalid_argument for scale <= 0 or non-finite, good_steps < 0
  /// or hysteresis_left < 0.
  void restore(double scale, int64_t good_steps, int64_t hysteresis_left);

 private:
  bool dynamic_ = false;
  bool use_hysteresis_ = false;
  double scale_ = 1;
  double min_scale_ = 1;
  int64_t window_ = 1000;
  int64_t hysteresis_ = 2;
  bool consecutive_hysteresis_ = false;
  int64_t good_steps_ = 0;
  int64_t hysteresis_left_ = 2;
  int64_t overflows_ = 0;
};

}  // namespace flowrun
