// PPO phases on stories260K (actor, reference, critic and reward all start from
// the real weights; the critic and reward get value heads).
#include <doctest/doctest.h>

#include <cmath>

#include "models/llama2c.h"
#include "models/ppo.h"
#include "models/tokenizer.h"
#include "test_util.h"

using namespace flowrun;

namespace {

// Left-padded prompt batch from texts.
void prompt_batch(const tokenizer& tok, const std::vector<std::string>& texts, tensor& ids, tensor& mask) {
  std::vector<std::vector<int32_t>> rows;
  int64_t P = 0;
  for (auto& t : texts) {
    rows.push_back(tok.encode(t, true));
    P = std::max<int64_t>(P, static_cast<int64_t>(rows.back().size()));
  }
  const int64_t B = static_cast<int64_t>(rows.size());
  ids = tensor::zeros({B, P}, dtype::i32);
  mask = tensor::zeros({B, P}, dtype::i32);
  for (int64_t b = 0; b < B; ++b) {
    int64_t pad = P - static_cast<int64_t>(rows[b].size());
    for (size_t i = 0; i < rows[b].size(); ++i) {
      ids.data<int32_t>()[b * P + pad + i] = rows[b][i];
      mask.data<int32_t>()[b * P + pad + i] = 1;
    }
  }
}

}  // namespace

TEST_CASE("PPO: rollouts, scores, advantages and one actor/critic update") {
  auto tok = load_tokenizer(test::tokenizer_path());
  auto actor = load_llama2c(test::model_path());
  auto ref = load_llama2c(test::model_path());
  auto critic = load_llama2c(test::model_path());
  critic.add_value_head(1);
  auto reward = load_llama2c(test::model_path());
  reward.add_value_head(2);
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The little dog was", "Lily and Ben"}, prompts, pmask);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 16;
  auto e = ppo::generate_rollouts(actor, prompts, pmask, s, tok->eos_id(), 0, 7);
  REQUIRE(e.has_value());
  const int64_t B = e->seq.size(0), S = e->seq.size(1), P = prompts.size(1);
  CHECK(S <= P + 16);
  for (int64_t b = 0; b < B; ++b) {
    int64_t real = 0;
    for (int64_t t = P; t < S; ++t) real += e->attention_mask.data<int32_t>()[b * S + t];
    CHECK(real == e->answer_len[b]);
    CHECK(real > 1);
  }
  activations a;
  e->logprobs = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask);
  e->ref_logprobs = ppo::sequence_logprobs(ref, a, e->seq, e->attention_mask);
  e->values = ppo::sequence_values(critic, a, e->seq, e->attention_mask);
  e->reward_score = ppo::reward_scores(reward, e->seq, e->attention_mask);
  CHECK(e->logprobs.shape() == shape_t{B, S - 1});
  // the actor and the reference are the same weights: KL is exactly zero
  CHECK(ppo::mean_kl(*e) == 0.0);
  // a logprob of a real answer token is a log-probability
  CHECK(e->logprobs.item(e->start()) < 0.0f);
  tensor adv, ret;
  ppo::make_advantages(*e, s.ppo, adv, ret);
  CHECK(adv.shape() == shape_t{B, S - 1 - e->start()});
  ops::adamw_config oa;
  adamw_optimizer aopt(actor, oa), copt(critic, oa);
  double gn = 0;
  // old == new policy: ratio 1, so the loss is -mean(advantages) over answer tokens
  double want = 0, n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < adv.size(1); ++t)
      if (e->attention_mask.data<int32_t>()[b * S + e->start() + 1 + t]) {
        want -= adv.data<float>()[b * adv.size(1) + t];
        n += 1;
      }
  double al = ppo::actor_train_step(actor, aopt, *e, adv, s, &gn);
  CHECK(al == doctest::Approx(want / n).epsilon(1e-4));
  CHECK(gn > 0.0);
  double cl = ppo::critic_train_step(critic, copt, *e, ret, s, &gn);
  CHECK(cl > 0.0);
  // after the update the policy moved away from the reference
  e->logprobs = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask);
  CHECK(std::fabs(ppo::mean_kl(*e)) > 0.0);
}

TEST_CASE("PPO: a batch whose answers are all dropped gives no experience (no deadlock)") {
  auto tok = load_tokenizer(test::tokenizer_path());
  auto actor = load_llama2c(test::model_path());
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The end."}, prompts, pmask);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 1;  // at most one token per answer: every row is dropped, as DS-Chat drops them
  auto e = ppo::generate_rollouts(actor, prompts, pmask, s, tok->eos_id(), 0, 3);
  CHECK_FALSE(e.has_value());
}

TEST_CASE("PPO: temperature near 0 samples the greedy path and its log-probs stay finite") {
  // Reliability (#17): a temperature of 1e-6 divides logits by 1e-6 in the sampler; the rollout must be the
  // greedy one (temperature 0) and the old policy's log-probs finite (never -inf or NaN).
  auto tok = load_tokenizer(test::tokenizer_path());
  auto actor = load_llama2c(test::model_path());
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The little dog was", "Lily and Ben"}, prompts, pmask);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 16;
  s.temperature = 0.0f;
  auto greedy = ppo::generate_rollouts(actor, prompts, pmask, s, tok->eos_id(), 0, 7);
  REQUIRE(greedy.has_value());
  for (float t : {1e-6f, 1e-4f}) {
    s.temperature = t;
    auto e = ppo::generate_rollouts(actor, prompts, pmask, s, tok->eos_id(), 0, 11);
    REQUIRE(e.has_value());
    INFO("temperature " << t);
    REQUIRE(e->seq.shape() == greedy->seq.shape());
    CHECK(std::equal(e->seq.data<int32_t>(), e->seq.data<int32_t>() + e->seq.numel(), greedy->seq.data<int32_t>()));
    activations a;
    tensor lp = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask);
    const int64_t B = lp.size(0), L = lp.size(1);
    int64_t counted = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = e->start(); i < L; ++i) {
        if (e->attention_mask.data<int32_t>()[b * (L + 1) + i + 1] == 0) continue;
        const float v = lp.data<float>()[b * L + i];
        CHECK(std::isfinite(v));
        CHECK(v <= 0.0f);
        ++counted;
      }
    CHECK(counted > 0);
  }
}

TEST_CASE("PPO: pad == eos: the answer's EOS is a real token of the mask, padding after it is not") {
  // Reliability (#17): models whose tokenizer has no pad token use EOS as pad (DS-Chat sets
  // tokenizer.pad_token = tokenizer.eos_token). The mask must come from positions: the first EOS of an
  // answer counts as real (it is trained on), what follows it does not.
  auto tok = load_tokenizer(test::tokenizer_path());
  auto actor = load_llama2c(test::model_path());
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The little dog was", "Lily and Ben", "One day"}, prompts, pmask);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 48;
  // stories260K rarely emits its EOS within 48 tokens: the end token here is the full stop, which it
  // emits often, so that most answers end early and are followed by padding that is the same id
  const auto dot = tok->encode("The dog ran.", false);
  REQUIRE(!dot.empty());
  const int32_t eos = dot.back();
  REQUIRE(tok->piece(eos).find('.') != std::string::npos);
  auto e = ppo::generate_rollouts(actor, prompts, pmask, s, eos, /*pad_id=*/eos, 5);
  REQUIRE(e.has_value());
  const int64_t B = e->seq.size(0), S = e->seq.size(1), P = prompts.size(1);
  int64_t ended = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = e->seq.data<int32_t>() + b * S;
    const int32_t* m = e->attention_mask.data<int32_t>() + b * S;
    int64_t first_eos = -1;
    for (int64_t t = P; t < S && first_eos < 0; ++t)
      if (row[t] == eos) first_eos = t;
    const int64_t real_end = first_eos >= 0 ? first_eos + 1 : S;  // the EOS itself is real
    for (int64_t t = P; t < S; ++t) CHECK(m[t] == (t < real_end ? 1 : 0));
    CHECK(e->answer_len[b] == real_end - P);
    if (first_eos >= 0) ++ended;
  }
  CHECK(ended >= 2);  // the case this test is about: an end token inside the answer, padding after it
  MESSAGE(ended << " of " << B << " answers ended within 48 tokens");
}
