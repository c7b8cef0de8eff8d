// TensorBoard event files: one file per run (per node, in flowrun: docs/console.md,
// "TensorBoard"), read by `tensorboard --logdir` and by the tensorboard Python package
// (EventAccumulator, summary_iterator). The records are TensorBoard's Event messages
// (tensorboard_event.proto) in TFRecord framing (tfrecord.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/actor/expected.h"

namespace flowrun::tensorboard {

/// The file_version of the first record, as TensorFlow and TensorBoard write it.
inline constexpr std::string_view file_version = "brain.Event:2";

/// Seconds since the Unix epoch, now (an Event's wall_time).
double wall_time_now();

/// An open event file. Each write is one record, flushed to the operating system before it
/// returns, so a crash of the process loses nothing written. Not thread-safe.
class event_writer {
 public:
  /// Creates `dir` (with its parents) and a new event file in it, named as TensorBoard's
  /// writers name theirs: events.out.tfevents.<Unix seconds, 10 digits>.<host name>.<pid>
  /// (".1", ".2", ... appended when that name exists), and writes its first record: the
  /// file_version event at `wall_time`. An error (as a value) names `dir` or the file and
  /// the system's reason (e.g. "Permission denied", "Not a directory").
  ///
  /// When `dir` already holds event files (the job was interrupted and resumed, or run again
  /// into the same tensorboard_path), the first scalar is preceded by a SessionLog START event
  /// at its step S: TensorBoard's reader (EventAccumulator's purge_orphaned_data, on by
  /// default) then drops the earlier files' events at steps >= S, so a step the interrupted
  /// run wrote after its last checkpoint, and this run writes again, shows once, with this
  /// run's value. It is what PyTorch's SummaryWriter(purge_step = S) writes.
  static actor::expected<event_writer> open(const std::filesystem::path& dir, double wall_time = wall_time_now());

  /// Appends one scalar: Summary.Value{tag, simple_value} (TensorBoard stores float32, so
  /// `value` is rounded to the nearest float) at `step` and `wall_time` (seconds since the
  /// epoch). Returns nullopt when written, else the error naming the file.
  std::optional<std::string> scalar(std::string_view tag, double value, std::int64_t step,
                                    double wall_time = wall_time_now());

  /// The event file.
  const std::filesystem::path& path() const { return path_; }
  /// Whether `dir` held other event files when this one was opened (see open).
  bool follows_earlier_run() const { return purge_pending_ || purged_; }

 private:
  event_writer(std::filesystem::path path, std::FILE* f) : path_(std::move(path)), file_(f, &std::fclose) {}
  std::optional<std::string> write(const std::string& event_bytes);

  std::filesystem::path path_;
  bool purge_pending_ = false;  // the folder held earlier event files: START before the first scalar
  bool purged_ = false;         // that START was written
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_;
};

}  // namespace flowrun::tensorboard
