// GPT-2 byte-level BPE (Radford et al. 2019; OpenAI gpt-2 src/encoder.py, and
// transformers' GPT2Tokenizer, which OPT uses too).
//
// Why our own: Debian ships no maintained C++ library for GPT-2's BPE (HF
// `tokenizers` is Rust with Python bindings; SentencePiece, which Debian has,
// cannot read vocab.json + merges.txt). The algorithm is small and fully
// specified by encoder.py:
//   1. split the text on special/added tokens (they map to their ids directly);
//   2. pre-tokenize each piece with the regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (a hand-written scanner below, same leftmost-first alternation);
//   3. map each UTF-8 byte of a pre-token to a printable code point
//      (bytes_to_unicode), then merge adjacent symbols by the lowest merges.txt
//      rank until no ranked pair is left, and look the symbols up in vocab.json.
// Decoding maps the code points back to bytes.
//
// Steps 2 and 3 (and the UTF-8 helpers) are shared with the Hugging Face tokenizer.json
// reader (models/hf_tokenizer.cpp) through models/bpe.h; they are defined here.
//
// Unicode classes: \p{L} = general categories Lu Ll Lt Lm Lo, \p{N} = Nd Nl No,
// \s = the White_Space property (what Python's `regex` module, which encoder.py
// uses, matches), from ICU (libicu-dev: u_charType, u_isUWhiteSpace), with an
// exact ASCII fast path.
#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <queue>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include "models/bpe.h"
#include "models/tokenizer.h"

namespace flowrun {

namespace {

namespace fs = std::filesystem;

enum class char_class : uint8_t { other, letter, number, space };

char_class classify(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return char_class::letter;
    if (cp >= '0' && cp <= '9') return char_class::number;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d)) return char_class::space;
    return char_class::other;
  }
  const auto c = static_cast<UChar32>(cp);
  if (u_isUWhiteSpace(c)) return char_class::space;
  switch (u_charType(c)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER: return char_class::letter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER: return char_class::number;
    default: return char_class::other;
  }
}

}  // namespace

namespace bpe {

// Invalid UTF-8 (a stray byte) decodes as U+FFFD (class "other") of length 1, so every byte is
// still tokenized (byte-level BPE covers all 256 bytes).

uint32_t next_cp(std::string_view s, size_t i, size_t& len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) { return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80; };
  auto bits = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k]) & 0x3f); };
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  if (b0 >= 0xc2 && b0 < 0xe0 && cont(1)) {
    len = 2;
    return ((b0 & 0x1fu) << 6) | bits(1);
  }
  if (b0 >= 0xe0 && b0 < 0xf0 && cont(1) && cont(2)) {
    uint32_t cp = ((b0 & 0x0fu) << 12) | (bits(1) << 6) | bits(2);
    if (cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff)) {
      len = 3;
      return cp;
    }
  }
  if (b0 >= 0xf0 && b0 < 0xf5 && cont(1) && cont(2) && cont(3)) {
    uint32_t cp = ((b0 & 0x07u) << 18) | (bits(1) << 12) | (bits(2) << 6) | bits(3);
    if (cp >= 0x10000 && cp <= 0x10ffff) {
      len = 4;
      return cp;
    }
  }
  len = 1;
  return 0xfffd;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::vector<std::pair<size_t, size_t>> gpt2_pretokenize(std::string_view text) {
  struct cpi {
    uint32_t cp;
    size_t pos;
    char_class cls;
  };
  std::vector<cpi> cps;
  for (size_t i = 0; i < text.size();) {
    size_t len;
    uint32_t cp = next_cp(text, i, len);
    cps.push_back({cp, i, classify(cp)});
    i += len;
  }
  const size_t n = cps.size();
  auto byte_at = [&](size_t k) { return k < n ? cps[k].pos : text.size(); };
  std::vector<std::pair<size_t, size_t>> out;
  size_t i = 0;
  while (i < n) {
    size_t end = i;
    const uint32_t c = cps[i].cp;
    // 's|'t|'re|'ve|'m|'ll|'d
    if (c == '\'' && i + 1 < n) {
      uint32_t a = cps[i + 1].cp, b = i + 2 < n ? cps[i + 2].cp : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') end = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) end = i + 3;
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional ASCII space, then a run of one class
    if (end == i) {
      size_t k = c == ' ' ? i + 1 : i;
      if (k < n && cps[k].cls != char_class::space) {
        const char_class cls = cps[k].cls;
        end = k;
        while (end < n && cps[end].cls == cls) ++end;
      }
    }
    // '\s+(?!\S)' (a whitespace run, less its last char when a non-space follows), then '\s+'
    if (end == i) {
      size_t j = i;
      while (j < n && cps[j].cls == char_class::space) ++j;
      end = (j < n && j - i >= 2) ? j - 1 : j;
    }
    out.emplace_back(byte_at(i), byte_at(end));
    i = end;
  }
  return out;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  for (size_t i = 0; i < s.size();) {
    const unsigned char b0 = byte(i);
    if (b0 < 0x80) {
      out += static_cast<char>(b0);
      ++i;
      continue;
    }
    // the length of the sequence b0 starts and the range its second byte must fall in (Unicode Table 3-7)
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (b0 >= 0xc2 && b0 <= 0xdf) need = 2;
    else if (b0 >= 0xe0 && b0 <= 0xef) {
      need = 3;
      if (b0 == 0xe0) lo = 0xa0;
      if (b0 == 0xed) hi = 0x9f;
    } else if (b0 >= 0xf0 && b0 <= 0xf4) {
      need = 4;
      if (b0 == 0xf0) lo = 0x90;
      if (b0 == 0xf4) hi = 0x8f;
    }
    size_t got = 1;
    while (need && got < need && i + got < s.size()) {
      const unsigned char b = byte(i + got);
      const bool ok = got == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xbf);
      if (!ok) break;
      ++got;
    }
    if (need && got == need) out.append(s.substr(i, need));
    else out += "\xef\xbf\xbd";  // U+FFFD for the maximal subpart s[i, i + got)
    i += got;
  }
  return out;
}

const byte_alphabet& bytes_to_unicode() {
  static const byte_alphabet a = [] {
    byte_alphabet t;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      append_utf8(t.enc[b], cp);
      t.dec[cp] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return a;
}

std::string pair_key(std::string_view a, std::string_view b) {
  std::string k;
  k.reserve(a.size() + b.size() + 5);
  k.append(std::to_string(a.size())).push_back(':');
  k.append(a).append(b);
  return k;
}

void merge(std::vector<std::string>& sym, const ranks_map& ranks) {
  const int n = static_cast<int>(sym.size());
  if (n < 2) return;
  // a doubly linked list over the symbols; a merge keeps the left node and kills the right one
  std::vector<int> prev(n), next(n);
  std::vector<uint32_t> version(n, 0);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct candidate {
    int32_t rank;
    int left, right;
    uint32_t v_left, v_right;
  };
  auto later = [](const candidate& a, const candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  std::priority_queue<candidate, std::vector<candidate>, decltype(later)> heap(later);
  auto push = [&](int l, int r) {
    auto it = ranks.find(pair_key(sym[l], sym[r]));
    if (it != ranks.end()) heap.push({it->second, l, r, version[l], version[r]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    const candidate c = heap.top();
    heap.pop();
    // stale: a side was merged away or changed since this pair was ranked
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || version[c.left] != c.v_left ||
        version[c.right] != c.v_right)
      continue;
    sym[c.left] += sym[c.right];
    ++version[c.left];
    alive[c.right] = 0;
    const int nn = next[c.right];
    next[c.left] = nn;
    if (nn >= 0) prev[nn] = c.left;
    if (prev[c.left] >= 0) push(prev[c.left], c.left);
    if (nn >= 0) push(c.left, nn);
  }
  size_t w = 0;
  for (int i = 0; i < n; ++i)
    if (alive[i]) {
      if (w != static_cast<size_t>(i)) sym[w] = std::move(sym[i]);
      ++w;
    }
  sym.resize(w);
}

std::string token_content(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

void split_at_specials(std::string_view text, const std::vector<std::pair<std::string, int32_t>>& specials,
                       const std::function<void(std::string_view piece, bool first)>& ordinary,
                       std::vector<int32_t>& out) {
  size_t start = 0;
  bool first = true;
  while (start <= text.size()) {
    size_t best = std::string_view::npos;
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& sp : specials) {  // the earliest special token, the longest one at that position
      const size_t at = text.find(sp.first, start);
      if (at != std::string_view::npos && (at < best || (at == best && sp.first.size() > hit->first.size()))) {
        best = at;
        hit = &sp;
      }
    }
    if (const auto piece = text.substr(start, (hit ? best : text.size()) - start); !piece.empty())
      ordinary(piece, first);
    if (!hit) break;
    out.push_back(hit->second);
    first = false;
    start = best + hit->first.size();
  }
}

}  // namespace bpe

namespace {

using bpe::next_cp;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error(p.string() + ": cannot open");
  try {
    return nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw std::runtime_error(p.string() + ": not valid JSON: " + e.what());
  }
}

class gpt2_bpe_tokenizer final : public tokenizer {
 public:
  gpt2_bpe_tokenizer(const std::string& vocab_json, const std::string& merges_txt) {
    load_vocab(vocab_json);
    load_merges(merges_txt);
    load_specials(fs::path(vocab_json).parent_path());
  }

  std::vector<int32_t> encode(const std::string& text, bool add_bos, bool add_eos) const override {
    std::vector<int32_t> out;
    if (add_bos && bos_ >= 0) out.push_back(bos_);
    bpe::split_at_specials(
        text, specials_, [&](std::string_view piece, bool) { encode_ordinary(std::string(piece), out); }, out);
    if (add_eos && eos_ >= 0) out.push_back(eos_);
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id == bos_ || id == eos_ || id == pad_ || id < 0 || id >= static_cast<int32_t>(id_to_token_.size()))
        continue;
      const std::string& tok = id_to_token_[id];
      if (special_ids_.count(id)) {
        out += tok;
        continue;
      }
      for (size_t i = 0; i < tok.size();) {
        size_t len;
        uint32_t cp = next_cp(tok, i, len);
        auto it = bytes_.dec.find(cp);
        if (it != bytes_.dec.end()) out += static_cast<char>(it->second);
        else out.append(tok, i, len);  // not a byte symbol (a hand-added token): its text as is
        i += len;
      }
    }
    // as transformers' GPT2Tokenizer (bytearray(...).decode("utf-8", errors="replace")): bytes that do not
    // form UTF-8 (a character cut at the end, a model's stray byte) become U+FFFD; raw, they went to stdout,
    // a reward command's JSON line and the console, which all need UTF-8
    return bpe::utf8_lossy(out);
  }

  std::string piece(int32_t id) const override {
    return id >= 0 && id < static_cast<int32_t>(id_to_token_.size()) ? id_to_token_[id] : std::string();
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int32_t pad_id() const override { return pad_; }
  bool adds_bos() const override { return add_bos_; }

 private:
  void add_token(const std::string& tok, int64_t id, const std::string& file) {
    if (id < 0 || id > INT32_MAX) throw std::runtime_error(file + ": token '" + tok + "' has a bad id " + std::to_string(id));
    if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(static_cast<size_t>(id) + 1);
    id_to_token_[id] = tok;
    encoder_[tok] = static_cast<int32_t>(id);
  }

  void load_vocab(const std::string& path) {
    auto j = read_json(path);
    if (!j.is_object() || j.empty()) throw std::runtime_error(path + ": not a vocab.json (a {token: id} object)");
    for (auto& [tok, id] : j.items()) {
      if (!id.is_number_integer()) throw std::runtime_error(path + ": the id of '" + tok + "' is not an integer");
      add_token(tok, id.get<int64_t>(), path);
    }
  }

  void load_merges(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw std::runtime_error(path + ": cannot open merges.txt");
    std::string line;
    int32_t rank = 0;
    int64_t lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
      size_t sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos)
        throw std::runtime_error(path + ":" + std::to_string(lineno) + ": a merge must be two symbols separated by "
                                                                       "one space, got '" + line + "'");
      ranks_.emplace(bpe::pair_key(std::string_view(line).substr(0, sp), std::string_view(line).substr(sp + 1)),
                     rank++);
    }
    if (ranks_.empty()) throw std::runtime_error(path + ": no merges");
  }

  // Special tokens: added tokens are matched in text before BPE; bos/eos/pad/unk
  // ids from the tokenizer files, then config.json, then GPT-2's defaults.
  void load_specials(const fs::path& dir) {
    const std::string where = dir.string();
    std::set<std::string> special_strings;
    if (fs::exists(dir / "added_tokens.json")) {
      auto j = read_json(dir / "added_tokens.json");
      for (auto& [tok, id] : j.items())
        if (id.is_number_integer()) {
          add_token(tok, id.get<int64_t>(), (dir / "added_tokens.json").string());
          special_strings.insert(tok);
        }
    }
    nlohmann::json cfg = nlohmann::json::object(), map = nlohmann::json::object(), model = nlohmann::json::object();
    if (fs::exists(dir / "tokenizer_config.json")) cfg = read_json(dir / "tokenizer_config.json");
    if (fs::exists(dir / "special_tokens_map.json")) map = read_json(dir / "special_tokens_map.json");
    if (fs::exists(dir / "config.json")) model = read_json(dir / "config.json");
    if (cfg.contains("added_tokens_decoder") && cfg["added_tokens_decoder"].is_object())
      for (auto& [id, v] : cfg["added_tokens_decoder"].items()) {
        std::string tok = bpe::token_content(v);
        if (tok.empty()) continue;
        int64_t n = -1;
        try {
          n = std::stoll(id);
        } catch (const std::exception&) {
        }
        add_token(tok, n, (dir / "tokenizer_config.json").string());
        special_strings.insert(tok);
      }
    auto resolve = [&](const char* key, const char* id_key, int32_t def) -> int32_t {
      std::string tok;
      if (map.contains(key)) tok = bpe::token_content(map[key]);
      if (tok.empty() && cfg.contains(key)) tok = bpe::token_content(cfg[key]);
      if (!tok.empty()) {
        auto it = encoder_.find(tok);
        if (it == encoder_.end())
          throw std::runtime_error(where + ": " + key + " '" + tok + "' is not in vocab.json or the added tokens");
        special_strings.insert(tok);
        return it->second;
      }
      if (model.contains(id_key) && model[id_key].is_number_integer()) return model[id_key].get<int32_t>();
      return def;
    };
    auto eot = encoder_.find("<|endoftext|>");
    const int32_t gpt2_default = eot == encoder_.end() ? -1 : eot->second;
    bos_ = resolve("bos_token", "bos_token_id", gpt2_default);
    eos_ = resolve("eos_token", "eos_token_id", gpt2_default);
    unk_ = resolve("unk_token", "unk_token_id", gpt2_default);
    pad_ = resolve("pad_token", "pad_token_id", -1);
    if (eot != encoder_.end()) special_strings.insert("<|endoftext|>");
    // OPT's tokenizer prepends </s>; its tokenizer_config.json says so with add_bos_token,
    // and a model folder without that key is recognised by config.json's model_type
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) add_bos_ = cfg["add_bos_token"].get<bool>();
    else add_bos_ = model.value("model_type", "") == "opt";
    for (const auto& s : special_strings) {
      specials_.emplace_back(s, encoder_.at(s));
      special_ids_.insert(encoder_.at(s));
    }
  }

  // BPE of one pre-token (its raw bytes), appending ids.
  void bpe(const std::string& word, std::vector<int32_t>& out) const {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(word);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<std::string> sym;
    sym.reserve(word.size());
    for (unsigned char b : word) sym.push_back(bytes_.enc[b]);
    bpe::merge(sym, ranks_);
    std::vector<int32_t> ids;
    for (const auto& s : sym) {
      auto it = encoder_.find(s);
      if (it != encoder_.end()) ids.push_back(it->second);
      else if (unk_ >= 0) ids.push_back(unk_);
      else throw std::runtime_error("GPT-2 BPE: symbol '" + s + "' is not in vocab.json (vocab.json and merges.txt "
                                    "do not belong together)");
    }
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_.size() > 200000) cache_.clear();
    cache_.emplace(word, std::move(ids));
  }

  void encode_ordinary(const std::string& text, std::vector<int32_t>& out) const {
    for (auto [b, e] : bpe::gpt2_pretokenize(text)) bpe(text.substr(b, e - b), out);
  }

  const bpe::byte_alphabet& bytes_ = bpe::bytes_to_unicode();
  std::unordered_map<std::string, int32_t> encoder_;
  std::vector<std::string> id_to_token_;
  bpe::ranks_map ranks_;
  std::vector<std::pair<std::string, int32_t>> specials_;
  std::set<int32_t> special_ids_;
  int32_t bos_ = -1, eos_ = -1, pad_ = -1, unk_ = -1;
  bool add_bos_ = false;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace

std::unique_ptr<tokenizer> load_gpt2_bpe(const std::string& vocab_json, const std::string& merges_txt) {
  if (!fs::exists(vocab_json)) throw std::runtime_error(vocab_json + ": vocab.json not found");
  if (!fs::exists(merges_txt)) throw std::runtime_error(merges_txt + ": merges.txt not found (needed beside vocab.json)");
  return std::make_unique<gpt2_bpe_tokenizer>(vocab_json, merges_txt);
}

}  // namespace flowrun
