// Standard output captured for a test: the lines a node printed through node_context::print.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace flowrun::test {

/// Redirects file descriptor 1 into a temporary file from construction until lines() or destruction.
class stdout_capture {
 public:
  stdout_capture() : file_(std::tmpfile()) {
    REQUIRE(file_ != nullptr);
    std::fflush(stdout);
    saved_ = ::dup(1);
    ::dup2(::fileno(file_), 1);
  }
  ~stdout_capture() {
    restore();
    std::fclose(file_);
  }
  stdout_capture(const stdout_capture&) = delete;
  stdout_capture& operator=(const stdout_capture&) = delete;
  /// Restores standard output; the captured lines that start with `prefix`.
  std::vector<std::string> lines(const std::string& prefix) {
    restore();
    std::vector<std::string> out;
    std::rewind(file_);
    char buf[4096];
    while (std::fgets(buf, sizeof buf, file_)) {
      std::string l(buf);
      if (!l.empty() && l.back() == '\n') l.pop_back();
      if (l.rfind(prefix, 0) == 0) out.push_back(l);
    }
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stdout);
    ::dup2(saved_, 1);
    ::close(saved_);
    saved_ = -1;
  }
  std::FILE* file_;
  int saved_ = -1;
};

}  // namespace flowrun::test
