#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <fstream>
#include <memory>
#include <thread>

#include <spdlog/spdlog.h>

#include "models/adapter.h"
#include "models/generate.h"
#include "models/checkpoint.h"
#include "models/llama2c.h"
#include "models/safetensors.h"
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
  std::string max_new_tokens_from;  // the generation_config.json that gave max_new_tokens; empty: the option
  int64_t max_length = 0;        // prompt + new tokens at most, from a generation_config.json; 0: max_new_tokens
  std::string max_length_from;   // that file
  std::string zero_checkpoint;
  int world_size = 2;
  std::string lora;  // a PEFT adapter folder on top of --model
  std::string test_path;        // TencentPretrain's: one prompt per line
  std::string prediction_path;  // TencentPretrain's: where the texts go (default: standard output)
};

// Prompts per generate() call with --test_path: at most cpu_gemm's small-M rows, so that a decoding step's
// products give each row the bits of its prompt run alone (generate's promise), and a long file's KV cache
// stays small.
constexpr size_t k_prompts_per_batch = 16;

// generate() over `prompts` in batches of k_prompts_per_batch; prompt i samples with seed + i, as one
// generate() call of them all and as `--prompt` alone with --seed seed + i. With `max_length` > 0 (a
// generation_config.json's, transformers' prompt + new tokens), prompt i takes max_length - its length new
// tokens (prompt_id_lists checked it is >= 1): prompts of other lengths run one by one, each alone as promised.
std::vector<std::vector<int32_t>> generate_batches(decoder& m, const std::vector<std::vector<int32_t>>& prompts,
                                                   generation_config g, int64_t max_length = 0) {
  std::vector<std::vector<int32_t>> out;
  const uint64_t seed = g.seed;
  if (max_length > 0) {
    const bool one_length = std::all_of(prompts.begin(), prompts.end(),
                                        [&](const auto& p) { return p.size() == prompts.front().size(); });
    if (one_length) {
      g.max_new_tokens = max_length - static_cast<int64_t>(prompts.front().size());
    } else {
      for (size_t i = 0; i < prompts.size(); ++i) {
        g.seed = seed + i;
        g.max_new_tokens = max_length - static_cast<int64_t>(prompts[i].size());
        out.push_back(std::move(generate(m, {prompts[i]}, g).front().tokens));
      }
      return out;
    }
  }
  for (size_t a = 0; a < prompts.size(); a += k_prompts_per_batch) {
    const size_t b = std::min(prompts.size(), a + k_prompts_per_batch);
    g.seed = seed + a;
    for (auto& r : generate(m, {prompts.begin() + a, prompts.begin() + b}, g)) out.push_back(std::move(r.tokens));
  }
  return out;
}

// The prompts' texts: --prompt, or each line of --test_path (a final newline ends the last line; a '\r' before
// it is dropped). Throws std::invalid_argument naming the file when it cannot be read or holds no line.
std::vector<std::string> prompt_texts(const generate_opts& o) {
  if (o.test_path.empty()) return {o.prompt};
  const std::string path = resolve_user_path(o.test_path, "test_path").string();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::invalid_argument("--test_path " + path + " is a folder: give a text file, one prompt per line");
  std::ifstream f(path);
  if (!f) throw std::invalid_argument("--test_path " + path + " cannot be read: give a text file, one prompt per line");
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lines.empty() && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 byte order mark
    lines.push_back(std::move(line));
  }
  if (lines.empty()) throw std::invalid_argument("--test_path " + path + " holds no line: give one prompt per line");
  return lines;
}

// The prompts' token ids, each checked against the model's context `ctx` (`model`: its name in messages): an
// empty one without a BOS to start from and one that fills the context are refused, naming --prompt or the
// file's line; one whose answer would pass the context is warned about.
std::vector<std::vector<int32_t>> prompt_id_lists(const generate_opts& o, const std::vector<std::string>& texts,
                                                  const tokenizer& tok, const std::string& tok_path, int64_t ctx,
                                                  const std::string& model) {
  std::vector<std::vector<int32_t>> ids;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string where =
        o.test_path.empty() ? "--prompt" : fmt::format("--test_path {} line {}", o.test_path, i + 1);
    ids.push_back(prompt_ids(tok, texts[i]));
    const auto n = static_cast<int64_t>(ids.back().size());
    if (n == 0)  // a tokenizer without BOS (Qwen2's) has nothing to start from
      throw std::invalid_argument(where + " is empty and the tokenizer " + tok_path +
                                  " has no BOS token to start from: give a prompt");
    if (n >= ctx)
      throw std::invalid_argument(fmt::format("{} is {} tokens, which fill {}'s context of {} tokens: shorten it", where,
                                              n, model, ctx));
    if (o.max_length > 0 && n >= o.max_length)  // transformers' generate() refuses it too
      throw std::invalid_argument(fmt::format("{} is {} tokens, which fill max_length = {} (prompt + new tokens) of {}: "
                                              "give --max_new_tokens, or raise max_length there",
                                              where, n, o.max_length, o.max_length_from));
    const int64_t new_tokens = o.max_length > 0 ? o.max_length - n : o.max_new_tokens;
    if (n + new_tokens > ctx)  // said, as chat refuses it
      spdlog::warn("{}: {} prompt tokens ({}) + {} new ones pass {}'s context of {} tokens; generation stops at the "
                   "context, after at most {} new tokens",
                   o.max_length > 0 ? fmt::format("max_length = {} (prompt + new tokens) of {}", o.max_length,
                                                  o.max_length_from)
                   : o.max_new_tokens_from.empty() ? fmt::format("--max_new_tokens {}", o.max_new_tokens)
                                                   : fmt::format("max_new_tokens = {} of {}", o.max_new_tokens,
                                                                 o.max_new_tokens_from),
                   n, where, new_tokens, model, ctx, ctx - n);
  }
  return ids;
}

// The sampling settings of the command line.
generation_config generation_of(const generate_opts& o, const sampling_options& s, const tokenizer& tok) {
  generation_config g = s.config();
  g.max_new_tokens = o.max_new_tokens;
  // transformers warns of "unfeasible length constraints" too: the stop ids stay masked to the last token
  if (g.min_new_tokens > g.max_new_tokens)
    spdlog::warn("min_new_tokens {} (generation_config.json) is above max_new_tokens {}: every answer runs to "
                 "max_new_tokens, no stop id before it",
                 g.min_new_tokens, g.max_new_tokens);
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
std::vector<std::vector<int32_t>> generate_from_zero(const loaded_checkpoint& ck, int world, bool world_given,
                                                     const std::string& base_given,
                                                     const std::vector<std::string>& texts, const generate_opts& o,
                                                     const generation_config& g, const tokenizer& tok,
                                                     const std::string& tok_path,
                                                     std::vector<std::vector<int32_t>>& prompts) {
  const std::string& folder = ck.folder;
  const auto& extra = ck.manifests.at(0).extra;
  const bool whole = ck.full.count("base") > 0;
  if (whole && !base_given.empty())  // it generated from the checkpoint without a word
    throw std::invalid_argument(folder + " holds the whole model, not a LoRA adapter on a base: drop --model " +
                                base_given + " (it names the base of a LoRA run's checkpoint)");
  // (zero_checkpoint_model also says why a checkpoint is no model here: no recorded model, a value head)
  if (!whole || !extra.contains("model_config") || extra.contains("lora_config") || extra.value("value_head", false)) {
    decoder model = zero_checkpoint_model(ck, base_given, "--model");
    if (world_given && world > 1)  // it was dropped without a word (zero_checkpoint_model refuses the others)
      spdlog::warn("--world_size {} is not used: {} holds a LoRA adapter, so it generates from the model merged in "
                   "this process, on one rank",
                   world, folder);
    check_tokenizer_fits(tok, tok_path, model, folder);
    prompts = prompt_id_lists(o, texts, tok, tok_path, model.config().max_seq_len, folder);
    return generate_batches(model, prompts, g, o.max_length);
  }
  const model_config cfg = extra.at("model_config").get<model_config>();
  check_tokenizer_fits(tok, tok_path, cfg.vocab_size, folder);
  prompts = prompt_id_lists(o, texts, tok, tok_path, cfg.max_seq_len, folder);
  auto group = comm::make_inproc_group(world);
  std::vector<std::vector<std::vector<int32_t>>> out(world);
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
        out[r] = generate_batches(m, prompts, g, o.max_length);
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
  size_t tokens = 0;
  for (const auto& t : out[0]) tokens += t.size();
  spdlog::info("generated from {} over {} ZeRO-3 ranks (step {}): {} tokens, {:.2f} MB all-gathered per rank",
               folder, world, ck.step, tokens, bytes[0] / 1e6);
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
  auto* prompt_opt =
      sub->add_option("--prompt", o->prompt, "Prompt text (empty: start from BOS, for a tokenizer that has one)");
  sub->add_option("--test_path", o->test_path,
                  "A text file of prompts, one per line (TencentPretrain's generate_lm): each answered, in batches of "
                  "16, line i sampling with --seed + i (as --prompt alone with that seed)")
      ->excludes(prompt_opt);
  sub->add_option("--prediction_path", o->prediction_path,
                  "Write each prompt and its continuation here, each followed by an empty line (TencentPretrain's; "
                  "default: standard output)");
  auto sampling = std::make_shared<sampling_options>(
      *sub, o->sampling,
      "0 = greedy (default: the model folder's generation_config.json; an HF folder decodes greedily unless it says "
      "do_sample, as transformers does; else 1)",
      /*beams=*/true);
  graph::node_kind_registry declared;  // --max_new_tokens is checked as the generator's setting
  graph::register_example_kinds(declared);
  const graph::node_kind& gen = *declared.lookup("generator");
  auto* max_opt = sub->add_option("--max_new_tokens", o->max_new_tokens,
                                  "Tokens to generate at most (default: an HF folder's generation_config.json "
                                  "max_new_tokens, else its max_length minus the prompt's tokens, else 256)")
                       ->capture_default_str()
                       ->check(setting_check(*gen.find_setting("max_new_tokens"), gen.name));
  sub->add_option("--zero_checkpoint", o->zero_checkpoint,
                  "Generate from a ZeRO checkpoint folder (zero_rank's output_dir or a step folder), sharded over "
                  "--world_size ranks that gather each layer as it runs (instead of --model). A LoRA run's "
                  "checkpoint: its base model (the run's `model`, or --model when it moved) with the adapter merged");
  auto* world_opt = sub->add_option("--world_size", o->world_size, "Ranks for --zero_checkpoint (threads of this process)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  sub->add_option("--lora", o->lora,
                  "A LoRA adapter folder (PEFT's adapter_config.json + adapter_model.safetensors: zero_rank's "
                  "save_lora, a trainer's LoRA output) applied on top of --model, merged before generating");
  sub->callback([o, tok_opt, model_opt, max_opt, world_opt, sampling] {
    if (!o->zero_checkpoint.empty() && !o->lora.empty())
      throw std::invalid_argument("--lora goes with --model (the base model), not --zero_checkpoint");
    // the sampling defaults of the model folder `model`, for the options not given (sampling_options::take_defaults)
    const auto take_defaults = [&](const std::string& model) {
      if (const std::string took = sampling->take_defaults(model); !took.empty()) spdlog::info("sampling: {}", took);
      // the file's max_new_tokens, as transformers' generate() takes it (a folder whose file said 2 generated to the
      // context here), else its max_length (prompt + new tokens; it was not read)
      if (max_opt->count() == 0) {
        const auto lengths = generation_config_lengths(model);
        const std::string file = model + "/generation_config.json";
        if (lengths.max_new_tokens > 0) {
          o->max_new_tokens = lengths.max_new_tokens;
          o->max_new_tokens_from = file;
          spdlog::info("max_new_tokens {} ({}; --max_new_tokens wins)", lengths.max_new_tokens, file);
        } else if (lengths.max_length > 0) {
          o->max_length = lengths.max_length;
          o->max_length_from = file;
          spdlog::info("max_length {}: prompt + new tokens, as transformers' generate() takes it without "
                       "max_new_tokens ({}; --max_new_tokens wins)",
                       lengths.max_length, file);
        }
      }
      sampling->refuse_filters_when_greedy();
      sampling->check_beams();
    };
    const std::vector<std::string> texts = prompt_texts(*o);
    // line i samples with --seed + i, which --seed alone must be able to say (it takes at most 2^32 - 1)
    if (const int64_t last = o->sampling->seed + static_cast<int64_t>(texts.size()) - 1; last > 4294967295LL)
      throw std::invalid_argument(fmt::format("--seed {} with {} prompts: line {} would sample with seed {}, past "
                                              "the largest --seed (4294967295); give --seed at most {}",
                                              o->sampling->seed, texts.size(), texts.size(), last,
                                              4294967295LL - static_cast<int64_t>(texts.size()) + 1));
    if (!o->prediction_path.empty()) {  // refused before the model loads, not after the work
      namespace fs = std::filesystem;
      std::error_code ec;
      const fs::path out = fs::absolute(o->prediction_path);
      if (!o->test_path.empty() &&
          fs::weakly_canonical(out, ec) == fs::weakly_canonical(resolve_user_path(o->test_path, "test_path"), ec))
        throw std::invalid_argument("--prediction_path " + o->prediction_path +
                                    " is the --test_path file: the prompts would be overwritten; write elsewhere");
      if (fs::is_directory(out, ec))
        throw std::invalid_argument("--prediction_path " + o->prediction_path +
                                    " is a folder: give a file to write, e.g. " + (out / "predictions.txt").string());
      if (!fs::is_directory(out.parent_path(), ec))
        throw std::invalid_argument("--prediction_path " + o->prediction_path + ": its folder " +
                                    out.parent_path().string() + " does not exist: create it or write elsewhere");
    }
    // each prompt as given and its continuation: one on standard output as before; with --test_path or
    // --prediction_path each followed by an empty line, the file written whole (atomically) at the end
    const auto print_texts = [&](const tokenizer& tok, const std::vector<std::vector<int32_t>>& prompts,
                                 const std::vector<std::vector<int32_t>>& gen) {
      std::string text;
      for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<int32_t> all = prompts[i];
        all.insert(all.end(), gen[i].begin(), gen[i].end());
        text += shown_text(tok, texts[i], prompts[i], all) + (o->test_path.empty() && o->prediction_path.empty() ? "\n" : "\n\n");
      }
      if (o->prediction_path.empty()) {
        std::cout << text << std::flush;
        return;
      }
      write_text_atomic(o->prediction_path, text);
      spdlog::info("{} prompts and their continuations written to {}", prompts.size(), o->prediction_path);
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
      sampling->refuse_filters_when_greedy();  // also where the base is no folder
      sampling->check_beams();
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
      std::vector<std::vector<int32_t>> prompts;
      auto gen = generate_from_zero(ck, o->world_size, world_opt->count() > 0,
                                    model_opt->count() > 0 ? o->model : "", texts, *o,
                                    generation_of(*o, *sampling, *tok), *tok, tok_path, prompts);
      print_texts(*tok, prompts, gen);
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
    // a padded vocabulary (Qwen2.5's, OPT's): rows no token id of the tokenizer names are never sampled, where
    // transformers' generate() may pick one (models/config.h vocab_limit)
    if (const auto& mc = model.config(); mc.vocab_limit() < mc.vocab_size)
      spdlog::info("the model's {} output rows past the tokenizer's {} tokens are never generated (transformers' "
                   "generate() may pick them: they decode to nothing)",
                   mc.vocab_size - mc.vocab_limit(), mc.vocab_limit());
    const auto prompts = prompt_id_lists(*o, texts, *tok, tok_path, model.config().max_seq_len, o->model);
    print_texts(*tok, prompts, generate_batches(model, prompts, generation_of(*o, *sampling, *tok), o->max_length));
  });
}

}  // namespace flowrun::cli
