// A detached VM's VMM side, recorded in `<state_dir>/<vm>/vmm.json` so that a process other than
// the monitor that started it can find it, tell whether it still runs and take it over when that
// monitor is gone (docs/host.md "Re-adoption"): the VMM's and each helper daemon's identity, the
// sockets its chardevs redial, and what the replacement monitor needs to serve the rest of the
// generation as the original would have (on_exit, timeouts, log rotation, --rm). The boot
// descriptor itself is beside it in `boot.json` (the `boot` message as sent).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"
#include "host/lib/record.hpp"
#include "host/lib/session.hpp"
#include "host/monitor/reconcile.hpp"
#include "protocol/messages.hpp"

namespace nes::host {

/// File names in a VM's directory.
inline constexpr char kVmmFile[] = "vmm.json";
inline constexpr char kBootFile[] = "boot.json";
/// flock(2)ed (LOCK_EX|LOCK_NB) by a replacement monitor for its whole life: two racing
/// replacements of one VM, one wins (the other exits 0 saying so).
inline constexpr char kAdoptLock[] = "adopt.lock";

/// One helper process (virtiofsd for a share, passt) that outlives the monitor with the VMM.
struct VmmDaemon {
  std::string name;  // "virtiofsd nes.v0", "passt": for messages
  ProcessIdentity id;
  bool operator==(const VmmDaemon&) const = default;
};

/// Where a `-i` workload's stdin comes from when another process can open it again, so that a
/// replacement monitor goes on feeding it: a FIFO (a named pipe, as containerd's stdin: spliced
/// through `stdin.spool`, host/monitor/stdin_spool.hpp, so what the dead monitor had taken and
/// the guest never received is sent again from there) or a regular file (read again from the
/// guest's stdin position plus `offset`). Both exact. A terminal, an anonymous pipe or /dev/null
/// cannot be reopened: no source is recorded and a replacement gives the workload's stdin its
/// EOF, saying why.
struct VmmStdin {
  enum class Kind { fifo, file };
  Kind kind = Kind::fifo;
  std::filesystem::path path;  // absolute
  std::uint64_t offset = 0;    // bytes: a file's read offset when the run began (0 for a FIFO)
  bool operator==(const VmmStdin&) const = default;
};

/// Where the workload's stdout or stderr goes when another process can open it again, so that a
/// replacement monitor writes on to it at the first byte not yet delivered (`output.pos`,
/// host/monitor/owed_output.hpp): containerd's FIFO (opened read-write, as the shim opens it:
/// the pipe never loses its last reader) or a regular file (`ctr run --log-uri file://`,
/// appended to). A terminal, a socket or an anonymous pipe cannot be reopened: none is recorded
/// and a replacement writes the output to workload.log alone, as before.
struct VmmSink {
  enum class Kind { fifo, file };
  Kind kind = Kind::fifo;
  std::filesystem::path path;  // absolute
  bool operator==(const VmmSink&) const = default;
};

/// netns mode's attachment (host/vm/netns.hpp), so that whoever ends the VM tears the tap and the
/// redirects down, not only the monitor that made them: the namespace's path as given, the tap's
/// name and the interface it is tied to.
struct VmmNetns {
  std::filesystem::path path;
  std::string tap, interface;
  bool operator==(const VmmNetns&) const = default;
};

/// `vmm.json` (schema_version 1), written durably (temp, fsync, rename, fsync dir) by the monitor
/// that starts the VM: once per helper daemon and once for the VMM, each time from the spawner's
/// gate (vm::LaunchOptions::before_exec), i.e. *after* fork and *before* the process may exec, so
/// a process that runs is always recorded (a monitor killed before the write leaves a child that
/// never execs). Only for a VM whose VMM outlives its monitor (`neshost run -d`).
struct VmmInfo {
  static constexpr int kSchemaVersion = 1;
  std::string vm;
  std::uint64_t generation = 0;
  std::optional<ProcessIdentity> vmm;  // QEMU, or --sandbox's unshare; absent until it is started
  std::vector<VmmDaemon> daemons;      // in start order
  std::filesystem::path runtime_dir;   // the private $TMPDIR/neshost-XXXXXX the sockets live in
  std::filesystem::path channel_socket, data_socket;  // where the chardevs (or the init) redial
  bool sandbox = false;
  /// What the replacement monitor serves the generation with (the original's flags).
  OnExitPolicy on_exit = OnExitPolicy::stop;
  std::chrono::milliseconds stop_timeout{10000}, grace{10000}, reconnect{0};
  std::uint64_t log_max_size = 10u << 20;  // bytes
  unsigned log_max_files = 5;
  bool rm = false;  // --rm
  std::optional<VmmStdin> stdin_source;  // `stdin`: absent or null without one (see VmmStdin)
  /// Duties a replacement takes over (each absent in an older vmm.json, and then not taken):
  /// `started_at` (RFC 3339): when the VM started, the session's vm_started (Session::started_at),
  /// written right after it: the outcome record's started_at whoever records it.
  std::optional<WallTime> started_at;
  /// `timeout_ms`: `run --timeout`; `deadline_boottime_ns`: when it ends the workload, on
  /// CLOCK_BOOTTIME (one clock for every process of this boot, never set back): first the VM's
  /// start plus the limit (earlier than the session's own, which runs from `boot`), then, at the
  /// workload's first `started`, the session's (started plus the limit). A replacement arms what
  /// is left of it (SessionConfig::wall_left): never later than the first monitor would have.
  std::optional<std::chrono::milliseconds> wall_timeout;
  std::optional<std::int64_t> wall_deadline_ns;
  std::optional<VmmNetns> netns;  // `netns`: netns mode's attachment (absent in other modes)
  /// `stdout`, `stderr`: the workload's output sinks (VmmSink; absent: none a replacement can open).
  std::optional<VmmSink> stdout_sink, stderr_sink;
  bool operator==(const VmmInfo&) const = default;
};

/// One compact JSON object plus '\n'.
std::string encode_vmm(const VmmInfo& v);
/// Parse and validate; the error names the field. Unknown fields are ignored.
Result<VmmInfo> parse_vmm(std::string_view json);
/// Durable write of `<state_dir>/<vm>/vmm.json` (write_durable). Error names the file.
Status write_vmm(const std::filesystem::path& state_dir, const VmmInfo& v);
/// `<state_dir>/<vm>/vmm.json`: nullopt if absent; an error if unreadable or invalid.
Result<std::optional<VmmInfo>> load_vmm(const std::filesystem::path& state_dir, std::string_view vm);

/// `boot.json`: the descriptor as the `boot` message encodes it (protocol/codec.hpp), durably.
Status write_boot(const std::filesystem::path& state_dir, std::string_view vm, const proto::Boot& b);
/// The descriptor back (decoded as the guest would); errors name the file and field.
Result<proto::Boot> load_boot(const std::filesystem::path& state_dir, std::string_view vm);

/// CLOCK_BOOTTIME now, ns (the clock of VmmInfo::wall_deadline_ns).
std::int64_t boottime_ns();

/// true iff `v` names a VMM that still runs (is_alive on its identity).
bool vmm_alive(const VmmInfo& v);

}  // namespace nes::host
