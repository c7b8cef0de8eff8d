// Helpers shared by the libFuzzer targets (tests/fuzz): a per-process scratch
// folder for loaders that read files, and the splitting of one input into
// several files at a separator line.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace flowrun::fuzz {

/// A folder of this process's own ($TMPDIR or /tmp, flowrun_fuzz_NAME_PID), made once.
inline const std::filesystem::path& scratch_dir(const char* name) {
  static const std::filesystem::path dir = [name] {
    const char* t = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(t && *t ? t : "/tmp") /
                              ("flowrun_fuzz_" + std::string(name) + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

/// Writes `bytes` to `path` (replacing it).
inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The parts of `text` between lines that are exactly `sep` ("\n" + sep + "\n"
/// separates); always at least one part.
inline std::vector<std::string_view> split_parts(std::string_view text, std::string_view sep) {
  std::vector<std::string_view> parts;
  const std::string marker = "\n" + std::string(sep) + "\n";
  std::size_t at = 0;
  while (true) {
    const auto p = text.find(marker, at);
    if (p == std::string_view::npos) {
      parts.push_back(text.substr(at));
      return parts;
    }
    parts.push_back(text.substr(at, p - at));
    at = p + marker.size();
  }
}

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace flowrun::fuzz
