#include "host/monitor/adopt.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <vector>

#include "host/lib/state_dir.hpp"
#include "host/monitor/removal.hpp"
#include "host/vm/netns.hpp"
#include "host/monitor/vmm_record.hpp"

namespace nes::monitor {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

/// Starts `neshost monitor` detached (double fork). Returns the read end of its notify pipe.
host::Result<host::Fd> spawn_replacement(const fs::path& state, std::string_view vm, const fs::path& neshost) {
  // Everything the children need, made before fork (only async-signal-safe calls after it). A
  // bare name is looked up in PATH here, as execvp(3) would.
  std::string prog = neshost.string();
  if (prog.find('/') == std::string::npos) {
    const char* path = std::getenv("PATH");
    std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
    for (std::size_t pos = 0; pos <= dirs.size();) {
      auto colon = dirs.find(':', pos);
      if (colon == std::string_view::npos) colon = dirs.size();
      std::string cand = std::string(dirs.substr(pos, colon - pos)) + "/" + neshost.string();
      if (colon > pos && ::access(cand.c_str(), X_OK) == 0) {
        prog = cand;
        break;
      }
      pos = colon + 1;
    }
  }
  std::vector<std::string> args{prog, "monitor", "--state", state.string(), "--notify-fd", "3", std::string(vm)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  host::Fd null{::open("/dev/null", O_RDWR | O_CLOEXEC)};
  if (!null) return host::Error{fmt::format("open /dev/null: {}", std::strerror(errno))};
  const fs::path log_path = host::vm_path(state, vm, host::kMonitorLog);
  host::Fd log{::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600)};
  if (!log) log.reset(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return host::Error{fmt::format("pipe: {}", std::strerror(errno))};
  host::Fd rd{p[0]}, wr{p[1]};
  pid_t pid = ::fork();
  if (pid < 0) return host::Error{fmt::format("fork: {}", std::strerror(errno))};
  if (pid == 0) {
    ::setsid();
    if (::fork() != 0) ::_exit(0);  // the grandchild runs on, not our child
    int w = ::fcntl(wr.get(), F_DUPFD_CLOEXEC, 10);
    ::dup2(null.get(), 0);
    ::dup2(null.get(), 1);
    ::dup2(log.get(), 2);
    ::dup2(w, 3);  // the notify pipe, inherited as fd 3
    ::syscall(SYS_close_range, 4u, ~0u, 0u);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(prog.c_str(), argv.data());
    ::_exit(127);
  }
  wr.reset();
  int st;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return rd;
}

/// Reads the notify pipe until a line or EOF, at most `bound`. Returns the line (empty: EOF or
/// nothing in time).
std::string await_notify(int fd, std::chrono::milliseconds bound) {
  std::string got;
  auto deadline = std::chrono::steady_clock::now() + bound;
  pollfd pf{fd, POLLIN, 0};
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return {};
    int n = ::poll(&pf, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return {};
    char buf[256];
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return got;
    got.append(buf, static_cast<std::size_t>(r));
    if (auto nl = got.find('\n'); nl != std::string::npos) return got.substr(0, nl);
    if (got.size() > 4096) return got;
  }
}

}  // namespace

fs::path self_program() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path("neshost") : p;
}

host::Result<std::optional<host::VmState>> ensure_monitor(const fs::path& state, std::string_view vm,
                                                          const fs::path& neshost, std::chrono::milliseconds bound,
                                                          std::string* said) {
  // A removal a crash cut short (host/monitor/removal.hpp) is finished before anything reads it.
  if (auto f = host::finish_removal(state, vm); f && *f != host::Finished::nothing && said)
    *said = fmt::format("VM {}: finished a removal its monitor began and did not end ({})", vm,
                        *f == host::Finished::all ? "the whole VM" : *f == host::Finished::scratch ? "its scratch files"
                                                                                                 : "a stale intent");
  else if (!f && said)
    *said = fmt::format("VM {}: an unfinished removal: {}", vm, f.error().message);
  auto s = host::reconcile(state, vm);
  if (!s) return s.error();
  if (!*s) return s;
  if (!(*s)->orphaned()) {
    // Monitor and VMM gone (reconciled as failed, or stopped): what they left must not linger.
    if (!(*s)->monitor_alive && !(*s)->vmm_alive)
      if (auto v = host::load_vmm(state, vm); v && *v && (*v)->generation == (*s)->generation) {
        host::end_leftovers(**v);
        // netns mode: the tap and redirects its monitor made, while the namespace's path still
        // names it (else nothing holds the namespace and they went with it).
        if (const auto& n = (*v)->netns; n && n->tap.starts_with("nes"))
          if (auto ns = vm::open_netns(n->path))
            vm::NetnsAttachment::reclaim(std::move(*ns), n->path, n->tap, n->interface, [](std::string_view) {});
      }
    return s;
  }
  const auto deadline = std::chrono::steady_clock::now() + bound;
  // Watched before the replacement starts: its monitor.json (renamed into place) or the record.
  host::Fd ino{::inotify_init1(IN_CLOEXEC | IN_NONBLOCK)};
  if (ino) ::inotify_add_watch(ino.get(), (state / std::string(vm)).c_str(), IN_MOVED_TO | IN_CLOSE_WRITE | IN_ONLYDIR);
  auto rd = spawn_replacement(state, vm, neshost);
  if (!rd) return rd.error();
  const std::string line = await_notify(rd->get(), bound);
  auto after = host::reconcile(state, vm);
  // A replacement that lost the race exits at once, saying so: the winner is still taking over.
  while (after && *after && (*after)->orphaned() && ino) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd pf{ino.get(), POLLIN, 0};
    int n = ::poll(&pf, 1, static_cast<int>(std::min<long long>(left.count(), 200)));
    if (n < 0 && errno != EINTR) break;
    alignas(inotify_event) char buf[4096];
    while (::read(ino.get(), buf, sizeof buf) > 0) {}
    after = host::reconcile(state, vm);
  }
  if (!after) return after.error();
  if (said) {
    if (*after && (*after)->monitor_alive && (*after)->monitor)
      *said = fmt::format("VM {}: its monitor was gone; adopted by a new monitor (pid {})", vm,
                          (*after)->monitor->monitor.pid);
    else if (!line.empty())
      *said = fmt::format("VM {}: {}", vm, line);
    else if (*after && (*after)->orphaned())
      *said = fmt::format("VM {}: its monitor is gone and no replacement took it over within {} ms (see {})", vm,
                          bound.count(), host::vm_path(state, vm, host::kMonitorLog).string());
  }
  return after;
}

}  // namespace nes::monitor
