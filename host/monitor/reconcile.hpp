// What a VM is doing, from its state dir alone: the monitor that serves a generation
// (`<state_dir>/<vm>/monitor.json`), an explicit stop (`stop.json`), the outcome record
// (`outcome.json`, host/lib/record.hpp), and the one reconcile rule every reader uses (ps, inspect,
// wait, rm, stop). The rules and why: docs/host.md "Detached VMs and reconcile".
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/record.hpp"
#include "host/lib/state_dir.hpp"
#include "host/lib/base.hpp"

namespace nes::host {

/// One process for good: its pid, its start time (field 22 of /proc/PID/stat, clock ticks since
/// boot) and the kernel's boot id (/proc/sys/kernel/random/boot_id). A recycled pid has another
/// start time; after a reboot the boot id differs. A bare pid never names a monitor.
struct ProcessIdentity {
  pid_t pid = 0;
  unsigned long long start_time = 0;
  std::string boot_id;
  bool operator==(const ProcessIdentity&) const = default;
};

/// The identity of process `pid` now, or nullopt if there is none (or /proc is unreadable).
std::optional<ProcessIdentity> identity_of(pid_t pid);
/// The calling process's identity (nullopt only without /proc).
std::optional<ProcessIdentity> self_identity();
/// true iff the process `id` names still runs: same pid, same start time, same boot, and not a
/// zombie (a zombie has exited; only its parent has not reaped it yet).
bool is_alive(const ProcessIdentity& id);
/// A pidfd (pidfd_open(2)) on the process `id` names, opened first and its identity checked after
/// (is_alive), so a pid reused by another process is never pinned. Empty if it is gone, is another
/// process now, or pidfd_open failed.
Fd pin_process(const ProcessIdentity& id);

/// `<state_dir>/<vm>/monitor.json` (schema_version 1): the process serving one generation of a VM
/// (the `neshost run` process, detached or not). Written before the VMM starts; left behind when
/// the monitor exits (it still names the generation and the command for `ps -a`).
struct MonitorInfo {
  static constexpr int kSchemaVersion = 1;
  std::string vm;
  std::uint64_t generation = 0;
  ProcessIdentity monitor;
  WallTime created_at{};
  std::vector<std::string> command;  // the workload's argv, for humans (ps)
  /// Published ports as `docker ps` shows them ("127.0.0.1:8080->80/tcp"; `neshost ps`/`port`).
  /// Additive: written only when there are some, absent reads as none.
  std::vector<std::string> ports;
  bool operator==(const MonitorInfo&) const = default;
};
/// One compact JSON object plus '\n'.
std::string encode_monitor(const MonitorInfo& m);
/// Parse and validate; the error names the field. Unknown fields are ignored.
Result<MonitorInfo> parse_monitor(std::string_view json);

/// Start a new generation of `m.vm` with `m.monitor` as its monitor: under the VM's lock
/// (`<vm>/.lock`, the one write_record() takes), refuse if the monitor of the current generation
/// is alive, or its VMM (vmm.json) is alive with no outcome recorded (an orphaned VM); else the new generation is one more than any on disk (monitor.json or outcome.json;
/// 1 for a new VM), a stop request of an older generation is dropped, and monitor.json is written
/// durably (temp, fsync, rename, fsync dir). Returns the generation; `m.generation` is ignored.
/// A monitor whose generation is already recorded is only powering its VM off: it is waited for
/// first, at most `settle` (then refused like a live one: e.g. a VM kept up by --on-exit keep).
/// Blocking (bounded: `settle`, then the lock is tried for at most 5 s).
Result<std::uint64_t> begin_generation(const std::filesystem::path& state_dir, MonitorInfo m,
                                       std::chrono::milliseconds settle = std::chrono::seconds(10));

/// A replacement monitor takes generation G of `vm` over (docs/host.md "Re-adoption"): under the
/// VM's lock, only if monitor.json's monitor of G is gone and G's VMM (vmm.json) still runs (an
/// outcome of G may be recorded: its acknowledgement may still be owed); then monitor.json is
/// rewritten durably with `self` as G's monitor (the rest as it was). Returns the monitor record
/// as written. Errors say which condition failed ("the monitor (pid P) of generation G is
/// alive", "a newer generation is recorded", "no VMM of generation G is recorded", "its VMM is
/// gone").
Result<MonitorInfo> take_over_generation(const std::filesystem::path& state_dir, std::string_view vm,
                                         const ProcessIdentity& self);

/// What persist_stop() did.
struct StopResult {
  enum class Kind {
    persisted,          // stop.json now holds this generation: the VM reconciles as stopped
    already_requested,  // it held it already
    already_final       // an outcome of this generation was recorded first: nothing written
  };
  Kind kind = Kind::persisted;
  std::optional<Record> record;  // already_final: that outcome
};
/// Persist an explicit stop of `generation` (compare-and-set under the VM's lock): written only if
/// no outcome of that generation is recorded yet, so whichever of the stop and the natural exit
/// takes the lock first decides the status, and a later exit never turns `stopped` into `exited`.
/// `reason` (stop.json's additive `reason`): set when the VM's monitor ends it for a cause of its
/// own, not a user's request (a helper daemon died: docs/host.md "Re-adoption"); reconcile then
/// says "stopped by its monitor at T: REASON; then …".
Result<StopResult> persist_stop(const std::filesystem::path& state_dir, std::string_view vm,
                                std::uint64_t generation, std::string_view reason = {});

/// A VM's status as every reader reports it.
enum class VmStatus { running, exited, failed, stopped };
std::string_view to_string(VmStatus s);

/// The reconciled view of one VM.
struct VmState {
  std::string vm;
  std::uint64_t generation = 0;    // the current generation
  VmStatus status = VmStatus::failed;
  std::optional<int> exit_status;  // set unless running: the record's (reported_status: 125
                                   // when its output was lost), 125 failed, 143 stopped
  std::string reason;              // one line saying why this status (always set)
  std::optional<Record> record;    // the current generation's valid record, if any
  std::optional<MonitorInfo> monitor;
  bool monitor_alive = false;
  bool stop_requested = false;     // a stop of the current generation is persisted
  /// Running with its vCPUs stopped (`neshost pause`, the shim's Pause): the monitor's
  /// `paused` marker names the current generation (mark_paused).
  bool paused = false;
  /// The current generation's VMM (vmm.json, host/monitor/vmm_record.hpp: a detached VM's QEMU
  /// or sandbox, which outlives its monitor), and whether it still runs.
  std::optional<ProcessIdentity> vmm;
  bool vmm_alive = false;
  /// Its monitor is gone and its VMM runs: running with no outcome recorded, or an outcome
  /// recorded whose acknowledgement the guest still waits for (it would wait out its reconnect
  /// window before powering off). A neshost command that finds it so starts a replacement
  /// monitor (host/monitor/adopt.hpp), which acknowledges the record on disk and powers it off.
  bool orphaned() const { return !monitor_alive && vmm_alive; }
};

/// The one reconcile rule, from the state dir alone (no lock; liveness is read before the record
/// so a monitor that records and exits in between is never taken for a lost one):
///   stop persisted for G, and (a record of G or the monitor and VMM gone) -> stopped
///   a valid record of G (vm matches)   -> exited (exited/signalled) or failed (its reason);
///                                         a host-ended `stopped` outcome -> stopped
///   the monitor of G alive, no record  -> running
///   the monitor gone, its VMM alive (vmm.json of G), no record -> running (orphaned(): a
///                                         replacement monitor takes it over)
///   the monitor and VMM gone, no valid record -> failed, saying why (missing, unreadable, stale)
/// G is the newest generation on disk (monitor.json or outcome.json); older ones are ignored.
/// nullopt: no such VM (no directory, or neither file). Error: the state dir cannot be read.
Result<std::optional<VmState>> reconcile(const std::filesystem::path& state_dir, std::string_view vm);

/// `<state_dir>/<vm>/paused`: present, naming the generation ("G\n"), while the VM's monitor holds
/// its vCPUs stopped; written durably before `pause` answers, removed before `resume` answers and
/// when the VM ends. A marker of another generation is stale and ignored.
inline constexpr char kPausedFile[] = "paused";
/// Writes the marker for `generation`, durably (write_durable). Errors name the file.
Status mark_paused(const std::filesystem::path& state_dir, std::string_view vm, std::uint64_t generation);
/// Removes the marker (absent: Ok). Errors name the file.
Status clear_paused(const std::filesystem::path& state_dir, std::string_view vm);
/// The generation the marker names; nullopt when absent or unreadable.
std::optional<std::uint64_t> paused_generation(const std::filesystem::path& state_dir, std::string_view vm);

/// One JSON object plus '\n' (what `neshost inspect` prints): the current generation's record
/// fields when there is a valid record (schema_version .. finished_at, as encode_record), else
/// vm, generation, outcome null, exit_status; then status, status_reason, monitor_pid (null
/// without a monitor file), monitor_alive, stop_requested, vmm_pid (null without a recorded VMM),
/// vmm_alive, paused.
std::string encode_state(const VmState& s);

/// One JSON object plus '\n' (what `neshost wait --format json` prints, docker's `wait` status
/// with what tells a code from a signal): vm, generation, status (exited, failed, stopped),
/// outcome (the record's, null without one), exit_code (set only for `exited`), signal (only for
/// `signalled`: the number, e.g. 9), exit_status (what plain `wait` prints and exits with: the
/// code, 128+N for signal N, 125 when output was lost or there is no record), reason (the
/// status_reason), and started_at, finished_at, lost, truncated as the record has them.
std::string encode_wait(const VmState& s);

/// VM ids with a directory in `state_dir` (sorted; other entries ignored). Empty if none.
std::vector<std::string> list_vms(const std::filesystem::path& state_dir);

/// Delete `<state_dir>/<vm>/` and everything in it, under the VM's lock; refused while the
/// current generation's monitor is alive (or its VMM, unrecorded: an orphaned VM), unless that monitor is `self` (the caller: `neshost run
/// --rm` removing its own VM at its end).
Status remove_vm(const std::filesystem::path& state_dir, std::string_view vm,
                 const std::optional<ProcessIdentity>& self = std::nullopt);

}  // namespace nes::host
