// Layer 5, actor runtime: errors as values.
//
// expected<T> holds either a T or an error message (std::expected is C++23;
// caf::expected needs an actor system to render its errors, and the runtime's
// errors are for people: a sentence naming the node and the reason).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace flowrun::actor {

/// An error message, wrapped so that expected<std::string> stays unambiguous.
struct error_text {
  std::string message;
};

/// Either a value or an error_text.
template <class T>
class expected {
 public:
  /// A value.
  expected(T value) : v_(std::move(value)) {}
  /// An error.
  expected(error_text err) : v_(std::move(err)) {}

  /// True when a value is held.
  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  /// The value. Throws std::logic_error with the error message when there is none.
  T& value() {
    if (!has_value()) throw std::logic_error("expected holds an error: " + error());
    return std::get<0>(v_);
  }
  const T& value() const {
    if (!has_value()) throw std::logic_error("expected holds an error: " + error());
    return std::get<0>(v_);
  }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The error message ("" when a value is held).
  const std::string& error() const {
    static const std::string none;
    return has_value() ? none : std::get<1>(v_).message;
  }

 private:
  std::variant<T, error_text> v_;
};

}  // namespace flowrun::actor
