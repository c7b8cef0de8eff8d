#include "models/dschat_steps.h"

#include "models/adapter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace flowrun::dschat {

namespace {

constexpr double pi = 3.14159265358979323846;

// The weight of Linear module m of a layer (the tensor LinearLayer_LoRA freezes).
tensor& module_weight(layer_weights& L, int m) {
  switch (m) {
    case lm_q: return L.wq;
    case lm_k: return L.wk;
    case lm_v: return L.wv;
    case lm_o: return L.wo;
    case lm_gate: return L.w_gate;
    case lm_up: return L.w_up;
    default: return L.w_down;
  }
}

// The end of an accumulation window: average, freeze, clip, schedule, step.
void finish_update(decoder& model, adamw_optimizer& opt, const dschat_settings& s, train_state& st) {
  auto grads = opt.trainable_grads();
  if (s.gradient_accumulation_steps > 1)
    for (auto& g : grads) ops::scale(g, 1.0f / static_cast<float>(s.gradient_accumulation_steps));
  // DS-Chat's LinearLayer_LoRA freezes the adapted Linear's weight even when the rest trains
  if (model.has_lora() && model.base_trainable()) {
    for (size_t l = 0; l < model.w().layers.size(); ++l)
      for (int m = 0; m < lm_count; ++m)
        if (model.w().layers[l].lora[m].A.defined()) module_weight(model.grads().layers[l], m).zero_();
  }
  st.last_grad_norm = s.gradient_clipping > 0 ? ops::clip_grad_norm(grads, s.gradient_clipping)
                                              : ops::global_norm(grads);
  st.last_lr = static_cast<float>(s.learning_rate * lr_factor(s.lr_scheduler_type, st.update_step,
                                                              s.num_warmup_steps, st.total_update_steps));
  opt.step(st.last_lr);
  ++st.update_step;
  st.stepped = true;
}

void check_accumulation(const dschat_settings& s) {
  if (s.gradient_accumulation_steps < 1)
    throw std::invalid_argument("dschat: gradient_accumulation_steps must be >= 1");
}

void check_state(const dschat_settings& s, const train_state& st) {
  check_accumulation(s);
  if (st.total_update_steps <= 0)
    throw std::invalid_argument(
        "dschat: train_state.total_update_steps is 0; set it with total_update_steps(n_train, settings) before "
        "training (the lr scheduler needs it)");
}

}  // namespace

dschat_settings rm_defaults() {
  dschat_settings s;
  s.learning_rate = 5e-5f;
  return s;
}

ops::adamw_config adamw_from(const dschat_settings& s) {
  ops::adamw_config c;
  c.lr = s.learning_rate;
  c.beta1 = s.adam_beta1;
  c.beta2 = s.adam_beta2;
  c.eps = s.adam_eps;
  c.weight_decay = s.weight_decay;
  return c;
}

lora_config lora_from(const dschat_settings& s) {
  // LinearLayer_LoRA: lora_scaling (1) / lora_dim, i.e. alpha 1; no dropout in DS-Chat's steps 1-2
  return make_lora_config(s.lora_dim, 1.0f, 0.0f, s.lora_module_name, s.seed);
}

void apply_lora(decoder& model, const dschat_settings& s) {
  if (s.lora_dim <= 0) return;
  model.enable_lora(lora_from(s), /*freeze_base=*/s.only_optimize_lora);
}

double lr_factor(const std::string& type, int64_t k, int64_t W, int64_t total) {
  const double kd = static_cast<double>(k), Wd = static_cast<double>(std::max<int64_t>(W, 0));
  if (type == "constant") return 1.0;
  if (k < W) return kd / std::max(1.0, Wd);
  if (type == "constant_with_warmup") return 1.0;
  const double progress = (kd - Wd) / std::max(1.0, static_cast<double>(total) - Wd);
  if (type == "linear") return std::max(0.0, 1.0 - progress);
  if (type == "cosine") return std::max(0.0, 0.5 * (1.0 + std::cos(pi * progress)));
  throw std::invalid_argument("lr_scheduler_type \"" + type +
                              "\" is not supported; use cosine, linear, constant or constant_with_warmup");
}

int64_t total_update_steps(int64_t n_train, const dschat_settings& s) {
  check_accumulation(s);
  if (s.per_device_train_batch_size < 1) throw std::invalid_argument("dschat: per_device_train_batch_size must be >= 1");
  const int64_t batches = (n_train + s.per_device_train_batch_size - 1) / s.per_device_train_batch_size;
  const int64_t per_epoch = (batches + s.gradient_accumulation_steps - 1) / s.gradient_accumulation_steps;
  return s.num_train_epochs * per_epoch;
}

double sft_step(decoder& model, adamw_optimizer& opt, const sft_batch_data& batch, const dschat_settings& s,
                train_state& st) {
  check_state(s, st);
  if (model.has_value_head())
    throw std::invalid_argument("sft_step: the model has a value head; step 1 trains the LM head");
  if (st.micro_step % s.gradient_accumulation_steps == 0) model.zero_grad();
  st.stepped = false;
  const double loss = model.forward(st.acts, batch.ids, batch.targets);
  if (!std::isfinite(loss))
    throw std::runtime_error("sft_step: non-finite loss " + std::to_string(loss) + " at micro-step " +
                             std::to_string(st.micro_step) + "; lower learning_rate or check the data");
  model.backward(st.acts);
  ++st.micro_step;
  if (st.micro_step % s.gradient_accumulation_steps == 0) finish_update(model, opt, s, st);
  return loss;
}

namespace {
// Evaluation mode for a scope (no LoRA dropout), as torch's model.eval() in DS-Chat's evaluation.
class eval_mode {
 public:
  explicit eval_mode(decoder& m) : m_(m), was_(m.training()) { m_.set_training(false); }
  ~eval_mode() { m_.set_training(was_); }
  eval_mode(const eval_mode&) = delete;
  eval_mode& operator=(const eval_mode&) = delete;

 private:
  decoder& m_;
  bool was_;
};
}  // namespace

sft_eval_result sft_eval(decoder& model, const std::vector<sft_batch_data>& batches) {
  sft_eval_result r;
  eval_mode ev(model);
  activations a;
  double tok_sum = 0, batch_sum = 0;
  int64_t nb = 0;
  for (const auto& b : batches) {
    if (b.n_target_tokens == 0) continue;
    const double loss = model.forward(a, b.ids, b.targets);
    tok_sum += loss * static_cast<double>(a.n_valid);
    r.tokens += a.n_valid;
    r.rows += b.B;
    batch_sum += loss;
    ++nb;
  }
  if (r.tokens > 0) {
    r.loss = tok_sum / static_cast<double>(r.tokens);
    r.perplexity = std::exp(r.loss);
    r.batch_mean_loss = batch_sum / static_cast<double>(nb);
  }
  return r;
}

rlhf::pairwise_result rm_forward(decoder& value_model, activations& a, const rm_batch_data& batch, tensor* dvalues) {
  if (!value_model.has_value_head())
    throw std::invalid_argument("rm_forward: the model has no value head; call add_value_head() first (step 2 "
                                "trains a RewardModel: the LM head replaced by v_head)");
  const int64_t B = batch.B, T = batch.T;
  tensor ids = tensor::empty({2 * B, T}, dtype::i32);
  std::memcpy(ids.data<int32_t>(), batch.chosen_ids.data<int32_t>(), sizeof(int32_t) * B * T);
  std::memcpy(ids.data<int32_t>() + B * T, batch.rejected_ids.data<int32_t>(), sizeof(int32_t) * B * T);
  // Right padding: causal attention keeps every real position independent of the padding,
  // so no mask is needed; positions are 0..T-1 for every row.
  value_model.forward(a, ids, tensor{});
  tensor values = a.values.to(device::cpu());
  tensor cr = values.flat_view(0, {B, T}), rr = values.flat_view(B * T, {B, T});
  tensor dc, dr;
  auto res = rlhf::pairwise_loss(cr, rr, batch.chosen_ids, batch.rejected_ids, batch.chosen_len, batch.rejected_len,
                                 dvalues ? &dc : nullptr, dvalues ? &dr : nullptr);
  if (dvalues) {
    *dvalues = tensor::empty({2 * B, T});
    std::memcpy(dvalues->data<float>(), dc.data<float>(), sizeof(float) * B * T);
    std::memcpy(dvalues->data<float>() + B * T, dr.data<float>(), sizeof(float) * B * T);
  }
  return res;
}

namespace {

rm_step_result summarize(const rlhf::pairwise_result& res) {
  rm_step_result r;
  r.loss = res.loss;
  const size_t n = res.chosen_scores.size();
  for (size_t i = 0; i < n; ++i) {
    r.accuracy += res.chosen_scores[i] > res.rejected_scores[i];
    r.chosen_mean += res.chosen_scores[i];
    r.rejected_mean += res.rejected_scores[i];
  }
  if (n) {
    r.accuracy /= static_cast<double>(n);
    r.chosen_mean /= static_cast<double>(n);
    r.rejected_mean /= static_cast<double>(n);
  }
  return r;
}

}  // namespace

rm_step_result rm_step(decoder& value_model, adamw_optimizer& opt, const rm_batch_data& batch,
                       const dschat_settings& s, train_state& st) {
  check_state(s, st);
  if (st.micro_step % s.gradient_accumulation_steps == 0) value_model.zero_grad();
  st.stepped = false;
  tensor dvalues;
  auto res = rm_forward(value_model, st.acts, batch, &dvalues);
  if (!std::isfinite(res.loss))
    throw std::runtime_error("rm_step: non-finite pairwise loss " + std::to_string(res.loss) + " at micro-step " +
                             std::to_string(st.micro_step) + "; lower learning_rate or check the data");
  value_model.backward(st.acts, dvalues);
  ++st.micro_step;
  if (st.micro_step % s.gradient_accumulation_steps == 0) finish_update(value_model, opt, s, st);
  return summarize(res);
}

rm_eval_result rm_eval(decoder& value_model, const std::vector<rm_batch_data>& batches) {
  rm_eval_result r;
  eval_mode ev(value_model);
  activations a;
  int64_t correct = 0;
  double cs = 0, rs = 0, ls = 0;
  for (const auto& b : batches) {
    auto res = rm_forward(value_model, a, b);
    for (size_t i = 0; i < res.chosen_scores.size(); ++i) {
      correct += res.chosen_scores[i] > res.rejected_scores[i];
      cs += res.chosen_scores[i];
      rs += res.rejected_scores[i];
    }
    ls += res.loss * static_cast<double>(b.B);
    r.pairs += b.B;
  }
  if (r.pairs > 0) {
    const double n = static_cast<double>(r.pairs);
    r.accuracy = static_cast<double>(correct) / n;
    r.accuracy_stderr = std::sqrt(r.accuracy * (1.0 - r.accuracy) / n);
    r.chosen_mean = cs / n;
    r.rejected_mean = rs / n;
    r.loss = ls / n;
  }
  return r;
}

}  // namespace flowrun::dschat
