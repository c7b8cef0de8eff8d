#include "runtime/util/same_path.h"

#include <filesystem>
#include <system_error>

namespace flowrun {

std::string same_path_key(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return path;
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::path(path), ec);
  if (ec) {
    ec.clear();
    p = fs::absolute(fs::path(path), ec);
    if (ec) p = fs::path(path);
  }
  std::string key = p.lexically_normal().string();
  while (key.size() > 1 && key.back() == '/') key.pop_back();
  return key;
}

bool same_path(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return a == b;
  return same_path_key(a) == same_path_key(b);
}

}  // namespace flowrun
