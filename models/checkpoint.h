// Whole-model files for the tools: one loader for every format a user brings,
// and a folder format that also keeps the value head and LoRA tensors.
#pragma once

#include <string>

#include "models/decoder.h"

namespace flowrun {

/// Save `model` into folder `dir`: flowrun_config.json (the model_config, LoRA
/// and value-head flags) and model.safetensors (every base and adapter tensor,
/// f32, HF LlamaForCausalLM names plus v_head.weight and PEFT-style lora_A/lora_B).
/// Each file is written atomically. Throws std::runtime_error naming the file.
void save_model_dir(const decoder& model, const std::string& dir);

/// Load a model from: a llama2.c .bin file; a folder written by save_model_dir;
/// or a Hugging Face folder (config.json + safetensors). Relative paths also
/// resolve under FLOWRUN_ASSETS. Throws asset_missing / std::runtime_error naming the path.
decoder load_model(const std::string& path);

}  // namespace flowrun
