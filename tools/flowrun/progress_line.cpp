#include "tools/flowrun/progress_line.h"

#include <unistd.h>

#include <utility>

#include <fmt/format.h>

#include "runtime/actor/console.h"

namespace flowrun::cli {

progress_line::progress_line(std::string tag, std::string what)
    : tag_(std::move(tag)), tty_(isatty(STDERR_FILENO) == 1), t0_(std::chrono::steady_clock::now()) {
  p_.what = std::move(what);
}

progress_line::~progress_line() { clear(); }

double progress_line::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void progress_line::update(std::int64_t done, std::int64_t total, std::string_view counts) {
  // the first report is the loop's start (t 0, nothing done), so the rate counts from there
  p_.done = done;
  p_.total = total;
  p_.t_s = seconds();
  counts_.assign(counts);
  if (!tty_) return;
  if (done >= total) {
    clear();
    return;
  }
  actor::console::progress("[" + tag_ + "] " + text());
}

std::string progress_line::text() const {
  // live_progress::text is "WHAT DONE/TOTAL" and then its ETA (or " done"): `counts` replaces the middle
  const std::string full = p_.text(p_.t_s);
  if (counts_.empty()) return full;
  const std::string head = p_.what + " " + std::to_string(p_.done) + "/" + std::to_string(p_.total);
  return p_.what + " " + counts_ + full.substr(head.size());
}

void progress_line::clear() {
  if (tty_) actor::console::clear_progress();
}

std::string byte_size_text(std::int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= 1000LL * 1000 * 1000) return fmt::format("{:.1f} GB", b / 1e9);
  if (bytes >= 1000LL * 1000) return fmt::format("{:.1f} MB", b / 1e6);
  if (bytes >= 1000) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{} B", bytes);
}

}  // namespace flowrun::cli
