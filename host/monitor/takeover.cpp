// `neshost monitor`'s body: a replacement for a detached VM's dead monitor takes the generation
// over and serves the VM to its end (host/monitor/vm_monitor.hpp; docs/host.md "Re-adoption").
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <variant>

#include <fmt/format.h>

#include "host/lib/state_dir.hpp"
#include "host/monitor/duties.hpp"
#include "host/monitor/output_resume.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/monitor/say.hpp"
#include "host/monitor/vm_monitor.hpp"
#include "host/vm/netns.hpp"

namespace nes::monitor {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

/// What a replacement found to take over: the VM's records, its lock held.
struct Orphan {
  host::Fd lock;  // adopt.lock, held for our whole life
  host::VmmInfo vmm;
  proto::Boot boot;
};

/// One replacement per VM at a time (adopt.lock): the loser of a race leaves it to the winner.
/// Then the VM must still be orphaned (its monitor gone, no outcome, its VMM alive) and its
/// records readable. Error: why there is nothing to take over (exit 0, said by the caller).
host::Result<Orphan> claim(const fs::path& state, const std::string& vm) {
  auto lock = host::open_vm_file(state, vm, host::kAdoptLock, O_RDWR | O_CREAT);
  if (!lock) return host::Error{fmt::format("not taken over: {}", lock.error().message)};
  if (::flock(lock->get(), LOCK_EX | LOCK_NB) != 0) {
    // Held by a replacement that won (it rewrites monitor.json at once: we stand down), or by a
    // monitor being killed whose other threads have not exited yet (its leader is already a
    // zombie, so the VM looks orphaned, but its fds, the lock among them, live on for a moment):
    // wait for the lock, looking again every 10 ms, at most 5 s.
    const auto until = std::chrono::steady_clock::now() + 5s;
    for (;;) {
      if (auto st = host::reconcile(state, vm); st && *st && (*st)->monitor_alive)
        return host::Error{"another replacement monitor took it over"};
      if (std::chrono::steady_clock::now() >= until) return host::Error{"another replacement monitor is taking it over"};
      ::poll(nullptr, 0, 10);
      if (::flock(lock->get(), LOCK_EX | LOCK_NB) == 0) break;
    }
  }
  auto st = host::reconcile(state, vm);
  if (!st || !*st) return host::Error{st ? "no such VM" : st.error().message};
  if (!(*st)->orphaned())
    return host::Error{fmt::format("nothing to take over ({}: {})", host::to_string((*st)->status), (*st)->reason)};
  auto info = host::load_vmm(state, vm);
  if (!info || !*info) return host::Error{info ? "no vmm.json" : info.error().message};
  auto boot = host::load_boot(state, vm);
  if (!boot) return boot.error();
  return Orphan{std::move(*lock), **info, std::move(*boot)};
}

/// A VM paused under the monitor gone runs again *before* we listen: QEMU's chardevs redial our
/// listeners at most once a second, so the guest sees its ports' host side gone (and redials)
/// before it sees them back. Resumed while paused, it would see both at once and never redial.
void resume_if_paused(const fs::path& state, const std::string& vm, const host::VmmInfo& v, std::uint64_t generation) {
  if (v.sandbox || host::paused_generation(state, vm) != generation) return;
  VmPause p(v.runtime_dir / "qmp.sock", state, vm, generation, true);
  if (auto r = p.resume(); r)
    say("neshost monitor: VM {}: resumed: it was paused under the monitor gone, and its guest must redial\n", vm);
  else
    say("neshost monitor: VM {}: it was paused under the monitor gone and cannot be resumed: {}\n", vm,
        r.error().message);
}

/// The plan a replacement serves the rest of the generation with: vmm.json's and boot.json's
/// (the session resumes: no boot; its start and what is left of its --timeout taken over).
cli::RunPlan plan_of(const fs::path& state, const std::string& vm, const host::VmmInfo& v, proto::Boot boot,
                     const host::MonitorInfo& mon) {
  cli::RunPlan plan;
  plan.vm = vm;
  plan.state_dir = state;
  plan.serve.state_dir = state;
  auto& sc = plan.serve.session;
  sc.vm = vm;
  sc.generation = mon.generation;
  sc.descriptor = std::move(boot);
  sc.on_exit = v.on_exit;
  sc.stop_timeout = v.stop_timeout;
  sc.grace = v.grace;
  sc.reconnect = v.reconnect;
  sc.resume = true;  // no boot: only the guest's resumed `ready` (docs/protocol.md "Channel survival")
  take_over_duties(v, sc, host::boottime_ns());
  if (sc.wall_left)
    say("neshost monitor: VM {}: its --timeout ({} ms) goes on: {} ms left\n", vm, sc.wall_timeout->count(),
        std::max<long long>(sc.wall_left->count(), 0));
  plan.serve.listen.kind = host::ListenSpec::Kind::unix_path;
  plan.serve.listen.path = v.channel_socket.string();
  plan.runtime_dir = v.runtime_dir;
  plan.channel_socket = v.channel_socket;
  plan.data_socket = v.data_socket;
  plan.sandbox = v.sandbox;
  plan.workload_log.max_size = v.log_max_size;
  plan.workload_log.max_files = v.log_max_files;
  plan.grace = v.grace;
  plan.rm = v.rm;
  plan.vmm_survives = true;
  plan.monitor_log = true;
  plan.command = mon.command;
  return plan;
}

/// netns mode: the namespace as QEMU holds it (the path may be gone), taken while it runs.
host::Fd open_vmm_netns(const host::VmmInfo& v) {
  host::Fd netns_fd;
  if (!v.netns || !v.vmm) return netns_fd;
  netns_fd.reset(::open(fmt::format("/proc/{}/ns/net", v.vmm->pid).c_str(), O_RDONLY | O_CLOEXEC));
  // The pid is QEMU's only while QEMU (pinned before) still runs after the open: checked again.
  if (netns_fd && !host::vmm_alive(v)) netns_fd.reset();
  return netns_fd;
}

/// netns mode, once QEMU is gone (the serve may return early, its listener failed, with the VM
/// running): the tap and redirects the monitor gone made are torn down.
void reclaim_netns(const std::string& vm, const host::VmmInfo& v, host::Fd netns_fd) {
  if (!v.netns) return;
  if (host::vmm_alive(v)) {
    say("neshost monitor: VM {}: netns {}: tap {} left in place: its QEMU still runs\n", vm, v.netns->path.string(),
        v.netns->tap);
    return;
  }
  if (!netns_fd)
    if (auto f = vm::open_netns(v.netns->path)) netns_fd = std::move(*f);
  const bool have_ns = static_cast<bool>(netns_fd);
  vm::NetnsAttachment::reclaim(std::move(netns_fd), v.netns->path, v.netns->tap, v.netns->interface,
                               [](std::string_view line) { say("neshost monitor: {}\n", line); });
  if (have_ns)
    say("neshost monitor: VM {}: netns {}: tap {} torn down (by the replacement of the monitor that made it)\n", vm,
        v.netns->path.string(), v.netns->tap);
  else
    say("neshost monitor: VM {}: netns {}: gone, and tap {} with it\n", vm, v.netns->path.string(), v.netns->tap);
}

/// The output's sinks the monitor gone recorded (containerd's FIFOs, a --log-uri file), reopened
/// so the output goes on there at the first byte not yet delivered (host/monitor/output_resume.hpp):
/// `output.pos` says what each sink has, workload.log.pos where the guest's replay starts. The
/// sink ahead of the log: that many replayed bytes are dropped; behind it: the bytes between come
/// back out of workload.log first. Without a sink (or it cannot be opened) the stream goes to
/// workload.log alone, said.
void adopt_output(const fs::path& state, const std::string& vm, const host::VmmInfo& v, std::uint64_t generation,
                  VmResources& run) {
  if (!v.stdout_sink && !v.stderr_sink) return;
  auto tally = OutputTally::open(state, vm, false);
  if (!tally) {
    say("neshost monitor: VM {}: {}: the output goes to workload.log alone\n", vm, tally.error().message);
    return;
  }
  const fs::path log = host::vm_path(state, vm, host::kWorkloadLog);
  const host::LogPositions pos = host::read_log_positions(log.string() + ".pos").value_or(host::LogPositions{});
  struct Side {
    const char* name;
    const std::optional<host::VmmSink>& sink;
    host::OutputStream stream;
    std::uint64_t logged;
    host::Fd& fd;
    std::uint64_t& skip;
    std::string& backlog;
    bool& counted;
  };
  for (Side s : {Side{"stdout", v.stdout_sink, host::OutputStream::out, pos.out, run.out_sink, run.skip_out,
                      run.backlog_out, run.count_out},
                 Side{"stderr", v.stderr_sink, host::OutputStream::err, pos.err, run.err_sink, run.skip_err,
                      run.backlog_err, run.count_err}}) {
    if (!s.sink) continue;
    auto f = open_sink(*s.sink);
    if (!f) {
      say("neshost monitor: VM {}: {}: {}: it goes to workload.log alone\n", vm, s.name, f.error().message);
      continue;
    }
    const std::uint64_t had = tally->delivered(s.stream);
    std::uint64_t missing = 0;
    if (had >= s.logged) {
      s.skip = had - s.logged;
    } else {
      auto lb = logged_bytes(log, s.stream, generation, had, s.logged, pos.file);
      s.backlog = std::move(lb.bytes);
      missing = lb.missing;
    }
    say("neshost monitor: VM {}: {} goes on to {} at byte {}: {} bytes from workload.log first, {} bytes of the "
        "guest's replay already there; {} bytes lost\n",
        vm, s.name, s.sink->path.string(), had, s.backlog.size(), s.skip, missing);
    s.fd = std::move(*f);
    s.counted = true;
  }
  run.output_tally = std::move(*tally);
}

}  // namespace

int Monitor::take_over(const fs::path& state, const std::string& vm, host::Fd notify) {
  auto tell = [&](std::string_view line) {
    if (!notify) return;
    std::string l = std::string(line) + "\n";
    [[maybe_unused]] auto n = ::write(notify.get(), l.data(), l.size());
    notify.reset();
  };
  cli::make_own_nonblocking(1);
  cli::make_own_nonblocking(2);
  ::signal(SIGPIPE, SIG_IGN);
  auto nothing = [&](std::string why) {
    say("neshost monitor: VM {}: {}\n", vm, why);
    tell(why);
    return 0;
  };
  auto orphan = claim(state, vm);
  if (!orphan) return nothing(orphan.error().message);
  const host::VmmInfo& v = orphan->vmm;
  // Pin the VMM before claiming the generation: a pidfd on the recorded process.
  auto console = std::make_shared<ConsoleOut>();
  if (auto f = host::open_vm_file(state, vm, host::kConsoleLog, O_WRONLY | O_CREAT | O_APPEND))
    console->open_log(std::move(*f));
  auto adopted = vm::VmProcess::adopt(
      v.vmm->pid, v.vmm->start_time, [console](std::string_view b) { console->write(b); },
      [](std::string_view b) { cli::put_bounded(2, b, 1s); });
  if (!adopted) return nothing(fmt::format("its VMM: {}", adopted.error().message));
  const auto self = host::self_identity().value_or(host::ProcessIdentity{::getpid(), 0, {}});
  auto mon = host::take_over_generation(state, vm, self);
  if (!mon) return nothing(fmt::format("not taken over: {}", mon.error().message));
  say("neshost monitor: VM {}: generation {} taken over from the monitor gone (VMM pid {})\n", vm, mon->generation,
      v.vmm->pid);
  resume_if_paused(state, vm, v, mon->generation);

  cli::RunPlan plan = plan_of(state, vm, v, std::move(orphan->boot), *mon);
  VmResources run;
  run.console = console;
  run.console_log = host::vm_path(state, vm, host::kConsoleLog);
  run.adopted = std::move(*adopted);
  run.adopted_daemons = v.daemons;
  run.vmm_info = v;
  run.adopt_stdin = plan.serve.session.descriptor.stdio && plan.serve.session.descriptor.stdio->attach_stdin;
  run.stdin_source = v.stdin_source;
  adopt_output(state, vm, v, mon->generation, run);
  cli::RuntimeDir rt(v.runtime_dir);
  host::Fd netns_fd = open_vmm_netns(v);
  host::Fd no_notify;
  // The caller (ensure_monitor) is told once the guest has resumed its session with us, so its
  // next request (kill, exec, ...) finds a booted session; or, if it never does, when we end.
  int status = Monitor(plan, rt, run, no_notify, {}, [&] { tell("adopted"); }).serve();
  reclaim_netns(vm, v, std::move(netns_fd));
  tell(fmt::format("served to its end (exit status {})", status));
  if (plan.rm)
    if (auto r = host::remove_vm(state, vm, self); !r) say("neshost monitor: --rm: {}\n", r.error().message);
  return status;
}

}  // namespace nes::monitor
