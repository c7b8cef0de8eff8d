#include "tools/flowrun/option_hints.h"

#include <map>
#include <set>

#include <fmt/format.h>

#include "runtime/graph/graph_spec.h"

namespace flowrun::cli {

namespace {
// Other tools' flags for generate, chat and eval, and what they are here (transformers' generate(), DS-Chat's
// prompt_eval.py, rw_eval.py and chat.py, TRL's chat)
const std::map<std::string, std::string>& foreign_flags() {
  static const std::map<std::string, std::string> m = {
      {"do_sample", "sampling is on with --temperature > 0 (an HF folder's generation_config.json decides when "
                    "--temperature is not given); --temperature 0 is greedy"},
      {"greedy", "--temperature 0 is greedy"},
      {"num_beams", "there is no beam search here: --temperature 0 decodes greedily, > 0 samples"},
      {"num_return_sequences", "one sequence per run: run again with another --seed"},
      {"model_name_or_path", "the model is --model here (eval prompts: --baseline, --finetuned)"},
      {"model_name_or_path_baseline", "DS-Chat's --model_name_or_path_baseline is --baseline here"},
      {"model_name_or_path_finetune", "DS-Chat's --model_name_or_path_finetune is --finetuned here"},
      {"path", "DS-Chat's chat.py --path is --model here"},
      {"num_padding_at_beginning",
       "DS-Chat's --num_padding_at_beginning (OPT's one pad) needs no setting here: scores are read at the last "
       "real token, padding is right-aligned out"},
      {"max_length", "transformers' max_length (prompt + answer) is --max_new_tokens (the answer) here"},
      {"max_new_token", "--max_new_tokens"},
  };
  return m;
}
}  // namespace

std::vector<std::string> unknown_option_hints(const CLI::App& sub, const std::vector<std::string>& args) {
  std::set<std::string> own;  // the command's options, and those of its own command named next (eval prompts)
  auto add = [&](const CLI::App& app) {
    for (const auto* o : app.get_options())
      for (const auto& n : o->get_lnames()) own.insert(n);
  };
  add(sub);
  if (args.size() >= 3)
    for (const auto* child : sub.get_subcommands([&](const CLI::App* c) { return c->check_name(args[2]); })) add(*child);
  std::vector<std::string> hints;
  for (std::size_t i = 2; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 3 || a.rfind("--", 0) != 0) continue;
    std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    if (own.count(name)) continue;
    std::string underscored = name;
    for (auto& c : underscored)
      if (c == '-') c = '_';
    if (own.count(underscored)) {
      hints.push_back(fmt::format("--{} is --{} here", name, underscored));
      continue;
    }
    if (auto it = foreign_flags().find(underscored); it != foreign_flags().end()) {
      hints.push_back(fmt::format("--{}: {}", name, it->second));
      continue;
    }
    std::string closest;
    std::size_t best = 3;  // at most 2 edits away
    for (const auto& n : own)
      if (const std::size_t d = graph::edit_distance(underscored, n); d < best) best = d, closest = n;
    if (!closest.empty()) hints.push_back(fmt::format("--{}: did you mean --{}?", name, closest));
  }
  return hints;
}

}  // namespace flowrun::cli
