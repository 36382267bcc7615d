#include "workload.hpp"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>

#include <fmt/format.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

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
    case SpawnStep::container: return "exec.container.root:";
    case SpawnStep::cgroup: return "exec.container: join its cgroup";
    case SpawnStep::join: return "exec.in:";
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

/// What the child leaves for the parent when a step fails (in the memory they share).
struct ChildReport {
  std::int32_t step = 0;  // 0: nothing failed (the child exec'd)
  std::int32_t err = 0;
  std::int32_t index = 0;  // the failing container step or namespace (SpawnStep::container, join)
};

/// Moves the calling process into the cgroup whose cgroup.procs is `procs` (cgroup.hpp): 0 or
/// the errno. System calls only (a vfork-style child).
int join_cgroup(const char* procs) {
  int fd = ::open(procs, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = ::write(fd, "0", 1) == 1 ? 0 : errno;
  ::close(fd);
  return err;
}

void close_fds_from_3() {
  // Every fd >= 3 is closed now: the workload starts with exactly fds 0-2, whatever the init had
  // open (the channel, signalfd, its log's reopened stderr).
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 3u, ~0u, 0u) == 0) return;
#endif
  struct rlimit rl {};
  long max = (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
                 ? static_cast<long>(rl.rlim_cur) : 65536;
  if (max > 1 << 20) max = 1 << 20;
  for (int fd = 3; fd < max; ++fd) ::close(fd);
}

/// Everything the child reads (built by the parent before the clone) and the one thing it writes.
struct ChildArgs {
  const proto::Exec* exec;
  Stdio stdio;
  const ChildFds* fds;
  const std::vector<std::string>* candidates;
  char* const* argvp;
  char* const* envp;
  const char* cwd;
  const std::vector<gid_t>* groups;
  const Enclosure* where;
  ChildReport report;
  pid_t joined = 0;  // exec.in: the process the intermediate child started in the container
  char* stack2 = nullptr;  // ... on this stack
};

/// The child, between clone and execve. It shares the parent's memory (CLONE_VM) while the
/// parent waits (CLONE_VFORK), as posix_spawn's child does: it only makes system calls, writes
/// nothing of the parent's but `report`, and ends in execve or _exit. Credentials are set by the
/// raw system calls: libc's setuid/setgid/setgroups would act on the parent's thread list.
int child_main(void* p) {
  auto* a = static_cast<ChildArgs*>(p);
  auto fail = [a](SpawnStep step, int err) {
    a->report.step = static_cast<std::int32_t>(step);
    a->report.err = err;
    ::_exit(127);
  };
  // Own session and process group: signals to the workload's group reach all it starts, and
  // nothing reaches PID 1 through a terminal.
  if (::setsid() < 0) fail(SpawnStep::setsid, errno);
  if (const ChildFds* fds = a->fds) {
    // Move any of the given fds out of 0..2 first, so no dup2 below overwrites one still needed.
    int src[3];
    for (int i = 0; i < 3; ++i) {
      if (fds->fd[i] < 0) fail(SpawnStep::stdio, EBADF);
      src[i] = fds->fd[i] < 3 ? ::fcntl(fds->fd[i], F_DUPFD_CLOEXEC, 3) : fds->fd[i];
      if (src[i] < 0) fail(SpawnStep::stdio, errno);
    }
    for (int i = 0; i < 3; ++i)
      if (::dup2(src[i], i) < 0) fail(SpawnStep::stdio, errno);
    if (fds->terminal && ::ioctl(0, TIOCSCTTY, 0) != 0) fail(SpawnStep::terminal, errno);
  } else if (a->stdio == Stdio::console) {
    int fd = ::open("/dev/console", O_RDWR | O_NOCTTY);
    if (fd < 0) fd = ::open("/dev/null", O_RDWR);
    if (fd < 0) fail(SpawnStep::console, errno);
    for (int i = 0; i < 3; ++i)
      if (fd != i) ::dup2(fd, i);
    if (fd > 2) ::close(fd);
  }
  // Dispositions back to default (ignored ones survive exec; a handler must not run in this
  // child, which shares the parent's memory), then an empty mask.
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    ::signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0) fail(SpawnStep::sigmask, errno);
  // A new container: its root, /proc, /dev, /sys and /etc files (container.hpp), before the
  // exec's cwd and PATH search, which are then the container's.
  if (a->where->steps && a->where->cgroup_procs) {
    if (int err = join_cgroup(a->where->cgroup_procs); err != 0) fail(SpawnStep::cgroup, err);
  }
  if (a->where->steps) {
    int err = run_container(*a->where->steps, a->report.index);
    if (err != 0) fail(SpawnStep::container, err);
  }
  // The init runs at -1000; the workload is an ordinary candidate for the OOM killer. Best
  // effort: without /proc there is nothing to reset.
  int oom = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    [[maybe_unused]] auto n = ::write(oom, "0", 1);
    ::close(oom);
  }
  close_fds_from_3();
  if (::chdir(a->cwd) != 0) fail(SpawnStep::chdir, errno);
  // Groups, then gid, then uid: after setuid the others are no longer permitted.
  if (::syscall(SYS_setgroups, a->groups->size(), a->groups->data()) != 0) fail(SpawnStep::setgroups, errno);
  if (::syscall(SYS_setgid, a->exec->gid) != 0) fail(SpawnStep::setgid, errno);
  if (::syscall(SYS_setuid, a->exec->uid) != 0) fail(SpawnStep::setuid, errno);
  // PATH search as execvp does it: ENOENT/ENOTDIR try the next entry; EACCES is remembered and
  // reported if nothing else runs; any other error stops the search.
  int err = ENOENT;
  bool saw_eacces = false;
  for (auto& c : *a->candidates) {
    ::execve(c.c_str(), a->argvp, a->envp);
    err = errno;
    if (err == EACCES) { saw_eacces = true; continue; }
    if (err == ENOENT || err == ENOTDIR) continue;
    break;
  }
  if ((err == ENOENT || err == ENOTDIR) && saw_eacces) err = EACCES;
  fail(SpawnStep::exec, err);
  return 127;
}

/// The child's stack: it runs only child_main's system calls (no formatting, no allocation).
constexpr std::size_t kChildStack = 32 * 1024;

/// exec.in's intermediate child: it joins the container's namespaces and root, then starts the
/// process there (a setns'd pid namespace applies to children only) as the init's child
/// (CLONE_PARENT: the init reaps it), and exits. It shares the init's memory, as child_main.
int join_main(void* p) {
  auto* a = static_cast<ChildArgs*>(p);
  // The container's cgroup first (its path is the VM's, not the container's): the process it
  // starts inherits it. Best effort when it is gone (the container is ending).
  if (a->where->cgroup_procs) (void)join_cgroup(a->where->cgroup_procs);
  int err = join_container(*a->where->join, a->report.index);
  if (err != 0) {
    a->report = {static_cast<std::int32_t>(SpawnStep::join), err, a->report.index};
    ::_exit(127);
  }
  pid_t pid = ::clone(child_main, a->stack2 + kChildStack, CLONE_VM | CLONE_VFORK | CLONE_PARENT | SIGCHLD, a);
  if (pid < 0) a->report = {static_cast<std::int32_t>(SpawnStep::fork), errno, 0};
  a->joined = pid;
  ::_exit(0);
}

}  // namespace

SpawnResult spawn(const proto::Exec& exec, const proto::Geometry& g, Stdio stdio, Reaper& reaper,
                  const ChildFds* fds, Role role, const Enclosure& where) {
  auto fail = [](SpawnStep step, int err, std::string detail = {}) -> SpawnResult {
    return proto::StartFailed{
        fmt::format("{}{}{}: {}", to_string(step), detail.empty() ? "" : " ", detail, std::strerror(err)),
        err, classify(step, err)};
  };
  if (exec.argv.empty()) return fail(SpawnStep::exec, EINVAL, "(empty argv)");

  // Everything the child needs is built before the clone: after it the child only makes system
  // calls.
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
  ChildArgs args{&exec, stdio, fds, &candidates, argvp.data(), envp.data(), cwd.c_str(), &groups, &where, {}};

  // The caller (PID 1) has every catchable signal blocked, so the child starts with them blocked
  // too: nothing can run a disposition before the child has reset it. CLONE_VM|CLONE_VFORK (what
  // posix_spawn does): no copy of the init's page tables, and this call returns only once the
  // child has exec'd or exited, with its report (if any) in `args`.
  // A new container: new mount, pid (the child is its PID 1) and, with a hostname, UTS
  // namespaces. exec.in: an intermediate child joins and starts the process (join_main).
  alignas(16) std::array<char, kChildStack> stack;
  int flags = CLONE_VM | CLONE_VFORK | SIGCHLD;
  if (where.steps) flags |= CLONE_NEWNS | CLONE_NEWPID | (where.uts ? CLONE_NEWUTS : 0);
  std::vector<char> stack2(where.join ? kChildStack + 16 : 0);
  if (where.join) args.stack2 = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(stack2.data()) + 15) & ~std::uintptr_t{15});
  pid_t pid = ::clone(where.join ? join_main : child_main, stack.data() + stack.size(), flags, &args);
  if (where.join && pid > 0) {
    // The intermediate has exited (after its child exec'd or failed): collect it; the process
    // that runs is its child's pid, the init's child (CLONE_PARENT).
    int st;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    pid = args.joined;
    if (args.report.step != 0 && pid <= 0) pid = 0;  // nothing more to collect
  }
#if defined(__SANITIZE_ADDRESS__)
  // The child's frames marked their redzones in the shadow of `stack` and never returned to
  // clear them (the child exec'd or exited): clear them here, or a later frame of ours that
  // reuses this stack is misreported (a vfork child under ASan).
  ASAN_UNPOISON_MEMORY_REGION(stack.data(), stack.size());
  if (!stack2.empty()) ASAN_UNPOISON_MEMORY_REGION(stack2.data(), stack2.size());
#endif
  if (pid < 0) return fail(SpawnStep::fork, errno);
  if (args.report.step == 0 && pid > 0) {
    // Registered before the loop can reap: an instant exit is still the workload's.
    if (role == Role::workload) {
      reaper.watch(pid);
      return pid;
    }
    if (reaper.watch_exec(pid)) return pid;
    // No slot (the session bounds execs to the same number, so this does not happen): the
    // child would be taken for an orphan. End it and collect it here.
    ::kill(pid, SIGKILL);
    int st;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return fail(SpawnStep::fork, EAGAIN, "(too many processes started by exec)");
  }
  // The child failed and exited 127 after its report: collect it here, so the reaper never
  // mistakes it for the workload's exit (start_failed has no workload_exited after it).
  int st;
  while (pid > 0 && ::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  auto step = static_cast<SpawnStep>(args.report.step);
  std::string detail;
  if (step == SpawnStep::exec) detail = exec.argv[0];
  if (step == SpawnStep::chdir) detail = cwd;
  const int i = args.report.index;
  if (step == SpawnStep::container && where.steps && i >= 0 && static_cast<std::size_t>(i) < where.steps->size())
    detail = describe((*where.steps)[static_cast<std::size_t>(i)]);
  if (step == SpawnStep::join && where.join && i >= 0 && i < 4)
    detail = fmt::format("open/enter {}", i < 3 ? where.join->ns[i] : where.join->root);
  return fail(step, args.report.err, detail);
}

}  // namespace nes::init
