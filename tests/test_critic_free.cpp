// The critic-free trainers' pieces (issue 18): the experience maker's GRPO / RLOO /
// REINFORCE++ advantages on hand-built experiences (values worked by hand below), and the
// actor's loss with veRL's options (dual clip, seq-mean aggregation, the KL loss term)
// checked against finite differences and across ranks and accumulation.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <algorithm>

#include "models/llama2c.h"
#include "models/tokenizer.h"
#include "models/rlhf/ppo.h"
#include "test_ranks.h"
#include "test_util.h"

using namespace flowrun;

namespace {

// B rows of a 2-token prompt (start = 1) and answers of `lens` tokens (padding after), n = 3
// answer columns; logprobs − ref_logprobs = `diff` on every entry.
ppo::experience hand_experience(const std::vector<int64_t>& lens, const std::vector<float>& scores, float diff) {
  const int64_t B = static_cast<int64_t>(lens.size()), P = 2, n = 3, S = P + n, L = S - 1;
  ppo::experience e;
  std::vector<int32_t> ids(B * S, 7), mask(B * S, 0), prompt(B * P, 7);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < P + lens[b]; ++t) mask[b * S + t] = 1;
  e.prompts = tensor::from_ints({B, P}, prompt);
  e.seq = tensor::from_ints({B, S}, ids);
  e.attention_mask = tensor::from_ints({B, S}, mask);
  std::vector<float> lp(B * L, -1.0f), ref(B * L, -1.0f - diff);
  e.logprobs = tensor::from_floats({B, L}, lp);
  e.ref_logprobs = tensor::from_floats({B, L}, ref);
  e.reward_score = tensor::from_floats({B}, scores);
  e.answer_len = lens;
  return e;
}

float at(const tensor& t, int64_t r, int64_t c) { return t.data<float>()[r * t.size(1) + c]; }

}  // namespace

TEST_CASE("critic-free advantages: GRPO and RLOO by hand, each row's value on its answer tokens, 0 on padding") {
  // rewards [1, 0, 0, 0]: mean 0.25, deviations (0.75, -0.25, -0.25, -0.25), Bessel variance
  // (0.5625 + 3 x 0.0625) / 3 = 0.25, sigma 0.5 (the worked case)
  auto e = hand_experience({3, 2, 1, 3}, {1, 0, 0, 0}, 0.0f);
  ppo::critic_free_config c;
  c.num_generations = 4;
  c.ppo.kl_ctl = 0;
  const tensor a = ppo::critic_free_advantages(e, c);
  REQUIRE(a.shape() == shape_t{4, 3});
  const double s = 0.5 + 1e-4;
  CHECK(at(a, 0, 0) == doctest::Approx(0.75 / s).epsilon(1e-6));
  CHECK(at(a, 0, 2) == doctest::Approx(0.75 / s).epsilon(1e-6));
  CHECK(at(a, 1, 0) == doctest::Approx(-0.25 / s).epsilon(1e-6));
  CHECK(at(a, 1, 1) == doctest::Approx(-0.25 / s).epsilon(1e-6));
  CHECK(at(a, 1, 2) == 0.0f);  // padding
  CHECK(at(a, 2, 0) == doctest::Approx(-0.25 / s).epsilon(1e-6));
  CHECK(at(a, 2, 1) == 0.0f);
  // RLOO: A_i = r_i - mean of the others: 1 - 0 = 1, 0 - 1/3
  c.estimator = ppo::advantage_estimator::rloo;
  const tensor r = ppo::critic_free_advantages(e, c);
  CHECK(at(r, 0, 1) == doctest::Approx(1.0).epsilon(1e-6));
  CHECK(at(r, 3, 2) == doctest::Approx(-1.0 / 3.0).epsilon(1e-6));
  CHECK(at(r, 2, 2) == 0.0f);
  // equal rewards: exact zeros
  auto flat = hand_experience({3, 2, 1, 3}, {0.3f, 0.3f, 0.3f, 0.3f}, 0.0f);
  c.estimator = ppo::advantage_estimator::grpo;
  const tensor z = ppo::critic_free_advantages(flat, c);
  for (int64_t i = 0; i < z.numel(); ++i) CHECK(z.data<float>()[i] == 0.0f);
  // rows that are not whole groups, and GAE, are refused
  c.num_generations = 3;
  CHECK_THROWS_AS(ppo::critic_free_advantages(e, c), std::invalid_argument);
  c.estimator = ppo::advantage_estimator::gae;
  CHECK_THROWS_AS(ppo::critic_free_advantages(e, c), std::invalid_argument);
  CHECK_THROWS_AS(ppo::parse_advantage_estimator("ppo"), std::invalid_argument);
  // kl_ctl left unwritten: DS-Chat's 0.1 for gae (ppo_trainer.py), none in the reward for grpo and rloo
  // (veRL's algorithm.use_kl_in_reward = false), veRL's kl_coef 0.001 for REINFORCE++
  CHECK(ppo::default_kl_ctl("gae") == 0.1);
  CHECK(ppo::default_kl_ctl("grpo") == 0.0);
  CHECK(ppo::default_kl_ctl("rloo") == 0.0);
  CHECK(ppo::default_kl_ctl("reinforce_plus_plus") == 0.001);
}

TEST_CASE("critic-free advantages: the KL penalty inside the reward is summed over each answer (veRL use_kl_in_reward)") {
  // diff 0.2 per token, kl_ctl 0.5: R = score - 0.5 x 0.2 x len = (1 - 0.3, 0 - 0.2, 0 - 0.1, 0 - 0.3)
  // = (0.7, -0.2, -0.1, -0.3); mean 0.025; deviations (0.675, -0.225, -0.125, -0.325);
  // squares 0.455625 + 0.050625 + 0.015625 + 0.105625 = 0.6275; / 3 = 0.2091667; sigma 0.4573474
  auto e = hand_experience({3, 2, 1, 3}, {1, 0, 0, 0}, 0.2f);
  ppo::critic_free_config c;
  c.num_generations = 4;
  c.ppo.kl_ctl = 0.5f;
  const tensor a = ppo::critic_free_advantages(e, c);
  const double s = 0.4573474 + 1e-4;
  CHECK(at(a, 0, 0) == doctest::Approx(0.675 / s).epsilon(1e-5));
  CHECK(at(a, 1, 1) == doctest::Approx(-0.225 / s).epsilon(1e-5));
  CHECK(at(a, 2, 0) == doctest::Approx(-0.125 / s).epsilon(1e-5));
  CHECK(at(a, 3, 2) == doctest::Approx(-0.325 / s).epsilon(1e-5));
}

TEST_CASE("critic-free advantages: REINFORCE++ puts the score on the answer's last real token, then whitens") {
  // row 0: score 1, 2 answer tokens; row 1: score 0, 1 token; kl_ctl 0, gamma 1. Returns:
  // (1, 1 | 0); mean 2/3, Bessel variance ((1/3)^2 x 2 + (2/3)^2) / 2 = 1/3;
  // A = (G - 2/3) / sqrt(1/3 + 1e-8) = (0.5773503, 0.5773503 | -1.1547005).
  auto e = hand_experience({2, 1}, {1, 0}, 0.0f);
  ppo::critic_free_config c;
  c.estimator = ppo::advantage_estimator::reinforce_plus_plus;
  c.ppo.kl_ctl = 0;
  c.ppo.gamma = 1;
  const tensor a = ppo::critic_free_advantages(e, c);
  CHECK(at(a, 0, 0) == doctest::Approx(0.5773503).epsilon(1e-5));
  CHECK(at(a, 0, 1) == doctest::Approx(0.5773503).epsilon(1e-5));
  CHECK(at(a, 0, 2) == 0.0f);
  CHECK(at(a, 1, 0) == doctest::Approx(-1.1547005).epsilon(1e-5));
  CHECK(at(a, 1, 1) == 0.0f);
  // a score beyond clip_reward_value is clipped: scores (10, 0) with clip 5 whiten like (5, 0), which
  // after whitening is the same as (1, 0)
  auto big = hand_experience({2, 1}, {10, 0}, 0.0f);
  c.ppo.clip_reward_value = 5;
  const tensor b = ppo::critic_free_advantages(big, c);
  CHECK(at(b, 1, 0) == doctest::Approx(-1.1547005).epsilon(1e-4));
}

TEST_CASE("critic-free advantages without a reference model: no KL term, kl_ctl > 0 refused, mean_kl 0") {
  // a graph without a reference (experience_maker reference = false) leaves ref_logprobs
  // undefined: each estimator's advantages are those of kl_ctl = 0 with a reference (the hand
  // values above: GRPO 0.75 / (0.5 + 1e-4) on row 0), whatever the policy's log-probs are
  for (auto est : {ppo::advantage_estimator::grpo, ppo::advantage_estimator::rloo,
                   ppo::advantage_estimator::reinforce_plus_plus}) {
    CAPTURE(static_cast<int>(est));
    auto with_ref = hand_experience({3, 2, 1, 3}, {1, 0, 0, 0}, 0.2f);
    auto no_ref = with_ref;
    no_ref.ref_logprobs = tensor();
    ppo::critic_free_config c;
    c.estimator = est;
    c.num_generations = 4;
    c.ppo.kl_ctl = 0;
    const tensor a = ppo::critic_free_advantages(with_ref, c), b = ppo::critic_free_advantages(no_ref, c);
    REQUIRE(a.shape() == b.shape());
    for (int64_t i = 0; i < a.numel(); ++i) CHECK(a.data<float>()[i] == b.data<float>()[i]);
    if (est == ppo::advantage_estimator::grpo) CHECK(at(b, 0, 0) == doctest::Approx(0.75 / (0.5 + 1e-4)).epsilon(1e-6));
    c.ppo.kl_ctl = 0.1f;  // a KL penalty needs the reference
    CHECK_THROWS_AS(ppo::critic_free_advantages(no_ref, c), std::invalid_argument);
    CHECK(ppo::mean_kl(no_ref) == 0.0);
    CHECK(ppo::mean_kl(with_ref) == doctest::Approx(0.2).epsilon(1e-6));
  }
}

TEST_CASE("take_rows copies the rows DAPO's filter keeps, with their lengths and sources") {
  auto e = hand_experience({3, 2, 1, 3}, {1, 0, 0.5f, 0}, 0.0f);
  e.source_rows = {0, 1, 2, 3};
  const auto k = ppo::take_rows(e, {1, 3});
  REQUIRE(k.seq.size(0) == 2);
  CHECK(k.answer_len == std::vector<int64_t>{2, 3});
  CHECK(k.source_rows == std::vector<int64_t>{1, 3});
  CHECK(k.reward_score.data<float>()[1] == 0.0f);
  CHECK(k.attention_mask.data<int32_t>()[0 * 5 + 4] == 0);  // row 1's padding
  CHECK(k.attention_mask.data<int32_t>()[1 * 5 + 4] == 1);
}

namespace {

// Rollout-like rows of stories260K's own tokens: 3 rows, prompt 4, answers of 5, 3 and 1 tokens.
ppo::experience model_experience(decoder& m) {
  const int64_t B = 3, P = 4, S = 9;
  std::vector<int32_t> ids(B * S), mask(B * S, 0), prompt(B * P);
  const int64_t lens[] = {5, 3, 1};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      ids[b * S + t] = static_cast<int32_t>(1 + (b * 37 + t * 11) % 300);
      mask[b * S + t] = t < P + lens[b];
    }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < P; ++t) prompt[b * P + t] = ids[b * S + t];
  ppo::experience e;
  e.prompts = tensor::from_ints({B, P}, prompt);
  e.seq = tensor::from_ints({B, S}, ids);
  e.attention_mask = tensor::from_ints({B, S}, mask);
  e.answer_len = {5, 3, 1};
  activations a;
  e.logprobs = ppo::sequence_logprobs(m, a, e.seq, e.attention_mask);  // old = current: ratio 1
  e.ref_logprobs = e.logprobs.clone();
  for (int64_t i = 0; i < e.ref_logprobs.numel(); ++i)
    e.ref_logprobs.data<float>()[i] -= 0.3f * static_cast<float>(std::sin(0.7 * static_cast<double>(i)));
  return e;
}

tensor model_advantages() {  // (3, 5) per answer token
  std::vector<float> v(15);
  for (int i = 0; i < 15; ++i) v[i] = (i % 3 == 0) ? -1.0f : 0.5f + 0.1f * static_cast<float>(i % 4);
  return tensor::from_floats({3, 5}, v);
}

double micro_loss_at(decoder& m, const batch_loss& l) {
  activations a;
  return l.forward(0, m, a).loss;
}

}  // namespace

TEST_CASE("GRPO actor loss: dual clip, seq-mean-token-mean and the k3 KL loss, gradient = finite differences") {
  auto m = load_llama2c(test::model_path());
  const auto e = model_experience(m);
  const tensor adv = model_advantages();
  ppo::policy_loss_settings p;
  p.clip_ratio_c = 3.0;
  p.loss_agg_mode = rlhf::loss_agg_mode::seq_mean_token_mean;
  p.use_kl_loss = true;
  p.kl_loss_coef = 0.5;  // large, so the KL term's share of the gradient is checked too
  const auto l = ppo::actor_batch_loss(e, adv, 0.2f, p, 1);
  CHECK(l.units(0) == 3);  // seq-mean: the rows with an answer token
  // the loss is the two pure functions' sum on the model's log-probs
  {
    activations a;
    const tensor lp = ppo::sequence_logprobs(m, a, e.seq, e.attention_mask);
    auto cols = [](const tensor& t, int64_t c0, int64_t c1) {
      auto o = tensor::empty({t.size(0), c1 - c0}, t.type());
      for (int64_t r = 0; r < t.size(0); ++r)
        for (int64_t c = c0; c < c1; ++c)
          std::memcpy(static_cast<char*>(o.raw()) + (r * (c1 - c0) + c - c0) * 4,
                      static_cast<const char*>(t.raw()) + (r * t.size(1) + c) * 4, 4);
      return o;
    };
    const tensor mask = cols(e.attention_mask, 4, 9), lp_a = cols(lp, 3, 8);
    rlhf::policy_loss_config c;
    c.clip_ratio_c = 3.0;
    c.agg = p.loss_agg_mode;
    const double pg = rlhf::clipped_policy_loss(lp_a, cols(e.logprobs, 3, 8), adv, mask, c).loss;
    const double kl = rlhf::aggregate_loss(rlhf::kl_estimate(lp_a, cols(e.ref_logprobs, 3, 8), rlhf::kl_estimator::k3),
                                           mask, p.loss_agg_mode);
    CHECK(kl > 0.01);
    CHECK(micro_loss_at(m, l) == doctest::Approx(pg + 0.5 * kl).epsilon(1e-6));
    // DAPO's clip-higher reaches the loss: the ceiling 1 + clip_ratio_high, the floor 1 - cliprange. With
    // old log-probs 0.1 lower (ratio e^0.1 = 1.105) a ceiling of 1.05 clips the positive advantages' tokens
    // that cliprange 0.2 leaves alone, so the two losses differ
    ppo::experience eh = e;
    eh.logprobs = e.logprobs.clone();
    for (int64_t i = 0; i < eh.logprobs.numel(); ++i) eh.logprobs.data<float>()[i] -= 0.1f;
    ppo::policy_loss_settings ph = p;
    ph.clip_ratio_high = 0.05;
    const auto lh = ppo::actor_batch_loss(eh, adv, 0.2f, ph, 1);
    rlhf::policy_loss_config ch = c;
    const double pg_sym = rlhf::clipped_policy_loss(lp_a, cols(eh.logprobs, 3, 8), adv, mask, ch).loss;
    ch.clip_ratio_high = 0.05;
    const double pgh = rlhf::clipped_policy_loss(lp_a, cols(eh.logprobs, 3, 8), adv, mask, ch).loss;
    REQUIRE(std::fabs(pgh - pg_sym) > 1e-3);
    CHECK(micro_loss_at(m, lh) == doctest::Approx(pgh + 0.5 * kl).epsilon(1e-6));
  }
  // analytic gradient along its own direction vs central differences of the loss
  m.zero_grad();
  activations a;
  auto r = l.forward(0, m, a);
  m.backward(a, r.dout);
  const tensor g = m.grads().flat.clone();
  double gn = 0;
  for (int64_t i = 0; i < g.numel(); ++i) gn += static_cast<double>(g.data<float>()[i]) * g.data<float>()[i];
  gn = std::sqrt(gn);
  REQUIRE(gn > 1e-4);
  const tensor w0 = m.w().flat.clone();
  const double h = 2e-3;
  auto shifted = [&](double s) {
    for (int64_t i = 0; i < g.numel(); ++i)
      m.w().flat.data<float>()[i] = w0.data<float>()[i] + static_cast<float>(s * g.data<float>()[i] / gn);
    return micro_loss_at(m, l);
  };
  const double fd = (shifted(h) - shifted(-h)) / (2 * h);
  m.w().flat.copy_from(w0);
  CHECK(fd / gn == doctest::Approx(1.0).epsilon(0.03));  // relative: Approx alone adds 1 to its scale
}

TEST_CASE("GRPO actor loss through the engine: 2 ranks with accumulation at stages 0 and 3 give the 1-rank losses and weights") {
  // seq-mean-token-mean over 3 rows cut as 1 x 1 or 2 ranks x 2 micro-batches (one empty): the
  // micro-batches' seq means are weighed by their rows (zero.h), so the step is the same.
  auto m0 = load_llama2c(test::model_path());
  const auto e = model_experience(m0);
  const tensor adv = model_advantages();
  ppo::ppo_settings s;
  s.policy.clip_ratio_c = 3.0;
  s.policy.loss_agg_mode = rlhf::loss_agg_mode::seq_mean_token_mean;
  s.policy.use_kl_loss = true;
  s.policy.kl_loss_coef = 0.1;
  auto run = [&](int world, int stage, int64_t gas) {
    std::pair<std::vector<double>, tensor> out;
    test::on_inproc_ranks(world, [&](int r, comm::communicator& c) {
      auto m = load_llama2c(test::model_path());
      zero_settings zs;
      zs.stage = stage;
      zs.gradient_accumulation_steps = gas;
      zs.gradient_clipping = 1.0;
      // Adam divides by |g|: where a gradient is float noise (~1e-9: summed in another order on 2
      // ranks) eps 1e-8 would turn the noise into a step of lr/10; 1e-6 keeps such steps < lr/1000
      zs.adamw.eps = 1e-6f;
      zero_engine eng(m, c, zs);
      std::vector<double> losses;
      for (int it = 0; it < 2; ++it) losses.push_back(ppo::actor_update(eng, e, adv, s, 1e-3).loss);
      tensor w = eng.gather_full_params();
      if (r == 0) out = {losses, w};
    });
    return out;
  };
  const auto one = run(1, 0, 1);
  CHECK(one.first[0] != doctest::Approx(one.first[1]));  // the first update changed the policy
  for (int stage : {0, 3}) {
    CAPTURE(stage);
    const auto two = run(2, stage, 2);
    CHECK(two.first[0] == doctest::Approx(one.first[0]).epsilon(1e-5));
    CHECK(two.first[1] == doctest::Approx(one.first[1]).epsilon(1e-5));
    double d = 0;
    for (int64_t i = 0; i < one.second.numel(); ++i)
      d = std::max(d, std::fabs(static_cast<double>(one.second.data<float>()[i]) - two.second.data<float>()[i]));
    CHECK(d < 2e-5);
  }
}

TEST_CASE("GRPO learns: rewarding one first answer token raises its probability within a few updates") {
  // stories260K after "Once upon a time, there was a": the reward is 1 when the answer starts
  // with the most likely token of probability below 0.3 (sampled now and then, far from sure). Ten GRPO iterations of 16 samples (one group) through the
  // engine must raise that token's probability well above its start (a wrong sign or a lost
  // advantage would lower it or leave it).
  auto tok = load_tokenizer(test::tokenizer_path());
  auto actor = load_llama2c(test::model_path());
  std::vector<int32_t> prompt = tok->encode("Once upon a time, there was a", true);
  const int64_t P = static_cast<int64_t>(prompt.size()), G = 16, V = actor.config().vocab_size;
  auto next_probs = [&] {  // p(. | prompt) (V)
    activations a;
    const tensor ids = tensor::from_ints({1, P}, prompt), mask = tensor::from_ints({1, P}, std::vector<int32_t>(P, 1));
    actor.forward(a, ids, {}, mask);
    std::vector<double> p(static_cast<size_t>(V));
    const float* l = a.logits.data<float>() + (P - 1) * V;
    double mx = l[0], z = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(l[v]));
    for (int64_t v = 0; v < V; ++v) z += p[v] = std::exp(l[v] - mx);
    for (auto& x : p) x /= z;
    return p;
  };
  auto p0 = next_probs();
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int32_t v = 0; v < V; ++v) order[v] = v;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p0[a] > p0[b]; });
  int32_t target = -1;
  for (int32_t v : order)
    if (p0[v] < 0.3) {
      target = v;
      break;
    }
  REQUIRE(p0[target] > 0.02);
  auto c = comm::inproc_communicator(comm::make_inproc_group(1), 0);
  zero_settings zs;
  zero_engine eng(actor, *c, zs);
  ppo::ppo_settings s;
  s.max_answer_seq_len = 3;
  s.drop_short_answers = false;
  s.policy.clip_ratio_c = 3.0;
  std::vector<int32_t> rows, masks;
  for (int64_t g = 0; g < G; ++g) rows.insert(rows.end(), prompt.begin(), prompt.end());
  masks.assign(rows.size(), 1);
  const tensor ids = tensor::from_ints({G, P}, rows), pmask = tensor::from_ints({G, P}, masks);
  ppo::critic_free_config cf;
  cf.num_generations = G;
  cf.ppo.kl_ctl = 0;
  for (int it = 0; it < 10; ++it) {
    auto e = ppo::generate_rollouts(actor, ids, pmask, s, {tok->eos_id()}, 0, 100 + static_cast<uint64_t>(it));
    REQUIRE(e.has_value());
    REQUIRE(e->seq.size(0) == G);
    activations a;
    e->logprobs = ppo::sequence_logprobs(actor, a, e->seq, e->attention_mask);
    e->ref_logprobs = e->logprobs.clone();
    std::vector<float> r(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) r[g] = e->seq.data<int32_t>()[g * e->seq.size(1) + P] == target ? 1.0f : 0.0f;
    e->reward_score = tensor::from_floats({G}, r);
    const tensor adv = ppo::critic_free_advantages(*e, cf);
    ppo::actor_update(eng, *e, adv, s, 1e-3);
  }
  eng.release_model();
  const double before = p0[target], after = next_probs()[target];
  MESSAGE("p(target) " << before << " -> " << after);
  CHECK(after > 2 * before);
}
