// Autoregressive generation with a KV cache: batched, left-padded prompts,
// per-sequence EOS, greedy or sampled (models/sampler.h).
#pragma once

#include <cstdint>
#include <map>
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
  /// Record each new token's log-prob under the logits divided by the sampling temperature (1 for
  /// greedy rows: log_prob_temperature), over the whole logits row (token_log_prob, as
  /// rlhf::gather_log_probs_forward computes it): generation_result::logprobs.
  bool record_logprobs = false;
  /// > 1: beam search (transformers' generate with num_beams and do_sample false; see beam_search below)
  /// instead of sampling; the sampling settings but repetition_penalty are then unused.
  int64_t num_beams = 1;
  /// Beam search: a finished beam scores sum log p / (new tokens)^length_penalty (transformers' default 1).
  float length_penalty = 1.0f;
  /// Tokens masked out (-inf before sampling, greedy choice or the beams' log-probs; mask_tokens), as
  /// transformers' logits processors of the same generation_config.json keys: the stop ids while fewer
  /// than min_new_tokens new tokens were generated (MinNewTokensLengthLogitsProcessor), or while the
  /// sequence, prompt included, is shorter than min_length (MinLengthLogitsProcessor; the prompt's own
  /// tokens, without left padding); suppress_ids at every step (suppress_tokens:
  /// SuppressTokensLogitsProcessor); begin_suppress_ids as the first new token (begin_suppress_tokens:
  /// SuppressTokensAtBeginLogitsProcessor); and with no_repeat_ngram_size n > 0 every token that would
  /// repeat an n-gram of the sequence, prompt included (NoRepeatNGramLogitsProcessor). Ids outside
  /// 0..vocab-1 are ignored.
  int64_t min_new_tokens = 0, min_length = 0, no_repeat_ngram_size = 0;
  std::vector<int32_t> suppress_ids, begin_suppress_ids;
};

/// Sets to -inf the entries of `row` (n values: a vocabulary's logits or log-probs) that `cfg` masks for the
/// token that follows `seq` (the prompt's `prompt_len` tokens and those generated after them): see
/// generation_config::min_new_tokens.
void mask_tokens(float* row, int64_t n, const std::vector<int32_t>& seq, int64_t prompt_len,
                 const generation_config& cfg);

struct generation_result {
  std::vector<int32_t> tokens;  ///< the new tokens only (a stop id, if hit, is the last one)
  bool stopped = false;         ///< ended on a stop id (not by max_new_tokens or the context length)
  std::vector<float> logprobs;  ///< with record_logprobs: one per new token
};

/// The rows of a batch grouped by equal keys: `first` holds each distinct key's first row, in
/// order; slot[b] is row b's index into `first`.
struct row_groups {
  std::vector<int64_t> first, slot;
};
/// Groups rows [0, B) by key(b) (any value std::map can order, e.g. a prompt's tokens).
template <class KeyFn>
row_groups group_rows(int64_t B, KeyFn key) {
  row_groups g;
  g.slot.resize(static_cast<size_t>(B));
  std::map<decltype(key(int64_t{0})), int64_t> seen;
  for (int64_t b = 0; b < B; ++b) {
    auto [it, fresh] = seen.emplace(key(b), static_cast<int64_t>(g.first.size()));
    if (fresh) g.first.push_back(b);
    g.slot[static_cast<size_t>(b)] = it->second;
  }
  return g;
}

/// Prefill rows that share prompts once: rows g.first of ids (B, P) i32, positions (B, P) i32 and
/// mask (B, P) i32 (positions and mask may be undefined, as for forward_cached; host tensors) run
/// through decoder::forward_cached in a cache of their own, and each row b of `cache` (B rows, made
/// by model.make_cache) receives the K/V of row slot[b]. Returns forward_cached's result for the U
/// distinct rows (U, P, V) with all_logits, else (U, V); row slot[b] is row b's. A row's K/V and
/// logits are those of a prefill of its prompt alone (the attention is per row; the GEMMs give a
/// row the same bits at any row count above cpu_gemm::k_small_m on flowrun's packed kernel and on
/// BLIS, while fewer rows take the small-M kernel, and oneDNN's AVX2 sgemm or cuBLAS may round by
/// row count, 1-2 ulp).
tensor prefill_shared(decoder& model, kv_cache& cache, const row_groups& g, const tensor& ids, const tensor& positions,
                      const tensor& mask, bool all_logits);

/// Beam search over one prompt (token ids, non-empty) with cfg.num_beams beams, as transformers'
/// generate() with num_beams and do_sample false does it (generation/utils.py _beam_search, 4.50 and
/// later; early_stopping false): each step the beams' next-token log-softmax (repetition_penalty applied
/// to it, as transformers' processor) plus their running sums; the best (1 + stop ids, at least 2) x
/// num_beams continuations; those ending on a stop id (or at the length limit) among the first num_beams
/// become finished hypotheses scored sum / (new tokens)^length_penalty, the best num_beams others run on;
/// the search ends when no running beam can beat the worst of num_beams finished ones (the best running
/// sum over the current new tokens^length_penalty) or every continuation ends. Returns the best finished
/// hypothesis (its stop id included). The beams share one prefill; the KV cache's rows follow their beams.
/// Throws std::invalid_argument for an empty prompt, one longer than max_seq_len or num_beams < 2.
generation_result beam_search(decoder& model, const std::vector<int32_t>& prompt, const generation_config& cfg);

/// Generate for each prompt (token ids, each non-empty). Prompts are left-padded
/// into one batch; a padded sequence yields the same tokens as when run alone.
/// With cfg.num_beams > 1, each prompt's beam_search instead.
/// Throws std::invalid_argument for an empty prompt or one longer than max_seq_len.
std::vector<generation_result> generate(decoder& model, const std::vector<std::vector<int32_t>>& prompts,
                                        const generation_config& cfg);

}  // namespace flowrun
