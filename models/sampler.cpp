#include "models/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

namespace flowrun {

int32_t sample_token(const float* logits_in, int64_t n, const sampling_config& cfg, rng64& rng,
                     const std::vector<int32_t>& history) {
  std::vector<float> logits(logits_in, logits_in + n);
  if (cfg.repetition_penalty != 1.0f && !history.empty()) {
    std::unordered_set<int32_t> seen(history.begin(), history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= n) continue;
      float& l = logits[id];
      l = l > 0 ? l / cfg.repetition_penalty : l * cfg.repetition_penalty;
    }
  }
  if (cfg.temperature <= 0.0f || cfg.top_k == 1) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // probabilities at temperature
  float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<float> probs(n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    probs[i] = std::exp((logits[i] - mx) / cfg.temperature);
    sum += probs[i];
  }
  for (auto& p : probs) p = static_cast<float>(p / sum);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  int64_t keep = n;
  bool filtered = (cfg.top_k > 0 && cfg.top_k < n) || cfg.top_p < 1.0f;
  if (filtered) {
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
    if (cfg.top_k > 0 && cfg.top_k < n) keep = cfg.top_k;
    if (cfg.top_p < 1.0f) {
      double cum = 0;
      for (int64_t i = 0; i < keep; ++i) {
        cum += probs[order[i]];
        if (cum >= cfg.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += probs[order[i]];
  double r = rng.next_f32() * total, cdf = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cdf += probs[order[i]];
    if (r < cdf) return order[i];
  }
  return order[keep - 1];
}

}  // namespace flowrun
