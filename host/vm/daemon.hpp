// What the helper daemons a VM needs (virtiofsd per share, passt for `--network passt`) have in
// common once launched with VmProcess: waiting until one has set up, stopping it after QEMU has
// gone, and turning its stderr into a line for an error message (host/vm/virtiofsd.hpp,
// host/vm/passt.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "host/vm/process.hpp"

namespace nes::vm {

/// How wait_ready() ended.
struct DaemonWait {
  enum class Outcome { ready, exited, timed_out };
  Outcome outcome = Outcome::ready;
  /// exited: how (nullopt if another part of the program reaped it first).
  std::optional<ProcessExit> exit;
  /// exited / timed_out: the last stderr it wrote (VmProcess::diagnostics_tail(); for timed_out
  /// taken before it was ended, so our own SIGTERM's echoes are left out). Empty when ready.
  std::string tail;
};

/// Waits at most `bound` until the daemon `p` has set up, has exited, or has stayed silent.
/// Ready: `ready_fd` (an eventfd, an inotify fd, ...; not owned) polls readable and `confirm()`
/// (if given: it reads what made the fd readable) says true; false keeps waiting. An exit seen at
/// the same time as readiness counts as an exit. Exited: it is reaped and its output drained (up
/// to 1 s). Timed out (or poll failed): it is ended (SIGTERM, 200 ms, SIGKILL) and its output
/// drained. Never returns with it unreaped unless ready.
DaemonWait wait_ready(VmProcess& p, int ready_fd, std::chrono::milliseconds bound,
                      const std::function<bool()>& confirm = {});

/// Ends a daemon that exits by itself once QEMU has gone: waits up to `grace` for that, then
/// SIGTERM/SIGKILL (VmProcess::terminate, 1 s), then drains its output (up to 1 s). Returns how
/// it ended.
ProcessExit stop_daemon(VmProcess& p, std::chrono::milliseconds grace);

/// A daemon's last stderr lines as one line for an error message: each line trimmed at its end,
/// empty lines and those `skip` matches (if given) left out, joined by single spaces. At most
/// `max` bytes (the last ones): earlier lines are dropped whole (a last line longer than `max`
/// keeps its last `max` bytes), and "... " starts the result when anything was dropped.
std::string daemon_last_lines(std::string_view text, std::size_t max = 600,
                              const std::function<bool(std::string_view)>& skip = {});

/// Appends `b` to a daemon's log file `log` (not owned), keeping the file at most `cap` bytes:
/// `logged` (bytes already in it) grows by what was written; the rest is dropped. A write error
/// stops this call (the log is best effort: the daemon's last words are also kept in memory).
void append_bounded_log(int log, std::string_view b, std::size_t cap, std::size_t& logged);

}  // namespace nes::vm
