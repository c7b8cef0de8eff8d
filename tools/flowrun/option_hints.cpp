#include "tools/flowrun/option_hints.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/graph/graph_spec.h"

namespace flowrun::cli {

namespace {
struct foreign_flag {
  std::set<std::string> commands;  // the commands whose options the hint names
  std::string hint;
};

// Other tools' flags for generate, chat and eval, and what they are here (transformers' generate(), DS-Chat's
// prompt_eval.py, rw_eval.py and chat.py, TRL's chat)
const std::map<std::string, foreign_flag>& foreign_flags() {
  static const std::set<std::string> decoding = {"generate", "chat", "eval"};
  static const std::map<std::string, foreign_flag> m = {
      {"do_sample", {{"generate", "chat"}, "sampling is on with --temperature > 0 (an HF folder's generation_config.json "
                                   "decides when no sampling option is given); --temperature 0 is greedy"}},
      {"greedy", {{"generate", "chat"}, "--temperature 0 is greedy"}},
      {"num_beams", {{"chat"}, "beam search is `flowrun generate --num_beams` and `eval prompts --num_beams`; chat "
                               "decodes greedily, or samples with --temperature"}},
      {"num_return_sequences", {{"generate"}, "one sequence per run: run again with another --seed"}},
      {"model_name_or_path", {decoding, "the model is --model here (eval prompts: --baseline, --finetuned)"}},
      {"model_name_or_path_baseline", {{"eval"}, "DS-Chat's --model_name_or_path_baseline is --baseline here"}},
      {"model_name_or_path_finetune", {{"eval"}, "DS-Chat's --model_name_or_path_finetune is --finetuned here"}},
      {"path", {{"chat"}, "DS-Chat's chat.py --path is --model here"}},
      {"num_padding_at_beginning",
       {{"eval"}, "DS-Chat's --num_padding_at_beginning (OPT's one pad) needs no setting here: scores are read at the "
                  "last real token"}},
      {"max_length", {{"generate", "chat"}, "transformers' max_length (prompt + answer) is --max_new_tokens (the answer) here"}},
      {"add_eot_token", {{"eval"}, "DS-Chat's --add_eot_token needs no flag here: every sequence ends with the "
                                   "tokenizer's EOS id, one token, as in training (docs/rlhf.md, \"The end of a "
                                   "conversation\")"}},
      {"language", {{"eval"}, "DS-Chat's prompt_eval.py --language picks its own built-in prompts; here the prompts "
                              "are the held-out split of --data (--data_split, --seed as in training)"}},
      {"zero_checkpoint", {{"chat"}, "chat reads a model file or folder: write the checkpoint as one with `flowrun "
                                     "convert --from zero DIR --to hf OUT` (`flowrun generate --zero_checkpoint DIR` "
                                     "answers prompts from it directly)"}},
      // TencentPretrain's LoRA flags: train-lm trains whole models; LoRA pretraining is zero_rank's
      {"lora_r", {{"train-lm"}, "LoRA pretraining is graphs/pretrain.graph's zero_rank (--set node.ranks.use_lora=true "
                                "--set node.ranks.lora_r=8); train-lm trains the whole model"}},
      {"lora_alpha", {{"train-lm"}, "LoRA pretraining is graphs/pretrain.graph's zero_rank (--set node.ranks.use_lora=true "
                                    "--set node.ranks.lora_alpha=16); train-lm trains the whole model"}},
      {"lora_dropout", {{"train-lm"}, "LoRA pretraining is graphs/pretrain.graph's zero_rank (--set "
                                      "node.ranks.use_lora=true --set node.ranks.lora_dropout=0.05); train-lm trains "
                                      "the whole model"}},
  };
  return m;
}

// eval prompts decodes greedily, as DS-Chat's prompt_eval.py does by default
const std::map<std::string, std::string>& greedy_commands_flags() {
  static const std::map<std::string, std::string> m = {
      {"do_sample", "eval prompts decodes greedily (DS-Chat's prompt_eval.py does too); `flowrun generate` and "
                    "`flowrun chat --temperature` sample"},

      {"temperature", "eval prompts decodes greedily; `flowrun generate` and `flowrun chat --temperature` sample"}};
  return m;
}
}  // namespace

std::vector<std::string> unknown_option_hints(const CLI::App& sub, const std::vector<std::string>& args) {
  std::map<std::string, const CLI::Option*> own;  // the command's options, and those of its own command named next
  auto add = [&](const CLI::App& app) {
    for (const auto* o : app.get_options())
      for (const auto& n : o->get_lnames()) own.emplace(n, o);
  };
  add(sub);
  if (args.size() >= 3)
    for (const auto* child : sub.get_subcommands([&](const CLI::App* c) { return c->check_name(args[2]); })) add(*child);
  std::vector<std::string> hints;
  for (std::size_t i = 2; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;  // positional arguments follow
    if (a.size() < 3 || a.rfind("--", 0) != 0) continue;
    // the value of the option before it (generate --prompt "--hello")
    if (const std::string& prev = args[i - 1]; prev.rfind("--", 0) == 0 && prev.find('=') == std::string::npos)
      if (auto it = own.find(prev.substr(2)); it != own.end() && it->second->get_type_size() != 0) continue;
    std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    if (own.count(name)) continue;
    std::string underscored = name;
    for (auto& c : underscored)
      if (c == '-') c = '_';
    if (own.count(underscored)) {
      hints.push_back(fmt::format("--{} is --{} here", name, underscored));
      continue;
    }
    if (auto it = foreign_flags().find(underscored); it != foreign_flags().end() && it->second.commands.count(sub.get_name())) {
      hints.push_back(fmt::format("--{}: {}", name, it->second.hint));
      continue;
    }
    if (auto it = greedy_commands_flags().find(underscored);
        it != greedy_commands_flags().end() && sub.get_name() == "eval") {
      hints.push_back(fmt::format("--{}: {}", name, it->second));
      continue;
    }
    // the options it begins (--temp: --temperature; --top: --top_k or --top_p), else one a few edits away
    // (--temprature), never --help
    std::vector<std::string> begun;
    for (const auto& [n, o] : own)
      if (n != "help" && n.rfind(underscored, 0) == 0) begun.push_back("--" + n);
    if (!begun.empty() && begun.size() <= 3) {
      hints.push_back(fmt::format("--{}: did you mean {}?", name, fmt::join(begun, " or ")));
      continue;
    }
    std::string closest;
    std::size_t best = std::max<std::size_t>(1, underscored.size() / 3) + 1;  // a third of its letters (--seed is no --set)
    for (const auto& [n, o] : own)
      if (const std::size_t d = graph::edit_distance(underscored, n); n != "help" && d < best) best = d, closest = n;
    if (!closest.empty()) hints.push_back(fmt::format("--{}: did you mean --{}?", name, closest));
  }
  // an option given twice, hinted once
  std::vector<std::string> once;
  for (auto& h : hints)
    if (std::find(once.begin(), once.end(), h) == once.end()) once.push_back(std::move(h));
  return once;
}

}  // namespace flowrun::cli
