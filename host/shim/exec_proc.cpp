// A process the VM's monitor runs for the shim (host/shim/exec_proc.hpp).
#include "host/shim/exec_proc.hpp"

#include <signal.h>

#include <filesystem>
#include <utility>

#include <boost/asio/read_until.hpp>
#include <fmt/format.h>

#include "host/shim/container.hpp"
#include "host/shim/control_journal.hpp"
#include "host/shim/pod_mounts.hpp"
#include "host/shim/fault_point.hpp"
#include "host/shim/log.hpp"
#include "host/shim/rpc.hpp"
#include "protocol/codec.hpp"

namespace nes::shim {
namespace asio = boost::asio;
namespace v2 = containerd::task::v2;
namespace ev = containerd::events;
using host::Error;
using host::Fd;
using rpc::empty;
using rpc::fail;
using rpc::ok;
using namespace std::chrono_literals;

namespace {

/// The `exec` request for an exec's process `spec` (its number is the monitor's to give): its
/// stdin attached when it has one; with a `terminal`, a PTY of `size` (height, width; 24x80
/// unless a ResizePty came before it started).
proto::ExecProcess exec_message(const TaskSpec& spec, bool attach_stdin, bool terminal,
                                std::optional<std::pair<std::uint32_t, std::uint32_t>> size) {
  proto::ExecProcess m;
  m.proc = 1;  // the monitor numbers it
  m.exec.argv = spec.argv;
  for (const auto& kv : spec.env) {
    auto eq = kv.find('=');
    m.exec.env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  m.exec.cwd = spec.cwd;
  m.exec.uid = spec.uid;
  m.exec.gid = spec.gid;
  m.exec.groups = spec.groups;
  m.stdio = proto::Stdio{};
  m.stdio->attach_stdin = attach_stdin;
  if (terminal) {
    auto [h, w] = size.value_or(std::pair<std::uint32_t, std::uint32_t>{24, 80});
    m.stdio->terminal = proto::Terminal{static_cast<std::uint16_t>(h), static_cast<std::uint16_t>(w)};
  }
  return m;
}

}  // namespace

ExecProc::ExecProc(Shim& shim, std::string task_id, std::string exec_id)
    : shim(shim), sock(shim.io), buf(std::make_shared<asio::streambuf>(64u << 10)) {
  exec = !exec_id.empty();
  id = exec ? std::move(exec_id) : task_id;
  task = std::move(task_id);
  phase = Phase::created;
}

std::string ExecProc::name() const { return fmt::format("{} {}", exec ? "exec" : "task", id); }

void ExecProc::start(std::optional<std::uint16_t> in_proc, ttrpc::Respond respond) {
  auto streams = open_streams();
  if (!streams) return respond(fail(ttrpc::Code::invalid_argument, streams.error().message));
  proto::ExecProcess m = exec_message(spec, !stdin_path.empty(), terminal, pending_resize);
  if (!exec) {
    const Container* c = shim.pod_container(id);
    m.container = proto::Container{c->guest_root, c->hostname, spec.root_ro,
                                   pod_guest_mounts(spec, std::filesystem::path(c->guest_root).parent_path().string()),
                                   spec.resources};
  }
  m.in = in_proc;
  if (auto okm = proto::validate(proto::HostMessage{m}); !okm)
    return respond(fail(ttrpc::Code::invalid_argument, "spec: " + okm.error().reason));
  request = cli::control::Exec{false, false, false, std::move(m)};  // `exec - JSON`
  in = std::move(streams->in);
  out = std::move(streams->out);
  err = std::move(streams->err);
  start_respond = std::move(respond);
  restored = false;  // an added one taken over: this Start's answer is published as any
  connect_deadline = std::chrono::steady_clock::now() + 30s;
  // Intent before effect: the journal says it is starting before the request can reach the
  // monitor (a replacement then knows the answer was lost, docs/containerd.md).
  if (auto w = shim.persist_execs("journal:exec-start"); !w) {
    in.reset();
    out.reset();
    err.reset();
    auto rs = std::exchange(start_respond, std::nullopt);
    return (*rs)(fail(ttrpc::Code::internal, fmt::format("exec {}: journal: {}", id, w.error().message)));
  }
  fault_point("exec:recorded");
  connect_exec(shim, key());
}

void connect_exec(Shim& shim, const ProcKey& k) {
  ExecProc* x = shim.find(k);
  if (!x || !x->start_respond) return;
  const auto path = shim.control();
  std::error_code fe;
  const bool there = std::filesystem::exists(path, fe);
  auto cs = there ? cli::ControlSession::open(path, x->request, {x->in.get(), x->out.get(), x->err.get()})
                  : host::Result<cli::ControlSession>(Error{fmt::format("no monitor at {} yet", path.string())});
  if (!cs) {
    if (shim.own().task.phase == Phase::running && std::chrono::steady_clock::now() < x->connect_deadline) {
      x->retry.emplace(shim.io, 20ms);
      x->retry->async_wait([&shim, k](boost::system::error_code e) { if (!e) connect_exec(shim, k); });
      return;
    }
    return x->ended(125, cs.error().message);
  }
  // The monitor has its own copies now.
  x->in.reset();
  x->out.reset();
  x->err.reset();
  boost::system::error_code ec;
  Fd s = cs->take();
  x->sock.assign(asio::local::stream_protocol(), s.get(), ec);
  if (ec) return x->ended(125, ec.message());
  s.release();
  read_exec(shim, k);
}

namespace {

/// The monitor said exec `x` started (`pid` in the guest, its number `proc`): journaled, then
/// published and Start answered; a resize or signal that waited for it sent. false: its start
/// was not journaled (it ended, its Start failed).
bool on_started(ExecProc& x, std::uint32_t pid, std::uint16_t proc) {
  Shim& shim = x.shim;
  x.pid = pid;
  x.proc = proc;
  x.phase = Phase::running;
  // The result, durable before containerd hears it. Not durable: the process is ended in the
  // guest (SIGKILL: nothing runs that no journal names) and Start fails naming the journal;
  // nothing is published. The journal still says `starting`, which a replacement reports as a
  // failed Start (125), as containerd was told.
  if (auto w = shim.persist_execs("journal:exec-started"); !w) {
    (void)cli::control_call(shim.control(), cli::control::Kill{SIGKILL, x.proc}, 2s);
    x.phase = Phase::created;
    x.pid = 0;
    auto rs = std::exchange(x.start_respond, std::nullopt);
    const std::string what = x.exec ? "exec " + x.id : fmt::format("container '{}'", x.id);
    x.ended(125, "its start was not journaled: " + w.error().message);
    if (rs) (*rs)(fail(ttrpc::Code::internal, fmt::format("{}: journal: {}", what, w.error().message)));
    return false;
  }
  if (x.exec) {
    ev::TaskExecStarted e;
    e.set_container_id(x.task);
    e.set_exec_id(x.id);
    e.set_pid(pid);
    shim.events.publish("/tasks/exec-started", e);
  } else {  // a pod's container
    ev::TaskStart e;
    e.set_container_id(x.id);
    e.set_pid(pid);
    shim.events.publish("/tasks/start", e);
  }
  v2::StartResponse r;
  r.set_pid(pid);
  if (auto rs = std::exchange(x.start_respond, std::nullopt)) (*rs)(ok(r));
  if (auto sz = std::exchange(x.pending_resize, std::nullopt)) {
    x.last_size = *sz;
    (void)cli::control_request(shim.control(),
                               cli::control::Resize{static_cast<std::uint16_t>(sz->first),
                                                    static_cast<std::uint16_t>(sz->second), x.proc},
                               2s);
  }
  if (auto sig = std::exchange(x.pending_signal, std::nullopt)) (void)x.kill(*sig);
  return true;
}

}  // namespace

void read_exec(Shim& shim, const ProcKey& k) {
  ExecProc* x = shim.find(k);
  if (!x) return;
  asio::async_read_until(x->sock, *x->buf, '\n', [&shim, k, buf = x->buf](boost::system::error_code ec, std::size_t n) {
    ExecProc* x = shim.find(k);
    if (!x || x->buf != buf || ec == asio::error::operation_aborted) return;
    if (ec) return x->ended(137, "the VM's monitor closed the connection");  // gone with the VM
    std::string line(asio::buffers_begin(buf->data()), asio::buffers_begin(buf->data()) + n - 1);
    buf->consume(n);
    auto reply = cli::control::parse_reply(line);
    if (!reply) return x->ended(125, "unexpected answer: " + line);
    if (std::holds_alternative<cli::control::Waiting>(*reply)) return read_exec(shim, k);  // the VM is still booting
    if (auto* started = std::get_if<cli::control::Started>(&*reply)) {
      if (x->restored) return read_exec(shim, k);  // `wait PROC`: the start was published by the shim before
      if (on_started(*x, static_cast<std::uint32_t>(started->pid), started->proc)) read_exec(shim, k);
      return;
    }
    if (auto* exited = std::get_if<cli::control::Exited>(&*reply))
      return x->ended(static_cast<std::uint32_t>(exited->status), exited->why);
    if (auto* e = std::get_if<cli::control::Error>(&*reply)) return x->ended(125, e->message);
    x->ended(125, "unexpected answer: " + line);
  });
}

void ExecProc::ended(std::uint32_t status, std::string why, bool hold) {
  boost::system::error_code ig;
  sock.close(ig);
  const bool started = phase == Phase::running;
  // What went wrong after it ran (e.g. its output lost on the way to its FIFOs: 125) goes to
  // the shim's log, naming the task and the exec.
  if (started && !why.empty())
    log("warning: task {}{}: {} (exit status {})", task, exec ? " exec " + id : std::string(), why, status);
  stop(status, now_ns());
  announce_end(shim, key(), started, std::move(why), hold);
}

void announce_end(Shim& shim, const ProcKey& k, bool started, std::string why, bool hold) {
  ExecProc* xp = shim.find(k);
  if (!xp) return;
  ExecProc& x = *xp;
  const std::uint32_t status = x.exit_status;
  if (auto w = shim.persist_execs("journal:exec-exit"); !w) {
    if (hold) {
      if (x.end_tries++ == 0)
        log("warning: task {}: {}: its end (exit status {}) is held until the exec journal takes it: {}", x.task,
            x.name(), status, w.error().message);
      x.phase = started ? Phase::running : Phase::created;  // as before its end, until it is durable
      x.end_retry.emplace(shim.io, 1s);
      x.end_retry->async_wait([&shim, k, started, why](boost::system::error_code e) {
        ExecProc* x = shim.find(k);
        if (e || !x) return;
        x->phase = Phase::stopped;
        announce_end(shim, k, started, why, true);
      });
      return;
    }
    log("warning: task {}: {}: its end is told, not journaled: {}", x.task, x.name(), w.error().message);
  }
  if (x.end_tries) log("task {}: {}: its end journaled after {} failed writes", x.task, x.name(), x.end_tries);
  x.end_tries = 0;
  if (auto rs = std::exchange(x.start_respond, std::nullopt)) {
    (*rs)(fail(ttrpc::Code::failed_precondition,
               fmt::format("{}: {}{}", x.exec ? "exec " + x.id : fmt::format("container '{}'", x.id),
                           why.empty() ? "did not start" : why, status == 127 ? " (not found)" : "")));
  }
  if (!started && x.pid == 0 && x.waiters.empty()) return;
  x.report_exit(shim.events, x.task);
}

void ExecProc::wait_end() {
  auto cs = cli::ControlSession::open(shim.control(), cli::control::Wait{proc}, {});
  boost::system::error_code ec;
  if (cs) {
    Fd s = cs->take();
    sock.assign(asio::local::stream_protocol(), s.get(), ec);
    if (!ec) s.release();
  }
  if (!cs || ec) return ended(137, fmt::format("its end cannot be waited for: {}", cs ? ec.message() : cs.error().message));
  read_exec(shim, key());
}

ttrpc::Reply ExecProc::kill(std::uint32_t signal) {
  if (start_respond) {  // its Start is in flight: the signal goes once it runs
    pending_signal = signal;
    return empty();
  }
  if (phase != Phase::running || proc == 0) return fail(ttrpc::Code::failed_precondition, fmt::format("{}: not started", name()));
  // Journaled in the task's record (control_journal.hpp): a replaced shim sends it again, once.
  auto done = journaled_call(shim.own(), cli::control::Kill{static_cast<int>(signal), proc}, 2s);
  if (done) return empty();
  return fail(ttrpc::Code::unavailable, fmt::format("kill {}: {}", signal, done.error().message));
}

ttrpc::Reply ExecProc::resize(std::uint32_t height, std::uint32_t width) {
  if (!terminal) return fail(ttrpc::Code::failed_precondition, fmt::format("{}: no terminal", name()));
  if (phase == Phase::stopped) return fail(ttrpc::Code::not_found, "process already finished");
  if (proc == 0) {  // before it started: the size it starts with
    pending_resize = std::pair{height, width};
    return empty();
  }
  if (last_size == std::pair{height, width}) return empty();  // told already: nothing changes
  auto done = cli::control_call(shim.control(),
                                cli::control::Resize{static_cast<std::uint16_t>(height), static_cast<std::uint16_t>(width), proc},
                                2s);
  if (done) {
    last_size = std::pair{height, width};
    return empty();
  }
  return fail(ttrpc::Code::unavailable, fmt::format("resize: {}", done.error().message));
}

}  // namespace nes::shim
