// The helper daemons a monitor runs beside its VMM: one virtiofsd per share and passt for
// `--network user` (docs/vm.md "Shares", "Network"), started before QEMU and reaped after it.
#pragma once

#include <string>

#include "host/cli/plan.hpp"
#include "host/lib/base.hpp"
#include "host/monitor/vm_state.hpp"

namespace nes::monitor {

/// The passt to run (`--network user`): $NESHOST_PASST, else the one scripts/fetch-passt.sh
/// provided when there is one (a source build), else `passt` in PATH.
std::string passt_program();

/// --network passt: passt, first of all (before the state dir: one that cannot start, e.g. a port
/// taken since it was checked, leaves nothing behind) and so before QEMU, which gets its socket's
/// other end. Its output is kept until open_vm_state() gives it its log next to console.log; it
/// dies with us (unless plan.vmm_survives) and exits by itself once QEMU has gone. Bounded (10 s).
/// Error: "--network passt: WHY".
host::Status start_passt(const cli::RunPlan& plan, VmResources& run);

/// One virtiofsd per share, before QEMU: each creates the socket its QEMU device connects to.
/// Their logs sit next to console.log; they die with us (unless plan.vmm_survives, then each is
/// recorded by its gate) and exit by themselves once QEMU has gone. Each bounded (10 s).
host::Status start_daemons(const cli::RunPlan& plan, VmResources& run);

/// QEMU is gone, so each virtiofsd (and passt) has lost its client and is exiting: reaped
/// (bounded, 2 s each, then killed); a replacement's adopted daemons ended by identity.
void reap_daemons(const cli::RunPlan& plan, VmResources& run);

}  // namespace nes::monitor
