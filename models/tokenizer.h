// Tokenizers behind one interface: SentencePiece (LLaMA, via the SentencePiece
// library) now; GPT-2 byte-level BPE (GPT-2, OPT) joins behind the same interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flowrun {

class tokenizer {
 public:
  virtual ~tokenizer() = default;
  /// Token ids of `text` (no BOS/EOS unless asked).
  virtual std::vector<int32_t> encode(const std::string& text, bool add_bos = false, bool add_eos = false) const = 0;
  /// Text of `ids`; BOS, EOS and pad ids are skipped.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  /// The piece string of one id (for debugging and tests).
  virtual std::string piece(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  /// -1 when the model has no pad token.
  virtual int32_t pad_id() const = 0;
};

/// Load a SentencePiece .model file. Throws std::runtime_error naming the file.
std::unique_ptr<tokenizer> load_sentencepiece(const std::string& path);

/// Load by file type: *.model → SentencePiece. Throws std::runtime_error with a hint otherwise.
std::unique_ptr<tokenizer> load_tokenizer(const std::string& path);

}  // namespace flowrun
