// The reaper: PID 1's one waiter. On SIGCHLD (merged or not) the loop calls reap(), which
// waitpid(-1, WNOHANG)s until nothing is left to collect. The workload's pid is registered right
// after fork, before the loop can call reap(), so its status cannot be taken for an orphan's; it
// is delivered exactly once. Every other pid is an orphan: reaped and counted.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "protocol/frame.hpp"
#include "protocol/messages.hpp"

namespace nes::init {

/// A process `exec` started, reaped: its pid and status.
struct ExecReaped {
  pid_t pid = 0;
  proto::WorkloadExited status;
  bool operator==(const ExecReaped&) const = default;
};

/// What one reap() collected.
struct Reaped {
  std::optional<proto::WorkloadExited> workload;  // set once: the registered pid's status
  std::vector<ExecReaped> execs;                   // registered exec'd pids reaped, each once
  unsigned orphans = 0;                            // other pids reaped in this call
  bool no_children = false;                        // waitpid said ECHILD: no child is left
  bool operator==(const Reaped&) const = default;
};

/// A wait(2) status as the wire carries it: exit_code 0..255, or signal 1..64 (a kill never
/// looks like a clean run). Stopped/continued statuses do not occur without WUNTRACED.
proto::WorkloadExited to_exit(int wait_status);

class Reaper {
 public:
  /// Register the workload's pid (> 0). Replaces any earlier registration.
  void watch(pid_t pid) { workload_ = pid; }
  /// Register a pid `exec` started (> 0), beside the workload: its status is delivered once, in
  /// Reaped::execs. At most proto::kExecMax at once (false: not registered).
  bool watch_exec(pid_t pid);
  /// Forget `pid`'s registration, the workload's or an exec'd one's (e.g. the spawn failed and
  /// the child was collected directly).
  void forget(pid_t pid);
  pid_t watched() const { return workload_; }

  /// Collect every child that has exited (waitpid(-1, WNOHANG) until 0 or ECHILD); EINTR is
  /// retried. Bounded by the number of exited children.
  Reaped reap();

  /// Orphans reaped since construction.
  std::uint64_t orphans_total() const { return orphans_total_; }

 private:
  pid_t workload_ = 0;
  pid_t execs_[proto::kExecMax] = {};  // 0: a free slot
  std::uint64_t orphans_total_ = 0;
};

}  // namespace nes::init
