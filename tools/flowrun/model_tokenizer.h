// Which tokenizer a command that reads a model uses, and the check that it fits the model.
#pragma once

#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/tokenizer.h"

namespace flowrun::cli {

/// The tokenizer path of a command (generate, chat, eval) that reads the models `models`
/// (user paths, resolved as resolve_user_path does): `tokenizer` when the user gave --tokenizer
/// (`given`); else the first of the models that is a folder holding a tokenizer (an HF folder, a
/// trainer's output: folder_has_tokenizer), or a file whose folder holds one (convert --to llama2c
/// writes it beside the file); else `tokenizer` (the option's default, stories260K's tok512.model,
/// the tokenizer of llama2.c files). With `given`, a model folder whose own tokenizer
/// has another vocabulary size is warned about (spdlog), since its text would be misread.
std::string tokenizer_for(const std::vector<std::string>& models, const std::string& tokenizer, bool given);

/// Throws std::invalid_argument naming both paths when `tok` has more token ids than the model's
/// embedding rows (`m.config().vocab_size`): the first id past them would fail deep in
/// embedding_forward. The fix it names: --tokenizer with the model's own tokenizer.
void check_tokenizer_fits(const tokenizer& tok, const std::string& tok_path, const decoder& m,
                          const std::string& model_path);

/// The same check against a model known by its vocab_size alone (a ZeRO checkpoint's manifest).
void check_tokenizer_fits(const tokenizer& tok, const std::string& tok_path, int64_t model_vocab,
                          const std::string& model_path);

}  // namespace flowrun::cli
