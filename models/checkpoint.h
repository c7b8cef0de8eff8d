// Whole-model files for the tools and the trainers: one loader for every format
// a user brings, one saver that writes a model back in the format it came in,
// and the checks that refuse, before training, a save that cannot succeed.
//
// Formats (load_model reads all three; save_model writes all three):
//   llama2c  a llama2.c .bin file (models/llama2c.h): LLaMA family only, no value
//            head; LoRA is merged on save; RoPE in llama2.c's adjacent layout.
//   flowrun  a folder from save_model_dir: flowrun_config.json + model.safetensors,
//            LoRA adapters and the value head kept apart (bit-exact on reload).
//   hf       a Hugging Face folder (models/hf.h): config.json + model.safetensors
//            with the family's HF tensor names (LLaMA, OPT, GPT-2), LoRA merged, a
//            value head as "v_head.weight", and the tokenizer files beside them.
#pragma once

#include <string>
#include <string_view>

#include "models/decoder.h"

namespace flowrun {

enum class model_format : uint8_t { llama2c, flowrun, hf };

/// "llama2.c file", "flowrun model folder" or "Hugging Face folder".
std::string_view to_string(model_format f);

/// What a model on disk is, read from its header or config file only (no weights).
struct model_file_info {
  model_format format = model_format::llama2c;
  model_family family = model_family::llama;
  bool value_head = false;  ///< flowrun folders only (HF folders: not looked up, false)
};

/// The format and family of the model at `path` (resolved as load_model does).
/// Throws asset_missing / std::runtime_error naming the path when it is none of the three.
model_file_info inspect_model(const std::string& path);

/// Save `model` into folder `dir`: flowrun_config.json (the model_config, LoRA
/// and value-head flags) and model.safetensors (every base and adapter tensor,
/// f32, HF LlamaForCausalLM names plus v_head.weight and PEFT-style lora_A/lora_B).
/// Each file is written atomically. Throws std::runtime_error naming the file.
void save_model_dir(const decoder& model, const std::string& dir);

/// Load a model from: a llama2.c .bin file; a folder written by save_model_dir;
/// or a Hugging Face folder (config.json + safetensors; with v_head.weight it gets a
/// value head). Relative paths also resolve under FLOWRUN_ASSETS. Throws
/// asset_missing / std::runtime_error naming the path.
decoder load_model(const std::string& path);

/// The format a trainer writes a model it was given as `given`: the same, except that
/// a model with a value head given as a llama2.c file (which cannot hold one) is written
/// as a flowrun folder (rm_trainer's output from a llama2.c base).
model_format saved_format(model_format given, bool value_head);

/// Why a model of `family` (with a value head when `value_head`) cannot be saved as `f`
/// at `path`: a sentence that ends with the fix, or "" when it can. Checked before
/// training, so that a save never fails after it: the format can hold the model
/// (llama2.c: LLaMA without a value head); the path fits the format (llama2.c: a file,
/// not an existing folder nor a path ending in '/'; folders: not an existing file nor a
/// name ending in ".bin"); the nearest existing folder above `path` is a writable folder.
/// Writes nothing.
std::string save_problem(model_format f, const std::string& path, model_family family, bool value_head);

/// Write `model` at `path` as `f` (folders are created). llama2c and hf get a copy
/// with the LoRA adapters merged (the model itself is not changed) and the RoPE layout
/// the format uses (models/hf.h to_half_rope / to_adjacent_rope). For hf, `tokenizer`
/// (what load_tokenizer takes; empty: none) is copied into the folder
/// (copy_tokenizer_files) and its BOS/EOS/pad ids go into config.json. Throws
/// std::runtime_error with save_problem's sentence when the model cannot be written
/// so, or naming the file on an I/O error.
void save_model(const decoder& model, const std::string& path, model_format f, const std::string& tokenizer = "");

/// The largest |difference| between `model`'s outputs and those of the model that
/// load_model reads back from `path`, on a fixed probe batch (2 rows of up to 8 tokens,
/// ids spread over the vocabulary): logits, or values when `model` has a value head.
/// Checks that a saved model equals the one in memory (the trainers' verify_output).
double reload_max_diff(const decoder& model, const std::string& path);

}  // namespace flowrun
