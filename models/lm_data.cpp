#include "models/lm_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "runtime/util/utf8.h"

namespace flowrun {

namespace {
// The offset of the first byte of `s` that is not part of well-formed UTF-8 (RFC 3629: no overlong
// forms, no surrogates, at most U+10FFFF) or is a NUL, else npos.
size_t first_non_text_byte(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = s[i] == '\0' ? 0 : utf8_sequence_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}
}  // namespace

std::vector<std::string> split_documents(const std::string& text, document_split how) {
  std::vector<std::string> docs;
  std::istringstream in(text);
  std::string line, cur;
  auto flush = [&] {
    size_t a = cur.find_first_not_of(" \t\r\n");
    if (a != std::string::npos) {
      size_t b = cur.find_last_not_of(" \t\r\n");
      docs.push_back(cur.substr(a, b - a + 1));
    }
    cur.clear();
  };
  while (std::getline(in, line)) {
    // a CRLF file reads as its LF copy (Python's text mode, which TencentPretrain's and llm.c's readers use, does
    // the same): the \r stayed in every line's text and its tokens
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      flush();
    } else {
      cur += line;
      cur += '\n';
      if (how == document_split::lines) flush();
    }
  }
  flush();
  return docs;
}

lm_dataset::lm_dataset(const std::string& path, const tokenizer& tok, int64_t seq_length, double val_fraction,
                       document_split how)
    : T_(seq_length) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error(path + ": is a folder; the training data is one UTF-8 text file (documents separated by "
                             "blank lines, e.g. data/tinystories/tinystories_train_head.txt)");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open training text");
  std::stringstream ss;
  ss << f.rdbuf();
  // a model file or other binary was tokenized byte by byte and trained on without a word
  if (const size_t at = first_non_text_byte(ss.view()); at != std::string_view::npos)
    throw std::runtime_error(path + ": is not UTF-8 text (line " +
                             std::to_string(1 + std::count(ss.view().begin(), ss.view().begin() + at, '\n')) +
                             ", byte " + std::to_string(at) + ", 0x" +
                             fmt::format("{:02x}", static_cast<unsigned char>(ss.view()[at])) +
                             "): the training data is a text file; a binary (a model, an archive) is no data");
  for (const auto& d : split_documents(ss.str(), how)) {
    auto ids = tok.encode(d, /*add_bos=*/true);
    tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  }
  int64_t n = static_cast<int64_t>(tokens_.size()) / (T_ + 1);
  n_val_ = std::max<int64_t>(1, static_cast<int64_t>(n * val_fraction));
  n_train_ = n - n_val_;
  if (n_train_ < 1)
    throw std::runtime_error(path + ": " + std::to_string(tokens_.size()) + " tokens make " + std::to_string(n) +
                             " instances of seq_length+1 = " + std::to_string(T_ + 1) +
                             "; need at least 2 (one to train, one to validate). Use a longer file or a shorter seq_length.");
  set_seed(1);
}

void lm_dataset::set_seed(uint64_t seed) {
  seed_ = seed;
  epoch_ = 0;
  cursor_ = 0;
  shuffle();
}

void lm_dataset::set_position(int64_t epoch, int64_t cursor) {
  if (epoch < 0 || cursor < 0 || cursor > n_train_)
    throw std::invalid_argument("lm_dataset: position (epoch " + std::to_string(epoch) + ", cursor " +
                                std::to_string(cursor) + ") is outside the data (" + std::to_string(n_train_) +
                                " training instances): the checkpoint was made with other data or seq_length");
  epoch_ = epoch;
  cursor_ = cursor;
  shuffle();
}

void lm_dataset::shuffle() {
  order_.resize(n_train_);
  std::iota(order_.begin(), order_.end(), 0);
  // Fisher–Yates with splitmix64 (platform-independent, unlike std::shuffle)
  uint64_t s = seed_ * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(epoch_) + 1;
  auto next = [&] {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (int64_t i = n_train_ - 1; i > 0; --i) std::swap(order_[i], order_[next() % static_cast<uint64_t>(i + 1)]);
}

void lm_dataset::fill(int64_t instance, int32_t* ids, int32_t* targets) const {
  const int32_t* src = tokens_.data() + instance * (T_ + 1);
  for (int64_t t = 0; t < T_; ++t) {
    ids[t] = src[t];
    targets[t] = src[t + 1];
  }
}

void lm_dataset::next_batch(int64_t B, tensor& ids, tensor& targets) {
  if (!ids.defined() || ids.shape() != shape_t{B, T_}) ids = tensor::empty({B, T_}, dtype::i32);
  if (!targets.defined() || targets.shape() != shape_t{B, T_}) targets = tensor::empty({B, T_}, dtype::i32);
  for (int64_t b = 0; b < B; ++b) {
    if (cursor_ >= n_train_) {
      ++epoch_;
      cursor_ = 0;
      shuffle();
    }
    fill(order_[cursor_++], ids.data<int32_t>() + b * T_, targets.data<int32_t>() + b * T_);
  }
}

void lm_dataset::val_batch(int64_t i, int64_t B, tensor& ids, tensor& targets) const {
  if (!ids.defined() || ids.shape() != shape_t{B, T_}) ids = tensor::empty({B, T_}, dtype::i32);
  if (!targets.defined() || targets.shape() != shape_t{B, T_}) targets = tensor::empty({B, T_}, dtype::i32);
  for (int64_t b = 0; b < B; ++b) {
    int64_t inst = n_train_ + (i * B + b) % n_val_;
    fill(inst, ids.data<int32_t>() + b * T_, targets.data<int32_t>() + b * T_);
  }
}

}  // namespace flowrun
