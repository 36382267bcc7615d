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
/// With `root.ro` the share is not mounted on kNewRoot itself but as the lower layer of an
/// overlay whose upper layer is a tmpfs (stage_read_only): the mount points the init makes for
/// /dev, /proc, /sys, /run, /tmp, the shares and the files bound over /etc land in memory, never
/// in the host's directory (docker's --read-only over a plain root). seal_read_only("/") then
/// makes it read-only once the shares and the network are in place, before the workload runs.
/// A block root (fs erofs or ext4, docs/protocol.md "Block roots"): the disk whose virtio-blk
/// serial is `root.tag` (block.hpp) mounted read-only is the lower layer of an overlay whose upper
/// is a tmpfs capped at `root.upper_mib` or the scratch disk of serial `root.upper`, always (not
/// only with `ro`); the overlay is the new root.
MountStatus switch_root(const proto::Root& root, const Log& log);

/// Where a read-only root's share and its tmpfs wait below the overlay (directories of the
/// initramfs; detached once the overlay holds them).
inline constexpr const char* kRootLower = "/nesinit.lower";
inline constexpr const char* kRootUpper = "/nesinit.upper";

/// Mounts on `target` an overlay of `lower` (a directory, read-only to us) under a fresh tmpfs
/// mounted on `upper` (`size=` `upper_mib` MiB when not 0), or with `upper_dev` that device's
/// ext4 read-write (a block root's scratch disk); its layers are `upper`/u and `upper`/w (made
/// if missing: a scratch disk keeps them), the overlay's root taking the mode and owner of
/// `lower`'s when u is new. Writes to `target` land in the upper until seal_read_only(). Errors:
/// the step that failed ("mount tmpfs", "mount overlay", ...) with its errno.
base::Status stage_read_only(const std::string& lower, const std::string& upper, const std::string& target,
                             std::uint32_t upper_mib = 0, const std::string& upper_dev = {});

/// Makes the mount on `at` read-only (a bind remount: MS_RDONLY on that mount alone; the mounts
/// on top of it keep their own flags). Errors: mount(2)'s errno.
base::Status seal_read_only(const std::string& at);

}  // namespace nes::init
