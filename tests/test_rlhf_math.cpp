// DeepSpeed-Chat's step-2 and step-3 math on small hand-made tensors. Every
// expected value below is worked out by hand in the comments.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "models/rlhf/rlhf_math.h"
#include "models/sampler.h"

using namespace flowrun;
using namespace flowrun::rlhf;

namespace {
std::vector<float> row(const tensor& t, int64_t r) { return t.rows(r, r + 1).to_floats(); }
}  // namespace

TEST_CASE("compute_rewards: KL penalty everywhere, clipped score at EOS / at the last token when cut") {
  // P = 3 (start = 2), S = 7, L = 6. Masks are attention_mask[:, 1:].
  //  row 0: answer of 3 tokens ending in EOS, then one pad: attention 1111110 -> action 111110
  //         n = sum(action[2:]) = 3, ends = 6, reward at min(6, 6) - 1 = 5 (the EOS state)
  //  row 1: answer cut at the length limit: action 111111, n = 4, ends = 7, reward at min(7, 6) - 1 = 5
  //  row 2: left-padded prompt, 2-token answer: attention 0111100 -> action 111100, n = 2, ends = 5, at 4
  auto am = tensor::from_ints({3, 6}, {1, 1, 1, 1, 1, 0, /**/ 1, 1, 1, 1, 1, 1, /**/ 1, 1, 1, 1, 0, 0});
  auto lp = tensor::from_floats({3, 6}, std::vector<float>(18, -1.0f));
  // log_probs - ref = +0.5 (row 0), -1.0 (row 1), 0 (row 2)
  std::vector<float> ref(18);
  for (int t = 0; t < 6; ++t) {
    ref[t] = -1.5f;
    ref[6 + t] = 0.0f;
    ref[12 + t] = -1.0f;
  }
  auto rlp = tensor::from_floats({3, 6}, ref);
  auto score = tensor::from_floats({3}, {2.0f, 7.5f, -9.0f});  // 7.5 and -9 clip to +-5
  ppo_config cfg;  // kl_ctl 0.1, clip_reward_value 5
  std::vector<int64_t> ends;
  auto r = compute_rewards(lp, rlp, score, am, 2, cfg, &ends);
  CHECK(ends == std::vector<int64_t>{6, 7, 5});
  // row 0: -0.1 * 0.5 = -0.05 each, +2 at index 5
  auto r0 = row(r, 0);
  for (int t = 0; t < 5; ++t) CHECK(r0[t] == doctest::Approx(-0.05));
  CHECK(r0[5] == doctest::Approx(1.95));
  // row 1: -0.1 * -1 = 0.1 each, +5 at index 5
  auto r1 = row(r, 1);
  for (int t = 0; t < 5; ++t) CHECK(r1[t] == doctest::Approx(0.1));
  CHECK(r1[5] == doctest::Approx(5.1));
  // row 2: 0 each, -5 at index 4
  auto r2 = row(r, 2);
  CHECK(r2[4] == doctest::Approx(-5.0));
  CHECK(r2[3] == doctest::Approx(0.0));
  CHECK(r2[5] == doctest::Approx(0.0));
}

TEST_CASE("GAE advantages and returns, with values and rewards zeroed after the end") {
  ppo_config cfg;  // gamma 1, lam 0.95
  // row 0 (ends = 6): r = [-.05 x5, 1.95], v = [.5, .5, 1, 2, 1, 3], start = 2
  //  t5: delta = 1.95 - 3 = -1.05                      A5 = -1.05
  //  t4: delta = -.05 + 3 - 1 = 1.95                   A4 = 1.95 + .95(-1.05) = 0.9525
  //  t3: delta = -.05 + 1 - 2 = -1.05                  A3 = -1.05 + .95(.9525) = -0.145125
  //  t2: delta = -.05 + 2 - 1 = 0.95                   A2 = .95 + .95(-.145125) = 0.81213125
  //  returns = A + v[2:] = [1.81213125, 1.854875, 1.9525, 1.95]
  // row 1 (ends = 5): r = [0, 0, 0, 0, -5, 7 -> 0], v = [.1, .2, .3, .4, .6, 9 -> 0]
  //  t5: 0; t4: -5 + 0 - .6 = -5.6; t3: .2 + .95(-5.6) = -5.12; t2: .1 + .95(-5.12) = -4.764
  //  returns = [-4.464, -4.72, -5.0, 0]
  auto rewards = tensor::from_floats({2, 6}, {-.05f, -.05f, -.05f, -.05f, -.05f, 1.95f, 0, 0, 0, 0, -5.f, 7.f});
  auto values = tensor::from_floats({2, 6}, {.5f, .5f, 1.f, 2.f, 1.f, 3.f, .1f, .2f, .3f, .4f, .6f, 9.f});
  zero_after_ends(rewards, values, {6, 5});
  CHECK(values.item(11) == 0.0f);
  CHECK(rewards.item(11) == 0.0f);
  tensor adv, ret;
  advantages_and_returns(adv, ret, values, rewards, 2, cfg);
  REQUIRE(adv.shape() == shape_t{2, 4});
  std::vector<double> want_a = {0.81213125, -0.145125, 0.9525, -1.05, -4.764, -5.12, -5.6, 0.0};
  std::vector<double> want_r = {1.81213125, 1.854875, 1.9525, 1.95, -4.464, -4.72, -5.0, 0.0};
  for (int i = 0; i < 8; ++i) {
    CHECK(adv.item(i) == doctest::Approx(want_a[i]).epsilon(1e-6));
    CHECK(ret.item(i) == doctest::Approx(want_r[i]).epsilon(1e-6));
  }
}

TEST_CASE("GAE with gamma < 1: the discount on the next value and on the next advantage") {
  // gamma 0.9, lam 0.8, start 0, r = [0.2, -0.1, 1.0], v = [0.5, 0.4, 0.3], V(L) = 0:
  //  t2: delta = 1.0 - 0.3 = 0.7                        A2 = 0.7
  //  t1: delta = -0.1 + 0.9 x 0.3 - 0.4 = -0.23        A1 = -0.23 + 0.72 x 0.7 = 0.274
  //  t0: delta = 0.2 + 0.9 x 0.4 - 0.5 = 0.06          A0 = 0.06 + 0.72 x 0.274 = 0.25728
  //  returns = A + v = [0.75728, 0.674, 1.0]
  ppo_config cfg;
  cfg.gamma = 0.9f;
  cfg.lam = 0.8f;
  auto rewards = tensor::from_floats({1, 3}, {0.2f, -0.1f, 1.0f});
  auto values = tensor::from_floats({1, 3}, {0.5f, 0.4f, 0.3f});
  tensor adv, ret;
  advantages_and_returns(adv, ret, values, rewards, 0, cfg);
  REQUIRE(adv.shape() == shape_t{1, 3});
  const double want_a[] = {0.25728, 0.274, 0.7}, want_r[] = {0.75728, 0.674, 1.0};
  for (int i = 0; i < 3; ++i) {
    CHECK(adv.item(i) == doctest::Approx(want_a[i]).epsilon(1e-6));
    CHECK(ret.item(i) == doctest::Approx(want_r[i]).epsilon(1e-6));
  }
}

TEST_CASE("actor loss: ratio clipping and masking, with its gradient") {
  // i0: ratio 1, -A r = -1 (grad -A r = -1)
  // i1: ratio e^.5 = 1.6487 > 1.2: max(-3.297, -2.4) = -2.4, clipped: grad 0
  // i2: ratio e^-.4 = 0.6703 < 0.8, A = -1: max(0.6703, 0.8) = 0.8, clipped: grad 0
  // i3: masked (mask 0): contributes nothing though its values are wild
  // loss = (-1 - 2.4 + 0.8) / 3 = -0.8666667
  auto lp = tensor::from_floats({1, 4}, {-1.0f, -2.0f, -0.5f, 5.0f});
  auto old = tensor::from_floats({1, 4}, {-1.0f, -2.5f, -0.1f, -5.0f});
  auto A = tensor::from_floats({1, 4}, {1.0f, 2.0f, -1.0f, 100.0f});
  auto mask = tensor::from_ints({1, 4}, {1, 1, 1, 0});
  tensor d;
  double loss = actor_loss(lp, old, A, mask, 0.2f, &d);
  CHECK(loss == doctest::Approx(-2.6 / 3.0).epsilon(1e-6));
  CHECK(d.item(0) == doctest::Approx(-1.0 / 3.0).epsilon(1e-6));
  CHECK(d.item(1) == 0.0f);
  CHECK(d.item(2) == 0.0f);
  CHECK(d.item(3) == 0.0f);
  // inside the clip range the gradient is -A·ratio / n: check by finite differences
  auto lp2 = tensor::from_floats({1, 2}, {-1.0f, -2.0f});
  auto old2 = tensor::from_floats({1, 2}, {-1.1f, -1.9f});
  auto A2 = tensor::from_floats({1, 2}, {0.7f, -1.3f});
  auto m2 = tensor::from_ints({1, 2}, {1, 1});
  tensor d2;
  actor_loss(lp2, old2, A2, m2, 0.2f, &d2);
  for (int i = 0; i < 2; ++i) {
    auto plus = lp2.clone(), minus = lp2.clone();
    plus.data<float>()[i] += 1e-3f;
    minus.data<float>()[i] -= 1e-3f;
    double fd = (actor_loss(plus, old2, A2, m2, 0.2f) - actor_loss(minus, old2, A2, m2, 0.2f)) / 2e-3;
    CHECK(d2.item(i) == doctest::Approx(fd).epsilon(1e-3));
  }
}

TEST_CASE("critic loss: value clipping and masking, with its gradient") {
  // cliprange_value 0.2
  // i0: v 1.0, old 1.1 -> vc = 1.0; (1-2)^2 = 1 both; grad 2(v-R) = -2
  // i1: v 2.0, old 1.5 -> vc = 1.7; (2-1)^2 = 1 > (0.7)^2 = .49; unclipped: grad 2(2-1) = 2
  // i2: v 1.5, old 1.0 -> vc = 1.2; (1.5-2)^2 = .25 < (1.2-2)^2 = .64; clipped, v outside: grad 0
  // i3: masked
  // loss = 0.5 (1 + 1 + .64) / 3 = 0.44; dv = 0.5 [-2, 2, 0] / 3
  auto v = tensor::from_floats({1, 4}, {1.0f, 2.0f, 1.5f, 0.0f});
  auto old = tensor::from_floats({1, 4}, {1.1f, 1.5f, 1.0f, 0.0f});
  auto R = tensor::from_floats({1, 4}, {2.0f, 1.0f, 2.0f, -1.0f});
  auto mask = tensor::from_ints({1, 4}, {1, 1, 1, 0});
  tensor d;
  double loss = critic_loss(v, old, R, mask, 0.2f, &d);
  CHECK(loss == doctest::Approx(0.44).epsilon(1e-6));
  CHECK(d.item(0) == doctest::Approx(-1.0 / 3.0).epsilon(1e-6));
  CHECK(d.item(1) == doctest::Approx(1.0 / 3.0).epsilon(1e-6));
  CHECK(d.item(2) == 0.0f);
  CHECK(d.item(3) == 0.0f);
}

TEST_CASE("pairwise reward loss: divergence and end indices, scores, gradient, padding independence") {
  // pair 0: chosen  [5 6 7 8 | pad] len 4, rejected [5 6 9 | pad pad] len 3
  //   first difference at t = 2, end = max(4, 3) = 4 -> positions 2, 3
  //   d2 = 0.5 - 0.0 = 0.5 -> -log σ(.5) = 0.4740770; d3 = 1 - 2 = -1 -> -log σ(-1) = 1.3132617
  //   loss0 = 0.8936693; scores: chosen r[3] = 1.0, rejected r[2] = 0.0
  // pair 1: identical [3 4] len 2 -> the single position 1, d = 0 -> log 2 = 0.6931472; scores 0.3, 0.3
  // batch loss = (0.8936693 + 0.6931472) / 2 = 0.7934083
  auto cid = tensor::from_ints({2, 5}, {5, 6, 7, 8, 0, /**/ 3, 4, 0, 0, 0});
  auto rid = tensor::from_ints({2, 5}, {5, 6, 9, 0, 0, /**/ 3, 4, 0, 0, 0});
  auto cr = tensor::from_floats({2, 5}, {0.1f, 0.2f, 0.5f, 1.0f, 9.0f, /**/ 0.0f, 0.3f, 7.0f, 7.0f, 7.0f});
  auto rr = tensor::from_floats({2, 5}, {0.1f, 0.2f, 0.0f, 2.0f, 9.0f, /**/ 0.0f, 0.3f, -7.0f, -7.0f, -7.0f});
  auto cl = tensor::from_ints({2}, {4, 2}), rl = tensor::from_ints({2}, {3, 2});
  tensor dc, dr;
  auto res = pairwise_loss(cr, rr, cid, rid, cl, rl, &dc, &dr);
  CHECK(res.divergence == std::vector<int64_t>{2, 1});
  CHECK(res.end == std::vector<int64_t>{4, 2});
  CHECK(res.loss == doctest::Approx(0.7934083).epsilon(1e-6));
  CHECK(res.chosen_scores == std::vector<float>{1.0f, 0.3f});
  CHECK(res.rejected_scores == std::vector<float>{0.0f, 0.3f});
  // gradients: pair 0 pos 2: -σ(-.5)/2/2 = -0.0943852; pos 3: -σ(1)/2/2 = -0.1827648; pair 1 pos 1: -σ(0)/1/2 = -.25
  CHECK(dc.item(2) == doctest::Approx(-0.0943852).epsilon(1e-5));
  CHECK(dc.item(3) == doctest::Approx(-0.1827648).epsilon(1e-5));
  CHECK(dc.item(6) == doctest::Approx(-0.25).epsilon(1e-6));
  CHECK(dr.item(3) == doctest::Approx(0.1827648).epsilon(1e-5));
  CHECK(dc.item(4) == 0.0f);
  // more right padding, and the same pairs in another batch order: same loss and scores
  auto cid2 = tensor::from_ints({2, 7}, {3, 4, 0, 0, 0, 0, 0, /**/ 5, 6, 7, 8, 0, 0, 0});
  auto rid2 = tensor::from_ints({2, 7}, {3, 4, 0, 0, 0, 0, 0, /**/ 5, 6, 9, 0, 0, 0, 0});
  auto cr2 = tensor::from_floats({2, 7}, {0.0f, 0.3f, 1, 1, 1, 1, 1, /**/ 0.1f, 0.2f, 0.5f, 1.0f, 4, 4, 4});
  auto rr2 = tensor::from_floats({2, 7}, {0.0f, 0.3f, 2, 2, 2, 2, 2, /**/ 0.1f, 0.2f, 0.0f, 2.0f, 3, 3, 3});
  auto res2 = pairwise_loss(cr2, rr2, cid2, rid2, tensor::from_ints({2}, {2, 4}), tensor::from_ints({2}, {2, 3}));
  CHECK(res2.loss == doctest::Approx(res.loss).epsilon(1e-7));
  CHECK(res2.chosen_scores[1] == res.chosen_scores[0]);
  CHECK(res2.rejected_scores[1] == res.rejected_scores[0]);
}

TEST_CASE("gather_log_probs: forward against a hand softmax, backward by finite differences") {
  // logits [0, ln 2, ln 3] -> softmax [1/6, 2/6, 3/6]; label 2 -> log(1/2)
  auto logits = tensor::from_floats({1, 2, 3}, {0.0f, std::log(2.0f), std::log(3.0f), 1.0f, -1.0f, 0.5f});
  auto labels = tensor::from_ints({1, 2}, {2, 0});
  tensor out;
  gather_log_probs_forward(out, logits, labels);
  CHECK(out.item(0) == doctest::Approx(std::log(0.5)).epsilon(1e-6));
  auto dout = tensor::from_floats({1, 2}, {0.7f, -1.1f});
  tensor dl;
  gather_log_probs_backward(dl, dout, logits, labels);
  for (int i = 0; i < 6; ++i) {
    auto p = logits.clone(), m = logits.clone();
    p.data<float>()[i] += 1e-3f;
    m.data<float>()[i] -= 1e-3f;
    tensor op, om;
    gather_log_probs_forward(op, p, labels);
    gather_log_probs_forward(om, m, labels);
    double fd = (0.7 * (op.item(0) - om.item(0)) - 1.1 * (op.item(1) - om.item(1))) / 2e-3;
    CHECK(dl.item(i) == doctest::Approx(fd).epsilon(2e-3));
  }
  CHECK_THROWS_AS(gather_log_probs_forward(out, logits, tensor::from_ints({1, 2}, {3, 0})), std::out_of_range);
  // from = 1 (decoder::forward's keep_from): position 0 is neither computed nor its gradient, position 1 as above
  tensor out1, dl1;
  gather_log_probs_forward(out1, logits, labels, 1.0f, 1);
  CHECK(out1.item(0) == 0.0f);
  CHECK(out1.item(1) == out.item(1));
  gather_log_probs_backward(dl1, dout, logits, labels, 1.0f, 1);
  for (int i = 0; i < 3; ++i) CHECK(dl1.item(i) == 0.0f);
  for (int i = 3; i < 6; ++i) CHECK(dl1.item(i) == dl.item(i));
  CHECK_THROWS_AS(gather_log_probs_forward(out1, logits, labels, 1.0f, 2), std::invalid_argument);
}

TEST_CASE("gather_log_probs at a sampling temperature: log-softmax(logits / T), by hand and finite differences") {
  // TRL (grpo_trainer.py, ppo_trainer.py: logits /= temperature) and veRL (dp_actor.py:
  // logits.div_(temperature)) take the log-probs of rollouts sampled at T under logits / T.
  // logits [2, 1, 0] at T = 0.5: z = [4, 2, 0], log p = z - log(e^4 + e^2 + 1).
  auto logits = tensor::from_floats({1, 3, 3}, {2.0f, 1.0f, 0.0f, 2.0f, 1.0f, 0.0f, -0.3f, 0.8f, 0.1f});
  auto labels = tensor::from_ints({1, 3}, {0, 2, 1});
  const double lse = std::log(std::exp(4.0) + std::exp(2.0) + 1.0);
  tensor out;
  gather_log_probs_forward(out, logits, labels, 0.5f);
  CHECK(out.item(0) == doctest::Approx(4.0 - lse).epsilon(1e-6));  // -0.14293
  CHECK(out.item(1) == doctest::Approx(0.0 - lse).epsilon(1e-6));  // -4.14293
  tensor at1;
  gather_log_probs_forward(at1, logits, labels);
  CHECK(at1.item(0) == doctest::Approx(2.0 - std::log(std::exp(2.0) + std::exp(1.0) + 1.0)).epsilon(1e-6));
  // the generator's recorded log-prob (token_log_prob) is the same number, bit for bit
  std::vector<float> scratch;
  CHECK(token_log_prob(logits.data<float>(), 3, 0, 0.5f, scratch) == out.item(0));
  auto dout = tensor::from_floats({1, 3}, {0.7f, -1.1f, 0.4f});
  tensor dl;
  gather_log_probs_backward(dl, dout, logits, labels, 0.5f);
  for (int i = 0; i < 9; ++i) {
    auto p = logits.clone(), m = logits.clone();
    p.data<float>()[i] += 1e-3f;
    m.data<float>()[i] -= 1e-3f;
    tensor op, om;
    gather_log_probs_forward(op, p, labels, 0.5f);
    gather_log_probs_forward(om, m, labels, 0.5f);
    double fd = 0;
    for (int r = 0; r < 3; ++r) fd += dout.item(r) * (op.item(r) - om.item(r)) / 2e-3;
    CHECK(dl.item(i) == doctest::Approx(fd).epsilon(3e-3));
  }
  CHECK_THROWS_AS(gather_log_probs_forward(out, logits, labels, 0.0f), std::invalid_argument);
  CHECK_THROWS_AS(token_log_prob(logits.data<float>(), 3, 0, -1.0f, scratch), std::invalid_argument);
}

TEST_CASE("EMA and the non-finite diagnostic") {
  auto ema = tensor::from_floats({2}, {1.0f, 0.0f});
  auto p = tensor::from_floats({2}, {0.0f, 1.0f});
  ema_update(ema, p, 0.992f);
  CHECK(ema.item(0) == doctest::Approx(0.992));
  CHECK(ema.item(1) == doctest::Approx(0.008));
  auto bad = tensor::from_floats({3}, {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f});
  CHECK_THROWS_WITH_AS(check_finite(bad, "critic", "values"), doctest::Contains("values"), std::runtime_error);
  CHECK_THROWS_WITH_AS(check_finite(bad, "critic", "values"), doctest::Contains("node critic"), std::runtime_error);
  CHECK_NOTHROW(check_finite(p, "critic", "values"));
}
