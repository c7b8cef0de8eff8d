// Language-model data processing, as TencentPretrain's LM target: documents
// are tokenized (BOS first, as llama2.c's pretokenization), concatenated and
// cut into instances of seq_length + 1 tokens; ids = instance[:-1], targets =
// instance[1:]. A held-out share of the instances gives a validation loss.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/tokenizer.h"
#include "runtime/tensor/tensor.h"

namespace flowrun {

/// How a text file holds its documents.
enum class document_split {
  blank_lines,  ///< separated by blank lines (TinyStories', llm.c's), a document's lines joined with '\n'
  lines,        ///< one a line (TencentPretrain's `lm` data processor, LmDataset)
};

/// Split text into documents: at blank lines (TinyStories' separator; lines are kept with their
/// newlines), or one a line. A CRLF line ends as an LF one; leading/trailing whitespace of each
/// document is trimmed, and blank ones are dropped.
std::vector<std::string> split_documents(const std::string& text, document_split how = document_split::blank_lines);

class lm_dataset {
 public:
  /// Tokenize `path` (a UTF-8 text file) into instances of seq_length + 1 tokens.
  /// `val_fraction` of the instances (at least one) are held out from the end.
  /// Throws std::runtime_error naming the file when it cannot be read, is a folder, is not
  /// UTF-8 text (a NUL or a malformed sequence: a binary file; its line and byte named), or is too short for one
  /// training and one validation instance.
  /// `how`: the file's documents (split_documents), each tokenized with a BOS first.
  lm_dataset(const std::string& path, const tokenizer& tok, int64_t seq_length, double val_fraction = 0.05,
             document_split how = document_split::blank_lines);

  int64_t seq_length() const { return T_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_train() const { return n_train_; }
  int64_t num_val() const { return n_val_; }

  /// The next training batch: ids, targets (B, T) i32. Instances are visited in a
  /// seeded random order, reshuffled each epoch; deterministic for a seed.
  void next_batch(int64_t B, tensor& ids, tensor& targets);
  /// Validation batch i (instances i*B .. i*B+B-1 of the held-out share, wrapping).
  void val_batch(int64_t i, int64_t B, tensor& ids, tensor& targets) const;
  void set_seed(uint64_t seed);
  /// Position in the data (for checkpoints): epoch and cursor.
  int64_t epoch() const { return epoch_; }
  int64_t cursor() const { return cursor_; }
  /// Resume at a saved position (epoch, cursor): the next batch is the one that
  /// followed when they were read. Throws std::invalid_argument when out of range.
  void set_position(int64_t epoch, int64_t cursor);

 private:
  void fill(int64_t instance, int32_t* ids, int32_t* targets) const;
  void shuffle();
  std::vector<int32_t> tokens_;
  int64_t T_ = 0, n_train_ = 0, n_val_ = 0;
  std::vector<int64_t> order_;
  uint64_t seed_ = 1;
  int64_t epoch_ = 0, cursor_ = 0;
};

}  // namespace flowrun
