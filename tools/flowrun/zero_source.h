// A zero_rank checkpoint as a model source (flowrun generate --zero_checkpoint, flowrun convert
// --from zero): the step folder a path names, and the whole model consolidated from its shards, as
// DeepSpeed's zero_to_fp32.py consolidates a ZeRO checkpoint.
#pragma once

#include <string>

#include "models/decoder.h"
#include "models/train/shard_checkpoint.h"

namespace flowrun::cli {

/// The step folder that `path` names for `option` (its name in errors, "--zero_checkpoint"): `path`
/// itself when it is a step folder, else the committed one in `path` (zero_rank's output_dir, a
/// trainer's CHECKPOINT_DIR/NODE) by its `latest` file. Unlike a resume, which takes the newest step
/// that verifies where `latest` cannot say, any doubt is an error: throws std::invalid_argument for no
/// such folder, no `latest`, a `latest` that is malformed or names a step that is gone (naming the
/// newest step folder to pass instead), and for a graph's checkpoint_dir (naming its nodes' folders).
std::string zero_step_folder(const std::string& path, const std::string& option);

/// The `model` setting of the zero_rank run that wrote `ck` (its manifest's settings record,
/// an absolute path); "" when the record names none.
std::string zero_run_model(const loaded_checkpoint& ck);

/// The model the run that wrote `ck` started from (zero_run_model; `base_given`, the option `opt`,
/// names it after a move), checked by its bytes against the record ("model (contents)"); "" when
/// the record names none. Throws std::invalid_argument when it is gone or has other bytes, saying
/// to give it with `opt`.
std::string zero_run_base(const loaded_checkpoint& ck, const std::string& base_given, const std::string& opt);

/// The tokenizer the run that wrote `ck` (read from `path`, what the user named) trained with: a
/// trainer's own `tokenizer` setting (sft_trainer's, in the manifest's settings record), else a
/// pretraining run's data node's (run_data_tokenizer); "" when neither names a file that exists.
/// Throws std::invalid_argument when the file's bytes differ from the record's (edited since the run).
std::string zero_run_tokenizer(const loaded_checkpoint& ck, const std::string& path);

/// The whole model of a checkpoint of the one training engine (zero_rank's, a DS-Chat trainer's:
/// engine_state_groups records the model), f32 on the CPU, its LoRA merged (a plain model):
///  - a full run's: the fp32 master weights of every shard (checkpoint group "base"), on the
///    model_config the manifest records;
///  - a LoRA run's (the checkpoint holds the adapter alone, group "adapter"): the run's base model
///    (zero_run_model; `base_given`, the option `base_option` ("--model"), names it after a move) checked by its bytes
///    or, for step 3's trainers, which record the weights they started from (init_weights), by those
///    (the record's "model (contents)", actors::model_contents_changes), with the adapter of the
///    manifest's lora_config put in and merged: W + (lora_alpha / r) B A;
///  - a DS-Chat trainer's with lora_dim beside a base that trains: both groups, the adapter merged.
/// A value model's (a reward model's or critic's v_head) is refused: no language-model format holds it.
/// Throws std::invalid_argument saying what to give: no model_config (not zero_rank's); a LoRA
/// checkpoint from before lora_config was recorded; a base that is gone, or has other bytes; an
/// adapter of another size than the config makes.
/// A full checkpoint's weights are all in it: `base_given` is not read then (the caller decides what it means).
decoder zero_checkpoint_model(const loaded_checkpoint& ck, const std::string& base_given, const std::string& base_option);

/// The adapter of a checkpoint that trained one alone (zero_rank's use_lora, DS-Chat's only_optimize_lora)
/// on a model of the recorded config, its base weights not read (zeros): what save_adapter writes as
/// PEFT's adapter folder (a stopped run's save_lora). Throws std::invalid_argument for a checkpoint
/// without an adapter, one whose base trained too (the adapter alone is not the model) and a value model's.
decoder zero_checkpoint_adapter(const loaded_checkpoint& ck);

}  // namespace flowrun::cli
