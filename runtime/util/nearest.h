// "Did you mean": the nearest of a list of names to a misspelt one (setting names, node kinds,
// DeepSpeed JSON keys). One implementation for every layer (runtime/graph re-exports it).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace flowrun {

/// Edit distance between two strings (bytes): insertions, deletions,
/// substitutions and swaps of neighbouring characters each count 1
/// (optimal string alignment).
std::size_t edit_distance(std::string_view a, std::string_view b);

/// The candidate nearest to `name` by edit distance if it is close enough to
/// be a plausible typo (distance <= max(1, min(3, size/3))), else "".
std::string nearest_name(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace flowrun
