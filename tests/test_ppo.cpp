// PPO phases on stories260K (actor, reference, critic and reward all start from
// the real weights; the critic and reward get value heads).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "models/generate.h"
#include "models/llama2c.h"
#include "models/rlhf/ppo.h"
#include "models/tokenizer.h"
#include "test_ranks.h"
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

// Whether two f32 tensors of one shape hold the very same bits.
bool same_bits(const tensor& x, const tensor& y) {
  return x.shape() == y.shape() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

/// stories260K three times: the policy, the critic (a value head of 1 output) and the reward model (a
/// value head of 2 outputs).
struct ppo_models {
  decoder actor, critic, reward;
};
ppo_models load_ppo_models() {
  ppo_models m{load_llama2c(test::model_path()), load_llama2c(test::model_path()), load_llama2c(test::model_path())};
  m.critic.add_value_head(1);
  m.reward.add_value_head(2);
  return m;
}

}  // namespace

TEST_CASE("PPO: rollouts, scores, advantages and one actor/critic update") {
  auto tok = load_tokenizer(test::tokenizer_path());
  auto [actor, critic, reward] = load_ppo_models();
  auto ref = load_llama2c(test::model_path());
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The little dog was", "Lily and Ben"}, prompts, pmask);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 16;
  auto e = ppo::generate_rollouts(actor, prompts, pmask, s, {tok->eos_id()}, 0, 7);
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
  e->reward_score = ppo::reward_scores(reward, a, e->seq, e->attention_mask);
  CHECK(e->logprobs.shape() == shape_t{B, S - 1});
  // the actor and the reference are the same weights: KL is exactly zero
  CHECK(ppo::mean_kl(*e) == 0.0);
  // a logprob of a real answer token is a log-probability
  CHECK(e->logprobs.item(e->start()) < 0.0f);
  tensor adv, ret;
  ppo::make_advantages(*e, s.ppo, adv, ret);
  CHECK(adv.shape() == shape_t{B, S - 1 - e->start()});
  auto c1 = comm::inproc_communicator(comm::make_inproc_group(1), 0);
  auto c2 = comm::inproc_communicator(comm::make_inproc_group(1), 0);
  zero_settings zs;
  zs.gradient_clipping = 1.0;
  zero_engine aeng(actor, *c1, zs), ceng(critic, *c2, zs);
  // old == new policy: ratio 1, so the loss is -mean(advantages) over answer tokens
  double want = 0, n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < adv.size(1); ++t)
      if (e->attention_mask.data<int32_t>()[b * S + e->start() + 1 + t]) {
        want -= adv.data<float>()[b * adv.size(1) + t];
        n += 1;
      }
  const step_result ar = ppo::actor_update(aeng, *e, adv, s, 1e-3);
  CHECK(ar.loss == doctest::Approx(want / n).epsilon(1e-4));
  CHECK(ar.grad_norm > 0.0);
  CHECK(ar.tokens == static_cast<int64_t>(n));  // the units: the answer tokens
  const step_result cr = ppo::critic_update(ceng, *e, ret, s, 1e-3);
  CHECK(cr.loss > 0.0);
  // after the update the policy moved away from the reference
  e->logprobs = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask);
  CHECK(std::fabs(ppo::mean_kl(*e)) > 0.0);
}

TEST_CASE("PPO: an update that takes over the trainer's scoring forward equals one that runs it again") {
  // The trainers score the rows into the engine's activations; the synchronous loop's first
  // update on them (`scored`) skips its own forward. Two actors and two critics from the same
  // weights: one pair runs every forward, the other reuses the scoring forward; the losses,
  // gradient norms and updated weights must be bitwise equal.
  auto tok = load_tokenizer(test::tokenizer_path());
  auto a1 = load_llama2c(test::model_path()), a2 = load_llama2c(test::model_path());
  auto c1 = load_llama2c(test::model_path()), c2 = load_llama2c(test::model_path());
  c1.add_value_head(1);
  c2.add_value_head(1);
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The little dog was", "Lily and Ben"}, prompts, pmask);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 12;
  auto e = ppo::generate_rollouts(a1, prompts, pmask, s, {tok->eos_id()}, 0, 11);
  REQUIRE(e.has_value());
  auto comms = std::vector<std::shared_ptr<comm::communicator>>{};
  for (int i = 0; i < 4; ++i) comms.push_back(comm::inproc_communicator(comm::make_inproc_group(1), 0));
  zero_settings zs;
  zs.gradient_clipping = 1.0;
  zero_engine ea1(a1, *comms[0], zs), ea2(a2, *comms[1], zs), ec1(c1, *comms[2], zs), ec2(c2, *comms[3], zs);
  activations fresh;
  e->logprobs = ppo::sequence_logprobs(a1, fresh, e->seq, e->attention_mask);
  e->ref_logprobs = e->logprobs.clone();
  e->values = ppo::sequence_values(c1, fresh, e->seq, e->attention_mask);
  e->reward_score = tensor::from_floats({e->seq.size(0)}, std::vector<float>(static_cast<size_t>(e->seq.size(0)), 0.5f));
  tensor adv, ret;
  ppo::make_advantages(*e, s.ppo, adv, ret);
  // the reusing pair scores into its engines' activations, as ppo_trainer::score does
  const tensor lp2 = ppo::sequence_logprobs(a2, ea2.forward_activations(), e->seq, e->attention_mask);
  const tensor v2 = ppo::sequence_values(c2, ec2.forward_activations(), e->seq, e->attention_mask);
  CHECK(ppo::holds_forward_of(ea2.forward_activations(), e->seq, e->attention_mask));
  CHECK_FALSE(ppo::holds_forward_of(ea2.forward_activations(), e->seq.clone(), e->attention_mask));
  CHECK_FALSE(ppo::holds_forward_of(ea2.forward_activations(), e->seq.rows(0, 1), e->attention_mask.rows(0, 1)));
  CHECK(same_bits(lp2, e->logprobs));
  CHECK(same_bits(v2, e->values));
  const step_result r1 = ppo::actor_update(ea1, *e, adv, s, 1e-3);
  const step_result r2 = ppo::actor_update(ea2, *e, adv, s, 1e-3, /*scored=*/true);
  CHECK(r1.loss == r2.loss);
  CHECK(r1.grad_norm == r2.grad_norm);
  CHECK(r1.grad_norm > 0.0);
  CHECK(same_bits(a1.w().flat, a2.w().flat));
  const step_result q1 = ppo::critic_update(ec1, *e, ret, s, 1e-3);
  const step_result q2 = ppo::critic_update(ec2, *e, ret, s, 1e-3, /*scored=*/true);
  CHECK(q1.loss == q2.loss);
  CHECK(q1.grad_norm == q2.grad_norm);
  CHECK(same_bits(c1.w().flat, c2.w().flat));
  CHECK(same_bits(c1.w().adapter_flat, c2.w().adapter_flat));
  // `scored` on activations of other rows (the update above left a training forward of the
  // same rows under the old weights: what a second epoch would see, which the trainer never
  // marks scored) is guarded only by the rows; rows that differ run the forward: the second
  // update with scored = true on a copy of the rows equals one without
  ppo::experience copy = *e;
  copy.seq = e->seq.clone();
  copy.attention_mask = e->attention_mask.clone();
  const step_result s1 = ppo::actor_update(ea1, copy, adv, s, 1e-3);
  const step_result s2 = ppo::actor_update(ea2, copy, adv, s, 1e-3, /*scored=*/true);
  CHECK(s1.loss == s2.loss);
  CHECK(same_bits(a1.w().flat, a2.w().flat));
}

TEST_CASE("PPO: micro_slice_of cuts a mini-batch over ranks x accumulation, empty slices run a row with no weight") {
  auto m = ppo::micro_slice_of(3, 2, 0);
  CHECK((m.a == 0 && m.b == 2 && !m.empty));
  m = ppo::micro_slice_of(3, 2, 1);
  CHECK((m.a == 2 && m.b == 3 && !m.empty));
  m = ppo::micro_slice_of(3, 4, 3);  // 4 micro-batches of 1 row over 3 rows: the last is empty
  CHECK((m.a == 2 && m.b == 3 && m.empty));
  CHECK_THROWS_AS(ppo::micro_slice_of(3, 2, 2), std::invalid_argument);
}

namespace {

// What one data-parallel PPO run gives: per update the actor, critic and ptx losses (rank 0's
// step_result, which is the global batch's), and the final weights gathered whole.
struct ppo_run {
  std::vector<double> losses;
  tensor actor_params, critic_params, critic_v_head;
};

// Two actor + critic updates and one ptx update on `e` through the engine on `world` inproc
// ranks at ZeRO `stage` with `gas` micro-batches per rank, each rank from the same weights.
ppo_run run_ppo_ranks(const ppo::experience& e, const tensor& adv, const tensor& ret, const tensor& ptx_ids,
                      const tensor& ptx_labels, int world, int stage, int64_t gas) {
  ppo_run out;
  test::on_inproc_ranks(world, [&](int r, comm::communicator& ca) {
    auto actor = load_llama2c(test::model_path());
    auto critic = load_llama2c(test::model_path());
    critic.add_value_head(1);
    zero_settings zs;
    zs.stage = stage;
    zs.gradient_accumulation_steps = gas;
    zs.gradient_clipping = 1.0;
    zs.adamw.beta2 = 0.95f;
    zero_engine aeng(actor, ca, zs);
    ppo::ppo_settings s;
    s.unsup_coef = 2.0f;
    std::vector<double> losses;
    for (int it = 0; it < 2; ++it) {
      losses.push_back(ppo::actor_update(aeng, e, adv, s, 1e-3).loss);
      losses.push_back(ppo::ptx_update(aeng, ptx_ids, ptx_labels, s, 1e-3).loss);
    }
    // the critic over the same ranks (its engine after the actor's: collectives in one order)
    zero_engine ceng(critic, ca, zs);
    for (int it = 0; it < 2; ++it) losses.push_back(ppo::critic_update(ceng, e, ret, s, 1e-3).loss);
    tensor ap = aeng.gather_full_params(), cp = ceng.gather_full_params();
    if (r == 0) {
      out.losses = losses;
      out.actor_params = ap;
      out.critic_params = cp;
      out.critic_v_head = ceng.adapter_params();  // the value head: replicated, all-reduced gradients
    }
  });
  return out;
}

double max_abs_diff(const tensor& a, const tensor& b) {
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, std::fabs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  return d;
}

/// How many elements of a and b differ by more than tol.
int64_t count_over(const tensor& a, const tensor& b, double tol) {
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    n += std::fabs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]) > tol;
  return n;
}

}  // namespace

TEST_CASE("PPO through the engine: 2 ranks at ZeRO stages 0-3, with accumulation, give the 1-rank losses and weights") {
  // The global mini-batch is split, not changed: each micro-batch's loss is a token mean
  // weighed by its answer tokens (zero.h normalization), so the actor, critic and ptx losses
  // and the updates equal one rank's to float tolerance. 3 rows over 2 ranks is uneven, and
  // with 2 accumulation steps one rank's second micro-batch is empty (a row run with no weight).
  auto tok = load_tokenizer(test::tokenizer_path());
  auto [actor, critic, reward] = load_ppo_models();
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The little dog was", "Lily and Ben"}, prompts, pmask);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 12;
  auto e = ppo::generate_rollouts(actor, prompts, pmask, s, {tok->eos_id()}, 0, 7);
  REQUIRE(e.has_value());
  REQUIRE(e->seq.size(0) == 3);
  activations a;
  e->logprobs = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask);
  // an older policy: perturbed log-probs so that the ratio is not 1 and clipping matters
  e->ref_logprobs = e->logprobs.clone();
  for (int64_t i = 0; i < e->logprobs.numel(); ++i) e->logprobs.data<float>()[i] += 0.3f * std::sin(0.7f * i);
  e->values = ppo::sequence_values(critic, a, e->seq, e->attention_mask);
  e->reward_score = ppo::reward_scores(reward, a, e->seq, e->attention_mask);
  tensor adv, ret;
  ppo::make_advantages(*e, s.ppo, adv, ret);
  // ptx rows: 3 rows of 10 tokens of text, the last label ignored (-100)
  auto ids = tensor::zeros({3, 10}, dtype::i32), labels = tensor::zeros({3, 10}, dtype::i32);
  const auto text = tok->encode("Once upon a time there was a little girl named Lily. She liked to play with her toys in the park. One day, she saw a big red ball under a tree and ran to get it.", true);
  REQUIRE(text.size() >= 31);
  for (int64_t i = 0; i < 30; ++i) {
    ids.data<int32_t>()[i] = text[i];
    labels.data<int32_t>()[i] = i % 10 == 9 ? -100 : text[i + 1];
  }
  const ppo_run ref1 = run_ppo_ranks(*e, adv, ret, ids, labels, 1, 0, 1);
  REQUIRE(ref1.losses.size() == 6);
  for (double l : ref1.losses) CHECK(std::isfinite(l));
  CHECK(ref1.losses[0] != doctest::Approx(ref1.losses[2]));  // the second actor update saw the first's effect
  const auto init = load_llama2c(test::model_path());
  CHECK(max_abs_diff(ref1.actor_params, init.w().flat) > 1e-3);  // the updates moved the weights
  for (int stage = 0; stage <= 3; ++stage)
    for (int64_t gas : {int64_t{1}, int64_t{2}}) {
      CAPTURE(stage);
      CAPTURE(gas);
      const ppo_run r = run_ppo_ranks(*e, adv, ret, ids, labels, 2, stage, gas);
      for (size_t i = 0; i < r.losses.size(); ++i) CHECK(r.losses[i] == doctest::Approx(ref1.losses[i]).epsilon(1e-5));
      // AdamW moves every element by about lr per step whatever its gradient's size, so the
      // summation-order noise of a near-zero gradient shows in the weights of single elements:
      // the largest difference at most 5e-5 (5% of one step at lr 1e-3; the 4 actor steps moved
      // the weights by up to 4e-3), and at most 10 of the 260,032 elements over 1e-5. Measured:
      // every x86 path <= 1.2e-5; NEON (tools/arm64_check.sh, under qemu) 2.6e-5 on one critic
      // element at gas = 2, none other over 1e-5. A wrong split or weighting moves most
      // elements, by up to lr
      for (const auto& [got, want] : {std::pair{&r.actor_params, &ref1.actor_params},
                                      std::pair{&r.critic_params, &ref1.critic_params},
                                      std::pair{&r.critic_v_head, &ref1.critic_v_head}}) {
        CHECK(max_abs_diff(*got, *want) < 5e-5);
        CHECK(count_over(*got, *want, 1e-5) <= 10);
      }
    }
}

TEST_CASE("PPO: a batch whose answers are all dropped gives no experience (no deadlock)") {
  auto tok = load_tokenizer(test::tokenizer_path());
  auto actor = load_llama2c(test::model_path());
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The end."}, prompts, pmask);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 1;  // at most one token per answer: every row is dropped, as DS-Chat drops them
  auto e = ppo::generate_rollouts(actor, prompts, pmask, s, {tok->eos_id()}, 0, 3);
  CHECK_FALSE(e.has_value());
}

TEST_CASE("PPO: an answer ends at the first of the stop ids it samples, which its text leaves out") {
  // DS-Chat's generate() stops at every eos_token_id of the model's generation config (Qwen2-Instruct's
  // <|im_end|> and <|endoftext|>): rollouts stopped at the tokenizer's EOS only and ran to max_answer_seq_len
  auto tok = load_tokenizer(test::tokenizer_path());
  auto actor = load_llama2c(test::model_path());
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The little dog was"}, prompts, pmask);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 12;
  s.temperature = 0.0f;
  auto free_run = ppo::generate_rollouts(actor, prompts, pmask, s, {tok->eos_id()}, 0, 7);
  REQUIRE(free_run.has_value());
  const int64_t P = free_run->prompts.size(1), S = free_run->seq.size(1);
  // row 0's third greedy answer token, made a stop id: the row ends there, that token kept as its last
  REQUIRE(free_run->answer_len[0] >= 4);
  const int32_t stop = free_run->seq.data<int32_t>()[P + 2];
  const int32_t first = free_run->seq.data<int32_t>()[P];
  REQUIRE(stop != tok->eos_id());
  REQUIRE(stop != first);
  REQUIRE(stop != free_run->seq.data<int32_t>()[P + 1]);
  auto e = ppo::generate_rollouts(actor, prompts, pmask, s, {tok->eos_id(), stop}, 0, 7);
  REQUIRE(e.has_value());
  CHECK(e->answer_len[0] == 3);
  CHECK(e->stop_ids == std::vector<int32_t>{tok->eos_id(), stop});
  const int64_t S2 = e->seq.size(1);
  CHECK(e->seq.data<int32_t>()[P + 2] == stop);
  for (int64_t t = P + 3; t < S2; ++t) CHECK(e->attention_mask.data<int32_t>()[t] == 0);  // nothing after it
  const auto ids = ppo::rollout_row_ids(*e, 0);  // the text leaves the stop id out, as it does the EOS
  CHECK(ids.answer == std::vector<int32_t>{first, free_run->seq.data<int32_t>()[P + 1]});
  CHECK(S2 <= S);
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
  auto greedy = ppo::generate_rollouts(actor, prompts, pmask, s, {tok->eos_id()}, 0, 7);
  REQUIRE(greedy.has_value());
  for (float t : {1e-6f, 1e-4f}) {
    s.temperature = t;
    auto e = ppo::generate_rollouts(actor, prompts, pmask, s, {tok->eos_id()}, 0, 11);
    REQUIRE(e.has_value());
    INFO("temperature " << t);
    REQUIRE(e->seq.shape() == greedy->seq.shape());
    CHECK(std::equal(e->seq.data<int32_t>(), e->seq.data<int32_t>() + e->seq.numel(), greedy->seq.data<int32_t>()));
    activations a;
    CHECK(e->temperature == t);  // log-probs at the sampling temperature: logits / 1e-6 stay finite
    tensor lp = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask, e->temperature);
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
  auto e = ppo::generate_rollouts(actor, prompts, pmask, s, {eos}, /*pad_id=*/eos, 5);
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

TEST_CASE("PPO hybrid engine at ZeRO-3: ranks whose answers end at different steps do not hang") {
  // The policy's ranks gather the blocks once (a collective) and generate with the whole
  // weights, locally: no collective runs per decoding step, so a rank whose answer ends at its
  // first tokens and one that decodes to max_new_tokens meet again at the next collective (the
  // DS-Chat / OpenRLHF ZeRO-3 hang came from gathering per decoding step). Each rank's answers
  // equal the unsharded model's.
  auto tok = load_tokenizer(test::tokenizer_path());
  const std::vector<int32_t> prompt = tok->encode("Once upon a time", true);
  auto whole = load_llama2c(test::model_path());
  generation_config g;
  g.sampling.temperature = 0.0f;  // greedy
  g.max_new_tokens = 16;
  const auto ref = generate(whole, {prompt}, g)[0].tokens;
  REQUIRE(ref.size() == 16);
  std::vector<std::vector<int32_t>> got(2);
  std::vector<double> losses(2);
  test::on_inproc_ranks(2, [&](int r, comm::communicator& c) {
    auto actor = load_llama2c(test::model_path());
    zero_settings zs;
    zs.stage = 3;
    zero_engine eng(actor, c, zs);
    decoder gen(actor.config());
    gen.w().flat.copy_from(eng.gather_full_params());  // the hybrid engine's gather, once
    generation_config mine = g;
    if (r == 0) mine.stop_ids = {ref[1]};  // rank 0's answer ends at its second token, rank 1's runs to 16
    got[r] = generate(gen, {prompt}, mine)[0].tokens;
    // then a collective step on both ranks (a ZeRO-3 forward and backward): completes, no hang
    auto ids = tensor::zeros({2, 8}, dtype::i32), tg = tensor::zeros({2, 8}, dtype::i32);
    for (int64_t i = 0; i < 16; ++i) {
      ids.data<int32_t>()[i] = ref[i % 16];
      tg.data<int32_t>()[i] = ref[(i + 1) % 16];
    }
    losses[r] = eng.train_step(ids, tg, 1e-4).loss;
  });
  CHECK(got[0].size() == 2);
  CHECK(got[1] == ref);
  CHECK(std::vector<int32_t>(ref.begin(), ref.begin() + 2) == got[0]);
  CHECK(losses[0] == losses[1]);
  CHECK(std::isfinite(losses[0]));
}

TEST_CASE("PPO: scoring at the answer's positions (keep_from) gives the full forward's log-probs, values and scores") {
  // The answers' rows only: the last layer's MLP and the head skip the prompt (decoder::forward's keep_from).
  // The answers end at different steps (EOS), so the reward reads each row's own last token.
  auto tok = load_tokenizer(test::tokenizer_path());
  auto [actor, critic, reward] = load_ppo_models();
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The little dog was", "Lily and Ben", "Tom had a red"}, prompts, pmask);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 24;
  auto e = ppo::generate_rollouts(actor, prompts, pmask, s, {tok->eos_id()}, 0, 11);
  REQUIRE(e.has_value());
  const int64_t keep = e->start(), L = e->seq.size(1) - 1, B = e->seq.size(0);
  REQUIRE(keep > 0);
  activations a;
  const auto same_from = [&](const tensor& full, const tensor& kept, int64_t from) {
    int64_t differ = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = from; t < L; ++t) differ += full.data<float>()[b * L + t] != kept.data<float>()[b * L + t];
    return differ;
  };
  // answers of several lengths: row b's last 3b answer tokens are padding (an EOS came earlier)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = L + 1 - 3 * b; t <= L; ++t) e->attention_mask.data<int32_t>()[b * (L + 1) + t] = 0;
  const tensor lp_full = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask);
  const tensor lp_kept = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask, 1.0f, keep);
  CHECK(a.keep_from == keep);
  CHECK(same_from(lp_full, lp_kept, keep) == 0);
  const tensor v_full = ppo::sequence_values(critic, a, e->seq, e->attention_mask);
  const tensor v_kept = ppo::sequence_values(critic, a, e->seq, e->attention_mask, keep);
  CHECK(same_from(v_full, v_kept, keep) == 0);
  const tensor full = ppo::reward_scores(reward, a, e->seq, e->attention_mask);
  const tensor kept = ppo::reward_scores(reward, a, e->seq, e->attention_mask, keep);
  CHECK(a.keep_from == L - 3 * (B - 1));  // from the earliest row's last token
  for (int64_t b = 0; b < B; ++b) CHECK(kept.data<float>()[b] == doctest::Approx(full.data<float>()[b]).epsilon(1e-6));
  // a row whose last real token lies before keep_from (an empty answer and its prompt's padding cut): a full forward
  tensor m2 = e->attention_mask.clone();
  for (int64_t t = keep; t <= L; ++t) m2.data<int32_t>()[t] = 0;
  m2.data<int32_t>()[keep - 1] = 1;
  const tensor cut = ppo::reward_scores(reward, a, e->seq, m2, keep);
  CHECK(a.keep_from == 0);
  CHECK(cut.data<float>()[0] == doctest::Approx(ppo::reward_scores(reward, a, e->seq, m2).data<float>()[0]));
}

TEST_CASE("PPO: with ppo_epochs = 1 the first ratio is exactly 1, whatever the micro-batch split") {
  // The old log-probs are scored on the whole rollout batch (or on each rank's rows); the first
  // update recomputes them on each micro-batch. On the CPU in fp32 a row's log-probs do not
  // depend on its batch mates or the batch size, so the ratio exp(new - old) is exactly 1.
  auto tok = load_tokenizer(test::tokenizer_path());
  auto actor = load_llama2c(test::model_path());
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The little dog was", "Lily and Ben", "Tom had a red"}, prompts, pmask);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 12;
  auto e = ppo::generate_rollouts(actor, prompts, pmask, s, {tok->eos_id()}, 0, 5);
  REQUIRE(e.has_value());
  activations a;
  const tensor old = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask);
  const int64_t B = e->seq.size(0), L = old.size(1);
  for (int64_t M : {int64_t{1}, int64_t{2}, int64_t{3}, B}) {
    CAPTURE(M);
    for (int64_t k = 0; k < M; ++k) {
      const auto m = ppo::micro_slice_of(B, M, k);
      if (m.empty) continue;
      activations am;
      const tensor lp = ppo::sequence_logprobs(actor, am, e->seq.rows(m.a, m.b), e->attention_mask.rows(m.a, m.b));
      int64_t differ = 0;
      for (int64_t i = 0; i < lp.numel(); ++i) differ += lp.data<float>()[i] != old.data<float>()[m.a * L + i];
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("PPO: the generator's behaviour log-probs are the trainer's old log-probs, at any temperature") {
  // Asynchronous RLHF (docs/rlhf.md, max_staleness): the generator records each sampled token's
  // log-prob while it samples, the log-softmax of the logits divided by the sampling temperature, as
  // sequence_logprobs computes it at the experience's temperature (TRL, veRL and OpenRLHF divide
  // by it; top-k shapes what is sampled, not the log-prob). With the same weights (max_staleness =
  // 0, ppo_epochs = 1) the generator's numbers must be the trainer's old log-probs; only the KV
  // cache's summation order differs (fp32). The actor's loss takes them at that temperature too:
  // with old = its own log-probs every ratio is exactly 1 and the clipped loss is -token-mean(A).
  auto tok = load_tokenizer(test::tokenizer_path());
  auto actor = load_llama2c(test::model_path());
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The little dog was", "Lily and Ben", "Tom had a red"}, prompts, pmask);
  for (float temperature : {1.0f, 0.7f}) {
    CAPTURE(temperature);
    ppo::ppo_settings s;
    s.max_answer_seq_len = 12;
    s.temperature = temperature;
    s.top_k = temperature < 1 ? 20 : 0;
    auto e = ppo::generate_rollouts(actor, prompts, pmask, s, {tok->eos_id()}, 0, 5);
    REQUIRE(e.has_value());
    CHECK(e->temperature == temperature);
    activations a;
    const tensor old = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask, e->temperature);
    const tensor raw = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask);  // temperature 1
    REQUIRE(e->behav_logprobs.defined());
    REQUIRE(e->behav_logprobs.shape() == old.shape());
    const int64_t B = e->seq.size(0), S = e->seq.size(1), L = S - 1, P = prompts.size(1);
    double worst = 0, from_raw = 0;
    int64_t answer = 0, off = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < L; ++t) {
        const float bl = e->behav_logprobs.data<float>()[b * L + t];
        const bool real = t + 1 >= P && e->attention_mask.data<int32_t>()[b * S + t + 1];
        if (!real) {
          off += bl != 0.0f;
          continue;
        }
        ++answer;
        CHECK(bl <= 0.0f);
        worst = std::max(worst, std::abs(static_cast<double>(bl) - old.data<float>()[b * L + t]));
        from_raw = std::max(from_raw, std::abs(static_cast<double>(bl) - raw.data<float>()[b * L + t]));
      }
    CHECK(off == 0);  // 0 off the answer
    CHECK(answer > 8);
    CHECK(worst < 1e-5);
    if (temperature != 1.0f) CHECK(from_raw > 1e-2);  // the temperature changes the log-probs
    else CHECK(from_raw < 1e-5);

    // the decoupled loss with these behaviour log-probs (w = exp(old - behav) ~ 1) is the plain
    // clipped loss; with behav = old exactly it is the plain loss bit for bit (pg_math.h)
    e->logprobs = old;
    const int64_t n = L - e->start();
    auto adv = tensor::empty({B, n});
    for (int64_t i = 0; i < adv.numel(); ++i) adv.data<float>()[i] = static_cast<float>(std::sin(0.7 * i));
    ppo::policy_loss_settings plain, dec;
    dec.decoupled = true;
    dec.behav_imp_weight_cap = 5;
    auto loss = [&](const ppo::experience& x, const ppo::policy_loss_settings& p) {
      activations am;
      return ppo::actor_batch_loss(x, adv, 0.2f, p, 1).forward(0, actor, am).loss;
    };
    const double l0 = loss(*e, plain), l1 = loss(*e, dec);
    CHECK(std::isfinite(l0));
    double sum_a = 0, n_a = 0;  // ratio 1: the clipped loss is -token-mean(A) over the answer tokens
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i)
        if (e->attention_mask.data<int32_t>()[b * S + e->start() + 1 + i]) {
          sum_a += adv.data<float>()[b * n + i];
          n_a += 1;
        }
    CHECK(l0 == doctest::Approx(-sum_a / n_a).epsilon(1e-6));
    CHECK(std::abs(l1 - l0) <= 1e-5 * std::max(1.0, std::abs(l0)));
    ppo::experience same = *e;
    same.behav_logprobs = old;
    CHECK(loss(same, dec) == l0);
  }
}

TEST_CASE("PPO: fresh_items leaves out the stale items only with the drop policy") {
  // a trainer at version 5; items sampled with versions 5, 3, 4, 2: staleness 0, 2, 1, 3
  int64_t worst = -1;
  CHECK(ppo::fresh_items({5, 3, 4, 2}, 5, 1, /*drop=*/true, worst) == std::vector<size_t>{0, 2});
  CHECK(worst == 3);
  CHECK(ppo::fresh_items({5, 3, 4, 2}, 5, 2, true, worst) == std::vector<size_t>{0, 1, 2});
  CHECK(ppo::fresh_items({5, 3, 4, 2}, 5, 1, /*drop=*/false, worst) == std::vector<size_t>{0, 1, 2, 3});  // wait
  CHECK(worst == 3);
  CHECK(ppo::fresh_items({2}, 5, 1, true, worst).empty());  // nothing left: no update
  CHECK(ppo::fresh_items({5, 3}, 5, 0, true, worst) == std::vector<size_t>{0, 1});  // synchronous: nothing checked
  CHECK(worst == 0);
}

TEST_CASE("PPO: a row's log-probs are the same bits in any batch of GRPO groups (the reference's are the policy's)") {
  // The reference scores with the policy's own sequence_logprobs, so a policy equal to the reference has a
  // KL of exactly 0 and no KL-loss gradient, also in the update's mini-batches (other rows beside each row).
  // Scoring each prompt once per group (shared_prompt_logprobs, removed) differed by 3e-8, which AdamW made
  // into full steps: with every reward 0 the held-out KL reached 0.158 in two updates.
  auto tok = load_tokenizer(test::tokenizer_path());
  auto model = load_llama2c(test::model_path());
  tensor prompts, pmask;
  prompt_batch(*tok, {"Once upon a time", "The little dog was very happy because"}, prompts, pmask);
  const int64_t P = prompts.size(1), G = 4, R = 2 * G;  // two prompts, four answers each: adjacent groups
  auto ids = tensor::empty({R, P}, dtype::i32), m = tensor::empty({R, P}, dtype::i32);
  for (int64_t b = 0; b < R; ++b) {
    ids.rows(b, b + 1).copy_from(prompts.rows(b / G, b / G + 1));
    m.rows(b, b + 1).copy_from(pmask.rows(b / G, b / G + 1));
  }
  ppo::ppo_settings s;
  s.max_answer_seq_len = 40;  // over 32 answer tokens: the answers' attention takes the GEMM path
  s.drop_short_answers = false;
  auto e = ppo::generate_rollouts(model, ids, m, s, {tok->eos_id()}, 0, 11);
  REQUIRE(e.has_value());
  activations a;
  const tensor whole = ppo::sequence_logprobs(model, a, e->seq, e->attention_mask, 1.0f, e->start());
  const int64_t L = whole.size(1);
  for (const int64_t mb : {1, 3, 4, 5}) {  // mini-batches of the update, a group split or two joined
    CAPTURE(mb);
    for (int64_t r0 = 0; r0 < R; r0 += mb) {
      const int64_t r1 = std::min(R, r0 + mb);
      const tensor part = ppo::sequence_logprobs(model, a, e->seq.rows(r0, r1).clone(),
                                                 e->attention_mask.rows(r0, r1).clone(), 1.0f, e->start());
      for (int64_t b = r0; b < r1; ++b)
        for (int64_t t = e->start(); t < L; ++t)
          REQUIRE(std::bit_cast<uint32_t>(part.data<float>()[(b - r0) * L + t]) ==
                  std::bit_cast<uint32_t>(whole.data<float>()[b * L + t]));
    }
  }
}
