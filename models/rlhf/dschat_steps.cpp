#include "models/rlhf/dschat_steps.h"

#include "models/adapter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace flowrun::dschat {

namespace {

void check_accumulation(const dschat_settings& s) {
  if (s.gradient_accumulation_steps < 1)
    throw std::invalid_argument("dschat: gradient_accumulation_steps must be >= 1");
}

}  // namespace

void check_global_batch(zero_engine& e, size_t n, const char* what) {
  const int64_t want = e.settings().gradient_accumulation_steps * e.comm().world_size();
  if (static_cast<int64_t>(n) != want)
    throw std::invalid_argument(std::string(what) + ": the global batch has " + std::to_string(n) +
                                " micro-batches; it needs gradient_accumulation_steps " +
                                std::to_string(e.settings().gradient_accumulation_steps) + " x world size " +
                                std::to_string(want / e.settings().gradient_accumulation_steps) + " = " +
                                std::to_string(want));
}

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
  // DS-Chat's only_optimize_lora_parameters freezes all but the LoRA weights; without LoRA there are
  // none, and flowrun trained the whole model instead
  if (s.lora_dim <= 0 && s.only_optimize_lora)
    throw std::invalid_argument("only_optimize_lora = true trains only the LoRA weights, and lora_dim = 0 adds none: "
                                "set lora_dim (e.g. 128, DS-Chat's), or only_optimize_lora = false");
  if (s.lora_dim <= 0) return;
  try {
    model.enable_lora(lora_from(s), /*freeze_base=*/s.only_optimize_lora);
  } catch (const std::invalid_argument& e) {  // name the setting: the decoder speaks of target modules
    std::string why = e.what();
    if (why.rfind("enable_lora: ", 0) == 0) why.erase(0, 13);
    if (why.rfind("LoRA rank", 0) == 0)  // the rank, not the modules (it named lora_module_name)
      throw std::invalid_argument("lora_dim = " + std::to_string(s.lora_dim) +
                                  " (step 3: actor_lora_dim / critic_lora_dim): " + why);
    throw std::invalid_argument("lora_module_name = \"" + s.lora_module_name +
                                "\" (step 3: actor_lora_module_name / critic_lora_module_name): " + why);
  }
}

void apply_ds_config(dschat_settings& s, const ds_config& c) {
  s.zero_stage = c.zero_stage;
  s.dtype = c.bf16 ? "bf16" : c.fp16 ? "fp16" : "fp32";
  s.ds = std::make_shared<const ds_config>(c);
  s.gradient_clipping = static_cast<float>(c.gradient_clipping);
  s.gradient_accumulation_steps = c.gradient_accumulation_steps;
  s.per_device_train_batch_size = c.train_micro_batch_size_per_gpu;
  if (c.optimizer_given) {
    if (c.optimizer_type != "AdamW")
      throw std::invalid_argument(c.where + ": optimizer " + c.optimizer_type +
                                  " (L2 weight decay) is not what the engine runs: use AdamW (adam_w_mode true)");
    s.learning_rate = static_cast<float>(c.lr);
    s.adam_beta1 = static_cast<float>(c.beta1);
    s.adam_beta2 = static_cast<float>(c.beta2);
    s.adam_eps = static_cast<float>(c.eps);
    s.weight_decay = static_cast<float>(c.weight_decay);
  }
  s.ds_scheduler = c.scheduler;
}

lr_schedule schedule_from(const dschat_settings& s, int64_t total) {
  if (!s.ds_scheduler.type.empty()) return s.ds_scheduler;  // DeepSpeed: the configured scheduler wins
  return lr_schedule::transformers(s.lr_scheduler_type, s.num_warmup_steps, total);
}

zero_settings engine_settings(const decoder& model, const dschat_settings& s) {
  check_accumulation(s);
  if (s.zero_stage < 0 || s.zero_stage > 3)
    throw std::invalid_argument("dschat: zero_stage must be 0, 1, 2 or 3, got " + std::to_string(s.zero_stage));
  zero_settings z;
  z.stage = s.zero_stage;
  z.micro_batch = s.per_device_train_batch_size;
  z.gradient_accumulation_steps = s.gradient_accumulation_steps;
  z.gradient_clipping = s.gradient_clipping > 0 ? s.gradient_clipping : 0.0;
  z.adamw = adamw_from(s);
  if (s.lora_dim > 0) z.adapter_lr = s.lora_learning_rate;  // DS-Chat's LoRA group (utils.py, lora_lr)
  if (s.dtype == "bf16") {
    z.precision = dtype::bf16;
  } else if (s.dtype == "fp16") {
    z.precision = dtype::f16;
    ds_config c = s.ds ? *s.ds : ds_config{};  // the JSON's fp16 section, else DeepSpeed's defaults
    c.fp16 = true;
    c.zero_stage = s.zero_stage;
    z.loss_scaler = std::make_shared<dynamic_loss_scaler>(c);
  } else if (s.dtype != "fp32") {
    throw std::invalid_argument("dschat: dtype must be fp32, bf16 or fp16, got \"" + s.dtype + "\"");
  }
  // DS-Chat's LinearLayer_LoRA freezes the adapted Linear's weight even when the rest trains
  if (model.has_lora() && model.base_trainable()) {
    const std::string a_suffix = "lora_A.weight";
    for (const auto& ae : model.adapter_params()) {
      if (ae.name.size() < a_suffix.size() ||
          ae.name.compare(ae.name.size() - a_suffix.size(), a_suffix.size(), a_suffix) != 0)
        continue;
      const std::string prefix = ae.name.substr(0, ae.name.size() - a_suffix.size());
      std::vector<std::string> weights = {prefix + "weight"};
      const std::string fused = std::string(k_fused_qkv_path) + ".";  // GPT-2's c_attn: q, k and v
      if (prefix.size() > fused.size() && prefix.compare(prefix.size() - fused.size(), fused.size(), fused) == 0) {
        const std::string layer = prefix.substr(0, prefix.size() - fused.size());
        weights = {layer + "self_attn.q_proj.weight", layer + "self_attn.k_proj.weight", layer + "self_attn.v_proj.weight"};
      }
      for (const auto& e : model.params())
        for (const auto& weight : weights)
          if (e.name == weight) z.frozen_ranges.push_back({e.offset, e.offset + e.numel});
    }
  }
  return z;
}

int64_t total_update_steps(int64_t n_train, const dschat_settings& s) {
  check_accumulation(s);
  if (s.per_device_train_batch_size < 1) throw std::invalid_argument("dschat: per_device_train_batch_size must be >= 1");
  const int64_t batches = (n_train + s.per_device_train_batch_size - 1) / s.per_device_train_batch_size;
  const int64_t per_epoch = (batches + s.gradient_accumulation_steps - 1) / s.gradient_accumulation_steps;
  return s.num_train_epochs * per_epoch;
}

batch_loss sft_loss(const std::vector<sft_batch_data>& micro) {
  batch_loss l;
  l.units = [&micro](int64_t k) { return micro.at(k).n_target_tokens; };
  l.forward = [&micro](int64_t k, decoder& model, activations& a) {
    if (model.has_value_head())
      throw std::invalid_argument("sft_loss: the model has a value head; step 1 trains the LM head");
    const auto& b = micro.at(k);
    micro_loss r;
    r.loss = model.forward(a, b.ids, b.targets);  // dout undefined: the model's cross-entropy backward
    return r;
  };
  return l;
}

step_result sft_update(zero_engine& engine, const std::vector<sft_batch_data>& micro, double lr) {
  check_global_batch(engine, micro.size(), "sft_update");
  return engine.train_step(sft_loss(micro), lr);
}

sft_eval_result sft_eval(decoder& model, const std::vector<sft_batch_data>& batches,
                         const batch_progress_fn& progress) {
  sft_eval_result r;
  eval_mode ev(model);
  activations a;
  double tok_sum = 0, batch_sum = 0;
  int64_t nb = 0;
  const auto total = static_cast<int64_t>(batches.size());
  if (progress) progress(0, total);
  for (int64_t k = 0; k < total; ++k) {
    const auto& b = batches[static_cast<size_t>(k)];
    if (b.n_target_tokens > 0) {
      const double loss = model.forward(a, b.ids, b.targets);
      tok_sum += loss * static_cast<double>(a.n_valid);
      r.tokens += a.n_valid;
      r.rows += b.B;
      batch_sum += loss;
      ++nb;
    }
    if (progress) progress(k + 1, total);
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
  // Right padding: causal attention keeps every real position independent of the padding. The
  // pairwise loss also reads the values at the shorter row's padding (DS-Chat's RewardModel.forward
  // averages from the divergence to the end of the longer row), which DS-Chat computes with its
  // attention_mask: a padding position attends to the real tokens only. So the mask goes in, with
  // positions 0..T-1 for every row as HF's LLaMA forward takes them without position_ids (the mask's
  // cumsum, decoder::forward's default with a mask, would move the padding's positions).
  tensor mask = tensor::empty({2 * B, T}, dtype::i32), positions = tensor::empty({2 * B, T}, dtype::i32);
  std::memcpy(mask.data<int32_t>(), batch.chosen_mask.data<int32_t>(), sizeof(int32_t) * B * T);
  std::memcpy(mask.data<int32_t>() + B * T, batch.rejected_mask.data<int32_t>(), sizeof(int32_t) * B * T);
  for (int64_t r = 0; r < 2 * B; ++r)
    for (int64_t t = 0; t < T; ++t) positions.data<int32_t>()[r * T + t] = static_cast<int32_t>(t);
  value_model.forward(a, ids, tensor{}, mask, positions);
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

batch_loss rm_loss(const std::vector<rm_batch_data>& micro, std::vector<rlhf::pairwise_result>* scores) {
  batch_loss l;
  l.units = [&micro](int64_t k) { return micro.at(k).B; };
  l.forward = [&micro, scores](int64_t k, decoder& model, activations& a) {
    micro_loss r;
    auto res = rm_forward(model, a, micro.at(k), &r.dout);
    r.loss = res.loss;
    if (scores) scores->push_back(std::move(res));
    return r;
  };
  return l;
}

rm_step_result rm_update(zero_engine& engine, const std::vector<rm_batch_data>& micro, double lr) {
  check_global_batch(engine, micro.size(), "rm_update");
  std::vector<rlhf::pairwise_result> scores;
  const step_result sr = engine.train_step(rm_loss(micro, &scores), lr);
  // correct pairs, chosen and rejected score sums, pairs: this rank's, then summed over the ranks
  double sum[4] = {0, 0, 0, 0};
  for (const auto& res : scores)
    for (size_t i = 0; i < res.chosen_scores.size(); ++i) {
      sum[0] += res.chosen_scores[i] > res.rejected_scores[i];
      sum[1] += res.chosen_scores[i];
      sum[2] += res.rejected_scores[i];
      sum[3] += 1;
    }
  if (engine.comm().world_size() > 1) {
    auto t = tensor::empty({4});  // (the communicators reduce f32, not f64)
    for (int i = 0; i < 4; ++i) t.data<float>()[i] = static_cast<float>(sum[i]);
    engine.all_reduce_host(t);
    for (int i = 0; i < 4; ++i) sum[i] = t.data<float>()[i];
  }
  rm_step_result r;
  r.loss = sr.loss;
  r.grad_norm = sr.grad_norm;
  r.lr = sr.lr;
  r.pairs = static_cast<int64_t>(sum[3]);
  if (r.pairs > 0) {
    r.accuracy = sum[0] / sum[3];
    r.chosen_mean = sum[1] / sum[3];
    r.rejected_mean = sum[2] / sum[3];
  }
  return r;
}

rm_eval_result rm_eval(decoder& value_model, const std::vector<rm_batch_data>& batches,
                       const batch_progress_fn& progress) {
  rm_eval_result r;
  eval_mode ev(value_model);
  activations a;
  int64_t correct = 0;
  double cs = 0, rs = 0, ls = 0;
  const auto total = static_cast<int64_t>(batches.size());
  if (progress) progress(0, total);
  for (int64_t k = 0; k < total; ++k) {
    const auto& b = batches[static_cast<size_t>(k)];
    auto res = rm_forward(value_model, a, b);
    for (size_t i = 0; i < res.chosen_scores.size(); ++i) {
      correct += res.chosen_scores[i] > res.rejected_scores[i];
      cs += res.chosen_scores[i];
      rs += res.rejected_scores[i];
    }
    ls += res.loss * static_cast<double>(b.B);
    r.pairs += b.B;
    if (progress) progress(k + 1, total);
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
