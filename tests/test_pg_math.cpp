// Critic-free RL and DPO math (models/rlhf/pg_math.h) on small hand-made tensors.
// Every expected value is worked out by hand in the comments; gradients are
// checked against central finite differences in double.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>

#include "models/rlhf/pg_math.h"
#include "models/rlhf/rlhf_math.h"

using namespace flowrun;
using namespace flowrun::rlhf;

namespace {

std::vector<float> floats(const tensor& t) { return t.to_floats(); }
std::vector<int32_t> ints(const tensor& t) { return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel()); }

// Central differences of f at x (f takes the tensor, x is changed and restored), against `analytic`.
void check_gradient(tensor& x, const std::function<double(const tensor&)>& f, const tensor& analytic,
                    double h = 1e-3, double tol = 2e-3) {
  float* p = x.data<float>();
  const float* g = analytic.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float keep = p[i];
    p[i] = keep + static_cast<float>(h);
    const double up = f(x);
    p[i] = keep - static_cast<float>(h);
    const double down = f(x);
    p[i] = keep;
    const double numeric = (up - down) / (2 * h);
    CHECK_MESSAGE(g[i] == doctest::Approx(numeric).epsilon(tol).scale(1.0), "element " << i);
  }
}

tensor random_floats(shape_t shape, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(rng);
  return tensor::from_floats(shape, v);
}

}  // namespace

TEST_CASE("GRPO group advantages: Bessel std, scale_rewards group / batch / none, exact zeros, refusals") {
  // group 0 = [1, 0, 0, 0]: mean 0.25; Bessel std = sqrt((0.75² + 3 · 0.25²) / 3) = sqrt(0.75 / 3) = 0.5
  // group 1 = [2, 2, 2, 2]: mean 2, std 0
  auto r = tensor::from_floats({8}, {1, 0, 0, 0, 2, 2, 2, 2});
  group_advantage_config cfg;
  cfg.num_generations = 4;
  cfg.epsilon = 1e-4;  // TRL's
  auto a = floats(group_advantages(r, cfg));
  // (0.75 / 0.5001, −0.25 / 0.5001 x3) = (1.4997000600, −0.4999000200)
  CHECK(a[0] == doctest::Approx(1.4997000600).epsilon(1e-6));
  for (int i = 1; i < 4; ++i) CHECK(a[i] == doctest::Approx(-0.4999000200).epsilon(1e-6));
  for (int i = 4; i < 8; ++i) CHECK(a[i] == 0.0f);  // exact: the centred reward is exactly 0
  // veRL's epsilon: 0.75 / 0.500001
  cfg.epsilon = 1e-6;
  CHECK(floats(group_advantages(r, cfg))[0] == doctest::Approx(0.75 / 0.500001).epsilon(1e-6));
  // batch: group means, the std of all 8: mean 9/8, Σ(r − 1.125)² = 6.875, std = sqrt(6.875 / 7) = 0.9910312
  cfg.epsilon = 0;
  cfg.scale_rewards = reward_scaling::batch;
  a = floats(group_advantages(r, cfg));
  CHECK(a[0] == doctest::Approx(0.75 / 0.9910312).epsilon(1e-6));  // 0.7567875
  CHECK(a[1] == doctest::Approx(-0.25 / 0.9910312).epsilon(1e-6));
  CHECK(a[5] == 0.0f);
  // none (Dr. GRPO): centred only
  cfg.scale_rewards = reward_scaling::none;
  a = floats(group_advantages(r, cfg));
  CHECK(a[0] == doctest::Approx(0.75));
  CHECK(a[3] == doctest::Approx(-0.25));
  // equal rewards that do not add up exactly in floating point (0.1 · 3 != 0.3) still give exact zeros
  cfg.scale_rewards = reward_scaling::group;
  cfg.num_generations = 3;
  auto tenths = floats(group_advantages(tensor::from_floats({3}, {0.1f, 0.1f, 0.1f}), cfg));
  for (float x : tenths) CHECK(x == 0.0f);
  // refusals, with the reason
  cfg.num_generations = 1;
  CHECK_THROWS_WITH_AS(group_advantages(r, cfg), doctest::Contains("at least 2 samples per prompt"),
                       std::invalid_argument);
  cfg.num_generations = 3;
  CHECK_THROWS_WITH_AS(group_advantages(r, cfg), doctest::Contains("not whole groups"), std::invalid_argument);
  CHECK(parse_reward_scaling("none") == reward_scaling::none);
  CHECK_THROWS_WITH_AS(parse_reward_scaling("grp"), doctest::Contains("\"group\", \"batch\" or \"none\""),
                       std::invalid_argument);
}

TEST_CASE("RLOO: leave-one-out baseline, exact zeros, no catastrophic cancellation, DAPO groups with signal") {
  // [1, 0, 0, 0]: A_0 = 1 − (0 + 0 + 0) / 3 = 1; A_1 = 0 − (1 + 0 + 0) / 3 = −1/3
  auto a = floats(rloo_advantages(tensor::from_floats({4}, {1, 0, 0, 0}), 4));
  CHECK(a[0] == doctest::Approx(1.0));
  for (int i = 1; i < 4; ++i) CHECK(a[i] == doctest::Approx(-1.0 / 3));
  for (float x : floats(rloo_advantages(tensor::from_floats({3}, {0.1f, 0.1f, 0.1f}), 3))) CHECK(x == 0.0f);
  // [1e7 + 1, 1e7, 1e7, 1e7]: in f32 the sum 40000001 rounds to 40000000 (spacing 4 there), so
  // r_1 − (sum − r_1) / 3 would give 1e7 − 1e7 = 0; the answer is 0 − 1/3 of the one extra = −1/3
  a = floats(rloo_advantages(tensor::from_floats({4}, {10000001.0f, 1e7f, 1e7f, 1e7f}), 4));
  CHECK(a[0] == doctest::Approx(1.0));
  CHECK(a[1] == doctest::Approx(-1.0 / 3));
  CHECK_THROWS_WITH_AS(rloo_advantages(tensor::from_floats({2}, {1, 0}), 1), doctest::Contains("RLOO needs"),
                       std::invalid_argument);
  // DAPO's dynamic filtering keeps groups whose rewards differ
  auto keep = groups_with_signal(tensor::from_floats({8}, {1, 0, 0, 0, 2, 2, 2, 2}), 4);
  CHECK(keep == std::vector<bool>{true, false});
}

TEST_CASE("REINFORCE++: discounted returns reset at each row's end, whitened over the batch's real tokens") {
  // gamma 1, no padding: returns [[1, 1], [−1, −1]], mean 0, Bessel var 4/3 -> ±1/sqrt(4/3 + 1e-8) = ±0.8660254
  auto a = floats(reinforce_pp_advantages(tensor::from_floats({2, 2}, {0, 1, 0, -1}), tensor::from_ints({2, 2}, {1, 1, 1, 1}), 1.0));
  CHECK(a[0] == doctest::Approx(0.8660254));
  CHECK(a[1] == doctest::Approx(0.8660254));
  CHECK(a[2] == doctest::Approx(-0.8660254));
  // gamma 0.5 with padding: row 0 = [0, 1, (5 on padding)], row 1 = [0, −1, 0]
  //  row 0: G2 = 5 (padding; reset after), G1 = 1, G0 = 0 + 0.5 · 1 = 0.5
  //  row 1: G2 = 0, G1 = −1, G0 = −0.5
  //  real tokens 0.5, 1, −0.5, −1, 0: mean 0, Σ² = 2.5, var = 2.5 / 4 = 0.625, 1/sqrt(0.625) = 1.2649111
  a = floats(reinforce_pp_advantages(tensor::from_floats({2, 3}, {0, 1, 5, 0, -1, 0}),
                                     tensor::from_ints({2, 3}, {1, 1, 0, 1, 1, 1}), 0.5));
  CHECK(a[0] == doctest::Approx(0.6324555));
  CHECK(a[1] == doctest::Approx(1.2649111));
  CHECK(a[2] == 0.0f);  // padding
  CHECK(a[3] == doctest::Approx(-0.6324555));
  CHECK(a[4] == doctest::Approx(-1.2649111));
  CHECK(a[5] == doctest::Approx(0.0).scale(1));
  // an all-padding batch: zeros, not NaN
  for (float x : floats(reinforce_pp_advantages(tensor::from_floats({1, 2}, {1, 2}), tensor::from_ints({1, 2}, {0, 0}), 1.0)))
    CHECK(x == 0.0f);
}

TEST_CASE("KL estimators k1, k2, k3 (low_var_kl, clamped) and abs, with their gradients") {
  // log π = −1.0, log π_ref = −1.5: x = 0.5
  //  k1 = 0.5; k2 = 0.125; k3 = exp(−0.5) + 0.5 − 1 = 0.1065307; abs = 0.5
  auto lp = tensor::from_floats({1, 1}, {-1.0f});
  auto ref = tensor::from_floats({1, 1}, {-1.5f});
  CHECK(floats(kl_estimate(lp, ref, kl_estimator::k1))[0] == doctest::Approx(0.5));
  CHECK(floats(kl_estimate(lp, ref, kl_estimator::k2))[0] == doctest::Approx(0.125));
  CHECK(floats(kl_estimate(lp, ref, kl_estimator::k3))[0] == doctest::Approx(0.1065307).epsilon(1e-6));
  CHECK(floats(kl_estimate(lp, ref, kl_estimator::abs))[0] == doctest::Approx(0.5));
  // k3's clamp: x = −3 gives exp(3) − 3 − 1 = 16.09, clamped to 10, gradient 0
  tensor g;
  CHECK(floats(kl_estimate(tensor::from_floats({1}, {-4.0f}), tensor::from_floats({1}, {-1.0f}), kl_estimator::k3, &g))[0] ==
        doctest::Approx(10.0));
  CHECK(floats(g)[0] == 0.0f);
  // gradients by finite differences, away from the clamps and abs's kink
  std::mt19937 rng(7);
  auto x = random_floats({2, 3}, rng, -2.0f, -0.5f);
  auto r = random_floats({2, 3}, rng, -2.0f, -0.5f);
  for (auto k : {kl_estimator::k1, kl_estimator::k2, kl_estimator::k3, kl_estimator::abs}) {
    tensor d;
    kl_estimate(x, r, k, &d);
    // the sum of the estimates, whose gradient is d
    check_gradient(x, [&](const tensor& t) {
      double s = 0;
      for (float v : floats(kl_estimate(t, r, k))) s += v;
      return s;
    }, d);
  }
  CHECK(parse_kl_estimator("low_var_kl") == kl_estimator::k3);
  CHECK(parse_kl_estimator("mse") == kl_estimator::k2);
  CHECK_THROWS_AS(parse_kl_estimator("k4"), std::invalid_argument);
}

TEST_CASE("loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum, all-padding rows skipped") {
  // rows [1, 2, 3] (3 real), [4, 0, 0] (1 real), [9, 9, 9] (all padding)
  auto l = tensor::from_floats({3, 3}, {1, 2, 3, 4, 0, 0, 9, 9, 9});
  auto m = tensor::from_ints({3, 3}, {1, 1, 1, 1, 0, 0, 0, 0, 0});
  tensor d;
  // token-mean: (1 + 2 + 3 + 4) / 4 = 2.5, each real token 1/4
  CHECK(aggregate_loss(l, m, loss_agg_mode::token_mean, &d) == doctest::Approx(2.5));
  CHECK(floats(d) == std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f, 0, 0, 0, 0, 0});
  // seq-mean-token-mean over the 2 rows with tokens: (6/3 + 4/1) / 2 = 3; row 0 tokens 1/6, row 1's 1/2
  CHECK(aggregate_loss(l, m, loss_agg_mode::seq_mean_token_mean, &d) == doctest::Approx(3.0));
  auto dv = floats(d);
  CHECK(dv[0] == doctest::Approx(1.0 / 6));
  CHECK(dv[3] == doctest::Approx(0.5));
  CHECK(dv[6] == 0.0f);
  // seq-mean-token-sum: (6 + 4) / 2 = 5, every real token 1/2
  CHECK(aggregate_loss(l, m, loss_agg_mode::seq_mean_token_sum, &d) == doctest::Approx(5.0));
  CHECK(floats(d)[1] == doctest::Approx(0.5));
  // nothing real at all: 0, not NaN
  for (auto mode : {loss_agg_mode::token_mean, loss_agg_mode::seq_mean_token_mean, loss_agg_mode::seq_mean_token_sum})
    CHECK(aggregate_loss(l, tensor::from_ints({3, 3}, std::vector<int32_t>(9, 0)), mode) == 0.0);
  CHECK(parse_loss_agg_mode("seq-mean-token-sum") == loss_agg_mode::seq_mean_token_sum);
  CHECK_THROWS_WITH_AS(parse_loss_agg_mode("token_mean"), doctest::Contains("\"token-mean\""), std::invalid_argument);
}

TEST_CASE("clipped policy loss: ratio clip, dual clip for negative advantages, gradient, PPO's actor_loss") {
  auto one = [](float v) { return tensor::from_floats({1, 1}, {v}); };
  auto mask1 = tensor::from_ints({1, 1}, {1});
  policy_loss_config cfg;  // clip 0.2 / 0.2, clip_ratio_c 3
  tensor d;
  // A = −1, ratio 5: l1 = 5, l2 = −(−1) · 1.2 = 1.2, max = 5; dual: min(3 · 1, 5) = 3, gradient 0
  auto r = clipped_policy_loss(one(std::log(5.0f)), one(0.0f), one(-1.0f), mask1, cfg, &d);
  CHECK(r.loss == doctest::Approx(3.0));
  CHECK(r.dual_clip_frac == 1.0);
  CHECK(floats(d)[0] == 0.0f);
  // the dual clip off: 5, gradient d(−A · e^x)/dx = 5
  cfg.clip_ratio_c = 0;
  r = clipped_policy_loss(one(std::log(5.0f)), one(0.0f), one(-1.0f), mask1, cfg, &d);
  CHECK(r.loss == doctest::Approx(5.0));
  CHECK(floats(d)[0] == doctest::Approx(5.0));
  cfg.clip_ratio_c = 3;
  // A = 1, ratio 1.5: l1 = −1.5, l2 = −1.2 -> −1.2 from the clip, gradient 0, clipfrac 1
  r = clipped_policy_loss(one(std::log(1.5f)), one(0.0f), one(1.0f), mask1, cfg, &d);
  CHECK(r.loss == doctest::Approx(-1.2));
  CHECK(r.clipfrac == 1.0);
  CHECK(floats(d)[0] == 0.0f);
  // A = 1, ratio 1.1: inside, −1.1 with gradient −1.1
  r = clipped_policy_loss(one(std::log(1.1f)), one(0.0f), one(1.0f), mask1, cfg, &d);
  CHECK(r.loss == doctest::Approx(-1.1));
  CHECK(floats(d)[0] == doctest::Approx(-1.1));
  CHECK_THROWS_WITH_AS(
      [&] {
        policy_loss_config bad;
        bad.clip_ratio_c = 0.5;
        clipped_policy_loss(one(0), one(0), one(1), mask1, bad);
      }(),
      doctest::Contains("greater than 1"), std::invalid_argument);
  // gradients by finite differences on random tokens (ratios within e^±0.15 stay off the clip kinks)
  std::mt19937 rng(11);
  auto lp = random_floats({3, 4}, rng, -2.0f, -1.0f);
  auto olp = tensor::from_floats({3, 4}, floats(lp));
  {
    auto noise = floats(random_floats({3, 4}, rng, -0.15f, 0.15f));
    float* p = olp.data<float>();
    for (int i = 0; i < 12; ++i) p[i] += noise[static_cast<std::size_t>(i)];
  }
  auto adv = random_floats({3, 4}, rng, -1.0f, 1.0f);
  auto mask = tensor::from_ints({3, 4}, {1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 1});
  for (auto mode : {loss_agg_mode::token_mean, loss_agg_mode::seq_mean_token_mean, loss_agg_mode::seq_mean_token_sum}) {
    policy_loss_config c;
    c.agg = mode;
    clipped_policy_loss(lp, olp, adv, mask, c, &d);
    check_gradient(lp, [&](const tensor& t) { return clipped_policy_loss(t, olp, adv, mask, c).loss; }, d, 1e-3, 5e-3);
  }
  // PPO's actor_loss (rlhf_math.h) is this loss's token-mean case without a dual clip; its hand-worked
  // DeepSpeed-Chat values are in test_rlhf_math ("actor loss: ...").
}

// Decoupled PPO (AReaL, pg_math.h): the clipped loss times w = exp(old − behav), w > cap left out.
TEST_CASE("clipped policy loss: the log-ratio is clamped to +-20 (no inf from a diverged token), gradient 0 there") {
  // pg_math.h: ratio = exp(clamp(logprobs - old, +-20)), and d/dlogprobs is 0 where the clamp holds (DS-Chat's
  // actor_loss_fn has no clamp: a log-ratio of 100 gives inf there)
  auto one = [](float v) { return tensor::from_floats({1, 1}, {v}); };
  auto mask1 = tensor::from_ints({1, 1}, {1});
  policy_loss_config cfg;
  cfg.clip_ratio_c = 0;  // no dual clip: the unclipped term decides for A < 0
  tensor d;
  // A = -1, log-ratio 30: l1 = exp(20) (clamped, not exp(30)), l2 = 1.2, the loss is exp(20)
  auto r = clipped_policy_loss(one(30.0f), one(0.0f), one(-1.0f), mask1, cfg, &d);
  CHECK(r.loss == doctest::Approx(std::exp(20.0)).epsilon(1e-9));
  CHECK(floats(d)[0] == 0.0f);
  // log-ratio 100 stays finite
  r = clipped_policy_loss(one(100.0f), one(0.0f), one(-1.0f), mask1, cfg, &d);
  CHECK(r.loss == doctest::Approx(std::exp(20.0)).epsilon(1e-9));
  // A = +1, log-ratio -30: l1 = -exp(-20), l2 = -0.8, max = -exp(-20)
  r = clipped_policy_loss(one(-30.0f), one(0.0f), one(1.0f), mask1, cfg, &d);
  CHECK(r.loss == doctest::Approx(-std::exp(-20.0)).epsilon(1e-9));
  CHECK(floats(d)[0] == 0.0f);
  // just inside the clamp the gradient is the ratio's: d(-A r)/dx = -A r = exp(19.5) for A = -1
  r = clipped_policy_loss(one(19.5f), one(0.0f), one(-1.0f), mask1, cfg, &d);
  CHECK(floats(d)[0] == doctest::Approx(std::exp(19.5)).epsilon(1e-5));
}

TEST_CASE("decoupled PPO: behaviour importance weights by hand, the cap, gradient, and w = 1 on-policy") {
  // Four tokens of one row; old (proximal) log-probs 0, so ratio = e^lp; behav = −ln w.
  //  t0: ratio 1.5, A = 1:  l1 = −1.5, l2 = −1.2 -> −1.2 (clip, gradient 0); w = 2   -> −2.4
  //  t1: ratio 0.5, A = −1: l1 = 0.5, l2 = 0.8  -> 0.8 (clip, gradient 0); dual 3 > 0.8; w = 0.5 -> 0.4
  //  t2: ratio 1,   A = 2:  −2; w = 4 > cap 3 -> left out (0), still counted
  //  t3: ratio 1.1, A = 1:  −1.1 (inside, gradient −1.1); w = 1.5 -> −1.65, gradient −1.65
  // token-mean over 4: (−2.4 + 0.4 + 0 − 1.65) / 4 = −0.9125; gradient t3: −1.65 / 4 = −0.4125
  auto lp = tensor::from_floats({1, 4}, {std::log(1.5f), std::log(0.5f), 0.0f, std::log(1.1f)});
  auto old_lp = tensor::from_floats({1, 4}, {0, 0, 0, 0});
  auto behav = tensor::from_floats({1, 4}, {-std::log(2.0f), -std::log(0.5f), -std::log(4.0f), -std::log(1.5f)});
  auto adv = tensor::from_floats({1, 4}, {1, -1, 2, 1});
  auto mask = tensor::from_ints({1, 4}, {1, 1, 1, 1});
  policy_loss_config cfg;  // clip 0.2 / 0.2, clip_ratio_c 3
  cfg.behav_imp_weight_cap = 3;
  tensor d;
  auto r = clipped_policy_loss(lp, old_lp, adv, mask, cfg, &d, &behav);
  CHECK(r.loss == doctest::Approx(-0.9125).epsilon(1e-6));
  CHECK(r.behav_capped_frac == doctest::Approx(0.25));
  CHECK(r.behav_weight == doctest::Approx((2 + 0.5 + 0 + 1.5) / 4.0).epsilon(1e-6));
  CHECK(floats(d)[0] == 0.0f);
  CHECK(floats(d)[1] == 0.0f);
  CHECK(floats(d)[2] == 0.0f);
  CHECK(floats(d)[3] == doctest::Approx(-0.4125).epsilon(1e-5));
  // no cap: t2 counts with w = 4: (−2.4 + 0.4 − 8 − 1.65) / 4 = −2.9125
  cfg.behav_imp_weight_cap = 0;
  r = clipped_policy_loss(lp, old_lp, adv, mask, cfg, &d, &behav);
  CHECK(r.loss == doctest::Approx(-2.9125).epsilon(1e-6));
  CHECK(floats(d)[2] == doctest::Approx(-4.0 * 2.0 / 4.0).epsilon(1e-5));  // −A · ratio · w / 4
  CHECK_THROWS_WITH_AS(
      [&] {
        policy_loss_config bad;
        bad.behav_imp_weight_cap = 0.9;
        clipped_policy_loss(lp, old_lp, adv, mask, bad, nullptr, &behav);
      }(),
      doctest::Contains("behav_imp_weight_cap"), std::invalid_argument);
  // On-policy (behav = old): exactly the plain loss and gradient, whatever the aggregation (S = 0 of
  // max_staleness changes nothing).
  std::mt19937 rng(5);
  auto lp2 = random_floats({3, 5}, rng, -2.0f, -0.5f);
  auto old2 = random_floats({3, 5}, rng, -2.0f, -0.5f);
  auto adv2 = random_floats({3, 5}, rng, -1.0f, 1.0f);
  auto mask2 = tensor::from_ints({3, 5}, {1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0});
  for (auto mode : {loss_agg_mode::token_mean, loss_agg_mode::seq_mean_token_mean}) {
    policy_loss_config c;
    c.agg = mode;
    tensor d_plain, d_dec;
    const auto plain = clipped_policy_loss(lp2, old2, adv2, mask2, c, &d_plain);
    const auto dec = clipped_policy_loss(lp2, old2, adv2, mask2, c, &d_dec, &old2);
    CHECK(dec.loss == plain.loss);
    CHECK(floats(d_dec) == floats(d_plain));
    CHECK(dec.behav_weight == 1.0);
  }
  // gradient by finite differences with weights off 1 (ratios near 1 stay off the clip kinks)
  auto lp3 = tensor::from_floats({3, 5}, floats(old2));
  {
    auto noise = floats(random_floats({3, 5}, rng, -0.1f, 0.1f));
    float* p = lp3.data<float>();
    for (int i = 0; i < 15; ++i) p[i] += noise[static_cast<std::size_t>(i)];
  }
  auto behav3 = random_floats({3, 5}, rng, -2.5f, -0.5f);
  policy_loss_config c3;
  c3.behav_imp_weight_cap = 2.5;
  clipped_policy_loss(lp3, old2, adv2, mask2, c3, &d, &behav3);
  check_gradient(lp3, [&](const tensor& t) { return clipped_policy_loss(t, old2, adv2, mask2, c3, nullptr, &behav3).loss; },
                 d, 1e-3, 5e-3);
}

TEST_CASE("DPO: sigmoid, label smoothing and IPO by hand, ln 2 at the reference, gradients, DS-Chat masking") {
  auto v = [](float x) { return tensor::from_floats({1}, {x}); };
  dpo_config cfg;  // beta 0.1, sigmoid
  // the policy equal to the reference: z = 0, loss = −log σ(0) = ln 2, rewards 0, no pair won
  auto r = dpo_loss(v(-10), v(-12), v(-10), v(-12), cfg);
  CHECK(r.loss == doctest::Approx(std::log(2.0)));
  CHECK(r.accuracy == 0.0);
  // chosen up by 1, rejected down by 1 against the reference: z = 2, β z = 0.2
  //  loss = log(1 + e^−0.2) = 0.5981389; rewards 0.1 and −0.1; accuracy 1
  tensor dc, dr;
  r = dpo_loss(v(-10), v(-12), v(-11), v(-11), cfg, &dc, &dr);
  CHECK(r.loss == doctest::Approx(0.5981389));
  CHECK(r.chosen_rewards[0] == doctest::Approx(0.1));
  CHECK(r.rejected_rewards[0] == doctest::Approx(-0.1));
  CHECK(r.accuracy == 1.0);
  // d/dchosen = −β σ(−β z) = −0.1 · 0.4501660 = −0.0450166; d/drejected = +0.0450166
  CHECK(floats(dc)[0] == doctest::Approx(-0.0450166));
  CHECK(floats(dr)[0] == doctest::Approx(0.0450166));
  // label smoothing 0.1: 0.9 · 0.5981389 + 0.1 · log(1 + e^0.2) = 0.9 · 0.5981389 + 0.1 · 0.7981389 = 0.6181389
  cfg.label_smoothing = 0.1;
  CHECK(dpo_loss(v(-10), v(-12), v(-11), v(-11), cfg).loss == doctest::Approx(0.6181389));
  // IPO: (z − 1/(2β))² = (2 − 5)² = 9
  cfg.label_smoothing = 0;
  cfg.loss_type = dpo_loss_type::ipo;
  CHECK(dpo_loss(v(-10), v(-12), v(-11), v(-11), cfg).loss == doctest::Approx(9.0));
  // IPO with the counted tokens (TRL 1.12 dpo_trainer.py "ipo": each side's summed log-ratio over its
  // completion tokens): chosen −10 against −12 over 4 tokens, rejected −12 against −11 over 2:
  //  z' = 2/4 − (−1)/2 = 1, loss (1 − 5)² = 16; the rewards stay β × the sums (TRL's rewards/*): 0.2 and −0.1;
  //  d/dchosen = 2 (z' − 5) / 4 = −2, d/drejected = −2 (z' − 5) / 2 = 4
  {
    auto nc = v(4), nr = v(2);
    r = dpo_loss(v(-10), v(-12), v(-12), v(-11), cfg, &dc, &dr, &nc, &nr);
    CHECK(r.loss == doctest::Approx(16.0));
    CHECK(r.chosen_rewards[0] == doctest::Approx(0.2));
    CHECK(r.rejected_rewards[0] == doctest::Approx(-0.1));
    CHECK(r.accuracy == 1.0);
    CHECK(floats(dc)[0] == doctest::Approx(-2.0));
    CHECK(floats(dr)[0] == doctest::Approx(4.0));
  }
  // gradients by finite differences, both loss types, over 3 pairs
  std::mt19937 rng(5);
  auto pc = random_floats({3}, rng, -20, -5), pr = random_floats({3}, rng, -20, -5);
  auto rc = random_floats({3}, rng, -20, -5), rr = random_floats({3}, rng, -20, -5);
  for (auto type : {dpo_loss_type::sigmoid, dpo_loss_type::ipo}) {
    dpo_config c;
    c.loss_type = type;
    c.label_smoothing = type == dpo_loss_type::sigmoid ? 0.05 : 0.0;
    auto nc = tensor::from_floats({3}, {3, 7, 1}), nr = tensor::from_floats({3}, {5, 2, 4});  // IPO's token counts
    dpo_loss(pc, pr, rc, rr, c, &dc, &dr, &nc, &nr);
    check_gradient(pc, [&](const tensor& t) { return dpo_loss(t, pr, rc, rr, c, nullptr, nullptr, &nc, &nr).loss; }, dc,
                   1e-2);
    check_gradient(pr, [&](const tensor& t) { return dpo_loss(pc, t, rc, rr, c, nullptr, nullptr, &nc, &nr).loss; }, dr,
                   1e-2);
  }
  cfg.beta = 0;
  CHECK_THROWS_WITH_AS(dpo_loss(v(0), v(0), v(0), v(0), cfg), doctest::Contains("beta must be > 0"),
                       std::invalid_argument);
  // sequence log-probs: sum or (TRL's IPO) average over real tokens; an all-padding row gives 0
  auto lp = tensor::from_floats({2, 3}, {-1, -2, -3, -4, -5, -6});
  auto m = tensor::from_ints({2, 3}, {1, 1, 0, 0, 0, 0});
  CHECK(floats(sequence_log_probs(lp, m, false)) == std::vector<float>{-3.0f, 0.0f});
  CHECK(floats(sequence_log_probs(lp, m, true)) == std::vector<float>{-1.5f, 0.0f});
  // DeepSpeed-Chat's masking: both masks zeroed before the first differing id (index 2); identical rows untouched
  auto cid = tensor::from_ints({2, 4}, {5, 6, 7, 8, 1, 2, 3, 4});
  auto rid = tensor::from_ints({2, 4}, {5, 6, 9, 9, 1, 2, 3, 4});
  auto cm = tensor::from_ints({2, 4}, std::vector<int32_t>(8, 1));
  auto rm = tensor::from_ints({2, 4}, std::vector<int32_t>(8, 1));
  mask_before_divergence(cm, rm, cid, rid);
  CHECK(ints(cm) == std::vector<int32_t>{0, 0, 1, 1, 1, 1, 1, 1});
  CHECK(ints(rm) == std::vector<int32_t>{0, 0, 1, 1, 1, 1, 1, 1});
}
