// A small expected-style result for the host library (C++20 has no std::expected).
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace nes::host {

/// A failure described for a human: names the field, path or flag and what went wrong. `err`
/// is the errno(3) behind it, positive (as errno itself), 0 when none applies. Used by the init
/// and the host alike (header-only, std only, never throws).
struct Error {
  std::string message;
  int err = 0;
};

/// Either a value or an Error. Never throws on access of the wrong alternative: callers check
/// `ok()` first (accessing the wrong one is a programming error caught by std::get).
template <class T>
class Result {
 public:
  Result(T v) : v_(std::in_place_index<0>, std::move(v)) {}
  Result(Error e) : v_(std::in_place_index<1>, std::move(e)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

/// Result of an operation that returns nothing.
struct Ok {};
using Status = Result<Ok>;

}  // namespace nes::host
