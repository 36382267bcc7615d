// A pod's container's mounts (issue 48; docs/containerd.md "Mounts in a pod"): each bind of a
// host directory or file is carried into the pod's VM through the pod's one share, as Kata
// carries a sandbox's volumes through one shared directory: the shim binds the source on
// `<share>/<container dir>/m<N>` (the read-only view the guest sees at /run/nes/pod; the bind
// propagates to the share's virtiofsd, whose mount namespace is a slave of the view), and the
// guest's init binds `/run/nes/pod/<container dir>/m<N>` at the spec's destination in the
// container's mount namespace with the spec's flags. No virtiofsd per volume, no copy: a write
// is the host file's at once, both ways, so a volume shared by two containers is shared, the
// kubelet reads /dev/termination-log from its own file, and a directory bind shows the kubelet's
// atomic `..data` rename of a token directory. A tmpfs (not met by the guest's own) is a guest
// tmpfs. CRI's /etc/hosts, /etc/resolv.conf, /etc/hostname are the VM's own (the guest binds them).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"
#include "host/shim/oci_spec.hpp"
#include "protocol/messages.hpp"

namespace nes::shim {

/// Whether a pod's container's bind `v` is carried through the pod's share (every bind but CRI's
/// /etc/hosts, /etc/resolv.conf and /etc/hostname, which the guest gives from the VM's own).
bool carried(const Volume& v);

/// Binds each carried volume of `sp` (in order, the N-th as `m<N>`) on `<share>/<dir>/m<N>`:
/// its mount point made in the shim's own directory (pod_share_real: an empty directory, or an
/// empty file for a file), the bind recursive for `rbind`, remounted with `ro`, `nosuid`,
/// `nodev`, `noexec` (so the host enforces `ro` too). Errors name the destination, the source and
/// the errno ("mounts (destination /data): bind /srv/x on …: No such file or directory"); what
/// was made stays for unmount_pod_volumes.
host::Status mount_pod_volumes(const std::filesystem::path& share, const std::string& dir, const TaskSpec& sp);

/// Unmounts every `m<N>` under `<share>/<dir>` (MNT_DETACH, never through a symlink) and removes
/// its mount point from the shim's own directory. Idempotent; never fails (`shim delete` too).
void unmount_pod_volumes(const std::filesystem::path& share, const std::string& dir);

/// The container's mounts as the guest makes them (exec.container.mounts): each carried volume
/// a bind of `<guest_dir>/m<N>` (guest_dir: the container's directory in the guest's share,
/// /run/nes/pod/<dir>), each tmpfs a tmpfs; ordered as containerd's CRI orders a container's
/// mounts (by the number of components of the destination, stably), so a mount inside another
/// comes after it.
std::vector<proto::ContainerMount> pod_guest_mounts(const TaskSpec& sp, std::string_view guest_dir);

}  // namespace nes::shim
