#include "models/rlhf/rlhf_math.h"

#include "models/rlhf/pg_math.h"
#include "models/sampler.h"
#include "runtime/kernels/cpu/simd_kernels.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace flowrun::rlhf {

namespace {

void need(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

void same_shape(const tensor& a, const tensor& b, const char* fn, const char* an, const char* bn) {
  need(a.shape() == b.shape(), std::string(fn) + ": " + an + " " + a.str() + " and " + bn + " " + b.str() +
                                   " must have the same shape");
}

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

}  // namespace

void gather_log_probs_forward(tensor& out, const tensor& logits, const tensor& labels, float temperature,
                              int64_t from) {
  need(temperature > 0, "gather_log_probs: temperature must be > 0, got " + std::to_string(temperature));
  need(logits.dim() == 3, "gather_log_probs: logits must be (B, T, V), got " + logits.str());
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  need(labels.shape() == shape_t{B, T} && labels.type() == dtype::i32, "gather_log_probs: labels must be (B, T) i32");
  need(from >= 0 && from < T, "gather_log_probs: from " + std::to_string(from) + " outside [0, T)");
  if (!out.defined() || out.shape() != shape_t{B, T}) out = tensor::empty({B, T});
  const float* lg = logits.data<float>();
  const int32_t* lb = labels.data<int32_t>();
  float* o = out.data<float>();
  for (int64_t n = 0; n < B * T; ++n)
    if (lb[n] < 0 || lb[n] >= V)
      throw std::out_of_range("gather_log_probs: label " + std::to_string(lb[n]) + " outside the vocabulary of " +
                              std::to_string(V));
#pragma omp parallel
  {
    std::vector<float> scratch;  // the row / temperature (token_log_prob)
#pragma omp for
    for (int64_t n = 0; n < B * T; ++n)
      o[n] = n % T < from ? 0.0f : token_log_prob(lg + n * V, V, lb[n], temperature, scratch);
  }
}

void gather_log_probs_backward(tensor& dlogits, const tensor& dout, const tensor& logits, const tensor& labels,
                               float temperature, int64_t from) {
  need(temperature > 0, "gather_log_probs_backward: temperature must be > 0, got " + std::to_string(temperature));
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  need(dout.shape() == shape_t{B, T}, "gather_log_probs_backward: dout must be (B, T)");
  if (!dlogits.defined() || dlogits.shape() != logits.shape()) dlogits = tensor::empty(logits.shape());
  const float* lg = logits.data<float>();
  const float* d = dout.data<float>();
  const int32_t* lb = labels.data<int32_t>();
  float* g = dlogits.data<float>();
#pragma omp parallel for
  for (int64_t n = 0; n < B * T; ++n) {
    const float* row = lg + n * V;
    float* gr = g + n * V;
    if (n % T < from) {
      std::fill(gr, gr + V, 0.0f);
      continue;
    }
    // z = row / T; d logp[label] / d row = (onehot(label) - softmax(z)) / T: softmax through the
    // same vector exp and double sum as the forward (token_log_prob, simd::log_softmax_at)
    const float* z = row;
    if (temperature != 1.0f) {
      for (int64_t i = 0; i < V; ++i) gr[i] = row[i] / temperature;
      z = gr;
    }
    const float mx = simd::max_f(z, V);
    const double s = simd::exp_sum(z, mx, V, gr);  // gr = exp(z - mx)
    const float dn = temperature == 1.0f ? d[n] : d[n] / temperature;
    simd::scale_f(gr, static_cast<float>(-dn / s), V);
    gr[lb[n]] += dn;
  }
}

tensor compute_rewards(const tensor& log_probs, const tensor& ref_log_probs, const tensor& reward_score,
                       const tensor& action_mask, int64_t start, const ppo_config& cfg, std::vector<int64_t>* ends) {
  need(log_probs.dim() == 2, "compute_rewards: log_probs must be (B, L), got " + log_probs.str());
  same_shape(log_probs, ref_log_probs, "compute_rewards", "log_probs", "ref_log_probs");
  need(action_mask.shape() == log_probs.shape() && action_mask.type() == dtype::i32,
       "compute_rewards: action_mask must be (B, L) i32 like log_probs");
  const int64_t B = log_probs.size(0), L = log_probs.size(1);
  need(reward_score.numel() == B, "compute_rewards: reward_score must have B entries");
  need(start >= 0 && start < L, "compute_rewards: start " + std::to_string(start) + " outside [0, " +
                                    std::to_string(L) + ")");
  auto rewards = tensor::empty({B, L});
  const float* lp = log_probs.data<float>();
  const float* rp = ref_log_probs.data<float>();
  const float* sc = reward_score.data<float>();
  const int32_t* am = action_mask.data<int32_t>();
  float* r = rewards.data<float>();
  for (int64_t i = 0; i < B * L; ++i) r[i] = -cfg.kl_ctl * (lp[i] - rp[i]);
  if (ends) ends->assign(B, 0);
  for (int64_t j = 0; j < B; ++j) {
    int64_t n = 0;
    for (int64_t t = start; t < L; ++t) n += am[j * L + t] != 0;
    int64_t end = start + n + 1;
    if (ends) (*ends)[j] = end;
    int64_t at = std::min(end, L) - 1;  // the last element of rewards[j, start:end] (python slice clipping)
    float clipped = std::clamp(sc[j], -cfg.clip_reward_value, cfg.clip_reward_value);
    r[j * L + at] += clipped;
  }
  return rewards;
}

void zero_after_ends(tensor& rewards, tensor& values, const std::vector<int64_t>& ends) {
  same_shape(rewards, values, "zero_after_ends", "rewards", "values");
  const int64_t B = rewards.size(0), L = rewards.size(1);
  need(static_cast<int64_t>(ends.size()) == B, "zero_after_ends: one end per row");
  for (int64_t j = 0; j < B; ++j)
    for (int64_t t = std::max<int64_t>(0, ends[j]); t < L; ++t) {
      rewards.data<float>()[j * L + t] = 0.0f;
      values.data<float>()[j * L + t] = 0.0f;
    }
}

void advantages_and_returns(tensor& advantages, tensor& returns, const tensor& values, const tensor& rewards,
                            int64_t start, const ppo_config& cfg) {
  same_shape(values, rewards, "advantages_and_returns", "values", "rewards");
  const int64_t B = values.size(0), L = values.size(1), n = L - start;
  need(start >= 0 && start < L, "advantages_and_returns: start outside the sequence");
  advantages = tensor::empty({B, n});
  returns = tensor::empty({B, n});
  const float* v = values.data<float>();
  const float* r = rewards.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    double last = 0;
    for (int64_t t = L - 1; t >= start; --t) {
      double next = t < L - 1 ? v[b * L + t + 1] : 0.0;
      double delta = r[b * L + t] + cfg.gamma * next - v[b * L + t];
      last = delta + cfg.gamma * cfg.lam * last;
      advantages.data<float>()[b * n + (t - start)] = static_cast<float>(last);
      returns.data<float>()[b * n + (t - start)] = static_cast<float>(last + v[b * L + t]);
    }
  }
}

double actor_loss(const tensor& logprobs, const tensor& old_logprobs, const tensor& advantages, const tensor& mask,
                  float cliprange, tensor* dlogprobs) {
  // DeepSpeed-Chat's loss is the clipped surrogate's token-mean case, without a dual clip (pg_math.h).
  policy_loss_config c;
  c.clip_ratio_low = c.clip_ratio_high = cliprange;
  c.clip_ratio_c = 0;
  c.agg = loss_agg_mode::token_mean;
  return clipped_policy_loss(logprobs, old_logprobs, advantages, mask, c, dlogprobs).loss;
}

double critic_loss(const tensor& values, const tensor& old_values, const tensor& returns, const tensor& mask,
                   float cliprange_value, tensor* dvalues) {
  same_shape(values, old_values, "critic_loss", "values", "old_values");
  same_shape(values, returns, "critic_loss", "values", "returns");
  need(mask.shape() == values.shape() && mask.type() == dtype::i32, "critic_loss: mask must be i32 like values");
  const int64_t N = values.numel();
  const float* v = values.data<float>();
  const float* ov = old_values.data<float>();
  const float* R = returns.data<float>();
  const int32_t* m = mask.data<int32_t>();
  double msum = 0;
  for (int64_t i = 0; i < N; ++i) msum += m[i] != 0;
  if (dvalues) {
    if (!dvalues->defined() || dvalues->shape() != values.shape()) *dvalues = tensor::empty(values.shape());
    dvalues->zero_();
  }
  if (msum == 0) return 0.0;
  double total = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (m[i] == 0) continue;
    double lo = static_cast<double>(ov[i]) - cliprange_value, hi = static_cast<double>(ov[i]) + cliprange_value;
    double vc = std::clamp(static_cast<double>(v[i]), lo, hi);
    double l1 = (v[i] - R[i]) * (v[i] - R[i]), l2 = (vc - R[i]) * (vc - R[i]);
    total += std::max(l1, l2);
    if (dvalues) {
      bool inside = v[i] > lo && v[i] < hi;
      double g = l1 >= l2 ? 2.0 * (v[i] - R[i]) : (inside ? 2.0 * (vc - R[i]) : 0.0);
      dvalues->data<float>()[i] = static_cast<float>(0.5 * g / msum);
    }
  }
  return 0.5 * total / msum;
}

pairwise_result pairwise_loss(const tensor& cr, const tensor& rr, const tensor& cid, const tensor& rid,
                              const tensor& clen, const tensor& rlen, tensor* dchosen, tensor* drejected) {
  same_shape(cr, rr, "pairwise_loss", "chosen_rewards", "rejected_rewards");
  need(cid.shape() == cr.shape() && rid.shape() == cr.shape(), "pairwise_loss: ids must be (B, T) like the rewards");
  const int64_t B = cr.size(0), T = cr.size(1);
  need(clen.numel() == B && rlen.numel() == B, "pairwise_loss: one length per pair");
  pairwise_result res;
  if (dchosen) {
    *dchosen = tensor::zeros({B, T});
  }
  if (drejected) {
    *drejected = tensor::zeros({B, T});
  }
  const float* c = cr.data<float>();
  const float* r = rr.data<float>();
  for (int64_t i = 0; i < B; ++i) {
    int64_t cl = clen.data<int32_t>()[i], rl = rlen.data<int32_t>()[i];
    need(cl >= 1 && cl <= T && rl >= 1 && rl <= T, "pairwise_loss: pair " + std::to_string(i) +
                                                       " has a length outside [1, T]");
    int64_t lim = std::max(cl, rl), div = -1;
    for (int64_t t = 0; t < lim; ++t) {
      bool c_real = t < cl, r_real = t < rl;
      if (c_real != r_real || (c_real && cid.data<int32_t>()[i * T + t] != rid.data<int32_t>()[i * T + t])) {
        div = t;
        break;
      }
    }
    int64_t end;
    if (div < 0) {  // identical answers: the last real position only
      div = cl - 1;
      end = cl;
    } else {
      end = lim;
    }
    res.divergence.push_back(div);
    res.end.push_back(end);
    res.chosen_scores.push_back(c[i * T + cl - 1]);
    res.rejected_scores.push_back(r[i * T + rl - 1]);
    double s = 0;
    const double k = static_cast<double>(end - div);
    for (int64_t t = div; t < end; ++t) {
      double d = static_cast<double>(c[i * T + t]) - r[i * T + t];
      s += -log_sigmoid(d);
      double g = -sigmoid(-d) / k / static_cast<double>(B);  // d(-log σ(d))/dd = -σ(-d)
      if (dchosen) dchosen->data<float>()[i * T + t] = static_cast<float>(g);
      if (drejected) drejected->data<float>()[i * T + t] = static_cast<float>(-g);
    }
    res.loss += s / k;
  }
  res.loss /= static_cast<double>(B);
  return res;
}

void ema_update(tensor& ema, const tensor& param, float beta) {
  need(ema.numel() == param.numel(), "ema_update: ema and param differ in size");
  float* e = ema.data<float>();
  const float* p = param.data<float>();
  const int64_t n = ema.numel();
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) e[i] = beta * e[i] + (1.0f - beta) * p[i];
}

void check_finite(const tensor& x, const std::string& node, const std::string& tensor_name) {
  auto v = x.to_floats();
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) {
      std::ostringstream os;
      os << "non-finite value in " << tensor_name << " " << x.str() << " at index " << i << " (value " << v[i]
         << ") in node " << node;
      throw std::runtime_error(os.str());
    }
}

}  // namespace flowrun::rlhf
