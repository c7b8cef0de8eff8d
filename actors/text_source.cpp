// text_source: emits the lines of a text file, one "text" message each.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/message_types.h"
#include "actors/register.h"
#include "runtime/util/assets.h"

namespace flowrun::actors {

namespace {

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

/// Reads `path` (resolved with flowrun::resolve_user_path: as given, else
/// under the asset root) and emits each non-blank line, without its line
/// end. With several replicas, replica r takes lines r, r + R, r + 2R, ...
/// of the non-blank lines, so together they emit the file once. `max_lines`
/// (> 0) caps the lines emitted by the node as a whole. A restarted replica
/// starts again from the top of the file.
///
/// The file is read in 64 KiB blocks with pread and is open only while a
/// block is read: a graph of thousands of sources holds no descriptors
/// (20k sources that each kept an ifstream ran out of them) and no stdio
/// streams (glibc's fclose walks a list of every open stream, so closing N of
/// them cost N^2).
class text_source final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    path_ = resolve_user_path(ctx.spec().get_string("path"), "text file").string();
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("cannot open '" + path_ + "' for reading: " + std::strerror(errno));
    ::close(fd);
    max_lines_ = ctx.spec().get_int("max_lines");
    stride_ = ctx.replicas();
    skip_ = ctx.replica();
  }

  bool produce(actor::node_context& ctx) override {
    std::string line;
    while (next_line(line)) {
      if (blank(line)) continue;
      const std::int64_t index = line_index_++;
      if (max_lines_ > 0 && index >= max_lines_) return false;
      if (static_cast<std::size_t>(index) % stride_ != skip_) continue;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      ctx.metric("lines");
      ctx.emit("lines", actor::payload::make(text_type, std::move(line)));
      return true;
    }
    return false;
  }

 private:
  static constexpr std::size_t block_bytes = 64 * 1024;

  // The next line (without its '\n'; the last one may have none), as std::getline gives it; false at the end.
  // Throws std::runtime_error naming the file when it cannot be opened or read.
  bool next_line(std::string& line) {
    for (;;) {
      if (const auto nl = buf_.find('\n', pos_); nl != std::string::npos) {
        line.assign(buf_, pos_, nl - pos_);
        pos_ = nl + 1;
        return true;
      }
      if (eof_) {
        if (pos_ >= buf_.size()) return false;
        line.assign(buf_, pos_, std::string::npos);
        pos_ = buf_.size();
        return true;
      }
      buf_.erase(0, pos_);
      pos_ = 0;
      const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw std::runtime_error("cannot open '" + path_ + "' for reading: " + std::strerror(errno));
      // A block per thread, not per source: buf_ only ever holds what was read (a short file costs its size).
      thread_local std::vector<char> block(block_bytes);
      ssize_t n;
      do n = ::pread(fd, block.data(), block_bytes, static_cast<off_t>(offset_));
      while (n < 0 && errno == EINTR);
      const int err = errno;
      ::close(fd);
      if (n < 0) throw std::runtime_error("read error in '" + path_ + "': " + std::strerror(err));
      buf_.append(block.data(), static_cast<std::size_t>(n));
      offset_ += static_cast<std::uint64_t>(n);
      eof_ = n == 0;
    }
  }

  std::string path_;
  std::string buf_;          // read but not yet returned, from pos_
  std::size_t pos_ = 0;
  std::uint64_t offset_ = 0;  // file offset of the end of buf_
  bool eof_ = false;
  std::int64_t max_lines_ = 0;
  std::int64_t line_index_ = 0;  // among the non-blank lines of the file
  std::size_t stride_ = 1, skip_ = 0;
};

}  // namespace

std::unique_ptr<actor::node> make_text_source() { return std::make_unique<text_source>(); }

}  // namespace flowrun::actors
