// Named fault points for the shim's qualification tests (tests/shim: the journal's gates, the
// durable writes' failures).
#pragma once

#include <string_view>

namespace nes::shim {

/// Where a test may stop the shim: when the build has fault points (meson option
/// `fault_points`, on by default only where the tests are built, never in the host-only
/// configuration that is packaged) and the environment variable NESINIT_SHIM_FAULT equals `name`
/// (e.g. "create:mounted"), the shim says so on stderr and SIGKILLs itself there, so a test puts
/// a kill between an intent and its effect without timing it. With "stop:" + `name` (e.g.
/// "stop:control:sent") it stops itself (SIGSTOP) there instead, for a test that stops
/// containerd, SIGKILLs the frozen shim and starts a replacement (a shim that dies while
/// containerd runs is cleaned up, not replaced). Otherwise nothing.
void fault_point(std::string_view name);

/// Where a test may fail a durable write as a full or broken disk would: with fault points built
/// and NESINIT_SHIM_FAULT equal to "eio:" + `name` (e.g. "eio:receipt:delete"), EIO (the write
/// is not attempted; the shim says so on stderr); otherwise 0. Read at each call, so a unit test
/// may set and unset the variable between calls.
int fault_errno(std::string_view name);

/// Whether this build has fault points (a test that needs them skips without).
bool fault_points_built();

}  // namespace nes::shim
