// Layer 5, actor runtime: trivially copyable values in a byte buffer, in this
// machine's byte order (a cluster's machines must share it; x86-64 and AArch64
// are little-endian). The one encoding under every byte format that crosses
// processes: the bulk plane's header (bulk_plane.h), replica counters
// (metrics.h) and the node kinds' codecs (actors/codec_io.h). No CAF.
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

namespace flowrun::actor::byte_io {

/// Appends the bytes of `x` to `out`.
template <class T>
void put(std::vector<char>& out, T x) {
  static_assert(std::is_trivially_copyable_v<T>);
  const auto at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &x, sizeof(T));
}

/// Reads a T at `at` into `x` and advances `at`; false (nothing read) when
/// fewer than sizeof(T) bytes are left.
template <class T>
bool get(const std::vector<char>& in, std::size_t& at, T& x) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (at > in.size() || sizeof(T) > in.size() - at) return false;
  std::memcpy(&x, in.data() + at, sizeof(T));
  at += sizeof(T);
  return true;
}

}  // namespace flowrun::actor::byte_io
