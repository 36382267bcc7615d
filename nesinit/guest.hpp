// Guest-mode bring-up: what a kernel hands PID 1 is a bare root file system. Only ever called in
// guest mode (PID 1 of the initial pid namespace).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/result.hpp"
#include "log.hpp"
#include "protocol/messages.hpp"

namespace nes::init {

/// devtmpfs on /dev (if /dev is not a mount point yet), then fds 0-2 on /dev/console (O_NOCTTY;
/// /dev/null if there is no console) for whichever of them are closed. Call before opening
/// anything else, so no other file lands on fds 0-2.
void guest_early(const Log& log);

/// proc, sysfs, devpts, /dev/shm, /run (tmpfs), cgroup2 on /sys/fs/cgroup, each only if not
/// already mounted; `lo` up; reboot(RB_DISABLE_CAD) so Ctrl-Alt-Del arrives as SIGINT.
void guest_mounts_and_net(const Log& log);

/// Parse a modules list: one path per line; blank lines and '#' comments skipped, surrounding
/// blanks trimmed.
std::vector<std::string> parse_modules_list(std::string_view text);

/// Load modules with finit_module, in order: with `only` unset, those listed in `dir`/modules (if
/// present); else, for each name, those in `dir`/modules.d/NAME (the module after its
/// dependencies), each path once. A name without its group file (an initramfs from an older
/// nesinit-mkinitrd) falls back to the whole list. EEXIST (already loaded or built in) is fine;
/// other failures are logged and loading goes on. A kernel without module support (no
/// `proc_modules`, /proc/modules) loads none. Returns the number that failed.
int load_modules(const Log& log, const std::optional<std::vector<std::string>>& only = std::nullopt,
                 const std::string& dir = "/etc/nesinit", const char* proc_modules = "/proc/modules");

/// How far the guest's CLOCK_REALTIME may be from boot.realtime_ns before seed() steps it: ns.
/// A restored snapshot's clock is the moment it was saved; a fresh boot's is the host's RTC.
inline constexpr std::int64_t kClockStepNs = 1000000000;

/// act::Seed: `entropy` into the kernel's pool with RNDADDENTROPY (all its bits credited), then
/// RNDRESEEDCRNG so the CRNG is reseeded now (a restored VM's is a copy of every other clone's);
/// CLOCK_REALTIME set to `realtime_ns` if it is more than kClockStepNs off. Each failure is a
/// warning, never fatal.
void seed(const std::optional<proto::Entropy>& entropy, const std::optional<std::uint64_t>& realtime_ns,
          const Log& log);

/// Bring `lo` up (SIOCSIFFLAGS IFF_UP); the kernel assigns 127.0.0.1/8. An error names the
/// call that failed, with its errno.
base::Status loopback_up();

}  // namespace nes::init
