// The task's exec journal (`<bundle>/nesinit-execs.json`): every exec of the shim's own task as
// the shim last knew it, written durably (host/monitor/reconcile.hpp write_durable) before the
// effect it announces (Start's intent before the request reaches the VM's monitor; a Delete's
// answer before the exec is forgotten), so a shim started again on the bundle after a SIGKILL
// (TaskService::restore) takes every exec over as it was (a pod's sandbox journals the pod's
// containers and the execs in them the same way): an added one can be started, a running
// one is waited for through the monitor (`wait PROC`), a stopped one answers Wait and Delete with
// its own status, and a deleted one's receipt answers a retried Delete identically. Why:
// docs/containerd.md "A shim replaced".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"

namespace nes::shim {

/// The journal's file name in the task's bundle.
inline constexpr const char* kExecJournalFile = "nesinit-execs.json";
/// The longest process spec (OCI JSON) an exec may have: bytes. The VM's monitor takes an `exec`
/// request of at most 64 KiB (host/monitor/control.hpp kRequestMax), so a longer spec could never
/// start; the shim's Exec refuses it.
inline constexpr std::size_t kExecSpecMax = 64u << 10;
/// The most live execs (the shim's bound per task) and deleted execs' receipts (the oldest
/// forgotten first) the journal holds.
inline constexpr std::size_t kExecLiveMax = 16;
inline constexpr std::size_t kExecReceiptsKept = 64;
/// The most entries a journal holds (a pod's sandbox journals its containers and their execs).
inline constexpr std::size_t kExecJournalEntriesMax = 1024;
/// The longest journal a shim reads back: bytes (a spec is kept only while its exec is not yet
/// started: kExecLiveMax specs of kExecSpecMax, each at most doubled by JSON's escapes, fit).
inline constexpr std::size_t kExecJournalMax = 4u << 20;

/// Where an exec is, as the journal says it.
enum class ExecState {
  added,     // Exec answered: containerd may Start it
  starting,  // Start's intent: the request may have reached the monitor, its answer did not reach the shim
  running,   // the monitor answered `ok started PID PROC`
  stopped,   // it ended (exit_status, exited_at_ns), or its Start failed
  deleted,   // DeleteProcess answered (pid, exit_status, exited_at_ns: the receipt)
};
/// "added", "starting", ...: the journal's spelling.
std::string_view to_string(ExecState s);

/// One exec of the task, or (a pod's sandbox) one of the pod's containers or an exec in one.
struct ExecEntry {
  std::string id;    // containerd's exec id (1..256 bytes); a pod's container: its container id
  std::string spec;  // the OCI process JSON of its ExecProcessRequest (empty once deleted)
  std::string stdin_path, stdout_path, stderr_path;  // containerd's; empty: none
  bool terminal = false;
  ExecState state = ExecState::added;
  std::uint16_t proc = 0;          // the monitor's number for it (running and after; 0: never started)
  std::uint32_t pid = 0;           // its pid in the guest (0: never started)
  std::uint32_t exit_status = 0;   // stopped, deleted
  std::int64_t exited_at_ns = 0;   // stopped, deleted: CLOCK_REALTIME ns
  /// A pod's: the container an exec runs in (empty: the shim's own task). Optional on the wire.
  std::string task;
  /// A pod's container itself (not an exec), its bundle (absolute; empty once deleted): its
  /// record and config.json there say the rest. Optional on the wire (absent: false, empty).
  bool container = false;
  std::string bundle;
  /// CloseIO closed its stdin: a replacement holds no writer on its FIFO. Optional (false).
  bool stdin_closed = false;
  bool operator==(const ExecEntry&) const = default;
};

/// One JSON object plus '\n': `{"schema_version":1,"execs":[{...},...]}`, entries in order.
std::string encode_exec_journal(const std::vector<ExecEntry>& execs);
/// Parse; errors name the entry's index and the field (`nesinit-execs.json: execs[2].state:
/// expected one of added, starting, running, stopped, deleted`), and refuse a duplicate (task,
/// id, container) and more than kExecJournalEntriesMax entries.
host::Result<std::vector<ExecEntry>> parse_exec_journal(std::string_view json);

class Shim;  // host/shim/container.hpp

/// Writes `<bundle>/nesinit-execs.json` durably from what `shim` knows now: every exec and pod
/// container not deleted (a spec kept only until its process started), then the newest
/// kExecReceiptsKept receipts of deleted ones, oldest first; the oldest receipts dropped to stay
/// within kExecJournalEntriesMax and kExecJournalMax. `point`: the write's fault point
/// (durable.hpp: "journal:exec-add", ...). Errors: live processes alone over the bounds, or
/// write_durable's, naming the file and the errno. Nothing is written once the shim's own task
/// is deleted (its bundle is containerd's to remove).
host::Status save_exec_journal(Shim& shim, std::string_view point);

/// Takes over what the journal names (TaskService::restore, the shim's own task running): an
/// added exec as created (containerd may Start it), a running one waited for through the
/// monitor (`wait PROC`: its end is this shim's to report), a stopped one with its status and
/// time, a deleted one's receipt kept; a pod's containers first (from their bundles' records and
/// config.json; one whose record is gone but whose receipt is there: deleted), then their execs.
/// One whose Start was in flight when the shim died (`starting`: containerd failed that Start)
/// is stopped with 125 and a warning. The journal is written back once, as taken over, before
/// any wait. Returns a summary for the log ("" when none).
std::string restore_exec_journal(Shim& shim);

}  // namespace nes::shim
