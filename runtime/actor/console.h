// Layer 5, actor runtime: standard output and the progress line, side by side.
//
// Node output (node_context::print) goes to standard output; the progress
// line lives on standard error, redrawn in place with '\r'. Both go through
// one lock so that a printed line never lands in the middle of the progress
// line on a terminal.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace spdlog::sinks {
class sink;
}

namespace flowrun::actor::console {

/// Writes `line` and '\n' to standard output (clearing the progress line first if one is shown,
/// and drawing it again below the line).
void print(std::string_view line);

/// Shows `line` as the progress line on standard error (replacing the previous one), cut to the
/// terminal's width when standard error is a terminal (fit_width).
void progress(std::string_view line);

/// `line` cut to `columns` - 1 characters (UTF-8 code points, so "·" counts as one) so that it
/// never wraps: a wrapped line is not erased by "\r\033[K". `columns` <= 1 (unknown): unchanged.
std::string fit_width(std::string_view line, int columns);

/// Erases the progress line, if one is shown, and forgets it (log lines after this do not draw it again).
void clear_progress();

/// An spdlog sink for standard error (colored on a terminal, as spdlog's
/// stderr_color_sink) that takes the same lock as print() and progress() and
/// erases the progress line before each log line, so that log lines never land
/// inside it, and draws it again right below the log line (bytes on standard
/// error: "\r\033[K", the log line, then the progress line again). The programs'
/// loggers use it (tools/flowrun). Thread-safe.
std::shared_ptr<spdlog::sinks::sink> log_sink();

}  // namespace flowrun::actor::console
