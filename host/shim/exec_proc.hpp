// A process the VM's monitor runs for the shim (docs/containerd.md "Exec"): an exec added to a
// task, or a pod's container's own process (the monitor starts it with `exec.container`, its
// root under the pod's share; its execs join it with `exec.in`), as containerd's runc shim has
// process.execProcess beside process.Init. The VM's control socket takes an `exec` request with
// containerd's FIFOs for the process (SCM_RIGHTS) and answers on the same connection "ok started
// PID PROC", then "ok exit STATUS" (host/monitor/control.hpp); the shim reads that connection on
// its loop. Kill and ResizePty go to the control socket naming PROC. Its Start's intent, its
// start and its end are journaled (host/shim/exec_journal.hpp) before they are told.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>

#include "host/monitor/monitor.hpp"
#include "host/shim/oci_spec.hpp"
#include "host/shim/process.hpp"

namespace nes::shim {

class Shim;

/// (task id, exec id): an exec; (container id, ""): a pod's container's own process.
using ProcKey = std::pair<std::string, std::string>;

/// What running through the monitor adds to a Process (host/shim/process.hpp).
struct ExecProc : Process {
  /// Exec `exec_id` of task `task_id`, or with `exec_id` empty the pod's container `task_id`.
  ExecProc(Shim& shim, std::string task_id, std::string exec_id);
  Shim& shim;
  std::string task;  // the task it belongs to: the shim's own, or a pod's container
  TaskSpec spec;
  std::string spec_json;  // an exec's: containerd's OCI process JSON, for the exec journal
  bool restored = false;  // running when a replaced shim took it over from the journal (its start was published)
  bool stdin_closed = false;  // CloseIO came (journaled: a replacement holds no writer)
  std::uint16_t proc = 0;     // the monitor's number for it (0 until started)
  boost::asio::local::stream_protocol::socket sock;
  // Shared with the read in flight: a read cancelled by close() still completes into it, after
  // Delete may have freed the process.
  std::shared_ptr<boost::asio::streambuf> buf;
  std::optional<ttrpc::Respond> start_respond;
  std::optional<std::pair<std::uint32_t, std::uint32_t>> pending_resize;  // height, width before it started
  std::optional<std::uint32_t> pending_signal;  // a Kill that came while its Start was in flight
  std::optional<std::pair<std::uint32_t, std::uint32_t>> last_size;  // the size the monitor was told (ResizePty)
  // Until the monitor's control socket takes the request (a VM just started has none yet).
  cli::control::Exec request;
  host::Fd in, out, err;
  std::optional<boost::asio::steady_timer> retry;
  std::chrono::steady_clock::time_point connect_deadline;
  // Its end not yet journaled (announce_end): the next try, and how many failed.
  std::optional<boost::asio::steady_timer> end_retry;
  unsigned end_tries = 0;

  /// Its key in the shim (ProcKey).
  ProcKey key() const { return {task, exec ? id : std::string()}; }
  /// "exec ID", or "task ID" for a pod's container: what a message calls it.
  std::string name() const;

  /// Start (created, its task running): its streams opened, the `exec` request built (`in`: the
  /// monitor's number of the pod container an exec joins), its intent journaled, then sent
  /// (connect()); `respond` answered once the monitor says it started or failed. Errors answer
  /// at once: the streams' (INVALID_ARGUMENT), a request the protocol refuses, the journal's
  /// (INTERNAL, nothing sent).
  void start(std::optional<std::uint16_t> in, ttrpc::Respond respond);
  /// Waits for its end through a connection of its own (`wait PROC`: restored running).
  void wait_end();
  /// It is over with `status` (`why`: what went wrong). If it never started, its Start fails with
  /// `why` instead, as runc's shim fails Start for an exec whose program cannot run. Told once
  /// its end is journaled (announce_end; `hold` false: at once, the failure a warning).
  void ended(std::uint32_t status, std::string why, bool hold = true);
  /// Kill: `signal` through the monitor (PROC), or held until its Start in flight answers.
  ttrpc::Reply kill(std::uint32_t signal);
  /// ResizePty: through the monitor, or the size it starts with when not started yet.
  ttrpc::Reply resize(std::uint32_t height, std::uint32_t width);
};

/// Sends exec `k`'s request to the VM's monitor. A task just started may not have its control
/// socket yet (`neshost run` is setting up): tried again every 20 ms for up to 30 s.
void connect_exec(Shim& shim, const ProcKey& k);
/// The monitor's next line about exec `k` (its start, then its end).
void read_exec(Shim& shim, const ProcKey& k);
/// Tells exec `k`'s end (ExecProc::ended: its Start's failure answered, its /tasks/exit
/// published, its waiters answered) once the journal holds it. A journal write that fails holds
/// all of that back: the exec stays as it was before its end (State RUNNING, Wait waiting, Delete
/// refused) and the write is tried again every second, said in the log at the first failure and
/// when it succeeds. A replacement shim meanwhile finds it running in the journal and gets its
/// end from the monitor (`wait PROC`: the last 64 ended processes' status). `hold` false (it ends
/// with its container's Delete, which is durable by the container's receipt): told at once, the
/// failure a warning.
void announce_end(Shim& shim, const ProcKey& k, bool started, std::string why, bool hold);

}  // namespace nes::shim
