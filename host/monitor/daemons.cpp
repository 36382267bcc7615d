// The helper daemons beside the VMM (host/monitor/daemons.hpp).
#include "host/monitor/daemons.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "host/lib/state_dir.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/monitor/say.hpp"

#ifndef NESHOST_DEFAULT_PASST
#define NESHOST_DEFAULT_PASST "passt"
#endif

namespace nes::monitor {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using cli::RunPlan;
using cli::ServeConfig;
using cli::put_bounded;

std::string passt_program() {
  if (const char* s = std::getenv("NESHOST_PASST"); s && *s) return s;
  std::error_code ec;
  if (std::string_view(NESHOST_DEFAULT_PASST) != "passt" && fs::exists(NESHOST_DEFAULT_PASST, ec))
    return NESHOST_DEFAULT_PASST;
  return "passt";
}

host::Status start_daemons(const RunPlan& plan, VmResources& run) {
  const ServeConfig& cfg = plan.serve;
  const std::string& vmid = plan.vm;
  for (vm::VirtiofsdOptions vo : plan.daemons) {
    const auto& sh = vo.share;
    vo.log = host::vm_path(cfg.state_dir, vmid, host::virtiofsd_log_name(sh.tag));
    vo.outlive = plan.vmm_survives;
    vo.before_exec = record_gate(plan, run, "virtiofsd " + sh.tag);
    auto d = vm::Virtiofsd::start(vo, 10s);
    if (!d) return d.error();
    if (plan.console)
      say("neshost: virtiofsd pid {} serves {} as {}{}\n", (*d)->pid(), sh.dir.string(), sh.tag,
          sh.ro ? " (ro)" : "");
    run.daemons.push_back(std::move(*d));
  }
  return host::Ok{};
}

host::Status start_passt(const RunPlan& plan, VmResources& run) {
  if (!plan.passt) return host::Ok{};
  vm::PasstOptions po;
  po.program = passt_program();
  po.network = plan.network;
  // As root, passt drops to `nobody`, which must reach its PID file's directory: /tmp (a private
  // $TMPDIR such as the tests' is not searchable by others). Otherwise it runs as us.
  const char* t = std::getenv("TMPDIR");
  po.tmp_dir = ::geteuid() != 0 && t && *t == '/' ? t : "/tmp";
  po.outlive = plan.vmm_survives;
  auto p = vm::Passt::start(po, 10s);
  if (!p) return host::Error{"--network passt: " + p.error().message};
  if (plan.console) say("neshost: passt pid {} serves the VM's network\n", (*p)->pid());
  run.passt = std::move(*p);
  return host::Ok{};
}

void reap_daemons(const RunPlan& plan, VmResources& run) {
  if (run.passt) {
    auto e = run.passt->stop(2s);
    if (plan.console) say("neshost: passt {}\n", vm::describe(e));
    run.passt.reset();
  }
  for (auto& d : run.daemons) {
    auto e = d->stop(2s);
    if (plan.console) say("neshost: virtiofsd {} {}\n", d->share().tag, vm::describe(e));
  }
  run.daemons.clear();
  // A replacement monitor's: the dead monitor's children, ended by identity (no exit status to
  // read: they are not ours). Each exits by itself once QEMU has gone.
  for (const auto& d : run.adopted_daemons) {
    host::Fd pidfd = host::pin_process(d.id);
    if (!pidfd) continue;
    pollfd pf{pidfd.get(), POLLIN, 0};
    if (::poll(&pf, 1, 2000) == 0) {
      ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGTERM, nullptr, 0);
      if (::poll(&pf, 1, 1000) == 0) ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
    }
    if (plan.console) say("neshost: {} (pid {}) ended\n", d.name, d.id.pid);
  }
  run.adopted_daemons.clear();
}

}  // namespace nes::monitor
