#include "host/vm/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <deque>
#include <optional>
#include <future>

#include <fmt/format.h>

#include "host/lib/signals_blocked.hpp"

#ifndef P_PIDFD
#define P_PIDFD 3  // linux/wait.h: waitid(2) on a pidfd (Linux 5.4)
#endif

namespace nes::vm {

std::string describe(const ProcessExit& e) {
  if (e.signal) return fmt::format("killed by signal {}", *e.signal);
  if (e.code) return fmt::format("exited with code {}", *e.code);
  return "reaped elsewhere (status unknown)";
}

namespace {

constexpr std::size_t kDiagTailCap = 8192;

int sys_pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }
int sys_pidfd_send_signal(int pidfd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

/// The one thread every child is forked from. PR_SET_PDEATHSIG fires when the *thread* that
/// forked the child exits, not the process; this thread lives until the process exits, so
/// "the parent died" means "this process died". Jobs run one at a time, in order.
class Spawner {
 public:
  /// The spawner of the calling process. After a fork(2) the child has no spawner thread (only
  /// the forking thread is copied), so a process that is not the one the spawner was made in
  /// gets a fresh one; the inherited object is deliberately leaked (its std::thread names a
  /// thread that does not exist here: destroying it would call std::terminate).
  /// The same holds at exit: a forked child (the `run -d` monitor) that never asked for its own
  /// spawner must not destroy the parent's (its condition variable counts the parent's waiting
  /// thread, so pthread_cond_destroy would block the child's exit for ever).
  static Spawner& instance() {
    struct Holder {
      std::unique_ptr<Spawner> s;
      pid_t owner = 0;
      ~Holder() {
        if (s && owner != ::getpid()) [[maybe_unused]] Spawner* leaked = s.release();
      }
    };
    static std::mutex mu;
    static Holder h;
    std::lock_guard lk(mu);
    if (!h.s || h.owner != ::getpid()) {
      if (h.s) [[maybe_unused]] Spawner* leaked = h.s.release();
      h.s = std::make_unique<Spawner>(Key{});
      h.owner = ::getpid();
    }
    return *h.s;
  }
  template <class F>
  auto run(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto fut = task.get_future();
    {
      std::lock_guard lk(mu_);
      jobs_.emplace_back([&task] { task(); });
    }
    cv_.notify_one();
    return fut.get();
  }
  ~Spawner() {
    {
      std::lock_guard lk(mu_);
      quit_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Key {
    explicit Key() = default;
  };

 public:
  explicit Spawner(Key) {
    thread_ = std::thread([this] {
      // Asynchronous signals for this process are handled elsewhere; never on this thread.
      sigset_t all;
      sigfillset(&all);
      pthread_sigmask(SIG_BLOCK, &all, nullptr);
      std::unique_lock lk(mu_);
      while (true) {
        cv_.wait(lk, [this] { return quit_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        auto job = std::move(jobs_.front());
        jobs_.pop_front();
        lk.unlock();
        job();
        lk.lock();
      }
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool quit_ = false;
  std::thread thread_;
};

/// Marks the child's status word when setns(2), not execve, failed.
constexpr int kSetnsFailed = 1 << 20;

struct Forked {
  pid_t pid = -1;
  host::Fd pidfd;
};

/// Runs on the spawner thread. Only async-signal-safe calls between fork and execve.
host::Result<Forked> fork_exec(const std::string& path, const std::vector<std::string>& argv,
                               int death_signal, int out_w, int err_w,
                               const std::vector<std::pair<int, int>>& pass, int netns_fd,
                               const std::function<host::Status(pid_t)>& before_exec, bool ignore_sigpipe) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  host::Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devnull) return host::Error{fmt::format("open /dev/null: {}", std::strerror(errno))};
  int st[2];
  if (::pipe2(st, O_CLOEXEC) != 0) return host::Error{fmt::format("pipe2: {}", std::strerror(errno))};
  host::Fd st_r(st[0]), st_w(st[1]);
  // The gate (before_exec): the child reads one byte from it before execve; EOF (we died, or
  // the gate refused) makes it exit instead.
  host::Fd go_r, go_w;
  if (before_exec) {
    int g[2];
    if (::pipe2(g, O_CLOEXEC) != 0) return host::Error{fmt::format("pipe2: {}", std::strerror(errno))};
    go_r.reset(g[0]);
    go_w.reset(g[1]);
  }
  const pid_t parent = ::getpid();
  // The status pipe sits just above the passed descriptors (3 when there are none); every source
  // is first moved above it, so no dup2 below clobbers another source.
  int sfd = 3;
  for (const auto& [from, to] : pass) sfd = std::max(sfd, to + 1);
  const int high = std::max(10, sfd + 1);
  std::vector<int> src(4 + pass.size());  // allocated before fork: the child may not allocate

  pid_t pid = ::fork();
  if (pid < 0) return host::Error{fmt::format("fork: {}", std::strerror(errno))};
  if (pid == 0) {
    // Child. Own session: a terminal's Ctrl-C (SIGINT to the foreground process group) reaches
    // neshost, which shuts the guest down in order, never QEMU directly.
    ::setsid();
    if (death_signal) {
      ::prctl(PR_SET_PDEATHSIG, death_signal);
      if (::getppid() != parent) ::_exit(125);  // the parent died before prctl took effect
    }
    if (go_r) {
      go_w.reset();  // only the parent may hold the write end: its death is our EOF
      char b = 0;
      ssize_t g;
      do g = ::read(go_r.get(), &b, 1); while (g < 0 && errno == EINTR);
      if (g != 1) ::_exit(125);
    }
    if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) {
      int e = errno | kSetnsFailed;
      [[maybe_unused]] auto n = ::write(st_w.get(), &e, sizeof e);
      ::_exit(127);
    }
    // Move every source above 2 first, so no dup2 below can clobber another source (our own
    // fds 0-2 may have been closed, making a pipe end land there).
    src[0] = devnull.get(), src[1] = out_w, src[2] = err_w, src[3] = st_w.get();
    for (std::size_t i = 0; i < pass.size(); ++i) src[4 + i] = pass[i].first;
    for (int& fd : src) fd = ::fcntl(fd, F_DUPFD_CLOEXEC, high);
    ::dup2(src[0], 0);  // dup2 clears FD_CLOEXEC on the target
    ::dup2(src[1], 1);
    ::dup2(src[2], 2);
    for (std::size_t i = 0; i < pass.size(); ++i) ::dup2(src[4 + i], pass[i].second);
    // The status pipe survives as fd `sfd` (CLOEXEC: closed by a successful execve).
    ::dup3(src[3], sfd, O_CLOEXEC);
    // No descriptor of ours leaks into QEMU: the gaps below sfd, and everything above it.
    for (int fd = 3; fd < sfd; ++fd) {
      bool passed = false;
      for (const auto& pr : pass) passed = passed || pr.second == fd;
      if (!passed) ::close(fd);
    }
    ::syscall(SYS_close_range, static_cast<unsigned>(sfd + 1), ~0u, 0u);
    // Reset what execve keeps: the mask and ignored dispositions.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);  // EINVAL for KILL/STOP: fine
    if (ignore_sigpipe) {
      struct sigaction ign {};
      ign.sa_handler = SIG_IGN;
      ::sigaction(SIGPIPE, &ign, nullptr);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(path.c_str(), cargv.data(), environ);
    int e = errno;
    [[maybe_unused]] auto n = ::write(sfd, &e, sizeof e);
    ::_exit(127);
  }
  st_w.reset();
  go_r.reset();
  Forked f;
  f.pid = pid;
  f.pidfd = host::Fd(sys_pidfd_open(pid));
  if (before_exec) {
    // The child waits for the gate; it cannot exec (nor outlive us unrecorded) before this.
    host::Status g = f.pidfd ? before_exec(pid) : host::Status(host::Error{"pidfd_open failed"});
    if (g) {
      char one = 1;
      if (::write(go_w.get(), &one, 1) != 1) g = host::Error{fmt::format("gate: {}", std::strerror(errno))};
    }
    go_w.reset();
    if (!g) {
      ::kill(pid, SIGKILL);
      int status;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
      return g.error();
    }
  }
  int e = 0;
  ssize_t n;
  do n = ::read(st_r.get(), &e, sizeof e); while (n < 0 && errno == EINTR);
  if (n == sizeof e || !f.pidfd) {
    // exec failed (or no pidfd): reap the child now; it has exited or is about to.
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!f.pidfd && n != sizeof e) return host::Error{"pidfd_open failed"};
    if (e & kSetnsFailed) return host::Error{fmt::format("setns into the network namespace: {}", std::strerror(e & ~kSetnsFailed))};
    return host::Error{fmt::format("{}: {}", path, std::strerror(e))};
  }
  return f;
}

}  // namespace

host::Result<std::string> resolve_program(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0) return name;
    return host::Error{fmt::format("{}: {}", name, std::strerror(errno))};
  }
  const char* path = std::getenv("PATH");
  std::string_view p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  int last = ENOENT;
  while (true) {
    auto colon = p.find(':');
    std::string dir(p.substr(0, colon));
    std::string cand = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    if (errno != ENOENT) last = errno;
    if (colon == std::string_view::npos) break;
    p.remove_prefix(colon + 1);
  }
  return host::Error{fmt::format("{}: {} (searched PATH)", name, std::strerror(last))};
}

host::Result<std::unique_ptr<VmProcess>> VmProcess::launch(LaunchOptions opts) {
  if (opts.argv.empty()) return host::Error{"argv: empty"};
  auto path = resolve_program(opts.argv[0]);
  if (!path) return path.error();
  for (std::size_t i = 0; i < opts.fds.size(); ++i) {
    const auto [from, to] = opts.fds[i];
    if (from < 0 || ::fcntl(from, F_GETFD) < 0)
      return host::Error{fmt::format("fds[{}]: descriptor {} is not open", i, from)};
    if (to < 3 || to > LaunchOptions::kMaxChildFd)
      return host::Error{fmt::format("fds[{}]: child number {} is outside 3..{}", i, to, LaunchOptions::kMaxChildFd)};
    for (std::size_t j = 0; j < i; ++j)
      if (opts.fds[j].second == to) return host::Error{fmt::format("fds[{}]: child number {} given twice", i, to)};
  }
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return host::Error{fmt::format("pipe2: {}", std::strerror(errno))};
  host::Fd out_r(out[0]), out_w(out[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) return host::Error{fmt::format("pipe2: {}", std::strerror(errno))};
  host::Fd err_r(err[0]), err_w(err[1]);
  host::Fd wake(::eventfd(0, EFD_CLOEXEC));
  if (!wake) return host::Error{fmt::format("eventfd: {}", std::strerror(errno))};

  auto forked = Spawner::instance().run([&] {
    return fork_exec(*path, opts.argv, opts.death_signal, out_w.get(), err_w.get(), opts.fds, opts.netns_fd,
                     opts.before_exec, opts.ignore_sigpipe);
  });
  if (!forked) return forked.error();
  auto p = std::make_unique<VmProcess>(Key{});
  p->pid_ = forked->pid;
  p->pidfd_ = std::move(forked->pidfd);
  p->out_r_ = std::move(out_r);
  p->err_r_ = std::move(err_r);
  p->wake_ = std::move(wake);
  p->console_ = std::move(opts.console);
  p->diagnostics_ = std::move(opts.diagnostics);
  // Our copies of the write ends close here: EOF on the pipes then means the child is gone.
  out_w.reset();
  err_w.reset();
  host::SignalsBlocked quiet;  // the drain thread never takes a process signal
  p->drain_ = std::thread([raw = p.get()] { raw->drain_loop(); });
  return p;
}

host::Result<std::unique_ptr<VmProcess>> VmProcess::adopt(pid_t pid, unsigned long long start_time, ByteSink console,
                                                          ByteSink diagnostics) {
  host::Fd pidfd(sys_pidfd_open(pid));
  if (!pidfd) return host::Error{fmt::format("pid {}: {}", pid, std::strerror(errno))};
  // Pinned by the pidfd now: the start time read after opening it rules out a recycled pid.
  auto stat = [&]() -> std::optional<unsigned long long> {
    host::Fd f(::open(fmt::format("/proc/{}/stat", pid).c_str(), O_RDONLY | O_CLOEXEC));
    if (!f) return std::nullopt;
    char b[1024];
    ssize_t n = ::read(f.get(), b, sizeof b - 1);
    if (n <= 0) return std::nullopt;
    std::string_view s(b, static_cast<std::size_t>(n));
    auto rp = s.rfind(')');
    if (rp == std::string_view::npos) return std::nullopt;
    s.remove_prefix(rp + 2);  // field 3 on
    for (int field = 3; field < 22; ++field) {
      auto sp = s.find(' ');
      if (sp == std::string_view::npos) return std::nullopt;
      s.remove_prefix(sp + 1);
    }
    return std::strtoull(std::string(s.substr(0, s.find(' '))).c_str(), nullptr, 10);
  }();
  if (!stat || *stat != start_time)
    return host::Error{fmt::format("pid {}: not the process recorded (start time {} != {})", pid,
                                   stat ? std::to_string(*stat) : "?", start_time)};
  host::Fd wake(::eventfd(0, EFD_CLOEXEC));
  if (!wake) return host::Error{fmt::format("eventfd: {}", std::strerror(errno))};
  auto p = std::make_unique<VmProcess>(Key{});
  p->pid_ = pid;
  p->adopted_ = true;
  p->pidfd_ = std::move(pidfd);
  // Its stdout/stderr pipes, opened again: only a pipe is read (a file or /dev/null is not ours).
  auto reopen = [pid](int n) {
    std::string path = fmt::format("/proc/{}/fd/{}", pid, n);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISFIFO(st.st_mode)) return host::Fd();
    return host::Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  };
  p->out_r_ = reopen(1);
  p->err_r_ = reopen(2);
  p->wake_ = std::move(wake);
  p->console_ = std::move(console);
  p->diagnostics_ = std::move(diagnostics);
  host::SignalsBlocked quiet;
  p->drain_ = std::thread([raw = p.get()] { raw->drain_loop(); });
  return p;
}

void VmProcess::drain_loop() {
  char buf[65536];
  bool out_open = static_cast<bool>(out_r_), err_open = static_cast<bool>(err_r_);
  while (out_open || err_open) {
    pollfd fds[3] = {{out_open ? out_r_.get() : -1, POLLIN, 0},
                     {err_open ? err_r_.get() : -1, POLLIN, 0},
                     {wake_.get(), POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[2].revents) break;  // finish_output gave up waiting for EOF
    for (int i = 0; i < 2; ++i) {
      if (!fds[i].revents) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        (i == 0 ? out_open : err_open) = false;
        continue;
      }
      std::string_view chunk(buf, static_cast<std::size_t>(n));
      if (i == 0) {
        if (console_) console_(chunk);
      } else {
        {
          std::lock_guard lk(mu_);
          diag_tail_.append(chunk);
          if (diag_tail_.size() > kDiagTailCap) diag_tail_.erase(0, diag_tail_.size() - kDiagTailCap);
        }
        if (diagnostics_) diagnostics_(chunk);
      }
    }
  }
  std::lock_guard lk(mu_);
  drained_ = true;
  drained_cv_.notify_all();
}

std::optional<ProcessExit> VmProcess::wait_for(std::chrono::milliseconds timeout) {
  if (exit_) return exit_;
  pollfd p{pidfd_.get(), POLLIN, 0};
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    int r = ::poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count())));
    if (r > 0) break;
    if (r == 0) return std::nullopt;
    if (errno != EINTR) return std::nullopt;
  }
  if (adopted_) {  // not ours to reap (its parent does); its status is not ours to read
    exit_ = ProcessExit{};
    return exit_;
  }
  siginfo_t si{};
  while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &si, WEXITED) < 0) {
    if (errno == ECHILD) {  // reaped by someone else (SIGCHLD ignored, or a waitpid(-1))
      exit_ = ProcessExit{};
      return exit_;
    }
    if (errno != EINTR) return std::nullopt;
  }
  ProcessExit e;
  if (si.si_code == CLD_EXITED)
    e.code = si.si_status;
  else
    e.signal = si.si_status;
  exit_ = e;
  return exit_;
}

bool VmProcess::signal(int sig) {
  if (exit_) return false;
  return sys_pidfd_send_signal(pidfd_.get(), sig) == 0;
}

ProcessExit VmProcess::terminate(std::chrono::milliseconds grace) {
  if (exit_) return *exit_;
  signal(SIGTERM);
  if (auto e = wait_for(grace)) return *e;
  signal(SIGKILL);
  // SIGKILL cannot be caught: the wait ends as soon as the kernel has torn the process down.
  while (!exit_) wait_for(std::chrono::milliseconds(1000));
  return *exit_;
}

bool VmProcess::finish_output(std::chrono::milliseconds bound) {
  bool to_eof;
  {
    std::unique_lock lk(mu_);
    to_eof = drained_cv_.wait_for(lk, bound, [this] { return drained_; });
  }
  if (!to_eof) {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_.get(), &one, sizeof one);
  }
  if (drain_.joinable()) drain_.join();
  return to_eof;
}

std::string VmProcess::diagnostics_tail() const {
  std::lock_guard lk(mu_);
  return diag_tail_;
}

VmProcess::~VmProcess() {
  // One we adopted is not killed on the way out: a replacement monitor that stands down (it lost
  // a race, the generation was recorded meanwhile) must leave the VM to whoever serves it; the
  // serve loop ends an adopted VMM on purpose (terminate) when the VM is over.
  if (!exit_ && !adopted_) {
    signal(SIGKILL);
    while (!exit_) wait_for(std::chrono::milliseconds(1000));
  }
  finish_output(std::chrono::milliseconds(2000));
}

}  // namespace nes::vm
