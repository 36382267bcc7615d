// `neshost wait` and `neshost inspect`: a VM's reconciled state (host/monitor/reconcile.hpp) from its
// state dir, from any process.
#include <poll.h>
#include <sys/syscall.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <chrono>
#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/lib/base.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/lib/record.hpp"
#include "protocol/status.hpp"

namespace nes::cli {
namespace {

constexpr std::string_view kWaitHelp = R"(usage: neshost wait [--state DIR] [--generation N] [--timeout S] [--format json] VM

Wait until the VM is no longer running (of generation N or newer, if given): exited, failed or
stopped, as `neshost ps` and `inspect` say. Print its exit status and exit with it (a failed VM
without an outcome: 125; 125 too when the record says workload output was lost, with one line on
stderr per stream naming its bytes). Returns at once if it has ended. Works from any process: it needs only
the state dir (inotify on it, and the monitor's pidfd: a monitor that dies without recording an
outcome ends the wait as failed, never a wait forever). A VM that does not exist yet is waited
for until it appears and ends (unlike docker wait: give --timeout if it may never come). DIR
defaults as for `neshost run`.
  --timeout S   give up after S seconds: exit 124 (timeout(1))
  --format json print one JSON object instead of the bare status, saying a code from a signal
                (137 is exit(137) or SIGKILL): vm, generation, status (exited, failed, stopped),
                outcome (the record's; null without one), exit_code (only for outcome exited),
                signal (only for signalled: its number), exit_status (the status printed without
                --format, and the exit status), reason, started_at, finished_at, lost, truncated
Exit 1 if the state dir cannot be read.
)";

constexpr std::string_view kInspectHelp = R"(usage: neshost inspect [--state DIR] VM

Print the VM's reconciled state as one JSON object: the current generation's outcome record
(schema_version, vm, generation, outcome, exit_code, signal, exit_status, reason, started_at,
finished_at, and lost, truncated, lost_reason when output was lost; without one: vm, generation,
outcome null, exit_status), then status (running,
exited, failed, stopped), status_reason, monitor_pid, monitor_alive, stop_requested, vmm_pid, vmm_alive
(a detached VM's QEMU or sandbox, which outlives its monitor; an orphaned VM is adopted first).
Exit 1 if there is no such VM.
)";

constexpr FlagSpec kWaitFlags[] = {{"state"}, {"generation"}, {"timeout"}, {"format"}};
constexpr FlagSpec kInspectFlags[] = {{"state"}};

struct Target {
  std::filesystem::path state;
  std::string vm;
};

host::Result<Target> target(std::string_view cmd, const Parsed& p) {
  if (p.positional.empty()) return host::Error{"VM is required"};
  if (p.positional.size() > 1)
    return host::Error{fmt::format("unexpected argument '{}'", p.positional[1])};
  if (auto id = host::check_vm_id(p.positional[0]); !id) return host::Error{"VM: " + id.error().message};
  (void)cmd;
  return Target{p.has("state") ? std::filesystem::path(*p.get("state")) : default_state_dir(),
                p.positional[0]};
}

int inspect_main(const Args& args) {
  auto p = parse_flags(kInspectFlags, args);
  if (!p) return usage_error("inspect", p.error().message);
  if (p->help) { fmt::print("{}", kInspectHelp); return 0; }
  auto t = target("inspect", *p);
  if (!t) return usage_error("inspect", t.error().message);
  adopt_orphan("inspect", t->state, t->vm);
  auto r = host::reconcile(t->state, t->vm);
  if (!r) { fmt::print(stderr, "neshost inspect: {}\n", r.error().message); return 1; }
  if (!*r) {
    fmt::print(stderr, "neshost inspect: no such VM (no outcome recorded, no monitor) '{}' in {}\n",
               t->vm, t->state.string());
    return 1;
  }
  std::fputs(host::encode_state(**r).c_str(), stdout);
  return 0;
}

int wait_main(const Args& args) {
  auto p = parse_flags(kWaitFlags, args);
  if (!p) return usage_error("wait", p.error().message);
  if (p->help) { fmt::print("{}", kWaitHelp); return 0; }
  auto t = target("wait", *p);
  if (!t) return usage_error("wait", t.error().message);
  std::uint64_t min_gen = 0;
  if (auto g = p->get("generation")) {
    auto n = parse_uint("generation", *g, 0, UINT64_MAX);
    if (!n) return usage_error("wait", n.error().message);
    min_gen = *n;
  }
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (auto v = p->get("timeout")) {
    auto ms = parse_seconds("timeout", *v);
    if (!ms) return usage_error("wait", ms.error().message);
    deadline = std::chrono::steady_clock::now() + *ms;
  }
  bool json = false;
  if (auto f = p->get("format")) {
    if (*f != "json") return usage_error("wait", fmt::format("--format: expected json, got '{}'", *f));
    json = true;
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(t->state, ec)) {
    fmt::print(stderr, "neshost wait: --state: {} is not a directory\n", t->state.string());
    return 1;
  }
  host::Fd in{::inotify_init1(IN_CLOEXEC | IN_NONBLOCK)};
  if (!in) { fmt::print(stderr, "neshost wait: inotify: {}\n", std::strerror(errno)); return 1; }
  // Watch first, then look: a record renamed in between is seen either way.
  if (::inotify_add_watch(in.get(), t->state.c_str(), IN_CREATE | IN_MOVED_TO | IN_ONLYDIR) < 0) {
    fmt::print(stderr, "neshost wait: watching {}: {}\n", t->state.string(), std::strerror(errno));
    return 1;
  }
  bool vm_watched = false;
  int retry_ms = -1;  // the next poll's bound (ms): -1 none
  auto vm_dir = t->state / t->vm;
  for (;;) {
    if (!vm_watched &&
        ::inotify_add_watch(in.get(), vm_dir.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE | IN_ONLYDIR) >= 0)
      vm_watched = true;
    // A VM whose monitor died (now, or before we looked) is served again: its replacement
    // records the outcome we wait for.
    adopt_orphan("wait", t->state, t->vm);
    auto r = host::reconcile(t->state, t->vm);
    if (!r) { fmt::print(stderr, "neshost wait: {}\n", r.error().message); return 1; }
    host::Fd monitor;
    if (*r && (*r)->generation >= min_gen) {
      if ((*r)->status != host::VmStatus::running) {
        int st = (*r)->exit_status.value_or(proto::kStatusHostFailure);
        if (json) std::fputs(host::encode_wait(**r).c_str(), stdout);
        else fmt::print("{}\n", st);
        if ((*r)->status == host::VmStatus::failed && !(*r)->record)
          fmt::print(stderr, "neshost wait: VM '{}' failed: {}\n", t->vm, (*r)->reason);
        // Output lost: 125 instead of the workload's status, and one line per stream.
        if ((*r)->record)
          for (const auto& l : host::describe_loss(*(*r)->record)) fmt::print(stderr, "neshost wait: {}\n", l);
        return st;
      }
      // Running: its monitor's exit wakes us too (it may die without writing anything). The
      // identity is checked again once the pidfd pins the process. Orphaned (no replacement took
      // it over yet): its VMM's exit wakes us, and adoption is tried again at most once a second.
      const bool orphaned = (*r)->orphaned();
      const host::ProcessIdentity& who = orphaned ? *(*r)->vmm : (*r)->monitor->monitor;
      monitor.reset(static_cast<int>(::syscall(SYS_pidfd_open, who.pid, 0)));
      if (!orphaned) {
        if (!monitor && errno == ESRCH) continue;  // gone just now: look again
        if (monitor && !host::is_alive(who)) continue;
      }
      if (orphaned) retry_ms = 1000;
    }
    int timeout_ms = retry_ms;
    retry_ms = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        fmt::print(stderr, "neshost wait: no outcome for vm '{}' within --timeout\n", t->vm);
        return proto::kStatusTimeout;
      }
      timeout_ms = static_cast<int>(std::min<long long>(left.count(), timeout_ms < 0 ? 1 << 30 : timeout_ms));
    }
    pollfd pfd[2] = {{in.get(), POLLIN, 0}, {monitor.get(), POLLIN, 0}};
    int n = ::poll(pfd, monitor ? 2 : 1, timeout_ms);
    if (n < 0 && errno != EINTR) { fmt::print(stderr, "neshost wait: poll: {}\n", std::strerror(errno)); return 1; }
    alignas(inotify_event) char buf[4096];
    while (::read(in.get(), buf, sizeof buf) > 0) {}
  }
}

const Registrar reg_wait{{"wait", "wait until a VM is no longer running; exit with its status", wait_main}};
const Registrar reg_inspect{{"inspect", "print a VM's reconciled state and outcome record (JSON)", inspect_main}};

}  // namespace
}  // namespace nes::cli
