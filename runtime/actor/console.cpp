#include "runtime/actor/console.h"

#include <cstdio>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace flowrun::actor::console {

namespace {
std::mutex mutex;
bool shown = false;

void erase_locked() {
  if (!shown) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  shown = false;
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
  (void)had_progress;
  std::fflush(stdout);
}

void progress(std::string_view line) {
  std::lock_guard<std::mutex> lock(mutex);
  std::fflush(stdout);
  std::fputs("\r\033[K", stderr);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  shown = true;
}

void clear_progress() {
  std::lock_guard<std::mutex> lock(mutex);
  erase_locked();
}

namespace {

// spdlog's stderr color sink (single-threaded flavour: the console lock serializes it), behind the lock.
class progress_safe_sink final : public spdlog::sinks::sink {
 public:
  void log(const spdlog::details::log_msg& msg) override {
    std::lock_guard<std::mutex> lock(mutex);
    erase_locked();
    inner_.log(msg);
    inner_.flush();
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
