// doctest checks the init's end-to-end tests share on top of the Sandbox (harness.hpp, which
// stays free of doctest so harness.cpp builds without it).
#pragma once

#include <doctest/doctest.h>

#include "harness.hpp"

namespace nes::init::test {

/// The workload_exited the init reports next; the test stops there, naming the harness's last
/// error (a timeout, another message, the channel closed), when it reports anything else.
inline proto::WorkloadExited next_exit(Sandbox& sb) {
  auto x = sb.expect<proto::WorkloadExited>();
  REQUIRE_MESSAGE(x, sb.last_error());
  return *x;
}

}  // namespace nes::init::test
