#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include <spdlog/spdlog.h>

#include "models/adapter.h"
#include "models/generate.h"
#include "models/checkpoint.h"
#include "models/llama2c.h"
#include <nlohmann/json.hpp>

#include "models/config.h"
#include "models/train/shard_checkpoint.h"
#include "models/tokenizer.h"
#include "models/train/zero.h"
#include "runtime/graph/node_kind.h"
#include "runtime/kernels/ops.h"
#include "runtime/util/assets.h"
#include "tools/flowrun/commands.h"
#include "tools/flowrun/model_tokenizer.h"
#include "tools/flowrun/sampling_options.h"
#include "tools/flowrun/zero_source.h"

namespace flowrun::cli {

namespace {
struct generate_opts {
  std::string model = "model/stories260K/stories260K.bin";
  std::string tokenizer = "model/stories260K/tok512.model";
  std::string prompt;
  std::shared_ptr<sampling_opts> sampling = std::make_shared<sampling_opts>();  // llama2.c's run.c: T 1, top_p 0.9
  int64_t max_new_tokens = 256;
  std::string zero_checkpoint;
  int world_size = 2;
  std::string lora;  // a PEFT adapter folder on top of --model
};

// The sampling settings of the command line.
generation_config generation_of(const generate_opts& o, const sampling_options& s, const tokenizer& tok) {
  generation_config g = s.config();
  g.max_new_tokens = o.max_new_tokens;
  // a ZeRO checkpoint holds pretraining's llama2.c-style models: EOS or a new BOS, as llama2.c's files
  g.stop_ids = o.zero_checkpoint.empty() ? stop_ids_for(o.model, tok.bos_id(), tok.eos_id())
                                         : std::vector<int32_t>{tok.eos_id(), tok.bos_id()};
  return g;
}

// The text printed: the prompt as given, then the continuation as the tokenizer decodes it after the prompt's ids
// (decoding the whole sequence keeps the first new word's space). The prompt decoded from its ids lost an HF chat
// template's EOS marks (Qwen2's <|im_end|>, decode drops the EOS) while keeping the others. Where the whole
// decoding does not begin with the prompt's, the whole decoding.
std::string shown_text(const tokenizer& tok, const std::string& given, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& all) {
  const std::string whole = tok.decode(all), head = tok.decode(prompt);
  if (whole.rfind(head, 0) != 0) return whole;
  // trailing spaces the tokenizer dropped (SentencePiece's "Hello " is "Hello"): the model never saw them
  std::string shown = given;
  if (head.empty() || !std::isspace(static_cast<unsigned char>(head.back())))
    while (!shown.empty() && std::isspace(static_cast<unsigned char>(shown.back()))) shown.pop_back();
  return shown + whole.substr(head.size());
}

// TencentPretrain's generate_lm_deepspeed: the model stays sharded over
// `world` in-process ZeRO-3 ranks; each layer is all-gathered just before it
// runs for every decoded token, then freed. Every rank samples the same tokens
// (same gathered weights, same seed); rank 0's are returned.
// A checkpoint with a LoRA adapter (a LoRA run's, the adapter alone; DS-Chat's lora_dim beside a base that
// trains) goes through zero_checkpoint_model (base_given: --model, a LoRA run's base), in this thread.
std::vector<int32_t> generate_from_zero(const loaded_checkpoint& ck, int world, const std::string& base_given,
                                        const std::vector<int32_t>& prompt, const generation_config& g,
                                        const tokenizer& tok, const std::string& tok_path) {
  const std::string& folder = ck.folder;
  const auto& extra = ck.manifests.at(0).extra;
  const bool whole = ck.full.count("base") > 0;
  if (whole && !base_given.empty())  // it generated from the checkpoint without a word
    throw std::invalid_argument(folder + " holds the whole model, not a LoRA adapter on a base: drop --model " +
                                base_given + " (it names the base of a LoRA run's checkpoint)");
  // (zero_checkpoint_model also says why a checkpoint is no model here: no recorded model, a value head)
  if (!whole || !extra.contains("model_config") || extra.contains("lora_config") || extra.value("value_head", false)) {
    decoder model = zero_checkpoint_model(ck, base_given, "--model");
    check_tokenizer_fits(tok, tok_path, model, folder);
    return generate(model, {prompt}, g)[0].tokens;
  }
  const model_config cfg = extra.at("model_config").get<model_config>();
  check_tokenizer_fits(tok, tok_path, cfg.vocab_size, folder);
  auto group = comm::make_inproc_group(world);
  std::vector<std::vector<int32_t>> out(world);
  std::vector<std::string> errors(world);
  std::vector<int64_t> bytes(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        ops::set_thread_budget(std::max(1, ops::hardware_threads() / world));
        auto c = comm::inproc_communicator(group, r);
        decoder m(cfg);
        zero_settings zs;
        zs.stage = 3;
        zero_engine eng(m, *c, zs);
        eng.restore(ck.full.at("base").at("fp32_master"), {}, {}, {}, {}, {}, ck.step);
        auto res = generate(m, {prompt}, g);
        out[r] = res[0].tokens;
        bytes[r] = c->stats().bytes_sent;
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r)
    if (!errors[r].empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[r]);
  for (int r = 1; r < world; ++r)
    if (out[r] != out[0]) throw std::runtime_error("ZeRO-3 ranks sampled different tokens (rank " + std::to_string(r) + ")");
  spdlog::info("generated from {} over {} ZeRO-3 ranks (step {}): {} tokens, {:.2f} MB all-gathered per rank",
               folder, world, ck.step, out[0].size(), bytes[0] / 1e6);
  return out[0];
}
}  // namespace

void add_generate(CLI::App& app) {
  auto o = std::make_shared<generate_opts>();
  auto* sub = app.add_subcommand("generate", "Generate text from a model (llama2.c file, flowrun or HF folder) and a prompt");
  auto* model_opt = sub->add_option("--model", o->model,
                                    "llama2.c file, flowrun or HF folder (relative paths also resolve under FLOWRUN_ASSETS)")
                        ->capture_default_str();
  auto* tok_opt = sub->add_option("--tokenizer", o->tokenizer,
                                  "SentencePiece .model, GPT-2 vocab.json or an HF folder; default: the model "
                                  "folder's own tokenizer, else this")
                      ->capture_default_str();
  sub->add_option("--prompt", o->prompt, "Prompt text (empty: start from BOS, for a tokenizer that has one)");
  auto sampling = std::make_shared<sampling_options>(
      *sub, o->sampling,
      "0 = greedy (default: the model folder's generation_config.json; an HF folder decodes greedily unless it says "
      "do_sample, as transformers does; else 1)");
  graph::node_kind_registry declared;  // --max_new_tokens is checked as the generator's setting
  graph::register_example_kinds(declared);
  const graph::node_kind& gen = *declared.lookup("generator");
  sub->add_option("--max_new_tokens", o->max_new_tokens, "Tokens to generate at most")
      ->capture_default_str()
      ->check(setting_check(*gen.find_setting("max_new_tokens"), gen.name));
  sub->add_option("--zero_checkpoint", o->zero_checkpoint,
                  "Generate from a ZeRO checkpoint folder (zero_rank's output_dir or a step folder), sharded over "
                  "--world_size ranks that gather each layer as it runs (instead of --model). A LoRA run's "
                  "checkpoint: its base model (the run's `model`, or --model when it moved) with the adapter merged");
  sub->add_option("--world_size", o->world_size, "Ranks for --zero_checkpoint (threads of this process)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  sub->add_option("--lora", o->lora,
                  "A LoRA adapter folder (PEFT's adapter_config.json + adapter_model.safetensors: zero_rank's "
                  "save_lora, a trainer's LoRA output) applied on top of --model, merged before generating");
  sub->callback([o, tok_opt, model_opt, sampling] {
    if (!o->zero_checkpoint.empty() && !o->lora.empty())
      throw std::invalid_argument("--lora goes with --model (the base model), not --zero_checkpoint");
    // the sampling defaults of the model folder `model`, for the options not given (sampling_options::take_defaults)
    const auto take_defaults = [&](const std::string& model) {
      if (const std::string took = sampling->take_defaults(model); !took.empty()) spdlog::info("sampling: {}", took);
    };
    if (!o->zero_checkpoint.empty()) {
      const auto ck = load_checkpoint(zero_step_folder(o->zero_checkpoint, "--zero_checkpoint"));
      // a run from an HF folder decodes as that folder does (its generation_config.json, transformers' rule), as
      // the checkpoint converted to an HF folder would
      if (const std::string base = model_opt->count() > 0 ? o->model : zero_run_model(ck); !base.empty()) {
        std::error_code ec;
        if (std::filesystem::is_directory(base, ec))
          take_defaults(base);
        else if (!std::filesystem::exists(base, ec) && model_opt->count() == 0)
          spdlog::warn("the run's base model {} is gone: its generation_config.json (greedy or sampling, as "
                       "transformers decodes an HF folder) is not read; the options given decide, else temperature "
                       "{:g} and top_p {:g}",
                       base, o->sampling->temperature, o->sampling->top_p);
      }
      // the run's own tokenizer (the trainer's, or a pretraining run's data node's), as --model reads a folder's:
      // tok512 encoded a Llama 3 run's text
      std::string tok_path = resolve_user_path(o->tokenizer, "tokenizer").string();
      if (tok_opt->count() == 0) {
        if (const std::string run_tok = zero_run_tokenizer(ck, o->zero_checkpoint); !run_tok.empty()) {
          tok_path = run_tok;
          spdlog::info("tokenizer: {}, the run's (--tokenizer not given)", tok_path);
        } else {
          spdlog::warn("{}: the tokenizer the run trained with is not found (no record beside the checkpoint names a "
                       "file that exists): reading with {}; give the run's with --tokenizer",
                       ck.folder, tok_path);
        }
      }
      auto tok = load_tokenizer(tok_path);
      auto prompt = prompt_ids(*tok, o->prompt);
      auto gen = generate_from_zero(ck, o->world_size, model_opt->count() > 0 ? o->model : "", prompt,
                                    generation_of(*o, *sampling, *tok), *tok, tok_path);
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), gen.begin(), gen.end());
      std::cout << shown_text(*tok, o->prompt, prompt, all) << std::endl;
      return;
    }
    auto model = load_model(o->model);
    take_defaults(o->model);
    if (!o->lora.empty()) {  // base + LoRA, merged (W + alpha/r B A): one product per Linear while decoding
      try {
        load_adapter(model, resolve_user_path(o->lora, "lora").string(), /*freeze_base=*/true);
      } catch (const std::runtime_error& e) {
        throw std::invalid_argument("--lora " + o->lora + " on --model " + o->model + ": " + e.what());
      }
      model.merge_lora();
      spdlog::info("LoRA adapter {} merged into {}", o->lora, o->model);
    }
    if (model.has_value_head())
      throw std::invalid_argument(o->model + " is a reward/value model (a value head: DS-Chat's v_head or a ForSequenceClassification's score; no LM head): give a policy model");
    const std::string tok_path = tokenizer_for({o->model}, o->tokenizer, tok_opt->count() > 0);
    auto tok = load_tokenizer(resolve_user_path(tok_path, "tokenizer").string());
    check_tokenizer_fits(*tok, tok_path, model, o->model);
    spdlog::info("model: {}", model.config().summary());
    auto prompt = prompt_ids(*tok, o->prompt);
    if (prompt.empty())  // a tokenizer without BOS (Qwen2's) has nothing to start from
      throw std::invalid_argument("--prompt is empty and the tokenizer " + tok_path +
                                  " has no BOS token to start from: give a prompt");
    if (const int64_t ctx = model.config().max_seq_len;
        static_cast<int64_t>(prompt.size()) + o->max_new_tokens > ctx)  // said, as chat refuses it
      spdlog::warn("--max_new_tokens {} after a prompt of {} tokens passes {}'s context of {} tokens: generation "
                   "stops at the context, after at most {} new tokens",
                   o->max_new_tokens, prompt.size(), o->model, ctx,
                   std::max<int64_t>(0, ctx - static_cast<int64_t>(prompt.size())));
    auto res = generate(model, {prompt}, generation_of(*o, *sampling, *tok));
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), res[0].tokens.begin(), res[0].tokens.end());
    std::cout << shown_text(*tok, o->prompt, prompt, all) << std::endl;
  });
}

}  // namespace flowrun::cli
