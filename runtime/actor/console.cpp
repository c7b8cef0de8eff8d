#include "runtime/actor/console.h"

#include <cstdio>
#include <mutex>

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

}  // namespace flowrun::actor::console
