// Next-token sampling: greedy, temperature, top-k, top-p (nucleus; Holtzman et
// al. 2020) and repetition penalty (Keskar et al. 2019, CTRL eq. in sec. 4.1,
// as HF's RepetitionPenaltyLogitsProcessor).
#pragma once

#include <cstdint>
#include <vector>

namespace flowrun {

struct sampling_config {
  float temperature = 1.0f;        ///< 0 = greedy (argmax)
  int top_k = 0;                   ///< 0 = off
  float top_p = 1.0f;              ///< 1 = off
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

/// Pick the next token from `logits` (n_valid entries are considered; padded
/// vocabulary rows beyond n_valid are never chosen). `history` feeds the
/// repetition penalty. Modifies nothing but `rng`.
int32_t sample_token(const float* logits, int64_t n_valid, const sampling_config& cfg, rng64& rng,
                     const std::vector<int32_t>& history = {});

}  // namespace flowrun
