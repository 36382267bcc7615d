// A read-only root's mount points, made before the VM starts, as runc makes them before it
// remounts a container's root read-only. CRI runs every pod sandbox with `root.readonly`, and
// Kubernetes' pause image holds `/pause` alone: without this the guest's init could not mount
// /dev, /proc, /sys, /run or the binds over /etc files in that root (docs/containerd.md "Pods").
#pragma once

#include <filesystem>
#include <vector>

#include "host/lib/base.hpp"
#include "host/shim/oci_spec.hpp"

namespace nes::shim {

/// Creates in `root` (a directory of the host: the task's writable rootfs before the VM makes it
/// read-only) what the guest's init mounts over: the directories /dev, /proc, /sys, /run, /tmp
/// and /etc, the empty files /etc/hosts, /etc/resolv.conf and /etc/hostname, and each volume's
/// guest path (its parents as directories; the path an empty file when the volume's host side is
/// a file, else a directory), each only if missing (mode 0755, files 0644). Never follows a
/// symlink nor leaves `root`: a component that is a symlink or not a directory is left as it is
/// (the guest then reports what it cannot mount). Errors: the first mkdirat/openat that fails for
/// another reason, naming the path and errno, e.g. "root mount point /etc/hosts: Read-only file
/// system".
host::Status make_mount_points(const std::filesystem::path& root, const std::vector<Volume>& volumes);

}  // namespace nes::shim
