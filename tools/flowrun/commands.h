// flowrun's subcommands. Each registers itself on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace flowrun::cli {

/// `flowrun generate`: text from a model and a prompt.
void add_generate(CLI::App& app);
/// `flowrun train-lm`: causal-LM training on a text file, printing the loss each step.
void add_train_lm(CLI::App& app);

}  // namespace flowrun::cli
