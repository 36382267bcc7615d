// Reading the init Session's actions in tests (tests/init/session_test, stdio_test): the actions
// of one kind, the message types sent, the timers armed and cancelled, a host message as an event.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "nesinit/session.hpp"

namespace nes::init::test {

/// The actions of type T in `as`, in order.
template <class T>
std::vector<T> only(const Actions& as) {
  std::vector<T> out;
  for (auto& a : as)
    if (auto* p = std::get_if<T>(&a)) out.push_back(*p);
  return out;
}

/// Type names of the messages sent, in order ("ready", "mounted", ...).
inline std::vector<std::string> sent(const Actions& as) {
  std::vector<std::string> out;
  for (auto& s : only<act::Send>(as)) out.emplace_back(proto::type_name(s.msg));
  return out;
}

/// `t` was armed for exactly `ms` milliseconds.
inline bool armed(const Actions& as, Timer t, std::uint32_t ms) {
  for (auto& a : only<act::ArmTimer>(as))
    if (a.timer == t && a.ms == ms) return true;
  return false;
}

/// `t` was cancelled.
inline bool cancelled(const Actions& as, Timer t) {
  for (auto& a : only<act::CancelTimer>(as))
    if (a.timer == t) return true;
  return false;
}

/// A decoded host message as the session's event.
inline Event msg(proto::HostMessage m) { return ev::Message{proto::HostDecoded{std::move(m)}}; }

}  // namespace nes::init::test
