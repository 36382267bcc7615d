// Re-adoption (docs/host.md "Re-adoption"): a detached VM's QEMU (or sandbox) outlives its
// monitor; whichever neshost command (ps, inspect, wait, logs, exec, stop, kill, top, rm) or shim
// call finds the VM orphaned — its monitor gone, no outcome recorded, its VMM alive — starts a
// replacement monitor (`neshost monitor`), which takes the generation over (the lifecycle
// session through the resume path, the control socket, the record, on_exit, the power-off).
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "host/lib/base.hpp"
#include "host/monitor/reconcile.hpp"

namespace nes::monitor {

/// If `vm` in `state` is orphaned (host::VmState::orphaned()), starts one replacement monitor,
/// `NESHOST monitor --state STATE --notify-fd 3 VM` (`neshost` the program to run: the CLI's own
/// /proc/self/exe, or the one the shim runs), in its own session and not our child (double fork:
/// nothing to reap), stdin and stdout /dev/null, stderr appended to the VM's monitor.log; then
/// waits, at most `bound`, until it says the guest has resumed its session with it (so the
/// caller's next request finds a booted session), or why not, or exits (its notify pipe: a
/// line, or EOF). Callers that race each start one; one wins, the others exit 0 saying so (a lock in
/// the VM's directory), and every caller returns once the winner has the VM. A VM whose monitor
/// and VMM are both gone but whose helper daemons (virtiofsd, passt) still run: those are killed
/// (leftovers). Returns the VM's reconciled state afterwards (nullopt: no such VM); `said`, if
/// given, gets one line for the user when a replacement was started ("VM web: its monitor was
/// gone; adopted by a new monitor (pid 123)"). Errors: the state dir cannot be read, the fork.
host::Result<std::optional<host::VmState>> ensure_monitor(const std::filesystem::path& state, std::string_view vm,
                                                          const std::filesystem::path& neshost,
                                                          std::chrono::milliseconds bound = std::chrono::seconds(15),
                                                          std::string* said = nullptr);

/// This program's own path (/proc/self/exe), for ensure_monitor() from the CLI.
std::filesystem::path self_program();

}  // namespace nes::monitor

// The names host/cli and host/shim spelled `nes::cli::` before this header moved to nes::monitor
// (as in monitor.hpp).
namespace nes::cli {
using monitor::ensure_monitor;
using monitor::self_program;
}  // namespace nes::cli
