// One virtiofsd per share: the vhost-user file system daemon that serves a host directory to the
// guest's virtiofs driver through QEMU's vhost-user-fs-pci device (docs/vm.md "Shares").
// Lifecycle: started before QEMU (it creates the socket QEMU connects to), killed with us
// (PR_SET_PDEATHSIG, as QEMU is), ended after QEMU has exited; its stderr kept in a log file.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"
#include "host/vm/process.hpp"

namespace nes::vm {

/// One host directory offered to the guest under a tag (the name the guest mounts).
struct ShareSpec {
  std::string tag;            // 1..36 of [A-Za-z0-9._-] (virtio-fs config space holds 36 bytes)
  std::filesystem::path dir;  // host directory, absolute
  bool ro = false;            // virtiofsd --readonly: the host side refuses every write too
};

/// Checks `tag` is a valid virtio-fs tag: 1..36 of [A-Za-z0-9._-]; an error says why not.
host::Status check_share_tag(std::string_view tag);

/// virtiofsd's cache policy for every share: `auto` (the daemon's default: attributes and
/// directory entries cached for 1 s, file data dropped on open), so host edits show up in a
/// running guest within a second and close-to-open consistency holds (docs/vm.md "Cache mode").
inline constexpr std::string_view kCacheMode = "auto";

/// A host file bind-mounted onto a file inside a share's directory before virtiofsd starts, so a
/// single file can be shared (virtiofsd serves directories only).
struct FileBind {
  std::filesystem::path source;  // the host's regular file, absolute
  std::filesystem::path target;  // an existing empty file inside the share's directory
  bool ro = false;               // the bind is remounted read-only (EROFS through virtiofsd too)
};

/// An overlay mounted on the share's directory before virtiofsd starts (`neshost run IMAGE`'s
/// writable root: the image's unpacked root below, the VM's own layer above; docs/images.md "run").
/// Paths without ',' or ':' (overlayfs' option syntax), absolute.
struct OverlayRoot {
  std::filesystem::path lower, upper, work;
};

/// How to run one virtiofsd.
struct VirtiofsdOptions {
  std::string program;            // virtiofsd (Rust, >= 1.11 for --readonly) or a wrapper that execs it
  std::filesystem::path socket;   // vhost-user socket it creates and QEMU connects to (< 108 bytes)
  ShareSpec share;
  std::filesystem::path log;      // its stdout+stderr, truncated, bounded at kLogCap bytes
  static constexpr std::size_t kLogCap = 1u << 20;
  /// Made in a private mount namespace of the daemon's own (util-linux unshare(1) and mount(8),
  /// so nothing reaches the host's mount table and the binds vanish with the daemon). Needs root.
  std::vector<FileBind> binds;
  /// Mounted on share.dir in the same private mount namespace (before the binds).
  std::optional<OverlayRoot> overlay;
  /// The daemon outlives this process (a detached VM's, docs/host.md "Re-adoption"): no death
  /// signal, SIGPIPE ignored (its stderr has no reader once we are gone). Default: it dies with us.
  bool outlive = false;
  /// vm::LaunchOptions::before_exec: e.g. record its identity before it may run.
  std::function<host::Status(pid_t)> before_exec;
};

/// The daemon's argv. Sandbox: `--sandbox=namespace` (virtiofsd's default and its documented
/// choice when run as root: mount, pid and net namespaces, pivot_root into the shared directory,
/// so no path the guest names resolves outside it); seccomp `kill` (its default). With `binds`,
/// the daemon runs under `unshare --mount --propagation private` and a sh(1) that makes each bind
/// (`mount --bind`, then `remount,bind,ro` for a read-only one) and execs it.
std::vector<std::string> virtiofsd_argv(const VirtiofsdOptions& o);

/// A running virtiofsd. The destructor kills and reaps it if it is still running.
class Virtiofsd {
 public:
  /// Starts it and waits (at most `bound`) until it listens on its socket: its
  /// "Waiting for vhost-user socket connection" line, seen on its stderr. Error if it exits or
  /// stays silent first; the message names the share (tag and directory) and carries the last
  /// lines virtiofsd wrote.
  static host::Result<std::unique_ptr<Virtiofsd>> start(const VirtiofsdOptions& o,
                                                        std::chrono::milliseconds bound);

  ~Virtiofsd();
  Virtiofsd(const Virtiofsd&) = delete;
  Virtiofsd& operator=(const Virtiofsd&) = delete;

  pid_t pid() const { return proc_->pid(); }
  /// A pidfd, readable once the daemon has exited (for an Asio wait); owned here.
  int pidfd() const { return proc_->pidfd(); }
  /// Reaps it if it has exited; nullopt while it runs.
  std::optional<ProcessExit> exited() { return proc_->wait_for(std::chrono::milliseconds(0)); }
  const ShareSpec& share() const { return share_; }
  /// After QEMU has gone: virtiofsd normally exits by itself once its client disconnects; wait up
  /// to `grace` for that, then SIGTERM/SIGKILL (stop_daemon). Returns how it ended.
  ProcessExit stop(std::chrono::milliseconds grace);

 private:
  struct Key {  // passkey: only start() can construct
    explicit Key() = default;
  };
  struct State;  // shared with the drain thread's sink (log file, readiness eventfd)

 public:
  Virtiofsd(Key, std::unique_ptr<VmProcess> p, std::shared_ptr<State> st, ShareSpec s)
      : st_(std::move(st)), proc_(std::move(p)), share_(std::move(s)) {}

 private:
  std::shared_ptr<State> st_;
  std::unique_ptr<VmProcess> proc_;
  ShareSpec share_;
};

}  // namespace nes::vm
