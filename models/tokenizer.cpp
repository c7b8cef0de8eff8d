#include "models/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include <sentencepiece_processor.h>

#include "models/bpe.h"

namespace flowrun {

namespace {

// Protocol-buffer wire format (developers.google.com/protocol-buffers/docs/encoding): a varint at `at`.
bool read_varint(const std::string& b, size_t& at, uint64_t& v) {
  v = 0;
  for (int shift = 0; at < b.size() && shift < 64; shift += 7) {
    const auto c = static_cast<unsigned char>(b[at++]);
    v |= static_cast<uint64_t>(c & 0x7f) << shift;
    if (!(c & 0x80)) return true;
  }
  return false;
}

void write_varint(std::string& out, uint64_t v) {
  do {
    unsigned char c = v & 0x7f;
    v >>= 7;
    if (v) c |= 0x80;
    out.push_back(static_cast<char>(c));
  } while (v);
}

// A serialized SentencePiece ModelProto with normalizer_spec (field 3) remove_extra_whitespaces (its field 4)
// false: a scalar given twice takes the last value, so "field 4 = 0" is appended to the spec. "" when the
// bytes are not a message this reads (then the model is loaded as it is). transformers' LlamaTokenizer
// (a `tokenizers` Metaspace over the same vocabulary) keeps every space; SentencePiece with this flag on
// (the proto's default, tok512's setting) collapses runs of spaces and drops them at the ends. Edited on
// the wire (a varint walk of the top level) rather than through libprotobuf: SentencePiece ships no
// sentencepiece_model.pb.h, and a second protobuf copy in this library is what runtime/tensorboard's
// CMakeLists.txt had to fence off (libsentencepiece exports its own).
std::string without_whitespace_removal(const std::string& b) {
  std::string out;
  bool patched = false;
  for (size_t at = 0; at < b.size();) {
    const size_t start = at;
    uint64_t key = 0, v = 0;
    if (!read_varint(b, at, key)) return "";
    switch (key & 7) {
      case 0:
        if (!read_varint(b, at, v)) return "";
        break;
      case 1: at += 8; break;
      case 5: at += 4; break;
      case 2: {
        if (!read_varint(b, at, v) || v > b.size() - at) return "";
        if ((key >> 3) == 3 && !patched) {  // normalizer_spec
          std::string spec = b.substr(at, v);
          spec += std::string("\x20\x00", 2);  // field 4 (remove_extra_whitespaces), varint 0
          write_varint(out, key);
          write_varint(out, spec.size());
          out += spec;
          at += v;
          patched = true;
          continue;
        }
        at += v;
        break;
      }
      default: return "";
    }
    if (at > b.size()) return "";
    out.append(b, start, at - start);
  }
  if (!patched) {
    write_varint(out, (3 << 3) | 2);
    out += std::string("\x02\x20\x00", 3);
  }
  return out;
}

class sentencepiece_tokenizer final : public tokenizer {
 public:
  explicit sentencepiece_tokenizer(const std::string& path) {
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    hf_folder_ = !dir.empty() && std::filesystem::exists(dir / "tokenizer_config.json");
    // an HF folder's model with every space kept, as transformers encodes (see without_whitespace_removal);
    // bytes this does not read load as they are
    std::string kept;
    if (hf_folder_) {
      std::ifstream in(path, std::ios::binary);
      kept = without_whitespace_removal(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
    }
    auto st = kept.empty() ? sp_.Load(path) : sp_.LoadFromSerializedProto(kept);
    if (!st.ok() && !kept.empty()) st = sp_.Load(path);
    if (!st.ok()) throw std::runtime_error(path + ": cannot load SentencePiece model: " + st.ToString());
    if (hf_folder_) load_hf_specials(dir);
  }
  std::vector<int32_t> encode(const std::string& text, bool add_bos, bool add_eos) const override {
    std::vector<int32_t> out;
    if (add_bos && bos_id() >= 0) out.push_back(bos_id());
    // transformers' LlamaTokenizer: the special and added tokens are cut out of the text first (their ids),
    // then each piece of text between them is encoded on its own: with SentencePiece's dummy prefix (legacy =
    // true, transformers' default), or, with legacy = false, only the text's first piece
    bpe::split_at_specials(
        text, specials_,
        [&](std::string_view piece, bool first) {
          if (legacy_ || first)
            append_pieces(piece, out);
          else
            append_without_prefix(piece, out);
        },
        out);
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
  /// llama2.c's run.c puts BOS before every prompt (a bare .model file); a Hugging Face folder as its
  /// tokenizer_config.json says (add_bos_token, true by default as in LlamaTokenizer).
  bool adds_bos() const override { return add_bos_ && bos_id() >= 0; }
  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }
  int32_t pad_id() const override { return sp_.pad_id(); }

 private:
  void append_pieces(std::string_view text, std::vector<int32_t>& out) const {
    std::vector<int> ids;
    // an HF folder's text that starts with a space: that space is the "▁" SentencePiece's dummy prefix
    // would add (transformers' Metaspace prepends one only to text not starting with one)
    const bool lead = hf_folder_ && !text.empty() && text[0] == ' ';
    if (lead && text.size() == 1) {  // " ": the prefix alone (SentencePiece encodes "" as nothing)
      if (const int id = sp_.PieceToId("\xe2\x96\x81"); id != sp_.unk_id()) out.push_back(id);
      return;
    }
    auto st = sp_.Encode(lead ? text.substr(1) : text, &ids);
    if (!st.ok()) throw std::runtime_error("SentencePiece encode failed: " + st.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }
  // Text after a special token with legacy = false: no dummy prefix. transformers' slow LlamaTokenizer
  // encodes unk_token + text and drops the unk_token's own pieces (its fast one gives the same ids).
  void append_without_prefix(std::string_view text, std::vector<int32_t>& out) const {
    std::vector<int> unk, ids;
    auto st = sp_.Encode(unk_piece_, &unk);
    if (st.ok()) st = sp_.Encode(unk_piece_ + std::string(text), &ids);
    if (!st.ok()) throw std::runtime_error("SentencePiece encode failed: " + st.ToString());
    out.insert(out.end(), ids.begin() + static_cast<std::ptrdiff_t>(std::min(unk.size(), ids.size())), ids.end());
  }
  // A Hugging Face folder (tokenizer_config.json beside tokenizer.model): its special tokens (bos, eos, unk,
  // pad and added_tokens_decoder; special_tokens_map.json; added_tokens.json) stand for their ids wherever a
  // text holds them, as in transformers (a chat template's "<s>[INST] ... </s>" gives BOS and EOS, not the
  // characters '<', 's', '>'). A bare .model file (llama2.c's tok512) keeps SentencePiece's plain encoding.
  void load_hf_specials(const std::filesystem::path& dir) {
    const auto cfg_path = dir / "tokenizer_config.json";
    auto read = [](const std::filesystem::path& f) {
      std::ifstream in(f);
      nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) throw std::runtime_error(f.string() + ": not valid JSON");
      return j;
    };
    const nlohmann::json cfg = read(cfg_path);
    if (cfg.contains("legacy") && cfg["legacy"].is_boolean()) legacy_ = cfg["legacy"].get<bool>();
    // transformers' LlamaTokenizer puts BOS first unless add_bos_token is false (its default is true)
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) add_bos_ = cfg["add_bos_token"].get<bool>();
    unk_piece_ = sp_.unk_id() >= 0 ? sp_.IdToPiece(sp_.unk_id()) : "<unk>";
    std::map<std::string, int32_t> found;
    auto add_piece = [&](const std::string& content) {  // a token named by its content: the model's piece
      if (content.empty() || found.count(content)) return;
      const int id = sp_.PieceToId(content);
      if (id >= 0 && (id != sp_.unk_id() || content == unk_piece_)) found[content] = id;
    };
    if (cfg.contains("added_tokens_decoder") && cfg["added_tokens_decoder"].is_object())
      for (const auto& [id, v] : cfg["added_tokens_decoder"].items())
        if (const std::string c = bpe::token_content(v); !c.empty() && !id.empty() &&
                                                     id.find_first_not_of("0123456789") == std::string::npos)
          found[c] = static_cast<int32_t>(std::stol(id));
    if (std::filesystem::exists(dir / "added_tokens.json")) {
      const nlohmann::json added = read(dir / "added_tokens.json");
      for (const auto& [c, id] : added.items())
        if (id.is_number_integer()) found.emplace(c, id.get<int32_t>());
    }
    const nlohmann::json map = std::filesystem::exists(dir / "special_tokens_map.json") ? read(dir / "special_tokens_map.json")
                                                                                  : nlohmann::json::object();
    for (const nlohmann::json* src : {&cfg, &map})
      for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"})
        if (src->contains(key)) add_piece(bpe::token_content((*src)[key]));
    for (const auto& [c, id] : found)
      if (id >= 0 && id < vocab_size()) specials_.emplace_back(c, id);
  }

  sentencepiece::SentencePieceProcessor sp_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // content -> id (an HF folder's special tokens)
  bool legacy_ = true;                                      // tokenizer_config.json "legacy" (transformers' default)
  bool add_bos_ = true;                                     // tokenizer_config.json "add_bos_token" (LlamaTokenizer: true)
  bool hf_folder_ = false;                                  // tokenizer_config.json beside the model
  std::string unk_piece_ = "<unk>";
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

std::string other_tokenizer_in(const std::string& dir, const std::string& path) {
  std::error_code ec;
  if (!folder_has_tokenizer(dir) || std::filesystem::equivalent(dir, path, ec)) return "";
  try {
    return tokenizer_difference(*load_tokenizer(dir), *load_tokenizer(path));
  } catch (const std::exception& e) {
    return std::string("its files do not load: ") + e.what();
  }
}

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names = {
      "tokenizer.model",     "vocab.json",         "merges.txt",          "special_tokens_map.json",
      "tokenizer_config.json", "added_tokens.json", "tokenizer.json",
      "chat_template.jinja", "chat_template.json"};  // newer transformers' template files
  return names;
}

std::vector<std::string> remove_tokenizer_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  for (const auto& f : tokenizer_file_names())
    if (fs::remove(fs::path(dir) / f)) removed.push_back((fs::path(dir) / f).string());
  return removed;
}

std::vector<std::string> copy_tokenizer_files(const std::string& src_in, const std::string& dst_in, bool hf_names) {
  namespace fs = std::filesystem;
  const auto& files = tokenizer_file_names();
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
    for (const auto& f : files)
      if (fs::exists(dir / f)) pairs.emplace_back(dir / f, dst / f);
  } else {
    // a SentencePiece file is tokenizer.model in any model folder: what the readers look for beside a llama2.c
    // file too (folder_has_tokenizer: a run's mod.model kept its name there, and its text was read with tok512)
    pairs.emplace_back(src, dst / (src.extension() == ".model" ? fs::path("tokenizer.model") : src.filename()));
  }
  // A model folder holds one tokenizer: another one's files left there (an earlier conversion into the same
  // folder) would be read before the new one (load_tokenizer takes tokenizer.json first) or describe it wrongly
  // (its tokenizer_config.json), so they go. Not when the source is the folder itself, and not without hf_names
  // (the folder is then a llama2.c file's parent, which may hold anything).
  const bool same_folder = std::any_of(pairs.begin(), pairs.end(), [](const auto& pr) {
    return fs::exists(pr.second) && fs::equivalent(pr.first, pr.second);
  });
  if (hf_names && !same_folder)
    for (const auto& f : files)
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

std::vector<int32_t> prompt_ids(const tokenizer& tok, const std::string& text) {
  auto ids = tok.encode(text, tok.adds_bos());
  if (ids.empty() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  return ids;
}

}  // namespace flowrun
