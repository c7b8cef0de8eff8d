// Helpers shared by the test suites: assets and the reference JSON.
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/util/assets.h"

namespace flowrun::test {

/// Parse a JSON asset file (e.g. "ref/stories260K_forward_reference.json").
inline nlohmann::json load_json_asset(const std::string& rel) {
  std::ifstream f(asset_path(rel));
  return nlohmann::json::parse(f);
}

inline std::string model_path() { return asset_path("model/stories260K/stories260K.bin").string(); }
inline std::string model_v1_path() { return asset_path("model/stories260K/stories260K_v1.bin").string(); }
inline std::string tokenizer_path() { return asset_path("model/stories260K/tok512.model").string(); }

}  // namespace flowrun::test
