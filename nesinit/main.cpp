// nesinit: PID 1 for microVMs. Start-up order (docs/init.md): block signals, decide the
// mode, (guest) bring the system up, configure, dial, then the event loop (loop.cpp) until the
// final act. As PID 1 this function never returns.
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "base/fd.hpp"
#include "base/small_file.hpp"
#include "config.hpp"
#include "guest.hpp"
#include "log.hpp"
#include "loop.hpp"
#include "mounts.hpp"
#include "protocol/codec.hpp"
#include "reaper.hpp"

#ifndef NESINIT_VERSION
#define NESINIT_VERSION "dev"
#endif

using namespace nes::init;
namespace base = nes::base;

namespace {

/// fmt::print out of line: one copy of its buffer and error path for every line main prints
/// (the init is measured in KiB; inlined, each call costs a few hundred bytes).
[[gnu::noinline]] void vsay(std::FILE* f, fmt::string_view format, fmt::format_args args) {
  fmt::vprint(f, format, args);
}
template <class... T>
void say(std::FILE* f, fmt::format_string<T...> format, T&&... args) {
  vsay(f, format, fmt::make_format_args(args...));
}
template <class... T>
void say(fmt::format_string<T...> format, T&&... args) {
  vsay(stdout, format, fmt::make_format_args(args...));
}

/// The signals PID 1 blocks (all but the synchronous fault signals, whose delivery while blocked
/// would kill us anyway and whose default action is what a crash should do).
sigset_t blocked_set() {
  sigset_t s;
  sigfillset(&s);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS}) sigdelset(&s, sig);
  return s;
}

/// The kernel's command line (COMMAND_LINE_SIZE is 2048 bytes on x86; bounded generously for
/// other architectures); "" when /proc/cmdline cannot be read.
std::string kernel_cmdline() {
  auto r = base::read_small_file("/proc/cmdline", 64 * 1024, {.longer = base::Longer::truncate});
  return r ? std::move(*r) : std::string();
}

/// Decide the mode. As PID 1 without /proc (a real kernel starts init with nothing mounted):
/// kthreadd is pid 2 in the initial pid namespace only, so if pid 2 does not exist this is a
/// namespace; otherwise mount proc and read the namespace inode.
Mode detect_mode() {
  const pid_t pid = ::getpid();
  if (pid != 1) return Mode::not_pid1;
  auto ino = ns_inode("pid");
  if (!ino && !(::kill(2, 0) != 0 && errno == ESRCH)) {
    ::mkdir("/proc", 0555);
    if (::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) == 0) {
      ino = ns_inode("pid");
      if (!ino || *ino != kInitialPidNsInode) ::umount2("/proc", MNT_DETACH);
    }
  }
  return decide_mode(pid, ino);
}

int self_check(const Config& c, const Log& log) {
  int bad = 0;
  auto ino = ns_inode("pid");
  say("nesinit {} (protocol {})\n", NESINIT_VERSION, nes::proto::kProtocolVersion);
  say("mode: {} (pid {}, pid namespace inode {})\n", to_string(decide_mode(::getpid(), ino)),
             ::getpid(), ino ? fmt::format("{}", *ino) : std::string("unknown"));
  say("channel: {}\n", c.channel ? to_string(*c.channel) : std::string("(default: vsock:2:7000 in guest mode only)"));
  say("grace_ms={} ack_timeout_ms={} boot_timeout_ms={} connect_timeout_ms={} halt={}\n",
             c.grace_ms, c.ack_timeout_ms, c.boot_timeout_ms, c.connect_timeout_ms,
             nes::proto::to_string(c.halt));
  // The codec as built into this binary (no exceptions, musl): one round trip each way.
  auto boot = nes::proto::decode_host(
      R"({"type":"boot","exec":{"argv":["/bin/true"],"uid":0,"gid":0},"geometry":{"width":1,"height":2,"fps":3},"on_exit":{"terminal":true}})");
  const bool boot_ok = std::holds_alternative<nes::proto::HostMessage>(boot);
  const std::string ready = nes::proto::encode(nes::proto::GuestMessage{nes::proto::Ready{}});
  const bool ready_ok = ready == R"({"type":"ready","protocol_version":2})";
  say("codec: decode boot {}, encode ready {}\n", boot_ok ? "ok" : "FAILED", ready_ok ? "ok" : "FAILED");
  bad += !boot_ok + !ready_ok;
  sigset_t s = blocked_set();
  int sfd = ::signalfd(-1, &s, SFD_CLOEXEC | SFD_NONBLOCK);
  say("signalfd: {}\n", sfd >= 0 ? "ok" : std::strerror(errno));
  if (sfd >= 0) ::close(sfd); else ++bad;
  say("self-check: {}\n", bad ? "FAILED" : "ok");
  (void)log;
  return bad ? 1 : 0;
}

/// Write `v` to /proc/self/oom_score_adj. An error carries the errno (lowering needs
/// CAP_SYS_RESOURCE: EACCES).
base::Status write_oom_score_adj(const char* v) {
  base::Fd fd(::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC));
  if (!fd || ::write(fd.get(), v, std::strlen(v)) < 0) return base::errno_error(errno);
  return base::Ok{};
}

}  // namespace

int main(int argc, char** argv) {
  // 1. Nothing sent to PID 1 may be lost or act before the loop exists: block first.
  const sigset_t blocked = blocked_set();
  ::sigprocmask(SIG_SETMASK, &blocked, nullptr);

  const Mode mode = detect_mode();
  std::vector<std::string_view> args(argv + (argc > 0 ? 1 : 0), argv + argc);
  Log log(2, LogLevel::info);

  if (mode == Mode::not_pid1) {
    // Not PID 1: a tool, not an init. Only help, version and the self-check run.
    Config c;
    ParsedArgv a = apply_argv(c, args);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    switch (a.command) {
      case Command::help: say("{}", usage()); return 0;
      case Command::version:
        say("nesinit {} (protocol {})\n", NESINIT_VERSION, nes::proto::kProtocolVersion);
        return 0;
      case Command::self_check:
        for (auto& p : a.problems) say(stderr, "nesinit: {}\n", p);
        return self_check(c, log) | (a.problems.empty() ? 0 : 1);
      case Command::run:
        say(stderr, "nesinit: not PID 1: only --help, --version and --self-check run here\n{}", usage());
        return 2;
    }
    return 2;
  }

  // 2.-3. guest mode: a bare kernel environment.
  if (mode == Mode::guest) {
    guest_early(log);
    guest_mounts_and_net(log);
  }
  const base::Status log_ok = log.make_nonblocking();  // needs /proc: after the guest's mounts
  // A sandbox takes a mount namespace of its own, private from "/" down, only before its first
  // share (Shares, mounts.hpp): a boot without shares skips a namespace's creation and teardown.

  // 4. Orphans come to us (PID 1 gets them anyway; explicit for the sandbox); we are the last
  // process the OOM killer should pick.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  const base::Status oom = write_oom_score_adj("-1000");

  // 5. Configuration: the kernel command line first (guest only: a sandbox's /proc/cmdline is the
  // machine's), then argv, which wins.
  Config cfg;
  std::vector<std::string> notes;
  if (mode == Mode::guest) apply_cmdline(cfg, kernel_cmdline(), notes);
  ParsedArgv a = apply_argv(cfg, args);
  log.set_level(cfg.log);
  // Logged only now: with nesinit.log=quiet (neshost run) nothing but the workload reaches the console.
  log.info("mode", "{} (pid {})", to_string(mode), ::getpid());
  for (auto& n : notes) log.warn("config", "{}", n);
  if (!oom) log.debug("oom", "oom_score_adj -1000: {}", oom.error().message);
  if (!log_ok)
    log.debug("log", "no non-blocking reopen of stderr ({}); polling before each line", log_ok.error().message);
  if (mode == Mode::guest) {
    // Bare words and unknown flags are what the kernel hands PID 1: never fatal here.
    for (auto& p : a.problems) log.warn("config", "{}", p);
    if (a.command != Command::run) log.warn("config", "--help/--version/--self-check ignored as PID 1");
  } else {
    if (a.command == Command::help) { say("{}", usage()); return 0; }
    if (a.command == Command::version) { say("nesinit {}\n", NESINIT_VERSION); return 0; }
    if (!a.problems.empty() || a.command != Command::run) {
      for (auto& p : a.problems) log.error("config", "{}", p);
      say(stderr, "{}", usage());
      return 2;
    }
  }
  if (auto fin = finalize_for_mode(cfg, mode); !fin) {
    log.error("config", "{}", fin.error().message);
    say(stderr, "{}", usage());
    return 2;
  }
  log.info("config", "channel={} data_channel={} grace_ms={} ack_timeout_ms={} boot_timeout_ms={} connect_timeout_ms={} halt={}",
           to_string(*cfg.channel), cfg.data_channel ? to_string(*cfg.data_channel) : "none", cfg.grace_ms, cfg.ack_timeout_ms, cfg.boot_timeout_ms,
           cfg.connect_timeout_ms, nes::proto::to_string(cfg.halt));

  // 3. Modules (guest): the channel's transport may be among them (virtio_console, vsock).
  if (mode == Mode::guest) load_modules(log, cfg.modules);

  int sfd = ::signalfd(-1, &blocked, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    // Without it PID 1 never learns of SIGCHLD or SIGTERM: the loop would hang silently. Fail
    // here, before the loop, as catatonit's bail() does (as a real PID 1 the kernel then panics,
    // which a VMM reports; better than a VM that never ends).
    log.error("loop", "signalfd: {}; cannot run without it", std::strerror(errno));
    return 1;
  }
  Reaper reaper;
  // 6. onwards: dial, session, ordered shutdown. Never returns.
  run_pid1(mode, cfg, log, sfd, reaper);
}
