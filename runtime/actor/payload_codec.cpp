#include "runtime/actor/payload_codec.h"

#include <map>
#include <mutex>

namespace flowrun::actor {

namespace {

struct codec_registry {
  std::mutex mutex;
  std::map<std::string, payload_codec, std::less<>> codecs;
};

codec_registry& registry() {
  static codec_registry r;
  return r;
}

}  // namespace

void register_payload_codec(std::string message_type, payload_codec codec) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.codecs[std::move(message_type)] = std::move(codec);
}

bool has_payload_codec(std::string_view message_type) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.codecs.find(message_type) != r.codecs.end();
}

bool has_bulk_codec(std::string_view message_type) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.codecs.find(message_type);
  return it != r.codecs.end() && it->second.bulk();
}

namespace {

const payload_codec* find(std::string_view type) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.codecs.find(type);
  return it == r.codecs.end() ? nullptr : &it->second;  // entries are never erased
}

std::string no_codec(std::string_view type) {
  return "message type '" + std::string(type) +
         "' cannot cross processes: it has no codec (register_payload_codec in the node kind's registration)";
}

}  // namespace

expected<std::vector<char>> encode_payload(const payload& p, std::vector<tensor>* bulk) {
  const payload_codec* c = find(p.type());
  if (!c) return error_text{no_codec(p.type())};
  try {
    if (c->bulk()) {
      if (!bulk)
        return error_text{"a '" + std::string(p.type()) + "' payload holds tensors: it needs the cluster's bulk plane"};
      return c->encode_bulk(p, *bulk);
    }
    return c->encode(p);
  } catch (const std::exception& e) {
    return error_text{"cannot encode a '" + std::string(p.type()) + "' payload: " + e.what()};
  }
}

expected<payload> decode_payload(std::string_view type, const std::vector<char>& bytes, std::vector<tensor>* bulk) {
  const payload_codec* c = find(type);
  if (!c) return error_text{no_codec(type)};
  try {
    if (c->bulk()) {
      if (!bulk)
        return error_text{"a '" + std::string(type) + "' payload holds tensors: it needs the cluster's bulk plane"};
      return c->decode_bulk(type, bytes, *bulk);
    }
    return c->decode(type, bytes);
  } catch (const std::exception& e) {
    return error_text{"cannot decode a '" + std::string(type) + "' payload of " + std::to_string(bytes.size()) +
                      " bytes: " + e.what()};
  }
}

payload_codec string_codec() {
  payload_codec c;
  c.encode = [](const payload& p) {
    const auto& s = p.as<std::string>();
    return std::vector<char>(s.begin(), s.end());
  };
  c.decode = [](std::string_view type, const std::vector<char>& bytes) {
    return payload::make(type, std::string(bytes.begin(), bytes.end()));
  };
  return c;
}

}  // namespace flowrun::actor
