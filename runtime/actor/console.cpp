#include "runtime/actor/console.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace flowrun::actor::console {

namespace {
std::mutex mutex;
bool shown = false;
std::string line_shown;  // the progress line on screen (kept while a log line is written, to draw it again)

void erase_locked() {
  if (!shown) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  shown = false;
}

// After a log or output line: the progress line that was on screen comes back below it at once.
void redraw_locked(bool had_progress) {
  if (!had_progress || line_shown.empty()) return;
  std::fflush(stdout);
  std::fputs("\r\033[K", stderr);
  std::fwrite(line_shown.data(), 1, line_shown.size(), stderr);
  std::fflush(stderr);
  shown = true;
}
}  // namespace

void print(std::string_view line) {
  std::lock_guard<std::mutex> lock(mutex);
  const bool had_progress = shown;
  erase_locked();
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  // Flushed per line: nodes print a line per step at most, and a log file (a
  // cluster node's stdout, say) must show each line as it happens, also when
  // the process is then killed.
  std::fflush(stdout);
  redraw_locked(had_progress);
}

std::string fit_width(std::string_view line, int columns) {
  if (columns <= 1) return std::string(line);
  std::size_t chars = 0, i = 0;
  for (; i < line.size(); ++i) {
    if ((static_cast<unsigned char>(line[i]) & 0xC0) == 0x80) continue;  // a UTF-8 continuation byte
    if (chars == static_cast<std::size_t>(columns - 1)) break;
    ++chars;
  }
  return std::string(line.substr(0, i));
}

void progress(std::string_view full_line) {
  // wider than the terminal, the line would wrap and "\r\033[K" would erase only its last row
  int columns = 0;
  winsize ws{};
  if (isatty(STDERR_FILENO) == 1 && ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0) columns = ws.ws_col;
  const std::string line = fit_width(full_line, columns);
  std::lock_guard<std::mutex> lock(mutex);
  std::fflush(stdout);
  std::fputs("\r\033[K", stderr);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  shown = true;
  line_shown.assign(line);
}

void clear_progress() {
  std::lock_guard<std::mutex> lock(mutex);
  erase_locked();
  line_shown.clear();
}

namespace {

// spdlog's stderr color sink (single-threaded flavour: the console lock serializes it), behind the lock.
class progress_safe_sink final : public spdlog::sinks::sink {
 public:
  void log(const spdlog::details::log_msg& msg) override {
    std::lock_guard<std::mutex> lock(mutex);
    const bool had_progress = shown;
    erase_locked();
    inner_.log(msg);
    inner_.flush();
    redraw_locked(had_progress);
  }
  void flush() override {
    std::lock_guard<std::mutex> lock(mutex);
    inner_.flush();
  }
  void set_pattern(const std::string& pattern) override {
    std::lock_guard<std::mutex> lock(mutex);
    inner_.set_pattern(pattern);
  }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override {
    std::lock_guard<std::mutex> lock(mutex);
    inner_.set_formatter(std::move(f));
  }

 private:
  spdlog::sinks::stderr_color_sink_st inner_;
};

}  // namespace

std::shared_ptr<spdlog::sinks::sink> log_sink() { return std::make_shared<progress_safe_sink>(); }

}  // namespace flowrun::actor::console
