// Greedy decoding of stories260K from BOS against the float64 reference, and
// batched left-padded generation against per-sequence generation.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/generate.h"
#include "models/llama2c.h"
#include "models/sampler.h"
#include "models/tokenizer.h"
#include "test_util.h"

using namespace flowrun;

TEST_CASE("greedy generation from BOS reproduces greedy_from_bos_tokens and text") {
  auto ref = test::load_json_asset("ref/stories260K_forward_reference.json");
  auto want = ref["greedy_from_bos_tokens"].get<std::vector<int32_t>>();
  auto model = load_llama2c(test::model_path());
  auto tok = load_tokenizer(test::tokenizer_path());
  generation_config g;
  g.sampling.temperature = 0.0f;
  g.max_new_tokens = static_cast<int64_t>(want.size()) - 1;
  auto res = generate(model, {{tok->bos_id()}}, g);
  std::vector<int32_t> got = {tok->bos_id()};
  got.insert(got.end(), res[0].tokens.begin(), res[0].tokens.end());
  CHECK(got == want);
  CHECK(tok->decode(got) == ref["greedy_from_bos_text"].get<std::string>());
}

TEST_CASE("beam search gives transformers' tokens: num_beams 2-5, length_penalty 0.5-2, beams ending at EOS or BOS") {
  // tests/fixtures/beam/stories260K_beams.jsonl: transformers 5.25's generate(num_beams, do_sample=False,
  // length_penalty, max_new_tokens) on stories260K converted to an HF folder (tests/fixtures/make_generate_reference.py, beams);
  // the two 300-token cases end at a stop id (272 and 239 new tokens), where the finished hypotheses and the early
  // stop decide
  auto model = load_llama2c(test::model_path());
  std::ifstream f(std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/beam/stories260K_beams.jsonl");
  int cases = 0, ended = 0;
  for (std::string line; std::getline(f, line);) {
    const auto c = nlohmann::json::parse(line);
    CAPTURE(line.substr(0, 120));
    generation_config g;
    g.num_beams = c["num_beams"].get<int64_t>();
    g.length_penalty = c["length_penalty"].get<float>();
    g.max_new_tokens = c["max_new_tokens"].get<int64_t>();
    g.stop_ids = {2, 1};  // EOS or a new BOS: llama2.c's rule, the converted folder's generation_config.json
    const auto want = c["new_ids"].get<std::vector<int32_t>>();
    const auto got = beam_search(model, c["prompt_ids"].get<std::vector<int32_t>>(), g);
    CHECK(got.tokens == want);
    CHECK(got.stopped == (want.size() < static_cast<size_t>(g.max_new_tokens)));
    // one entry point: generate() with num_beams searches each prompt
    CHECK(generate(model, {c["prompt_ids"].get<std::vector<int32_t>>()}, g)[0].tokens == want);
    ++cases;
    ended += want.size() < static_cast<size_t>(g.max_new_tokens);
  }
  CHECK(cases == 6);
  CHECK(ended == 2);
}

TEST_CASE("generation_config's token masks give transformers' tokens, greedy and with beams") {
  // tests/fixtures/generate/stories260K_processors.jsonl: transformers 5.25's generate() with min_new_tokens,
  // min_length, no_repeat_ngram_size, suppress_tokens and begin_suppress_tokens (its MinNewTokensLength, MinLength,
  // NoRepeatNGram, SuppressTokens and SuppressTokensAtBegin logits processors) on stories260K as an HF folder
  // (tests/fixtures/make_generate_reference.py, masks). Greedily "The little dog" stops after 218 new tokens: with
  // min_new_tokens 230 it goes on to 233
  auto model = load_llama2c(test::model_path());
  std::ifstream f(std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/generate/stories260K_processors.jsonl");
  int cases = 0;
  for (std::string line; std::getline(f, line);) {
    const auto c = nlohmann::json::parse(line);
    CAPTURE(line.substr(0, 160));
    generation_config g;
    g.sampling.temperature = 0.0f;  // greedy where num_beams is 1
    g.num_beams = c["num_beams"].get<int64_t>();
    g.max_new_tokens = c["max_new_tokens"].get<int64_t>();
    g.min_new_tokens = c["min_new_tokens"].get<int64_t>();
    g.min_length = c["min_length"].get<int64_t>();
    g.no_repeat_ngram_size = c["no_repeat_ngram_size"].get<int64_t>();
    g.suppress_ids = c["suppress_tokens"].get<std::vector<int32_t>>();
    g.begin_suppress_ids = c["begin_suppress_tokens"].get<std::vector<int32_t>>();
    g.stop_ids = {2, 1};  // the converted folder's generation_config.json
    const auto want = c["new_ids"].get<std::vector<int32_t>>();
    const auto got = generate(model, {c["prompt_ids"].get<std::vector<int32_t>>()}, g)[0].tokens;
    CHECK(got == want);
    CHECK(static_cast<int64_t>(got.size()) >= std::min(g.min_new_tokens, g.max_new_tokens));
    const auto& prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    CHECK(static_cast<int64_t>(prompt.size() + got.size()) >= std::min(g.min_length, g.max_new_tokens));
    if (const int64_t n = g.no_repeat_ngram_size; n > 0) {  // no n-gram twice in prompt + answer
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), got.begin(), got.end());
      std::set<std::vector<int32_t>> seen;
      for (size_t i = 0; i + n <= all.size(); ++i) CHECK(seen.insert({all.begin() + i, all.begin() + i + n}).second);
    }
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK(std::find(g.suppress_ids.begin(), g.suppress_ids.end(), got[i]) == g.suppress_ids.end());
      if (i == 0) CHECK(std::find(g.begin_suppress_ids.begin(), g.begin_suppress_ids.end(), got[i]) == g.begin_suppress_ids.end());
    }
    ++cases;
  }
  CHECK(cases == 8);
  // without the masks "The little dog" stops at 218 tokens, so the first case's 233 came from min_new_tokens
  generation_config plain;
  plain.sampling.temperature = 0.0f;
  plain.max_new_tokens = 260;
  plain.stop_ids = {2, 1};
  CHECK(generate(model, {{1, 291, 376, 400, 428}}, plain)[0].tokens.size() == 218);
  // every token masked: refused, greedy and sampling (sampling read NaN probabilities and printed garbage)
  generation_config none = plain;
  for (int32_t t = 0; t < 512; ++t) none.suppress_ids.push_back(t);
  CHECK_THROWS_WITH_AS(generate(model, {{1, 291}}, none), doctest::Contains("every token is masked for new token 1"),
                       std::invalid_argument);
  none.sampling.temperature = 1.0f;
  CHECK_THROWS_AS(generate(model, {{1, 291}}, none), std::invalid_argument);
  none.num_beams = 2;
  CHECK_THROWS_AS(generate(model, {{1, 291}}, none), std::invalid_argument);
}

TEST_CASE("beam search: one beam is refused, no new token gives none") {
  auto model = load_llama2c(test::model_path());
  generation_config g;
  g.num_beams = 1;
  CHECK_THROWS_AS(beam_search(model, {1, 403}, g), std::invalid_argument);
  g.num_beams = 3;
  g.max_new_tokens = 0;
  CHECK(beam_search(model, {1, 403}, g).tokens.empty());
  CHECK_THROWS_AS(beam_search(model, {}, g), std::invalid_argument);
}

TEST_CASE("batched generation with left padding equals per-sequence generation, token for token") {
  auto model = load_llama2c(test::model_path());
  auto tok = load_tokenizer(test::tokenizer_path());
  std::vector<std::vector<int32_t>> prompts = {
      tok->encode("Once upon a time", true),
      tok->encode("The cat", true),
      tok->encode("Lily and Ben went to the park to play with a ball", true),
  };
  generation_config g;
  g.sampling.temperature = 0.0f;
  g.max_new_tokens = 40;
  g.stop_ids = {tok->eos_id(), tok->bos_id()};
  auto batched = generate(model, prompts, g);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = generate(model, {prompts[i]}, g);
    INFO("prompt " << i);
    CHECK(batched[i].tokens == alone[0].tokens);
    CHECK(batched[i].stopped == alone[0].stopped);
    CHECK(!alone[0].tokens.empty());
  }
}

TEST_CASE("sampling is reproducible for a seed and differs across seeds") {
  auto model = load_llama2c(test::model_path());
  generation_config g;
  g.sampling.temperature = 1.0f;
  g.sampling.top_p = 0.9f;
  g.sampling.top_k = 40;
  g.max_new_tokens = 30;
  g.seed = 7;
  auto a = generate(model, {{1}}, g);
  auto b = generate(model, {{1}}, g);
  CHECK(a[0].tokens == b[0].tokens);
  g.seed = 8;
  auto c = generate(model, {{1}}, g);
  CHECK(a[0].tokens != c[0].tokens);
}

TEST_CASE("apply_repetition_penalty: CTRL's rule once per seen id, as transformers' RepetitionPenaltyLogitsProcessor") {
  // penalty 2: a positive score halves, a negative one doubles, 0 stays; an id seen twice counts once;
  // ids outside the row are skipped (transformers gathers the scores at the ids, then divides or multiplies)
  std::vector<float> row = {2.0f, -2.0f, 0.0f, 1.0f};
  apply_repetition_penalty(row.data(), 4, 2.0f, {0, 1, 1, 2, 7, -1});
  CHECK(row == std::vector<float>{1.0f, -4.0f, 0.0f, 1.0f});
  apply_repetition_penalty(row.data(), 4, 1.0f, {0, 3});  // 1: off
  CHECK(row == std::vector<float>{1.0f, -4.0f, 0.0f, 1.0f});
  // greedy sampling sees the penalised row: the best logit, seen before, loses to the second
  sampling_config cfg;
  cfg.temperature = 0.0f;
  cfg.repetition_penalty = 3.0f;
  rng64 rng(1);
  const std::vector<float> logits = {3.0f, 2.0f, -1.0f};
  CHECK(sample_token(logits.data(), 3, cfg, rng) == 0);
  CHECK(sample_token(logits.data(), 3, cfg, rng, {0}) == 1);  // 3 / 3 = 1 < 2
}

TEST_CASE("sample_token: top-k keeps the k most probable (and ties with the k-th), frequencies follow the renormalised softmax") {
  // logits with a tie inside the top 3 (ids 1 and 3) and one at the top-2 boundary below
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};
  sampling_config cfg;
  cfg.temperature = 0.7f;
  cfg.top_k = 3;
  // float64 reference: softmax(l / T) over the kept ids {1, 3, 2}, renormalised
  const std::vector<int> kept = {1, 3, 2};
  double z = 0;
  for (int id : kept) z += std::exp(logits[id] / 0.7);
  rng64 rng(12345);
  const int draws = 30000;
  std::vector<int> count(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++count[sample_token(logits.data(), 6, cfg, rng)];
  CHECK(count[0] == 0);
  CHECK(count[4] == 0);
  CHECK(count[5] == 0);
  // binomial standard deviation <= sqrt(0.25 / 30000) = 0.0029: 0.015 is > 5 sigma
  for (int id : kept) {
    CAPTURE(id);
    CHECK(std::fabs(count[id] / double(draws) - std::exp(logits[id] / 0.7) / z) <= 0.015);
  }
  // top-2 of {3, 1, 3, 3}: transformers' TopKLogitsWarper removes only scores below the k-th
  // (generation/logits_process.py: scores < topk(scores, k)[0][..., -1]), so the three tied at 3 all stay,
  // each a third (they were cut to ids 0 and 2 by id)
  const std::vector<float> tie = {3.0f, 1.0f, 3.0f, 3.0f};
  cfg.top_k = 2;
  std::vector<int> tc(4, 0);
  for (int i = 0; i < 3000; ++i) ++tc[sample_token(tie.data(), 4, cfg, rng)];
  CHECK(tc[1] == 0);
  CHECK(tc[0] + tc[2] + tc[3] == 3000);
  for (int id : {0, 2, 3}) CHECK(std::fabs(tc[id] / 3000.0 - 1.0 / 3) <= 0.05);  // sd 0.009
}

TEST_CASE("sample_token: top_p after top_k measures the nucleus on the renormalised top k, as transformers") {
  // probabilities 0.70, 0.10 and 0.20 spread over 8 ids: top_k = 2 leaves 0.70 and 0.10, renormalised
  // 0.875 and 0.125 (TopPLogitsWarper softmaxes the scores TopK set to -inf). top_p = 0.75: the first alone
  // reaches it, so id 0 only (the nucleus on the raw mass, 0.70 < 0.75, also kept id 1: 1 draw in 8);
  // top_p = 0.9: both, 7 : 1.
  std::vector<double> p = {0.70, 0.10};
  for (int i = 0; i < 8; ++i) p.push_back(0.20 / 8);
  std::vector<float> logits;
  for (double x : p) logits.push_back(static_cast<float>(std::log(x)));
  sampling_config cfg;
  cfg.top_k = 2;
  cfg.top_p = 0.75f;
  rng64 rng(99);
  std::vector<int> count(p.size(), 0);
  for (int i = 0; i < 2000; ++i) ++count[sample_token(logits.data(), static_cast<int64_t>(p.size()), cfg, rng)];
  CHECK(count[0] == 2000);
  cfg.top_p = 0.9f;
  std::fill(count.begin(), count.end(), 0);
  for (int i = 0; i < 8000; ++i) ++count[sample_token(logits.data(), static_cast<int64_t>(p.size()), cfg, rng)];
  CHECK(count[0] + count[1] == 8000);
  CHECK(std::fabs(count[1] / 8000.0 - 0.125) <= 0.02);  // sd 0.0037
}

TEST_CASE("rows with equal prompts share one prefill: each row samples what it samples alone") {
  // GRPO's rollouts: num_generations rows per prompt. generate() runs each distinct prompt once
  // and copies its K/V rows and logits to the rows that repeat it; every row must still be the
  // row generated alone with its own sampler seed (row b of a batch draws from seed + b + 1).
  auto model = load_llama2c(test::model_path());
  auto tok = load_tokenizer(test::tokenizer_path());
  const auto p = tok->encode("Once upon a time", true), q = tok->encode("The cat sat", true);
  const std::vector<std::vector<int32_t>> prompts = {p, q, p, p, q, p};  // q shorter: left padding too
  generation_config g;
  g.sampling.temperature = 1.0f;
  g.max_new_tokens = 24;
  g.seed = 11;
  g.record_logprobs = true;
  const auto batched = generate(model, prompts, g);
  int differ = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    generation_config one = g;
    one.seed = g.seed + b;  // the batch's row b: seed + b + 1
    const auto alone = generate(model, {prompts[b]}, one);
    INFO("row " << b);
    REQUIRE(batched[b].tokens == alone[0].tokens);
    REQUIRE(batched[b].logprobs.size() == alone[0].logprobs.size());
    for (size_t t = 0; t < alone[0].logprobs.size(); ++t)
      CHECK(std::fabs(batched[b].logprobs[t] - alone[0].logprobs[t]) < 1e-4f);
    differ += batched[b].tokens != batched[0].tokens;
  }
  CHECK(differ > 0);  // the rows of one prompt sampled different answers: they share only the prompt
}
