// Named fault points for the shim's qualification tests (tests/shim: the journal's gates).
#pragma once

#include <string_view>

namespace nes::shim {

/// Where a test may stop the shim: when the build has fault points (meson option
/// `fault_points`, on by default only where the tests are built, never in the host-only
/// configuration that is packaged) and the environment variable NESINIT_SHIM_FAULT equals `name`
/// (e.g. "create:mounted"), the shim says so on stderr and SIGKILLs itself there, so a test puts
/// a kill between an intent and its effect without timing it. Otherwise nothing.
void fault_point(std::string_view name);

}  // namespace nes::shim
