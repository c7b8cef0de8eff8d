#include "runtime/actor/payload.h"

#include <mutex>
#include <unordered_set>

namespace flowrun::actor {

std::string_view intern_message_type(std::string_view type) {
  // Node-based set: element addresses (and so the views) never move.
  static std::mutex mutex;
  static std::unordered_set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = names.find(std::string(type));
  if (it == names.end()) it = names.emplace(type).first;
  return *it;
}

std::vector<payload> payload::split(std::size_t n) const {
  if (empty()) throw std::invalid_argument("cannot split an empty payload");
  if (n == 0) throw std::invalid_argument("cannot split a payload into 0 parts");
  if (!ops_->split)
    throw std::invalid_argument("payload type '" + std::string(type_) +
                                "' cannot be split (its C++ type declares no payload_traits<T>::split; use "
                                "flowrun::actor::batch<T> for batches)");
  auto parts = ops_->split(data_.get(), n);
  if (parts.size() != n)
    throw std::invalid_argument("payload type '" + std::string(type_) + "' split into " +
                                std::to_string(parts.size()) + " parts, not " + std::to_string(n));
  std::vector<payload> out;
  out.reserve(n);
  for (auto& p : parts) {
    payload q;
    q.ops_ = ops_;
    q.type_ = type_;
    q.bytes_ = ops_->byte_size(p.get());
    q.data_ = std::move(p);
    out.push_back(std::move(q));
  }
  return out;
}

payload payload::merge(const std::vector<payload>& parts) {
  if (parts.empty()) throw std::invalid_argument("cannot merge zero payloads");
  const payload& first = parts.front();
  if (first.empty()) throw std::invalid_argument("cannot merge empty payloads");
  std::vector<const void*> raw;
  raw.reserve(parts.size());
  for (const auto& p : parts) {
    if (p.ops_ != first.ops_ || p.type_ != first.type_)
      throw std::invalid_argument("cannot merge payloads of different types ('" + std::string(first.type_) +
                                  "' and '" + std::string(p.type_) + "')");
    raw.push_back(p.data_.get());
  }
  if (!first.ops_->merge)
    throw std::invalid_argument("payload type '" + std::string(first.type_) +
                                "' cannot be merged (its C++ type declares no payload_traits<T>::merge)");
  payload out;
  out.ops_ = first.ops_;
  out.type_ = first.type_;
  out.data_ = first.ops_->merge(raw);
  out.bytes_ = first.ops_->byte_size(out.data_.get());
  return out;
}

}  // namespace flowrun::actor
