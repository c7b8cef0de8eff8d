#include "models/rlhf/dpo.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "models/rlhf/dschat_steps.h"
#include "models/rlhf/rlhf_math.h"

namespace flowrun::dschat {

namespace {

// Rows [0, B) of x then rows [0, B) of y: (2B, ...) (chosen first, as DataCollatorReward).
tensor stack(const tensor& x, const tensor& y) {
  shape_t sh = x.shape();
  sh[0] *= 2;
  tensor out = tensor::empty(sh, x.type());
  const size_t bytes = x.nbytes();
  std::memcpy(static_cast<char*>(out.raw()), x.raw(), bytes);
  std::memcpy(static_cast<char*>(out.raw()) + bytes, y.raw(), bytes);
  return out;
}

// Per-position labels (the next id; 0 where the mask is 0, so padding never indexes the vocabulary)
// of ids (2B, T) under the stacked label mask (2B, T).
tensor next_labels(const tensor& ids, const tensor& lmask) {
  const int64_t R = ids.size(0), T = ids.size(1);
  tensor lab = tensor::zeros({R, T}, dtype::i32);
  const int32_t *id = ids.data<int32_t>(), *m = lmask.data<int32_t>();
  int32_t* l = lab.data<int32_t>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = 0; t + 1 < T; ++t)
      if (m[r * T + t]) l[r * T + t] = id[r * T + t + 1];
  return lab;
}

// The policy's forward on one pair batch: logits (2B, T, V) on the host, labels and label masks
// (2B, T), the per-token log-probs (2B, T) and the sequence log-probs of both sides.
struct pair_forward {
  tensor logits, labels, lmask;
  int64_t keep = 0;  // the first position a log-prob is counted at (decoder::forward's keep_from)
  pair_log_probs seq;
};

pair_forward forward_pairs(decoder& model, activations& a, const rm_batch_data& b, const dpo_settings& s) {
  if (model.has_value_head())
    throw std::invalid_argument("dpo: the model has a value head; DPO trains the LM head (give the SFT model, not "
                                "the reward model)");
  const int64_t B = b.B;
  const dpo_label_masks m = dpo_masks(b, s.mask_before_divergence);
  pair_forward f;
  const tensor ids = stack(b.chosen_ids, b.rejected_ids);
  f.lmask = stack(m.chosen, m.rejected);
  f.labels = next_labels(ids, f.lmask);
  // only the positions a log-prob is counted at need logits: from the earliest counted one on (the
  // answers; decoder::forward's keep_from)
  const int64_t T = ids.size(1);
  f.keep = T - 1;
  for (int64_t i = 0; i < f.lmask.numel(); ++i)
    if (f.lmask.data<int32_t>()[i] != 0) f.keep = std::min(f.keep, i % T);
  // right padding: causal attention keeps real positions independent of the padding (rm_forward)
  model.forward(a, ids, tensor{}, tensor{}, tensor{}, f.keep);
  f.logits = a.logits.to(device::cpu());
  tensor lp;
  rlhf::gather_log_probs_forward(lp, f.logits, f.labels, 1.0f, f.keep);  // (2B, T)
  const tensor seq = rlhf::sequence_log_probs(lp, f.lmask, /*average=*/false);
  f.seq.chosen = tensor::empty({B});
  f.seq.rejected = tensor::empty({B});
  std::memcpy(f.seq.chosen.data<float>(), seq.data<float>(), sizeof(float) * B);
  std::memcpy(f.seq.rejected.data<float>(), seq.data<float>() + B, sizeof(float) * B);
  f.seq.chosen_tokens = tensor::zeros({B});
  f.seq.rejected_tokens = tensor::zeros({B});
  for (int64_t r = 0; r < 2 * B; ++r) {
    float& n = (r < B ? f.seq.chosen_tokens.data<float>()[r] : f.seq.rejected_tokens.data<float>()[r - B]);
    for (int64_t t = 0; t < T; ++t) n += f.lmask.data<int32_t>()[r * T + t] != 0;
  }
  return f;
}

}  // namespace

dpo_label_masks dpo_masks(const rm_batch_data& b, bool mask_before_divergence) {
  const int64_t B = b.B, T = b.T;
  if (B > 0 && (!b.chosen_prompt_len.defined() || b.chosen_prompt_len.numel() != B ||
                !b.rejected_prompt_len.defined() || b.rejected_prompt_len.numel() != B))
    throw std::invalid_argument("dpo_masks: the pair batch has no prompt lengths (make it with dschat::rm_batch)");
  // token masks (B, T): the real tokens, then TRL's answer-only or DS-Chat's from-the-divergence
  tensor tc = b.chosen_mask.clone(), tr = b.rejected_mask.clone();
  if (mask_before_divergence) {
    rlhf::mask_before_divergence(tc, tr, b.chosen_ids, b.rejected_ids);
  } else {
    for (int64_t r = 0; r < B; ++r) {
      const int64_t pc = std::min<int64_t>(b.chosen_prompt_len.data<int32_t>()[r], T);
      const int64_t pr = std::min<int64_t>(b.rejected_prompt_len.data<int32_t>()[r], T);
      for (int64_t t = 0; t < pc; ++t) tc.data<int32_t>()[r * T + t] = 0;
      for (int64_t t = 0; t < pr; ++t) tr.data<int32_t>()[r * T + t] = 0;
    }
  }
  // position t predicts token t + 1 (DS-Chat's get_batch_logps: label_mask[:, 1:], logits[:, :-1])
  dpo_label_masks out;
  out.chosen = tensor::zeros({B, T}, dtype::i32);
  out.rejected = tensor::zeros({B, T}, dtype::i32);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t + 1 < T; ++t) {
      out.chosen.data<int32_t>()[r * T + t] = tc.data<int32_t>()[r * T + t + 1];
      out.rejected.data<int32_t>()[r * T + t] = tr.data<int32_t>()[r * T + t + 1];
    }
  return out;
}

pair_log_probs dpo_log_probs(decoder& model, activations& a, const rm_batch_data& b, const dpo_settings& s) {
  return forward_pairs(model, a, b, s).seq;
}

batch_loss dpo_batch_loss(const std::vector<dpo_batch_data>& micro, const dpo_settings& s,
                          std::vector<rlhf::dpo_result>* results) {
  batch_loss l;
  l.units = [&micro](int64_t k) { return micro.at(k).pairs.B; };
  l.forward = [&micro, s, results](int64_t k, decoder& model, activations& a) {
    const auto& mb = micro.at(k);
    const int64_t B = mb.pairs.B, T = mb.pairs.T;
    if (!mb.ref.chosen.defined() || mb.ref.chosen.numel() != B || !mb.ref.rejected.defined() ||
        mb.ref.rejected.numel() != B)
      throw std::invalid_argument("dpo_batch_loss: micro-batch " + std::to_string(k) +
                                  " has no reference log-probs (dpo_log_probs of the reference)");
    pair_forward f = forward_pairs(model, a, mb.pairs, s);
    tensor dc, dr;  // d loss / d sequence log-probs (B) each: d of the micro-batch mean
    rlhf::dpo_result res = rlhf::dpo_loss(f.seq.chosen, f.seq.rejected, mb.ref.chosen, mb.ref.rejected, s.loss, &dc,
                                          &dr, &f.seq.chosen_tokens, &f.seq.rejected_tokens);
    // sequence_log_probs' backward (sums): d token = d sequence · mask
    tensor dlp = tensor::zeros({2 * B, T});
    const int32_t* m = f.lmask.data<int32_t>();
    float* d = dlp.data<float>();
    for (int64_t r = 0; r < 2 * B; ++r) {
      const float g = r < B ? dc.data<float>()[r] : dr.data<float>()[r - B];
      for (int64_t t = 0; t < T; ++t)
        if (m[r * T + t]) d[r * T + t] = g;
    }
    micro_loss out;
    out.loss = res.loss;
    rlhf::gather_log_probs_backward(out.dout, dlp, f.logits, f.labels, 1.0f, f.keep);  // (2B, T, V)
    if (results) results->push_back(std::move(res));
    return out;
  };
  return l;
}

dpo_step_result dpo_update(zero_engine& engine, decoder& reference, const std::vector<rm_batch_data>& micro,
                           const dpo_settings& s, double lr) {
  check_global_batch(engine, micro.size(), "dpo_update");
  const int64_t N = engine.comm().world_size(), r = engine.rank();
  std::vector<dpo_batch_data> batches(micro.size());
  {
    eval_mode ev(reference);
    // the reference's products in the policy's precision (bf16 products in a bf16 model): before the
    // first step the two give the same log-probs and every margin is 0
    ops::matmul_precision_scope gemm(engine.compute_precision());
    activations a;
    for (size_t k = 0; k < micro.size(); ++k) {
      batches[k].pairs = micro[k];
      if (static_cast<int64_t>(k) % N == r) batches[k].ref = dpo_log_probs(reference, a, micro[k], s);
    }
  }
  std::vector<rlhf::dpo_result> results;
  const step_result sr = engine.train_step(dpo_batch_loss(batches, s, &results), lr);
  // correct pairs, chosen and rejected reward sums, pairs: this rank's, then summed over the ranks
  double sum[4] = {0, 0, 0, 0};
  for (const auto& res : results)
    for (size_t i = 0; i < res.chosen_rewards.size(); ++i) {
      sum[0] += res.chosen_rewards[i] > res.rejected_rewards[i];
      sum[1] += res.chosen_rewards[i];
      sum[2] += res.rejected_rewards[i];
      sum[3] += 1;
    }
  if (N > 1) {
    auto t = tensor::empty({4});  // (the communicators reduce f32, not f64)
    for (int i = 0; i < 4; ++i) t.data<float>()[i] = static_cast<float>(sum[i]);
    engine.all_reduce_host(t);
    for (int i = 0; i < 4; ++i) sum[i] = t.data<float>()[i];
  }
  dpo_step_result out;
  out.loss = sr.loss;
  out.grad_norm = sr.grad_norm;
  out.lr = sr.lr;
  out.pairs = static_cast<int64_t>(sum[3]);
  if (out.pairs > 0) {
    out.accuracy = sum[0] / sum[3];
    out.chosen_reward = sum[1] / sum[3];
    out.rejected_reward = sum[2] / sum[3];
  }
  return out;
}

dpo_eval_result dpo_eval(decoder& policy, decoder& reference, const std::vector<rm_batch_data>& batches,
                         const dpo_settings& s, const batch_progress_fn& progress) {
  dpo_eval_result out;
  eval_mode ev(policy), evr(reference);
  activations a;
  int64_t correct = 0, logp_correct = 0;
  double loss = 0, cs = 0, rs = 0;
  const auto total = static_cast<int64_t>(batches.size());
  if (progress) progress(0, total);
  for (int64_t k = 0; k < total; ++k) {
    const auto& b = batches[static_cast<size_t>(k)];
    if (b.B == 0) {
      if (progress) progress(k + 1, total);
      continue;
    }
    const pair_log_probs pol = dpo_log_probs(policy, a, b, s);
    const pair_log_probs ref = dpo_log_probs(reference, a, b, s);
    const auto res = rlhf::dpo_loss(pol.chosen, pol.rejected, ref.chosen, ref.rejected, s.loss, nullptr, nullptr,
                                    &pol.chosen_tokens, &pol.rejected_tokens);
    const bool per_token = s.loss.loss_type == rlhf::dpo_loss_type::ipo;  // the policy's own preference, as its loss
    for (int64_t i = 0; i < b.B; ++i) {
      correct += res.chosen_rewards[i] > res.rejected_rewards[i];
      const float nc = per_token ? std::max(1.0f, pol.chosen_tokens.data<float>()[i]) : 1.0f;
      const float nr = per_token ? std::max(1.0f, pol.rejected_tokens.data<float>()[i]) : 1.0f;
      logp_correct += pol.chosen.data<float>()[i] / nc > pol.rejected.data<float>()[i] / nr;
      cs += res.chosen_rewards[i];
      rs += res.rejected_rewards[i];
    }
    loss += res.loss * static_cast<double>(b.B);
    out.pairs += b.B;
    if (progress) progress(k + 1, total);
  }
  if (out.pairs > 0) {
    const double n = static_cast<double>(out.pairs);
    out.accuracy = static_cast<double>(correct) / n;
    out.accuracy_stderr = std::sqrt(out.accuracy * (1.0 - out.accuracy) / n);
    out.logp_accuracy = static_cast<double>(logp_correct) / n;
    out.logp_accuracy_stderr = std::sqrt(out.logp_accuracy * (1.0 - out.logp_accuracy) / n);
    out.loss = loss / n;
    out.chosen_reward = cs / n;
    out.rejected_reward = rs / n;
  }
  return out;
}

}  // namespace flowrun::dschat
