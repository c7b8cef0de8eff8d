// PEFT-format LoRA adapters (huggingface/peft: adapter_model.safetensors +
// adapter_config.json), as TencentPretrain's use_lora saves them: only the
// LoRA tensors (and a value head, when the model has one) are written, and
// base + adapter load to continue training.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "models/decoder.h"

namespace flowrun {

/// Write the adapter of `model` (which must have LoRA) into folder `dir`:
/// adapter_model.safetensors with PEFT's names for the model's family (see peft_name;
/// "v_head.weight" when present) and adapter_config.json (peft_type LORA, r,
/// lora_alpha, lora_dropout, target_modules (OPT / GPT-2: the HF names of the modules
/// adapted, or "all-linear"), bias "none", fan_in_fan_out true for GPT-2, and
/// base_model_name_or_path = `base` when given: the base model's folder or file, which
/// PEFT's AutoPeftModelForCausalLM loads). No base weight is written. Atomic per file.
/// Throws std::invalid_argument when the model has no LoRA, std::runtime_error naming the
/// file on I/O errors.
void save_adapter(const decoder& model, const std::string& dir, const std::string& base = "");

/// Add the adapter in `dir` to `model` (a base without LoRA): reads
/// adapter_config.json, enables LoRA with its r, lora_alpha, lora_dropout and
/// target_modules (freezing the base when freeze_base), and loads the tensors.
/// A value head in the file is added to the model. Throws std::runtime_error
/// naming the file and tensor when a tensor is missing, unexpected or of the
/// wrong shape, or the config is not a LoRA config; and naming the key when the
/// config asks for more than plain LoRA (any LoraConfig field flowrun does not read
/// that is set: DoRA, rsLoRA, aLoRA's invocation tokens, layers_to_transform,
/// exclude_modules, modules_to_save, lora_bias, a regex target_modules, ...), so
/// that no adapter is applied otherwise than PEFT applies it.
void load_adapter(decoder& model, const std::string& dir, bool freeze_base = true);

/// The one way a trainer's settings become a LoRA config (sft_trainer, rm_trainer, policy, critic,
/// zero_rank).
///   rank     DS-Chat's lora_dim / actor_lora_dim / critic_lora_dim, TencentPretrain's lora_r (>= 1)
///   alpha    DS-Chat's LinearLayer_LoRA scales by lora_scaling / lora_dim with lora_scaling 1, so
///            its trainers pass 1; TencentPretrain and PEFT pass lora_alpha
///   modules  DS-Chat's lora_module_name: a prefix ending in "layers" or "layers." (its default
///            "decoder.layers.", or "layers.") means every Linear of the blocks ("all-linear",
///            whatever the family); "all-linear" itself; otherwise a comma-separated list of PEFT
///            target_modules ("q_proj,v_proj"), matched by PEFT's rule with the model family's
///            own names (decoder::enable_lora)
/// Throws std::invalid_argument naming the setting when rank < 1, dropout is outside [0, 1) or the
/// module list is empty; decoder::enable_lora then checks the names against the model.
lora_config make_lora_config(int64_t rank, float alpha, float dropout, const std::string& modules, uint64_t seed);

/// Whether two LoRA configs adapt the same modules: their target_modules as sets (PEFT matches each
/// name; the order of the list means nothing).
bool same_target_modules(const lora_config& a, const lora_config& b);

/// A LoRA config as a checkpoint manifest records it (zero_rank's "lora_config"), with PEFT's
/// adapter_config.json keys: {"r", "lora_alpha", "lora_dropout", "target_modules"}, the target modules
/// as decoder::enable_lora reads them (flowrun's names, "all-linear"); the seed is not recorded (it
/// draws A's start and the dropout masks, neither of which a trained adapter needs).
nlohmann::json lora_config_record(const lora_config& c);

/// The config lora_config_record wrote. Throws std::invalid_argument naming `where` (the manifest)
/// when a key is missing or out of range (r < 1, lora_dropout outside [0, 1), no target module).
lora_config lora_config_from_record(const nlohmann::json& j, const std::string& where);

/// PEFT's tensor name for one of our adapter tensors of a model with config `c`, and back
/// (PEFT's in-memory ".default." adapter name is dropped). "v_head.weight" is the same in both.
///   LLaMA  model.layers.N.self_attn.q_proj.lora_A.weight
///            <-> base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight
///   OPT    base_model.model.model.decoder.layers.N.{self_attn.{q,k,v,out}_proj, fc1, fc2}.lora_{A,B}.weight
///            (our o_proj, up_proj, down_proj are out_proj, fc1, fc2)
///   GPT-2  base_model.model.transformer.h.N.{attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj}.lora_{A,B}.weight:
///            c_attn is our fused self_attn.qkv_proj (k_fused_qkv_path: one A (r, C) for q, k, v and
///            B (3C, r)), c_proj / c_fc / mlp.c_proj our o_proj / up_proj / down_proj. PEFT adapts GPT-2's
///            Conv1D with fan_in_fan_out = true, which only transposes the merged B A (the Conv1D weight
///            is (in, out)); lora_A is (r, in) and lora_B (out, r) as for a Linear.
/// peft_name throws std::invalid_argument for an adapter the family's HF model cannot hold (a GPT-2 with
/// q_proj alone adapted: PEFT adapts c_attn as a whole). ours_from_peft returns names it does not know
/// unchanged (load_adapter then reports them as unexpected).
std::string peft_name(const model_config& c, const std::string& ours);
std::string ours_from_peft(const model_config& c, const std::string& peft);

}  // namespace flowrun
