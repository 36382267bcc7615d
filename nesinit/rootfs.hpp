// A share as the root file system: the init mounts it and switches root into it, as an
// initramfs's switch_root does, so the workload (and the init itself) see the share as `/`
// (docs/vm.md "A host directory as root").
#pragma once

#include "log.hpp"
#include "mounts.hpp"
#include "protocol/messages.hpp"

namespace nes::init {

/// Where the root share is mounted before the switch (a directory in the initramfs).
inline constexpr const char* kNewRoot = "/nesinit.root";

/// Mounts `root` (virtiofs or 9p, ro if asked; suid and device files allowed: it is a whole
/// userland) on kNewRoot; moves the init's /dev, /proc, /sys and /run mounts (with everything
/// under them) into it, creating their mount points if missing; mounts a fresh tmpfs (1777) on its
/// /tmp; then makes it `/` (chdir, MS_MOVE onto /, chroot). Only for a guest's PID 1 on its
/// initramfs: call before any other share is mounted. On failure returns a MountFailed naming the
/// root's tag and the step, with errno; a failure before the final move leaves `/` as it was.
MountStatus switch_root(const proto::Root& root, const Log& log);

}  // namespace nes::init
