// One process of a task as the task API sees it (host/shim/container.hpp): the task's own
// (neshost run, the VM's monitor) or one `Exec` added to it, as containerd's runc shim has one
// process.Process for both. What every RPC reads or answers about a process lives here once:
// its id, pid, stdio paths, terminal, phase, exit status and time, its stdin hold and waiters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "containerd_pb.h"
#include "host/lib/base.hpp"
#include "host/shim/events.hpp"
#include "host/shim/ttrpc.hpp"

namespace nes::shim {

/// Where a process is in its life. `none` (before Create) and `deleted` (after Delete) are the
/// task's only; an exec is `created` when added and goes once it is deleted.
enum class Phase { none, created, running, stopped, deleted };

/// A process's own ends of its three streams, to hand to whoever runs it.
struct Streams {
  host::Fd in, out, err;
};

/// Opens containerd's stream at `path` for a child: its FIFO (non-blocking open, then blocking;
/// an output FIFO read-write, as runc's shim holds a read end: output waits in it while no one
/// reads, never EPIPE), `file://PATH`
/// (output only: appended to a regular file, as runc's shim takes ctr's --log-uri), or /dev/null
/// when empty. Errors name the path and the errno.
host::Result<host::Fd> open_stdio(const std::string& path, bool input);

/// One process: the task's (`exec` false; `id` the task's) or an exec's (`id` its exec id).
struct Process {
  std::string id;
  bool exec = false;
  std::uint32_t pid = 0;  // the task's: neshost run's (0 until started); an exec's: in the guest
  std::string stdin_path, stdout_path, stderr_path;  // containerd's; empty: none (/dev/null)
  bool terminal = false;
  Phase phase = Phase::none;
  std::uint32_t exit_status = 0;
  std::int64_t exited_at_ns = 0;  // CLOCK_REALTIME, ns
  // A writer of the shim's own on the stdin FIFO, as runc's shim holds one: a client that
  // detaches (its writer closed) is not the process's EOF; CloseIO (stdin) is.
  host::Fd stdin_hold;
  // The task's (not an exec's): a reader of the shim's own on the stdin FIFO that never reads.
  // While the task's monitor is replaced (SIGKILLed, then adopted: docs/host.md "Re-adoption"),
  // a client's writes wait in the FIFO instead of failing with EPIPE; the replacement reads on.
  host::Fd stdin_reader;
  // The task's: a writer (and reader) of the shim's own on each output FIFO, as runc's shim
  // holds one, until the task ends. The monitor is otherwise the FIFO's one writer: SIGKILLed,
  // it would end containerd's read (EOF: ctr stops copying and closes its end), and what its
  // replacement writes on at the first byte not yet delivered (host/monitor/output_resume.hpp)
  // would wait in a pipe nobody reads (issue 48).
  host::Fd stdout_hold, stderr_hold;
  std::vector<ttrpc::Respond> waiters;  // Wait calls answered at its exit

  /// containerd's status for `phase` (none and deleted: STOPPED).
  containerd::v1::types::Status status() const;
  /// State's answer (`bundle`: the task's). The task's pid before it started is the shim's own.
  containerd::task::v2::StateResponse state(const std::string& bundle) const;
  /// Wait's answer: the exit status and time.
  containerd::task::v2::WaitResponse wait_response() const;
  /// Delete's answer: the pid, exit status and time.
  containerd::task::v2::DeleteResponse delete_response() const;
  /// Opens its three streams (open_stdio) and, with a stdin, the stdin hold (after the read end
  /// is open, so the non-blocking writer's open succeeds at once). Errors: open_stdio's.
  host::Result<Streams> open_streams();
  /// With a stdin FIFO: its hold (a writer, so the reader never sees EOF before CloseIO) and,
  /// for the task, a reader; non-blocking opens, which succeed once a read end is open (ours in
  /// open_streams(), the monitor's after a shim's restore).
  void hold_stdin();
  /// The task's output FIFOs held (stdout_hold, stderr_hold; a `file://` or no path: nothing),
  /// read-write non-blocking opens, which never wait for a peer.
  void hold_output();
  /// It ended with `status` at `at_ns`: stopped, its stdin and output holds closed (containerd's
  /// reader sees EOF once the monitor, gone by now, has closed its end too).
  void stop(std::uint32_t status, std::int64_t at_ns);
  /// Publishes its /tasks/exit (`container`: the task's id) and answers every waiter.
  void report_exit(Publisher& events, const std::string& container);
};

/// CLOCK_REALTIME now, ns.
std::int64_t now_ns();
/// Sets `t` to `ns` (CLOCK_REALTIME ns).
void set_time(google::protobuf::Timestamp* t, std::int64_t ns);

}  // namespace nes::shim
