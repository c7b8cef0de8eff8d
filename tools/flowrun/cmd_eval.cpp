// DeepSpeed-Chat's tools: `flowrun eval prompts` (prompt_eval.py: baseline and
// fine-tuned answers side by side), `flowrun eval reward` (rw_eval.py: accuracy
// and scores on held-out pairs) and `flowrun chat` (chat.py: a multi-turn
// Human:/Assistant: conversation). Both eval tools show a progress line on a terminal
// (tools/flowrun/progress_line.h) and take `--apply_chat_template` as the trainers do.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "models/chat_format.h"
#include "models/checkpoint.h"
#include "models/rlhf/dschat_data.h"
#include "models/rlhf/dschat_steps.h"
#include "models/generate.h"
#include "models/tokenizer.h"
#include "runtime/kernels/ops.h"
#include "runtime/util/assets.h"
#include "tools/flowrun/commands.h"
#include "tools/flowrun/model_tokenizer.h"
#include "tools/flowrun/progress_line.h"
#include "tools/flowrun/sampling_options.h"

namespace flowrun::cli {

namespace {

struct eval_opts {
  std::string baseline = "model/stories260K/stories260K.bin";
  std::string finetuned = "out/rlhf/ppo_actor.bin";
  std::string model = "out/rlhf/reward_model";
  std::string tokenizer = "model/stories260K/tok512.model";
  std::string data = "data/hh-rlhf/harmless-base-test.dschat.jsonl";
  std::string data_split = "2,4,4";
  double eval_fraction = 0.1;
  int64_t seed = 1234;
  int64_t n = 5;
  int64_t max_prompt_seq_len = 48;
  int64_t max_new_tokens = 48;
  int64_t num_beams = 1;  ///< eval prompts: DS-Chat prompt_eval.py's --num_beams (1: greedy, its default search)
  int64_t max_seq_len = 96;
  int64_t step = 3;
  bool apply_chat_template = false;
  std::string dtype = "fp32";  ///< eval reward: the products' precision (the training's, from flowrun_data.json)
  std::string truncation = "prompt_start";  ///< eval reward: rm_trainer's truncation (the training's, from flowrun_data.json)
};

// --apply_chat_template: the trainers' rule (chat_formatter_for_tokenizer) on --tokenizer, into the
// tokenization of the held-out rows (dschat::tokenize_settings::chat); null without it.
std::shared_ptr<const chat_formatter> chat_option(const eval_opts& o) {
  if (!o.apply_chat_template) return nullptr;
  auto f = chat_formatter_for_tokenizer(resolve_user_path(o.tokenizer, "tokenizer").string(), "flowrun eval",
                                        "--apply_chat_template", "--tokenizer", "drop --apply_chat_template");
  spdlog::info("rows rendered with the chat template of {}", f->chat_template_of_model().tmpl.name());
  return f;
}

// With a chat template, what the first held-out row becomes (dschat::rendered_row_line), on standard output.
void print_rendered_row(const eval_opts& o, const dschat::step_rows& rows, const dschat::tokenize_settings& ts,
                        bool prompt_only) {
  if (!ts.chat || rows.eval.empty()) return;
  std::cout << dschat::rendered_row_line("[flowrun eval]", rows.eval.front(), rows.eval_refs.front(),
                                         resolve_user_path(o.data, "data").string(), ts, prompt_only)
            << "\n";
}

// The held-out rows of one DS-Chat step (the same split the training graphs use).
dschat::step_rows held_out(const eval_opts& o, int step_index) {
  const auto parts = dschat::parse_data_split(o.data_split);
  if (parts.size() != 3)
    throw std::invalid_argument("--data_split \"" + o.data_split + "\" must have 3 parts, one per DS-Chat step");
  if (parts[static_cast<size_t>(step_index)] <= 0)
    throw std::invalid_argument(fmt::format("--data_split \"{}\" gives step {} no share of the data, so it has no "
                                            "held-out rows: give the split the training used",
                                            o.data_split, step_index + 1));
  auto src = dschat::load_sources({resolve_user_path(o.data, "data").string()});
  for (const auto& s : src)  // as the trainers say it: lines dropped as malformed are held out of the figures too
    if (!s.report.malformed.empty()) spdlog::warn("{}", s.report.summary());
  dschat::split_settings sp;
  sp.data_split = o.data_split;
  sp.seed = static_cast<uint64_t>(o.seed);
  sp.eval_fraction = o.eval_fraction;
  return dschat::rows_for_step(src, step_index, sp);
}

std::string tail(const std::string& s, size_t n) { return s.size() <= n ? s : "..." + s.substr(s.size() - n); }

// A model that generates: refuses a reward/value model (v_head, no LM head) by name.
decoder load_policy(const std::string& path) {
  auto m = load_model(path);
  if (m.has_value_head())
    throw std::invalid_argument(path + " is a reward/value model (a value head: DS-Chat's v_head or a ForSequenceClassification's score; no LM head): give a policy model");
  return m;
}

// prompt_eval.py's default search
generation_config greedy() {
  generation_config g;
  g.sampling.temperature = 0.0f;
  return g;
}

// `stops`: stop_ids_for the model's path (flowrun generate's): an HF folder's eos_token_id list
std::string answer(decoder& m, const tokenizer& tok, const std::vector<int32_t>& prompt, int64_t max_new,
                   const std::vector<int32_t>& stops, generation_config g = greedy()) {
  g.max_new_tokens = max_new;
  g.stop_ids = stops;
  auto r = generate(m, {prompt}, g);
  return tok.decode(r[0].tokens);
}

}  // namespace

// A default model path (the shipped graphs' outputs, out/rlhf/...) that the working directory lacks: the
// repository's, where `flowrun train` and the graphs it finds there write them (cmd_run.cpp's rule for
// graphs/); train run from another folder wrote /repo/out/rlhf and eval looked for ./out/rlhf, then
// pointed at FLOWRUN_ASSETS. A path given on the command line is never replaced.
void default_from_repository(std::string& path, const CLI::Option* given, const char* option) {
  if (given->count() > 0) return;
  try {  // here or under FLOWRUN_ASSETS, as every relative path is found
    resolve_user_path(path, "model");
    return;
  } catch (const std::exception&) {
  }
  std::error_code ec;
  const auto repo = std::filesystem::path(FLOWRUN_SOURCE_DIR) / path;
  if (!std::filesystem::exists(repo, ec)) return;
  spdlog::info("{}: {} (the shipped graphs' output in the repository; give {} for another)", option, repo.string(),
               option);
  path = repo.string();
}

void add_eval(CLI::App& app) {
  auto* ev = app.add_subcommand("eval", "DS-Chat's evaluation tools: prompts (baseline vs fine-tuned), reward");
  ev->require_subcommand(1);

  auto o = std::make_shared<eval_opts>();
  auto* pr = ev->add_subcommand("prompts", "Answers of a baseline and a fine-tuned model, side by side, on held-out prompts");
  pr->add_option("--baseline", o->baseline, "baseline model (llama2.c .bin, flowrun folder or HF folder)")->capture_default_str();
  auto* pr_tuned = pr->add_option("--finetuned", o->finetuned,
                                  "fine-tuned model (the default: here, else under the repository, where flowrun "
                                  "train writes it)")
                       ->capture_default_str();
  auto* pr_tok = pr->add_option("--tokenizer", o->tokenizer,
                                "SentencePiece .model, GPT-2 vocab.json or an HF model folder; default: the "
                                "fine-tuned (else the baseline) model folder's own tokenizer, else this")
                    ->capture_default_str();
  pr->add_option("--data", o->data, "DS-Chat JSONL")->capture_default_str();
  pr->add_option("--data_split", o->data_split, "as in training")->capture_default_str();
  pr->add_option("--seed", o->seed, "as in training")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{4294967295}));
  pr->add_option("--n", o->n, "prompts to show")->capture_default_str();
  pr->add_option("--max_prompt_seq_len", o->max_prompt_seq_len, "prompt tokens kept (the end)")->capture_default_str();
  pr->add_option("--max_new_tokens", o->max_new_tokens, "answer tokens at most")->capture_default_str();
  pr->add_option("--num_beams", o->num_beams,
                 "beam search over this many beams (prompt_eval.py's --num_beams, transformers' beam search); 1: "
                 "greedy, its default")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{64}));
  pr->add_flag("--apply_chat_template", o->apply_chat_template,
               "render the prompts with the chat template of the --tokenizer HF folder, as prompt_loader's "
               "apply_chat_template does");
  pr->callback([o, pr_tok, pr_tuned] {
    default_from_repository(o->finetuned, pr_tuned, "--finetuned");
    if (pr_tok->count() == 0) {  // each model's own: one tokenization serves both, so they must agree
      const std::string t_tuned = tokenizer_for({o->finetuned}, o->tokenizer, false);
      const std::string t_base = tokenizer_for({o->baseline}, o->tokenizer, false);
      if (t_tuned != t_base) {
        const std::string why = tokenizer_difference(*load_tokenizer(resolve_user_path(t_base, "tokenizer").string()),
                                                     *load_tokenizer(resolve_user_path(t_tuned, "tokenizer").string()));
        if (!why.empty())
          throw std::invalid_argument(fmt::format(
              "the baseline {} reads text with the tokenizer {} and the fine-tuned {} with {}: they differ ({}); "
              "eval prompts answers both from one tokenization of the prompts: compare models of one tokenizer",
              o->baseline, t_base, o->finetuned, t_tuned, why));
      }
      o->tokenizer = t_tuned;
    }
    auto tok = load_tokenizer(resolve_user_path(o->tokenizer, "tokenizer").string());
    if (o->max_new_tokens < 0) throw std::invalid_argument("--max_new_tokens must be >= 0");
    if (o->n < 1) throw std::invalid_argument("--n must be >= 1");
    if (o->max_prompt_seq_len < 1) throw std::invalid_argument("--max_prompt_seq_len must be >= 1");
    auto chat = chat_option(*o);  // before the models: a refused template costs no load
    auto base = load_policy(o->baseline);
    auto tuned = load_policy(o->finetuned);
    check_tokenizer_fits(*tok, o->tokenizer, base, o->baseline);
    check_tokenizer_fits(*tok, o->tokenizer, tuned, o->finetuned);
    for (const auto* m : {&o->baseline, &o->finetuned}) {  // before any answer: a long prompt failed mid-way
      const int64_t ctx_len = (m == &o->baseline ? base : tuned).config().max_seq_len;
      if (o->max_prompt_seq_len + o->max_new_tokens > ctx_len)
        throw std::invalid_argument(fmt::format(
            "--max_prompt_seq_len {} + --max_new_tokens {} = {} tokens do not fit {}'s context of {}: lower either",
            o->max_prompt_seq_len, o->max_new_tokens, o->max_prompt_seq_len + o->max_new_tokens, *m, ctx_len));
    }
    auto rows = held_out(*o, 2);
    dschat::tokenize_settings ts;
    ts.max_prompt_seq_len = o->max_prompt_seq_len;
    ts.overflow = dschat::prompt_overflow::keep_end;
    ts.chat = chat;
    auto prompts = dschat::make_prompt_examples(rows.eval, *tok, ts);
    const int64_t n = std::min<int64_t>(o->n, static_cast<int64_t>(prompts.size()));
    if (n == 0)
      throw std::invalid_argument("no held-out prompt to answer (" + rows.summary +
                                  "): give --data more rows, or the --data_split and --seed the training used");
    if (n < o->n)  // --n 1000 showed the 92 there are without a word
      spdlog::info("--n {}: the held-out share holds {} prompts, all shown", o->n, n);
    std::cout << fmt::format("{} held-out prompts of DS-Chat step 3 ({}); {} answers, at most {} tokens\n", n,
                             rows.summary,
                             o->num_beams > 1 ? fmt::format("beam search ({} beams)", o->num_beams) : "greedy",
                             o->max_new_tokens);
    print_rendered_row(*o, rows, ts, /*prompt_only=*/true);
    progress_line line("flowrun eval", "eval prompts");  // prompts answered by both models, of n
    line.update(0, n);
    const auto base_stops = stop_ids_for(o->baseline, tok->bos_id(), tok->eos_id());
    const auto tuned_stops = stop_ids_for(o->finetuned, tok->bos_id(), tok->eos_id());
    // each folder's token masks (min_new_tokens, suppress_tokens, ...), which transformers' generate() applies beside
    // prompt_eval.py's own greedy or beam arguments (they were not read)
    generation_config g_base = greedy(), g_tuned = greedy();
    g_base.num_beams = g_tuned.num_beams = o->num_beams;
    for (auto [path, g] : {std::pair{&o->baseline, &g_base}, std::pair{&o->finetuned, &g_tuned}})
      if (const std::string took = take_generation_masks(*path, *g); !took.empty())
        spdlog::info("{}: {}", *path, took);
    for (int64_t i = 0; i < n; ++i) {
      const std::string a_base = answer(base, *tok, prompts[i].ids, o->max_new_tokens, base_stops, g_base);
      const std::string a_tuned = answer(tuned, *tok, prompts[i].ids, o->max_new_tokens, tuned_stops, g_tuned);
      line.clear();
      // with a chat template the rendered prompt (its special tokens, <|im_end|> too, which decoding drops as EOS),
      // unless max_prompt_seq_len cut it: then the tokens the models were given
      const bool rendered = ts.chat && prompts.size() == rows.eval.size() && !prompts[i].truncated;
      std::cout << fmt::format("\n==================== prompt {} ====================\n{}\n", i + 1,
                               tail(rendered ? dschat::prompt_text(rows.eval[static_cast<size_t>(i)], ts)
                                             : tok->decode(prompts[i].ids),
                                    300));
      std::cout << "---------- baseline (" << o->baseline << ") ----------\n" << a_base << "\n";
      std::cout << "---------- fine-tuned (" << o->finetuned << ") ----------\n" << a_tuned << std::endl;
      line.update(i + 1, n);
    }
    line.clear();
    spdlog::info("[flowrun eval] {} prompts answered by both models in {:.1f} s", n, line.seconds());
  });

  auto r = std::make_shared<eval_opts>();
  r->eval_fraction = 0.1;  // rm.graph's (the default of every step: one held-out share, disjoint steps)
  r->step = 2;
  auto* rw = ev->add_subcommand("reward", "Reward model accuracy and scores on held-out chosen/rejected pairs");
  auto* rw_model = rw->add_option("--model", r->model,
                                  "reward model folder (written by rm_trainer's output; the default: here, else "
                                  "under the repository)")
                       ->capture_default_str();
  auto* rw_tok = rw->add_option("--tokenizer", r->tokenizer,
                                "SentencePiece .model, GPT-2 vocab.json or an HF model folder; default: the "
                                "model folder's own tokenizer, else this")
                    ->capture_default_str();
  // the split options default to what the model folder's flowrun_data.json recorded at training
  const char* recorded = "; default: the training's, from the model folder's flowrun_data.json, else this";
  auto* rw_data = rw->add_option("--data", r->data, std::string("DS-Chat JSONL") + recorded)->capture_default_str();
  auto* rw_split = rw->add_option("--data_split", r->data_split, std::string("as in training") + recorded)
                       ->capture_default_str();
  auto* rw_frac = rw->add_option("--eval_fraction", r->eval_fraction, std::string("as in training") + recorded)
                      ->capture_default_str()
                      ->check(CLI::Validator(  // the trainers' range: the message named an internal function
                          [](std::string& v) {
                            double x = -1;
                            try {
                              x = std::stod(v);
                            } catch (const std::exception&) {
                            }
                            return x >= 0 && x < 1 ? std::string()
                                                   : "must be in [0, 1), the held-out share of the data, got " + v;
                          },
                          "[0, 1)"));
  auto* rw_seed = rw->add_option("--seed", r->seed, std::string("as in training") + recorded)
                      ->capture_default_str()
                      ->check(CLI::Range(std::int64_t{0}, std::int64_t{4294967295}));
  auto* rw_len = rw->add_option("--max_seq_len", r->max_seq_len, std::string("as in training") + recorded)
                     ->capture_default_str();
  rw->add_option("--step", r->step, "whose held-out share to use (2: the RM's own)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3));
  auto* rw_dtype = rw->add_option("--dtype", r->dtype,
                                  std::string("fp32, bf16 or fp16: bf16 multiplies in bf16 where the CPU has "
                                              "AVX512_BF16 or AMX, as rm_trainer's held-out pass in bf16 (fp16 "
                                              "computes in fp32, as it does)") +
                                      recorded)
                      ->capture_default_str()
                      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  auto* rw_trunc = rw->add_option("--truncation", r->truncation,
                                  std::string("end (DS-Chat's) or prompt_start, how a pair past --max_seq_len is cut, "
                                              "as rm_trainer's truncation") +
                                      recorded)
                      ->capture_default_str()
                      ->check(CLI::IsMember({"end", "prompt_start"}));
  rw->add_flag("--apply_chat_template", r->apply_chat_template,
               "render the pairs with the chat template of the --tokenizer HF folder, as rm_trainer's "
               "apply_chat_template does");
  rw->callback([r, rw_model, rw_tok, rw_data, rw_split, rw_frac, rw_seed, rw_len, rw_dtype, rw_trunc] {
    default_from_repository(r->model, rw_model, "--model");
    r->tokenizer = tokenizer_for({r->model}, r->tokenizer, rw_tok->count() > 0);
    const auto rec = std::filesystem::path(resolve_user_path(r->model, "model")) / "flowrun_data.json";
    if (std::filesystem::is_regular_file(rec)) {  // rm_trainer's split: its held-out rows, not others
      std::ifstream f(rec);
      const auto j = nlohmann::json::parse(f);
      if (!j.value("mix_data", nlohmann::json::array()).empty())
        spdlog::warn("{}: the model trained on mix_data too; eval reward reads --data only", rec.string());
      if (rw_data->count() == 0) r->data = j.value("data", r->data);
      if (rw_split->count() == 0) r->data_split = j.value("data_split", r->data_split);
      if (rw_frac->count() == 0) r->eval_fraction = j.value("eval_fraction", r->eval_fraction);
      if (rw_seed->count() == 0) r->seed = j.value("seed", r->seed);
      if (rw_len->count() == 0) r->max_seq_len = j.value("max_seq_len", r->max_seq_len);
      if (rw_dtype->count() == 0) r->dtype = j.value("dtype", r->dtype);
      // the trainer rendered the pairs with the chat template: so are they scored (a flag cannot be unset: the
      // record wins where the model trained with it)
      if (!r->apply_chat_template && j.value("apply_chat_template", false)) {
        r->apply_chat_template = true;
        spdlog::info("--apply_chat_template: the model trained with apply_chat_template = true ({})", rec.string());
      }
      // a folder written before the truncation was recorded holds "" or nothing: the default stays
      if (const std::string t = j.value("truncation", std::string()); rw_trunc->count() == 0 && !t.empty()) {
        if (t != "end" && t != "prompt_start")
          throw std::invalid_argument(rec.string() + ": truncation = \"" + t +
                                      "\" is neither \"end\" nor \"prompt_start\": fix it, or give --truncation");
        r->truncation = t;
      }
      // a folder trained before the split took DS-Chat's row order holds out other rows than these
      if (j.value("data_split_order", std::string()) != dschat::split_order)
        spdlog::warn("{} was written before the data split took DS-Chat's row order (flowrun 2026-12-05): the "
                     "pairs held out now are not the ones the model held out, and may include pairs it trained "
                     "on; train it again for a clean held-out figure",
                     rec.string());
      // the tokenizer it trained with (a flowrun folder holds none of its own)
      if (const std::string t = j.value("tokenizer", std::string()); !t.empty() && std::filesystem::exists(t)) {
        if (rw_tok->count() == 0 && !folder_has_tokenizer(rec.parent_path().string())) {
          r->tokenizer = t;
          spdlog::info("tokenizer: {} (the one the model trained with, from {})", t, rec.string());
        } else if (const std::string why = tokenizer_difference(*load_tokenizer(t), *load_tokenizer(
                       resolve_user_path(r->tokenizer, "tokenizer").string()));
                   !why.empty()) {
          spdlog::warn("the tokenizer {} is not the one the model trained with, {} ({}): its scores read other ids",
                       r->tokenizer, t, why);
        }
      }
      spdlog::info("held-out split: data {}, data_split {}, eval_fraction {}, seed {}, max_seq_len {}, truncation {}, "
                   "dtype {} ({} recorded the training's; options given win)",
                   r->data, r->data_split, r->eval_fraction, r->seed, r->max_seq_len, r->truncation, r->dtype,
                   rec.string());
    } else {  // said, so that a user sees which pairs and cuts the figures are of
      spdlog::info("held-out split: data {}, data_split {}, eval_fraction {}, seed {}, max_seq_len {}, truncation {}, "
                   "dtype {} (no {}: the options' values; give the training's where they differ)",
                   r->data, r->data_split, r->eval_fraction, r->seed, r->max_seq_len, r->truncation, r->dtype,
                   rec.string());
    }
    auto tok = load_tokenizer(resolve_user_path(r->tokenizer, "tokenizer").string());
    auto chat = chat_option(*r);
    auto m = load_model(r->model);
    if (!m.has_value_head())
      throw std::runtime_error(r->model + " has no value head: give a reward model (rm_trainer's output folder)");
    check_tokenizer_fits(*tok, r->tokenizer, m, r->model);
    if (r->max_seq_len > m.config().max_seq_len)
      throw std::invalid_argument(fmt::format("--max_seq_len {} exceeds the model's {} positions ({}): give at most {}",
                                              r->max_seq_len, m.config().max_seq_len, r->model,
                                              m.config().max_seq_len));
    auto rows = held_out(*r, static_cast<int>(r->step) - 1);
    dschat::tokenize_settings ts;
    ts.max_seq_len = r->max_seq_len;
    ts.truncation = r->truncation == "end" ? dschat::truncation_mode::end : dschat::truncation_mode::prompt_start;
    ts.chat = chat;
    print_rendered_row(*r, rows, ts, /*prompt_only=*/false);
    dschat::process_report rep;
    auto ex = dschat::make_rm_examples(rows.eval, *tok, ts, &rep);
    if (ex.empty())
      throw std::invalid_argument("no held-out pair to score (" + rows.summary +
                                  "): raise --eval_fraction, or give --data more rows");
    // pairs whose answers tokenize alike score alike: counted as wrong (a tie), they read as a model that
    // prefers nothing (--max_seq_len 4 gave "accuracy 0.000, loss 0.6931" without a word)
    if (rep.identical > 0)
      spdlog::warn("{} of the {} held-out pairs have chosen equal to rejected after tokenization (max_seq_len {}): "
                   "they score alike and count as wrong{}",
                   rep.identical, ex.size(), r->max_seq_len,
                   rep.identical == static_cast<int64_t>(ex.size()) ? ": the accuracy below says nothing of the model (raise --max_seq_len if their answers differ past it)"
                                                                  : "");
    if (rep.truncated > 0)  // the trainers say how many they cut; so does the evaluation of their model
      spdlog::info("{} of the {} held-out pairs were cut to max_seq_len {} (truncation {}{})", rep.truncated,
                   ex.size(), r->max_seq_len, r->truncation,
                   rep.prompt_lost > 0 ? fmt::format("; {} kept no prompt token", rep.prompt_lost) : "");
    std::vector<dschat::rm_batch_data> batches;
    for (auto& b : dschat::epoch_batches(static_cast<int64_t>(ex.size()), 16, 0, 0, false))
      batches.push_back(dschat::rm_batch(ex, b));
    progress_line line("flowrun eval", "eval reward");  // batches of 16 pairs scored
    // rm_trainer's held-out pass: the fp32 weights it saved, its products in bf16 in a bf16 step
    ops::matmul_precision_scope gemm(r->dtype == "bf16" ? ops::matmul_precision::bf16 : ops::matmul_precision::f32);
    auto e = dschat::rm_eval(m, batches, [&line](int64_t done, int64_t total) { line.update(done, total); });
    line.clear();
    spdlog::info("[flowrun eval] {} batches of held-out pairs scored in {:.1f} s", batches.size(), line.seconds());
    std::cout << fmt::format("{}\nheld-out pairs {}: accuracy {:.3f} ± {:.3f} (stderr), mean chosen score {:.4f}, "
                             "mean rejected score {:.4f}, loss {:.4f}\n",
                             rows.summary, e.pairs, e.accuracy, e.accuracy_stderr, e.chosen_mean, e.rejected_mean,
                             e.loss);
  });
}

void add_chat(CLI::App& app) {
  auto o = std::make_shared<eval_opts>();
  o->max_new_tokens = 64;
  auto* ch = app.add_subcommand("chat",
                                "Interactive multi-turn chat (DS-Chat's Human:/Assistant: turns, or the model's chat "
                                "template with --apply_chat_template); 'clear' resets, 'quit' ends");
  auto* ch_model = ch->add_option("--model", o->finetuned,
                                  "model (llama2.c .bin, flowrun folder or HF folder; the default: here, else "
                                  "under the repository)")
                       ->capture_default_str();
  auto* ch_tok = ch->add_option("--tokenizer", o->tokenizer,
                                "SentencePiece .model, GPT-2 vocab.json or an HF model folder; default: the "
                                "model folder's own tokenizer, else this")
                    ->capture_default_str();
  ch->add_option("--max_new_tokens", o->max_new_tokens, "answer tokens at most")->capture_default_str();
  auto chat_sampling = std::make_shared<sampling_opts>();
  chat_sampling->temperature = 0.0f;  // DS-Chat's chat.py: greedy
  auto sampling = std::make_shared<sampling_options>(
      *ch, chat_sampling,
      "0 = greedy, as DS-Chat's chat.py (default: an HF folder's generation_config.json decides, as transformers' "
      "pipeline does: greedy unless it says do_sample; else 0); > 0 samples each reply, TRL chat's --do_sample");
  ch->add_flag("--apply_chat_template", o->apply_chat_template,
               "render the conversation with the tokenizer folder's chat template (tokenizer_config.json's "
               "chat_template, as transformers' apply_chat_template with add_generation_prompt; TRL's chat does) "
               "instead of DS-Chat's \"\\n\\nHuman: ...\\n\\nAssistant:\"; for a model trained with "
               "apply_chat_template = true");
  ch->callback([o, ch_model, ch_tok, sampling, chat_sampling] {
    default_from_repository(o->finetuned, ch_model, "--model");
    o->tokenizer = tokenizer_for({o->finetuned}, o->tokenizer, ch_tok->count() > 0);
    auto tok = load_tokenizer(resolve_user_path(o->tokenizer, "tokenizer").string());
    if (o->max_new_tokens < 1)  // 0 printed an empty reply to every message
      throw std::invalid_argument("--max_new_tokens must be >= 1 (a reply needs a token)");
    auto m = load_policy(o->finetuned);
    check_tokenizer_fits(*tok, o->tokenizer, m, o->finetuned);
    if (const std::string took = sampling->take_defaults(o->finetuned); !took.empty()) spdlog::info("sampling: {}", took);
    sampling->refuse_filters_when_greedy();  // chat decodes greedily by default
    const int64_t ctx_len = m.config().max_seq_len;
    if (o->max_new_tokens > ctx_len - 2)  // the conversation needs at least BOS and one token
      throw std::invalid_argument(fmt::format(
          "--max_new_tokens {} leaves no room for the conversation in {}'s context of {} tokens: use at most {}",
          o->max_new_tokens, o->finetuned, ctx_len, ctx_len - 2));
    const auto stops = stop_ids_for(o->finetuned, tok->bos_id(), tok->eos_id());
    // --apply_chat_template: the conversation as messages, rendered whole each turn (the template writes
    // BOS and the turn markers: its text is encoded without adding BOS, as apply_chat_template(tokenize=True))
    std::shared_ptr<const chat_formatter> tmpl;
    if (o->apply_chat_template)
      tmpl = chat_formatter_for_tokenizer(resolve_user_path(o->tokenizer, "tokenizer").string(), "flowrun chat",
                                          "--apply_chat_template", "--tokenizer", "drop --apply_chat_template");
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    std::string history;
    std::string line;
    int64_t turn = 0;
    std::cout << "Enter input (type 'quit' to exit, 'clear' to clean memory): " << std::flush;
    while (std::getline(std::cin, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();  // a CRLF terminal or file: "quit\r" was a message
      if (line == "quit") break;
      if (line.find_first_not_of(" \t\r") == std::string::npos) {  // nothing said: ask again
        std::cout << "Enter input (type 'quit' to exit, 'clear' to clean memory): " << std::flush;
        continue;
      }
      if (line == "clear") {  // a fresh conversation, sampled as one from the start (turn 0: --seed)
        history.clear();
        turn = 0;
        messages = nlohmann::ordered_json::array();
        std::cout << "Enter input (type 'quit' to exit, 'clear' to clean memory): " << std::flush;
        continue;
      }
      const int64_t room = ctx_len - o->max_new_tokens;  // >= 2: BOS and the last token at least
      std::vector<int32_t> ids;
      bool dropped = false;     // whole exchanges left out (the template's conversation)
      bool whole_cut = false;   // not even this message fits
      if (tmpl) {
        messages.push_back({{"role", "user"}, {"content", line}});
        ids = tok->encode(tmpl->prompt(messages), false);
        while (static_cast<int64_t>(ids.size()) > room && messages.size() > 1) {  // the oldest user + assistant pair
          messages.erase(messages.begin(), messages.begin() + std::min<std::ptrdiff_t>(2, messages.size() - 1));
          ids = tok->encode(tmpl->prompt(messages), false);
          dropped = true;
        }
        whole_cut = static_cast<int64_t>(ids.size()) > room;
      } else {
        history += "\n\nHuman: " + line + "\n\nAssistant:";
        ids = prompt_ids(*tok, history);
        whole_cut = static_cast<int64_t>(ids.size()) > room &&
                    static_cast<int64_t>(tok->encode("\n\nHuman: " + line + "\n\nAssistant:", false).size()) +
                            (tok->adds_bos() ? 1 : 0) >
                        room;
      }
      // said, not silent: the model no longer sees the start (and with a small room not even the whole of
      // this message)
      if (dropped || static_cast<int64_t>(ids.size()) > room)
        std::cerr << fmt::format("(the conversation is longer than the {} tokens the context of {} leaves beside "
                                 "--max_new_tokens {}: {}; 'clear' starts afresh)\n",
                                 room, ctx_len, o->max_new_tokens,
                                 whole_cut ? "not even this message fits, it is cut" : "its oldest turns are dropped");
      if (static_cast<int64_t>(ids.size()) > room) {  // BOS (the template's too) and the most recent tokens
        const bool bos = !ids.empty() && ids.front() == tok->bos_id();
        ids.erase(ids.begin() + (bos ? 1 : 0), ids.end() - (room - (bos ? 1 : 0)));
      }
      // sampling: turn k draws with seed + k, so a conversation replays from its seed and no two replies share draws
      generation_config g = sampling->config();
      g.seed += static_cast<uint64_t>(turn++);
      std::string reply = answer(m, *tok, ids, o->max_new_tokens, stops, g);
      // an answer ends where the model starts the next turn
      if (!tmpl)
        if (auto cut = reply.find("Human:"); cut != std::string::npos) reply = reply.substr(0, cut);
      while (!reply.empty() && (reply.back() == '\n' || reply.back() == ' ')) reply.pop_back();
      if (tmpl)
        messages.push_back({{"role", "assistant"}, {"content", reply}});
      else
        history += " " + reply;
      std::cout << "Assistant: " << reply << "\n\nEnter input (type 'quit' to exit, 'clear' to clean memory): "
                << std::flush;
    }
    std::cout << "\n";
  });
}

}  // namespace flowrun::cli
