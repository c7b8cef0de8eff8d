// Hugging Face tokenizer.json (the `tokenizers` library's format, huggingface/tokenizers
// tokenizers/src/tokenizer/serialization.rs): the pipeline
//   added tokens (split out first) -> normalizer -> pre-tokenizer -> model -> post-processor
// and, back, the decoder. What is read (anything else is refused naming the JSON path):
//   model          BPE: vocab, merges ("a b" strings or [a, b] pairs), unk_token, fuse_unk,
//                  byte_fallback (<0xNN> tokens), ignore_merges; dropout null/0, no subword
//                  prefix/suffix. Merges go through the one BPE loop (models/bpe.h).
//   normalizer     Sequence, Prepend, Replace (String or Regex), NFC, NFD, NFKC, NFKD (ICU)
//   pre_tokenizer  Sequence, Split (String or Regex; Isolated, Removed, MergedWithPrevious,
//                  MergedWithNext, Contiguous; invert false), ByteLevel (add_prefix_space,
//                  use_regex: GPT-2's regex), Metaspace (prepend_scheme always/first/never,
//                  split), Digits (individual_digits)
//   added_tokens   matched leftmost-longest before the normalizer (normalized: false) or in the
//                  normalized text (normalized: true); lstrip / rstrip take the whitespace beside
//   decoder        Sequence, ByteLevel, ByteFallback, Metaspace, Replace, Strip, Fuse
//   post_processor TemplateProcessing (its single template: the ids before and after $A),
//                  ByteLevel (ids unchanged), Sequence of those
// Regexes (Split, Replace) are PCRE2 (libpcre2-dev) with UTF and UCP, so \p{L} \p{N} and the
// lookahead of Llama 3's and Qwen2's patterns work as in Oniguruma, which `tokenizers` uses;
// \s and \S are rewritten to Unicode's White_Space set (Oniguruma's \s), since PCRE2's UCP \s
// also takes U+180E.
//
// The behaviour of every step follows the Rust source (tokenizers 0.23): normalizer.rs
// (NormalizedString::split and its SplitDelimiterBehavior), added_vocabulary.rs (find_matches),
// models/bpe/model.rs (merge_word, tokenize), decoders/*.rs, processors/template.rs; checked
// against the Python package by tests/test_hf_tokenizer.cpp.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "models/bpe.h"
#include "models/tokenizer.h"

namespace flowrun {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Reading the JSON with errors that name the file and the path

struct reader {
  std::string file;

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw std::runtime_error(file + ": " + path + " " + what);
  }
  const json& get(const json& obj, const std::string& path, const char* key) const {
    if (!obj.is_object() || !obj.contains(key)) fail(path + "." + key, "is missing");
    return obj[key];
  }
  std::string str(const json& obj, const std::string& path, const char* key) const {
    const json& v = get(obj, path, key);
    if (!v.is_string()) fail(path + "." + key, "must be a string, got " + v.dump());
    return v.get<std::string>();
  }
  bool flag(const json& obj, const std::string& path, const char* key, bool def) const {
    if (!obj.contains(key) || obj[key].is_null()) return def;
    if (!obj[key].is_boolean()) fail(path + "." + key, "must be true or false, got " + obj[key].dump());
    return obj[key].get<bool>();
  }
  std::string type(const json& obj, const std::string& path) const {
    if (!obj.is_object()) fail(path, "must be an object with a \"type\", got " + obj.dump().substr(0, 80));
    return str(obj, path, "type");
  }
  [[noreturn]] void unsupported(const std::string& path, const std::string& value, const char* supported) const {
    fail(path, "\"" + value + "\" is not supported; supported: " + supported);
  }
  // the one code point of a "replacement"/"content" char field
  uint32_t one_char(const json& obj, const std::string& path, const char* key) const {
    std::string s = str(obj, path, key);
    size_t len = 0;
    uint32_t cp = s.empty() ? 0 : bpe::next_cp(s, 0, len);
    if (s.empty() || len != s.size()) fail(path + "." + key, "must be one character, got \"" + s + "\"");
    return cp;
  }
};

// ---------------------------------------------------------------------------------------------
// PCRE2 regexes (UTF + UCP)

// The pattern with \s and \S spelled as Unicode's White_Space set (what Oniguruma's \s matches),
// in and out of character classes.
std::string oniguruma_spaces(const std::string& pat) {
  static const std::string ws = R"(\t\n\x0b\f\r\x20\x85\xa0\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pat.size(); ++i) {
    const char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      const char n = pat[i + 1];
      if (n == 's') out += in_class ? ws : "[" + ws + "]";
      else if (n == 'S' && !in_class) out += "[^" + ws + "]";
      else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && in_class && i + 1 < pat.size() && pat[i + 1] == ':') {  // [:alpha:] inside a class
      const size_t end = pat.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(pat, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < pat.size() && pat[i + 1] == '^') out += pat[++i];
      if (i + 1 < pat.size() && pat[i + 1] == ']') out += pat[++i];  // a literal ] first in a class
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

class regex {
 public:
  regex(const std::string& pattern, const reader& r, const std::string& path) : where_(r.file + ": " + path) {
    int err = 0;
    PCRE2_SIZE off = 0;
    const std::string pat = oniguruma_spaces(pattern);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      r.fail(path, "regex \"" + pattern + "\" does not compile (PCRE2: " + reinterpret_cast<char*>(msg) +
                       " at offset " + std::to_string(off) + ")");
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is used without it
  }
  ~regex() { pcre2_code_free(code_); }
  regex(const regex&) = delete;
  regex& operator=(const regex&) = delete;

  /// The non-overlapping matches, left to right, as [begin, end) byte ranges; an empty match
  /// advances by one character.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t at = 0;
    while (at <= text.size()) {
      int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at, 0, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw std::runtime_error(where_ + " regex: matching failed (PCRE2: " + reinterpret_cast<char*>(msg) + ")");
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e > b) {
        out.emplace_back(b, e);
        at = e;
      } else {
        if (b >= text.size()) break;
        size_t len = 1;
        bpe::next_cp(text, b, len);
        at = b + len;
      }
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  std::string where_;  // "file: json.path" for errors
  pcre2_code* code_ = nullptr;
};

// A {"String": s} or {"Regex": r} pattern: its matches in a text.
struct pattern {
  std::string literal;
  std::shared_ptr<regex> re;

  static pattern read(const json& v, const reader& r, const std::string& path) {
    pattern p;
    if (v.is_object() && v.contains("String") && v["String"].is_string()) p.literal = v["String"].get<std::string>();
    else if (v.is_object() && v.contains("Regex") && v["Regex"].is_string())
      p.re = std::make_shared<regex>(v["Regex"].get<std::string>(), r, path + ".Regex");
    else r.fail(path, "must be {\"String\": ...} or {\"Regex\": ...}, got " + v.dump().substr(0, 80));
    if (!p.re && p.literal.empty()) r.fail(path + ".String", "is empty");
    return p;
  }
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const {
    if (re) return re->find_all(text);
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t at = text.find(literal); at != std::string_view::npos; at = text.find(literal, at + literal.size()))
      out.emplace_back(at, at + literal.size());
    return out;
  }
};

std::string replace_all(std::string_view text, const pattern& p, const std::string& with) {
  std::string out;
  size_t prev = 0;
  for (auto [b, e] : p.find_all(text)) {
    out.append(text.substr(prev, b - prev)).append(with);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

std::string utf8(uint32_t cp) {
  std::string s;
  bpe::append_utf8(s, cp);
  return s;
}

bool is_white_space(uint32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

// ---------------------------------------------------------------------------------------------
// Normalizers

struct normalizer {
  enum class kind { prepend, replace, unicode } k;
  std::string text;          // prepend: what; replace: the content
  pattern pat;               // replace
  const UNormalizer2* norm = nullptr;  // unicode: NFC / NFD / NFKC / NFKD

  std::string apply(const std::string& s) const {
    switch (k) {
      case kind::prepend: return s.empty() ? s : text + s;
      case kind::replace: return replace_all(s, pat, text);
      case kind::unicode: {
        if (s.empty()) return s;
        UErrorCode st = U_ZERO_ERROR;
        std::u16string in(s.size() + 1, u'\0');
        int32_t n = 0;
        u_strFromUTF8WithSub(in.data(), static_cast<int32_t>(in.size()), &n, s.data(), static_cast<int32_t>(s.size()),
                             0xfffd, nullptr, &st);
        if (U_FAILURE(st)) throw std::runtime_error(std::string("tokenizer normalizer: UTF-8 to UTF-16: ") + u_errorName(st));
        in.resize(n);
        std::u16string out(in.size() * 4 + 16, u'\0');
        int32_t m = unorm2_normalize(norm, in.data(), n, out.data(), static_cast<int32_t>(out.size()), &st);
        if (st == U_BUFFER_OVERFLOW_ERROR) {  // NFKC can expand one unit to 18 (U+FDFA)
          st = U_ZERO_ERROR;
          out.assign(static_cast<size_t>(m), u'\0');
          m = unorm2_normalize(norm, in.data(), n, out.data(), static_cast<int32_t>(out.size()), &st);
        }
        if (U_FAILURE(st)) throw std::runtime_error(std::string("tokenizer normalizer: ") + u_errorName(st));
        std::string res(static_cast<size_t>(m) * 3 + 1, '\0');
        int32_t k8 = 0;
        u_strToUTF8(res.data(), static_cast<int32_t>(res.size()), &k8, out.data(), m, &st);
        if (U_FAILURE(st)) throw std::runtime_error(std::string("tokenizer normalizer: UTF-16 to UTF-8: ") + u_errorName(st));
        res.resize(k8);
        return res;
      }
    }
    return s;
  }
};

void read_normalizer(const json& v, const reader& r, const std::string& path, std::vector<normalizer>& out) {
  if (v.is_null()) return;
  const std::string t = r.type(v, path);
  if (t == "Sequence") {
    const json& list = r.get(v, path, "normalizers");
    if (!list.is_array()) r.fail(path + ".normalizers", "must be a list");
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(list[i], r, path + ".normalizers[" + std::to_string(i) + "]", out);
  } else if (t == "Prepend") {
    out.push_back({normalizer::kind::prepend, r.str(v, path, "prepend"), {}, nullptr});
  } else if (t == "Replace") {
    out.push_back({normalizer::kind::replace, r.str(v, path, "content"),
                   pattern::read(r.get(v, path, "pattern"), r, path + ".pattern"), nullptr});
  } else if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
    UErrorCode st = U_ZERO_ERROR;
    const UNormalizer2* n = t == "NFC"    ? unorm2_getNFCInstance(&st)
                            : t == "NFD"  ? unorm2_getNFDInstance(&st)
                            : t == "NFKC" ? unorm2_getNFKCInstance(&st)
                                          : unorm2_getNFKDInstance(&st);
    if (U_FAILURE(st)) r.fail(path, std::string("ICU has no ") + t + " normalizer: " + u_errorName(st));
    out.push_back({normalizer::kind::unicode, {}, {}, n});
  } else {
    r.unsupported(path + ".type", t, "Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD");
  }
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers: a list of splits; `first` marks the split that starts at the start of the
// original text (Metaspace's prepend_scheme "first" looks at it).

struct split_piece {
  std::string text;
  bool first = false;
};

enum class delimiter { isolated, removed, merged_with_previous, merged_with_next, contiguous };

// NormalizedString::split: cut `s` at the matches, each piece kept, dropped or joined to a neighbour.
std::vector<std::string> split_by(const std::string& s, const std::vector<std::pair<size_t, size_t>>& matches,
                                  delimiter how) {
  // (begin, end, is_match) covering s
  struct part {
    size_t b, e;
    bool match;
  };
  std::vector<part> parts;
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) parts.push_back({prev, b, false});
    parts.push_back({b, e, true});
    prev = e;
  }
  if (prev != s.size()) parts.push_back({prev, s.size(), false});
  std::vector<std::pair<size_t, size_t>> keep;
  switch (how) {
    case delimiter::isolated:
      for (auto& p : parts) keep.emplace_back(p.b, p.e);
      break;
    case delimiter::removed:
      for (auto& p : parts)
        if (!p.match) keep.emplace_back(p.b, p.e);
      break;
    case delimiter::contiguous: {
      bool prev_match = false;
      for (auto& p : parts) {
        if (p.match == prev_match && !keep.empty()) keep.back().second = p.e;
        else keep.emplace_back(p.b, p.e);
        prev_match = p.match;
      }
      break;
    }
    case delimiter::merged_with_previous: {
      bool prev_match = false;
      for (auto& p : parts) {
        if (p.match && !prev_match && !keep.empty()) keep.back().second = p.e;
        else keep.emplace_back(p.b, p.e);
        prev_match = p.match;
      }
      break;
    }
    case delimiter::merged_with_next: {
      bool prev_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !prev_match && !keep.empty()) keep.back().first = it->b;
        else keep.emplace_back(it->b, it->e);
        prev_match = it->match;
      }
      std::reverse(keep.begin(), keep.end());
      break;
    }
  }
  std::vector<std::string> out;
  for (auto [b, e] : keep)
    if (e > b) out.push_back(s.substr(b, e - b));
  return out;
}

struct pre_tokenizer {
  enum class kind { split, byte_level, metaspace, digits } k;
  pattern pat;                             // split
  delimiter how = delimiter::isolated;     // split
  bool add_prefix_space = false;           // byte_level
  bool use_regex = false;                  // byte_level
  std::string replacement;                 // metaspace
  enum class prepend { always, first, never } scheme = prepend::always;  // metaspace
  bool split_on_replacement = false;       // metaspace
  bool individual_digits = false;          // digits

  void apply(std::vector<split_piece>& pieces) const {
    std::vector<split_piece> out;
    for (auto& p : pieces) {
      auto emit = [&](std::vector<std::string> parts) {
        for (size_t i = 0; i < parts.size(); ++i)
          if (!parts[i].empty()) out.push_back({std::move(parts[i]), p.first && i == 0});
      };
      switch (k) {
        case kind::split: emit(split_by(p.text, pat.find_all(p.text), how)); break;
        case kind::byte_level: {
          std::string s = p.text;
          if (add_prefix_space && (s.empty() || s[0] != ' ')) s.insert(0, " ");
          std::vector<std::string> parts;
          if (use_regex)
            for (auto [b, e] : bpe::gpt2_pretokenize(s)) parts.push_back(s.substr(b, e - b));
          else parts.push_back(s);
          const auto& alpha = bpe::bytes_to_unicode();
          for (auto& part : parts) {
            std::string mapped;
            for (unsigned char c : part) mapped += alpha.enc[c];
            part = std::move(mapped);
          }
          emit(std::move(parts));
          break;
        }
        case kind::metaspace: {
          std::string s;
          for (char c : p.text) {
            if (c == ' ') s += replacement;
            else s += c;
          }
          const bool starts = s.compare(0, replacement.size(), replacement) == 0;
          if (!starts && (scheme == prepend::always || (scheme == prepend::first && p.first))) s = replacement + s;
          if (split_on_replacement) {
            pattern rp;
            rp.literal = replacement;
            emit(split_by(s, rp.find_all(s), delimiter::merged_with_next));
          } else {
            emit({s});
          }
          break;
        }
        case kind::digits: {
          // Rust's char::is_numeric: general categories Nd, Nl, No
          std::vector<std::pair<size_t, size_t>> m;
          for (size_t i = 0; i < p.text.size();) {
            size_t len = 1;
            uint32_t cp = bpe::next_cp(p.text, i, len);
            const auto t = u_charType(static_cast<UChar32>(cp));
            if (t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER) m.emplace_back(i, i + len);
            i += len;
          }
          emit(split_by(p.text, m, individual_digits ? delimiter::isolated : delimiter::contiguous));
          break;
        }
      }
    }
    pieces.swap(out);
  }
};

void read_pre_tokenizer(const json& v, const reader& r, const std::string& path, std::vector<pre_tokenizer>& out) {
  if (v.is_null()) return;
  const std::string t = r.type(v, path);
  pre_tokenizer p{};
  if (t == "Sequence") {
    const json& list = r.get(v, path, "pretokenizers");
    if (!list.is_array()) r.fail(path + ".pretokenizers", "must be a list");
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(list[i], r, path + ".pretokenizers[" + std::to_string(i) + "]", out);
    return;
  }
  if (t == "Split") {
    p.k = pre_tokenizer::kind::split;
    p.pat = pattern::read(r.get(v, path, "pattern"), r, path + ".pattern");
    const std::string b = r.str(v, path, "behavior");
    static const std::map<std::string, delimiter> names = {{"Isolated", delimiter::isolated},
                                                           {"Removed", delimiter::removed},
                                                           {"MergedWithPrevious", delimiter::merged_with_previous},
                                                           {"MergedWithNext", delimiter::merged_with_next},
                                                           {"Contiguous", delimiter::contiguous}};
    auto it = names.find(b);
    if (it == names.end())
      r.unsupported(path + ".behavior", b, "Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous");
    p.how = it->second;
    if (r.flag(v, path, "invert", false)) r.fail(path + ".invert", "true is not supported (only false)");
  } else if (t == "ByteLevel") {
    p.k = pre_tokenizer::kind::byte_level;
    p.add_prefix_space = r.flag(v, path, "add_prefix_space", true);
    p.use_regex = r.flag(v, path, "use_regex", true);
  } else if (t == "Metaspace") {
    p.k = pre_tokenizer::kind::metaspace;
    p.replacement = utf8(r.one_char(v, path, "replacement"));
    p.split_on_replacement = r.flag(v, path, "split", true);
    if (v.contains("prepend_scheme")) {
      const std::string s = r.str(v, path, "prepend_scheme");
      if (s == "always") p.scheme = pre_tokenizer::prepend::always;
      else if (s == "first") p.scheme = pre_tokenizer::prepend::first;
      else if (s == "never") p.scheme = pre_tokenizer::prepend::never;
      else r.unsupported(path + ".prepend_scheme", s, "always, first, never");
    } else {  // files from tokenizers < 0.19: add_prefix_space
      p.scheme = r.flag(v, path, "add_prefix_space", true) ? pre_tokenizer::prepend::always : pre_tokenizer::prepend::never;
    }
  } else if (t == "Digits") {
    p.k = pre_tokenizer::kind::digits;
    p.individual_digits = r.flag(v, path, "individual_digits", false);
  } else {
    r.unsupported(path + ".type", t, "Sequence, Split, ByteLevel, Metaspace, Digits");
  }
  out.push_back(std::move(p));
}

// ---------------------------------------------------------------------------------------------
// Decoders: each maps the list of token strings to a new list (decode_chain), joined at the end.

struct decoder_step {
  enum class kind { byte_level, byte_fallback, metaspace, replace, strip, fuse } k;
  std::string replacement;      // metaspace
  bool prepend = true;          // metaspace: prepend_scheme != never
  pattern pat;                  // replace
  std::string content;          // replace
  uint32_t strip_char = 0;      // strip
  size_t start = 0, stop = 0;   // strip

  void apply(std::vector<std::string>& toks) const {
    switch (k) {
      case kind::byte_level: {
        const auto& alpha = bpe::bytes_to_unicode();
        std::string bytes;
        for (const auto& t : toks) {
          std::string b;
          bool all = true;
          for (size_t i = 0; i < t.size() && all;) {
            size_t len = 1;
            auto it = alpha.dec.find(bpe::next_cp(t, i, len));
            if (it == alpha.dec.end()) all = false;
            else b += static_cast<char>(it->second);
            i += len;
          }
          bytes += all ? b : t;
        }
        toks.assign(1, bpe::utf8_lossy(bytes));
        break;
      }
      case kind::byte_fallback: {
        std::vector<std::string> out;
        std::string run;  // pending <0xNN> bytes
        size_t run_n = 0;
        auto flush = [&] {
          if (!run_n) return;
          if (bpe::utf8_lossy(run) == run) out.push_back(run);
          else
            for (size_t i = 0; i < run_n; ++i) out.push_back("\xef\xbf\xbd");
          run.clear();
          run_n = 0;
        };
        for (auto& t : toks) {
          auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex(t[3]) && hex(t[4])) {
            run += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
            ++run_n;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        toks.swap(out);
        break;
      }
      case kind::metaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          std::string o;
          for (size_t at = 0; at < toks[i].size();) {
            if (toks[i].compare(at, replacement.size(), replacement) == 0) {
              if (!(i == 0 && prepend)) o += ' ';
              at += replacement.size();
            } else {
              o += toks[i][at++];
            }
          }
          toks[i] = std::move(o);
        }
        break;
      case kind::replace:
        for (auto& t : toks) t = replace_all(t, pat, content);
        break;
      case kind::strip:
        for (auto& t : toks) {
          std::vector<std::pair<size_t, uint32_t>> cps;  // byte offset, code point
          for (size_t i = 0; i < t.size();) {
            size_t len = 1;
            cps.emplace_back(i, bpe::next_cp(t, i, len));
            i += len;
          }
          size_t a = 0, b = cps.size();
          while (a < start && a < cps.size() && cps[a].second == strip_char) ++a;
          for (size_t s = 0; s < stop && b > a && cps[b - 1].second == strip_char; ++s) --b;
          const size_t from = a < cps.size() ? cps[a].first : t.size();
          const size_t to = b < cps.size() ? cps[b].first : t.size();
          t = to > from ? t.substr(from, to - from) : std::string();
        }
        break;
      case kind::fuse: {
        std::string all;
        for (auto& t : toks) all += t;
        toks.assign(1, std::move(all));
        break;
      }
    }
  }
};

void read_decoder(const json& v, const reader& r, const std::string& path, std::vector<decoder_step>& out) {
  if (v.is_null()) return;
  const std::string t = r.type(v, path);
  decoder_step d{};
  if (t == "Sequence") {
    const json& list = r.get(v, path, "decoders");
    if (!list.is_array()) r.fail(path + ".decoders", "must be a list");
    for (size_t i = 0; i < list.size(); ++i) read_decoder(list[i], r, path + ".decoders[" + std::to_string(i) + "]", out);
    return;
  }
  if (t == "ByteLevel") d.k = decoder_step::kind::byte_level;
  else if (t == "ByteFallback") d.k = decoder_step::kind::byte_fallback;
  else if (t == "Fuse") d.k = decoder_step::kind::fuse;
  else if (t == "Metaspace") {
    d.k = decoder_step::kind::metaspace;
    d.replacement = utf8(r.one_char(v, path, "replacement"));
    if (v.contains("prepend_scheme")) {
      const std::string s = r.str(v, path, "prepend_scheme");
      if (s != "always" && s != "first" && s != "never") r.unsupported(path + ".prepend_scheme", s, "always, first, never");
      d.prepend = s != "never";
    } else {
      d.prepend = r.flag(v, path, "add_prefix_space", true);
    }
  } else if (t == "Replace") {
    d.k = decoder_step::kind::replace;
    d.pat = pattern::read(r.get(v, path, "pattern"), r, path + ".pattern");
    d.content = r.str(v, path, "content");
  } else if (t == "Strip") {
    d.k = decoder_step::kind::strip;
    d.strip_char = r.one_char(v, path, "content");
    auto count = [&](const char* key) {
      const json& n = r.get(v, path, key);
      if (!n.is_number_unsigned()) r.fail(path + "." + key, "must be a count >= 0, got " + n.dump());
      return n.get<size_t>();
    };
    d.start = count("start");
    d.stop = count("stop");
  } else {
    r.unsupported(path + ".type", t, "Sequence, ByteLevel, ByteFallback, Metaspace, Replace, Strip, Fuse");
  }
  out.push_back(std::move(d));
}

// ---------------------------------------------------------------------------------------------
// The tokenizer

constexpr int64_t k_max_vocab = 10'000'000;

struct added_token {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip, normalized;
};

class hf_tokenizer final : public tokenizer {
 public:
  explicit hf_tokenizer(const std::string& path) : r_{path} {
    std::ifstream f(path);
    if (!f) throw std::runtime_error(path + ": cannot open tokenizer.json");
    json j;
    try {
      j = json::parse(f);
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ": not valid JSON: " + e.what());
    }
    if (!j.is_object()) r_.fail("(top level)", "must be an object (a tokenizers tokenizer.json)");
    read_model(r_.get(j, "", "model"), "model");
    if (j.contains("normalizer")) read_normalizer(j["normalizer"], r_, "normalizer", normalizers_);
    if (j.contains("pre_tokenizer")) read_pre_tokenizer(j["pre_tokenizer"], r_, "pre_tokenizer", pre_tokenizers_);
    if (j.contains("decoder")) read_decoder(j["decoder"], r_, "decoder", decoders_);
    if (j.contains("post_processor")) read_post_processor(j["post_processor"], "post_processor");
    if (j.contains("added_tokens")) read_added_tokens(j["added_tokens"], "added_tokens");
    for (const char* key : {"truncation", "padding"})
      if (j.contains(key) && !j[key].is_null())
        r_.fail(key, "is set; flowrun truncates and pads itself: save the tokenizer with it null");
    for (int32_t id : prefix_)
      if (id >= vocab_size() || id_to_token_[id].empty())
        r_.fail("post_processor", "puts id " + std::to_string(id) + " before the text; it is not in the vocabulary");
    for (int32_t id : suffix_)
      if (id >= vocab_size() || id_to_token_[id].empty())
        r_.fail("post_processor", "puts id " + std::to_string(id) + " after the text; it is not in the vocabulary");
    read_config(fs::path(path).parent_path() / "tokenizer_config.json");
  }

  std::vector<int32_t> encode(const std::string& text, bool add_bos, bool add_eos) const override {
    std::vector<int32_t> out;
    if (add_bos) {
      if (!prefix_.empty()) out.insert(out.end(), prefix_.begin(), prefix_.end());
      else if (bos_ >= 0) out.push_back(bos_);
    }
    // added tokens matched in the raw text, then in each normalized gap
    bool first = true;
    for (auto& [gap, id] : find_added(text, raw_added_)) {
      if (id >= 0) {
        out.push_back(id);
        first = false;
        continue;
      }
      const std::string norm = normalize(gap);
      bool gap_first = first;
      for (auto& [piece, id2] : find_added(norm, normalized_added_)) {
        if (id2 >= 0) out.push_back(id2);
        else encode_piece(piece, gap_first, out);
        gap_first = false;
      }
      first = false;
    }
    if (add_eos) {
      if (!suffix_.empty()) out.insert(out.end(), suffix_.begin(), suffix_.end());
      else if (eos_ >= 0) out.push_back(eos_);
    }
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<std::string> toks;
    for (int32_t id : ids) {
      if (id == bos_ || id == eos_ || id == pad_ || id < 0 || id >= vocab_size()) continue;
      if (!id_to_token_[id].empty()) toks.push_back(id_to_token_[id]);
    }
    if (decoders_.empty()) {  // tokenizers joins with spaces when the file has no decoder
      std::string s;
      for (size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
      return s;
    }
    for (const auto& d : decoders_) d.apply(toks);
    std::string s;
    for (auto& t : toks) s += t;
    return s;
  }

  std::string piece(int32_t id) const override { return id >= 0 && id < vocab_size() ? id_to_token_[id] : std::string(); }
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int32_t pad_id() const override { return pad_; }
  bool adds_bos() const override { return !prefix_.empty(); }

 private:
  void set_token(const std::string& tok, int64_t id, const std::string& path) {
    // 10M: far above any real vocabulary (Gemma's 256K), and a bound on the id -> token table
    if (id < 0 || id >= k_max_vocab)
      r_.fail(path, "id " + std::to_string(id) + " of \"" + tok + "\" is out of range [0, 10000000)");
    if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(static_cast<size_t>(id) + 1);
    id_to_token_[id] = tok;
  }

  void read_model(const json& m, const std::string& path) {
    const std::string t = m.is_object() && !m.contains("type") && m.contains("merges") ? std::string("BPE") : r_.type(m, path);
    if (t != "BPE")
      r_.unsupported(path + ".type", t, "BPE (byte-level as GPT-2 / Llama 3 / Qwen2, or with byte_fallback as Llama 2 / Mistral)");
    if (m.contains("dropout") && !m["dropout"].is_null() && !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
      r_.fail(path + ".dropout", "is " + m["dropout"].dump() + "; only null (no BPE dropout) is supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty()))
        r_.fail(path + "." + key, "is " + m[key].dump() + "; only null is supported");
    fuse_unk_ = r_.flag(m, path, "fuse_unk", false);
    byte_fallback_ = r_.flag(m, path, "byte_fallback", false);
    ignore_merges_ = r_.flag(m, path, "ignore_merges", false);
    const json& vocab = r_.get(m, path, "vocab");
    if (!vocab.is_object() || vocab.empty()) r_.fail(path + ".vocab", "must be a non-empty {token: id} object");
    for (auto& [tok, id] : vocab.items()) {
      if (!id.is_number_integer()) r_.fail(path + ".vocab[\"" + tok + "\"]", "must be an integer id, got " + id.dump());
      const int64_t i = id.get<int64_t>();
      if (i >= 0 && static_cast<size_t>(i) < id_to_token_.size() && !id_to_token_[i].empty())
        r_.fail(path + ".vocab[\"" + tok + "\"]", "id " + std::to_string(i) + " is also \"" + id_to_token_[i] +
                                                     "\"'s; each token of model.vocab needs an id of its own");
      set_token(tok, i, path + ".vocab[\"" + tok + "\"]");
      vocab_[tok] = static_cast<int32_t>(i);
    }
    if (m.contains("unk_token") && !m["unk_token"].is_null()) {
      const std::string unk = r_.str(m, path, "unk_token");
      auto it = vocab_.find(unk);
      if (it == vocab_.end()) r_.fail(path + ".unk_token", "\"" + unk + "\" is not in model.vocab");
      unk_ = it->second;
      unk_token_ = unk;  // spelled by name: an added token may reuse its id (read_added_tokens)
    }
    const json& merges = r_.get(m, path, "merges");
    if (!merges.is_array()) r_.fail(path + ".merges", "must be a list");
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& mg = merges[i];
      const std::string at = path + ".merges[" + std::to_string(i) + "]";
      std::string a, b;
      if (mg.is_string()) {  // "a b" (tokenizers < 0.20)
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
          r_.fail(at, "must be two tokens separated by one space, got \"" + s + "\"");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {  // [a, b]
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      } else {
        r_.fail(at, "must be \"a b\" or [\"a\", \"b\"], got " + mg.dump().substr(0, 80));
      }
      for (const std::string* s : std::initializer_list<const std::string*>{&a, &b, nullptr}) {
        const std::string tok = s ? *s : a + b;
        if (!vocab_.count(tok)) r_.fail(at, "\"" + tok + "\" is not in model.vocab (vocab and merges do not belong together)");
      }
      ranks_.emplace(bpe::pair_key(a, b), static_cast<int32_t>(i));
    }
  }

  void read_added_tokens(const json& list, const std::string& path) {
    if (!list.is_array()) r_.fail(path, "must be a list");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string at = path + "[" + std::to_string(i) + "]";
      const json& t = list[i];
      const json& id = r_.get(t, at, "id");
      if (!id.is_number_integer()) r_.fail(at + ".id", "must be an integer, got " + id.dump());
      set_token(r_.str(t, at, "content"), id.get<int64_t>(), at + ".id");  // checks the range
      added_token a{r_.str(t, at, "content"), id.get<int32_t>(), r_.flag(t, at, "special", false),
                    r_.flag(t, at, "lstrip", false), r_.flag(t, at, "rstrip", false), r_.flag(t, at, "normalized", false)};
      if (a.content.empty()) r_.fail(at + ".content", "is empty");
      if (r_.flag(t, at, "single_word", false)) r_.fail(at + ".single_word", "true is not supported (only false)");
      if (a.normalized) {  // matched in the normalized text: its content normalized the same way
        a.content = normalize(a.content);
        if (a.content.empty()) r_.fail(at + ".content", "is empty once normalized");
        normalized_added_.push_back(a);
      } else {
        raw_added_.push_back(a);
      }
      added_by_content_[list[i]["content"].get<std::string>()] = a.id;
    }
  }

  void read_post_processor(const json& v, const std::string& path) {
    if (v.is_null()) return;
    const std::string t = r_.type(v, path);
    if (t == "Sequence") {
      const json& list = r_.get(v, path, "processors");
      if (!list.is_array()) r_.fail(path + ".processors", "must be a list");
      for (size_t i = 0; i < list.size(); ++i) read_post_processor(list[i], path + ".processors[" + std::to_string(i) + "]");
    } else if (t == "ByteLevel") {
      // offsets only; the ids are unchanged
    } else if (t == "TemplateProcessing") {
      if (have_template_) r_.fail(path, "is a second TemplateProcessing; one is supported");
      have_template_ = true;
      const json& single = r_.get(v, path, "single");
      const json& specials = r_.get(v, path, "special_tokens");
      if (!single.is_array()) r_.fail(path + ".single", "must be a list");
      bool seen_a = false;
      for (size_t i = 0; i < single.size(); ++i) {
        const std::string at = path + ".single[" + std::to_string(i) + "]";
        const json& piece = single[i];
        if (piece.is_object() && piece.contains("Sequence")) {
          const std::string seq = r_.str(piece["Sequence"], at + ".Sequence", "id");
          if (seq != "A" || seen_a) r_.fail(at + ".Sequence.id", "must be \"A\", once (the single-text template)");
          seen_a = true;
        } else if (piece.is_object() && piece.contains("SpecialToken")) {
          const std::string name = r_.str(piece["SpecialToken"], at + ".SpecialToken", "id");
          const std::string sp = path + ".special_tokens[\"" + name + "\"]";
          if (!specials.is_object() || !specials.contains(name)) r_.fail(sp, "is missing (named by " + at + ")");
          const json& ids = r_.get(specials[name], sp, "ids");
          if (!ids.is_array()) r_.fail(sp + ".ids", "must be a list of ids");
          for (auto& id : ids) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= k_max_vocab)
              r_.fail(sp + ".ids", "must be a list of ids, got " + ids.dump());
            (seen_a ? suffix_ : prefix_).push_back(id.get<int32_t>());
          }
        } else {
          r_.fail(at, "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}, got " + piece.dump().substr(0, 80));
        }
      }
      if (!seen_a) r_.fail(path + ".single", "has no {\"Sequence\": {\"id\": \"A\"}}");
    } else {
      r_.unsupported(path + ".type", t, "TemplateProcessing, ByteLevel, Sequence");
    }
  }

  // bos/eos/pad: tokenizer_config.json's bos_token / eos_token / pad_token ("<s>" or {"content": "<s>"});
  // without the file or the key, BOS is the template's one leading token and there is no EOS or pad.
  void read_config(const fs::path& cfg_path) {
    if (prefix_.size() == 1) bos_ = prefix_[0];
    if (suffix_.size() == 1) eos_ = suffix_[0];
    if (!fs::exists(cfg_path)) return;
    const std::string where = cfg_path.string();
    std::ifstream f(cfg_path);
    json cfg;
    try {
      cfg = json::parse(f);
    } catch (const std::exception& e) {
      throw std::runtime_error(where + ": not valid JSON: " + e.what());
    }
    auto resolve = [&](const char* key, int32_t& out) {
      if (!cfg.contains(key)) return;
      const json& v = cfg[key];
      if (v.is_null()) {
        out = -1;
        return;
      }
      std::string tok;
      if (v.is_string()) tok = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string()) tok = v["content"].get<std::string>();
      if (tok.empty()) throw std::runtime_error(where + ": " + key + " must be a token string or {\"content\": ...}");
      if (auto a = added_by_content_.find(tok); a != added_by_content_.end()) out = a->second;
      else if (auto m = vocab_.find(tok); m != vocab_.end()) out = m->second;
      else throw std::runtime_error(where + ": " + key + " \"" + tok + "\" is not in the tokenizer.json beside it");
    };
    resolve("bos_token", bos_);
    resolve("eos_token", eos_);
    resolve("pad_token", pad_);
  }

  // Split `s` at the leftmost-longest occurrences of `tokens` (added_vocabulary.rs find_matches):
  // (text, -1) for a gap, (content, id) for a token, lstrip / rstrip taking the whitespace beside it.
  static std::vector<std::pair<std::string, int32_t>> find_added(const std::string& s, const std::vector<added_token>& tokens) {
    std::vector<std::pair<std::string, int32_t>> out;
    size_t start = 0, search = 0;
    // each token's next occurrence at or after `search`: found again only once passed, so a text is
    // scanned once per token however many tokens it holds
    std::vector<size_t> next(tokens.size(), 0);
    for (size_t k = 0; k < tokens.size(); ++k) next[k] = s.find(tokens[k].content);
    while (!tokens.empty()) {
      size_t best = std::string::npos;
      const added_token* hit = nullptr;
      for (size_t k = 0; k < tokens.size(); ++k) {
        if (next[k] != std::string::npos && next[k] < search) next[k] = s.find(tokens[k].content, search);
        const size_t at = next[k];
        if (at == std::string::npos) continue;
        if (at < best || (at == best && tokens[k].content.size() > hit->content.size())) {
          best = at;
          hit = &tokens[k];
        }
      }
      if (!hit) break;
      size_t b = best, e = best + hit->content.size();
      search = e;
      if (hit->lstrip) {
        size_t nb = b;
        while (nb > start) {  // step back over whitespace characters
          size_t k = nb - 1;
          while (k > start && (static_cast<unsigned char>(s[k]) & 0xc0) == 0x80) --k;
          size_t len = 1;
          if (!is_white_space(bpe::next_cp(s, k, len))) break;
          nb = k;
        }
        b = nb;
      }
      if (hit->rstrip) {
        while (e < s.size()) {
          size_t len = 1;
          if (!is_white_space(bpe::next_cp(s, e, len))) break;
          e += len;
        }
      }
      if (start < b) out.emplace_back(s.substr(start, b - start), -1);
      out.emplace_back(hit->content, hit->id);
      start = e;
      search = std::max(search, e);
    }
    if (start < s.size() || out.empty()) out.emplace_back(s.substr(start), -1);
    return out;
  }

  // The normalizers in order. A text that grows past 32 times its size (+ 4 KiB) is refused: no real
  // normalizer does that (NFKC's largest expansion is 18 characters for U+FDFA), and a chain of Replace
  // steps could grow it exponentially.
  std::string normalize(const std::string& text) const {
    std::string s = text;
    const size_t limit = 32 * text.size() + 4096;
    for (size_t i = 0; i < normalizers_.size(); ++i) {
      s = normalizers_[i].apply(s);
      if (s.size() > limit)
        throw std::runtime_error(r_.file + ": normalizer step " + std::to_string(i + 1) + " grows a text of " +
                                 std::to_string(text.size()) + " bytes to " + std::to_string(s.size()) +
                                 "; refusing (a Replace that inserts more than it removes?)");
    }
    return s;
  }

  // A gap of text without added tokens: pre-tokenize, then BPE each piece.
  void encode_piece(const std::string& text, bool first, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::vector<split_piece> pieces{{text, first}};
    for (const auto& p : pre_tokenizers_) p.apply(pieces);
    for (const auto& p : pieces) encode_word(p.text, out);
  }

  // models/bpe/model.rs tokenize + merge_word: characters (or their <0xNN> bytes, or unk) merged by rank
  void encode_word(const std::string& word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      if (auto it = vocab_.find(word); it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = cache_.find(word); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<std::string> sym;
    bool pending_unk = false;
    auto flush_unk = [&] {
      if (pending_unk) sym.push_back(unk_token_);
      pending_unk = false;
    };
    for (size_t i = 0; i < word.size();) {
      size_t len = 1;
      bpe::next_cp(word, i, len);
      const std::string c = word.substr(i, len);
      i += len;
      if (vocab_.count(c)) {
        flush_unk();
        sym.push_back(c);
        continue;
      }
      if (byte_fallback_) {
        std::vector<std::string> bytes;
        for (unsigned char b : c) {
          char name[8];
          std::snprintf(name, sizeof name, "<0x%02X>", b);
          if (!vocab_.count(name)) break;
          bytes.emplace_back(name);
        }
        if (bytes.size() == c.size()) {
          // tokenizers adds the byte tokens without first flushing a pending unk (model.rs merge_word)
          for (auto& b : bytes) sym.push_back(std::move(b));
          continue;
        }
      }
      if (unk_ < 0)
        throw std::runtime_error(r_.file + ": \"" + c + "\" (in \"" + word + "\") is not in model.vocab and the model has "
                                 "no unk_token or byte_fallback to spell it");
      if (pending_unk && !fuse_unk_) flush_unk();
      pending_unk = true;
    }
    flush_unk();
    bpe::merge(sym, ranks_);
    std::vector<int32_t> ids;
    ids.reserve(sym.size());
    for (const auto& s : sym) ids.push_back(vocab_.at(s));  // merges were checked against the vocab
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_.size() > 100000) cache_.clear();
    if (word.size() < 256) cache_.emplace(word, std::move(ids));
  }

  reader r_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  bpe::ranks_map ranks_;
  int32_t unk_ = -1;
  std::string unk_token_;  // model.unk_token
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::vector<normalizer> normalizers_;
  std::vector<pre_tokenizer> pre_tokenizers_;
  std::vector<decoder_step> decoders_;
  std::vector<added_token> raw_added_, normalized_added_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  bool have_template_ = false;
  std::vector<int32_t> prefix_, suffix_;
  int32_t bos_ = -1, eos_ = -1, pad_ = -1;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace

std::unique_ptr<tokenizer> load_hf_tokenizer(const std::string& path) {
  if (!fs::exists(path)) throw std::runtime_error(path + ": tokenizer.json not found");
  return std::make_unique<hf_tokenizer>(path);
}

}  // namespace flowrun
