// `neshost monitor`: the re-adoption entry (docs/host.md "Re-adoption"). Its flags and help are
// the CLI's; its body, taking the VM over and serving it, is the monitor's (Monitor::take_over,
// host/monitor/takeover.cpp).
#include <fcntl.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/lib/state_dir.hpp"
#include "host/monitor/vm_monitor.hpp"

namespace nes::cli {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kMonitorHelp = R"(usage: neshost monitor [--state DIR] [--notify-fd N] VM

Take over a detached VM whose monitor is gone while its QEMU (or sandbox) runs on: neshost itself
starts this (host/monitor/adopt.hpp) when any command (ps, inspect, wait, logs, exec, stop, kill,
top, rm) finds the VM so; there is no need to run it by hand. It takes the generation over
(monitor.json names it from then on), listens where the VM's chardevs redial, resumes the
lifecycle session (the guest's resumed `ready`: docs/protocol.md "Channel survival"), serves the
control socket, records the outcome once, applies on_exit and powers the VM down in order, as the
monitor it replaces would have. Its messages go to STATE/VM/monitor.log.
Exit 0 without doing anything when there is nothing to take over (another replacement won the
race, the VM has ended, its VMM is gone); else the outcome's exit status, as `neshost run`.
  --notify-fd N   write one line to fd N once the VM is taken over (or why not), then close it
)";

int monitor_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}, {"notify-fd"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("monitor", p.error().message);
  if (p->help) {
    fmt::print("{}", kMonitorHelp);
    return 0;
  }
  if (p->positional.size() != 1) return usage_error("monitor", "exactly one VM is required");
  const std::string vm = p->positional[0];
  if (auto id = host::check_vm_id(vm); !id) return usage_error("monitor", "VM: " + id.error().message);
  const fs::path state = p->has("state") ? fs::path(*p->get("state")) : default_state_dir();
  host::Fd notify;
  if (auto n = p->get("notify-fd")) {
    auto fd = parse_uint("notify-fd", *n, 3, 1023);
    if (!fd) return usage_error("monitor", fd.error().message);
    if (::fcntl(static_cast<int>(*fd), F_SETFD, FD_CLOEXEC) == 0) notify.reset(static_cast<int>(*fd));
  }
  return monitor::Monitor::take_over(state, vm, std::move(notify));
}

const Registrar monitor_reg{{"monitor", "take over a detached VM whose monitor died (started by neshost itself)",
                             monitor_main}};

}  // namespace
}  // namespace nes::cli
