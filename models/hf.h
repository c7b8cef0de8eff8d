// Hugging Face checkpoint folders (config.json + model.safetensors or shards)
// for the decoder families flowrun runs: LLaMA (LlamaForCausalLM: LLaMA 1/2 and
// Llama 3.x, whose llama3 RoPE scaling is model_config::rope_scaling), Qwen2 /
// Qwen2.5 (Qwen2ForCausalLM: the LLaMA decoder with q/k/v biases,
// model_config::qkv_bias), OPT (OPTForCausalLM) and GPT-2 (GPT2LMHeadModel).
//
// References (transformers): models/llama/modeling_llama.py and
// configuration_llama.py, modeling_rope_utils.py (_compute_llama3_parameters),
// models/qwen2/modeling_qwen2.py and configuration_qwen2.py,
// models/opt/modeling_opt.py and configuration_opt.py,
// models/gpt2/modeling_gpt2.py and configuration_gpt2.py,
// models/llama/convert_llama_weights_to_hf.py (the RoPE row permutation),
// modeling_utils.py (safetensors sharding, tied weights).
//
// Tensor names, HF ↔ flowrun (flowrun uses LlamaForCausalLM names for all):
//   LLaMA  identity.
//   Qwen2  identity, plus model.layers.N.self_attn.{q,k,v}_proj.bias.
//   OPT    model.decoder.embed_tokens.weight       ↔ model.embed_tokens.weight
//          model.decoder.embed_positions.weight    ↔ model.embed_positions.weight (P + 2 rows)
//          model.decoder.layers.N.self_attn_layer_norm ↔ model.layers.N.input_layernorm
//          model.decoder.layers.N.self_attn.{q,k,v}_proj ↔ same, out_proj ↔ o_proj
//          model.decoder.layers.N.final_layer_norm ↔ model.layers.N.post_attention_layernorm
//          model.decoder.layers.N.fc1 / fc2        ↔ model.layers.N.mlp.up_proj / down_proj
//          model.decoder.final_layer_norm          ↔ model.norm (absent when do_layer_norm_before
//                                                    is false: post-LayerNorm, model_config::post_norm)
//          model.decoder.project_in / project_out  ↔ model.project_in / model.project_out, when
//                                                    word_embed_proj_dim != hidden_size (model_config::embed_dim;
//                                                    embed_tokens and lm_head are then word_embed_proj_dim wide)
//   GPT-2  transformer.wte / wpe                   ↔ model.embed_tokens / model.embed_positions
//          transformer.h.N.ln_1 / ln_2             ↔ input_layernorm / post_attention_layernorm
//          transformer.h.N.attn.c_attn (C, 3C)     ↔ q_proj, k_proj, v_proj (transposed, split)
//          transformer.h.N.attn.c_proj, mlp.c_fc, mlp.c_proj ↔ o_proj, up_proj, down_proj
//            (GPT-2's Conv1D stores weights (in, out): transposed to Linear's (out, in))
//          transformer.ln_f                        ↔ model.norm
//   all    lm_head.weight (only when untied).
// Checkpoints of the base model (OPTModel "decoder.*", GPT2Model "h.*", LlamaModel
// "layers.*") load too. Known non-parameter buffers are ignored: GPT-2's
// attn.bias / attn.masked_bias, LLaMA's rotary_emb.inv_freq, and lm_head.weight
// when the config ties it to the embedding.
//
// Value head: a model with DeepSpeed-Chat's reward / critic head (decoder::add_value_head,
// reward_model.py's v_head = nn.Linear(C, 1, bias=False)) is written with one more tensor,
// "v_head.weight" (1, C), beside the CausalLM tensors, as DS-Chat's save_hf_format keeps
// it in the state dict; transformers' AutoModelForCausalLM loads the folder and ignores it
// (an "unused weights" warning); load_hf adds the value head when the tensor is there.
//
// Padded vocabularies: config.json's vocab_size is the number of embedding rows
// (OPT: 50272 for a 50265-token tokenizer). The tokenizer's size becomes
// model_config::real_vocab_size, from our key "flowrun_real_vocab_size" in
// config.json, else the tokenizer in the folder, else vocab_size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/decoder.h"
#include "models/safetensors.h"

namespace flowrun {

/// The model_config described by an HF config.json (model_type llama, qwen2, opt or gpt2).
/// real_vocab_size is taken from "flowrun_real_vocab_size" when present, else
/// left at vocab_size. RoPE: "rope_theta" and "rope_parameters" (transformers 5) or
/// "rope_scaling" (transformers 4) of rope_type / type "default" or "llama3" (factor,
/// low_freq_factor, high_freq_factor, original_max_position_embeddings). Throws
/// std::runtime_error naming `where` (the file) and the key for an unsupported
/// "architectures" entry or model_type (naming the supported architectures), or
/// architecture variant (OPT with _remove_final_layer_norm, RoPE scaling other than
/// llama3, Qwen2 sliding-window layers, an activation flowrun lacks, ...), and
/// for sizes model_config::validate refuses (e.g. num_attention_heads 0).
/// OPT's word_embed_proj_dim and do_layer_norm_before = false (facebook/opt-350m)
/// map to model_config::embed_dim and post_norm.
model_config hf_config_from_json(const nlohmann::json& config_json, const std::string& where = "config.json");

/// config.json for `cfg`, with the keys transformers reads for the family
/// (architectures, model_type, sizes, eps, activation, tie_word_embeddings,
/// token ids, torch_dtype from `on_disk`) plus "flowrun_real_vocab_size". A LLaMA-family
/// config with qkv_bias is written as Qwen2ForCausalLM; llama3 RoPE scaling as
/// "rope_parameters" (and "rope_scaling", for transformers 4).
/// Throws std::invalid_argument when `cfg` has switches the HF architecture of its
/// family cannot express (e.g. a LLaMA with biases, an OPT with RoPE).
nlohmann::json hf_config_to_json(const model_config& cfg, dtype on_disk = dtype::f32);

/// One HF tensor and the flowrun parameters it holds: `parts` concatenated
/// along dim 0 (after transposing when `transpose`) give the HF tensor.
/// GPT-2's c_attn.weight is {transpose, [q, k, v]}; most are a single part.
struct hf_tensor_spec {
  std::string hf_name;
  shape_t hf_shape;
  bool transpose = false;
  std::vector<std::string> parts;
};

/// All HF tensors of a model with config `cfg` (in the order save_hf writes them).
std::vector<hf_tensor_spec> hf_tensor_map(const model_config& cfg);

/// Whether an HF config.json (parsed) names a *ForSequenceClassification architecture: TRL's reward model,
/// whose score.weight is the value head (load_hf reads it so, save_hf writes it so).
bool is_sequence_classification(const nlohmann::json& config);

/// Load an HF folder: config.json plus model.safetensors (or shards with
/// model.safetensors.index.json), F32/BF16/F16 on disk, onto `dev`; with a
/// "v_head.weight" (1, C) tensor the model gets a value head (see above).
/// LLaMA loads with the half (rotate_half) RoPE layout.
/// Throws std::runtime_error naming the folder/file and the tensors at fault:
/// missing or unexpected tensors (all listed), a shape that disagrees with
/// config.json, and in particular an embedding whose rows differ from
/// config.json's vocab_size ("model.decoder.embed_tokens.weight has 50265 rows
/// but config.json vocab_size is 50272"), or a tokenizer larger than the embedding.
/// `progress`, when given, hears of each tensor read (tensor_progress: the bytes are the tensors'
/// in the files), after the checks above; `flowrun convert` draws its progress line from it.
decoder load_hf(const std::string& dir, device dev = device::cpu(), const tensor_progress_fn& progress = {});

/// Write `model` as an HF folder `dir` (created if needed; a value head as
/// "v_head.weight", DS-Chat's, or as "score.weight" where extra_config's "architectures" name a
/// *ForSequenceClassification, TRL's reward model as load_hf reads it; LoRA adapters are not written: merge them into a copy first,
/// as checkpoint.h save_model does): config.json and
/// model.safetensors (or shards of at most max_shard_bytes plus the index when
/// max_shard_bytes > 0), weights stored as `on_disk`. Each file is written
/// atomically. A LLaMA with llama2.c's adjacent RoPE layout is written with its
/// q_proj/k_proj rows permuted to HF's half layout (see to_half_rope), so the
/// folder loads in transformers with the same logits. `extra_config` keys are
/// merged into config.json last (e.g. bos_token_id / eos_token_id of the source).
/// `progress`, when given, hears of each tensor written (save_safetensors_checkpoint's report).
/// Throws std::invalid_argument when the model has no HF equivalent,
/// std::runtime_error on an I/O error.
void save_hf(const decoder& model, const std::string& dir, dtype on_disk = dtype::f32, int64_t max_shard_bytes = 0,
             const nlohmann::json& extra_config = nlohmann::json::object(), const tensor_progress_fn& progress = {});

/// A copy of a RoPE model with HF's half layout (pairs (i, i + hs/2)): the rows
/// of each head of q_proj and k_proj (and their biases) are permuted as
/// convert_llama_weights_to_hf.py's permute(w, n_heads, dim1, dim2) =
/// w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)
/// (k_proj with n_kv_heads), so the logits are unchanged. A model already in the
/// half layout is copied as is. Throws std::invalid_argument for a model without RoPE.
decoder to_half_rope(const decoder& model);
/// The inverse: a copy with llama2.c's / Meta's adjacent layout (pairs (2i, 2i+1)).
/// Within each of `n_heads` heads of hs rows (each of `cols` floats), move row 2i+j
/// (adjacent RoPE pairs) to row j*hs/2+i (half layout), or back (to_half false).
/// In place on a row-major (n_heads*hs, cols) block. convert_llama_weights_to_hf.py, permute().
void permute_heads(float* w, int64_t n_heads, int64_t hs, int64_t cols, bool to_half);

decoder to_adjacent_rope(const decoder& model);

/// A deep copy of `model` (the weights and the value head; not LoRA adapters) on `dev`.
decoder clone_decoder(const decoder& model, device dev = device::cpu());

}  // namespace flowrun
