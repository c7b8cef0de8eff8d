#include "runtime/util/assets.h"

#include <cstdlib>

namespace flowrun {

namespace fs = std::filesystem;

// A default candidate counts only when it holds the asset bundle (its README.md),
// so an empty or unrelated ../shared/assets next to the working directory is skipped.
static bool holds_bundle(const fs::path& p) { return fs::exists(p / "README.md"); }

fs::path assets_root() {
  if (const char* env = std::getenv("FLOWRUN_ASSETS"); env && *env) return fs::path(env);
  fs::path local = fs::path("..") / "shared" / "assets";
  if (holds_bundle(local)) return local;
#ifdef FLOWRUN_SOURCE_DIR
  fs::path beside = fs::path(FLOWRUN_SOURCE_DIR) / ".." / "shared" / "assets";
  if (holds_bundle(beside)) return beside.lexically_normal();
#endif
  return local;
}

fs::path asset_path(const std::string& relative) {
  fs::path p = assets_root() / relative;
  if (!fs::exists(p)) {
    throw asset_missing("asset file missing: " + p.string() + " (asset '" + relative +
                        "'). Set FLOWRUN_ASSETS to the folder that holds it, or run tools/setup.sh, "
                        "which names its public source in configs/assets.tsv and downloads it where the "
                        "network allows.");
  }
  return p;
}

fs::path resolve_user_path(const std::string& path, const std::string& what) {
  fs::path p(path);
  if (fs::exists(p)) return p;
  if (p.is_relative()) {
    fs::path under = assets_root() / p;
    if (fs::exists(under)) return under;
    std::error_code ec;
    const fs::path shown = fs::absolute(under, ec).lexically_normal();
    throw asset_missing(what + " file not found: '" + path + "' (looked in the working directory and in " +
                        (ec ? under : shown).string() + "). Check the path, or set FLOWRUN_ASSETS.");
  }
  throw asset_missing(what + " file not found: '" + path + "'. Check the path.");
}

}  // namespace flowrun
