// The progress line of a command that runs one long loop outside a graph (`flowrun eval prompts`,
// `flowrun eval reward`, `flowrun convert`): "[flowrun TAG] WHAT DONE/TOTAL ETA M:SS" on standard
// error, redrawn in place through runtime/actor/console.h (so log lines never land inside it), shown
// only while standard error is a terminal. The ETA and its text are live_progress's
// (runtime/actor/live.h), the one formula of every progress line: the rate since the line was made,
// times the units left.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/actor/live.h"

namespace flowrun::cli {

/// One command's progress line (see above). Not thread-safe: one loop updates it.
class progress_line {
 public:
  /// `tag`: the command ("flowrun eval"); `what`: the loop ("eval reward"); the clock starts now.
  /// The line shows only when standard error is a terminal.
  progress_line(std::string tag, std::string what);
  progress_line(const progress_line&) = delete;
  progress_line& operator=(const progress_line&) = delete;
  /// Erases the line.
  ~progress_line();

  /// `done` of `total` units are done: draws "[TAG] WHAT DONE/TOTAL ETA M:SS DETAIL" while
  /// done < total (the ETA unknown until a unit is done), erases the line once done >= total.
  /// `counts`, when not empty, stands where "DONE/TOTAL" stands (e.g. "tensors 12/291, 0.4/1.1 GB":
  /// the ETA still counts `done` of `total`, e.g. bytes).
  void update(std::int64_t done, std::int64_t total, std::string_view counts = {});
  /// Erases the line before the caller writes to standard output (the next update draws it again).
  void clear();
  /// Seconds since the line was made.
  double seconds() const;
  /// What update() would draw, without the tag ("WHAT DONE/TOTAL ETA M:SS"): for tests and logs.
  std::string text() const;
  /// Whether the line is drawn (standard error is a terminal).
  bool shown() const { return tty_; }

 private:
  std::string tag_, counts_;
  bool tty_ = false;
  std::chrono::steady_clock::time_point t0_;
  actor::live_progress p_;
};

/// "1.2 GB", "340.0 MB", "12.5 kB" (powers of 1000) or "512 B": sizes on progress lines and in logs.
std::string byte_size_text(std::int64_t bytes);

}  // namespace flowrun::cli
