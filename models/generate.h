// Autoregressive generation with a KV cache: batched, left-padded prompts,
// per-sequence EOS, greedy or sampled (models/sampler.h).
#pragma once

#include <cstdint>
#include <vector>

#include "models/decoder.h"
#include "models/sampler.h"

namespace flowrun {

struct generation_config {
  sampling_config sampling;
  int64_t max_new_tokens = 64;
  uint64_t seed = 42;              ///< sequence i samples with seed + i
  std::vector<int32_t> stop_ids;   ///< generation of a sequence ends after one of these (kept in the output)
  int32_t pad_id = 0;              ///< fills left padding and finished sequences
  /// Record each new token's log-prob under the raw logits (log-softmax over the whole logits
  /// row, float64 sum, as rlhf::gather_log_probs_forward computes it): generation_result::logprobs.
  bool record_logprobs = false;
};

struct generation_result {
  std::vector<int32_t> tokens;  ///< the new tokens only (a stop id, if hit, is the last one)
  bool stopped = false;         ///< ended on a stop id (not by max_new_tokens or the context length)
  std::vector<float> logprobs;  ///< with record_logprobs: one per new token
};

/// Generate for each prompt (token ids, each non-empty). Prompts are left-padded
/// into one batch; a padded sequence yields the same tokens as when run alone.
/// Throws std::invalid_argument for an empty prompt or one longer than max_seq_len.
std::vector<generation_result> generate(decoder& model, const std::vector<std::vector<int32_t>>& prompts,
                                        const generation_config& cfg);

}  // namespace flowrun
