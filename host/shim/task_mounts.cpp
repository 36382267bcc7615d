// Mounts, the VMM and the removal of a task (host/shim/task_mounts.hpp), and `shim delete`
// (host/shim/task_service.hpp cleanup_task).
#include "host/shim/task_mounts.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "host/lib/record.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/monitor/vmm_record.hpp"
#include "host/shim/exec_journal.hpp"
#include "host/shim/identity.hpp"
#include "host/shim/log.hpp"
#include "host/shim/pod_mounts.hpp"
#include "host/shim/process.hpp"
#include "host/shim/task_service.hpp"

namespace nes::shim {
namespace fs = std::filesystem;
using host::Error;
using host::Fd;

std::optional<unsigned long long> start_time(pid_t pid) {
  auto id = host::identity_of(pid);
  if (!id) return std::nullopt;
  return id->start_time;
}

bool same_process_alive(pid_t pid, unsigned long long start) {
  if (pid <= 0) return false;
  auto st = start_time(pid);
  return st && *st == start;
}

// mount(2) of one containerd rootfs mount (types.Mount: type, source, options as fstab options).
host::Status mount_rootfs(const containerd::types::Mount& m, const fs::path& target) {
  unsigned long flags = 0;
  std::string data;
  for (const auto& o : m.options()) {
    if (o == "ro") flags |= MS_RDONLY;
    else if (o == "rw") {}
    else if (o == "bind") flags |= MS_BIND;
    else if (o == "rbind") flags |= MS_BIND | MS_REC;
    else if (o == "nosuid") flags |= MS_NOSUID;
    else if (o == "nodev") flags |= MS_NODEV;
    else if (o == "noexec") flags |= MS_NOEXEC;
    else if (o == "noatime") flags |= MS_NOATIME;
    else if (o == "relatime") flags |= MS_RELATIME;
    else if (o == "strictatime") flags |= MS_STRICTATIME;
    else if (o == "private" || o == "rprivate" || o == "slave" || o == "rslave" || o == "shared" ||
             o == "rshared") {}  // propagation: the shim's mount namespace decides, nothing to pass
    else data += (data.empty() ? "" : ",") + o;
  }
  std::string type = m.type() == "bind" ? std::string() : m.type();
  if (::mount(m.source().c_str(), target.c_str(), type.empty() ? nullptr : type.c_str(), flags,
              data.empty() ? nullptr : data.c_str()) != 0)
    return Error{fmt::format("rootfs: mount {} ({}) on {}: {}", m.source(), m.type(), target.string(), std::strerror(errno))};
  // A bind mount ignores MS_RDONLY (and the other per-mount flags) until it is remounted.
  if ((flags & MS_BIND) && (flags & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)) &&
      ::mount(nullptr, target.c_str(), nullptr, MS_REMOUNT | MS_BIND | (flags & ~MS_REC), nullptr) != 0) {
    int e = errno;
    ::umount2(target.c_str(), MNT_DETACH);
    return Error{fmt::format("rootfs: remount {} read-only: {}", target.string(), std::strerror(e))};
  }
  return host::Ok{};
}

// What Create mounted on <bundle>/rootfs, if anything, unmounted.
static void unmount_rootfs(const fs::path& bundle, const TaskRecord& r) {
  if (r.mounted_rootfs) ::umount2((bundle / "rootfs").c_str(), MNT_DETACH);
}

// The VM's VMM (QEMU and its daemons), which outlives `neshost run` (--vmm-outlives): SIGKILLed by
// its recorded identity (vmm.json) when the task must end whatever its monitor does; its runtime
// dir removed.
void kill_vmm(const TaskRecord& r) {
  auto v = host::load_vmm(r.state_dir, r.vm);
  if (!v || !*v) return;
  std::vector<host::ProcessIdentity> ids;
  if ((*v)->vmm) ids.push_back(*(*v)->vmm);
  for (const auto& d : (*v)->daemons) ids.push_back(d.id);
  for (const auto& id : ids) {
    Fd pidfd{static_cast<int>(::syscall(SYS_pidfd_open, id.pid, 0))};
    if (pidfd && host::is_alive(id)) ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
  }
  // The VM's private runtime dir ($TMPDIR/neshost-XXXXXX: its sockets, a generated initramfs):
  // its monitor, killed, cannot remove it. Only a path of that shape is removed.
  const fs::path& rt = (*v)->runtime_dir;
  std::error_code ec;
  if (rt.is_absolute() && rt.filename().string().starts_with("neshost-")) fs::remove_all(rt, ec);
}

// Removes the directories of `dir` that are empty once their subdirectories are (the mount
// points a pod's share held), deepest first. Never unlinks a file: whatever is still mounted or
// holds data stays.
static void remove_empty_dirs(const fs::path& dir) {
  struct statx sx {};
  // Still a mount (the unmount failed, or another one is there): nothing under it is ours.
  if (::statx(AT_FDCWD, dir.c_str(), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx) != 0 ||
      (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT & sx.stx_attributes))
    return;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_directory(ec) && !it->is_symlink(ec)) remove_empty_dirs(it->path());
  ::rmdir(dir.c_str());
}

// The pod's share is a read-only view (`<bundle>/nesinit-pod`, what the guest gets) of a
// directory only the shim writes (`<bundle>/nesinit-pod.d`): no guest can rename or replace a
// path the shim later unmounts or removes (the containers' rootfs, mounted on the view, stay
// writable: a mount's flags are its own). `under` the share -> the same path under the
// shim's directory.
fs::path pod_share_real(const fs::path& share, const fs::path& under) {
  return under.empty() ? fs::path(share.string() + ".d") : fs::path(share.string() + ".d") / under;
}

// The pod's share (`container` false: the view and the shim's directory) or a container's
// rootfs in it (`at` its mount point in the view), unmounted with everything under it
// (MNT_DETACH: recursive, a busy one goes once released; never through a symlink) and the mount
// points removed from the shim's directory.
static void unmount_pod_share(const fs::path& at, bool container) {
  if (at.empty()) return;
  ::umount2(at.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
  if (container) {
    const fs::path share = at.parent_path().parent_path();
    unmount_pod_volumes(share, at.parent_path().filename().string());  // its volumes beside it
    const fs::path real = pod_share_real(share, at.lexically_relative(share));
    ::rmdir(real.c_str());
    ::rmdir(real.parent_path().c_str());
  } else {
    remove_empty_dirs(pod_share_real(at));
    ::rmdir(at.c_str());
  }
}

// A deleted task leaves nothing: its rootfs mount, the VM's state, the task file. A container's
// leaves its rootfs mount point in the pod's share (its parent, named for the container) too.
void remove_task(const fs::path& bundle, const TaskRecord& r) {
  unmount_rootfs(bundle, r);
  std::error_code ec;
  unmount_pod_share(r.pod_share, r.container);
  if (!r.container) fs::remove_all(r.state_dir, ec);
  fs::remove(bundle / kExecJournalFile, ec);
  fs::remove(bundle / kTaskFile, ec);
}

// The VM's durable outcome, when it recorded one, is the task's exit status and time: the
// status `neshost run` exits with (host::reported_status: 125 when the workload's output was lost
// on its way to containerd's FIFOs), and each loss is a warning in the shim's log naming the task.
void apply_recorded_exit(const TaskRecord& r, std::uint32_t& status, std::int64_t& at_ns) {
  if (auto o = host::read_record(r.state_dir, r.vm); o && *o) {
    status = static_cast<std::uint32_t>(host::reported_status(**o));
    at_ns = (*o)->finished_at.time_since_epoch().count();
    for (const auto& l : host::describe_loss(**o))
      log("warning: task {}: {} (exit status {} instead of {})", r.id, l,
                 status, (*o)->exit_status);
  }
}

host::Status make_pod_share(const fs::path& share) {
  std::error_code ec;
  const fs::path real = pod_share_real(share);
  fs::create_directories(real, ec);
  if (!ec) fs::create_directories(share, ec);
  if (ec) return Error{ec.message()};
  const char* at = share.c_str();
  if (::mount(real.c_str(), at, nullptr, MS_BIND, nullptr) != 0 || ::mount(nullptr, at, nullptr, MS_PRIVATE, nullptr) != 0 ||
      ::mount(nullptr, at, nullptr, MS_SHARED, nullptr) != 0 ||
      ::mount(nullptr, at, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0)
    return Error{std::strerror(errno)};
  return host::Ok{};
}

Cleanup cleanup_task(const fs::path& bundle) {
  Cleanup c;
  c.exit_status = 128 + SIGKILL;
  c.exited_at_ns = now_ns();
  // A Delete's receipt, when one answered already: the answer, identical, whether the task is
  // gone or the shim was killed between the answer and the removal (finished below).
  const std::optional<Cleanup> receipt = load_receipt(bundle);
  auto rec = load_task_record(bundle);
  if (!rec || !*rec) return receipt ? *receipt : c;
  const TaskRecord& r = **rec;
  c.pid = r.pid;
  if (r.container) {  // the pod's VM is its sandbox's: only the container's rootfs goes
    remove_task(bundle, r);
    return receipt ? *receipt : c;
  }
  if (same_process_alive(r.pid, r.pid_start)) {
    ::kill(-r.pid, SIGKILL);  // its session's process group: neshost
    ::kill(r.pid, SIGKILL);
  }
  // A replacement monitor (readopt) and the VMM, which outlive `neshost run`.
  if (auto st = host::reconcile(r.state_dir, r.vm); st && *st && (*st)->monitor_alive && (*st)->monitor) {
    Fd pidfd{static_cast<int>(::syscall(SYS_pidfd_open, (*st)->monitor->monitor.pid, 0))};
    if (pidfd && host::is_alive((*st)->monitor->monitor)) ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
  }
  kill_vmm(r);
  apply_recorded_exit(r, c.exit_status, c.exited_at_ns);
  remove_task(bundle, r);
  return receipt ? *receipt : c;
}

}  // namespace nes::shim
