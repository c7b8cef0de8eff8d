// Layer 5, actor runtime: payloads as bytes, for edges that cross processes.
//
// Inside one process a payload travels by handle (payload.h). Between the
// processes of a cluster (docs/scaling.md) CAF carries a payload as raw bytes
// (std::vector<char>, which CAF copies with memcpy) and never as floats:
// CAF 0.17 hangs on +inf and turns NaN into 1 when it serializes a float.
// A message type can cross only if it has a codec here; the runtime refuses,
// before anything runs, a graph whose cross-process edge carries a type
// without one (tensors and models: not yet supported across nodes; they are
// meant to go through the communicator, runtime/comm).
//
// The registry is process-wide; node kinds register the codecs of their
// message types next to their factories (actors/register.cpp).
//
// This header includes no CAF.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "runtime/actor/expected.h"
#include "runtime/actor/payload.h"

namespace flowrun::actor {

/// How one message type becomes bytes and back.
struct payload_codec {
  /// The bytes of a payload of this message type. May throw std::exception
  /// (e.g. bad_payload_cast when the payload holds another C++ type).
  std::function<std::vector<char>(const payload&)> encode;
  /// The payload (of message type `type`) that `bytes` encode. Throws
  /// std::exception on malformed bytes.
  std::function<payload(std::string_view type, const std::vector<char>& bytes)> decode;
};

/// Registers (or replaces) the codec of `message_type`. Thread-safe.
void register_payload_codec(std::string message_type, payload_codec codec);

/// True when `message_type` has a codec. Thread-safe.
bool has_payload_codec(std::string_view message_type);

/// The bytes of `p`, or an error naming the message type when it has no
/// codec or the codec failed.
expected<std::vector<char>> encode_payload(const payload& p);

/// The payload of message type `type` that `bytes` encode, or an error
/// naming the type when it has no codec or the bytes are malformed.
expected<payload> decode_payload(std::string_view type, const std::vector<char>& bytes);

/// The codec of a payload holding std::string (its characters).
payload_codec string_codec();

/// The codec of a payload holding std::vector<T> of a trivially copyable T
/// (its elements' bytes, in this machine's byte order: the cluster's
/// machines must share it; x86-64 and AArch64 are both little-endian).
template <class T>
payload_codec pod_vector_codec() {
  static_assert(std::is_trivially_copyable_v<T>);
  payload_codec c;
  c.encode = [](const payload& p) {
    const auto& v = p.as<std::vector<T>>();
    std::vector<char> out(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
    return out;
  };
  c.decode = [](std::string_view type, const std::vector<char>& bytes) {
    if (bytes.size() % sizeof(T) != 0)
      throw std::invalid_argument(std::to_string(bytes.size()) + " bytes are not a whole number of " +
                                  std::to_string(sizeof(T)) + "-byte elements");
    std::vector<T> v(bytes.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
    return payload::make(type, std::move(v));
  };
  return c;
}

}  // namespace flowrun::actor
