// Layer 5, actor runtime: standard output and the progress line, side by side.
//
// Node output (node_context::print) goes to standard output; the progress
// line lives on standard error, redrawn in place with '\r'. Both go through
// one lock so that a printed line never lands in the middle of the progress
// line on a terminal.
#pragma once

#include <memory>
#include <string_view>

namespace spdlog::sinks {
class sink;
}

namespace flowrun::actor::console {

/// Writes `line` and '\n' to standard output (clearing the progress line first if one is shown).
void print(std::string_view line);

/// Shows `line` as the progress line on standard error (replacing the previous one).
void progress(std::string_view line);

/// Erases the progress line, if one is shown.
void clear_progress();

/// An spdlog sink for standard error (colored on a terminal, as spdlog's
/// stderr_color_sink) that takes the same lock as print() and progress() and
/// erases the progress line before each log line, so that log lines never land
/// inside it; the next progress() draws it again below them. The programs'
/// loggers use it (tools/flowrun). Thread-safe.
std::shared_ptr<spdlog::sinks::sink> log_sink();

}  // namespace flowrun::actor::console
