// Fuzz target: the Hugging Face tokenizer.json reader (models/hf_tokenizer.cpp). A file it does not read
// must be refused with std::runtime_error (naming the file and the JSON path), never another exception or a
// crash; one it reads must encode any bytes to ids in [0, vocab_size) (or refuse a character it cannot spell,
// again with std::runtime_error) and decode any ids.
//
// Input: parts separated by a line "%%": 0 tokenizer.json, 1 the text to encode (default: a mixed-script text
// with digits, whitespace runs and special-token look-alikes).
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& dir = fuzz::scratch_dir("hf_tokenizer");
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), "%%");
  fuzz::write_file(dir / "tokenizer.json", parts[0]);
  std::unique_ptr<tokenizer> tok;
  try {
    tok = load_hf_tokenizer((dir / "tokenizer.json").string());
  } catch (const std::runtime_error&) {
    return 0;
  }
  const std::string text = parts.size() > 1 ? std::string(parts[1])
                                            : std::string("Hello  world\n\n12345 caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 "
                                                          "<s></s><|endoftext|> it's\t\xf0\x9f\x98\x80 \xff");
  std::vector<std::int32_t> ids;
  try {
    ids = tok->encode(text, true, true);
  } catch (const std::runtime_error&) {
    return 0;
  }
  for (auto id : ids)
    if (id < 0 || id >= tok->vocab_size()) {
      std::fprintf(stderr, "encode returned id %d outside [0, %d)\n", id, tok->vocab_size());
      __builtin_trap();
    }
  (void)tok->decode(ids);
  std::vector<std::int32_t> wild = {-1, 0, 1, tok->vocab_size() - 1, tok->vocab_size(), 1 << 30};
  (void)tok->decode(wild);
  for (auto id : wild) (void)tok->piece(id);
  return 0;
}
