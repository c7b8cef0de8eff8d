// The pieces of byte-pair encoding shared by the two BPE readers: GPT-2's vocab.json +
// merges.txt (models/bpe_tokenizer.cpp, where these are defined) and Hugging Face's
// tokenizer.json (models/hf_tokenizer.cpp); and the special-token handling that the GPT-2 reader
// and SentencePiece in an HF folder (models/tokenizer.cpp) share. Internal to models/: not a
// public API.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace flowrun::bpe {

/// One code point of UTF-8 `s` at byte i, its byte length in `len`. Invalid UTF-8 (a stray
/// byte, an overlong or surrogate form) decodes as U+FFFD of length 1.
uint32_t next_cp(std::string_view s, size_t i, size_t& len);
/// Append code point `cp` to `out` as UTF-8.
void append_utf8(std::string& out, uint32_t cp);
/// `bytes` as text the way Rust's String::from_utf8_lossy does (what the `tokenizers` package
/// returns): each maximal invalid subsequence becomes one U+FFFD (Unicode 15 §3.9 "U+FFFD
/// substitution of maximal subparts").
std::string utf8_lossy(std::string_view bytes);

/// A token entry of tokenizer_config.json / special_tokens_map.json: "<s>" or {"content": "<s>", ...}
/// (an AddedToken); "" for anything else.
std::string token_content(const nlohmann::json& v);

/// Cut `text` at the special tokens `specials` (content, id), as transformers does before the model
/// encodes: at each step the earliest occurrence, the longest one there, whose id goes into `out`;
/// `ordinary(piece, first)` encodes each non-empty text between them into `out` (first: no special
/// token came before it).
void split_at_specials(std::string_view text, const std::vector<std::pair<std::string, int32_t>>& specials,
                       const std::function<void(std::string_view piece, bool first)>& ordinary,
                       std::vector<int32_t>& out);

/// GPT-2's bytes_to_unicode() (OpenAI gpt-2 src/encoder.py): printable Latin-1 bytes map to
/// themselves, the other 68 bytes to U+0100 onwards in byte order. enc[b] is the UTF-8 of
/// byte b's code point; dec maps a code point back to its byte.
struct byte_alphabet {
  std::string enc[256];
  std::unordered_map<uint32_t, uint8_t> dec;
};
const byte_alphabet& bytes_to_unicode();

/// Split `text` (no special tokens in it) with GPT-2's pre-tokenizer regex
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
/// (also the `tokenizers` ByteLevel pre-tokenizer's with use_regex). Returns [begin, end) byte ranges
/// that cover the text in order.
std::vector<std::pair<size_t, size_t>> gpt2_pretokenize(std::string_view text);

/// Merge ranks: pair_key(a, b) -> rank (0 = merged first).
using ranks_map = std::unordered_map<std::string, int32_t>;
/// The key of merge (a, b) in a ranks_map; unambiguous for symbols holding spaces.
std::string pair_key(std::string_view a, std::string_view b);

/// Apply BPE merges to `symbols` in place: repeatedly merge the adjacent pair of the lowest
/// rank, its leftmost occurrence first, until no adjacent pair has a rank. This is encoder.py's
/// bpe() (which merges every occurrence of the best pair left to right) and the `tokenizers`
/// BPE model's merge_all (a queue ordered by rank, then position); a heap makes it
/// O(n log n) in the symbols, so a long unsplit word (Llama 2 has no pre-tokenizer) stays fast.
void merge(std::vector<std::string>& symbols, const ranks_map& ranks);

}  // namespace flowrun::bpe
