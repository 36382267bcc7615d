// `neshost ps`, `stop`, `kill`, `rm`: the VMs of a state dir, from any process, each through the
// one reconcile rule (host/monitor/reconcile.hpp) and the monitor's control socket (host/monitor/monitor.hpp).
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <cstring>
#include <utility>
#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/cli/flags.hpp"
#include "host/cli/plan.hpp"
#include "host/cli/vm_flags.hpp"
#include "host/lib/escape.hpp"
#include "host/lib/network.hpp"
#include "host/lib/base.hpp"
#include "base/small_file.hpp"
#include "host/monitor/monitor.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/monitor/removal.hpp"
#include "protocol/status.hpp"

namespace nes::cli {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr std::string_view kPsHelp = R"(usage: neshost ps [--state DIR] [-a|--all]

List the VMs of DIR (default: as `neshost run`): VM, generation, status, the monitor's pid,
the published ports (as docker ps: 127.0.0.1:8080->80/tcp), the workload's command. Only running ones unless -a. STATUS is the reconciled status every
command agrees on: running, exited (CODE), failed (125), stopped (STATUS); "output lost" after
the status when workload output was lost (125 then, unless a timeout's 124; `neshost inspect`).
)";

constexpr std::string_view kStopHelp = R"(usage: neshost stop [--state DIR] [-t S] VM

Stop a running VM: the stop is persisted first (a natural exit that comes later does not turn the
VM's status from stopped into exited), then its monitor shuts the guest down in order (SIGTERM
to the workload, the init's grace, SIGKILL, power-off) as SIGTERM to `neshost run` does. Waits
for the monitor to exit; after S seconds (default 30) the workload is sent SIGKILL, 30 s later
the monitor is killed (its VMM dies with it); `-t 0` sends SIGKILL at once, as docker's. A VM whose workload has ended but whose output its
monitor is still delivering (a slow reader) is ended at once: what it could not deliver is
counted and recorded (`neshost run` then exits 125 saying so). Exit 0 once stopped, 1 if no such
VM is running.
)";

constexpr std::string_view kKillHelp = R"(usage: neshost kill [--state DIR] [-s SIG] VM

Send SIG (a name such as TERM or SIGUSR1, or a number 1..64; default KILL, as docker) to the
workload's process group in a running VM, through its monitor. Exit 1 if no such VM is running
or the guest cannot take it (e.g. the workload has exited).
)";

constexpr std::string_view kPauseHelp = R"(usage: neshost pause [--state DIR] VM...
       neshost unpause [--state DIR] VM...

pause stops each running VM's vCPUs (QEMU's `stop`, through the VM's monitor): its workload and
guest make no progress and the guest's clock stands still, memory and devices kept; `ps` shows
it paused. unpause runs them again. As docker pause/unpause: exec into a paused VM is refused,
`kill -s KILL` and `stop` resume it first, other signals wait for unpause. Prints each VM.
Exit 1 if a VM is not running (pause), not paused (unpause), or runs without a VMM (--sandbox).
)";

constexpr std::string_view kStatsHelp = R"(usage: neshost stats [--state DIR] VM...

One line per running VM, as docker stats --no-stream: the guest's own figures (its init reads
them with the process list: /proc/meminfo, /proc/stat) and what its VMM costs this host.
  CPU        the guest's CPU time since boot, user + system, all vCPUs (s)
  MEM USAGE / LIMIT, MEM %   MemTotal - MemAvailable of MemTotal
  PIDS       the guest's user-space processes
  VMM RSS, VMM CPU   the VMM process (QEMU) on this host: resident memory, CPU time (s)
"-" where a figure is unknown (an init that predates the totals). Exit 1 if a VM is not running.
)";

constexpr std::string_view kTopHelp = R"(usage: neshost top [--state DIR] VM

List the processes running in a VM's guest, as `docker top` does: PID, PPID, UID and the
command, pids as the guest sees them (1 is nesinit), kernel threads left out. Asked of the guest
through the VM's monitor; at most 512 are listed (the rest counted). Exit 1 if no such VM is
running or its guest does not answer within 2 s (an init that predates the request).
)";

constexpr std::string_view kRmHelp = R"(usage: neshost rm [--state DIR] [-f|--force] VM...

Remove VMs' state (records, logs, the directory). A running VM is refused unless -f: then its
workload is killed (SIGKILL), the guest powers off, and its state goes once the monitor exited.
An ended VM (exited, failed, stopped) whose guest is still powering off is waited for, at most
10 s (then refused as running: e.g. one kept up by --on-exit keep).
Prints each VM removed. Exit 1 if any could not be removed.
)";

constexpr std::string_view kPortHelp = R"(usage: neshost port [--state DIR] VM [GUEST_PORT[/PROTO]]

List the VM's published ports (`neshost run -p`), one per line as docker port does:
"80/tcp -> 127.0.0.1:8080". With GUEST_PORT (PROTO defaults to tcp): only the host addresses it
is published at. Exit 1 if there is no such VM, or GUEST_PORT is not published.
)";

fs::path state_of(const Parsed& p) {
  auto s = p.get("state");
  return s ? fs::path(*s) : default_state_dir();
}

std::string status_cell(const host::VmState& s) {
  if (s.status == host::VmStatus::running) return s.stop_requested ? "stopping" : s.paused ? "paused" : "running";
  const bool lost = s.record && host::output_lost(*s.record);
  return fmt::format("{} ({}{})", host::to_string(s.status), s.exit_status.value_or(125), lost ? ", output lost" : "");
}

/// A pidfd for the VM's live monitor, opened and then checked again (the identity must still
/// match), so a recycled pid can never be signalled or waited on.
host::Fd monitor_pidfd(const host::VmState& s) {
  if (!s.monitor || !s.monitor_alive) return {};
  host::Fd fd{static_cast<int>(::syscall(SYS_pidfd_open, s.monitor->monitor.pid, 0))};
  if (!fd || !host::is_alive(s.monitor->monitor)) return {};
  return fd;
}

/// Wait up to `bound` for the process behind `pidfd` to exit. true if it did.
bool wait_exit(const host::Fd& pidfd, std::chrono::milliseconds bound) {
  pollfd pf{pidfd.get(), POLLIN, 0};
  auto deadline = std::chrono::steady_clock::now() + bound;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) left = 0ms;
    int r = ::poll(&pf, 1, static_cast<int>(left.count()));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

/// The VM's reconciled state, or a message (exit 1) saying there is none.
std::optional<host::VmState> load(std::string_view cmd, const fs::path& state, const std::string& vm) {
  adopt_orphan(cmd, state, vm);  // a VM whose monitor died is served again first
  auto s = host::reconcile(state, vm);
  if (!s) {
    fmt::print(stderr, "neshost {}: {}\n", cmd, s.error().message);
    return std::nullopt;
  }
  if (!*s) {
    fmt::print(stderr, "neshost {}: no {}VM '{}' in {}\n", cmd, cmd == "rm" ? "" : "running ", vm,
               state.string());
    return std::nullopt;
  }
  return **s;
}

/// The generation a control request about `s` targets (control::Targeted): the one its state
/// names (none if it names none).
std::optional<std::uint64_t> target_of(const host::VmState& s) {
  return s.generation ? std::optional<std::uint64_t>(s.generation) : std::nullopt;
}

/// End a live monitor's VM: `stop` (ordered) or `kill 9` through its control socket; if the
/// monitor does not exit within `grace`, SIGKILL to the workload, then after 30 s SIGKILL to
/// the monitor itself and its VMM (a foreground VM's VMM has PR_SET_PDEATHSIG and dies with it;
/// a detached VM's outlives it and is killed by its recorded identity). Returns false only if
/// the monitor is still alive after all of that.
bool end_monitor(std::string_view cmd, const fs::path& state, const host::VmState& s, bool ordered,
                 std::chrono::milliseconds grace) {
  host::Fd pidfd = monitor_pidfd(s);
  if (!pidfd) return true;  // already gone
  auto ctl = host::control_path(state, s.vm);
  // Aimed at the generation read from the state dir: a monitor of a newer one refuses it.
  auto r = control_request(ctl, control::Targeted{target_of(s), ordered ? control::Request{control::Stop{}}
                                                                        : control::Request{control::Kill{SIGKILL, std::nullopt}},
                                                  std::nullopt});
  if (!r || !std::holds_alternative<control::Ok>(*r)) {
    // No control socket (or the guest cannot take the request now): SIGTERM asks the monitor
    // for the same ordered shutdown.
    if (!r) fmt::print(stderr, "neshost {}: {}; sending SIGTERM to the monitor\n", cmd, r.error().message);
    ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGTERM, nullptr, 0);
  }
  if (wait_exit(pidfd, grace)) return true;
  (void)control_request(ctl, control::Targeted{target_of(s), control::Kill{SIGKILL, std::nullopt}, std::nullopt});
  if (wait_exit(pidfd, 30s)) return true;
  fmt::print(stderr, "neshost {}: VM '{}' did not stop; killing its monitor (pid {})\n", cmd, s.vm,
             s.monitor->monitor.pid);
  ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
  const bool gone = wait_exit(pidfd, 10s);
  if (s.vmm) {
    host::Fd vmm{static_cast<int>(::syscall(SYS_pidfd_open, s.vmm->pid, 0))};
    if (vmm && host::is_alive(*s.vmm)) ::syscall(SYS_pidfd_send_signal, vmm.get(), SIGKILL, nullptr, 0);
  }
  return gone;
}

int ps_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}, {"all", false, "-a"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("ps", p.error().message);
  if (p->help) { fmt::print("{}", kPsHelp); return 0; }
  if (!p->positional.empty()) return usage_error("ps", fmt::format("unexpected argument '{}'", p->positional[0]));
  fs::path state = state_of(*p);
  std::string out = fmt::format("{:<20} {:>4}  {:<14} {:>8}  {:<24}  {}\n", "VM", "GEN", "STATUS", "MONITOR", "PORTS",
                                "COMMAND");
  for (const auto& vm : host::list_vms(state)) {
    adopt_orphan("ps", state, vm);
    auto s = host::reconcile(state, vm);
    if (!s || !*s) continue;
    const host::VmState& v = **s;
    if (v.status != host::VmStatus::running && !p->has("all")) continue;
    std::string cmd;
    if (v.monitor)
      for (const auto& a : v.monitor->command) cmd += (cmd.empty() ? "" : " ") + a;
    if (cmd.size() > 60) cmd = cmd.substr(0, 57) + "...";
    std::string ports;
    if (v.monitor)
      for (const auto& pt : v.monitor->ports) ports += (ports.empty() ? "" : ", ") + pt;
    out += fmt::format("{:<20} {:>4}  {:<14} {:>8}  {:<24}  {}\n", vm, v.generation, status_cell(v),
                       v.monitor_alive ? std::to_string(v.monitor->monitor.pid) : "-", ports, cmd);
  }
  std::fputs(out.c_str(), stdout);
  return 0;
}

int port_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("port", p.error().message);
  if (p->help) { fmt::print("{}", kPortHelp); return 0; }
  if (p->positional.empty() || p->positional.size() > 2) return usage_error("port", "expected VM [GUEST_PORT[/PROTO]]");
  const std::string vm = p->positional[0];
  if (auto id = host::check_vm_id(vm); !id) return usage_error("port", "VM: " + id.error().message);
  std::optional<std::pair<std::uint16_t, host::IpProto>> want;  // GUEST_PORT[/PROTO]
  if (p->positional.size() == 2) {
    std::string f = p->positional[1];
    if (f.find('/') == std::string::npos) f += "/tcp";
    auto slash = f.find('/');
    auto n = parse_uint("port", std::string_view(f).substr(0, slash), 1, 65535);
    std::string_view proto = std::string_view(f).substr(slash + 1);
    if (!n || (proto != "tcp" && proto != "udp"))
      return usage_error("port", fmt::format("expected GUEST_PORT[/tcp|/udp] (1..65535), got '{}'", p->positional[1]));
    want = {static_cast<std::uint16_t>(*n), proto == "tcp" ? host::IpProto::tcp : host::IpProto::udp};
  }
  fs::path state = state_of(*p);
  auto s = load("port", state, vm);
  if (!s) return 1;
  std::string out;
  if (s->monitor)
    for (const auto& pt : s->monitor->ports) {
      // The record holds docker ps's text (host::ps_port_text); docker port shows host::to_string's.
      auto m = host::parse_ps_port_text(pt);
      if (!m) {  // not written by this neshost: shown as it is, never matched
        if (!want) out += pt + "\n";
        continue;
      }
      std::string line = host::to_string(*m);  // "80/tcp -> 127.0.0.1:8080"
      if (!want) out += line + "\n";
      else if (std::pair(m->guest_port, m->proto) == *want) out += line.substr(line.find(" -> ") + 4) + "\n";
    }
  if (want && out.empty()) {
    fmt::print(stderr, "neshost port: VM '{}' has no published port {}/{}\n", vm, want->first,
               want->second == host::IpProto::tcp ? "tcp" : "udp");
    return 1;
  }
  std::fputs(out.c_str(), stdout);
  return 0;
}

int stop_main(const Args& args) {
  auto p = parse_stop(args);
  if (!p) return usage_error("stop", p.error().message);
  if (p->help) { fmt::print("{}\n{}", kStopHelp, flag_help(stop_flags())); return 0; }
  const std::string vm = p->vm;
  const std::chrono::milliseconds grace = p->grace;
  const fs::path state = p->state ? *p->state : default_state_dir();
  auto s = load("stop", state, vm);
  if (!s) return 1;
  if (!s->monitor_alive) {
    fmt::print(stderr, "neshost stop: no running VM '{}' in {} ({})\n", vm, state.string(),
               status_cell(*s));
    return 1;
  }
  if (s->status == host::VmStatus::running) {
    // Persist first: from here on the status is stopped, whatever the workload does meanwhile.
    auto st = host::persist_stop(state, vm, s->generation);
    if (!st) {
      fmt::print(stderr, "neshost stop: {}\n", st.error().message);
      return 1;
    }
  }
  // A VM kept up after its outcome (--on-exit keep) is stopped too: its monitor powers it off.
  // -t 0 (docker's): no ordered shutdown, the workload is sent SIGKILL at once.
  if (grace.count() == 0) return end_monitor("stop", state, *s, false, 30s) ? 0 : 1;
  if (!end_monitor("stop", state, *s, true, grace)) return 1;
  return 0;
}

int kill_main(const Args& args) {
  auto p = parse_kill(args);
  if (!p) return usage_error("kill", p.error().message);
  if (p->help) { fmt::print("{}\n{}", kKillHelp, flag_help(kill_flags())); return 0; }
  const std::string vm = p->vm;
  const int sig = p->signal;
  const fs::path state = p->state ? *p->state : default_state_dir();
  auto s = load("kill", state, vm);
  if (!s) return 1;
  if (s->status != host::VmStatus::running || !monitor_pidfd(*s)) {
    fmt::print(stderr, "neshost kill: no running VM '{}' in {} ({})\n", vm, state.string(), status_cell(*s));
    return 1;
  }
  auto r = control_request(host::control_path(state, vm), control::Targeted{target_of(*s), control::Kill{sig, std::nullopt}, std::nullopt});
  if (!r) { fmt::print(stderr, "neshost kill: {}\n", r.error().message); return 1; }
  if (!std::holds_alternative<control::Ok>(*r)) {
    fmt::print(stderr, "neshost kill: VM '{}': {}\n", vm, control::encode(*r));
    return 1;
  }
  return 0;
}

/// pause / unpause: `resume` false / true.
int pause_main(const Args& args, bool resume) {
  const char* cmd = resume ? "unpause" : "pause";
  static constexpr FlagSpec kFlags[] = {{"state"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error(cmd, p.error().message);
  if (p->help) { fmt::print("{}", kPauseHelp); return 0; }
  if (p->positional.empty()) return usage_error(cmd, "VM is required");
  for (const auto& vm : p->positional)
    if (auto id = host::check_vm_id(vm); !id) return usage_error(cmd, "VM: " + id.error().message);
  fs::path state = state_of(*p);
  int rc = 0;
  for (const auto& vm : p->positional) {
    auto s = load(cmd, state, vm);
    if (!s) { rc = 1; continue; }
    if (s->status != host::VmStatus::running || !monitor_pidfd(*s)) {
      fmt::print(stderr, "neshost {}: no running VM '{}' in {} ({})\n", cmd, vm, state.string(), status_cell(*s));
      rc = 1;
      continue;
    }
    if (s->paused != resume) {  // docker's "Container X is (not) paused"
      fmt::print(stderr, "neshost {}: VM '{}' is {}paused\n", cmd, vm, resume ? "not " : "already ");
      rc = 1;
      continue;
    }
    auto r = control_request(host::control_path(state, vm),
                             control::Targeted{target_of(*s), resume ? control::Request{control::Resume{}}
                                                                     : control::Request{control::Pause{}},
                                               std::nullopt});
    if (!r || !std::holds_alternative<control::Ok>(*r)) {
      fmt::print(stderr, "neshost {}: VM '{}': {}\n", cmd, vm, r ? control::encode(*r) : r.error().message);
      rc = 1;
      continue;
    }
    std::fputs((vm + "\n").c_str(), stdout);
  }
  return rc;
}

/// "12.3MiB", "1.5GiB": docker stats' units (binary).
std::string human_bytes(std::uint64_t b) {
  if (b < (1u << 10)) return fmt::format("{}B", b);
  if (b < (1u << 20)) return fmt::format("{:.1f}KiB", b / 1024.0);
  if (b < (1u << 30)) return fmt::format("{:.1f}MiB", b / 1048576.0);
  return fmt::format("{:.2f}GiB", b / 1073741824.0);
}

/// The VM's VMM on this host: the one vmm.json records, else the monitor's child QEMU. 0: none.
pid_t vmm_pid_of(const host::VmState& s) {
  if (s.vmm && s.vmm_alive) return s.vmm->pid;
  if (!s.monitor) return 0;
  const pid_t mon = s.monitor->monitor.pid;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.empty() || name[0] < '1' || name[0] > '9') continue;
    std::string st;
    if (auto t = base::read_small_file((e.path() / "stat").c_str(), 1024); t) st = std::move(*t);
    const auto open = st.find('('), close = st.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 4 > st.size()) continue;
    if (!st.substr(open + 1, close - open - 1).starts_with("qemu-system")) continue;
    if (std::strtol(st.c_str() + close + 4, nullptr, 10) == mon) return static_cast<pid_t>(std::stol(name));
  }
  return 0;
}

/// A host process's resident memory (bytes, VmRSS) and CPU time (utime + stime, s); nullopt
/// when it is gone.
std::optional<std::pair<std::uint64_t, double>> process_cost(pid_t pid) {
  auto status = base::read_small_file(fmt::format("/proc/{}/status", pid).c_str(), 8192);
  auto stat = base::read_small_file(fmt::format("/proc/{}/stat", pid).c_str(), 4096);
  if (!status || !stat) return std::nullopt;
  std::uint64_t rss = 0;
  if (auto at = status->find("\nVmRSS:"); at != std::string::npos) rss = std::strtoull(status->c_str() + at + 7, nullptr, 10) * 1024;
  const auto close = stat->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  // After ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime (proc(5)).
  const char* f = stat->c_str() + close + 2;
  unsigned long long v[13] = {};
  for (int i = 0; i < 13 && *f; ++i) {
    while (*f == ' ') ++f;
    v[i] = std::strtoull(f, const_cast<char**>(&f), 10);
    while (*f && *f != ' ') ++f;
  }
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return std::make_pair(rss, static_cast<double>(v[11] + v[12]) / ticks);
}

int stats_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("stats", p.error().message);
  if (p->help) { fmt::print("{}", kStatsHelp); return 0; }
  if (p->positional.empty()) return usage_error("stats", "VM is required");
  for (const auto& vm : p->positional)
    if (auto id = host::check_vm_id(vm); !id) return usage_error("stats", "VM: " + id.error().message);
  fs::path state = state_of(*p);
  int rc = 0;
  std::string out = fmt::format("{:<20} {:>9} {:>23} {:>7} {:>5} {:>10} {:>9}\n", "VM", "CPU", "MEM USAGE / LIMIT",
                                "MEM %", "PIDS", "VMM RSS", "VMM CPU");
  for (const auto& vm : p->positional) {
    auto s = load("stats", state, vm);
    if (!s) { rc = 1; continue; }
    if (s->status != host::VmStatus::running || !monitor_pidfd(*s)) {
      fmt::print(stderr, "neshost stats: no running VM '{}' in {} ({})\n", vm, state.string(), status_cell(*s));
      rc = 1;
      continue;
    }
    if (s->paused) {
      fmt::print(stderr, "neshost stats: VM '{}' is paused: its guest cannot answer\n", vm);
      rc = 1;
      continue;
    }
    auto list = guest_processes(host::control_path(state, vm));
    if (!list) { fmt::print(stderr, "neshost stats: VM '{}': {}\n", vm, list.error().message); rc = 1; continue; }
    std::string cpu = "-", mem = "- / -", pct = "-", vrss = "-", vcpu = "-";  // one token per column
    if (const auto& t = list->totals) {
      cpu = fmt::format("{:.2f}s", static_cast<double>(t->cpu_user_usec + t->cpu_system_usec) / 1e6);
      const std::uint64_t used = t->mem_total > t->mem_available ? t->mem_total - t->mem_available : 0;
      mem = human_bytes(used) + " / " + human_bytes(t->mem_total);
      if (t->mem_total) pct = fmt::format("{:.2f}%", 100.0 * static_cast<double>(used) / static_cast<double>(t->mem_total));
    }
    if (pid_t v = vmm_pid_of(*s))
      if (auto c = process_cost(v)) {
        vrss = human_bytes(c->first);
        vcpu = fmt::format("{:.2f}s", c->second);
      }
    out += fmt::format("{:<20} {:>9} {:>23} {:>7} {:>5} {:>10} {:>9}\n", vm, cpu, mem, pct,
                       list->processes.size() + list->truncated, vrss, vcpu);
  }
  fmt::print("{}", out);
  return rc;
}

int top_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("top", p.error().message);
  if (p->help) { fmt::print("{}", kTopHelp); return 0; }
  if (p->positional.size() != 1) return usage_error("top", "exactly one VM is required");
  const std::string vm = p->positional[0];
  if (auto id = host::check_vm_id(vm); !id) return usage_error("top", "VM: " + id.error().message);
  fs::path state = state_of(*p);
  auto s = load("top", state, vm);
  if (!s) return 1;
  if (s->status != host::VmStatus::running || !monitor_pidfd(*s)) {
    fmt::print(stderr, "neshost top: no running VM '{}' in {} ({})\n", vm, state.string(), status_cell(*s));
    return 1;
  }
  auto list = guest_processes(host::control_path(state, vm));
  if (!list) { fmt::print(stderr, "neshost top: VM '{}': {}\n", vm, list.error().message); return 1; }
  std::string out = fmt::format("{:<8} {:<8} {:<8} {}\n", "PID", "PPID", "UID", "CMD");
  for (const auto& pi : list->processes)
    out += fmt::format("{:<8} {:<8} {:<8} {}\n", pi.pid, pi.ppid, pi.uid, host::escape_text(pi.cmd));
  if (list->truncated) out += fmt::format("({} more not listed)\n", list->truncated);
  fmt::print("{}", out);
  return 0;
}

int rm_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}, {"force", false, "-f"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("rm", p.error().message);
  if (p->help) { fmt::print("{}", kRmHelp); return 0; }
  if (p->positional.empty()) return usage_error("rm", "VM is required");
  for (const auto& vm : p->positional)
    if (auto id = host::check_vm_id(vm); !id) return usage_error("rm", "VM: " + id.error().message);
  fs::path state = state_of(*p);
  int rc = 0;
  for (const auto& vm : p->positional) {
    // A removal a crash cut short (its intent: host/monitor/removal.hpp) is finished first; one
    // of the whole VM means it is removed, as asked.
    if (auto f = host::finish_removal(state, vm); f && *f == host::Finished::all) {
      std::fputs((vm + "\n").c_str(), stdout);
      continue;
    }
    auto s = load("rm", state, vm);
    if (!s) {
      // A directory with neither a record nor a monitor file is still removable debris.
      std::error_code ec;
      if (!fs::is_directory(state / vm, ec)) { rc = 1; continue; }
    } else if (s->monitor_alive) {
      // Ended (its outcome recorded) but its monitor still powering the guest off: what `ps`
      // shows as exited is removable, as docker's `wait X && rm X` expects; give the power-off
      // the claim's settle time (host/monitor/reconcile.hpp) before calling it running.
      if (s->status != host::VmStatus::running)
        if (host::Fd pidfd = monitor_pidfd(*s); pidfd && wait_exit(pidfd, 10s)) {
          auto again = load("rm", state, vm);
          if (again) s = std::move(again);
        }
    }
    if (s && s->monitor_alive) {
      if (!p->has("force")) {
        fmt::print(stderr, "neshost rm: VM '{}' is running; stop it first or use rm -f\n", vm);
        rc = 1;
        continue;
      }
      if (!end_monitor("rm", state, *s, false, 10s)) {
        fmt::print(stderr, "neshost rm: VM '{}' is still running\n", vm);
        rc = 1;
        continue;
      }
    }
    if (auto r = host::remove_vm(state, vm); !r) {
      // A `run --rm` monitor removes its own VM as it ends, so once rm -f has stopped it the
      // directory may already be gone: removed all the same.
      std::error_code ec;
      const bool removed_by_its_monitor = s && s->monitor_alive && !fs::exists(state / vm, ec) && !ec;
      if (removed_by_its_monitor) {
        std::fputs((vm + "\n").c_str(), stdout);
        continue;
      }
      fmt::print(stderr, "neshost rm: {}\n", r.error().message);
      rc = 1;
      continue;
    }
    std::fputs((vm + "\n").c_str(), stdout);
  }
  return rc;
}

const Registrar ps_reg{{"ps", "list VMs and their reconciled status", ps_main}};
const Registrar port_reg{{"port", "list a VM's published ports (docker port)", port_main}};
const Registrar stop_reg{{"stop", "stop a running VM (ordered shutdown, persisted as stopped)", stop_main}};
const Registrar kill_reg{{"kill", "send a signal to a running VM's workload", kill_main}};
const Registrar pause_reg{{"pause", "pause a running VM's vCPUs (docker pause)", [](const Args& a) { return pause_main(a, false); }}};
const Registrar unpause_reg{{"unpause", "resume a paused VM (docker unpause)", [](const Args& a) { return pause_main(a, true); }}};
const Registrar stats_reg{{"stats", "a running VM's memory, CPU and processes (docker stats --no-stream)", stats_main}};
const Registrar top_reg{{"top", "list the processes in a running VM's guest", top_main}};
const Registrar rm_reg{{"rm", "remove a VM's state (-f: a running one too)", rm_main}};

}  // namespace
}  // namespace nes::cli
