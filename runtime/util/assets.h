// Finding the real input files (models, tokenizers, data, reference values).
//
// The asset root is $FLOWRUN_ASSETS, or else ../shared/assets beside the
// project (looked up relative to the working directory, then to the source
// tree the binary was built from). configs/assets.tsv lists every file with
// its public source and sha256; tools/setup.sh fetches missing ones.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>

namespace flowrun {

/// Thrown when an asset file is missing. what() names the file, where it was
/// looked for, and how to get it.
struct asset_missing : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The asset root directory (may not exist).
std::filesystem::path assets_root();

/// Full path of `relative` (e.g. "model/stories260K/stories260K.bin") under the
/// asset root. Throws asset_missing if the file does not exist.
std::filesystem::path asset_path(const std::string& relative);

/// A user-given path: returned as is when it exists; otherwise, if it is
/// relative and exists under the asset root, that path. Throws asset_missing
/// naming both places otherwise. `what` says what the file is for ("model").
std::filesystem::path resolve_user_path(const std::string& path, const std::string& what);

}  // namespace flowrun
