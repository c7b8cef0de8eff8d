// llama2.c checkpoint files (karpathy/llama2.c run.c and export.py).
//
//  - legacy v0: 7 int32 {dim, hidden_dim, n_layers, n_heads, n_kv_heads,
//    vocab_size (negative = untied classifier), seq_len}, then f32 weights in
//    run.c's order: token_embedding, rms_att (L), wq (L), wk, wv, wo, rms_ffn,
//    w1 (gate), w2 (down), w3 (up), rms_final, freq_cis_real, freq_cis_imag,
//    [wcls];
//  - version 1 (export.py version1_export): 256-byte header (uint32 magic
//    0x616b3432 "ak42", int32 version 1, the 7 ints, uint8 shared_classifier,
//    zero padding), then f32 weights: attention norms (L), ffn norms (L),
//    final norm, token embedding, wq, wk, wv, wo, w1, w2, w3 (each L), [wcls].
// RoPE in these files pairs adjacent channels (ops::rope_layout::adjacent).
#pragma once

#include <string>

#include "models/decoder.h"
#include "models/safetensors.h"  // tensor_progress

namespace flowrun {

/// Load a llama2.c v0 or v1 file into a new decoder on `dev`.
/// Throws std::runtime_error naming the file and the problem (bad magic, unknown
/// version, truncated or oversized file with the expected and actual byte counts), all before the
/// weights are allocated. The weights are read tensor by tensor, straight into the decoder;
/// `progress`, when given, hears of each one (tensor_progress: HF names, f32 bytes; version 0's
/// freq_cis block is skipped and not counted), as `flowrun convert` shows it.
decoder load_llama2c(const std::string& path, device dev = device::cpu(), const tensor_progress_fn& progress = {});

/// The config in a llama2.c file's header (28 or 256 bytes; no weights read), validated. Throws
/// std::runtime_error as load_llama2c does for the header.
model_config llama2c_config(const std::string& path);

/// Write a LLaMA-family decoder as a llama2.c file: version 0 (legacy) or 1.
/// Atomic (atomic_file): written to PATH.tmp tensor by tensor, fsynced, then renamed; `progress` hears
/// of each tensor as it is written. An exception (a full disk, or one `progress` throws) leaves no
/// PATH.tmp and PATH as it was. Throws std::runtime_error.
void save_llama2c(const decoder& model, const std::string& path, int version = 1,
                  const tensor_progress_fn& progress = {});

}  // namespace flowrun
