// The Monitor's VMM: started (booted or restored: vm::Vmm) or adopted once the listeners are up,
// its exit and its helper daemons' deaths reported to the session (host/monitor/vm_monitor.hpp;
// docs/host.md "Re-adoption": why a dead virtiofsd or passt ends the VM).
#include <fcntl.h>

#include <fmt/format.h>

#include "host/monitor/duties.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/monitor/say.hpp"
#include "host/monitor/vm_monitor.hpp"

namespace nes::monitor {

namespace asio = boost::asio;
using namespace std::chrono_literals;

/// The channel listener is up: the data listener, the control socket, then the VMM (started, or
/// a replacement's adopted). A data listener that cannot be bound ends the session (125).
void Monitor::on_listening(host::Host& h, const std::string& id) {
  host::UnixListenOptions dl;
  dl.path = plan_.data_socket.string();
  if (auto s = h.listen_data_unix(id, dl); !s) {
    say("neshost run: data channel: {}\n", s.error().message);
    (void)h.vm_started(id);
    (void)h.vm_exited(id);
    return;
  }
  start_control(h, id);
  if (run_.adopted) {
    adopt_vmm(h, id);
    return;
  }
  start_vmm(h, id);
  // The VM's start and its --timeout deadline, for a replacement (host/monitor/duties.hpp).
  if (auto* sess = h.session(id); run_.vmm_info && sess && sess->started_at())
    if (auto r = record_started(cfg_.state_dir, *run_.vmm_info, *sess->started_at(), cfg_.session.wall_timeout); !r)
      say("neshost monitor: VM {}: {} (a replacement would not know the VM's start or deadline)\n", id,
          r.error().message);
}

/// Starts the VMM (booted, or with --snapshot restored before the Host hears of it) and tells the
/// Host vm_started. If it cannot start: says why and ends the session (vm_started, vm_exited: no
/// `ready`, 125). Then watches its exit and each daemon's.
void Monitor::start_vmm(host::Host& h, const std::string& id) {
  auto console = run_.console;
  vm::VmmLaunch lo;
  lo.gate = record_gate(plan_, run_, "");  // -d: QEMU outlives us (recorded in vmm.json before it runs)
  lo.netns_fd = run_.netns_fd;            // --network netns: QEMU runs in the namespace, opens its tap there
  lo.argv = argv_;
  lo.console = [console](std::string_view b) { console->write(b); };
  lo.diagnostics = [](std::string_view b) { cli::put_bounded(2, b, 1s); };
  // --network passt: QEMU's end of passt's socket, at the number its -netdev names.
  if (run_.passt) lo.fds = {{run_.passt->qemu_fd(), vm::kPasstChildFd}};
  if (run_.snapshot_ram) lo.fds.emplace_back(run_.snapshot_ram.get(), cli::kRamChildFd);
  // --snapshot: the saved state loaded, the shares and the NIC plugged in, then `cont`. A restore
  // that fails ends QEMU before the Host takes its channel (the saved `ready` is never taken): the
  // session ends without one, 125.
  std::optional<vm::VmmRestore> r;
  if (plan_.snapshot)
    r = vm::VmmRestore{*plan_.qemu->qmp_socket, plan_.snapshot->qemu_version, &run_.snapshot_state,
                       plan_.hotplug_shares, plan_.hotplug_nic,
                       [this](host::Error e) { return cli::snapshot_refusal(plan_.snapshot_ref, std::move(e)); }};
  auto p = r ? vm::Vmm::restore(io_, std::move(lo), *r) : vm::Vmm::boot(io_, std::move(lo));
  if (run_.passt) run_.passt->close_qemu_fd();  // QEMU holds it now: passt sees QEMU go
  if (!p) {
    say("neshost run: {}\n", p.error().message);
    if (plan_.snapshot) console->finish();
    (void)h.vm_started(id);  // the session then ends as no_ready (125) through vm_exited
    (void)h.vm_exited(id);
    return;
  }
  vmm_ = std::move(*p);
  (void)h.vm_started(id);
  watch_daemons(h, id);
  watch_vmm_exit(h, id, plan_.console);
}

/// A replacement monitor: the VMM it took over (run.adopted), watched as one we started, and so
/// are its helper daemons (the dead monitor's children, by identity: daemon_watch.hpp), whose
/// death ends the VM as the first monitor's would.
void Monitor::adopt_vmm(host::Host& h, const std::string& id) {
  vmm_ = vm::Vmm::adopt(io_, std::move(run_.adopted));
  (void)h.vm_started(id);
  for (const auto& d : run_.adopted_daemons)
    adopted_watch_.watch(d, [this, &h, id](const host::VmmDaemon& gone, bool already) {
      const std::string tag = share_tag_of(gone);
      const char* how = already ? "was gone at the takeover" : "exited";
      end_for_daemon(h, id,
                     tag.empty() ? fmt::format("{} (pid {}) {} while the guest ran: the VM lost its network",
                                               gone.name, gone.id.pid, how)
                                 : fmt::format("share '{}': virtiofsd (pid {}) {} while the guest ran", tag,
                                               gone.id.pid, how));
    });
  watch_vmm_exit(h, id, false);
}

/// A helper daemon the guest needs died while it runs (and before its outcome): the VM is ended
/// in order (the workload's stop, grace, shutdown), the cause recorded first in stop.json, so the
/// VM reconciles as "stopped by its monitor: CAUSE".
void Monitor::end_for_daemon(host::Host& h, const std::string& id, const std::string& why) {
  // Its exit after QEMU's is the normal end. QEMU's fds (the daemon's socket) close a moment
  // before its pidfd turns readable, so a daemon that exits on that EOF can be seen first: a
  // QEMU that is ending is given a bounded moment, never recorded as "stopped by its monitor".
  if (!vmm_ || vmm_->exited_within(kDaemonVsQemuExit)) return;
  if (auto* sess = h.session(id); !sess || sess->outcome()) return;
  if (auto r = host::persist_stop(cfg_.state_dir, id, cfg_.session.generation, why); !r)
    say("neshost monitor: VM {}: recording why it ends: {}\n", id, r.error().message);
  say("neshost run: {}; shutting the VM down\n", why);
  (void)h.shutdown(id);
}

/// Each virtiofsd's death while QEMU runs leaves the guest's requests on that share unanswered
/// (QEMU's vhost-user-fs does not reconnect); passt's leaves it without its network for good (QEMU
/// holds passt's socket as an inherited fd: no redial). Either ends the VM in order.
void Monitor::watch_daemons(host::Host& h, const std::string& id) {
  for (auto& d : run_.daemons) {
    auto& w = daemon_watch_.emplace_back(io_, ::fcntl(d->pidfd(), F_DUPFD_CLOEXEC, 3));
    w.async_wait(asio::posix::stream_descriptor::wait_read, [this, &h, id, dp = d.get()](boost::system::error_code ec) {
      if (ec) return;  // its exit after QEMU's, or once the outcome is in, is the normal end
      auto e = dp->exited();
      end_for_daemon(h, id, fmt::format("share '{}' ({}): virtiofsd {} while the guest ran", dp->share().tag,
                                        dp->share().dir.string(), e ? vm::describe(*e) : "exited"));
    });
  }
  if (vm::Passt* passt = run_.passt.get()) {
    auto& w = daemon_watch_.emplace_back(io_, ::fcntl(passt->pidfd(), F_DUPFD_CLOEXEC, 3));
    w.async_wait(asio::posix::stream_descriptor::wait_read, [this, &h, id, passt](boost::system::error_code ec) {
      if (ec) return;
      auto e = passt->exited();
      std::string why = passt->last_words();
      end_for_daemon(h, id, fmt::format("passt {} while the guest ran: the VM lost its network{}{}",
                                        e ? vm::describe(*e) : "exited", why.empty() ? "" : ": ", why));
    });
  }
}

/// QEMU's exit: reaped and its console drained to EOF (so every line precedes our exit), then the
/// library told (`show`: said on stderr).
void Monitor::watch_vmm_exit(host::Host& h, const std::string& id, bool show) {
  vmm_->watch_exit([&h, id, console = run_.console, show](std::optional<vm::ProcessExit> e) {
    if (e && show) say("neshost: qemu {}\n", vm::describe(*e));
    console->finish();
    (void)h.vm_exited(id);
  });
}

/// Drops the VMM's watches and the VMM (after Vmm::stop()).
void Monitor::stop_vmm() {
  if (vmm_) vmm_->stop_watching();
  daemon_watch_.clear();
  adopted_watch_.clear();
  vmm_.reset();
}

}  // namespace nes::monitor
