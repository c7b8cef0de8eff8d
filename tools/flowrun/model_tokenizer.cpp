#include "tools/flowrun/model_tokenizer.h"

#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/util/assets.h"

namespace flowrun::cli {

namespace {

// The folder of a model path that holds a tokenizer, or "" (a missing path, a bare folder). A model
// file's own folder counts when it holds one (convert --to llama2c writes the tokenizer beside the file;
// tok512 read such a file's text with other ids, silently). `hf_without` is set when the path is a
// Hugging Face folder (config.json, no flowrun_config.json) with no tokenizer in it.
std::string tokenizer_folder(const std::string& model, bool& hf_without) {
  std::error_code ec;
  std::filesystem::path p;
  hf_without = false;
  try {
    p = resolve_user_path(model, "model");
  } catch (const std::exception&) {
    return "";  // the model's own load says what is missing
  }
  if (std::filesystem::is_regular_file(p, ec))
    return folder_has_tokenizer(p.parent_path().string()) ? p.parent_path().string() : "";
  if (!std::filesystem::is_directory(p, ec)) return "";
  if (folder_has_tokenizer(p.string())) return p.string();
  hf_without = std::filesystem::exists(p / "config.json", ec) && !std::filesystem::exists(p / "flowrun_config.json", ec);
  return "";
}

}  // namespace

std::string tokenizer_for(const std::vector<std::string>& models, const std::string& tokenizer, bool given) {
  for (const auto& m : models) {
    bool hf_without = false;
    const std::string dir = tokenizer_folder(m, hf_without);
    // transformers' AutoTokenizer refuses such a folder; here the default reads the text, so say so
    if (hf_without && !given)
      spdlog::warn("the Hugging Face folder {} holds no tokenizer (tokenizer.json, tokenizer.model or vocab.json + "
                   "merges.txt): its text is read with {}, which may not be its vocabulary; give its own with "
                   "--tokenizer",
                   m, tokenizer);
    if (dir.empty()) continue;
    if (!given) {
      spdlog::info("tokenizer: {} (the model's own; --tokenizer to use another)", dir);
      return dir;
    }
    // by their ids, not their sizes: Qwen2's and Llama 3's fixtures both hold 902 tokens and read text otherwise
    const std::string why =  // --tokenizer's against the folder's
        tokenizer_difference(*load_tokenizer(resolve_user_path(tokenizer, "tokenizer").string()), *load_tokenizer(dir));
    if (!why.empty())
      spdlog::warn("--tokenizer {} is not the tokenizer in the model folder {} ({}): the model's text would be read "
                   "with another vocabulary (drop --tokenizer to use the folder's)",
                   tokenizer, dir, why);
  }
  return tokenizer;
}

void check_tokenizer_fits(const tokenizer& tok, const std::string& tok_path, const decoder& m,
                          const std::string& model_path) {
  check_tokenizer_fits(tok, tok_path, m.config().vocab_size, model_path);
}

void check_tokenizer_fits(const tokenizer& tok, const std::string& tok_path, int64_t model_vocab,
                          const std::string& model_path) {
  if (tok.vocab_size() > model_vocab)
    throw std::invalid_argument(fmt::format(
        "the tokenizer {} has {} tokens, and the model {} has {} embedding rows: it is not the model's tokenizer; "
        "give the model's own with --tokenizer (an HF folder holds it: tokenizer.json, tokenizer.model or "
        "vocab.json + merges.txt)",
        tok_path, tok.vocab_size(), model_path, model_vocab));
}

}  // namespace flowrun::cli
