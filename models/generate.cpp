#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>


namespace flowrun {

tensor prefill_shared(decoder& model, kv_cache& cache, const row_groups& g, const tensor& ids, const tensor& positions,
                      const tensor& mask, bool all_logits) {
  const int64_t U = static_cast<int64_t>(g.first.size()), B = static_cast<int64_t>(g.slot.size());
  auto pick = [&](const tensor& t) -> tensor {  // rows g.first of a host (B, n) i32 tensor
    if (!t.defined()) return {};
    const int64_t n = t.size(1);
    auto u = tensor::empty({U, n}, dtype::i32);
    for (int64_t i = 0; i < U; ++i)
      std::copy_n(t.data<int32_t>() + g.first[static_cast<size_t>(i)] * n, n, u.data<int32_t>() + i * n);
    return u;
  };
  kv_cache shared = model.make_cache(U, cache.S);
  tensor out = model.forward_cached(shared, pick(ids), pick(positions), pick(mask), 0, all_logits);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t u = g.slot[static_cast<size_t>(b)];
    for (size_t l = 0; l < cache.k.size(); ++l) {
      cache.k[l].rows(b, b + 1).copy_from(shared.k[l].rows(u, u + 1));
      cache.v[l].rows(b, b + 1).copy_from(shared.v[l].rows(u, u + 1));
    }
  }
  return out;
}

void mask_tokens(float* row, int64_t n, const std::vector<int32_t>& seq, int64_t prompt_len,
                 const generation_config& cfg) {
  const float ninf = -std::numeric_limits<float>::infinity();
  bool masked = false;
  const auto mask_one = [&](int32_t t) {
    if (t < 0 || t >= n) return;
    row[t] = ninf;
    masked = true;
  };
  const auto mask = [&](const std::vector<int32_t>& ids) {
    for (const int32_t t : ids) mask_one(t);
  };
  const int64_t len = static_cast<int64_t>(seq.size()), new_tokens = len - prompt_len;
  if (new_tokens < cfg.min_new_tokens || len < cfg.min_length) mask(cfg.stop_ids);
  mask(cfg.suppress_ids);
  if (new_tokens == 0) mask(cfg.begin_suppress_ids);
  // transformers' _get_ngrams / _get_generated_ngrams: the (n-1) last tokens, and every earlier n-gram that
  // starts with them bans its last token
  const int64_t N = cfg.no_repeat_ngram_size;
  if (N > 0 && len + 1 >= N) {
    const int64_t tail = len - (N - 1);  // where the last n-1 tokens start
    for (int64_t i = 0; i + N <= len; ++i)
      if (std::equal(seq.begin() + i, seq.begin() + i + (N - 1), seq.begin() + tail)) mask_one(seq[i + N - 1]);
  }
  // nothing left to choose: sampling read NaN probabilities and printed garbage (transformers raises too)
  if (masked && std::none_of(row, row + n, [ninf](float x) { return x > ninf; }))
    throw std::invalid_argument("generate: every token is masked for new token " + std::to_string(new_tokens + 1) +
                                " (suppress_tokens, begin_suppress_tokens, no_repeat_ngram_size, and the stop ids "
                                "under min_new_tokens or min_length leave none): remove some of them");
}

generation_result beam_search(decoder& model, const std::vector<int32_t>& prompt, const generation_config& cfg) {
  const auto& mc = model.config();
  const int64_t K = cfg.num_beams, P = static_cast<int64_t>(prompt.size());
  if (K < 2) throw std::invalid_argument("beam_search: num_beams must be >= 2 (got " + std::to_string(K) + ")");
  if (P == 0) throw std::invalid_argument("generate: empty prompt (add a BOS token)");
  if (P >= mc.max_seq_len)
    throw std::invalid_argument("generate: prompt of " + std::to_string(P) + " tokens leaves no room in max_seq_len " +
                                std::to_string(mc.max_seq_len));
  generation_result out;
  if (cfg.max_new_tokens <= 0) return out;
  const int64_t S = std::min<int64_t>(mc.max_seq_len, P + cfg.max_new_tokens);  // transformers' max_length
  const int64_t V = mc.vocab_limit();
  // transformers' beams_to_keep, at most every continuation there is (a vocabulary smaller than the stop ids + 1)
  const int64_t keep = std::min(std::max<int64_t>(2, 1 + static_cast<int64_t>(cfg.stop_ids.size())) * K, K * V);
  const auto is_stop = [&](int32_t t) { return std::find(cfg.stop_ids.begin(), cfg.stop_ids.end(), t) != cfg.stop_ids.end(); };

  // one prefill, its K/V in every beam's row (prefill_shared)
  kv_cache cache = model.make_cache(K, S);
  auto ids = tensor::empty({K, P}, dtype::i32), pos = tensor::empty({K, P}, dtype::i32);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t t = 0; t < P; ++t) ids.data<int32_t>()[k * P + t] = prompt[t], pos.data<int32_t>()[k * P + t] = t;
  const row_groups one = group_rows(K, [](int64_t) { return 0; });
  tensor logits = prefill_shared(model, cache, one, ids, pos, {}, false).to(device::cpu());  // (1, Vrow)
  int64_t Vrow = logits.size(1);
  std::vector<int64_t> row_of(K, 0);  // the logits row of each beam (one shared row after the prefill)

  std::vector<std::vector<int32_t>> run(K);  // each running beam's new tokens
  std::vector<float> run_score(K, -1.0e9f);
  run_score[0] = 0.0f;  // the other beams start at -1e9, so the first step expands beam 0 alone
  struct hypothesis {
    float score;
    std::vector<int32_t> tokens;
  };
  std::vector<hypothesis> done;  // at most K, best first
  std::vector<float> lp(static_cast<size_t>(K * V));
  std::vector<int64_t> order(static_cast<size_t>(K * V));
  for (int64_t cur = P;; ++cur) {
    // log-softmax of each beam's row (float32, as torch's), the repetition penalty on it, plus the beam's sum
    for (int64_t k = 0; k < K; ++k) {
      const float* row = logits.data<float>() + row_of[k] * Vrow;
      float* l = lp.data() + k * V;
      const float mx = *std::max_element(row, row + V);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
      const float lse = mx + static_cast<float>(std::log(sum));
      for (int64_t v = 0; v < V; ++v) l[v] = row[v] - lse;
      std::vector<int32_t> history = prompt;
      history.insert(history.end(), run[k].begin(), run[k].end());
      mask_tokens(l, V, history, P, cfg);  // transformers' processors run on the log-probs in beam search
      if (cfg.sampling.repetition_penalty != 1.0f)  // on the log-probs, as transformers' beam search
        apply_repetition_penalty(l, V, cfg.sampling.repetition_penalty, history);
      for (int64_t v = 0; v < V; ++v) l[v] += run_score[k];
    }
    // the best `keep` continuations over every beam, best first (ties: the lower beam, then the lower token)
    std::iota(order.begin(), order.end(), int64_t{0});
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
      return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
    });
    std::vector<int64_t> cand_beam(keep);
    std::vector<int32_t> cand_tok(keep);
    std::vector<bool> hit(keep);
    bool all_hit = true;
    for (int64_t c = 0; c < keep; ++c) {
      cand_beam[c] = order[c] / V;
      cand_tok[c] = static_cast<int32_t>(order[c] % V);
      hit[c] = is_stop(cand_tok[c]) || cur + 1 >= S;
      all_hit = all_hit && hit[c];
    }
    // finished: those among the first K that end here, scored by their length (the new tokens, the stop id in)
    const float len_pen = std::pow(static_cast<float>(cur + 1 - P), cfg.length_penalty);
    for (int64_t c = 0; c < K; ++c) {
      if (!hit[c]) continue;
      hypothesis h{lp[order[c]] / len_pen, run[cand_beam[c]]};
      h.tokens.push_back(cand_tok[c]);
      done.push_back(std::move(h));
    }
    std::stable_sort(done.begin(), done.end(), [](const hypothesis& a, const hypothesis& b) { return a.score > b.score; });
    if (static_cast<int64_t>(done.size()) > K) done.resize(K);
    if (all_hit) break;
    // the next running beams: the best K that did not end (an ended one scores -1e9 more)
    std::vector<int64_t> pick(keep);
    std::iota(pick.begin(), pick.end(), int64_t{0});
    auto running_score = [&](int64_t c) { return lp[order[c]] + (hit[c] ? -1.0e9f : 0.0f); };
    std::stable_sort(pick.begin(), pick.end(), [&](int64_t a, int64_t b) { return running_score(a) > running_score(b); });
    std::vector<std::vector<int32_t>> next_run(K);
    std::vector<int64_t> src(K);
    auto step_ids = tensor::empty({K, 1}, dtype::i32), step_pos = tensor::empty({K, 1}, dtype::i32);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t c = pick[k];
      src[k] = cand_beam[c];
      next_run[k] = run[cand_beam[c]];
      next_run[k].push_back(cand_tok[c]);
      run_score[k] = running_score(c);
      step_ids.data<int32_t>()[k] = cand_tok[c];
      step_pos.data<int32_t>()[k] = static_cast<int32_t>(cur);
    }
    run = std::move(next_run);
    // can a running beam still beat the worst of K finished ones? (transformers' heuristic with early_stopping
    // false: the best running sum over the new tokens so far)
    if (static_cast<int64_t>(done.size()) == K &&
        run_score[0] / std::pow(static_cast<float>(cur + 1 - P), cfg.length_penalty) <= done.back().score)
      break;
    // the cache's rows follow their beams (the cur positions filled; a beam that stays in its row is not
    // copied; a row that another beam takes is read before it is written), then every beam's next token
    std::vector<int64_t> sources;  // rows another beam continues from
    for (int64_t k = 0; k < K; ++k)
      if (src[k] != k && std::find(sources.begin(), sources.end(), src[k]) == sources.end()) sources.push_back(src[k]);
    for (std::vector<tensor>* part : {&cache.k, &cache.v})
      for (tensor& t : *part) {
        const int64_t row = t.numel() / K, n = cur * (row / S);  // a row is (S, KV, hs); its first cur positions
        std::vector<tensor> saved;
        for (int64_t s : sources) saved.push_back(t.flat_view(s * row, {n}).clone());
        for (int64_t k = 0; k < K; ++k)
          if (src[k] != k)
            t.flat_view(k * row, {n}).copy_from(
                saved[static_cast<size_t>(std::find(sources.begin(), sources.end(), src[k]) - sources.begin())]);
      }
    logits = model.forward_cached(cache, step_ids, step_pos, {}, cur).to(device::cpu());
    Vrow = logits.size(1);
    std::iota(row_of.begin(), row_of.end(), int64_t{0});
  }
  out.tokens = done.front().tokens;
  out.stopped = !out.tokens.empty() && is_stop(out.tokens.back());
  return out;
}

std::vector<generation_result> generate(decoder& model, const std::vector<std::vector<int32_t>>& prompts,
                                        const generation_config& cfg) {
  const auto& mc = model.config();
  const int64_t B = static_cast<int64_t>(prompts.size());
  std::vector<generation_result> out(B);
  if (B == 0) return out;
  if (cfg.num_beams > 1) {
    for (int64_t b = 0; b < B; ++b) out[b] = beam_search(model, prompts[b], cfg);
    return out;
  }
  if (cfg.max_new_tokens < 0)
    throw std::invalid_argument("generate: max_new_tokens must be >= 0 (got " + std::to_string(cfg.max_new_tokens) + ")");
  if (cfg.max_new_tokens == 0) return out;
  int64_t P = 0;
  for (auto& p : prompts) {
    if (p.empty()) throw std::invalid_argument("generate: empty prompt (add a BOS token)");
    P = std::max<int64_t>(P, static_cast<int64_t>(p.size()));
  }
  if (P >= mc.max_seq_len)
    throw std::invalid_argument("generate: prompt of " + std::to_string(P) + " tokens leaves no room in max_seq_len " +
                                std::to_string(mc.max_seq_len));
  const int64_t S = std::min<int64_t>(mc.max_seq_len, P + cfg.max_new_tokens);
  // Host-side bookkeeping (ids, masks, positions, sampling) stays on the CPU; forward_cached
  // copies its small inputs to the model's device and only the logits come back each step.
  kv_cache cache = model.make_cache(B, S);

  // left-padded prompt batch and its mask (B, S) (columns beyond the current length unused)
  auto ids = tensor::empty({B, P}, dtype::i32);
  auto mask_full = tensor::zeros({B, S}, dtype::i32);
  std::vector<std::vector<int32_t>> history(B);
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[b];
    int64_t pad = P - static_cast<int64_t>(p.size());
    for (int64_t t = 0; t < P; ++t) {
      ids.data<int32_t>()[b * P + t] = t < pad ? cfg.pad_id : p[t - pad];
      mask_full.data<int32_t>()[b * S + t] = t < pad ? 0 : 1;
    }
    history[b] = p;
  }
  const bool padded = std::any_of(prompts.begin(), prompts.end(),
                                  [&](const auto& p) { return static_cast<int64_t>(p.size()) != P; });
  auto mask_upto = [&](int64_t n) -> tensor {
    if (!padded) return {};
    auto m = tensor::empty({B, n}, dtype::i32);
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(mask_full.data<int32_t>() + b * S, n, m.data<int32_t>() + b * n);
    return m;
  };
  // positions: index among the real tokens of each row
  auto positions_for = [&](int64_t start, int64_t n) {
    auto pos = tensor::empty({B, n}, dtype::i32);
    for (int64_t b = 0; b < B; ++b) {
      int32_t c = 0;
      const int32_t* m = mask_full.data<int32_t>() + b * S;
      for (int64_t s = 0; s < start + n; ++s) {
        if (s >= start) pos.data<int32_t>()[b * n + (s - start)] = std::max(c - (m[s] ? 0 : 1), 0);
        c += m[s] != 0;
      }
    }
    return pos;
  };

  std::vector<rng64> rngs;
  for (int64_t b = 0; b < B; ++b) rngs.emplace_back(cfg.seed + static_cast<uint64_t>(b) + 1);
  std::vector<bool> done(B, false);

  // Rows with equal prompts (GRPO's num_generations answers per prompt) share one prefill
  // (prefill_shared: the same K/V and logits as a prefill of each prompt alone)
  const row_groups groups = group_rows(B, [&](int64_t b) { return prompts[static_cast<size_t>(b)]; });
  tensor logits;
  if (static_cast<int64_t>(groups.first.size()) == B) {
    logits = model.forward_cached(cache, ids, positions_for(0, P), mask_upto(P), 0);
  } else {
    const tensor lu = prefill_shared(model, cache, groups, ids, positions_for(0, P), mask_upto(P), false).to(device::cpu());
    const int64_t Vrow = lu.size(1);
    logits = tensor::empty({B, Vrow});
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(lu.data<float>() + groups.slot[static_cast<size_t>(b)] * Vrow, Vrow, logits.data<float>() + b * Vrow);
  }
  int64_t n_past = P;
  const int64_t V = mc.vocab_limit();
  auto step_ids = tensor::empty({B, 1}, dtype::i32);
  std::vector<float> scratch;  // token_log_prob's scaled row
  for (int64_t step = 0; step < cfg.max_new_tokens; ++step) {
    auto host = logits.to(device::cpu());
    const int64_t Vrow = host.size(1);
    for (int64_t b = 0; b < B; ++b) {
      int32_t next = cfg.pad_id;
      if (!done[b]) {
        float* row = host.data<float>() + b * Vrow;  // this step's copy: the next forward writes new logits
        mask_tokens(row, V, history[b], static_cast<int64_t>(history[b].size()) - step, cfg);
        next = sample_token(row, V, cfg.sampling, rngs[b], history[b]);
        out[b].tokens.push_back(next);
        if (cfg.record_logprobs)  // the trainer's formula (rlhf::gather_log_probs_forward), at the sampling temperature
          out[b].logprobs.push_back(token_log_prob(row, Vrow, next, log_prob_temperature(cfg.sampling), scratch));
        history[b].push_back(next);
        if (std::find(cfg.stop_ids.begin(), cfg.stop_ids.end(), next) != cfg.stop_ids.end()) {
          done[b] = true;
          out[b].stopped = true;
        }
      }
      step_ids.data<int32_t>()[b] = next;
    }
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    if (step + 1 == cfg.max_new_tokens || n_past + 1 > S) break;
    for (int64_t b = 0; b < B; ++b) mask_full.data<int32_t>()[b * S + n_past] = 1;
    logits = model.forward_cached(cache, step_ids, positions_for(n_past, 1), mask_upto(n_past + 1), n_past);
    ++n_past;
  }
  return out;
}

}  // namespace flowrun
