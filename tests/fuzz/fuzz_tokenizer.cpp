// Fuzz target: tokenizer input (models/tokenizer.h, models/bpe_tokenizer.cpp):
// the GPT-2 byte-level BPE of tests/fixtures/bpe encodes arbitrary bytes (not
// necessarily UTF-8) and decodes arbitrary ids (out of range, negative,
// special). Checks beyond "no crash": every id encode returns is in
// [0, vocab_size), and decoding the ids of valid UTF-8 gives the text back (when
// no BOS, EOS or pad id is among them: decode skips those).
//
// Input: the first byte picks the mode (encode with/without BOS/EOS, or
// decode the rest read as little-endian int32 ids); the rest is the text/ids.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "models/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;

namespace {
bool valid_utf8(const std::string& s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (std::size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = cp << 6 | (d & 0x3f);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n;
  }
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto tok =
      load_gpt2_bpe(FLOWRUN_FIXTURES_DIR "/bpe/vocab.json", FLOWRUN_FIXTURES_DIR "/bpe/merges.txt");
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode & 0x80) {
    std::vector<std::int32_t> ids(rest.size() / 4);
    if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
    if (mode & 0x40)  // mostly in-range ids: where the vocabulary's pieces get joined
      for (auto& id : ids) id = static_cast<std::int32_t>(static_cast<std::uint32_t>(id) % (tok->vocab_size() + 2)) - 1;
    (void)tok->decode(ids);
    for (auto id : ids) (void)tok->piece(id);
    return 0;
  }
  const bool bos = mode & 1, eos = mode & 2;
  const std::vector<std::int32_t> ids = tok->encode(rest, bos, eos);
  for (auto id : ids)
    if (id < 0 || id >= tok->vocab_size()) {
      std::fprintf(stderr, "encode returned id %d outside [0, %d)\n", id, tok->vocab_size());
      __builtin_trap();
    }
  bool special = false;  // decode skips BOS, EOS and pad (a text may spell "<|endoftext|>")
  for (auto id : ids) special |= id == tok->bos_id() || id == tok->eos_id() || id == tok->pad_id();
  if (!special && valid_utf8(rest)) {
    const std::string back = tok->decode(ids);
    if (back != rest) {
      std::fprintf(stderr, "decode(encode(text)) != text: %zu bytes in, %zu bytes out\n", rest.size(), back.size());
      __builtin_trap();
    }
  }
  return 0;
}
