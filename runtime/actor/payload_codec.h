// Layer 5, actor runtime: payloads as bytes, for edges that cross processes.
//
// Inside one process a payload travels by handle (payload.h). Between the
// processes of a cluster (docs/scaling.md) CAF carries a payload as raw bytes
// (std::vector<char>, which CAF copies with memcpy) and never as floats:
// CAF 0.17 hangs on +inf and turns NaN into 1 when it serializes a float.
// A message type can cross only if it has a codec here; the runtime refuses,
// before anything runs, a graph whose cross-process edge carries a type
// without one. A codec of a type that holds tensors (models, rollouts, ...)
// is a *bulk* codec: it turns everything but the tensors into bytes and hands
// the tensors over separately; the cluster's bulk plane (bulk_plane.h) moves
// them through the communicator, never inside a CAF message.
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
#include "runtime/tensor/tensor.h"

namespace flowrun::actor {

/// How one message type becomes bytes and back. Set either encode/decode
/// (bytes only) or encode_bulk/decode_bulk (bytes plus tensors).
struct payload_codec {
  /// The bytes of a payload of this message type. May throw std::exception
  /// (e.g. bad_payload_cast when the payload holds another C++ type).
  std::function<std::vector<char>(const payload&)> encode;
  /// The payload (of message type `type`) that `bytes` encode. Throws
  /// std::exception on malformed bytes.
  std::function<payload(std::string_view type, const std::vector<char>& bytes)> decode;
  /// Bulk codecs: the bytes of everything but the tensors; the tensors are
  /// appended to `bulk` in an order the bytes refer to (e.g. by index). The
  /// tensors may share storage with the payload: the plane copies device
  /// tensors to the host and sends host tensors as they are, so a codec whose
  /// payload may change after it was sent (a live model) must clone them.
  std::function<std::vector<char>(const payload&, std::vector<tensor>& bulk)> encode_bulk;
  /// The payload that `bytes` and the received `bulk` tensors (CPU, in the
  /// order encode_bulk appended them) encode. Throws std::exception on
  /// malformed bytes or tensors of unexpected dtype or shape.
  std::function<payload(std::string_view type, const std::vector<char>& bytes, std::vector<tensor>& bulk)>
      decode_bulk;
  bool bulk() const { return static_cast<bool>(encode_bulk); }
};

/// Registers (or replaces) the codec of `message_type`. Thread-safe.
void register_payload_codec(std::string message_type, payload_codec codec);

/// True when `message_type` has a codec. Thread-safe.
bool has_payload_codec(std::string_view message_type);

/// True when `message_type` has a bulk codec (its tensors need the bulk plane). Thread-safe.
bool has_bulk_codec(std::string_view message_type);

/// The bytes of `p`, or an error naming the message type when it has no
/// codec or the codec failed. A bulk codec appends its tensors to `*bulk`;
/// with bulk == nullptr it is an error ("needs the cluster's bulk plane").
expected<std::vector<char>> encode_payload(const payload& p, std::vector<tensor>* bulk = nullptr);

/// The payload of message type `type` that `bytes` (and, for a bulk codec,
/// the tensors `*bulk`) encode, or an error naming the type when it has no
/// codec or the bytes are malformed.
expected<payload> decode_payload(std::string_view type, const std::vector<char>& bytes,
                                 std::vector<tensor>* bulk = nullptr);

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
