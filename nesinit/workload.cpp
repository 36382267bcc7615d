#include "workload.hpp"

#include <fcntl.h>
#include <grp.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include <fmt/format.h>

namespace nes::init {

std::vector<std::string> workload_env(const proto::Exec& exec, const proto::Geometry& g) {
  std::map<std::string, std::string> env = exec.env;
  // exec.env wins over the geometry variables: emplace never overwrites.
  env.emplace("NESINIT_WIDTH", fmt::format("{}", g.width));
  env.emplace("NESINIT_HEIGHT", fmt::format("{}", g.height));
  env.emplace("NESINIT_FPS", fmt::format("{}", g.fps));
  env.emplace("NESINIT_HDR", g.hdr ? "1" : "0");
  std::vector<std::string> out;
  out.reserve(env.size());
  for (auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::vector<std::string> exec_candidates(const std::string& argv0, const std::string& path) {
  if (argv0.find('/') != std::string::npos) return {argv0};
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    std::size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    out.push_back(dir.empty() ? argv0 : (dir.back() == '/' ? dir + argv0 : dir + "/" + argv0));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return out;
}

std::string_view to_string(SpawnStep s) {
  switch (s) {
    case SpawnStep::fork: return "fork";
    case SpawnStep::pipe: return "pipe";
    case SpawnStep::setsid: return "setsid";
    case SpawnStep::console: return "open /dev/console";
    case SpawnStep::sigmask: return "sigprocmask";
    case SpawnStep::chdir: return "chdir";
    case SpawnStep::setgroups: return "setgroups";
    case SpawnStep::setgid: return "setgid";
    case SpawnStep::setuid: return "setuid";
    case SpawnStep::exec: return "execve";
    case SpawnStep::stdio: return "dup2 stdio";
    case SpawnStep::terminal: return "TIOCSCTTY";
  }
  return "?";
}

proto::StartFailClass classify(SpawnStep step, int err) {
  if (step != SpawnStep::exec) return proto::StartFailClass::other;
  switch (err) {
    case ENOENT:
    case ENOTDIR: return proto::StartFailClass::not_found;
    case EACCES:
    case ENOEXEC:
    case EPERM:
    case EISDIR: return proto::StartFailClass::not_executable;
    default: return proto::StartFailClass::other;
  }
}

namespace {

/// What the child writes to the pipe when a step fails.
struct ChildReport {
  std::int32_t step;
  std::int32_t err;
};

[[noreturn]] void child_fail(int fd, SpawnStep step, int err) {
  ChildReport r{static_cast<std::int32_t>(step), err};
  // A pipe write of this size is atomic; nothing more can be done if it fails.
  [[maybe_unused]] auto n = ::write(fd, &r, sizeof r);
  ::_exit(127);
}

void close_fds_from_3(int keep) {
  // Every fd >= 3 is closed now, except `keep` (the CLOEXEC pipe that reports exec's result):
  // the workload starts with exactly fds 0-2, whatever the init had open (the channel, signalfd,
  // its log's reopened stderr).
  const unsigned k = keep >= 3 ? static_cast<unsigned>(keep) : 2u;
#ifdef SYS_close_range
  bool ok = true;
  if (k > 3) ok = ::syscall(SYS_close_range, 3u, k - 1, 0u) == 0;
  if (ok && ::syscall(SYS_close_range, k + 1, ~0u, 0u) == 0) return;
#endif
  struct rlimit rl {};
  long max = (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
                 ? static_cast<long>(rl.rlim_cur) : 65536;
  if (max > 1 << 20) max = 1 << 20;
  for (int fd = 3; fd < max; ++fd)
    if (fd != keep) ::close(fd);
}

}  // namespace

SpawnResult spawn(const proto::Exec& exec, const proto::Geometry& g, Stdio stdio, Reaper& reaper,
                  const ChildFds* fds, Role role) {
  auto fail = [](SpawnStep step, int err, std::string detail = {}) -> SpawnResult {
    return proto::StartFailed{
        fmt::format("{}{}{}: {}", to_string(step), detail.empty() ? "" : " ", detail, std::strerror(err)),
        err, classify(step, err)};
  };
  if (exec.argv.empty()) return fail(SpawnStep::exec, EINVAL, "(empty argv)");

  // Everything the child needs is built before fork: after fork it only makes system calls.
  std::vector<std::string> env = workload_env(exec, g);
  auto path_it = exec.env.find("PATH");
  std::vector<std::string> candidates =
      exec_candidates(exec.argv[0], path_it != exec.env.end() ? path_it->second : kDefaultPath);
  std::vector<char*> argvp, envp;
  for (const auto& a : exec.argv) argvp.push_back(const_cast<char*>(a.c_str()));
  argvp.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string cwd = exec.cwd.value_or("/");
  std::vector<gid_t> groups(exec.groups.begin(), exec.groups.end());

  int pfd[2];
  if (::pipe2(pfd, O_CLOEXEC) != 0) return fail(SpawnStep::pipe, errno);

  // The caller (PID 1) has every catchable signal blocked, so the child starts with them blocked
  // too: nothing can run a disposition before the child has reset it.
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    ::close(pfd[0]);
    ::close(pfd[1]);
    return fail(SpawnStep::fork, e);
  }
  if (pid == 0) {
    ::close(pfd[0]);
    const int rfd = pfd[1];
    // Own session and process group: signals to the workload's group reach all it starts, and
    // nothing reaches PID 1 through a terminal.
    if (::setsid() < 0) child_fail(rfd, SpawnStep::setsid, errno);
    if (fds) {
      // Move any of the given fds out of 0..2 first, so no dup2 below overwrites one still needed.
      int src[3];
      for (int i = 0; i < 3; ++i) {
        if (fds->fd[i] < 0) child_fail(rfd, SpawnStep::stdio, EBADF);
        src[i] = fds->fd[i] < 3 ? ::fcntl(fds->fd[i], F_DUPFD_CLOEXEC, 3) : fds->fd[i];
        if (src[i] < 0) child_fail(rfd, SpawnStep::stdio, errno);
      }
      for (int i = 0; i < 3; ++i)
        if (::dup2(src[i], i) < 0) child_fail(rfd, SpawnStep::stdio, errno);
      if (fds->terminal && ::ioctl(0, TIOCSCTTY, 0) != 0) child_fail(rfd, SpawnStep::terminal, errno);
    } else if (stdio == Stdio::console) {
      int fd = ::open("/dev/console", O_RDWR | O_NOCTTY);
      if (fd < 0) fd = ::open("/dev/null", O_RDWR);
      if (fd < 0) child_fail(rfd, SpawnStep::console, errno);
      for (int i = 0; i < 3; ++i)
        if (fd != i) ::dup2(fd, i);
      if (fd > 2) ::close(fd);
    }
    // Dispositions back to default (ignored ones survive exec), then an empty mask.
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig == SIGKILL || sig == SIGSTOP) continue;
      ::signal(sig, SIG_DFL);
    }
    sigset_t none;
    sigemptyset(&none);
    if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0) child_fail(rfd, SpawnStep::sigmask, errno);
    // The init runs at -1000; the workload is an ordinary candidate for the OOM killer. Best
    // effort: without /proc there is nothing to reset.
    int oom = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (oom >= 0) {
      [[maybe_unused]] auto n = ::write(oom, "0", 1);
      ::close(oom);
    }
    close_fds_from_3(rfd);
    if (::chdir(cwd.c_str()) != 0) child_fail(rfd, SpawnStep::chdir, errno);
    // Groups, then gid, then uid: after setuid the others are no longer permitted.
    if (::setgroups(groups.size(), groups.data()) != 0) child_fail(rfd, SpawnStep::setgroups, errno);
    if (::setgid(exec.gid) != 0) child_fail(rfd, SpawnStep::setgid, errno);
    if (::setuid(exec.uid) != 0) child_fail(rfd, SpawnStep::setuid, errno);
    // PATH search as execvp does it: ENOENT/ENOTDIR try the next entry; EACCES is remembered and
    // reported if nothing else runs; any other error stops the search.
    int err = ENOENT;
    bool saw_eacces = false;
    for (auto& c : candidates) {
      ::execve(c.c_str(), argvp.data(), envp.data());
      err = errno;
      if (err == EACCES) { saw_eacces = true; continue; }
      if (err == ENOENT || err == ENOTDIR) continue;
      break;
    }
    if ((err == ENOENT || err == ENOTDIR) && saw_eacces) err = EACCES;
    child_fail(rfd, SpawnStep::exec, err);
  }

  // Registered before the loop can reap: an instant exit is still the workload's.
  if (role == Role::workload) {
    reaper.watch(pid);
  } else if (!reaper.watch_exec(pid)) {
    // No slot (the session bounds execs to the same number, so this does not happen): the
    // child would be taken for an orphan. End it and collect it here.
    ::kill(pid, SIGKILL);
    ::close(pfd[1]);
    ::close(pfd[0]);
    int st;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return fail(SpawnStep::fork, EAGAIN, "(too many processes started by exec)");
  }
  ::close(pfd[1]);
  ChildReport r{};
  std::size_t got = 0;
  while (got < sizeof r) {
    ssize_t n = ::read(pfd[0], reinterpret_cast<char*>(&r) + got, sizeof r - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(pfd[0]);
  if (got == 0) return pid;  // EOF: execve succeeded and closed the CLOEXEC end
  // The child failed and exits 127 right after its report: collect it here, so the reaper never
  // mistakes it for the workload's exit (start_failed has no workload_exited after it).
  reaper.forget(pid);
  int st;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (got < sizeof r) return fail(SpawnStep::exec, EIO, "(short report from the child)");
  auto step = static_cast<SpawnStep>(r.step);
  std::string detail;
  if (step == SpawnStep::exec) detail = exec.argv[0];
  if (step == SpawnStep::chdir) detail = cwd;
  return fail(step, r.err, detail);
}

}  // namespace nes::init
