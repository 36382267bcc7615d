// What a task makes outside its record and how it goes (host/shim/task_service.hpp): the rootfs
// mount Create makes, a pod's share (a read-only view `<bundle>/nesinit-pod` of the shim's own
// `<bundle>/nesinit-pod.d`, the guest's /run/nes/pod) and each pod container's rootfs under it,
// the VM's VMM that outlives `neshost run`, and the removal of all of it (Delete, `shim delete`).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

#include "containerd_pb.h"
#include "host/lib/base.hpp"
#include "host/shim/task_record.hpp"

namespace nes::shim {

/// A pod's share in the sandbox's bundle, and where the guest mounts it.
inline constexpr const char* kPodShareDir = "nesinit-pod";
inline constexpr std::string_view kPodShareGuest = "/run/nes/pod";

/// `pid`'s start time (/proc/PID/stat field 22), nullopt when it is gone.
std::optional<unsigned long long> start_time(pid_t pid);
/// Whether `pid` runs and is the process that started at `start` (a recycled pid is not).
bool same_process_alive(pid_t pid, unsigned long long start);

/// mount(2) of one containerd rootfs mount (types.Mount: type, source, options as fstab
/// options) on `target`; a bind with per-mount flags remounted so they hold. Errors name the
/// source, the target and the errno.
host::Status mount_rootfs(const containerd::types::Mount& m, const std::filesystem::path& target);

/// The shim's own directory behind the pod's share `share` (`under` it: the same path there).
std::filesystem::path pod_share_real(const std::filesystem::path& share, const std::filesystem::path& under = {});

/// Makes the pod's share `share`: a bind of pod_share_real(share) on it, made private then
/// shared (the containers' rootfs mounted under it later reach virtiofsd's mount namespace) and
/// read-only. Errors: the mkdir's or mount's errno (the caller removes what was made).
host::Status make_pod_share(const std::filesystem::path& share);

/// The VM's VMM (QEMU and its daemons, vmm.json) SIGKILLed by their recorded identities and its
/// private runtime dir removed: the task ends whatever its monitor does.
void kill_vmm(const TaskRecord& r);

/// A deleted task leaves nothing: its rootfs mount, a pod's share (a container: its rootfs
/// there and its mount point), the VM's state dir (not a container's: the sandbox's), the exec
/// journal and the record.
void remove_task(const std::filesystem::path& bundle, const TaskRecord& r);

/// The VM's durable outcome, when it recorded one, as the task's exit status and time
/// (host::reported_status: 125 when output was lost), each loss a warning in the shim's log.
void apply_recorded_exit(const TaskRecord& r, std::uint32_t& status, std::int64_t& at_ns);

}  // namespace nes::shim
