// doctest checks the init's end-to-end tests share on top of the Sandbox (harness.hpp, which
// stays free of doctest so harness.cpp builds without it).
#pragma once

#include <doctest/doctest.h>

#include "harness.hpp"

namespace nes::init::test {

/// The next message of type T the init sends, the output_end accounts that come first kept in
/// sb.output_ends; the test stops there, naming the harness's last error (a timeout, another
/// message, the channel closed), when anything else comes.
template <class T>
T next_after_accounts(Sandbox& sb, int timeout_ms = 10000) {
  for (;;) {
    auto m = sb.next(timeout_ms);
    REQUIRE_MESSAGE(m, sb.last_error());
    if (auto* e = std::get_if<proto::OutputEnd>(&*m)) {
      sb.output_ends.push_back(*e);
      continue;
    }
    auto* x = std::get_if<T>(&*m);
    REQUIRE_MESSAGE(x, "unexpected message: " << proto::encode(*m));
    return *x;
  }
}

/// The workload_exited the init reports next (its streams' accounts kept).
inline proto::WorkloadExited next_exit(Sandbox& sb) { return next_after_accounts<proto::WorkloadExited>(sb); }

/// The exec_exited the init reports next (its process's accounts kept).
inline proto::ExecExited next_exec_exit(Sandbox& sb, int timeout_ms = 10000) {
  return next_after_accounts<proto::ExecExited>(sb, timeout_ms);
}

/// The account of the workload's `s` among sb.output_ends (nullopt: none arrived).
inline std::optional<proto::OutputEnd> account_of(const Sandbox& sb, proto::Stream s, std::uint16_t proc = 0) {
  for (const auto& e : sb.output_ends)
    if (e.proc == proc && e.stream == s) return e;
  return std::nullopt;
}

}  // namespace nes::init::test
