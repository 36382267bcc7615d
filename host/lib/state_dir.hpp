// A VM's state dir `<state_dir>/<vm>/`: the one owner of its layout. The VM id check, the name of
// every file in it (an on-disk contract: `neshost`, the shim, the library and whoever reads the
// state dir agree on these names), the paths built from them, and the safe, durable ways in: the
// VM dir opened once O_NOFOLLOW and everything else relative to it, directories 0700 fsynced into
// their parent, files 0600, replaced by temp + fsync + rename + fsync dir. Why each rule:
// docs/host.md "Durability" and "Detached VMs and reconcile". Installed as
// <nes/host/lib/state_dir.hpp>.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "host/lib/base.hpp"

namespace nes::host {

// ---- the names inside <state_dir>/<vm>/ ----

/// The durable outcome record (host/lib/record.hpp); its temps are `.outcome.json.PID.N.tmp`.
inline constexpr char kOutcomeFile[] = "outcome.json";
/// The monitor serving the current generation (host/monitor/reconcile.hpp MonitorInfo).
inline constexpr char kMonitorFile[] = "monitor.json";
/// An explicit stop of one generation (host/monitor/reconcile.hpp persist_stop()).
inline constexpr char kStopFile[] = "stop.json";
/// The monitor's control socket (`stop`, `kill SIG`, `exec`, ...; host/monitor/monitor.hpp).
inline constexpr char kControlSocket[] = "control.sock";
/// The workload's stdout/stderr log (host/lib/log_writer.hpp; rotated as `workload.log.1`, ...).
inline constexpr char kWorkloadLog[] = "workload.log";
/// The VM's serial console, as `neshost run` logs it (bounded).
inline constexpr char kConsoleLog[] = "console.log";
/// A detached monitor's stderr (`neshost run -d`), appended across generations.
inline constexpr char kMonitorLog[] = "monitor.log";
/// The per-VM flock every writer of the VM's files takes (lock_vm()).
inline constexpr char kLockFile[] = ".lock";
/// passt's log (`--network passt`: its stderr, host/vm/passt.hpp).
inline constexpr char kPasstLog[] = "passt.log";
/// A removal's intent (host/monitor/removal.hpp): "scratch G\n" (`--on-exit remove`: generation
/// G's scratch files go) or "all G\n" (`--rm`, `neshost rm`: the whole directory goes), written
/// durably before the first file is removed; whoever finds it finishes the removal.
inline constexpr char kRemovingFile[] = "removing";
/// The log of the virtiofsd serving share `tag`: `virtiofsd-TAG.log`.
std::string virtiofsd_log_name(std::string_view tag);

// ---- the VM id ----

/// The longest name check_name() allows, in bytes.
inline constexpr std::size_t kMaxNameBytes = 64;
/// The one name rule of VM ids, snapshot names (vm::check_snapshot_name) and QEMU's port names:
/// 1..kMaxNameBytes (64) bytes of [A-Za-z0-9._-]; what may not start one is each caller's own.
/// Error, naming `what`: "WHAT is empty", "WHAT is N bytes; at most 64", "WHAT may hold only
/// [A-Za-z0-9._-]; got byte 0xNN".
Status check_name(std::string_view what, std::string_view name);

/// A VM id is used as a directory name: check_name()'s rule, not starting with '.' or '-'. An
/// error names the problem.
Status check_vm_id(std::string_view id);

// ---- paths ----

/// `<state_dir>/<vm>/<name>`, for messages and for readers that go by path. `vm` is not checked
/// here: check_vm_id() first (open_vm_dir() and open_vm_file() check it themselves).
std::filesystem::path vm_path(const std::filesystem::path& state_dir, std::string_view vm,
                              std::string_view name);
/// Path of a VM's record (kOutcomeFile).
std::filesystem::path record_path(const std::filesystem::path& state_dir, std::string_view vm);
/// Path of a VM's monitor file (kMonitorFile).
std::filesystem::path monitor_path(const std::filesystem::path& state_dir, std::string_view vm);
/// Path of a VM's stop request (kStopFile).
std::filesystem::path stop_path(const std::filesystem::path& state_dir, std::string_view vm);
/// Path of a VM's control socket (kControlSocket).
std::filesystem::path control_path(const std::filesystem::path& state_dir, std::string_view vm);

// ---- opening ----

/// The VM's directory `<state_dir>/<vm>` opened O_DIRECTORY|O_NOFOLLOW (a symlink there is
/// refused by name, whoever planted it). `create`: make it (and a missing state dir) 0700, fsynced
/// into the parent, and tighten an existing one we own to 0700. Without `create`, a missing dir
/// is an empty Fd. Every other state-dir access goes through this fd (openat, renameat).
Result<Fd> open_vm_dir(const std::filesystem::path& state_dir, std::string_view vm, bool create);
/// Open `<state_dir>/<vm>/<name>` with `flags` (O_CREAT: mode 0600, and the dir is created as
/// open_vm_dir does), O_NOFOLLOW, and only if it is a regular file. For the files beside the
/// record (console log, ...).
Result<Fd> open_vm_file(const std::filesystem::path& state_dir, std::string_view vm,
                        std::string_view name, int flags);
/// Open `name` inside the directory `dirfd` with `flags` (O_CREAT: mode 0600), O_NOFOLLOW and
/// O_NONBLOCK during the open (a FIFO planted there cannot hang it), and require a regular file
/// (the fd is blocking again). ENOENT: an empty Fd and `missing` set. `shown` names the file in
/// errors; a symlink is refused by name ("is a symlink; refusing to follow it in the state dir").
Result<Fd> open_regular_at(int dirfd, const char* name, int flags, const std::filesystem::path& shown,
                           bool& missing);

// ---- durable changes ----

/// `mkdir -p` with mode 0700: each directory created is fsynced into its parent. An existing
/// non-directory on the way is an error naming it.
Status make_dirs_durable(const std::filesystem::path& dir);
/// open + fsync(2) of a directory; an error names it, with its errno.
Status fsync_dir(const std::filesystem::path& dir);
/// Durable replace of `dir/name` with `bytes` (the protocol of monitor.json and stop.json, and of
/// the containerd shim's task state): a fresh temp file beside it (0600), write, fsync, rename
/// over the name, fsync the directory. On error the temp is gone and the old file untouched.
Status write_durable(const std::filesystem::path& dir, std::string_view name, std::string_view bytes);
/// The per-VM lock: flock(LOCK_EX) of kLockFile inside the VM's directory `vm_dirfd` (created
/// 0600, never through a symlink, only a regular file), tried `tries` times 10 ms apart (LOCK_NB:
/// bounded). Held while the returned Fd lives. `vm_dir` names the directory in errors. Serialises
/// every writer of the VM's files, across threads and processes (flock is per open file
/// description). Blocking (at most tries x 10 ms).
Result<Fd> lock_vm(int vm_dirfd, const std::filesystem::path& vm_dir, int tries = 500);

namespace detail {
/// open_vm_dir(), reporting through `created` whether this call made the VM dir; such a dir is
/// NOT yet fsynced into the state dir: the caller must fsync the state dir (a group commit does
/// it once for all the VM dirs its round made). Library-internal, not part of the API.
Result<Fd> open_vm_dir_deferred(const std::filesystem::path& state_dir, std::string_view vm,
                                bool& created);
}  // namespace detail

}  // namespace nes::host
