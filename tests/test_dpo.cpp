// DeepSpeed-Chat's DPO step (models/rlhf/dpo.h) through the training engine: which tokens
// count (TRL's prompt masking, DS-Chat's divergence masking), the loss at the start, the
// whole loss's gradient against finite differences, accumulation = one larger micro-batch,
// 2 ranks = 1, and a few updates on real HH-RLHF pairs that learn the preference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/hf.h"
#include "models/rlhf/dpo.h"
#include "models/rlhf/dschat_data.h"
#include "models/rlhf/dschat_steps.h"
#include "models/train/zero.h"
#include "test_ranks.h"
#include "test_util.h"

using namespace flowrun;
using namespace flowrun::dschat;

namespace {

std::vector<int32_t> ints(const tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

rm_example pair(std::vector<int32_t> c, std::vector<int32_t> r, int64_t prompt_len) {
  rm_example e;
  e.chosen = std::move(c);
  e.rejected = std::move(r);
  e.chosen_prompt_len = e.rejected_prompt_len = prompt_len;
  return e;
}

std::vector<int64_t> iota(int64_t a, int64_t b) {
  std::vector<int64_t> v;
  for (int64_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

// A tiny random LLaMA (2 layers, C 64, V 64): fast enough for finite differences.
decoder tiny_model(uint64_t seed) {
  model_config c = test::eight_layer_config(model_family::llama);
  c.n_layers = 2;
  decoder m(c);
  m.init_random(seed);
  return m;
}

// Hand-made pairs over the tiny model's vocabulary: a shared prompt, answers of different
// lengths (right padding), one pair whose answers share their first token.
std::vector<rm_example> tiny_pairs() {
  return {pair({1, 10, 11, 12, 20, 21, 2}, {1, 10, 11, 12, 30, 2}, 4),
          pair({1, 13, 14, 40, 41, 42, 43, 2}, {1, 13, 14, 40, 50, 2}, 3),  // answers share token 40
          pair({1, 15, 16, 17, 18, 60, 2}, {1, 15, 16, 17, 18, 61, 62, 63, 2}, 5)};
}

// The HH-RLHF pairs of step 2's share, tokenized as the DPO node does (skip_identical, prompt_start).
std::vector<rm_example> hh_pairs(int64_t max_seq_len) {
  static auto tok = load_tokenizer(test::tokenizer_path());
  auto sources = load_sources({asset_path("data/hh-rlhf/harmless-base-test.dschat.jsonl").string()});
  dschat_settings s = rm_defaults();
  split_settings sp{s.data_split, s.seed, s.eval_fraction};
  auto rows = rows_for_step(sources, 1, sp);
  tokenize_settings ts;
  ts.max_seq_len = max_seq_len;
  ts.truncation = truncation_mode::prompt_start;
  ts.skip_identical = true;
  return make_rm_examples(rows.train, *tok, ts);
}

double max_abs_diff(const tensor& a, const tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, static_cast<double>(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

}  // namespace

TEST_CASE("dpo masks: TRL's answer tokens, DS-Chat's tokens from the first difference") {
  // chosen  1 5 6 | 7 8 2      rejected 1 5 6 | 7 9 4 2     (prompt 3 tokens, T = 7)
  const std::vector<rm_example> ex = {pair({1, 5, 6, 7, 8, 2}, {1, 5, 6, 7, 9, 4, 2}, 3)};
  const rm_batch_data b = rm_batch(ex, {0});
  REQUIRE(b.T == 7);
  CHECK(ints(b.chosen_prompt_len) == std::vector<int32_t>{3});
  // TRL: the logits at t predict ids[t + 1]; answer ids start at 3, so t = 2 .. len - 2
  auto trl = dpo_masks(b, false);
  CHECK(ints(trl.chosen) == std::vector<int32_t>{0, 0, 1, 1, 1, 0, 0});
  CHECK(ints(trl.rejected) == std::vector<int32_t>{0, 0, 1, 1, 1, 1, 0});
  // DS-Chat: the ids first differ at 4 (8 vs 9): the shared answer token 7 counts neither
  auto ds = dpo_masks(b, true);
  CHECK(ints(ds.chosen) == std::vector<int32_t>{0, 0, 0, 1, 1, 0, 0});
  CHECK(ints(ds.rejected) == std::vector<int32_t>{0, 0, 0, 1, 1, 1, 0});
  // a batch without prompt lengths (not from rm_batch) is refused
  rm_batch_data bare = b;
  bare.chosen_prompt_len = tensor{};
  CHECK_THROWS_AS(dpo_masks(bare, false), std::invalid_argument);
}

TEST_CASE("dpo data: a pair whose chosen equals its rejected after tokenization is skipped and counted") {
  auto tok = load_tokenizer(test::tokenizer_path());
  std::vector<sample> rows = {{"\n\nHuman: hi\n\nAssistant:", " Hello there.", " Go away."},
                              {"\n\nHuman: yes?\n\nAssistant:", " Same answer.", " Same answer."},
                              {"\n\nHuman: a long question about cats\n\nAssistant:", " Cats are nice.", " Dogs."}};
  tokenize_settings ts;
  ts.max_seq_len = 64;
  process_report rep;
  auto kept_all = make_rm_examples(rows, *tok, ts, &rep);  // the reward model keeps it (its loss is constant)
  CHECK(kept_all.size() == 3);
  CHECK(rep.identical == 1);
  ts.skip_identical = true;
  auto dpo = make_rm_examples(rows, *tok, ts, &rep);
  REQUIRE(dpo.size() == 2);
  CHECK(rep.identical == 1);
  CHECK(rep.kept == 2);
  CHECK(rep.input == 3);
  CHECK(rep.summary().find("1 pairs identical after tokenization (skipped: chosen = rejected)") != std::string::npos);
  CHECK(dpo[1].chosen == kept_all[2].chosen);
  // the prompt length: BOS + the prompt's tokens, the answer starting right after
  std::vector<int32_t> p = {tok->bos_id()};
  for (int32_t id : tok->encode(rows[0].prompt, false, false)) p.push_back(id);
  CHECK(dpo[0].chosen_prompt_len <= static_cast<int64_t>(p.size()));
  CHECK(dpo[0].chosen_prompt_len >= static_cast<int64_t>(p.size()) - 1);  // a token may merge across the boundary
  CHECK(std::equal(dpo[0].chosen.begin(), dpo[0].chosen.begin() + dpo[0].chosen_prompt_len, p.begin()));
  // cut to 4 tokens (prompt_start keeps the answers, end cuts them away): every pair becomes BOS x x EOS
  ts.truncation = truncation_mode::end;
  ts.max_seq_len = 4;
  auto none = make_rm_examples(rows, *tok, ts, &rep);
  CHECK(none.empty());
  CHECK(rep.identical == 3);
}

TEST_CASE("dpo loss: ln 2 while the policy equals the reference (sigmoid), 1/(2 beta)^2 for IPO") {
  auto ex = hh_pairs(64);
  REQUIRE(ex.size() >= 16);
  std::vector<rm_batch_data> batches = {rm_batch(ex, iota(0, 8)), rm_batch(ex, iota(8, 16))};
  decoder reference = clone_decoder(test::stories260k());
  decoder policy = clone_decoder(test::stories260k());
  for (bool div : {false, true}) {
    dpo_settings s;
    s.mask_before_divergence = div;
    const auto e = dpo_eval(policy, reference, batches, s);
    INFO("mask_before_divergence " << div);
    CHECK(e.pairs == 16);
    CHECK(std::fabs(e.loss - std::log(2.0)) < 1e-6);
    CHECK(e.accuracy == 0.0);  // every margin is exactly 0: no pair is "correct"
    CHECK(e.chosen_reward == 0.0);
    CHECK(e.rejected_reward == 0.0);
    CHECK(e.logp_accuracy > 0.0);  // the policy's own comparison is defined
    CHECK(e.logp_accuracy < 1.0);
    CHECK(e.logp_accuracy_stderr == doctest::Approx(std::sqrt(e.logp_accuracy * (1 - e.logp_accuracy) / 16)));
    s.loss.label_smoothing = 0.2;  // −0.8 log σ(0) − 0.2 log σ(0) = ln 2 as well
    CHECK(std::fabs(dpo_eval(policy, reference, batches, s).loss - std::log(2.0)) < 1e-6);
    s.loss.label_smoothing = 0;
    s.loss.loss_type = rlhf::dpo_loss_type::ipo;  // (0 − 1/(2·0.1))² = 25
    CHECK(std::fabs(dpo_eval(policy, reference, batches, s).loss - 25.0) < 1e-6);
  }
  // the engine's first update runs at the same loss, and its gradient is not zero
  auto group = comm::make_inproc_group(1);
  auto c = comm::inproc_communicator(group, 0);
  dschat_settings d = rm_defaults();
  d.per_device_train_batch_size = 8;
  zero_engine eng(policy, *c, engine_settings(policy, d));
  const auto r = dpo_update(eng, reference, {batches[0]}, dpo_settings{}, 1e-4);
  CHECK(std::fabs(r.loss - std::log(2.0)) < 1e-6);
  CHECK(r.pairs == 8);
  CHECK(r.accuracy == 0.0);
  CHECK(r.grad_norm > 1e-3);
  MESSAGE("DPO update 1 at policy = reference: loss " << r.loss << ", gradient norm " << r.grad_norm);
  CHECK_THROWS_AS(dpo_update(eng, reference, {batches[0], batches[1]}, dpo_settings{}, 1e-4), std::invalid_argument);
}

TEST_CASE("dpo loss: the gradient of the batch loss matches central finite differences") {
  const auto ex = tiny_pairs();
  const rm_batch_data b = rm_batch(ex, {0, 1, 2});
  decoder reference = tiny_model(7);  // a different model: the margins are not 0, σ is not 1/2
  struct variant {
    const char* name;
    rlhf::dpo_loss_type type;
    double label_smoothing;
    bool div;
  };
  for (const variant& v : {variant{"sigmoid, prompt masked", rlhf::dpo_loss_type::sigmoid, 0.0, false},
                           variant{"sigmoid + label_smoothing 0.1, divergence", rlhf::dpo_loss_type::sigmoid, 0.1, true},
                           variant{"ipo, prompt masked", rlhf::dpo_loss_type::ipo, 0.0, false}}) {
    INFO(v.name);
    dpo_settings s;
    s.loss.beta = 0.5;
    s.loss.loss_type = v.type;
    s.loss.label_smoothing = v.label_smoothing;
    s.mask_before_divergence = v.div;
    decoder policy = tiny_model(3);
    std::vector<dpo_batch_data> micro(1);
    micro[0].pairs = b;
    {
      activations ar;
      micro[0].ref = dpo_log_probs(reference, ar, b, s);
    }
    const batch_loss l = dpo_batch_loss(micro, s);
    CHECK(l.units(0) == 3);
    activations a;
    const micro_loss r = l.forward(0, policy, a);
    policy.zero_grad();
    policy.backward(a, r.dout);
    const tensor g = policy.grads().flat.clone();
    auto loss_at = [&] {
      activations a2;
      return l.forward(0, policy, a2).loss;
    };
    CHECK(std::fabs(loss_at() - r.loss) < 1e-12);
    // in the embedding (tied head), an attention, an MLP weight and the final norm: each tensor's
    // entry with the largest gradient. The model computes in f32, and the sequence log-probs are f32
    // (pg_math's sequence_log_probs): the loss carries rounding noise of ~1e-7, i.e. ~5e-6 on a
    // difference quotient at h = 1e-2. Central differences at h and h/2, Richardson-extrapolated
    // (truncation error O(h^4)); the tolerance is 1e-3 relative plus that noise floor.
    double worst = 0;
    for (const std::string name : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                                   "model.layers.1.self_attn.v_proj.weight", "model.layers.1.mlp.down_proj.weight",
                                   "model.norm.weight"}) {
      int64_t off = -1;
      for (const auto& e : policy.params())
        if (e.name == name) {
          off = e.offset;
          for (int64_t i = e.offset; i < e.offset + e.numel; ++i)
            if (std::fabs(g.data<float>()[i]) > std::fabs(g.data<float>()[off])) off = i;
        }
      REQUIRE(off >= 0);
      float* p = policy.w().flat.data<float>() + off;
      const float old = *p;
      auto central = [&](float h) {
        *p = old + h;
        const double up = loss_at();
        *p = old - h;
        const double down = loss_at();
        *p = old;
        return (up - down) / (static_cast<double>(old + h) - static_cast<double>(old - h));
      };
      const double d1 = central(2e-2f), d2 = central(1e-2f);
      const double fd = (4.0 * d2 - d1) / 3.0, an = g.data<float>()[off];
      INFO(name << " [" << off << "]: analytic " << an << ", finite difference " << fd << " (h 1e-2: " << d2 << ")");
      CHECK(std::fabs(an) > 1e-3);  // the probe sees a real gradient
      CHECK(std::fabs(fd - an) <= 1e-3 * std::fabs(an) + 1e-5);
      worst = std::max(worst, std::fabs(fd - an) / std::fabs(an));
    }
    MESSAGE(std::string(v.name) << ": loss " << r.loss << ", worst relative finite-difference error " << worst);
    CHECK(worst < 5e-3);
  }
}

TEST_CASE("dpo engine: gradient accumulation over unequal micro-batches and 2 ranks update as one batch") {
  const auto ex = tiny_pairs();
  dschat_settings d = rm_defaults();
  d.adam_eps = 1.0f;  // (test_dschat.cpp kEquivEps: the parameters then compare the gradients themselves)
  dpo_settings s;
  s.loss.beta = 0.5;
  auto run = [&](int world, int64_t micro_batch, int64_t gas, const std::vector<std::vector<int64_t>>& split) {
    std::vector<step_result> steps;
    std::vector<dpo_step_result> res(world);
    tensor params;
    test::on_inproc_ranks(world, [&](int rank, comm::communicator& c) {
      decoder policy = tiny_model(3), reference = tiny_model(7);
      dschat_settings dd = d;
      dd.per_device_train_batch_size = micro_batch;
      dd.gradient_accumulation_steps = gas;
      zero_engine eng(policy, c, engine_settings(policy, dd));
      std::vector<rm_batch_data> micro;
      for (const auto& idx : split) micro.push_back(rm_batch(ex, idx));
      dpo_step_result r;
      for (int u = 0; u < 2; ++u) r = dpo_update(eng, reference, micro, s, 0.05);
      res[rank] = r;
      if (rank == 0) params = eng.gather_full_params();
    });
    return std::make_pair(res[0], params);
  };
  const auto [one, p1] = run(1, 3, 1, {{0, 1, 2}});
  const auto [acc, p2] = run(1, 2, 2, {{0, 1}, {2}});      // 2 pairs + 1 pair: the loss is the mean over 3 pairs
  const auto [ranks, p3] = run(2, 2, 1, {{0, 1}, {2}});    // rank 0 runs {0, 1}, rank 1 runs {2}
  MESSAGE("update 2: loss " << one.loss << ", accuracy " << one.accuracy << ", gradient norm " << one.grad_norm);
  for (const auto* r : {&acc, &ranks}) {
    CHECK(std::fabs(r->loss - one.loss) < 1e-6);
    CHECK(std::fabs(r->grad_norm - one.grad_norm) < 1e-5 * std::max(1.0, one.grad_norm));
    CHECK(r->pairs == 3);
    CHECK(r->accuracy == one.accuracy);
    CHECK(std::fabs(r->chosen_reward - one.chosen_reward) < 1e-5);
  }
  CHECK(max_abs_diff(p2, p1) < 1e-6);
  CHECK(max_abs_diff(p3, p1) < 1e-6);
}

TEST_CASE("dpo training: a few updates on 8 HH-RLHF pairs raise their preference accuracy and lower the loss") {
  auto ex = hh_pairs(64);
  REQUIRE(ex.size() >= 8);
  const rm_batch_data b = rm_batch(ex, iota(0, 8));
  decoder reference = clone_decoder(test::stories260k());
  decoder policy = clone_decoder(test::stories260k());
  dpo_settings s;  // beta 0.1, sigmoid, TRL's prompt masking
  const auto before = dpo_eval(policy, reference, {b}, s);
  auto group = comm::make_inproc_group(1);
  auto c = comm::inproc_communicator(group, 0);
  dschat_settings d = rm_defaults();
  d.per_device_train_batch_size = 8;
  zero_engine eng(policy, *c, engine_settings(policy, d));
  std::vector<double> losses, accs;
  for (int u = 0; u < 8; ++u) {
    const auto r = dpo_update(eng, reference, {b}, s, 2e-4);
    REQUIRE(std::isfinite(r.loss));
    losses.push_back(r.loss);
    accs.push_back(r.accuracy);
  }
  eng.release_model();
  const auto after = dpo_eval(policy, reference, {b}, s);
  std::string curve;
  for (size_t i = 0; i < losses.size(); ++i) curve += " " + std::to_string(losses[i]) + "/" + std::to_string(accs[i]);
  MESSAGE("8 updates (lr 2e-4): loss/accuracy" << curve << "; after: loss " << after.loss << ", accuracy "
                                                 << after.accuracy << ", chosen reward " << after.chosen_reward
                                                 << ", rejected " << after.rejected_reward << ", logp accuracy "
                                                 << before.logp_accuracy << " -> " << after.logp_accuracy);
  CHECK(std::fabs(losses[0] - std::log(2.0)) < 1e-6);
  CHECK(accs[0] == 0.0);
  CHECK(after.loss < std::log(2.0) - 0.1);
  CHECK(after.accuracy >= 0.75);
  CHECK(after.chosen_reward > after.rejected_reward);
  CHECK(losses.back() < losses[0]);
  // DS-Chat's masking gives the sigmoid loss the same z: the tokens it adds or drops (the prompt, a
  // shared answer start) have equal log-probs in chosen and rejected under a causal model
  dpo_settings ds = s;
  ds.mask_before_divergence = true;
  const auto after_ds = dpo_eval(policy, reference, {b}, ds);
  const double margin = after.chosen_reward - after.rejected_reward;  // mean β z
  CHECK(std::fabs((after_ds.chosen_reward - after_ds.rejected_reward) - margin) < 1e-4 * std::fabs(margin));
  CHECK(std::fabs(after_ds.loss - after.loss) < 1e-3 * after.loss);
  CHECK(after_ds.accuracy == after.accuracy);
  CHECK(std::fabs(after_ds.chosen_reward - after.chosen_reward) > 1e-3);  // the per-side rewards do differ
}
