// Whether an output path can be written, asked before the work that would write it.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>

#include <fcntl.h>
#include <unistd.h>

namespace flowrun {

/// What an output path names: a file, a folder, or either (a model output: a llama2.c file or a folder).
enum class output_kind { file, folder, either };

/// Why `path` (of `kind`; it may not exist yet) cannot be written, or "" when it can. A symbolic link
/// to nothing is refused but for a `file`, and so is a `folder` that exists as a file ("'PATH' is a
/// file, not a folder"): both passed and failed at the first save, after the training before it
/// (a checkpoint_dir). The nearest existing folder at or
/// above what must be created has to be a folder in which a file can be created: checked by creating and
/// removing an empty probe file there (".flowrun-write-probe-PID-N", N counting the calls of the
/// process), since access(W_OK) says yes to root on a read-only mount or /proc. The reason reads
/// "'FOLDER' (where 'PATH' would be created) is not writable (ERROR)" or "'X' (above the output 'PATH')
/// is not a folder".
inline std::string unwritable_reason(const std::string& path, output_kind kind) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path probe = fs::absolute(path, ec);
  if (ec) return "'" + path + "' is not a usable path (" + ec.message() + ")";
  // a symbolic link to nothing: exists() says no, the walk up found its writable folder, and the save failed with
  // "File exists" after the training before it
  // (a file is written beside it and renamed over the link: that works)
  if (kind != output_kind::file && fs::is_symlink(fs::symlink_status(probe, ec)) && !fs::exists(probe, ec))
    return "'" + path + "' is a symbolic link to '" + fs::read_symlink(probe, ec).string() +
           "', which does not exist: create its target, or give the output another path";
  if (kind == output_kind::folder && fs::exists(probe, ec) && !fs::is_directory(probe, ec))
    return "'" + path + "' is a file, not a folder";
  if (kind == output_kind::file || !fs::is_directory(probe, ec)) probe = probe.parent_path();
  while (!probe.empty() && !fs::exists(probe, ec) && probe != probe.root_path()) probe = probe.parent_path();
  if (!fs::is_directory(probe, ec)) return "'" + probe.string() + "' (above the output '" + path + "') is not a folder";
  // unique per call: threads of one process probe at once (a node's replicas check their output together,
  // and O_EXCL failed the second with "File exists")
  static std::atomic<std::uint64_t> calls{0};
  const fs::path f = probe / (".flowrun-write-probe-" + std::to_string(::getpid()) + "-" + std::to_string(++calls));
  const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const std::string why = std::error_code(errno, std::generic_category()).message();
    return "'" + probe.string() + "' (where '" + path + "' would be created) is not writable (" + why + ")";
  }
  ::close(fd);
  ::unlink(f.c_str());
  return "";
}

}  // namespace flowrun
