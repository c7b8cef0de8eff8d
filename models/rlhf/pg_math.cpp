// Critic-free RL and DPO math: formulas and sources in pg_math.h.
#include "models/rlhf/pg_math.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace flowrun::rlhf {

namespace {

void need(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

void need_pair(const tensor& a, const tensor& mask, const char* fn, const char* an) {
  need(a.dim() == 2, std::string(fn) + ": " + an + " must be (B, n), got " + a.str());
  need(a.type() == dtype::f32, std::string(fn) + ": " + an + " must be f32");
  need(mask.shape() == a.shape() && mask.type() == dtype::i32,
       std::string(fn) + ": mask must be (B, n) i32 like " + an + ", got " + mask.str());
}

void need_same(const tensor& a, const tensor& b, const char* fn, const char* an, const char* bn) {
  need(a.shape() == b.shape() && b.type() == dtype::f32,
       std::string(fn) + ": " + an + " " + a.str() + " and " + bn + " " + b.str() + " must have the same shape (f32)");
}

// The groups of `rewards` (N, f32): k adjacent samples each.
const float* grouped(const tensor& rewards, int64_t k, const char* fn, const char* what) {
  need(rewards.dim() == 1 && rewards.type() == dtype::f32, std::string(fn) + ": rewards must be (N) f32, got " +
                                                               rewards.str());
  need(k >= 2, std::string(fn) + ": num_generations = " + std::to_string(k) + ", but " + what +
                   " needs at least 2 samples per prompt (one sample has no group to compare with)");
  need(rewards.numel() % k == 0, std::string(fn) + ": " + std::to_string(rewards.numel()) +
                                     " rewards are not whole groups of num_generations = " + std::to_string(k));
  return rewards.data<float>();
}

// Two-pass mean of x[0..n) taken from x[0]: exactly x[0] when all are equal.
double shifted_mean(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 1; i < n; ++i) s += static_cast<double>(x[i]) - x[0];
  return x[0] + s / static_cast<double>(n);
}

// Bessel std of x[0..n) around mean m (two-pass).
double bessel_std(const float* x, int64_t n, double m) {
  if (n < 2) return 0.0;
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += (x[i] - m) * (x[i] - m);
  return std::sqrt(ss / static_cast<double>(n - 1));
}

// Each real token's divisor under `mode` (0 on padding and on rows skipped):
// loss = Σ_rows Σ_t l / divisor. token-mean: the batch's real-token count (the
// sum is divided once, as DeepSpeed-Chat's actor loss does); seq-mean-token-mean:
// the row's count times the rows with a real token; seq-mean-token-sum: those rows.
// Returns false when nothing is real.
bool token_divisors(const int32_t* m, int64_t B, int64_t n, loss_agg_mode mode, std::vector<double>& div) {
  div.assign(static_cast<std::size_t>(B * n), 0.0);
  std::vector<double> row(static_cast<std::size_t>(B), 0.0);  // real tokens per row
  double cnt = 0, rows = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < n; ++t) row[b] += m[b * n + t] != 0;
    cnt += row[b];
    rows += row[b] > 0;
  }
  if (cnt == 0) return false;
  for (int64_t b = 0; b < B; ++b) {
    const double d = mode == loss_agg_mode::token_mean            ? cnt
                     : mode == loss_agg_mode::seq_mean_token_mean ? row[b] * rows
                                                                  : rows;
    for (int64_t t = 0; t < n; ++t)
      if (m[b * n + t]) div[b * n + t] = d;
  }
  return true;
}

// The aggregate of per-token losses l (double) with the divisors above; token-mean
// sums first and divides once.
double aggregate(const std::vector<double>& l, const std::vector<double>& div, loss_agg_mode mode) {
  double total = 0;
  if (mode == loss_agg_mode::token_mean) {
    double d = 0;
    for (std::size_t i = 0; i < l.size(); ++i)
      if (div[i] != 0) total += l[i], d = div[i];
    return d != 0 ? total / d : 0.0;
  }
  for (std::size_t i = 0; i < l.size(); ++i)
    if (div[i] != 0) total += l[i] / div[i];
  return total;
}

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

}  // namespace

// -- advantages -----------------------------------------------------------------------------

reward_scaling parse_reward_scaling(const std::string& s) {
  if (s == "group") return reward_scaling::group;
  if (s == "batch") return reward_scaling::batch;
  if (s == "none") return reward_scaling::none;
  throw std::invalid_argument("scale_rewards = \"" + s + "\": expected \"group\", \"batch\" or \"none\"");
}

tensor group_advantages(const tensor& rewards, const group_advantage_config& cfg) {
  const int64_t k = cfg.num_generations;
  const float* r = grouped(rewards, k, "group_advantages", "GRPO");
  need(cfg.epsilon >= 0 && std::isfinite(cfg.epsilon), "group_advantages: epsilon must be finite and >= 0");
  const int64_t N = rewards.numel();
  auto out = tensor::empty({N});
  float* a = out.data<float>();
  double batch_std = 0;
  if (cfg.scale_rewards == reward_scaling::batch) batch_std = bessel_std(r, N, shifted_mean(r, N));
  for (int64_t g = 0; g < N; g += k) {
    const double m = shifted_mean(r + g, k);
    double scale = 1.0;
    if (cfg.scale_rewards == reward_scaling::group) scale = bessel_std(r + g, k, m) + cfg.epsilon;
    if (cfg.scale_rewards == reward_scaling::batch) scale = batch_std + cfg.epsilon;
    for (int64_t i = g; i < g + k; ++i) {
      const double centred = r[i] - m;
      a[i] = static_cast<float>(centred == 0.0 ? 0.0 : centred / scale);
    }
  }
  return out;
}

tensor rloo_advantages(const tensor& rewards, int64_t num_generations) {
  const int64_t k = num_generations;
  const float* r = grouped(rewards, k, "rloo_advantages", "RLOO");
  const int64_t N = rewards.numel();
  auto out = tensor::empty({N});
  float* a = out.data<float>();
  const double f = static_cast<double>(k) / static_cast<double>(k - 1);
  for (int64_t g = 0; g < N; g += k) {
    const double m = shifted_mean(r + g, k);
    for (int64_t i = g; i < g + k; ++i) a[i] = static_cast<float>(f * (r[i] - m));
  }
  return out;
}

std::vector<bool> groups_with_signal(const tensor& rewards, int64_t num_generations) {
  const int64_t k = num_generations;
  const float* r = grouped(rewards, k, "groups_with_signal", "dynamic filtering");
  std::vector<bool> keep;
  for (int64_t g = 0; g < rewards.numel(); g += k)
    keep.push_back(std::any_of(r + g + 1, r + g + k, [&](float x) { return x != r[g]; }));
  return keep;
}

tensor reinforce_pp_advantages(const tensor& token_rewards, const tensor& mask, double gamma) {
  need_pair(token_rewards, mask, "reinforce_pp_advantages", "token_rewards");
  need(gamma >= 0 && gamma <= 1, "reinforce_pp_advantages: gamma must be in [0, 1]");
  const int64_t B = token_rewards.size(0), n = token_rewards.size(1);
  const float* r = token_rewards.data<float>();
  const int32_t* m = mask.data<int32_t>();
  std::vector<double> G(static_cast<std::size_t>(B * n), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    double running = 0;
    for (int64_t t = n - 1; t >= 0; --t) {
      running = r[b * n + t] + gamma * running;
      G[b * n + t] = running;
      if (m[b * n + t] == 0) running = 0;  // veRL: running_return * response_mask[:, t]
    }
  }
  // masked_whiten: mean and Bessel-corrected variance over the real tokens
  double cnt = 0, sum = 0;
  for (int64_t i = 0; i < B * n; ++i)
    if (m[i]) cnt += 1, sum += G[i];
  auto out = tensor::empty({B, n});
  float* a = out.data<float>();
  if (cnt == 0) {
    std::fill(a, a + B * n, 0.0f);
    return out;
  }
  const double mean = sum / cnt;
  double ss = 0;
  for (int64_t i = 0; i < B * n; ++i)
    if (m[i]) ss += (G[i] - mean) * (G[i] - mean);
  const double var = cnt > 1 ? ss / (cnt - 1) : 0.0;
  const double inv = 1.0 / std::sqrt(var + 1e-8);
  for (int64_t i = 0; i < B * n; ++i) a[i] = m[i] ? static_cast<float>((G[i] - mean) * inv) : 0.0f;
  return out;
}

// -- KL estimators ----------------------------------------------------------------------------

kl_estimator parse_kl_estimator(const std::string& s) {
  if (s == "k1" || s == "kl") return kl_estimator::k1;
  if (s == "k2" || s == "mse") return kl_estimator::k2;
  if (s == "k3" || s == "low_var_kl") return kl_estimator::k3;
  if (s == "abs") return kl_estimator::abs;
  throw std::invalid_argument("kl estimator \"" + s + "\": expected \"k1\" (\"kl\"), \"k2\" (\"mse\"), \"k3\" "
                              "(\"low_var_kl\") or \"abs\"");
}

tensor kl_estimate(const tensor& logprobs, const tensor& ref_logprobs, kl_estimator k, tensor* dlogprobs) {
  need(logprobs.type() == dtype::f32, "kl_estimate: logprobs must be f32");
  need_same(logprobs, ref_logprobs, "kl_estimate", "logprobs", "ref_logprobs");
  const int64_t N = logprobs.numel();
  auto out = tensor::empty(logprobs.shape());
  if (dlogprobs && (!dlogprobs->defined() || dlogprobs->shape() != logprobs.shape()))
    *dlogprobs = tensor::empty(logprobs.shape());
  const float* lp = logprobs.data<float>();
  const float* rp = ref_logprobs.data<float>();
  float* o = out.data<float>();
  float* d = dlogprobs ? dlogprobs->data<float>() : nullptr;
  for (int64_t i = 0; i < N; ++i) {
    const double x = static_cast<double>(lp[i]) - rp[i];
    double v = 0, g = 0;
    switch (k) {
      case kl_estimator::k1: v = x, g = 1; break;
      case kl_estimator::k2: v = 0.5 * x * x, g = x; break;
      case kl_estimator::abs: v = std::fabs(x), g = x > 0 ? 1 : (x < 0 ? -1 : 0); break;
      case kl_estimator::k3: {
        // veRL: kl = ref − logp clamped to ±20; kld = exp(kl) − kl − 1 clamped to ±10
        const double y = -x, yc = std::clamp(y, -20.0, 20.0);
        const double kld = std::exp(yc) - yc - 1.0;
        v = std::clamp(kld, -10.0, 10.0);
        // d/dlogp = −d/dy = −(exp(y) − 1) inside both clamps
        g = (y > -20.0 && y < 20.0 && kld > -10.0 && kld < 10.0) ? 1.0 - std::exp(yc) : 0.0;
        break;
      }
    }
    o[i] = static_cast<float>(v);
    if (d) d[i] = static_cast<float>(g);
  }
  return out;
}

// -- loss aggregation -------------------------------------------------------------------------

loss_agg_mode parse_loss_agg_mode(const std::string& s) {
  if (s == "token-mean") return loss_agg_mode::token_mean;
  if (s == "seq-mean-token-mean") return loss_agg_mode::seq_mean_token_mean;
  if (s == "seq-mean-token-sum") return loss_agg_mode::seq_mean_token_sum;
  // veRL's Dr. GRPO mode divides the batch's token sum by the padded response length (loss_mask.shape[-1],
  // its max_response_length), not by the rows: seq-mean-token-sum times rows / that length, the same gradient
  // direction, a constant factor while the rows per update are constant (not under filter_groups)
  const std::string norm = s == "seq-mean-token-sum-norm"
                               ? " (veRL's seq-mean-token-sum-norm is seq-mean-token-sum here times rows / the padded "
                                 "response length, max_answer_seq_len: a constant factor while the rows per update "
                                 "are, so use seq-mean-token-sum and scale the learning rate)"
                               : "";
  throw std::invalid_argument("loss_agg_mode = \"" + s +
                              "\": expected \"token-mean\", \"seq-mean-token-mean\" or \"seq-mean-token-sum\"" + norm);
}

double aggregate_loss(const tensor& losses, const tensor& mask, loss_agg_mode mode, tensor* dlosses) {
  need_pair(losses, mask, "aggregate_loss", "losses");
  const int64_t B = losses.size(0), n = losses.size(1);
  const float* l = losses.data<float>();
  std::vector<double> div;
  const bool any = token_divisors(mask.data<int32_t>(), B, n, mode, div);
  if (dlosses) {
    if (!dlosses->defined() || dlosses->shape() != losses.shape()) *dlosses = tensor::empty(losses.shape());
    float* d = dlosses->data<float>();
    for (int64_t i = 0; i < B * n; ++i) d[i] = div[i] != 0 ? static_cast<float>(1.0 / div[i]) : 0.0f;
  }
  if (!any) return 0.0;
  return aggregate(std::vector<double>(l, l + B * n), div, mode);
}

// -- the clipped policy loss with dual clip ---------------------------------------------------

policy_loss_result clipped_policy_loss(const tensor& logprobs, const tensor& old_logprobs, const tensor& advantages,
                                       const tensor& mask, const policy_loss_config& cfg, tensor* dlogprobs,
                                       const tensor* behav_logprobs) {
  need_pair(logprobs, mask, "clipped_policy_loss", "logprobs");
  need_same(logprobs, old_logprobs, "clipped_policy_loss", "logprobs", "old_logprobs");
  need_same(logprobs, advantages, "clipped_policy_loss", "logprobs", "advantages");
  if (behav_logprobs) need_same(logprobs, *behav_logprobs, "clipped_policy_loss", "logprobs", "behav_logprobs");
  need(cfg.behav_imp_weight_cap == 0 || cfg.behav_imp_weight_cap > 1,
       "clipped_policy_loss: behav_imp_weight_cap = " + std::to_string(cfg.behav_imp_weight_cap) +
           " must be greater than 1 (AReaL's bound), or 0 for no cap");
  need(cfg.clip_ratio_low >= 0 && cfg.clip_ratio_low < 1 && cfg.clip_ratio_high >= 0,
       "clipped_policy_loss: clip_ratio_low must be in [0, 1) and clip_ratio_high >= 0");
  need(cfg.clip_ratio_c == 0 || cfg.clip_ratio_c > 1,
       "clipped_policy_loss: clip_ratio_c = " + std::to_string(cfg.clip_ratio_c) +
           " must be greater than 1 (veRL's bound), or 0 to turn the dual clip off");
  const int64_t N = logprobs.numel();
  const float* lp = logprobs.data<float>();
  const float* olp = old_logprobs.data<float>();
  const float* A = advantages.data<float>();
  const int32_t* m = mask.data<int32_t>();
  const float* blp = behav_logprobs ? behav_logprobs->data<float>() : nullptr;
  std::vector<double> per_token(static_cast<std::size_t>(N), 0.0), dtoken(static_cast<std::size_t>(N), 0.0);
  double cnt = 0, clipped = 0, dual = 0, kl = 0, wsum = 0, capped = 0;
  const double lo = 1.0 - cfg.clip_ratio_low, hi = 1.0 + cfg.clip_ratio_high;
  for (int64_t i = 0; i < N; ++i) {
    if (!m[i]) continue;
    const double x = static_cast<double>(lp[i]) - olp[i];
    const double ratio = std::exp(std::clamp(x, -20.0, 20.0)), a = A[i];
    const double l1 = -a * ratio, l2 = -a * std::clamp(ratio, lo, hi);
    const bool took_clip = l2 > l1;
    double loss = std::max(l1, l2);
    // the gradient of max(l1, l2): l1's where it decides or the clamp is inactive (then l1 = l2)
    double g = (!took_clip || (ratio > lo && ratio < hi)) ? -a * ratio : 0.0;
    bool took_dual = false;
    if (cfg.clip_ratio_c > 0 && a < 0) {
      const double l3 = -a * cfg.clip_ratio_c;
      if (l3 < loss) loss = l3, g = 0.0, took_dual = true;
    }
    if (x <= -20.0 || x >= 20.0) g = 0.0;  // the log-ratio clamp holds
    if (blp) {  // decoupled PPO: the behaviour importance weight, a constant of the update
      double w = std::exp(std::clamp(static_cast<double>(olp[i]) - blp[i], -20.0, 20.0));
      if (cfg.behav_imp_weight_cap > 0 && w > cfg.behav_imp_weight_cap) w = 0.0, capped += 1;
      loss *= w;
      g *= w;
      wsum += w;
    }
    per_token[i] = loss;
    dtoken[i] = g;
    cnt += 1;
    clipped += took_clip;
    dual += took_dual;
    kl += -x;
  }
  policy_loss_result res;
  std::vector<double> div;
  const bool any = token_divisors(m, logprobs.size(0), logprobs.size(1), cfg.agg, div);
  if (dlogprobs) {
    if (!dlogprobs->defined() || dlogprobs->shape() != logprobs.shape()) *dlogprobs = tensor::empty(logprobs.shape());
    float* d = dlogprobs->data<float>();
    for (int64_t i = 0; i < N; ++i) d[i] = div[i] != 0 ? static_cast<float>(dtoken[i] / div[i]) : 0.0f;
  }
  if (!any) return res;
  res.loss = aggregate(per_token, div, cfg.agg);
  res.clipfrac = clipped / cnt;
  res.dual_clip_frac = dual / cnt;
  res.approx_kl = kl / cnt;
  if (blp) res.behav_weight = wsum / cnt, res.behav_capped_frac = capped / cnt;
  return res;
}

// -- DPO ---------------------------------------------------------------------------------------

dpo_loss_type parse_dpo_loss_type(const std::string& s) {
  if (s == "sigmoid") return dpo_loss_type::sigmoid;
  if (s == "ipo") return dpo_loss_type::ipo;
  throw std::invalid_argument("loss_type = \"" + s + "\": expected \"sigmoid\" or \"ipo\"");
}

dpo_result dpo_loss(const tensor& pc, const tensor& pr, const tensor& rc, const tensor& rr, const dpo_config& cfg,
                    tensor* dchosen, tensor* drejected, const tensor* chosen_tokens, const tensor* rejected_tokens) {
  need(pc.dim() == 1 && pc.type() == dtype::f32, "dpo_loss: policy_chosen must be (B) f32, got " + pc.str());
  need_same(pc, pr, "dpo_loss", "policy_chosen", "policy_rejected");
  need_same(pc, rc, "dpo_loss", "policy_chosen", "ref_chosen");
  need_same(pc, rr, "dpo_loss", "policy_chosen", "ref_rejected");
  need(cfg.beta > 0 && std::isfinite(cfg.beta), "dpo_loss: beta must be > 0");
  need(cfg.label_smoothing >= 0 && cfg.label_smoothing < 0.5, "dpo_loss: label_smoothing must be in [0, 0.5)");
  for (const tensor* n : {chosen_tokens, rejected_tokens})
    need(!n || (n->dim() == 1 && n->type() == dtype::f32 && n->numel() == pc.numel()),
         "dpo_loss: chosen_tokens / rejected_tokens must be (B) f32 like policy_chosen");
  // IPO's per-side token counts (TRL: completion_mask.sum(dim=1).clamp(min=1)); 1 without them
  auto tokens = [](const tensor* n, int64_t i) {
    return n ? std::max(1.0, static_cast<double>(n->data<float>()[i])) : 1.0;
  };
  const int64_t B = pc.numel();
  const float *c = pc.data<float>(), *r = pr.data<float>(), *c0 = rc.data<float>(), *r0 = rr.data<float>();
  dpo_result res;
  for (tensor* t : {dchosen, drejected})
    if (t && (!t->defined() || t->shape() != pc.shape())) *t = tensor::empty(pc.shape());
  if (B == 0) return res;
  const double beta = cfg.beta, eps = cfg.label_smoothing;
  double total = 0, correct = 0;
  for (int64_t i = 0; i < B; ++i) {
    const double cr = static_cast<double>(c[i]) - c0[i], rj = static_cast<double>(r[i]) - r0[i];
    const double z = cr - rj;
    double loss = 0, dc = 0, dr = 0;  // the pair's loss, d it / d policy_chosen[i], policy_rejected[i]
    if (cfg.loss_type == dpo_loss_type::sigmoid) {
      loss = -(1 - eps) * log_sigmoid(beta * z) - eps * log_sigmoid(-beta * z);
      dc = -(1 - eps) * beta * sigmoid(-beta * z) + eps * beta * sigmoid(beta * z);
      dr = -dc;
    } else {  // each side's log-ratio per counted token
      const double nc = tokens(chosen_tokens, i), nr = tokens(rejected_tokens, i);
      const double u = cr / nc - rj / nr - 1.0 / (2.0 * beta);
      loss = u * u;
      dc = 2.0 * u / nc;
      dr = -2.0 * u / nr;
    }
    total += loss;
    res.chosen_rewards.push_back(static_cast<float>(beta * cr));
    res.rejected_rewards.push_back(static_cast<float>(beta * rj));
    correct += beta * cr > beta * rj;
    if (dchosen) dchosen->data<float>()[i] = static_cast<float>(dc / B);
    if (drejected) drejected->data<float>()[i] = static_cast<float>(dr / B);
  }
  res.loss = total / B;
  res.accuracy = correct / B;
  return res;
}

tensor sequence_log_probs(const tensor& token_logprobs, const tensor& mask, bool average) {
  need_pair(token_logprobs, mask, "sequence_log_probs", "token_logprobs");
  const int64_t B = token_logprobs.size(0), n = token_logprobs.size(1);
  const float* lp = token_logprobs.data<float>();
  const int32_t* m = mask.data<int32_t>();
  auto out = tensor::empty({B});
  float* o = out.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    double s = 0, cnt = 0;
    for (int64_t t = 0; t < n; ++t)
      if (m[b * n + t]) s += lp[b * n + t], cnt += 1;
    o[b] = static_cast<float>(average ? (cnt > 0 ? s / cnt : 0.0) : s);
  }
  return out;
}

void mask_before_divergence(tensor& chosen_mask, tensor& rejected_mask, const tensor& chosen_ids,
                            const tensor& rejected_ids) {
  need(chosen_ids.dim() == 2 && chosen_ids.type() == dtype::i32, "mask_before_divergence: ids must be (B, T) i32");
  for (const tensor* t : {&rejected_ids, static_cast<const tensor*>(&chosen_mask), static_cast<const tensor*>(&rejected_mask)})
    need(t->shape() == chosen_ids.shape() && t->type() == dtype::i32,
         "mask_before_divergence: ids and masks must all be (B, T) i32, got " + t->str());
  const int64_t B = chosen_ids.size(0), T = chosen_ids.size(1);
  const int32_t *ci = chosen_ids.data<int32_t>(), *ri = rejected_ids.data<int32_t>();
  int32_t *cm = chosen_mask.data<int32_t>(), *rm = rejected_mask.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t div = 0;  // DS-Chat: 0 when the rows are identical
    for (int64_t t = 0; t < T; ++t)
      if (ci[b * T + t] != ri[b * T + t]) {
        div = t;
        break;
      }
    for (int64_t t = 0; t < div; ++t) cm[b * T + t] = rm[b * T + t] = 0;
  }
}

}  // namespace flowrun::rlhf
