#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace flowrun::cli {

/// For each option in `args` (the command line, args[1] the command) that the command `sub` does not
/// have, a hint: its own option of the same name in another spelling ("--max-new-tokens" is
/// --max_new_tokens) or at most 2 edits away, or what another tool's flag of that name is here
/// (transformers' --do_sample and --num_beams, DS-Chat's --model_name_or_path_baseline, chat.py's
/// --path, ...). Empty when every option is the command's or none is known. CLI11 said only "The
/// following arguments were not expected".
std::vector<std::string> unknown_option_hints(const CLI::App& sub, const std::vector<std::string>& args);

}  // namespace flowrun::cli
