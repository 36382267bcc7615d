#include "host/cli/exec.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/cli/exec_flags.hpp"
#include "host/cli/stdio.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/cli/terminal.hpp"
#include "protocol/codec.hpp"

namespace nes::cli {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

proto::ExecProcess resolve_exec(control::Exec request, const proto::Exec& workload) {
  proto::ExecProcess out = std::move(request.process);
  if (request.env) {
    auto env = workload.env;  // docker exec: the container's environment, then -e on top
    for (auto& [k, v] : out.exec.env) env[k] = v;
    out.exec.env = std::move(env);
  }
  if (request.cwd && !out.exec.cwd) out.exec.cwd = workload.cwd;
  if (request.user) {
    out.exec.uid = workload.uid;
    out.exec.gid = workload.gid;
    out.exec.groups = workload.groups;
  }
  return out;
}

// ---- the monitor's side ----------------------------------------------------------------------------

struct ExecAttachments::Attached {
  std::uint16_t proc = 0;
  host::Fd in, out, err;                      // the client's fds 0-2 (owned here)
  std::unique_ptr<FdWriter> wout, werr;       // declared after the fds: destroyed first
  std::unique_ptr<StdinPump> pump;
  ControlRespond reply;
  std::vector<ControlRespond> waiters;        // `wait PROC` requests (at most control::kWaitersMax)
  std::int32_t pid = 0;                       // in the guest, once started
  std::optional<int> status;                  // ended: the exit status to report
  std::string reason;
  std::vector<std::string> lost;              // its output the host could not deliver, one line each
  bool replied = false;
  bool empty() const { return (!wout || wout->queued() == 0) && (!werr || werr->queued() == 0); }
};

ExecAttachments::ExecAttachments(asio::io_context& io, std::string vm, std::function<void()> pause_changed)
    : io_(io), vm_(std::move(vm)), pause_changed_(std::move(pause_changed)) {}

ExecAttachments::~ExecAttachments() {
  for (auto& [proc, a] : live_)
    if (a->pump) a->pump->stop();
}

bool ExecAttachments::any_full() const {
  for (auto& [proc, a] : live_)
    if ((a->wout && a->wout->full()) || (a->werr && a->werr->full())) return true;
  return false;
}

void ExecAttachments::resume_stdin() {
  for (auto& [proc, a] : live_)
    if (a->pump) a->pump->resume();
}

std::size_t ExecAttachments::queued() const {
  std::size_t n = 0;
  for (auto& [proc, a] : live_)
    for (const FdWriter* w : {a->wout.get(), a->werr.get()})
      if (w) n += w->queued();
  return n;
}

void ExecAttachments::host_gone() {
  host_ = nullptr;
  for (auto& [proc, a] : live_)
    if (a->pump) a->pump->stop();
}

void ExecAttachments::finish(std::uint16_t proc) {
  auto it = live_.find(proc);
  if (it == live_.end()) return;
  auto a = it->second;
  if (!a->status || a->replied || !a->empty()) return;
  a->replied = true;
  // Output lost overrides the process's status as it does the workload's (docker's 125: the
  // host side failed), so the client can never take a cut output for a complete one.
  std::string why;
  for (const auto& l : a->lost) why += (why.empty() ? "" : "; ") + l;
  if (!a->lost.empty()) a->status = 125;
  if (!a->reason.empty()) why += (why.empty() ? "" : "; ") + a->reason;
  for (char& c : why)
    if (c == '\n' || c == '\r') c = ' ';
  const control::Exited end{*a->status, std::move(why)};  // WHY cut to control::kExitWhyMax
  a->reply(end);
  for (auto& w : std::exchange(a->waiters, {})) w(end);
  ended_procs_.emplace_back(proc, end);
  if (ended_procs_.size() > control::kWaitEndedKept) ended_procs_.pop_front();
  if (a->pump) a->pump->stop();
  // Not from inside a writer's callback: the entry goes on the next turn of the loop.
  asio::post(io_, [this, proc, a] {
    live_.erase(proc);
    pause_changed_();
  });
}

void ExecAttachments::wait(std::uint16_t proc, ControlRespond respond) {
  if (auto it = live_.find(proc); it != live_.end() && !it->second->replied) {
    auto& a = *it->second;
    // At the bound the oldest wait goes (a client replaced since, most likely: its connection
    // may be gone already), so a client waiting now is always served.
    if (a.waiters.size() >= control::kWaitersMax) {
      auto oldest = std::move(a.waiters.front());
      a.waiters.erase(a.waiters.begin());
      oldest(control::Error{fmt::format("wait: PROC {}: superseded by a newer wait ({} at most)", proc, control::kWaitersMax)});
    }
    respond(a.pid ? control::Reply{control::Started{a.pid, proc}} : control::Reply{control::Waiting{}});
    return a.waiters.push_back(std::move(respond));
  }
  for (auto it = ended_procs_.rbegin(); it != ended_procs_.rend(); ++it)
    if (it->first == proc) return respond(it->second);
  respond(control::Error{fmt::format("wait: PROC {}: no such process", proc)});
}

void ExecAttachments::workload_started() {
  started_ = true;
  for (auto& w : std::exchange(waiting_, {})) start(std::move(w.request), std::move(w.fds), std::move(w.respond));
}

void ExecAttachments::workload_ended() {
  ended_ = true;
  for (auto& w : std::exchange(waiting_, {})) w.respond(control::Error{"exec: the workload has ended"});
}

void ExecAttachments::start(control::Exec request, std::vector<host::Fd> fds, ControlRespond reply) {
  auto fail = [&](std::string why) { reply(control::Error{std::move(why)}); };
  if (!started_ && !ended_) {
    // docker exec into a container that is starting waits for it; so does this, bounded by the
    // VM's own deadlines (its outcome ends the wait).
    if (waiting_.size() >= proto::kExecMax) return fail("exec: too many requests wait for the workload to start");
    reply(control::Waiting{});
    waiting_.push_back(Queued{std::move(request), std::move(fds), std::move(reply)});
    return;
  }
  const host::Session* s = host_ ? host_->session(vm_) : nullptr;
  if (!s) return fail("exec: the VM is not up");
  proto::ExecProcess x = resolve_exec(std::move(request), s->config().descriptor.exec);
  if (x.stdio && fds.size() != 3) return fail("exec: the request must carry the client's fds 0, 1 and 2");
  auto a = std::make_shared<Attached>();
  a->reply = std::move(reply);
  const bool terminal = x.stdio && x.stdio->terminal;
  const bool input = x.stdio && x.stdio->attach_stdin;
  if (x.stdio) {
    a->in = std::move(fds[0]);
    a->out = std::move(fds[1]);
    a->err = std::move(fds[2]);
    // Our own open file descriptions (reopened non-blocking): the client's stay as they are.
    make_own_nonblocking(a->out.get());
    a->wout = std::make_unique<FdWriter>(io_, a->out.get(), kOutputQueueCap);
    a->wout->on_drained = pause_changed_;
    if (!terminal) {
      make_own_nonblocking(a->err.get());
      a->werr = std::make_unique<FdWriter>(io_, a->err.get(), kOutputQueueCap);
      a->werr->on_drained = pause_changed_;
    }
  }
  std::weak_ptr<Attached> wa = a;
  host::ExecHooks hooks;
  hooks.started = [this, wa, input](std::int32_t pid) {
    auto a = wa.lock();
    if (!a) return;
    a->pid = pid;
    a->reply(control::Started{pid, a->proc});
    for (auto& w : a->waiters) w(control::Started{pid, a->proc});
    if (!input) return;
    make_own_nonblocking(a->in.get());
    const std::uint16_t proc = a->proc;
    a->pump = std::make_unique<StdinPump>(
        io_, a->in.get(), [this, proc](std::string_view b) { return host_ && host_->send_stdin(vm_, b, proc).ok(); },
        [this, proc] {
          if (host_) (void)host_->send_stdin_eof(vm_, proc);
        });
    a->pump->start();
  };
  hooks.data = [this, wa](proto::Stream st, std::string_view b) {
    auto a = wa.lock();
    if (!a) return;
    FdWriter* w = st == proto::Stream::err && a->werr ? a->werr.get() : a->wout.get();
    if (w) w->write(b);
    pause_changed_();
  };
  hooks.lost = [wa](proto::Stream st, std::optional<std::uint64_t> bytes, std::uint64_t received) {
    auto a = wa.lock();
    if (!a) return;
    const std::string_view name = proto::to_string(st);
    a->lost.push_back(bytes ? fmt::format("{} bytes of {} lost: the data channel closed before its end", *bytes, name)
                            : fmt::format("{} truncated: its eof never arrived ({} bytes received)", name, received));
  };
  hooks.ended = [this, wa](const host::ExecEnd& e) {
    auto a = wa.lock();
    if (!a) return;
    a->status = host::exec_exit_status(e);
    if (auto* f = std::get_if<proto::ExecFailed>(&e)) a->reason = f->reason;
    else if (auto* lost = std::get_if<host::ExecLost>(&e)) a->reason = lost->reason;
    const std::uint16_t proc = a->proc;
    // The reply waits for the output to be written (or its reader to be gone).
    for (FdWriter* w : {a->wout.get(), a->werr.get()})
      if (w) w->on_empty = [this, proc] { finish(proc); };
    finish(proc);
  };
  // A pod's container (`container`) or a process joining one (`in`): as the client asked.
  auto proc = host_->exec(vm_, std::move(x.exec), x.stdio, std::move(hooks), host::ExecWhere{std::move(x.container), x.in});
  if (!proc) return a->reply(control::Error{proc.error().message});
  a->proc = *proc;
  live_[*proc] = a;
}

// ---- the client ----------------------------------------------------------------------------------

namespace {

int exec_error(std::string_view what) {
  fmt::print(stderr, "neshost exec: {}\n", what);
  return 125;
}

}  // namespace

int exec_main(const Args& args) {
  auto p = parse_exec(args);
  if (!p) return usage_error("exec", p.error().message);
  if (p->help) {
    fmt::print("{}", exec_help());
    return 0;
  }
  const bool interactive = p->interactive, tty = p->tty;
  const auto& state = p->state;
  const std::string vm = p->vm;
  proto::Exec ex = std::move(p->exec);

  proto::ExecProcess req;
  req.proc = 1;  // the monitor numbers it
  req.exec = std::move(ex);
  req.stdio = proto::Stdio{};
  req.stdio->attach_stdin = interactive;
  if (tty) {
    auto sz = terminal_size(0);
    if (!sz) sz = terminal_size(1);
    req.stdio->terminal = proto::Terminal{sz ? sz->rows : std::uint16_t{24}, sz ? sz->cols : std::uint16_t{80}};
  }
  if (auto ok = proto::validate(proto::HostMessage{req}); !ok) return usage_error("exec", ok.error().reason);
  // The workload's environment under ours; its cwd and user unless given.
  control::Exec request{true, !p->workdir_given, !p->user_given, std::move(req)};

  adopt_orphan("exec", state ? fs::path(*state) : default_state_dir(), vm);  // a dead monitor replaced first
  const fs::path ctl = host::control_path(state ? fs::path(*state) : default_state_dir(), vm);
  // SIGWINCH is read from a signalfd while we wait (-t); blocked before anything can raise it.
  sigset_t winch;
  sigemptyset(&winch);
  sigaddset(&winch, SIGWINCH);
  host::Fd sfd;
  if (tty) {
    ::sigprocmask(SIG_BLOCK, &winch, nullptr);
    sfd.reset(::signalfd(-1, &winch, SFD_CLOEXEC | SFD_NONBLOCK));
  }
  // The monitor that serves us (its pid): if the connection ends early, whether it died.
  pid_t served_by = 0;
  host::Fd served_pidfd;
  if (auto now = host::reconcile(state ? fs::path(*state) : default_state_dir(), vm);
      now && *now && (*now)->monitor && (*now)->monitor_alive) {
    served_by = (*now)->monitor->monitor.pid;
    served_pidfd = host::pin_process((*now)->monitor->monitor);
  }
  auto cs = ControlSession::open(ctl, control::Request{std::move(request)}, {0, 1, 2});
  auto not_running = [&](const host::Error& e) { return exec_error(fmt::format("VM '{}' is not running ({})", vm, e.message)); };
  if (!cs) return not_running(cs.error());
  // The answer to the exec itself is bounded (an init that never answers: Host::kExecAnswerWait).
  auto first = cs->read_reply(host::Host::kExecAnswerWait + 5s);
  // A VM still booting: the monitor says so and answers once the workload runs (its own
  // deadlines bound that).
  while (first && std::holds_alternative<control::Waiting>(*first)) first = cs->read_reply(std::nullopt);
  // A monitor that closes before answering is ending with its VM (it had an outcome as we
  // connected): the exec never started.
  if (!first && first.error().err == ECONNRESET) return not_running(first.error());
  if (!first) return exec_error(first.error().message);
  if (auto* e = std::get_if<control::Error>(&*first)) return exec_error(e->message);
  std::uint16_t proc = 0;
  std::unique_ptr<RawMode> raw;  // restored on every return below
  if (auto* started = std::get_if<control::Started>(&*first)) {
    proc = started->proc;
    if (tty && interactive && ::isatty(0)) {
      auto r = RawMode::enter(0);
      if (r) raw = std::move(*r);
    }
  }
  control::Reply last = std::move(*first);
  while (!control::is_final(last)) {
    pollfd p[2] = {{cs->fd(), POLLIN, 0}, {sfd.get(), POLLIN, 0}};
    int r = ::poll(p, sfd ? 2 : 1, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return exec_error(fmt::format("poll: {}", std::strerror(errno)));
    if (sfd && (p[1].revents & POLLIN)) {
      signalfd_siginfo si;
      while (::read(sfd.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
      }
      auto sz = terminal_size(0);
      if (!sz) sz = terminal_size(1);
      if (sz && proc) (void)control_request(ctl, control::Resize{sz->rows, sz->cols, proc}, 2s);
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      auto l = cs->read_reply(2s);
      if (!l) {
        if (raw) raw->restore();
        // The monitor we are attached to died (a replacement cannot take this client over: the
        // process's stdio went to the monitor gone as our own fds): said as such, 125.
        // Its pidfd turns readable once it has exited: its fds (our connection) close a moment
        // before, so the EOF may come first; waited for, bounded.
        pollfd pf{served_pidfd.get(), POLLIN, 0};
        bool died = false;
        while (served_pidfd && !died) {
          const int n = ::poll(&pf, 1, 5000);
          if (n < 0 && errno == EINTR) continue;
          died = n > 0;
          break;
        }
        // Died, not ended: the VM runs on without it (no outcome recorded).
        if (died)
          if (auto now = host::reconcile(state ? fs::path(*state) : default_state_dir(), vm);
              !now || !*now || (*now)->status != host::VmStatus::running)
            died = false;
        if (died)
          return exec_error(fmt::format(
              "VM '{}': its monitor (pid {}) died while the process ran: its further output and its exit status "
              "are not known (the process may still run in the guest: neshost top {})",
              vm, served_by, vm));
        return exec_error(fmt::format("VM '{}': {}", vm, l.error().message));
      }
      last = std::move(*l);
    }
  }
  if (raw) raw->restore();
  if (auto* e = std::get_if<control::Error>(&last)) return exec_error(e->message);
  auto* exited = std::get_if<control::Exited>(&last);
  if (!exited) return exec_error(fmt::format("unexpected answer '{}'", control::encode(last)));
  if (!exited->why.empty()) fmt::print(stderr, "neshost exec: {}\n", exited->why);
  return exited->status;
}

namespace {
const Registrar exec_reg{{"exec", "run another process in a running VM (as docker exec)", exec_main}};
}  // namespace

}  // namespace nes::cli
