// The one result/error vocabulary of the init, the wire (protocol/) and the host (C++20 has no
// std::expected).
//
// The idiom, everywhere: a function that can fail returns `Result<T>` (a value or an Error), or
// `Status` when there is no value; the errno behind a failure travels in `Error::err`, positive
// as errno itself. Where the failure *is* a protocol message (the init's mount_failed and
// start_failed carry a tag, a reason, an errno, a class), the second parameter names that type
// instead of Error: `Result<pid_t, proto::StartFailed>` reads like every other Result and hands
// the loop exactly what the session reports. No -errno or 0-or-errno ints, no empty string
// meaning success, no optional-failure or variant-of-value-or-text returns.
// Header-only, std only, never throws.
#pragma once

#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace nes::base {

/// A failure described for a human: names the field, path or flag and what went wrong. `err`
/// is the errno(3) behind it, positive (as errno itself), 0 when none applies.
struct Error {
  std::string message;
  int err = 0;
};

/// The Error for errno `e`: "what: strerror(e)" (strerror(e) alone when `what` is empty), err = e.
/// Out of line: one copy in the init instead of one per failure path (it is measured in KiB).
[[gnu::noinline]] inline Error errno_error(int e, std::string_view what = {}) {
  std::string m(what);
  if (!m.empty()) m += ": ";
  m += std::strerror(e);
  return Error{std::move(m), e};
}

/// Either a value `T` or a failure `E` (an Error unless the failure is a message of its own),
/// implicitly constructed from either. Callers check `ok()` (or the bool conversion) first:
/// value() on a failure or error() on a value is a programming error caught by std::get (which
/// throws std::bad_variant_access, or aborts where exceptions are off, as in the init).
template <class T, class E = Error>
class Result {
 public:
  Result(T v) : v_(std::in_place_index<0>, std::move(v)) {}
  Result(E e) : v_(std::in_place_index<1>, std::move(e)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const E& error() const& { return std::get<1>(v_); }
  E&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, E> v_;
};

/// The value of an operation that returns nothing (an empty struct).
struct Ok {};
/// Success (Ok), or failure `E` (an Error unless named).
template <class E = Error>
using StatusOf = Result<Ok, E>;
using Status = StatusOf<>;

}  // namespace nes::base
