// The I/O of the ordered shutdown. The *order* (workload's SIGTERM, grace, SIGKILL; everyone
// else's SIGTERM, grace, SIGKILL; the ack) is decided by the session (session.hpp); this file
// sends the signals and performs the final act: unmount, (guest) sync and remount / read-only,
// reboot(2). The final act never returns.
#pragma once

#include <sys/types.h>

#include "base/result.hpp"
#include "config.hpp"
#include "log.hpp"
#include "mounts.hpp"
#include "protocol/messages.hpp"
#include "reaper.hpp"

namespace nes::init {

/// kill(-pgid, signo) for the workload's process group. An error carries kill(2)'s errno (ESRCH
/// when the group is gone is normal); a pgid <= 1 is EINVAL, nothing sent.
base::Status signal_group(pid_t pgid, int signo);

/// kill(-1, signo): every process but the caller. Refused (EPERM, nothing sent) unless the caller
/// is PID 1 of its namespace: from anywhere else kill(-1) would reach the whole machine.
base::Status signal_all(int signo);

/// The reboot(2) command for a halt: RB_POWER_OFF or RB_AUTOBOOT.
int reboot_cmd(proto::Halt h);

/// The final act. guest: sync, unmount shares in reverse, remount / read-only (a lazy detach for
/// what stays busy), sync again, reboot(cmd). sandbox: unmount our own shares, reboot(cmd), which
/// ends only the pid namespace (its init dies of SIGINT for power-off, SIGHUP for reboot).
/// If reboot returns, PID 1 must not exit: it logs and waits forever, reaping.
/// Refuses (logs, waits forever) if the mode and the pid namespace disagree.
[[noreturn]] void final_act(Mode mode, Shares& shares, proto::Halt halt, Reaper& reaper, const Log& log);

}  // namespace nes::init
