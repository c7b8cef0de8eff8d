// One spelling of a path, for deciding whether two settings name the same file or folder.
// One implementation for every layer: the graph's include cycles and duplicate outputs
// (runtime/graph), a node pair that must share a folder (actors/zero_nodes), and the resume
// records that compare a run's files with the last run's (actors/resume_check).
#pragma once

#include <string>

namespace flowrun {

/// The key two spellings of one path share: "dir", "dir/", "./x/../dir", a symbolic link to it,
/// and the same relative path from its working directory all give "/abs/dir". Relative paths are
/// made absolute (from the current directory), symbolic links are resolved in the part of the
/// path that exists (std::filesystem::weakly_canonical: an output folder not made yet keeps its
/// missing tail, lexically normalised), and a trailing '/' is dropped ("/" stays "/"). Never
/// throws: when the file system cannot be asked, the absolute lexical form. "" gives "".
std::string same_path_key(const std::string& path);

/// Whether `a` and `b` name the same place (same_path_key equal; two empty strings are equal,
/// an empty string and a path are not).
bool same_path(const std::string& a, const std::string& b);

}  // namespace flowrun
