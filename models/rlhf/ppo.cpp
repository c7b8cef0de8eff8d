#include "models/rlhf/ppo.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "models/generate.h"
#include "runtime/kernels/ops.h"

namespace flowrun::ppo {

namespace {

// Columns [a, b) of a (B, T) tensor of f32 or i32, as a new contiguous tensor.
tensor cols(const tensor& t, int64_t a, int64_t b) {
  const int64_t B = t.size(0), T = t.size(1), n = b - a;
  auto out = tensor::empty({B, n}, t.type());
  const size_t es = dtype_size(t.type());
  for (int64_t r = 0; r < B; ++r)
    std::memcpy(static_cast<char*>(out.raw()) + r * n * es, static_cast<const char*>(t.raw()) + (r * T + a) * es,
                n * es);
  return out;
}

// Write src (B, n) into columns [a, a+n) of dst (B, T).
void put_cols(tensor& dst, const tensor& src, int64_t a) {
  const int64_t B = dst.size(0), T = dst.size(1), n = src.size(1);
  for (int64_t r = 0; r < B; ++r)
    std::memcpy(dst.data<float>() + r * T + a, src.data<float>() + r * n, n * sizeof(float));
}

// labels (B, S): seq shifted left by one, the last column 0 (its log-prob is unused).
tensor shifted_labels(const tensor& seq) {
  const int64_t B = seq.size(0), S = seq.size(1);
  auto lab = tensor::zeros({B, S}, dtype::i32);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t + 1 < S; ++t) lab.data<int32_t>()[r * S + t] = seq.data<int32_t>()[r * S + t + 1];
  return lab;
}

}  // namespace

std::optional<experience> generate_rollouts(decoder& actor, const tensor& prompts, const tensor& prompt_mask,
                                            const ppo_settings& s, const std::vector<int32_t>& stop_ids,
                                            int32_t pad_id, uint64_t seed) {
  if (prompts.dim() != 2 || prompt_mask.shape() != prompts.shape())
    throw std::invalid_argument("generate_rollouts: prompts and prompt_mask must be (B, P) i32");
  const int64_t B = prompts.size(0), P = prompts.size(1);
  std::vector<std::vector<int32_t>> rows(B);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < P; ++t)
      if (prompt_mask.data<int32_t>()[b * P + t]) rows[b].push_back(prompts.data<int32_t>()[b * P + t]);
  generation_config g;
  g.sampling.temperature = s.temperature;
  g.sampling.top_k = s.top_k;
  g.sampling.top_p = s.top_p;
  g.max_new_tokens = s.max_answer_seq_len;
  g.seed = seed;
  g.stop_ids = stop_ids;
  g.pad_id = pad_id;
  g.record_logprobs = true;
  auto res = generate(actor, rows, g);
  std::vector<int64_t> keep;
  int64_t A = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (s.drop_short_answers && res[b].tokens.size() <= 1) continue;  // DS-Chat drops answers of at most one valid token
    keep.push_back(b);
    A = std::max<int64_t>(A, static_cast<int64_t>(res[b].tokens.size()));
  }
  if (keep.empty()) return std::nullopt;
  const int64_t K = static_cast<int64_t>(keep.size()), S = P + A;
  experience e;
  e.temperature = log_prob_temperature(g.sampling);
  e.stop_ids = stop_ids;
  e.prompts = tensor::empty({K, P}, dtype::i32);
  e.seq = tensor::empty({K, S}, dtype::i32);
  e.attention_mask = tensor::zeros({K, S}, dtype::i32);
  e.behav_logprobs = tensor::zeros({K, S - 1});  // entry t: the token at t + 1
  for (int64_t k = 0; k < K; ++k) {
    int64_t b = keep[k];
    for (int64_t t = 0; t < P; ++t) {
      int32_t id = prompts.data<int32_t>()[b * P + t];
      e.prompts.data<int32_t>()[k * P + t] = id;
      e.seq.data<int32_t>()[k * S + t] = id;
      e.attention_mask.data<int32_t>()[k * S + t] = prompt_mask.data<int32_t>()[b * P + t];
    }
    const auto& ans = res[b].tokens;
    for (int64_t t = 0; t < A; ++t) {
      bool real = t < static_cast<int64_t>(ans.size());
      e.seq.data<int32_t>()[k * S + P + t] = real ? ans[t] : pad_id;
      e.attention_mask.data<int32_t>()[k * S + P + t] = real ? 1 : 0;
    }
    for (size_t t = 0; t < ans.size(); ++t)
      e.behav_logprobs.data<float>()[k * (S - 1) + P - 1 + static_cast<int64_t>(t)] = res[b].logprobs[t];
    e.answer_len.push_back(static_cast<int64_t>(ans.size()));
    e.source_rows.push_back(b);
  }
  return e;
}

tensor sequence_logprobs(decoder& model, activations& acts, const tensor& seq, const tensor& mask,
                         float temperature, int64_t keep_from) {
  const int64_t S = seq.size(1);
  model.forward(acts, seq, {}, mask, {}, keep_from);
  tensor lp;
  rlhf::gather_log_probs_forward(lp, acts.logits, shifted_labels(seq), temperature, keep_from);
  return cols(lp, 0, S - 1);
}

tensor sequence_values(decoder& model, activations& acts, const tensor& seq, const tensor& mask,
                       int64_t keep_from) {
  if (!model.has_value_head()) throw std::invalid_argument("sequence_values: the model has no value head");
  model.forward(acts, seq, {}, mask, {}, keep_from);
  return cols(acts.values, 0, seq.size(1) - 1);
}

tensor reward_scores(decoder& reward_model, activations& a, const tensor& seq, const tensor& mask,
                     int64_t keep_from) {
  if (!reward_model.has_value_head()) throw std::invalid_argument("reward_scores: the reward model has no value head");
  const int64_t B = seq.size(0), S = seq.size(1);
  std::vector<int64_t> last(static_cast<size_t>(B), S - 1);  // each row's last real token
  int64_t first_last = S - 1;
  for (int64_t b = 0; b < B; ++b) {
    while (last[b] > 0 && mask.data<int32_t>()[b * S + last[b]] == 0) --last[b];
    first_last = std::min(first_last, last[b]);
  }
  // the scores are read at the rows' last tokens: keep from the earliest (answers of one length: one
  // position), or from nothing when one lies before the caller's keep_from
  keep_from = keep_from > 0 && first_last >= keep_from ? first_last : 0;
  reward_model.forward(a, seq, {}, mask, {}, keep_from);
  const tensor values = a.values.to(device::cpu());
  auto out = tensor::empty({B});
  for (int64_t b = 0; b < B; ++b) out.data<float>()[b] = values.data<float>()[b * S + last[b]];
  return out;
}

bool holds_forward_of(const activations& acts, const tensor& seq, const tensor& mask, int64_t keep_from) {
  const auto same = [](const tensor& x, const tensor& y) {
    return x.defined() == y.defined() && (!x.defined() || (x.raw() == y.raw() && x.shape() == y.shape()));
  };
  return acts.ids.defined() && same(acts.ids, seq) && same(acts.mask, mask) && acts.keep_from == keep_from;
}

row_ids rollout_row_ids(const experience& e, int64_t b) {
  const int64_t S = e.seq.size(1), P = e.prompts.size(1);
  const int32_t* seq = e.seq.data<int32_t>() + b * S;
  const int32_t* mask = e.attention_mask.data<int32_t>() + b * S;
  row_ids r;
  for (int64_t t = 0; t < S; ++t)
    if (mask[t]) (t < P ? r.prompt : r.answer).push_back(seq[t]);
  if (!r.answer.empty() && std::find(e.stop_ids.begin(), e.stop_ids.end(), r.answer.back()) != e.stop_ids.end())
    r.answer.pop_back();
  return r;
}

experience slice_rows(const experience& e, int64_t a, int64_t b) {
  experience s;
  s.prompts = e.prompts.rows(a, b);
  s.seq = e.seq.rows(a, b);
  s.attention_mask = e.attention_mask.rows(a, b);
  if (e.logprobs.defined()) s.logprobs = e.logprobs.rows(a, b);
  if (e.ref_logprobs.defined()) s.ref_logprobs = e.ref_logprobs.rows(a, b);
  if (e.values.defined()) s.values = e.values.rows(a, b);
  if (e.reward_score.defined()) s.reward_score = e.reward_score.rows(a, b);
  if (e.behav_logprobs.defined()) s.behav_logprobs = e.behav_logprobs.rows(a, b);
  s.temperature = e.temperature;
  s.answer_len.assign(e.answer_len.begin() + a, e.answer_len.begin() + b);
  if (!e.source_rows.empty()) s.source_rows.assign(e.source_rows.begin() + a, e.source_rows.begin() + b);
  s.stop_ids = e.stop_ids;
  return s;
}

tensor make_advantages(const experience& e, const rlhf::ppo_config& cfg, tensor& advantages, tensor& returns) {
  const int64_t S = e.seq.size(1);
  tensor action_mask = cols(e.attention_mask, 1, S);
  std::vector<int64_t> ends;
  tensor rewards = rlhf::compute_rewards(e.logprobs, e.ref_logprobs, e.reward_score, action_mask, e.start(), cfg, &ends);
  tensor values = e.values.clone();
  tensor r = rewards.clone();
  rlhf::zero_after_ends(r, values, ends);
  rlhf::advantages_and_returns(advantages, returns, values, r, e.start(), cfg);
  return rewards;
}

double default_kl_ctl(const std::string& estimator) {
  if (estimator == "grpo" || estimator == "rloo") return 0.0;
  if (estimator == "reinforce_plus_plus") return 0.001;
  return 0.1;
}

advantage_estimator parse_advantage_estimator(const std::string& s) {
  if (s == "gae") return advantage_estimator::gae;
  if (s == "grpo") return advantage_estimator::grpo;
  if (s == "rloo") return advantage_estimator::rloo;
  if (s == "reinforce_plus_plus") return advantage_estimator::reinforce_plus_plus;
  throw std::invalid_argument("advantage_estimator = \"" + s +
                              "\": expected \"gae\", \"grpo\", \"rloo\" or \"reinforce_plus_plus\"");
}

tensor critic_free_advantages(const experience& e, const critic_free_config& c) {
  const int64_t B = e.seq.size(0), S = e.seq.size(1), L = S - 1, start = e.start(), n = L - start;
  const tensor mask = cols(e.attention_mask, start + 1, S);  // (B, n) the answer's real tokens
  const int32_t* m = mask.data<int32_t>();
  const bool ref = e.ref_logprobs.defined();  // else no reference model: no KL term
  if (!ref && c.ppo.kl_ctl > 0)
    throw std::invalid_argument("critic_free_advantages: kl_ctl > 0 needs the reference's log-probs");
  if (c.estimator == advantage_estimator::reinforce_plus_plus) {
    // veRL's token_level_rewards: −kl_ctl · KL on each answer token, the score on the last one
    // (not DS-Chat's index one past it, which REINFORCE++'s masked returns would drop)
    auto tr = tensor::zeros({B, n});  // (B, n)
    for (int64_t b = 0; b < B; ++b) {
      int64_t last = -1;
      for (int64_t t = 0; t < n; ++t)
        if (m[b * n + t]) {
          if (ref)
            tr.data<float>()[b * n + t] = -c.ppo.kl_ctl * (e.logprobs.data<float>()[b * L + start + t] -
                                                           e.ref_logprobs.data<float>()[b * L + start + t]);
          last = t;
        }
      if (last >= 0)
        tr.data<float>()[b * n + last] +=
            std::clamp(e.reward_score.data<float>()[b], -c.ppo.clip_reward_value, c.ppo.clip_reward_value);
    }
    return rlhf::reinforce_pp_advantages(tr, mask, c.ppo.gamma);
  }
  if (c.estimator == advantage_estimator::gae)
    throw std::invalid_argument("critic_free_advantages: gae needs the critic (make_advantages)");
  if (c.num_generations < 1 || B % c.num_generations != 0)
    throw std::invalid_argument("critic_free_advantages: " + std::to_string(B) + " rows are not groups of " +
                                "num_generations = " + std::to_string(c.num_generations));
  auto R = tensor::empty({B});  // (B) sequence rewards
  for (int64_t b = 0; b < B; ++b) {
    double kl = 0;
    for (int64_t t = 0; ref && t < n; ++t)
      if (m[b * n + t])
        kl += static_cast<double>(e.logprobs.data<float>()[b * L + start + t]) -
              e.ref_logprobs.data<float>()[b * L + start + t];
    R.data<float>()[b] = static_cast<float>(e.reward_score.data<float>()[b] - c.ppo.kl_ctl * kl);
  }
  tensor a;
  if (c.estimator == advantage_estimator::grpo) {
    rlhf::group_advantage_config g;
    g.num_generations = c.num_generations;
    g.scale_rewards = c.scale_rewards;
    g.epsilon = c.epsilon;
    a = rlhf::group_advantages(R, g);
  } else {
    a = rlhf::rloo_advantages(R, c.num_generations);
  }
  auto out = tensor::zeros({B, n});  // (B, n): the row's advantage on each of its answer tokens
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t)
      if (m[b * n + t]) out.data<float>()[b * n + t] = a.data<float>()[b];
  return out;
}

experience take_rows(const experience& e, const std::vector<int64_t>& rows) {
  auto pick = [&](const tensor& t) {
    if (!t.defined()) return tensor();
    shape_t sh = t.shape();
    sh[0] = static_cast<int64_t>(rows.size());
    auto out = tensor::empty(sh, t.type());
    for (size_t i = 0; i < rows.size(); ++i) out.rows(static_cast<int64_t>(i), static_cast<int64_t>(i) + 1).copy_from(t.rows(rows[i], rows[i] + 1));
    return out;
  };
  experience s;
  s.prompts = pick(e.prompts);
  s.seq = pick(e.seq);
  s.attention_mask = pick(e.attention_mask);
  s.logprobs = pick(e.logprobs);
  s.ref_logprobs = pick(e.ref_logprobs);
  s.values = pick(e.values);
  s.reward_score = pick(e.reward_score);
  s.behav_logprobs = pick(e.behav_logprobs);
  s.temperature = e.temperature;
  for (auto r : rows) {
    s.answer_len.push_back(e.answer_len.at(static_cast<size_t>(r)));
    if (!e.source_rows.empty()) s.source_rows.push_back(e.source_rows.at(static_cast<size_t>(r)));
  }
  return s;
}

std::vector<size_t> fresh_items(const std::vector<int64_t>& sampled_with, int64_t version, int64_t max_staleness,
                                bool drop, int64_t& staleness) {
  std::vector<size_t> keep;
  staleness = 0;
  for (size_t i = 0; i < sampled_with.size(); ++i) {
    const int64_t s = version - sampled_with[i];
    if (max_staleness > 0) staleness = std::max(staleness, s);
    if (!(max_staleness > 0 && drop && s > max_staleness)) keep.push_back(i);
  }
  return keep;
}

micro_slice micro_slice_of(int64_t B, int64_t M, int64_t k) {
  if (B < 1 || M < 1 || k < 0 || k >= M)
    throw std::invalid_argument("micro_slice_of: micro-batch " + std::to_string(k) + " of " + std::to_string(M) +
                                " over " + std::to_string(B) + " rows");
  const int64_t c = (B + M - 1) / M;
  micro_slice m;
  m.a = k * c;
  m.b = std::min(B, m.a + c);
  if (m.a >= B) m = {B - 1, B, true};
  return m;
}

namespace {

// The units of micro-batch k of the actor's and the critic's losses: its answer tokens
// (attention_mask columns start+1 .. S-1 of its rows) for token means, or with `rows` its rows
// with at least one answer token (the seq-mean modes); 0 for an empty micro-batch.
std::function<int64_t(int64_t)> answer_units(const experience& e, int64_t M, bool rows = false) {
  return [e, M, rows](int64_t k) {
    const auto m = micro_slice_of(e.seq.size(0), M, k);
    if (m.empty) return int64_t{0};
    const int64_t S = e.seq.size(1);
    int64_t n = 0;
    for (int64_t r = m.a; r < m.b; ++r) {
      int64_t tokens = 0;
      for (int64_t t = e.start() + 1; t < S; ++t) tokens += e.attention_mask.data<int32_t>()[r * S + t] != 0;
      n += rows ? (tokens > 0) : tokens;
    }
    return n;
  };
}

// Micro-batch k's forward into `a`, or none when the caller scored exactly these rows into `a`
// with the current weights (`scored`, micro-batch 0 only; see actor_batch_loss).
void forward_unless_scored(decoder& model, activations& a, const experience& sub, int64_t k, bool scored) {
  const bool dropout = model.has_lora() && model.lora().lora_dropout > 0.0f;
  if (scored && k == 0 && !dropout && holds_forward_of(a, sub.seq, sub.attention_mask, sub.start())) return;
  model.forward(a, sub.seq, {}, sub.attention_mask, {}, sub.start());  // the loss reads the answer's columns
}

}  // namespace

batch_loss actor_batch_loss(const experience& e, const tensor& advantages, float cliprange,
                            const policy_loss_settings& p, int64_t M, bool scored) {
  const int64_t B = e.seq.size(0);
  if (p.use_kl_loss && !e.ref_logprobs.defined())
    throw std::invalid_argument("actor_batch_loss: use_kl_loss needs the reference log-probs");
  batch_loss l;
  l.units = answer_units(e, M, /*rows=*/p.loss_agg_mode != rlhf::loss_agg_mode::token_mean);
  l.forward = [e, advantages, cliprange, p, B, M, scored](int64_t k, decoder& actor, activations& a) {
    const auto m = micro_slice_of(B, M, k);
    const experience sub = slice_rows(e, m.a, m.b);
    const int64_t rows = m.b - m.a, S = sub.seq.size(1), L = S - 1, start = sub.start();
    // (rows, S, V) logits -> log p of the taken tokens (rows, S); the answer part (rows, n)
    forward_unless_scored(actor, a, sub, k, scored);
    const tensor labels = shifted_labels(sub.seq);
    tensor lp;
    rlhf::gather_log_probs_forward(lp, a.logits, labels, sub.temperature, start);
    const tensor lp_ans = cols(lp, start, L);
    rlhf::check_finite(lp_ans, "policy", "actor_log_prob");
    tensor dlp_ans;
    micro_loss r;
    const tensor mask = cols(sub.attention_mask, start + 1, S);
    rlhf::policy_loss_config c;
    c.clip_ratio_low = cliprange;
    c.clip_ratio_high = p.clip_ratio_high > 0 ? p.clip_ratio_high : cliprange;
    c.clip_ratio_c = p.clip_ratio_c;
    c.agg = p.loss_agg_mode;
    c.behav_imp_weight_cap = p.behav_imp_weight_cap;
    tensor behav;  // decoupled PPO: the generator's log-probs; sub.logprobs are the proximal policy's
    if (p.decoupled) {
      if (!sub.behav_logprobs.defined())
        throw std::invalid_argument("actor_batch_loss: decoupled PPO needs the generator's behav_logprobs");
      behav = cols(sub.behav_logprobs, start, L);
    }
    r.loss = rlhf::clipped_policy_loss(lp_ans, cols(sub.logprobs, start, L), advantages.rows(m.a, m.b), mask, c,
                                       &dlp_ans, p.decoupled ? &behav : nullptr).loss;
    if (p.use_kl_loss) {  // veRL: policy_loss + kl_loss_coef x agg_loss(kl_penalty(logprob, ref_logprob))
      tensor dkl, dagg;
      const tensor kl = rlhf::kl_estimate(lp_ans, cols(sub.ref_logprobs, start, L), p.kl_loss_type, &dkl);
      r.loss += p.kl_loss_coef * rlhf::aggregate_loss(kl, mask, p.loss_agg_mode, &dagg);
      float* d = dlp_ans.data<float>();
      for (int64_t i = 0; i < dlp_ans.numel(); ++i)
        d[i] += static_cast<float>(p.kl_loss_coef) * dagg.data<float>()[i] * dkl.data<float>()[i];
    }
    auto dlp = tensor::zeros({rows, S});
    put_cols(dlp, dlp_ans, start);
    rlhf::gather_log_probs_backward(r.dout, dlp, a.logits, labels, sub.temperature, start);  // (rows, S, V)
    return r;
  };
  return l;
}

batch_loss critic_batch_loss(const experience& e, const tensor& returns, float cliprange_value, int64_t M,
                             bool scored) {
  const int64_t B = e.seq.size(0);
  batch_loss l;
  l.units = answer_units(e, M);
  l.forward = [e, returns, cliprange_value, B, M, scored](int64_t k, decoder& critic, activations& a) {
    if (!critic.has_value_head()) throw std::invalid_argument("critic_batch_loss: the model has no value head");
    const auto m = micro_slice_of(B, M, k);
    const experience sub = slice_rows(e, m.a, m.b);
    const int64_t rows = m.b - m.a, S = sub.seq.size(1), L = S - 1, start = sub.start();
    forward_unless_scored(critic, a, sub, k, scored);  // values (rows, S)
    const tensor v = cols(a.values, start, L);
    rlhf::check_finite(v, "critic", "values");
    tensor dv;
    micro_loss r;
    r.loss = rlhf::critic_loss(v, cols(sub.values, start, L), returns.rows(m.a, m.b),
                               cols(sub.attention_mask, start + 1, S), cliprange_value, &dv);
    r.dout = tensor::zeros({rows, S});
    put_cols(r.dout, dv, start);
    return r;
  };
  return l;
}

batch_loss ptx_batch_loss(const tensor& ids, const tensor& labels, float unsup_coef, int64_t M) {
  const int64_t B = ids.size(0);
  batch_loss l;
  l.units = [labels, B, M](int64_t k) {
    const auto m = micro_slice_of(B, M, k);
    if (m.empty) return int64_t{0};
    int64_t n = 0;
    const tensor lab = labels.rows(m.a, m.b);
    for (int64_t i = 0; i < lab.numel(); ++i) n += lab.data<int32_t>()[i] >= 0;
    return n;
  };
  l.forward = [ids, labels, unsup_coef, B, M](int64_t k, decoder& actor, activations& a) {
    const auto m = micro_slice_of(B, M, k);
    const tensor mi = ids.rows(m.a, m.b), ml = labels.rows(m.a, m.b);
    micro_loss r;
    r.loss = actor.forward(a, mi, ml);  // mean cross-entropy over the valid labels
    const int64_t N = mi.numel(), V = actor.config().vocab_size;
    r.dout = tensor::empty({N, V});
    const float dloss = a.n_valid > 0 ? unsup_coef / static_cast<float>(a.n_valid) : 0.0f;
    ops::cross_entropy_backward(r.dout, a.logits.view({N, V}), ml.view({N}), dloss);
    return r;
  };
  return l;
}

namespace {
int64_t micro_batches(const zero_engine& engine) {
  return engine.settings().gradient_accumulation_steps * engine.world_size();
}
}  // namespace

step_result actor_update(zero_engine& engine, const experience& e, const tensor& advantages, const ppo_settings& s,
                         double lr, bool scored) {
  return engine.train_step(actor_batch_loss(e, advantages, s.ppo.cliprange, s.policy, micro_batches(engine), scored),
                           lr);
}

step_result critic_update(zero_engine& engine, const experience& e, const tensor& returns, const ppo_settings& s,
                          double lr, bool scored) {
  return engine.train_step(critic_batch_loss(e, returns, s.ppo.cliprange_value, micro_batches(engine), scored), lr);
}

step_result ptx_update(zero_engine& engine, const tensor& ids, const tensor& labels, const ppo_settings& s,
                       double lr) {
  return engine.train_step(ptx_batch_loss(ids, labels, s.unsup_coef, micro_batches(engine)), lr);
}

double mean_kl(const experience& e) {
  if (!e.ref_logprobs.defined()) return 0.0;  // no reference model
  const int64_t B = e.seq.size(0), S = e.seq.size(1), L = S - 1, start = e.start();
  double s = 0, n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = start; t < L; ++t)
      if (e.attention_mask.data<int32_t>()[b * S + t + 1]) {
        s += static_cast<double>(e.logprobs.data<float>()[b * L + t]) - e.ref_logprobs.data<float>()[b * L + t];
        n += 1;
      }
  return n > 0 ? s / n : 0.0;
}

}  // namespace flowrun::ppo
