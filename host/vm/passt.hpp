// passt for one VM in `--network passt` mode (docs/network.md says why passt, and its limits):
// started before QEMU with one end of a connected socketpair, QEMU gets the other
// (`-netdev stream,...,addr.type=fd`). Both command lines come from host/lib/network.hpp
// (passt_argv, qemu_net_args). Lifecycle as virtiofsd's: killed with us (PR_SET_PDEATHSIG),
// ended after QEMU has exited (passt exits by itself once QEMU's end closes), its stderr kept in a
// log file in the VM's state dir (host/lib/state_dir.hpp kPasstLog).
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "host/lib/base.hpp"
#include "host/lib/network.hpp"
#include "host/vm/process.hpp"

namespace nes::vm {

/// The number each end of the socketpair has in its process: passt's in passt (`--fd 3`), QEMU's
/// in QEMU (`addr.str=3`). Both are passed with LaunchOptions::fds.
inline constexpr int kPasstChildFd = 3;

/// The oldest passt measured to deliver guest-bound TCP data whole under QEMU 7.2 (TCG):
/// 0.0~git20260728 (Debian trixie-backports). Debian 12's 0.0~git20230309 stalls 2 MB downloads
/// and Debian 13's 0.0~git20250503 cuts them short (docs/network.md has the table); tests/vm's
/// net_download is the bar. A date, YYYYMMDD: passt versions are snapshot dates.
inline constexpr int kPasstMinVersion = 20260728;

/// The snapshot date in passt's `--version` text, as YYYYMMDD: Debian's "passt
/// 0.0~git20260728.f8df3f1-1~bpo13+1", upstream's "passt 2026_07_28.f8df3f1". The first
/// plausible date (year 2020..2099, month 1..12, day 1..31) wins; nullopt if there is none.
std::optional<int> passt_version_date(std::string_view version_text);

/// Whether `program` (a path, or a name found in PATH) can serve a VM: it runs, and `program
/// --version` (bounded by `bound`) names a snapshot at least kPasstMinVersion. Errors, exit 125
/// for `neshost run`, each naming passt and the way out (scripts/fetch-passt.sh, NESHOST_PASST,
/// `--network slirp|none`): not found; no answer within `bound` (killed, reaped); no version in
/// its output; too old (names the version).
host::Status check_passt(const std::string& program, std::chrono::milliseconds bound = std::chrono::seconds(10));

/// How to run one passt.
struct PasstOptions {
  std::string program = "passt";  // started as is: check_passt() is the caller's (it costs a run)
  host::NetworkSpec network;     // mode passt (passt_argv() refuses any other)
  /// Its stdout+stderr, truncated, bounded at kLogCap bytes; empty: kept in memory (bounded)
  /// until log_to() names the file (so passt can start before the VM's state dir exists).
  std::filesystem::path log;
  static constexpr std::size_t kLogCap = 1u << 20;
  /// Where its readiness directory is made (mkdtemp; every component must be searchable by the
  /// user passt runs as, `nobody` when we are root: e.g. /tmp). Removed once passt is ready.
  std::filesystem::path tmp_dir = "/tmp";
  /// The daemon outlives this process (a detached VM's, docs/host.md "Re-adoption"): no death
  /// signal, SIGPIPE ignored (its stderr has no reader once we are gone). Default: it dies with us.
  bool outlive = false;
  /// vm::LaunchOptions::before_exec: e.g. record its identity before it may run.
  std::function<host::Status(pid_t)> before_exec;
};

/// A running passt. The destructor kills and reaps it if it still runs.
class Passt {
 public:
  /// Makes the socketpair (SOCK_STREAM, CLOEXEC), starts passt on its end and waits, at most
  /// `bound`, until passt has set up: it writes its PID file (`-P`, into a private directory we
  /// watch with inotify) only after every published port is bound. Root: passt runs as
  /// 65534:65534 (`--runas`; it refuses to stay root). Errors (each saying "passt"): not found
  /// (check_passt's text), exited first (its last stderr lines: "Failed to bind any port for '-t
  /// 127.0.0.1/8080:80'"; a port taken since we checked it), silent for `bound`.
  static host::Result<std::unique_ptr<Passt>> start(const PasstOptions& o, std::chrono::milliseconds bound);

  ~Passt();
  Passt(const Passt&) = delete;
  Passt& operator=(const Passt&) = delete;

  /// QEMU's end of the socketpair (CLOEXEC here): give it to QEMU as {qemu_fd(), kPasstChildFd}
  /// in LaunchOptions::fds, then close_qemu_fd() (else passt never sees QEMU go).
  int qemu_fd() const { return qemu_end_.get(); }
  void close_qemu_fd() { qemu_end_.reset(); }
  pid_t pid() const { return proc_->pid(); }
  /// A pidfd, readable once passt has exited (for an Asio wait); owned here.
  int pidfd() const { return proc_->pidfd(); }
  /// Reaps it if it has exited; nullopt while it runs.
  std::optional<ProcessExit> exited() { return proc_->wait_for(std::chrono::milliseconds(0)); }
  /// From now on its output goes to `log` (an open file), what it wrote so far first.
  void log_to(host::Fd log);
  /// Its last stderr lines, one line (syslog noise left out), for messages.
  std::string last_words() const;
  /// After QEMU has gone (and close_qemu_fd()): passt exits once its socket closes; wait up to
  /// `grace` for that, then SIGTERM/SIGKILL (stop_daemon). Returns how it ended.
  ProcessExit stop(std::chrono::milliseconds grace);

 private:
  struct Key {  // passkey: only start() can construct
    explicit Key() = default;
  };
  struct State;  // shared with the drain thread's sink (the log file)

 public:
  Passt(Key, std::unique_ptr<VmProcess> p, std::shared_ptr<State> st, host::Fd qemu_end)
      : st_(std::move(st)), proc_(std::move(p)), qemu_end_(std::move(qemu_end)) {}

 private:
  std::shared_ptr<State> st_;
  std::unique_ptr<VmProcess> proc_;
  host::Fd qemu_end_;
};

}  // namespace nes::vm
