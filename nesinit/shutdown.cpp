#include "shutdown.hpp"

#include <sys/mount.h>
#include <sys/reboot.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

namespace nes::init {

base::Status signal_group(pid_t pgid, int signo) {
  if (pgid <= 1) return base::errno_error(EINVAL);  // never kill(0) or kill(-1) by accident
  if (::kill(-pgid, signo) != 0) return base::errno_error(errno);
  return base::Ok{};
}

base::Status signal_all(int signo) {
  if (::getpid() != 1) return base::errno_error(EPERM);
  if (::kill(-1, signo) != 0) return base::errno_error(errno);
  return base::Ok{};
}

int reboot_cmd(proto::Halt h) { return h == proto::Halt::reboot ? RB_AUTOBOOT : RB_POWER_OFF; }

namespace {
[[noreturn]] void wait_forever(Reaper& reaper, const Log& log) {
  log.error("halt", "cannot end; waiting forever (PID 1 must not exit)");
  sigset_t all;
  sigfillset(&all);
  for (;;) {
    int sig = 0;
    ::sigwait(&all, &sig);
    if (sig == SIGCHLD) reaper.reap();
  }
}
}  // namespace

void final_act(Mode mode, Shares& shares, proto::Halt halt, Reaper& reaper, const Log& log) {
  // Defence in depth: the mode was decided at start; check again before anything machine-wide.
  const auto ino = ns_inode("pid");
  const bool initial_ns = ino && *ino == kInitialPidNsInode;
  // An unknown inode (someone unmounted /proc) trusts the start-up decision; a known one must
  // agree with it.
  if (::getpid() != 1 || mode == Mode::not_pid1 || (ino && (mode == Mode::guest) != initial_ns)) {
    log.error("halt", "mode {} does not match pid {} / pid namespace; refusing to halt",
              to_string(mode), ::getpid());
    wait_forever(reaper, log);
  }
  if (mode == Mode::guest) {
    ::sync();
    int left = shares.unmount_all(log);
    if (::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0)
      log.info("remount", "/ read-only");
    else
      log.warn("remount", "/ read-only: {}", std::strerror(errno));
    if (left) log.warn("unmount", "{} share(s) could not be unmounted", left);
    ::sync();
  } else {
    // A sandbox shares the machine's file systems: no sync(2) of the whole machine; only our own
    // mounts are removed (the namespace's end would drop them anyway, but in order is clearer).
    shares.unmount_all(log);
  }
  log.info(halt == proto::Halt::reboot ? "reboot" : "poweroff", "reboot({})",
           halt == proto::Halt::reboot ? "RB_AUTOBOOT" : "RB_POWER_OFF");
  ::reboot(reboot_cmd(halt));
  log.error("halt", "reboot: {}", std::strerror(errno));
  wait_forever(reaper, log);
}

}  // namespace nes::init
