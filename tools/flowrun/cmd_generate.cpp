#include <iostream>
#include <memory>

#include <spdlog/spdlog.h>

#include "models/generate.h"
#include "models/checkpoint.h"
#include "models/llama2c.h"
#include "models/tokenizer.h"
#include "runtime/util/assets.h"
#include "tools/flowrun/commands.h"

namespace flowrun::cli {

namespace {
struct generate_opts {
  std::string model = "model/stories260K/stories260K.bin";
  std::string tokenizer = "model/stories260K/tok512.model";
  std::string prompt;
  float temperature = 1.0f;
  float top_p = 0.9f;
  int top_k = 0;
  float repetition_penalty = 1.0f;
  int64_t seed = 42;
  int64_t max_new_tokens = 256;
};
}  // namespace

void add_generate(CLI::App& app) {
  auto o = std::make_shared<generate_opts>();
  auto* sub = app.add_subcommand("generate", "Generate text from a model (llama2.c file) and a prompt");
  sub->add_option("--model", o->model, "llama2.c checkpoint (relative paths also resolve under FLOWRUN_ASSETS)")
      ->capture_default_str();
  sub->add_option("--tokenizer", o->tokenizer, "SentencePiece .model file")->capture_default_str();
  sub->add_option("--prompt", o->prompt, "Prompt text (empty: start from BOS)");
  sub->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top_p", o->top_p, "Nucleus sampling threshold (1 = off)")->capture_default_str();
  sub->add_option("--top_k", o->top_k, "Top-k filter (0 = off)")->capture_default_str();
  sub->add_option("--repetition_penalty", o->repetition_penalty, "1 = off")->capture_default_str();
  sub->add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  sub->add_option("--max_new_tokens", o->max_new_tokens, "Tokens to generate at most")->capture_default_str();
  sub->callback([o] {
    if (o->max_new_tokens < 0) throw std::invalid_argument("--max_new_tokens must be >= 0");
    if (o->temperature < 0) throw std::invalid_argument("--temperature must be >= 0 (0 = greedy)");
    if (o->top_p <= 0 || o->top_p > 1) throw std::invalid_argument("--top_p must be in (0, 1]");
    if (o->top_k < 0) throw std::invalid_argument("--top_k must be >= 0 (0 = off)");
    auto model = load_model(o->model);
    if (model.has_value_head())
      throw std::invalid_argument(o->model + " is a reward/value model (it has a v_head, no LM head): give a policy model");
    auto tok = load_tokenizer(resolve_user_path(o->tokenizer, "tokenizer").string());
    spdlog::info("model: {}", model.config().summary());
    auto prompt = tok->encode(o->prompt, /*add_bos=*/true);
    generation_config g;
    g.sampling.temperature = o->temperature;
    g.sampling.top_p = o->top_p;
    g.sampling.top_k = o->top_k;
    g.sampling.repetition_penalty = o->repetition_penalty;
    g.seed = static_cast<uint64_t>(o->seed);
    g.max_new_tokens = o->max_new_tokens;
    // llama2.c models mark a story's end with EOS or a new BOS
    g.stop_ids = {tok->eos_id(), tok->bos_id()};
    auto res = generate(model, {prompt}, g);
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), res[0].tokens.begin(), res[0].tokens.end());
    std::cout << tok->decode(all) << std::endl;
  });
}

}  // namespace flowrun::cli
