// Named fault points for the monitor's kill-point tests (tests/host/adopt_test.py): the neshost
// side of host/shim/fault_point.hpp.
#pragma once

#include <string_view>

namespace nes::monitor {

/// Where a test may stop a neshost process (a monitor, a command): when the build has fault points
/// (meson option `fault_points`: on only where the tests are built, never in the installed
/// host-only configuration) and the environment variable NESHOST_FAULT equals `name` (e.g.
/// "remove:intent"), says so on stderr ("neshost: fault point remove:intent: SIGKILL") and
/// SIGKILLs itself there, so a test puts a kill between an intent and its effect without timing
/// it. Otherwise nothing.
void fault_point(std::string_view name);

/// The same with the environment variable `env` and the program name `who` in its stderr line:
/// the one implementation under the shim's (host/shim/fault_point.hpp: NESINIT_SHIM_FAULT).
void fault_point(std::string_view name, const char* env, std::string_view who);

}  // namespace nes::monitor
