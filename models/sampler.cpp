#include "models/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "runtime/kernels/cpu/simd_kernels.h"

namespace flowrun {

float token_log_prob(const float* logits, int64_t n, int32_t token, float temperature, std::vector<float>& scratch) {
  if (!(temperature > 0.0f))
    throw std::invalid_argument("token_log_prob: temperature must be > 0, got " + std::to_string(temperature));
  if (temperature == 1.0f) return simd::log_softmax_at(logits, n, token);
  scratch.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) scratch[static_cast<size_t>(i)] = logits[i] / temperature;
  return simd::log_softmax_at(scratch.data(), n, token);
}

float log_prob_temperature(const sampling_config& cfg) {
  return cfg.temperature <= 0.0f || cfg.top_k == 1 ? 1.0f : cfg.temperature;
}

void apply_repetition_penalty(float* row, int64_t n, float penalty, const std::vector<int32_t>& history) {
  if (penalty == 1.0f) return;
  std::unordered_set<int32_t> seen;
  for (int32_t id : history) {
    if (id < 0 || id >= n || !seen.insert(id).second) continue;
    float& l = row[id];
    l = l > 0 ? l / penalty : l * penalty;
  }
}

int32_t sample_token(const float* logits_in, int64_t n, const sampling_config& cfg, rng64& rng,
                     const std::vector<int32_t>& history) {
  // the row is read in place; a copy only when the repetition penalty changes it
  const float* logits = logits_in;
  std::vector<float> penalised;
  if (cfg.repetition_penalty != 1.0f && !history.empty()) {
    penalised.assign(logits_in, logits_in + n);
    apply_repetition_penalty(penalised.data(), n, cfg.repetition_penalty, history);
    logits = penalised.data();
  }
  if (cfg.temperature <= 0.0f || cfg.top_k == 1) return static_cast<int32_t>(simd::argmax_f(logits, n));
  // probabilities at temperature: exp((l - max) / T) on the CPU's vector path
  // (runtime/kernels/cpu/simd_kernels.h, ~2 ulp), the sum in double
  const float mx = simd::max_f(logits, n);
  std::vector<float> probs(n);
  for (int64_t i = 0; i < n; ++i) probs[i] = (logits[i] - mx) / cfg.temperature;
  const double sum = simd::exp_sum(probs.data(), 0.0f, n, probs.data());
  for (auto& p : probs) p = static_cast<float>(p / sum);
  const bool by_k = cfg.top_k > 0 && cfg.top_k < n;
  if (!by_k && !(cfg.top_p < 1.0f)) {  // plain sampling: the inverse CDF over the ids in order
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += probs[i];
    double r = rng.next_f32() * total, cdf = 0;
    for (int64_t i = 0; i < n; ++i) {
      cdf += probs[i];
      if (r < cdf) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(n - 1);
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  int64_t keep = n;
  {
    // most probable first, ties by id: a strict total order, so sorting only the
    // top k (partial_sort: n log k, not n log n) gives the full sort's first k
    auto before = [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); };
    if (by_k) {
      keep = cfg.top_k;
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), before);
      // transformers' TopKLogitsWarper removes only the scores below the k-th (scores < topk(scores)[-1]): a
      // token tied with the k-th stays, so k ties at the boundary keep them all (by id after the first k)
      const float kth = logits[order[keep - 1]] / cfg.temperature;
      auto tail = std::partition(order.begin() + keep, order.end(),
                                 [&](int32_t i) { return logits[i] / cfg.temperature >= kth; });
      std::sort(order.begin() + keep, tail);
      keep = tail - order.begin();
    } else {
      std::sort(order.begin(), order.end(), before);
    }
    if (cfg.top_p < 1.0f) {
      // the nucleus of what top k left, renormalised (transformers' TopPLogitsWarper softmaxes the scores
      // TopK has already set to -inf): k = 2 of probabilities 0.69 and 0.08 keeps one token at top_p 0.75
      double kept = 0;
      for (int64_t i = 0; i < keep; ++i) kept += probs[order[i]];
      double cum = 0;
      for (int64_t i = 0; i < keep; ++i) {
        cum += probs[order[i]] / kept;
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
