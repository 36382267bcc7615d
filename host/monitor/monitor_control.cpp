// The Monitor's control socket: each request (host/monitor/control.hpp) served on this VM's Host
// (host/monitor/vm_monitor.hpp; docs/host.md "The control socket", "Pause").
#include <signal.h>

#include <cstdio>

#include <fmt/format.h>

#include "host/lib/state_dir.hpp"
#include "host/monitor/say.hpp"
#include "host/monitor/vm_monitor.hpp"

namespace nes::monitor {

/// `neshost stop`/`kill`/`top`/`exec`/`pause` and the shim reach this VM through its control
/// socket, bound at STATE/VM/control.sock; requests aimed at another generation are refused.
/// A socket that cannot be bound is said, and the VM served without it.
void Monitor::start_control(host::Host& h, const std::string& id) {
  ControlHandlers ch;
  ch.generation = cfg_.session.generation;
  ch.stop = [this] { return ctl_stop(); };
  ch.kill = [this](const control::Kill& k) { return ctl_kill(k); };
  ch.pause = [this] { return ctl_pause(); };
  ch.resume = [this] { return ctl_resume(); };
  ch.resize = [&h, id](const control::Resize& r) { return h.send_resize(id, r.rows, r.cols, r.proc.value_or(0)); };
  ch.ps = [&h, id](auto done) { h.async_list_processes(id, std::move(done)); };
  ch.resources = [&h, id](const auto& r, auto done) { h.async_container_resources(id, r, std::move(done)); };
  ch.exec = [this](control::Exec x, std::vector<host::Fd> fds, ControlRespond respond) {
    ctl_exec(std::move(x), std::move(fds), std::move(respond));
  };
  ch.wait = [this](const control::Wait& w, ControlRespond respond) { execs_.wait(w.proc, std::move(respond)); };
  ch.close_stdin = [this]() -> host::Status {
    stdin_hold_.reset();  // the workload's EOF once the FIFO's other writers are gone too
    return host::Ok{};
  };
  auto cs = ControlServer::start(io_, host::control_path(cfg_.state_dir, id), control_handler(std::move(ch)));
  if (cs) control_ = std::move(*cs);
  else fmt::print(stderr, "neshost run: control socket: {}\n", cs.error().message);
}

// A paused VM: stop and SIGKILL resume it first (docker's); other signals wait in the channel for
// unpause (as a frozen cgroup's do); exec is refused (runc's).

/// `stop`: what SIGTERM to this process does (a paused VM resumed first).
host::Status Monitor::ctl_stop() {
  if (auto r = pause_.resume(); !r) return r;
  auto r = host_->shutdown(vmid_);
  if (r) stopping_ = true;
  return r;
}

/// `kill SIG [PROC]`: to the workload (or exec'd process PROC). SIGKILL is never refused: a paused
/// VM is resumed for it, or ended by its VMM's death if it cannot be.
host::Status Monitor::ctl_kill(const control::Kill& k) {
  if (k.signal == SIGKILL && !k.proc && pause_.paused()) {
    if (auto r = pause_.resume(); !r) {
      say("neshost monitor: VM {}: SIGKILL to a paused VM that cannot be resumed ({}): killing its VMM\n", vmid_,
          r.error().message);
      if (vmm_) vmm_->kill();
      return host::Ok{};
    }
    say("neshost monitor: VM {}: resumed for SIGKILL\n", vmid_);
  }
  return k.proc ? host_->kill_exec(vmid_, *k.proc, k.signal) : host_->kill(vmid_, k.signal);
}

/// `pause`: only a guest that runs (ready, or resumed by a replacement) and is not stopping.
host::Status Monitor::ctl_pause() {
  if (!guest_ready_) return host::Error{"the guest is not ready yet: pause it once it runs"};
  if (stopping_) return host::Error{"the VM is stopping"};
  auto r = pause_.pause();
  if (r) say("neshost monitor: VM {}: paused\n", vmid_);
  return r;
}

/// `resume`: Ok also when it was not paused.
host::Status Monitor::ctl_resume() {
  const bool was = pause_.paused();
  auto r = pause_.resume();
  if (r && was) say("neshost monitor: VM {}: resumed\n", vmid_);
  return r;
}

/// `exec FLAGS JSON`: a process beside the workload (cli::ExecAttachments); refused while paused.
void Monitor::ctl_exec(control::Exec x, std::vector<host::Fd> fds, ControlRespond respond) {
  if (pause_.paused()) return respond(control::Error{"cannot exec in a paused VM (unpause it first)"});
  execs_.start(std::move(x), std::move(fds), std::move(respond));
}

}  // namespace nes::monitor
