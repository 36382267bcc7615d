// The shim's own task's VM, through its monitor (host/shim/container.hpp): Start spawns
// `neshost run` (the monitor) with containerd's stdio; its exit is watched by pidfd, a monitor
// that died with its VM running is replaced (re-adoption), a replaced shim takes the task over
// from its record (restore); Kill, Pause, Resume, ResizePty and CloseIO reach the VM through the
// monitor's control socket, waiting for a VM that still boots (deliver.hpp).
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <boost/asio/posix/stream_descriptor.hpp>

#include <fmt/format.h>

#include "host/monitor/adopt.hpp"
#include "host/shim/container.hpp"
#include "host/shim/control_journal.hpp"
#include "host/shim/deliver.hpp"
#include "host/shim/exec_journal.hpp"
#include "host/shim/fault_point.hpp"
#include "host/shim/gated_spawn.hpp"
#include "host/shim/log.hpp"
#include "host/shim/rpc.hpp"
#include "host/shim/task_mounts.hpp"

namespace nes::shim {
namespace asio = boost::asio;
namespace fs = std::filesystem;
namespace v2 = containerd::task::v2;
namespace ev = containerd::events;
using host::Error;
using host::Fd;
using rpc::empty;
using rpc::fail;
using rpc::ok;
using namespace std::chrono_literals;

namespace {
/// How long a control (Pause, Resume, Kill with a signal other than SIGKILL and SIGTERM) that
/// comes while the VM boots waits for its guest: an exec's Start waits as long for the monitor.
constexpr std::chrono::milliseconds kControlWait{30000};
}  // namespace

// ---- Start and the monitor's end ----

/// Start of the shim's own task: `neshost run` spawned at its gate, recorded, then let go.
ttrpc::Reply Container::spawn() {
  if (task.phase != Phase::created) return fail(ttrpc::Code::failed_precondition, fmt::format("task {}: already started", id));
  auto streams = task.open_streams();
  if (!streams) return fail(ttrpc::Code::invalid_argument, streams.error().message);
  RunPlan plan{rec.vm, rec.state_dir, !task.stdin_path.empty()};
  // Intent before effect: the monitor's pid is recorded while it waits at its gate, so a shim
  // killed at any point leaves `shim delete` the process to end, and one killed before the
  // record leaves a child that exits at the closed gate having run nothing.
  auto spawned = spawn_gated(shim.cfg.neshost.string(), run_args(spec, plan), *streams);
  if (!spawned) return fail(ttrpc::Code::internal, spawned.error().message);
  const pid_t pid = spawned->pid;
  pidfd_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  int watch_fd = pidfd_ ? ::fcntl(pidfd_.get(), F_DUPFD_CLOEXEC, 3) : -1;
  rec.pid = pid;
  const auto pid_start = start_time(pid);
  rec.pid_start = pid_start.value_or(0);
  // Without its start time the record's pid is no identity `shim delete` could act on.
  auto w = watch_fd < 0  ? host::Status{Error{fmt::format("pidfd_open: {}", std::strerror(errno))}}
           : !pid_start ? host::Status{Error{fmt::format("/proc/{}/stat: no start time", pid)}}
                        : persist("record:start");
  if (w) {
    fault_point("start:recorded");
    w = release(*spawned, shim.cfg.neshost.string());
  }
  if (!w) {
    // Not recorded (`shim delete` could not find the VM), no pidfd (nobody would see it end) or
    // not run (execve failed): the child ends here, its gate closed, having started no VM.
    // Reaped here (SIGKILL: bounded).
    if (watch_fd >= 0) ::close(watch_fd);
    spawned->gate.reset();
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {}
    rec.pid = 0;
    rec.pid_start = 0;
    (void)persist("record:start-undone");
    pidfd_.reset();
    return fail(ttrpc::Code::internal, w.error().message);
  }
  task.phase = Phase::running;
  task.pid = static_cast<std::uint32_t>(pid);
  task.hold_output();  // a replacement monitor's output reaches containerd's reader (issue 48)
  watch_exit(watch_fd);
  ev::TaskStart e;
  e.set_container_id(id);
  e.set_pid(static_cast<std::uint32_t>(pid));
  shim.events.publish("/tasks/start", e);
  v2::StartResponse r;
  r.set_pid(static_cast<std::uint32_t>(pid));
  return ok(r);
}

void Container::kill_session() {
  if (task.phase != Phase::running) return;
  // Our child cannot be reaped behind our back; a re-adopted `neshost run` (restore()) can,
  // and its pid be reused: signalled only while it is the recorded process.
  if (!restored_ || same_process_alive(rec.pid, rec.pid_start)) {
    ::kill(-rec.pid, SIGKILL);  // neshost's session
    ::kill(rec.pid, SIGKILL);
  }
  if (adopted_) {
    Fd p{static_cast<int>(::syscall(SYS_pidfd_open, adopted_->pid, 0))};
    if (p && host::is_alive(*adopted_)) ::syscall(SYS_pidfd_send_signal, p.get(), SIGKILL, nullptr, 0);
  }
  kill_vmm(rec);  // QEMU and its daemons outlive neshost (--vmm-outlives)
}

/// on_exit() once the monitor's pidfd `fd` (owned from here on) is readable: it ended.
void Container::watch_exit(int fd) {
  exit_watch_.emplace(shim.io, fd);
  exit_watch_->async_wait(asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
    if (!ec) on_exit();
  });
}

/// The VM's monitor runs: `neshost run` (our child), or the replacement that adopted the VM.
bool Container::monitor_alive() const {
  return adopted_ ? host::is_alive(*adopted_) : same_process_alive(rec.pid, rec.pid_start);
}

void Container::on_exit() {
  kill_timer_.cancel();
  std::uint32_t status = 125;  // a replacement is not our child: its status is the record's
  if (!adopted_) {
    int st = 0;
    pid_t r;
    do r = ::waitpid(rec.pid, &st, 0);
    while (r < 0 && errno == EINTR);
    // neshost's own exit status is the workload's (docs/host.md); the record's is authoritative.
    status = WIFEXITED(st) ? static_cast<std::uint32_t>(WEXITSTATUS(st)) : static_cast<std::uint32_t>(128 + WTERMSIG(st));
  }
  // A pod's containers were the dead monitor's execs (their stdio its fds): a replacement could
  // not carry them on, so a pod's VM ends with its monitor (the kubelet restarts the pod).
  if (shim.pod) kill_vmm(rec);
  else if (readopt()) return;
  std::int64_t at = now_ns();
  apply_recorded_exit(rec, status, at);
  finish(status, at);
}

/// The monitor died with its VM still running (its VMM outlives it, no outcome recorded): a
/// replacement monitor takes the VM over (host/monitor/adopt.hpp; blocks the loop at most 15
/// s) and the task goes on until that one ends, its record the task's exit. Control requests
/// (Kill, Exec, ResizePty, Pids) reach it through the same control socket path. Output after
/// the replacement goes on to containerd's FIFOs at the first byte not yet delivered
/// (host/monitor/output_resume.hpp; the shim's output holds keep containerd reading). false:
/// nothing to adopt (the VM ended, or is gone with its monitor).
bool Container::readopt() {
  std::string said;
  auto st = cli::ensure_monitor(rec.state_dir, rec.vm, shim.cfg.neshost, 15s, &said);
  if (!st || !*st || (*st)->status != host::VmStatus::running || !(*st)->monitor_alive || !(*st)->monitor)
    return false;
  const host::ProcessIdentity mon = (*st)->monitor->monitor;
  if (adopted_ && *adopted_ == mon) return false;
  Fd p{static_cast<int>(::syscall(SYS_pidfd_open, mon.pid, 0))};
  if (!p || !host::is_alive(mon)) return false;
  adopted_ = mon;
  log("task {}: {}", id, said.empty() ? fmt::format("served by monitor pid {}", mon.pid) : said);
  watch_exit(p.release());
  return true;
}

/// The task ended with `status` at `at_ns`: its exit published, its waiters answered.
void Container::finish(std::uint32_t status, std::int64_t at_ns) {
  task.stop(status, at_ns);
  task.report_exit(shim.events, id);
}

/// A shim started again on a bundle whose task's monitor still runs (the one before was
/// SIGKILLed; containerd, restarted, finds this one at the bundle's address): the task as its
/// record says, RUNNING with the same pid. Its `neshost run` is not our child: watched by its
/// pidfd, its exit status the VM's outcome record's (as a replacement monitor's). Its stdio
/// stays as it was (containerd's FIFOs or files are the monitor's own fds: nothing of the
/// shim's is on that path, so no byte is lost or repeated); its stdin FIFO is held again as
/// Start holds it (CloseIO works). Its execs as the exec journal names them (restore_exec_journal). A
/// task whose Create finished and that was never started: CREATED again. A deleted one (its
/// receipt in the bundle): deleted, a retried Delete answered with the receipt. A pod's sandbox
/// as any task, its containers and their execs from the journal. A pod's container's own
/// record, another task's record, a Create cut short, or a record without a live monitor: nothing
/// (containerd's cleanup ends them). Returns what it did, for the shim's log.
std::optional<std::string> Container::restore() {
  // A task whose Delete answered (its receipt written first) and whose shim died before or
  // after the removal: deleted, its receipt the answer to a retried Delete, the removal done.
  if (auto c = load_receipt(bundle)) {
    if (auto r = load_task_record(bundle); r && *r && (*r)->id == id && !(*r)->container) remove_task(bundle, **r);
    task.phase = Phase::deleted;
    task.pid = static_cast<std::uint32_t>(c->pid);
    task.exit_status = c->exit_status;
    task.exited_at_ns = c->exited_at_ns;
    return fmt::format("deleted: its receipt (exit status {}) answers Delete", c->exit_status);
  }
  auto r = load_task_record(bundle);
  if (!r || !*r) return std::nullopt;
  TaskRecord got = std::move(**r);
  if (got.id != id || got.container) return std::nullopt;
  const bool is_pod = !got.pod_share.empty();  // a sandbox: its containers come back from the journal
  auto text = read_oci_config(bundle);
  if (!text) return std::nullopt;
  auto s = parse_oci_spec(*text, bundle);
  if (!s) return std::nullopt;
  if (got.pid <= 0) {
    // Created, not started: CREATED again (Start spawns the monitor as ever); its pid is now
    // this shim's, as a Created task's is.
    // A pod's sandbox never started is not: its VM's size and share are Create's work.
    if (!got.created || is_pod) return std::nullopt;
    rec = std::move(got);
    spec = std::move(*s);
    task.phase = Phase::created;
    stdio_from_record();
    return fmt::format("restored from its record: created, VM {}", rec.vm);
  }
  Fd p{static_cast<int>(::syscall(SYS_pidfd_open, got.pid, 0))};
  auto ident = host::identity_of(got.pid);
  // The pidfd first, the identity after: a recycled pid cannot pass for the monitor.
  if (!p || !ident || ident->start_time != got.pid_start) return std::nullopt;
  shim.pod = is_pod;
  rec = std::move(got);
  spec = std::move(*s);
  task.phase = Phase::running;
  task.pid = static_cast<std::uint32_t>(rec.pid);
  stdio_from_record();
  if (rec.stdin_closed) {  // CloseIO came before: the monitor is told again, no writer of ours
    deliver_close_stdin();
  } else {
    task.hold_stdin();  // as Start holds it (the monitor holds the read end)
  }
  task.hold_output();  // as Start holds them
  restored_ = true;
  adopted_ = *ident;
  watch_exit(p.release());
  std::string said = fmt::format("re-adopted from its record: monitor pid {}, VM {}", rec.pid, rec.vm);
  if (auto n = replay_recorded_controls()) said += fmt::format("; {} recorded control(s) sent again", n);
  if (auto n = restore_exec_journal(shim); !n.empty()) said += "; execs: " + n;
  return said;
}

/// The task's stdio paths and terminal as its record keeps them (restore()).
void Container::stdio_from_record() {
  task.stdin_path = rec.stdin_path;
  task.stdout_path = rec.stdout_path;
  task.stderr_path = rec.stderr_path;
  task.terminal = rec.terminal;
  spec.terminal = rec.terminal || spec.terminal;
}

ttrpc::Reply Container::kill_task(std::uint32_t signal) {
  if (task.phase == Phase::created) {
    // Never started: nothing runs; the task ends as if the signal had killed it.
    finish(128 + signal, now_ns());
    return empty();
  }
  if (!monitor_alive())  // exited, its exit not yet seen here
    return fail(ttrpc::Code::not_found, "process already finished");
  // Recorded before it is sent (control_journal.hpp); a record that cannot be written fails the
  // Kill, except SIGKILL, which ends the session below whatever happens.
  auto t = record_control(*this, cli::control::Kill{static_cast<int>(signal), std::nullopt});
  if (!t && signal != SIGKILL) return fail(ttrpc::Code::internal, fmt::format("kill {}: {}", signal, t.error().message));
  host::Status reply = t ? cli::control_call(shim.control(), *t, 2s) : host::Status{t.error()};
  if (t) control_answered(*this, *t->seq);
  if (signal == SIGKILL) {
    // SIGKILL must end the task whatever the guest does: if the VM has not exited 10 s after
    // the guest was told (or at once when it cannot be told), its whole session is killed
    // (exit 137: 128+SIGKILL).
    if (!reply) {
      kill_session();
      return empty();
    }
    kill_timer_.expires_after(10s);
    kill_timer_.async_wait([this](boost::system::error_code e) { if (!e) kill_session(); });
    return empty();
  }
  if (reply) return empty();
  // No control socket yet (the VM is still booting): SIGTERM still ends the task, as an
  // ordered shutdown of the VM (exit 143).
  if (signal == SIGTERM) {
    if (!restored_ || same_process_alive(rec.pid, rec.pid_start)) ::kill(rec.pid, SIGTERM);
    return empty();
  }
  // Another signal waits for the guest (kill_later), as Pause does.
  if (not_ready_yet(reply.error())) return fail(ttrpc::Code::unavailable, kKillNotReadyYet);
  return fail(ttrpc::Code::unavailable, fmt::format("kill {}: {}", signal, reply.error().message));
}

void Container::kill_later(std::uint32_t signal, ttrpc::Respond respond) {
  auto t = record_control(*this, cli::control::Kill{static_cast<int>(signal), std::nullopt});
  if (!t) return respond(fail(ttrpc::Code::internal, fmt::format("kill {}: {}", signal, t.error().message)));
  deliver_when_ready(shim.io, shim.control(), *t, kControlWait,
                     [this] { return task.phase == Phase::running && monitor_alive(); },
                     [this, seq = *t->seq, signal, respond = std::move(respond)](host::Status st) {
                       control_answered(*this, seq);
                       if (st) return respond(empty());
                       respond(fail(ttrpc::Code::unavailable, fmt::format("kill {}: {}", signal, st.error().message)));
                     });
}

// ---- Pause, Resume, ResizePty, CloseIO ----

/// Whether the task's VM is paused: its monitor's marker of the current generation (the one
/// record ps and a replacement monitor read; a SIGKILL that resumed it cleared it).
bool Container::vm_paused() const {
  auto st = host::reconcile(rec.state_dir, rec.vm);
  return st && *st && (*st)->status == host::VmStatus::running && (*st)->paused;
}

void Container::pause_resume(bool resume, ttrpc::Respond respond) {
  const char* what = resume ? "resume" : "pause";
  if (task.phase != Phase::running || !monitor_alive())
    return respond(fail(ttrpc::Code::failed_precondition, fmt::format("{}: task {} is not running", what, id)));
  if (vm_paused() != resume)
    return respond(fail(ttrpc::Code::failed_precondition,
                        fmt::format("{}: task {} is {}paused", what, id, resume ? "not " : "already ")));
  auto t = record_control(*this, resume ? cli::control::Request{cli::control::Resume{}} : cli::control::Request{cli::control::Pause{}});
  if (!t) return respond(fail(ttrpc::Code::internal, fmt::format("{} {}: {}", what, id, t.error().message)));
  deliver_when_ready(shim.io, shim.control(), *t, kControlWait, [this] { return task.phase == Phase::running; },
                     [this, seq = *t->seq, resume, what, respond = std::move(respond)](host::Status r) {
                       control_answered(*this, seq);
                       if (!r) return respond(fail(ttrpc::Code::unknown, fmt::format("{} {}: {}", what, id, r.error().message)));
                       publish_paused(resume);
                       respond(empty());
                     });
}

/// /tasks/resumed (`resume`) or /tasks/paused, as runc's shim publishes after its answer.
void Container::publish_paused(bool resume) {
  if (resume) {
    ev::TaskResumed e;
    e.set_container_id(id);
    shim.events.publish("/tasks/resumed", e);
  } else {
    ev::TaskPaused e;
    e.set_container_id(id);
    shim.events.publish("/tasks/paused", e);
  }
}

/// The controls the shim before this one recorded and did not see answered: sent again with
/// their numbers (the monitor applies each once); a Pause or Resume that took effect publishes
/// its event, which the shim before may not have.
std::size_t Container::replay_recorded_controls() {
  return replay_controls(*this, [this](const cli::control::Request& r, host::Status st) {
    if (!st) return;
    if (std::holds_alternative<cli::control::Pause>(r)) publish_paused(false);
    if (std::holds_alternative<cli::control::Resume>(r)) publish_paused(true);
  });
}

/// ctr resizes right after Start, before `neshost run` has its control socket: the latest size
/// is delivered as soon as the socket answers, tried for 30 s (neshost makes it the size the
/// workload starts with when the guest has not booted yet); a newer one replaces it. Its
/// answer, when not "ok", and a size never delivered go to the shim's log.
void Container::deliver_resize(std::uint32_t height, std::uint32_t width) {
  const cli::control::Resize size{static_cast<std::uint16_t>(height), static_cast<std::uint16_t>(width), std::nullopt};
  // The size already delivered (or on its way): nothing to tell (a terminal's SIGWINCH storm).
  if (last_size_ == std::pair{height, width}) return;
  last_size_ = std::pair{height, width};
  const unsigned gen = ++resize_gen_;
  retry_when_ready(
      shim.io, [path = shim.control(), size] { return control_attempt(path, size); }, 30s,
      [this, gen] { return gen == resize_gen_ && task.phase == Phase::running; },
      [this, size, gen](host::Status st, Delivered how) {
        if (how != Delivered::unwanted && !st && gen == resize_gen_) last_size_.reset();  // not told: the next one is
        if (how == Delivered::gave_up)
          log("{}: {} not delivered in 30 s", id, cli::control::encode(cli::control::Request{size}));
        else if (how == Delivered::answered && !st)
          log("{}: {}", id, st.error().message);
      });
}

/// `close-stdin` to the task's monitor (CloseIO), tried again every 20 ms while its control
/// socket does not answer yet, for up to 60 s (then said in the log: the workload's stdin stays
/// open until the VM ends).
void Container::deliver_close_stdin() {
  close_stdin_told_ = true;
  retry_when_ready(
      shim.io, [path = shim.control()] { return control_attempt(path, cli::control::CloseStdin{}); }, 60s,
      [this] { return task.phase == Phase::running; },
      [this](host::Status st, Delivered how) {
        if (how == Delivered::gave_up) log("{}: close-stdin not delivered in 60 s", id);
        else if (how == Delivered::answered && !st) log("{}: close-stdin: {}", id, st.error().message);
      });
}

}  // namespace nes::shim
