#include "host/shim/gated_spawn.hpp"

#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

extern char** environ;

namespace nes::shim {

namespace {

// `prog` as execve(2) takes it: a name without '/' found on PATH (execvp's search, done before
// forking: the child may only make async-signal-safe calls).
std::string resolve(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return prog;
  const char* path = std::getenv("PATH");
  std::string_view rest = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (!rest.empty()) {
    auto colon = rest.find(':');
    std::string_view dir = rest.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    std::string cand = fmt::format("{}/{}", dir.empty() ? "." : dir, prog);
    if (::access(cand.c_str(), X_OK) == 0) return cand;
  }
  return prog;
}

// fd `from` as the child's fd `to` (no close-on-exec).
bool place(int from, int to) {
  if (from == to) return ::fcntl(to, F_SETFD, 0) == 0;
  return ::dup2(from, to) == to;
}

}  // namespace

host::Result<GatedChild> spawn_gated(const std::string& prog, const std::vector<std::string>& args, const Streams& s) {
  const std::string path = resolve(prog);
  std::vector<std::string> strs{prog};
  strs.insert(strs.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : strs) argv.push_back(a.data());
  argv.push_back(nullptr);
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return host::errno_error(errno, fmt::format("spawn {}: pipe", prog));
  host::Fd rd(p[0]), wr(p[1]);
  // The child's errno if it cannot run the program (before the gate, or execve's), for
  // release() to report; close-on-exec, so EOF means it ran.
  if (::pipe2(p, O_CLOEXEC) != 0) return host::errno_error(errno, fmt::format("spawn {}: pipe", prog));
  host::Fd exec_rd(p[0]), exec_wr(p[1]);
  // The child's kept fds above 0-2 (which it overwrites), should the shim's own be closed.
  for (host::Fd* f : {&rd, &exec_wr})
    if (f->get() < 3) {
      host::Fd up(::fcntl(f->get(), F_DUPFD_CLOEXEC, 3));
      if (!up) return host::errno_error(errno, fmt::format("spawn {}: fcntl", prog));
      *f = std::move(up);
    }
  // The highest fd to close in the child when close_range(2) is missing (Linux < 5.9).
  rlimit nofile{};
  const int max_fd = ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY
                         ? static_cast<int>(std::min<rlim_t>(nofile.rlim_cur, 1 << 20))
                         : 65536;
  const int in = s.in.get(), out = s.out.get(), err = s.err.get();
  // Every signal blocked across fork (as glibc's posix_spawn does): no handler of the shim's
  // runs in the child before its dispositions are reset.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: async-signal-safe calls only. Any failure is said on exec_wr and ends it.
    const int ew = exec_wr.get(), gate = rd.get();
    auto die = [ew](int e) {
      (void)!::write(ew, &e, sizeof e);
      ::_exit(e == ENOENT ? 127 : 125);
    };
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction sa {};
      sa.sa_handler = SIG_DFL;
      ::sigaction(sig, &sa, nullptr);  // fails harmlessly for SIGKILL, SIGSTOP and glibc's own
    }
    ::setsid();
    // Each stream copied above every fd we keep first, so placing one never overwrites another.
    const int floor = std::max({3, ew, gate}) + 1;
    int hi_in = ::fcntl(in, F_DUPFD_CLOEXEC, floor), hi_out = ::fcntl(out, F_DUPFD_CLOEXEC, floor),
        hi_err = ::fcntl(err, F_DUPFD_CLOEXEC, floor);
    if (hi_in < 0 || hi_out < 0 || hi_err < 0 || !place(hi_in, 0) || !place(hi_out, 1) || !place(hi_err, 2)) die(errno);
    // Nothing else of the shim's while waiting (containerd's connections above all): 0-2, the
    // gate and the error pipe stay. close_range(2) where the kernel has it (5.9), else close(2)
    // up to the fd limit.
    auto close_span = [max_fd](unsigned a, unsigned b) {
      if (a > b || ::syscall(SYS_close_range, a, b, 0u) == 0) return;
      for (unsigned fd = a; fd <= b && fd <= static_cast<unsigned>(max_fd); ++fd) ::close(static_cast<int>(fd));
    };
    const unsigned lo = static_cast<unsigned>(std::min(ew, gate)), hi = static_cast<unsigned>(std::max(ew, gate));
    close_span(3, lo - 1);
    close_span(lo + 1, hi - 1);
    close_span(hi + 1, ~0u);
    char go = 0;
    ssize_t n;
    do n = ::read(gate, &go, 1); while (n < 0 && errno == EINTR);
    if (n != 1) ::_exit(125);  // the gate closed unreleased: nothing runs
    ::close(gate);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(path.c_str(), argv.data(), environ);
    die(errno);
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) return host::errno_error(fork_errno, fmt::format("spawn {}: fork", prog));
  return GatedChild{pid, std::move(wr), std::move(exec_rd)};
}

host::Status release(GatedChild& c, std::string_view prog) {
  const char go = 1;
  ssize_t n;
  do n = ::write(c.gate.get(), &go, 1); while (n < 0 && errno == EINTR);
  const int write_errno = n == 1 ? 0 : errno;  // EPIPE: the child is gone (its reason follows)
  c.gate.reset();
  // The other end closes at execve (close-on-exec) or when the child exits: bounded by its exec.
  int child_errno = 0;
  do n = ::read(c.exec_errors.get(), &child_errno, sizeof child_errno); while (n < 0 && errno == EINTR);
  c.exec_errors.reset();
  if (n == sizeof child_errno) return host::errno_error(child_errno, fmt::format("spawn {}", prog));
  if (write_errno) return host::errno_error(write_errno, fmt::format("spawn {}: release", prog));
  return host::Ok{};
}

}  // namespace nes::shim
