// One QEMU process, owned RAII-style: started in its own session, killed if this process dies,
// its console drained until it has exited, never left behind (docs/vm.md "Process").
#pragma once

#include <sys/types.h>

#include <csignal>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "host/lib/base.hpp"

namespace nes::vm {

/// Resolves a program name the way execvp(3) does (a name with a '/' as is, else the first
/// executable match in $PATH, default "/usr/local/bin:/usr/bin:/bin"), but before any fork (a
/// child may only make async-signal-safe calls). Returns the path, or an error naming the program
/// and the errno ("NAME: No such file or directory (searched PATH)").
host::Result<std::string> resolve_program(const std::string& name);

/// Receives bytes as they arrive, on the launcher's drain thread (never on the caller's).
using ByteSink = std::function<void(std::string_view)>;

/// What to start.
struct LaunchOptions {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH unless it contains '/'
  ByteSink console;               // the child's stdout: for QEMU, the guest's serial console
  ByteSink diagnostics;           // the child's stderr: QEMU's own warnings and errors
  /// Signal the child gets when the thread that forked it dies (PR_SET_PDEATHSIG). The fork runs
  /// on one spawner thread that lives as long as this process, so in effect: when we die. 0: none,
  /// the child outlives us (a detached VM's QEMU and daemons: docs/host.md "Re-adoption").
  int death_signal = SIGKILL;
  /// Called on the spawner thread with the child's pid after fork and before the child may
  /// execve (the child waits on a pipe meanwhile): e.g. to record its identity durably before it
  /// can do anything. An error kills and reaps the child and is launch()'s error. If this process
  /// dies before the call returns, the child never execs (it sees the pipe's EOF and exits 125),
  /// so nothing can outlive us unrecorded. Empty: the child execs at once.
  std::function<host::Status(pid_t)> before_exec;
  /// SIGPIPE ignored in the child (an ignored disposition survives execve): for a daemon that
  /// outlives us, whose stderr pipe then has no reader (a write fails with EPIPE instead of
  /// killing it). QEMU ignores SIGPIPE itself.
  bool ignore_sigpipe = false;
  /// Descriptors the child inherits at fixed numbers: {fd here, its number in the child}. Each
  /// child number is 3..kMaxChildFd and given once; the child gets a dup of the fd there (without
  /// FD_CLOEXEC) after every other descriptor was closed, so nothing else leaks. Our fd is not
  /// consumed: the caller closes its copy once launch() returned (e.g. QEMU's end of a
  /// socketpair: `-netdev stream,...,addr.type=fd,addr.str=3`, host/vm/passt.hpp).
  std::vector<std::pair<int, int>> fds;
  static constexpr int kMaxChildFd = 1023;
  /// >= 0: a network namespace (vm/netns.hpp) the child setns(2)s into before exec, so QEMU runs
  /// there and opens its tap by name (`--network netns:PATH`). Not owned; -1: ours.
  int netns_fd = -1;
};

/// How the process ended (waitid(2)): one of `code` (0..255) and `signal` is set; neither if
/// another part of the program reaped it first (ECHILD).
struct ProcessExit {
  std::optional<int> code;
  std::optional<int> signal;
  bool operator==(const ProcessExit&) const = default;
};
/// "exited with code 0" / "killed by signal 9".
std::string describe(const ProcessExit& e);

/// A running child process (QEMU). Not copyable or movable (the drain thread points at it).
/// The destructor never leaves it behind: SIGKILL if still running, reap, join the drain thread.
class VmProcess {
 public:
  /// fork+exec on the spawner thread: new session (setsid: a Ctrl-C on our terminal reaches us,
  /// not QEMU), PR_SET_PDEATHSIG, stdin /dev/null, stdout/stderr pipes, every other fd closed,
  /// signal mask and dispositions reset; `opts.fds` at their numbers. Success only once execve
  /// succeeded (CLOEXEC status pipe). Errors: program not found / not executable (with errno
  /// text), a bad `fds` entry (not open here, child number outside 3..kMaxChildFd or given twice),
  /// pipe/fork/pidfd failures.
  static host::Result<std::unique_ptr<VmProcess>> launch(LaunchOptions opts);
  /// Takes over a running process that is not our child (a VMM whose monitor died: docs/host.md
  /// "Re-adoption"), named by its pid and start time (field 22 of /proc/PID/stat): a pidfd on it,
  /// checked against `start_time` after it was opened (no pid-reuse race). Its stdout and stderr
  /// are pipes another process made: they are opened again through /proc/PID/fd/1 and 2 (the
  /// same pipes' read ends; needs ptrace access: our uid or root) and drained to `console` /
  /// `diagnostics` as launch()'s are; one that is not a pipe (or cannot be opened) is not read.
  /// Its exit status is unknown to us (only its parent may reap it): wait_for() reports it
  /// exited with neither code nor signal. Unlike a launched one, the destructor leaves it running
  /// (terminate() ends it on purpose). Errors: no such process, another start time.
  static host::Result<std::unique_ptr<VmProcess>> adopt(pid_t pid, unsigned long long start_time, ByteSink console,
                                                        ByteSink diagnostics);

private:
  struct Key {  // passkey: only launch() can construct
    explicit Key() = default;
  };

 public:
  explicit VmProcess(Key) {}
  VmProcess(const VmProcess&) = delete;
  VmProcess& operator=(const VmProcess&) = delete;
  ~VmProcess();

  pid_t pid() const { return pid_; }
  /// true if adopt() made it (not our child).
  bool adopted() const { return adopted_; }
  /// A pidfd (pidfd_open(2)): readable once the process has exited. For poll/epoll/Asio; owned here.
  int pidfd() const { return pidfd_.get(); }
  /// Waits up to `timeout` for the process to exit and reaps it. nullopt: still running.
  /// Idempotent: after the reap, returns the same ProcessExit at once.
  std::optional<ProcessExit> wait_for(std::chrono::milliseconds timeout);
  /// The exit, if already reaped.
  std::optional<ProcessExit> exit_status() const { return exit_; }
  /// Sends `sig` through the pidfd (no pid-reuse race). false once reaped or on error.
  bool signal(int sig);
  /// Ends it on every path: SIGTERM (QEMU exits cleanly on it), up to `grace`, then SIGKILL and
  /// reap. Returns how it ended. Bounded by grace + the kernel's SIGKILL delivery.
  ProcessExit terminate(std::chrono::milliseconds grace);
  /// After the process was reaped: wait up to `bound` for its stdout/stderr to reach EOF (every
  /// byte it wrote delivered to the sinks), then stop the drain thread. Returns true if drained
  /// to EOF. Safe to call more than once.
  bool finish_output(std::chrono::milliseconds bound);
  /// The last ≤ 8 KiB QEMU wrote to stderr (for error messages).
  std::string diagnostics_tail() const;

 private:
  void drain_loop();

  pid_t pid_ = -1;
  bool adopted_ = false;
  host::Fd pidfd_;
  host::Fd out_r_, err_r_, wake_;  // console pipe, stderr pipe, eventfd that stops the drain
  ByteSink console_, diagnostics_;
  std::optional<ProcessExit> exit_;
  mutable std::mutex mu_;
  std::condition_variable drained_cv_;
  bool drained_ = false;
  std::string diag_tail_;
  std::thread drain_;
};

}  // namespace nes::vm
