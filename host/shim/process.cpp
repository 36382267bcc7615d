// One process of a task (host/shim/process.hpp).
#include "host/shim/process.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace nes::shim {
namespace v2 = containerd::task::v2;
namespace types = containerd::v1::types;
using host::Error;
using host::Fd;
using host::Result;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void set_time(google::protobuf::Timestamp* t, std::int64_t ns) {
  t->set_seconds(ns / 1000000000);
  t->set_nanos(static_cast<std::int32_t>(ns % 1000000000));
}

Result<Fd> open_stdio(const std::string& path, bool input) {
  if (path.empty()) {
    Fd f(::open("/dev/null", (input ? O_RDONLY : O_WRONLY) | O_CLOEXEC));
    if (!f) return Error{fmt::format("/dev/null: {}", std::strerror(errno))};
    return f;
  }
  // `file://PATH` (ctr run --log-uri file://..., as runc's shim takes it): output appended to
  // a regular file.
  if (path.starts_with("file://")) {
    if (input) return Error{fmt::format("stdin: '{}': a file URI is for output only", path)};
    Fd f(::open(path.c_str() + 7, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640));
    if (!f) return Error{fmt::format("stdio {}: {}", path, std::strerror(errno))};
    return f;
  }
  // Non-blocking opens: a FIFO whose other end is not open yet must not hang the shim. An output
  // FIFO is opened read-write, as containerd's runc shim keeps a read end of its own: the pipe
  // never loses its last reader, so output waits in it (and then backpressures) while no one
  // reads (before an attach, across containerd's restart, after an attached ctr died) instead of
  // failing with EPIPE; whoever opens it next reads on from there.
  Fd f(::open(path.c_str(), (input ? O_RDONLY : O_RDWR) | O_NONBLOCK | O_CLOEXEC));
  if (!f) return Error{fmt::format("stdio {}: {}", path, std::strerror(errno))};
  int fl = ::fcntl(f.get(), F_GETFL);
  ::fcntl(f.get(), F_SETFL, fl & ~O_NONBLOCK);
  return f;
}

types::Status Process::status() const {
  return phase == Phase::created ? types::CREATED : phase == Phase::running ? types::RUNNING : types::STOPPED;
}

v2::StateResponse Process::state(const std::string& bundle) const {
  v2::StateResponse r;
  r.set_id(id);
  if (exec) r.set_exec_id(id);
  r.set_bundle(bundle);
  r.set_pid(pid || exec ? pid : static_cast<std::uint32_t>(::getpid()));
  r.set_status(status());
  r.set_stdin(stdin_path);
  r.set_stdout(stdout_path);
  r.set_stderr(stderr_path);
  r.set_terminal(terminal);
  if (phase == Phase::stopped) {
    r.set_exit_status(exit_status);
    set_time(r.mutable_exited_at(), exited_at_ns);
  }
  return r;
}

v2::WaitResponse Process::wait_response() const {
  v2::WaitResponse w;
  w.set_exit_status(exit_status);
  set_time(w.mutable_exited_at(), exited_at_ns);
  return w;
}

v2::DeleteResponse Process::delete_response() const {
  v2::DeleteResponse r;
  r.set_pid(pid);
  r.set_exit_status(exit_status);
  set_time(r.mutable_exited_at(), exited_at_ns);
  return r;
}

Result<Streams> Process::open_streams() {
  Streams s;
  auto in = open_stdio(stdin_path, true);
  if (!in) return std::move(in).error();
  hold_stdin();  // the read end is open (ours), so a non-blocking writer's open succeeds at once
  auto out = open_stdio(stdout_path, false);
  if (!out) return std::move(out).error();
  auto err = open_stdio(stderr_path, false);
  if (!err) return std::move(err).error();
  s.in = std::move(*in);
  s.out = std::move(*out);
  s.err = std::move(*err);
  return s;
}

void Process::hold_stdin() {
  if (!stdin_path.empty()) stdin_hold.reset(::open(stdin_path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  if (!stdin_path.empty() && !exec) stdin_reader.reset(::open(stdin_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
}

void Process::hold_output() {
  auto hold = [](const std::string& path) {
    if (path.empty() || path.starts_with("file://")) return Fd{};
    return Fd(::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
  };
  stdout_hold = hold(stdout_path);
  stderr_hold = hold(stderr_path);
}

void Process::stop(std::uint32_t status, std::int64_t at_ns) {
  phase = Phase::stopped;
  exit_status = status;
  exited_at_ns = at_ns;
  stdin_hold.reset();
  stdin_reader.reset();
  stdout_hold.reset();
  stderr_hold.reset();
}

void Process::report_exit(Publisher& events, const std::string& container) {
  containerd::events::TaskExit e;
  e.set_container_id(container);
  e.set_id(id);
  e.set_pid(pid);
  e.set_exit_status(exit_status);
  set_time(e.mutable_exited_at(), exited_at_ns);
  events.publish("/tasks/exit", e);
  const std::string w = wait_response().SerializeAsString();
  for (auto& r : std::exchange(waiters, {})) {
    ttrpc::Reply reply;
    reply.payload = w;
    r(std::move(reply));
  }
}

}  // namespace nes::shim
