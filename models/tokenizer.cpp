#include "models/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include <sentencepiece_processor.h>

namespace flowrun {

namespace {

class sentencepiece_tokenizer final : public tokenizer {
 public:
  explicit sentencepiece_tokenizer(const std::string& path) {
    auto st = sp_.Load(path);
    if (!st.ok()) throw std::runtime_error(path + ": cannot load SentencePiece model: " + st.ToString());
  }
  std::vector<int32_t> encode(const std::string& text, bool add_bos, bool add_eos) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(text, &ids);
    if (!st.ok()) throw std::runtime_error("SentencePiece encode failed: " + st.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 2);
    if (add_bos && bos_id() >= 0) out.push_back(bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    if (add_eos && eos_id() >= 0) out.push_back(eos_id());
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> keep;
    keep.reserve(ids.size());
    for (auto id : ids)
      if (id != bos_id() && id != eos_id() && id != pad_id() && id >= 0 && id < vocab_size()) keep.push_back(id);
    std::string text;
    auto st = sp_.Decode(keep, &text);
    if (!st.ok()) throw std::runtime_error("SentencePiece decode failed: " + st.ToString());
    return text;
  }
  std::string piece(int32_t id) const override { return sp_.IdToPiece(id); }
  int32_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }
  int32_t pad_id() const override { return sp_.pad_id(); }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<tokenizer> load_sentencepiece(const std::string& path) {
  if (!std::filesystem::exists(path)) throw std::runtime_error(path + ": tokenizer file not found");
  return std::make_unique<sentencepiece_tokenizer>(path);
}

std::unique_ptr<tokenizer> load_tokenizer(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) {
    if (std::filesystem::exists(p / "tokenizer.json")) return load_hf_tokenizer((p / "tokenizer.json").string());
    if (std::filesystem::exists(p / "tokenizer.model")) return load_sentencepiece((p / "tokenizer.model").string());
    if (std::filesystem::exists(p / "vocab.json") && std::filesystem::exists(p / "merges.txt"))
      return load_gpt2_bpe((p / "vocab.json").string(), (p / "merges.txt").string());
    throw std::runtime_error(path + ": no tokenizer in the folder: expected tokenizer.json (Hugging Face), "
                                    "tokenizer.model (SentencePiece) or vocab.json + merges.txt (GPT-2 byte-level BPE)");
  }
  if (p.extension() == ".model") return load_sentencepiece(path);
  if (p.filename() == "tokenizer.json") return load_hf_tokenizer(path);
  if (p.filename() == "vocab.json") return load_gpt2_bpe(path, (p.parent_path() / "merges.txt").string());
  throw std::runtime_error(path + ": unknown tokenizer format; give a SentencePiece .model file "
                                  "(e.g. model/stories260K/tok512.model), a GPT-2 BPE vocab.json (with merges.txt "
                                  "beside it), a Hugging Face tokenizer.json, or a folder holding one of them");
}

std::string tokenizer_difference(const tokenizer& a, const tokenizer& b) {
  if (a.vocab_size() != b.vocab_size())
    return std::to_string(a.vocab_size()) + " tokens against " + std::to_string(b.vocab_size());
  if (a.bos_id() != b.bos_id() || a.eos_id() != b.eos_id() || a.pad_id() != b.pad_id())
    return "special ids (BOS, EOS, pad) " + std::to_string(a.bos_id()) + ", " + std::to_string(a.eos_id()) + ", " +
           std::to_string(a.pad_id()) + " against " + std::to_string(b.bos_id()) + ", " + std::to_string(b.eos_id()) +
           ", " + std::to_string(b.pad_id());
  for (int32_t id = 0; id < a.vocab_size(); ++id)
    if (a.piece(id) != b.piece(id)) return "id " + std::to_string(id) + " is \"" + a.piece(id) + "\" against \"" + b.piece(id) + "\"";
  return "";
}

bool folder_has_tokenizer(const std::string& dir) {
  const std::filesystem::path d(dir);
  return std::filesystem::exists(d / "tokenizer.json") || std::filesystem::exists(d / "tokenizer.model") ||
         (std::filesystem::exists(d / "vocab.json") && std::filesystem::exists(d / "merges.txt"));
}

std::vector<std::string> copy_tokenizer_files(const std::string& src_in, const std::string& dst_in, bool hf_names) {
  namespace fs = std::filesystem;
  static const char* const files[] = {"tokenizer.model",       "vocab.json",        "merges.txt",
                                      "special_tokens_map.json", "tokenizer_config.json", "added_tokens.json",
                                      "tokenizer.json",        "chat_template.jinja"};  // newer transformers' template file
  const fs::path src(src_in), dst(dst_in);
  fs::create_directories(dst);
  std::vector<std::string> written;
  auto copy = [&](const fs::path& from, const fs::path& to) {
    if (fs::exists(to) && fs::equivalent(from, to)) return;
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
    written.push_back(to.string());
  };
  // the (source, destination) pairs of this tokenizer
  std::vector<std::pair<fs::path, fs::path>> pairs;
  if (fs::is_directory(src) || src.filename() == "vocab.json") {
    const fs::path dir = fs::is_directory(src) ? src : src.parent_path();
    for (const char* f : files)
      if (fs::exists(dir / f)) pairs.emplace_back(dir / f, dst / f);
  } else {
    pairs.emplace_back(src, dst / (hf_names && src.extension() == ".model" ? fs::path("tokenizer.model") : src.filename()));
  }
  // A model folder holds one tokenizer: another one's files left there (an earlier conversion into the same
  // folder) would be read before the new one (load_tokenizer takes tokenizer.json first) or describe it wrongly
  // (its tokenizer_config.json), so they go. Not when the source is the folder itself, and not without hf_names
  // (the folder is then a llama2.c file's parent, which may hold anything).
  const bool same_folder = std::any_of(pairs.begin(), pairs.end(), [](const auto& pr) {
    return fs::exists(pr.second) && fs::equivalent(pr.first, pr.second);
  });
  if (hf_names && !same_folder)
    for (const char* f : files)
      if (std::none_of(pairs.begin(), pairs.end(), [&](const auto& pr) { return pr.second.filename() == f; }))
        fs::remove(dst / f);
  for (const auto& [from, to] : pairs) copy(from, to);
  if (hf_names && fs::exists(dst / "tokenizer.model") && !fs::exists(dst / "tokenizer_config.json")) {
    write_sentencepiece_tokenizer_config((dst / "tokenizer.model").string(), (dst / "tokenizer_config.json").string());
    written.push_back((dst / "tokenizer_config.json").string());
  }
  return written;
}

void write_sentencepiece_tokenizer_config(const std::string& model_path, const std::string& out_path) {
  sentencepiece::SentencePieceProcessor sp;
  if (auto st = sp.Load(model_path); !st.ok())
    throw std::runtime_error(model_path + ": cannot load SentencePiece model: " + st.ToString());
  auto token = [&](int id) -> nlohmann::json {
    return id >= 0 && id < sp.GetPieceSize() ? nlohmann::json(sp.IdToPiece(id)) : nlohmann::json(nullptr);
  };
  // the keys of Meta's LLaMA tokenizer_config.json (transformers' LlamaTokenizer): BOS prepended, no EOS,
  // "legacy" = SentencePiece's own handling of text after a special token
  const nlohmann::json j = {{"tokenizer_class", "LlamaTokenizer"},
                            {"add_bos_token", sp.bos_id() >= 0},
                            {"add_eos_token", false},
                            {"bos_token", token(sp.bos_id())},
                            {"eos_token", token(sp.eos_id())},
                            {"unk_token", token(sp.unk_id())},
                            {"pad_token", token(sp.pad_id())},
                            {"clean_up_tokenization_spaces", false},
                            {"legacy", true}};
  std::ofstream f(out_path);
  f << j.dump(2) << "\n";
  if (!f) throw std::runtime_error(out_path + ": cannot write the tokenizer config");
}

}  // namespace flowrun
