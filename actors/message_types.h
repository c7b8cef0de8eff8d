// Layer 6, node kinds: the C++ types behind the message types of the built-in kinds.
//
//   message type | C++ value in the payload
//   "text"       | std::string                 (one line, one story, one completion)
//   "tokens"     | std::vector<std::int32_t>   (the token ids of one text)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flowrun::actors {

/// Message type "text": a std::string.
inline constexpr std::string_view text_type = "text";
/// Message type "tokens": a std::vector<std::int32_t>.
inline constexpr std::string_view tokens_type = "tokens";

/// The C++ type of a "tokens" payload.
using token_ids = std::vector<std::int32_t>;

}  // namespace flowrun::actors
