// A resume whose settings changed (issue 17): a checkpoint records the settings of the node
// that wrote it, except those that are safe to change (how often to print or save, where
// ranks talk, the ZeRO stage, gradient checkpointing, a longer run: leaving them out also keeps
// the checkpoints of one run on one process and on a cluster byte-identical); resuming
// compares the record with the node's settings now and refuses any change (a learning rate,
// the data, seq_length, the model, LoRA), naming each setting with its value then and now.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/actor/node.h"

namespace flowrun::actors {

/// The node's settings but those in `safe`, the TensorBoard ones (enable_tensorboard,
/// tensorboard_path), the supervision ones (restart, max_restarts: a restart policy added after a
/// crash was refused, and retried the refusal) and where the ranks meet (rank_group_setting_names):
/// they change nothing trained, so a resume or a rerun may switch them. As
/// {name: value as written (graph::to_string)}, absolute paths with their symbolic links resolved
/// (the same files from another working directory or FLOWRUN_ASSETS spelling record the same).
/// The DeepSpeed JSON (deepspeed_config) and a tokenizer file or folder (its tokenizer files: tokenizer.json,
/// tokenizer.model, tokenizer_config.json, vocab.json, merges.txt, ...) are also recorded by their contents
/// under "NAME (contents)": the JSON parsed, without the keys a resume may change (steps_per_print,
/// scheduler.params.total_num_steps, zero_optimization.stage, monitors), a LoRA adapter folder to continue
/// from (lora_pretrained: its adapter_config.json and adapter_model.safetensors), a tokenizer and the data
/// (data, unsup_data, each mix_data file) by an FNV-1a of their bytes, and the `model` that
/// sft_trainer, rm_trainer, dpo_trainer and zero_rank start from (unless it is their output) by that of its
/// bytes, or of each file directly in its folder (model_contents); check_resume_settings compares
/// those instead of the path (a data file edited in place is refused: "data: the bytes of \"PATH\" changed";
/// another file with other bytes: "model \"THEN\" -> \"NOW\" (other bytes)"; a folder names its model
/// files: "model: \"PATH\" changed (model.safetensors changed, tokenizer.json added)").
/// With ds_batch_split_safe in `safe`, a DeepSpeed JSON is recorded without its batch triple
/// (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps: the split of the
/// global batch may change, as the ranks may, and the trainer checks the resolved global batch itself;
/// check_resume_settings leaves the triple out of an older record too).
/// A node with data_split also records `data_split_order` (dschat::split_order): how the split
/// orders the rows, so a record from before the split took DS-Chat's own order (numpy's
/// RandomState, 2026-12-05) reads as a change, not as the same rows.
nlohmann::json settings_record(const graph::node_spec& n, const std::set<std::string>& safe);

/// The model a trainer starts from, by its contents, as settings_record records it under "model
/// (contents)": for a file the FNV-1a of its bytes ("fnv1a:" and 16 hex digits); for a folder (Hugging Face,
/// flowrun's) an object naming each regular file directly in it with that of its bytes. Its path alone let a
/// resume, or a rerun that skips a finished step, go on from a file replaced since (DPO scored its resumed
/// policy against another reference; a finished SFT kept an output trained from the old file).
nlohmann::json model_contents(const std::string& path);

/// What differs between two model_contents, `then` (a record) and `now`: none when they are the same model.
/// Two folders: each file a model is read from (is_model_file) that differs, "NAME changed", "NAME added" or
/// "NAME gone"; other files (a README added to a folder from the Hub) are no change. Otherwise (a file, or a
/// folder recorded before 2026-12-06 as one fingerprint over every file in it, which now's files give
/// again) one entry, "other bytes".
std::vector<std::string> model_contents_changes(const nlohmann::json& then, const nlohmann::json& now);

/// A tokenizer (a file, or a folder's tokenizer files) by its bytes, as settings_record records it
/// under "tokenizer (contents)"; "" when `path` is neither.
std::string tokenizer_fingerprint(const std::string& path);

/// The entry of settings_record's `safe` that lets a resume split train_batch_size otherwise.
inline constexpr std::string_view ds_batch_split_safe = "deepspeed_config (batch split)";

/// The changes from `recorded` to `now` (two settings_record's), each "name then -> now" (a file
/// recorded by its contents: "name: the bytes of \"PATH\" changed" at the same path, "name \"THEN\" -> \"NOW\" (other
/// bytes)" at another, or a DeepSpeed JSON's keys); none when
/// `recorded` is not an object (no record). A setting now that is absent then reads "(not set)".
std::vector<std::string> settings_changes(const nlohmann::json& recorded, const nlohmann::json& now);

/// `recorded` with the settings of `now` (n's settings_record) that it lacks and that n leaves at their
/// default filled in: a setting newer than the record (flowrun gained it since) at its default is no
/// change, as the run that wrote the record behaved as that default (it was refused as "(not set) -> ...",
/// with no value to set back). Every comparison of a record with now goes through it: resumes
/// (check_resume_settings) and the DS-Chat steps' done markers.
nlohmann::json with_newer_defaults(nlohmann::json recorded, const nlohmann::json& now, const graph::node_spec& n);

/// Compare `recorded` (settings_record of the run that wrote `folder`) with the node's settings
/// but those in `safe`: a change throws std::runtime_error: "node 'NAME': resuming from FOLDER
/// with settings changed: lr 1e-4 -> 2e-4; set them back, or AFRESH". A missing record (an
/// older checkpoint) is accepted.
void check_resume_settings(actor::node_context& ctx, const nlohmann::json& recorded, const std::string& folder,
                           const std::set<std::string>& safe, const std::string& afresh);

/// Step 3's nodes that keep no checkpoint of their own but shape what the trainers learn (the
/// prompt loader, the generator, the reward function, the experience maker, the controller, the
/// frozen reference and reward models):
/// when step 3 starts afresh (CHECKPOINT_DIR holds no step3.json) the node's settings record
/// (settings_record, but those in `safe`, restart and max_restarts) goes to
/// CHECKPOINT_DIR/NAME.settings.json (written by replica 0); when it resumes, every replica
/// compares, and a change is refused as
/// check_resume_settings does ("... set them back, or delete CHECKPOINT_DIR to start step 3
/// afresh"); a record that is missing (an older checkpoint) is accepted and written then, so later
/// resumes compare with it; one that is not JSON
/// refused. Without a checkpoint_dir: nothing. Throws std::runtime_error.
/// The record also holds replica 0's node seed (node_context::seed, from [graph] seed) under node_seed_key:
/// a resume under another graph seed is refused (the generator sampled with the new one, a run neither seed's).
void check_step3_settings(actor::node_context& ctx, std::set<std::string> safe);

/// The key of check_step3_settings' record that holds the node's seed.
inline constexpr std::string_view node_seed_key = "seed (the node's, from [graph] seed)";

}  // namespace flowrun::actors
