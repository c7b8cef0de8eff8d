// UTF-8 well-formedness, one rule for the readers that check or show text.
#pragma once

#include <cstddef>
#include <string_view>

namespace flowrun {

/// The length (1-4) of the well-formed UTF-8 sequence that starts at byte `i` of `s` (RFC 3629 /
/// Unicode Table 3-7: no overlong forms, no surrogates, at most U+10FFFF), or 0 when the bytes there
/// are none (a stray continuation byte, a bad lead byte, a sequence cut short). `i` < s.size().
inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned lo = 0x80, hi = 0xBF;  // the first continuation byte's range
  if (c >= 0xC2 && c <= 0xDF) n = 1;
  else if (c == 0xE0) n = 2, lo = 0xA0;
  else if (c >= 0xE1 && c <= 0xEC) n = 2;
  else if (c == 0xED) n = 2, hi = 0x9F;
  else if (c >= 0xEE && c <= 0xEF) n = 2;
  else if (c == 0xF0) n = 3, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) n = 3;
  else if (c == 0xF4) n = 3, hi = 0x8F;
  else return 0;
  if (i + n >= s.size()) return 0;  // cut short at the end
  for (std::size_t k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
  }
  return n + 1;
}

}  // namespace flowrun
