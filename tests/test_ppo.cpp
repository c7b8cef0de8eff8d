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
