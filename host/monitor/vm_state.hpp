// What a monitor keeps of its VM beside the session: the files in STATE/VM/ (monitor.json,
// vmm.json and boot.json for a VMM that outlives it, the console and passt logs) and the processes
// it runs beside the VMM (docs/host.md "Detached VMs", "Re-adoption").
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host/cli/plan.hpp"
#include "host/lib/base.hpp"
#include "host/monitor/console_log.hpp"
#include "host/monitor/output_resume.hpp"
#include "host/monitor/stdin_spool.hpp"
#include "host/monitor/vmm_record.hpp"
#include "host/vm/passt.hpp"
#include "host/vm/process.hpp"
#include "host/vm/virtiofsd.hpp"

namespace nes::monitor {

/// What the run keeps in STATE/VM/ and the processes beside its VMM, for the Monitor.
struct VmResources {
  /// A VMM that outlives us (RunPlan::vmm_survives): vmm.json as written so far; each spawn's
  /// gate (vm::LaunchOptions::before_exec) adds the new process and writes it durably.
  std::optional<host::VmmInfo> vmm_info;
  /// A replacement monitor (`neshost monitor`): the VMM it took over, and the daemons recorded
  /// beside it (reaped by identity at the end).
  std::unique_ptr<vm::VmProcess> adopted;
  std::vector<host::VmmDaemon> adopted_daemons;
  std::shared_ptr<ConsoleOut> console;
  std::filesystem::path console_log;
  std::vector<std::unique_ptr<vm::Virtiofsd>> daemons;
  std::unique_ptr<vm::Passt> passt;  // --network passt
  /// --snapshot: the RAM QEMU maps (the snapshot's file, or with shares a private copy of it:
  /// vm::copy_ram) and the device state it loads, both as checked (vm::open_snapshot).
  host::Fd snapshot_ram, snapshot_state;
  std::filesystem::path passt_log;
  int netns_fd = -1;  // --network netns: the namespace QEMU runs in (owned by run_main's attachment)
  /// -i with a FIFO stdin and a VMM that outlives us: the bytes taken from it, in stdin.spool.
  std::optional<host::StdinSpool> stdin_spool;
  /// A replacement monitor of a workload with stdin attached: it reopens `stdin_source` (when
  /// the original recorded one) once the guest said its stdin position, else ends stdin (EOF).
  bool adopt_stdin = false;
  std::optional<host::VmmStdin> stdin_source;
  /// A VMM that outlives us with its output going to sinks another process can reopen (vmm.json's
  /// `stdout`/`stderr`): each stream's bytes written there, counted (host/monitor/output_resume.hpp).
  std::optional<OutputTally> output_tally;
  /// Which streams' writers go to a recorded sink, and so are counted in output_tally.
  bool count_out = false, count_err = false;
  /// A replacement's: the recorded sinks reopened (absent: our own fds 1 and 2), the bytes of each
  /// stream (stdout, stderr) the sink already has of what the guest replays (dropped), and what
  /// it lacks before that (taken back out of workload.log, written first).
  host::Fd out_sink, err_sink;
  std::uint64_t skip_out = 0, skip_err = 0;
  std::string backlog_out, backlog_err;
};

/// `fd` as a stdin source another process can open again (host::VmmStdin): a FIFO or a regular
/// file whose /proc/self/fd link names a path that is still the same inode; nullopt for a
/// terminal, an anonymous pipe ("pipe:[N]"), a socket, /dev/null, a deleted or renamed file.
std::optional<host::VmmStdin> stdin_source_of(int fd);

/// The spawner's gate for a process that outlives us: its identity added to vmm.json (as the
/// daemon `name`, or as the VMM when `name` is empty) and written durably before it may exec.
/// Empty when nothing outlives us (no vmm.json). `plan` and `run` must outlive the gate.
std::function<host::Status(pid_t)> record_gate(const cli::RunPlan& plan, VmResources& run, std::string name);

/// STATE/VM/: the record's directory, monitor.json (this run's identity, for `neshost stop`),
/// the console log, passt's log; with a VMM that outlives us, vmm.json and boot.json (and -i's
/// stdin.spool) before anything that outlives us starts. Begins this run's generation (into
/// plan.serve.session.generation). Errors: the state dir's, begin_generation()'s, the writes'.
host::Status open_vm_state(cli::RunPlan& plan, VmResources& run);

}  // namespace nes::monitor
