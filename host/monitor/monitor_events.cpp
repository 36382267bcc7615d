// The Monitor's part in the session's events: the runtime dir tidied as QEMU and the guest come
// up, QMP connected, the workload's start and end passed on (the creator, exec clients, a
// replacement's stdin and caller), and what our user is told (host/monitor/vm_monitor.hpp).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "host/monitor/duties.hpp"
#include "host/monitor/say.hpp"
#include "host/monitor/vm_monitor.hpp"

namespace nes::monitor {

namespace fs = std::filesystem;
using host::act::Milestone;

/// Each session event, in this order: sockets, data-channel news, the guest's readiness, the
/// workload's milestones, the end, then what is said about it.
void Monitor::on_event(host::Host&, const host::Event& ev) {
  tidy_sockets(ev);
  say_data_event(ev);
  on_ready(ev);
  on_guest(ev);
  if (ev.milestone == Milestone::finished) on_finished();
  say_event(ev);
  std::fflush(stderr);
}

/// QEMU has dialled a socket: its path is needed no more, so even a SIGKILLed neshost leaves no
/// socket behind. The data channel connected: -i's pump may start.
void Monitor::tidy_sockets(const host::Event& ev) {
  std::error_code rm_ec;
  if (ev.milestone == Milestone::connected) fs::remove(plan_.channel_socket, rm_ec);
  if (ev.milestone == Milestone::data_connected) {
    fs::remove(plan_.data_socket, rm_ec);
    if (pump_) pump_->start();
  }
}

/// A data channel's error (unless --console says every event); what becomes of the data channel
/// across a loss, once per event (rare: a loss, a resume), in monitor.log for a detached VM:
/// where its output went is never a guess.
void Monitor::say_data_event(const host::Event& ev) {
  if (ev.milestone == Milestone::data_error && !plan_.console) say("neshost run: data channel: {}\n", ev.detail);
  if (!plan_.console && plan_.monitor_log &&
      (ev.kind == "data_refused" || ev.kind == "data_lost" || ev.kind == "data_resumed" ||
       ev.kind == "output_dropped" || ev.kind == "output_lost"))
    say("neshost monitor: VM {}: {} {}\n", vmid_, ev.kind, ev.detail);
}

/// The guest runs (its `ready`, or a replacement's resumed session): it may be paused from now on;
/// QMP connected while its socket's path exists; then the runtime dir goes. Once the guest said
/// `ready`, QEMU has also read the initramfs (it connects chardevs before it loads it); in
/// --sandbox the init dials the data channel only after `boot`, so the dir stays until then. A
/// VMM that outlives us redials the sockets' paths (a replacement monitor binds them again): the
/// directory stays until the VM is over; only a generated initramfs goes.
void Monitor::on_ready(const host::Event& ev) {
  const auto m = ev.milestone;
  if (m == Milestone::ready || ev.kind == "resumed") guest_ready_ = true;
  if (m == Milestone::ready && !plan_.sandbox && !pause_.paused()) {
    if (auto c = pause_.connect(); !c) say("neshost monitor: VM {}: QMP (pause): {}\n", vmid_, c.error().message);
  }
  if (m == (plan_.sandbox ? Milestone::data_connected : Milestone::ready)) {
    std::error_code rm_ec;
    if (!plan_.vmm_survives) rt_.remove_now();
    else if (plan_.initrd_from) fs::remove(plan_.initrd, rm_ec);
  }
}

/// The workload's start (the --timeout deadline a replacement re-arms recorded, the creator and
/// waiting exec clients told) and outcome; a replacement's stdin position and resumed session.
void Monitor::on_guest(const host::Event& ev) {
  const auto m = ev.milestone;
  if (m == Milestone::started) {
    if (run_.vmm_info)  // where the session arms its --timeout again: the deadline a replacement re-arms
      if (auto r = record_wall_deadline(cfg_.state_dir, *run_.vmm_info); !r)
        say("neshost monitor: VM {}: {} (a replacement would end it at the earlier deadline)\n", vmid_,
            r.error().message);
    notify_started(started_notify_);
    execs_.workload_started();
  }
  if (m == Milestone::outcome) execs_.workload_ended();
  if (ev.kind == "stdin_position" && run_.adopt_stdin && !std::exchange(stdin_adopted_, true))
    adopt_stdin(std::strtoull(ev.detail.c_str(), nullptr, 10));  // once: later ones follow redials
  if (ev.kind == "resumed") {
    // A replacement monitor has the lifecycle channel back (the guest redialled us).
    say("neshost monitor: VM {}: the guest resumed its session ({})\n", vmid_, ev.detail);
    if (ev.detail.find("started=true") != std::string::npos) execs_.workload_started();
    if (on_resumed_) on_resumed_();
  }
}

/// The session is finished: the pause marker goes; the record as it ends (with what was lost of
/// the output) kept for our last words; from here on SIGINT/SIGTERM are read from a signalfd by
/// the last writes (finish()).
void Monitor::on_finished() {
  pause_.ended();
  if (auto* sess = host_ ? host_->session(vmid_) : nullptr; sess && sess->outcome()) final_record_ = *sess->outcome();
  ::sigprocmask(SIG_BLOCK, &stop_signals_, nullptr);
}

/// --console: every event; else one line for an outcome that is not the workload's own (a
/// workload that ran speaks for itself), and how to stop a VM --on-exit keep left running.
void Monitor::say_event(const host::Event& ev) {
  const auto m = ev.milestone;
  if (plan_.console) say("neshost: {} {}{}{}\n", ev.vm, ev.kind, ev.detail.empty() ? "" : " ", ev.detail);
  if (m == Milestone::outcome && !plan_.console && ev.outcome && *ev.outcome != proto::Outcome::exited &&
      *ev.outcome != proto::Outcome::signalled)
    say("neshost run: {}\n", ev.detail);
  if (m == Milestone::recorded && cfg_.session.on_exit == host::OnExitPolicy::keep)
    say("neshost run: VM {} kept running; stop it with: neshost stop --state {} {}\n", vmid_,
        cfg_.state_dir.string(), vmid_);
}

}  // namespace nes::monitor
