#include "host/shim/gated_spawn.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

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
  // execve's errno, if it fails, for release() to report (close-on-exec: EOF means it ran).
  if (::pipe2(p, O_CLOEXEC) != 0) return host::errno_error(errno, fmt::format("spawn {}: pipe", prog));
  host::Fd exec_rd(p[0]), exec_wr(p[1]);
  int in = s.in.get(), out = s.out.get(), err = s.err.get();
  const pid_t pid = ::fork();
  if (pid < 0) return host::errno_error(errno, fmt::format("spawn {}: fork", prog));
  if (pid == 0) {
    // The child: async-signal-safe calls only.
    ::close(wr.get());
    ::close(exec_rd.get());
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction sa {};
      sa.sa_handler = SIG_DFL;
      ::sigaction(sig, &sa, nullptr);  // fails harmlessly for SIGKILL, SIGSTOP and glibc's own
    }
    ::setsid();
    // Each stream copied above 2 first, so placing one never overwrites another.
    int hi_in = ::fcntl(in, F_DUPFD_CLOEXEC, 3), hi_out = ::fcntl(out, F_DUPFD_CLOEXEC, 3),
        hi_err = ::fcntl(err, F_DUPFD_CLOEXEC, 3);
    if (hi_in < 0 || hi_out < 0 || hi_err < 0 || !place(hi_in, 0) || !place(hi_out, 1) || !place(hi_err, 2)) ::_exit(125);
    char go = 0;
    ssize_t n;
    do n = ::read(rd.get(), &go, 1); while (n < 0 && errno == EINTR);
    if (n != 1) ::_exit(125);  // the gate closed unreleased: nothing runs
    // Nothing else of the shim's but the exec-error pipe (close-on-exec itself).
    const unsigned keep = static_cast<unsigned>(exec_wr.get());
    if (keep > 3) ::syscall(SYS_close_range, 3u, keep - 1, 0u);
    ::syscall(SYS_close_range, keep + 1, ~0u, 0u);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(path.c_str(), argv.data(), environ);
    const int e = errno;
    (void)!::write(exec_wr.get(), &e, sizeof e);
    ::_exit(127);
  }
  return GatedChild{pid, std::move(wr), std::move(exec_rd)};
}

host::Status release(GatedChild& c, std::string_view prog) {
  const char go = 1;
  ssize_t n;
  do n = ::write(c.gate.get(), &go, 1); while (n < 0 && errno == EINTR);
  const int e = errno;
  c.gate.reset();
  if (n != 1) return host::errno_error(e, fmt::format("spawn {}: release", prog));
  // The other end closes at execve (close-on-exec) or when the child exits: bounded by its exec.
  int exec_errno = 0;
  do n = ::read(c.exec_errors.get(), &exec_errno, sizeof exec_errno); while (n < 0 && errno == EINTR);
  c.exec_errors.reset();
  if (n == sizeof exec_errno) return host::errno_error(exec_errno, fmt::format("spawn {}: execve", prog));
  return host::Ok{};
}

}  // namespace nes::shim
