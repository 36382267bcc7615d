// The descriptor's shares (virtiofs, 9p, tmpfs, bind), always nosuid,nodev, `ro` honoured, mount
// points created; and their removal in reverse order at shutdown.
#pragma once

#include <string>
#include <vector>

#include "base/result.hpp"
#include "log.hpp"
#include "protocol/messages.hpp"
#include "protocol/status.hpp"

namespace nes::init {

/// A share's mount (or the root switch): done, or the mount_failed to report (tag, reason, errno).
using MountStatus = base::StatusOf<proto::MountFailed>;

/// mkdir -p with mode 0755 for each missing component. An error's err is the errno (ENOTDIR:
/// `path` or a component exists and is not a directory); its message is strerror.
base::Status mkdir_p(const std::string& path);

/// The mount point of a single file's bind: its parent directories (mkdir_p) and an empty file
/// (mode 0644) if nothing is there; an existing non-symlink is kept as it is. An error's err is
/// the errno (ELOOP: a symlink is there; EINVAL: not an absolute path).
base::Status make_file(const std::string& path);

/// True if `path` is a mount point (its device differs from its parent's, or it is "/").
bool is_mount_point(const std::string& path);

/// Check a share before touching anything: `at` absolute, not "/", no "." or ".." components;
/// bind `tag` absolute. An error names the field (`mounts[i].at: ...`; err EINVAL).
base::Status validate_mount(const proto::Mount& m, std::size_t index);

/// The mount(2) arguments for a share: source, fstype (empty for bind), flags, data.
struct MountCall {
  std::string source;
  std::string fstype;
  unsigned long flags = 0;
  std::string data;
  bool operator==(const MountCall&) const = default;
};
/// virtiofs: source = tag; 9p: trans=virtio,version=9p2000.L; tmpfs: mode=0755; bind: MS_BIND
/// (nosuid/nodev/ro need a second MS_REMOUNT|MS_BIND call, see remount_flags).
MountCall mount_call(const proto::Mount& m);
/// Flags of the bind remount that applies nosuid,nodev (and ro).
unsigned long bind_remount_flags(const proto::Mount& m);

/// How long a virtiofs mount whose tag the guest kernel does not know (yet) is retried: ms slept
/// between the attempts. A share hot-plugged right before `boot` (a warm start from a snapshot)
/// is probed asynchronously, and until virtio-fs has registered its tag mount(2) fails with
/// EINVAL (the kernel logs "virtio-fs: tag <T> not found"). A tag that never comes is reported
/// this much later.
inline constexpr int kShareWaitMs = 2000;
/// The longest pause between two of those attempts, ms: a tag that comes is mounted at most this
/// late (the NIC's link is looked for as often: network.cpp). At most ~100 attempts in all, each
/// one failed mount(2) and one kernel log line.
inline constexpr int kShareTickMs = 20;

/// mount(2); a virtiofs mount failing with EINVAL is tried again (5 ms apart, doubling to
/// kShareTickMs) until kShareWaitMs have been slept. 0, or the last errno.
int mount_share(const char* source, const char* target, const char* fstype, unsigned long flags,
                const char* data);

/// The shares this init mounted, in order; unmounted in reverse.
class Shares {
 public:
  /// `own_namespace` (sandbox mode): before its first mount, the init moves into a mount
  /// namespace of its own with `/` private from the root down (isolate()), so no share reaches
  /// whoever started it, even if they did not unshare theirs; a boot without shares never pays
  /// for the namespace. A guest's PID 1 owns the machine's tree and mounts in it.
  explicit Shares(bool own_namespace = false) : own_namespace_(own_namespace) {}

  /// Mount all shares in order. On the first failure returns a MountFailed naming the tag, with
  /// the reason and errno; shares mounted before it stay listed (unmounted at shutdown).
  MountStatus mount_all(const std::vector<proto::Mount>& mounts, const Log& log);

  /// Unmount every share in reverse order; a busy one is lazily detached (MNT_DETACH) and logged.
  /// Returns the number that could not be unmounted even lazily.
  int unmount_all(const Log& log);

  const std::vector<std::string>& mounted() const { return mounted_; }

  /// In sandbox mode (own_namespace), move into the init's own mount namespace with `/` private:
  /// unshare(CLONE_NEWNS), then make_root_private(); once; a no-op for a guest. Called before the
  /// first share, and before boot.network binds its files over /etc. An error's err is the errno.
  base::Status isolate();

 private:
  bool own_namespace_ = false;
  bool isolated_ = false;
  std::vector<std::string> mounted_;
};

/// Make "/" and everything under it MS_REC|MS_PRIVATE, so no mount of ours propagates to a parent
/// namespace (sandbox mode, in the init's own mount namespace, before its first mount). An
/// error's err is mount(2)'s errno.
base::Status make_root_private();

}  // namespace nes::init
