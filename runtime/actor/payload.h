// Layer 5, actor runtime: the value that travels on an edge.
//
// A payload is an immutable, reference-counted, type-erased value together
// with the name of its message type (the port's `message_type` in the node
// kind, e.g. "text" or "tokens"). Inside one process it is passed by handle:
// sending a payload to several consumers copies a shared_ptr, never the data.
//
// Each C++ type T that travels in a payload may customise payload_traits<T>:
//   - byte_size(const T&): the bytes the value holds (for the byte metrics);
//   - split(const T&, n) -> std::vector<T>: cut a batch into n parts, for
//     edges with `dispatch=split` (a type without split cannot be split);
//   - merge(const std::vector<const T*>&) -> T: the inverse of split, used
//     when the outputs of a split group are gathered back into one message.
// batch<T> below is splittable and mergeable out of the box.
//
// This header includes no CAF: node code uses it freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace flowrun::actor {

/// A batch of items: the payload to use on edges with `dispatch=split`.
/// Splitting into n parts gives n contiguous runs of items whose sizes differ
/// by at most one (the first parts get the extra items; parts may be empty);
/// merging concatenates the parts in order.
template <class T>
struct batch {
  std::vector<T> items;
};

/// Customisation point for payload value types (see the top of this header).
/// The primary template gives sizeof(T) bytes and no split/merge.
template <class T>
struct payload_traits {
  /// Bytes held by `x` (sizeof(T) unless specialised).
  static std::size_t byte_size(const T&) { return sizeof(T); }
};

/// std::string: its characters.
template <>
struct payload_traits<std::string> {
  static std::size_t byte_size(const std::string& s) { return s.size(); }
};

/// std::vector<T> of trivially copyable T: size() * sizeof(T). Not splittable:
/// a vector may be one sequence (token ids) rather than a batch; use batch<T>.
template <class T>
struct payload_traits<std::vector<T>> {
  static std::size_t byte_size(const std::vector<T>& v) {
    if constexpr (std::is_trivially_copyable_v<T>) {
      return v.size() * sizeof(T);
    } else {
      std::size_t n = 0;
      for (const auto& x : v) n += payload_traits<T>::byte_size(x);
      return n;
    }
  }
};

/// batch<T>: the sum of its items' sizes; split into contiguous runs, merged by concatenation.
template <class T>
struct payload_traits<batch<T>> {
  static std::size_t byte_size(const batch<T>& b) { return payload_traits<std::vector<T>>::byte_size(b.items); }
  static std::vector<batch<T>> split(const batch<T>& b, std::size_t n) {
    std::vector<batch<T>> parts(n);
    const std::size_t base = b.items.size() / n, extra = b.items.size() % n;
    std::size_t at = 0;
    for (std::size_t p = 0; p < n; ++p) {
      std::size_t len = base + (p < extra ? 1 : 0);
      parts[p].items.assign(b.items.begin() + static_cast<std::ptrdiff_t>(at),
                            b.items.begin() + static_cast<std::ptrdiff_t>(at + len));
      at += len;
    }
    return parts;
  }
  static batch<T> merge(const std::vector<const batch<T>*>& parts) {
    batch<T> out;
    for (const auto* p : parts) out.items.insert(out.items.end(), p->items.begin(), p->items.end());
    return out;
  }
};

/// Thrown by payload::as<T>() when the payload holds another C++ type (or nothing).
struct bad_payload_cast : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Returns a string_view with static storage duration equal to `type`
/// (message type names are interned once; thread-safe).
std::string_view intern_message_type(std::string_view type);

/// The type-erased operations of one C++ type (one static instance per type).
struct payload_ops {
  const std::type_info* type;              ///< the C++ type held
  std::size_t (*byte_size)(const void*);   ///< payload_traits<T>::byte_size
  /// nullptr when the type cannot be split.
  std::vector<std::shared_ptr<const void>> (*split)(const void*, std::size_t);
  /// nullptr when the type cannot be merged.
  std::shared_ptr<const void> (*merge)(const std::vector<const void*>&);
};

namespace detail {

template <class T>
concept has_split = requires(const T& x, std::size_t n) {
  { payload_traits<T>::split(x, n) } -> std::same_as<std::vector<T>>;
};

template <class T>
concept has_merge = requires(const std::vector<const T*>& parts) {
  { payload_traits<T>::merge(parts) } -> std::same_as<T>;
};

template <class T>
const payload_ops* ops_of() {
  static const payload_ops ops{
      &typeid(T),
      [](const void* p) { return payload_traits<T>::byte_size(*static_cast<const T*>(p)); },
      has_split<T> ? +[](const void* p, std::size_t n) {
        std::vector<std::shared_ptr<const void>> out;
        if constexpr (has_split<T>) {
          auto parts = payload_traits<T>::split(*static_cast<const T*>(p), n);
          out.reserve(parts.size());
          for (auto& x : parts) out.push_back(std::make_shared<const T>(std::move(x)));
        }
        return out;
      }
                   : nullptr,
      has_merge<T> ? +[](const std::vector<const void*>& parts) -> std::shared_ptr<const void> {
        if constexpr (has_merge<T>) {
          std::vector<const T*> typed;
          typed.reserve(parts.size());
          for (const void* p : parts) typed.push_back(static_cast<const T*>(p));
          return std::make_shared<const T>(payload_traits<T>::merge(typed));
        } else {
          return nullptr;
        }
      }
                   : nullptr,
  };
  return &ops;
}

}  // namespace detail

/// An immutable, shared, type-erased message value with its message type
/// name and byte size. Copying a payload copies a handle (no data copy).
/// A default-constructed payload is empty (holds nothing, type "").
class payload {
 public:
  payload() = default;

  /// Wraps `value` (moved into a new shared object) as message type `type`.
  template <class T>
  static payload make(std::string_view type, T value) {
    using U = std::decay_t<T>;
    return share<U>(type, std::make_shared<const U>(std::move(value)));
  }

  /// Wraps an existing shared value (no copy) as message type `type`.
  /// Throws std::invalid_argument if `value` is null.
  template <class T>
  static payload share(std::string_view type, std::shared_ptr<const T> value) {
    if (!value) throw std::invalid_argument("payload::share: null value for message type '" + std::string(type) + "'");
    payload p;
    p.ops_ = detail::ops_of<T>();
    p.bytes_ = p.ops_->byte_size(value.get());
    p.data_ = std::move(value);
    p.type_ = intern_message_type(type);
    return p;
  }

  /// True when the payload holds no value.
  bool empty() const { return data_ == nullptr; }
  /// The message type name ("" when empty).
  std::string_view type() const { return type_; }
  /// The bytes the value holds, as its payload_traits say (0 when empty).
  std::size_t byte_size() const { return bytes_; }
  /// True when the value is a T.
  template <class T>
  bool is() const {
    return ops_ && *ops_->type == typeid(T);
  }
  /// The value, or nullptr when it is not a T (or the payload is empty).
  template <class T>
  const T* get() const {
    return is<T>() ? static_cast<const T*>(data_.get()) : nullptr;
  }
  /// The value. Throws bad_payload_cast naming both types when it is not a T.
  template <class T>
  const T& as() const {
    if (const T* p = get<T>()) return *p;
    throw bad_payload_cast("payload of message type '" + std::string(type_) + "' holds " +
                           (ops_ ? std::string(ops_->type->name()) : std::string("nothing")) + ", not " +
                           typeid(T).name());
  }
  /// The shared value (for handing it on without a copy); nullptr when not a T.
  template <class T>
  std::shared_ptr<const T> shared() const {
    return is<T>() ? std::static_pointer_cast<const T>(data_) : nullptr;
  }
  /// How many payload handles (and other owners) share the value (0 when empty).
  long use_count() const { return data_.use_count(); }

  /// True when the value's type declares payload_traits<T>::split.
  bool splittable() const { return ops_ && ops_->split; }
  /// True when the value's type declares payload_traits<T>::merge.
  bool mergeable() const { return ops_ && ops_->merge; }
  /// Cuts the value into `n` >= 1 parts of the same message type. Throws
  /// std::invalid_argument if the payload is empty, not splittable, or n == 0.
  std::vector<payload> split(std::size_t n) const;
  /// Joins parts (all of the same C++ and message type, in order) into one
  /// payload. Throws std::invalid_argument if `parts` is empty, holds
  /// different types, or the type is not mergeable.
  static payload merge(const std::vector<payload>& parts);

 private:
  std::shared_ptr<const void> data_;
  const payload_ops* ops_ = nullptr;
  std::string_view type_;
  std::size_t bytes_ = 0;
};

}  // namespace flowrun::actor
