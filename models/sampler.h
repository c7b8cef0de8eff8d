// Next-token sampling: greedy, temperature, top-k, top-p (nucleus; Holtzman et
// al. 2020) and repetition penalty (Keskar et al. 2019, CTRL eq. in sec. 4.1,
// as HF's RepetitionPenaltyLogitsProcessor).
#pragma once

#include <cstdint>
#include <vector>

namespace flowrun {

struct sampling_config {
  float temperature = 1.0f;        ///< 0 = greedy (argmax)
  int top_k = 0;                   ///< 0 = off; the k most probable and those tied with the k-th (HF's TopK)
  float top_p = 1.0f;              ///< 1 = off; the nucleus of what top_k left, renormalised (HF's TopP after TopK)
  float repetition_penalty = 1.0f; ///< 1 = off; > 1 discourages tokens already present
};

/// A small deterministic generator (xorshift64*, as llama2.c's run.c), one per sequence.
struct rng64 {
  uint64_t state;
  explicit rng64(uint64_t seed = 1) : state(seed ? seed : 0x2545F4914F6CDD1Dull) {}
  uint32_t next_u32() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return static_cast<uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
  }
  /// Uniform in [0, 1).
  float next_f32() { return (next_u32() >> 8) / 16777216.0f; }
};

/// transformers' RepetitionPenaltyLogitsProcessor (CTRL, Keskar et al. 2019) on row[0, n): each id of
/// `history` in [0, n), once however often it occurs, divided by `penalty` where > 0 and multiplied
/// where < 0. sample_token applies it to the logits, beam_search to the log-probs (as transformers'
/// beam search runs its processors on the log-softmax). penalty 1 changes nothing.
void apply_repetition_penalty(float* row, int64_t n, float penalty, const std::vector<int32_t>& history);

/// Pick the next token from `logits` (n_valid entries are considered; padded
/// vocabulary rows beyond n_valid are never chosen). `history` feeds the
/// repetition penalty. Modifies nothing but `rng`.
int32_t sample_token(const float* logits, int64_t n_valid, const sampling_config& cfg, rng64& rng,
                     const std::vector<int32_t>& history = {});

/// log p(token) under softmax(logits[0, n) / temperature), temperature > 0: the log-prob the RL
/// trainers give a token sampled at that temperature. TRL's, veRL's and OpenRLHF's actors divide
/// the logits by the rollout temperature before their log-softmax (veRL dp_actor.py
/// `logits.div_(temperature)`; TRL grpo_trainer.py and ppo_trainer.py `logits /= temperature`), so
/// the PPO ratio compares the policy that sampled with the one being trained; top-k, top-p and the
/// repetition penalty stay out of it, as there. At temperature 1 this is simd::log_softmax_at(logits,
/// n, token) itself; otherwise the row divided by the temperature goes to `scratch` (resized to n)
/// and through the same formula. The generator's recorded behaviour log-probs and
/// rlhf::gather_log_probs_forward both call it, so they agree bit for bit.
/// Throws std::invalid_argument for temperature <= 0 (a greedy row's log-probs are temperature 1's).
float token_log_prob(const float* logits, int64_t n, int32_t token, float temperature, std::vector<float>& scratch);

/// The temperature a row's log-probs are taken at (token_log_prob) after sampling with `cfg`:
/// cfg.temperature, or 1 for greedy rows (temperature 0 or top_k 1 pick the argmax; their
/// log-probs are the raw logits').
float log_prob_temperature(const sampling_config& cfg);

}  // namespace flowrun
