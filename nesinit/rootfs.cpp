#include "rootfs.hpp"

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "block.hpp"
#include "mounts.hpp"

namespace nes::init {

namespace {

/// A block root's layers (docs/protocol.md "Block roots"): the disk of serial `r.tag` read-only
/// on kRootLower, the upper (tmpfs or the scratch disk's ext4) on kRootUpper, their overlay on
/// `nr`; the two staging mounts are detached once the overlay holds them. Errors name the step.
base::Status mount_block_root(const proto::Root& r, const std::string& nr) {
  auto dev = find_block_device(r.tag);
  if (!dev) return base::Error{"find disk " + dev.error().message, dev.error().err};
  std::string upper_dev;
  if (r.upper) {
    auto u = find_block_device(*r.upper);
    if (!u) return base::Error{"find upper disk " + u.error().message, u.error().err};
    upper_dev = *u;
  }
  const char* fstype = proto::to_string(r.fs).data();  // "erofs" or "ext4": literals
  if (auto d = mkdir_p(kRootLower); !d) return base::errno_error(d.error().err, std::string("mkdir ") + kRootLower);
  if (::mount(dev->c_str(), kRootLower, fstype, MS_RDONLY, nullptr) != 0)
    return base::errno_error(errno, fmt::format("mount {} {} on {}", fstype, *dev, kRootLower));
  auto st = stage_read_only(kRootLower, kRootUpper, nr, r.upper_mib, upper_dev);
  ::umount2(kRootLower, MNT_DETACH);  // the overlay holds its own references
  ::umount2(kRootUpper, MNT_DETACH);
  return st;
}

/// A share root (virtiofs or 9p) on `nr`: the share itself, or with `ro` the lower layer of an
/// overlay over a tmpfs (stage_read_only). Errors: MountFailed naming the tag and the step.
MountStatus mount_share_root(const proto::Root& r, const std::string& nr, const char* fstype) {
  auto fail = [&](std::string what, int e) -> MountStatus {
    return proto::MountFailed{r.tag, fmt::format("root {}: {}", what, std::strerror(e)), e};
  };
  const char* data = r.fs == proto::FsType::ninep ? "trans=virtio,version=9p2000.L" : nullptr;
  // Read-only: the share is the overlay's lower layer; the mount points go to its tmpfs.
  const std::string share_at = r.ro ? kRootLower : nr;
  if (r.ro)
    if (auto d = mkdir_p(share_at); !d) return fail("mkdir " + share_at, d.error().err);
  if (int e = mount_share(r.tag.c_str(), share_at.c_str(), fstype, r.ro ? MS_RDONLY : 0, data))
    return fail(fmt::format("mount {} {} on {}", fstype, r.tag, share_at), e);
  if (r.ro) {
    auto st = stage_read_only(share_at, kRootUpper, nr);
    ::umount2(share_at.c_str(), MNT_DETACH);  // the overlay holds its own reference
    ::umount2(kRootUpper, MNT_DETACH);
    if (!st) {
      ::umount2(nr.c_str(), MNT_DETACH);
      return proto::MountFailed{r.tag, "root " + st.error().message, st.error().err};
    }
  }
  return base::Ok{};
}

}  // namespace

MountStatus switch_root(const proto::Root& r, const Log& log) {
  auto fail = [&](std::string what, int e) -> MountStatus {
    return proto::MountFailed{r.tag, fmt::format("root {}: {}", what, std::strerror(e)), e};
  };
  const std::string nr = kNewRoot;
  if (auto d = mkdir_p(nr); !d) return fail("mkdir " + nr, d.error().err);
  const bool block = proto::is_block_fs(r.fs);
  const char* fstype = proto::to_string(r.fs).data();  // a literal: "virtiofs", "9p", "erofs", "ext4"
  if (block) {
    if (auto st = mount_block_root(r, nr); !st) {
      ::umount2(nr.c_str(), MNT_DETACH);
      return proto::MountFailed{r.tag, "root " + st.error().message, st.error().err};
    }
  } else if (auto st = mount_share_root(r, nr, fstype); !st) {
    return st;
  }
  // Everything the init mounted at bring-up moves along (MS_MOVE takes the subtree: /dev/pts,
  // /dev/shm, /sys/fs/cgroup). A missing mount point is created in the share, as a container
  // runtime does in a rootfs.
  for (const char* m : {"/dev", "/proc", "/sys", "/run"}) {
    if (!is_mount_point(m)) continue;
    const std::string to = nr + m;
    if (auto d = mkdir_p(to); !d) {
      ::umount2(nr.c_str(), MNT_DETACH);
      return fail("mount point " + std::string(m), d.error().err);
    }
    if (::mount(m, to.c_str(), nullptr, MS_MOVE, nullptr) != 0) {
      int e = errno;
      ::umount2(nr.c_str(), MNT_DETACH);  // the moved ones go with it; bring-up mounts are lost
      return fail(fmt::format("move {} to {}", m, to), e);
    }
  }
  // /tmp: private scratch, not the host directory (a container's /tmp is not the image's either).
  const std::string tmp = nr + "/tmp";
  if (auto d = mkdir_p(tmp); !d) {
    ::umount2(nr.c_str(), MNT_DETACH);
    return fail("mount point /tmp", d.error().err);
  }
  if (::mount("tmpfs", tmp.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0) {
    int e = errno;
    ::umount2(nr.c_str(), MNT_DETACH);
    return fail("mount tmpfs on /tmp", e);
  }
  // The switch itself (switch_root(8)): the initramfs cannot be pivot_root'ed away, so the new
  // root is moved over it and entered with chroot. The initramfs stays in memory, unreachable.
  if (::chdir(nr.c_str()) != 0) return fail("chdir " + nr, errno);
  if (::mount(".", "/", nullptr, MS_MOVE, nullptr) != 0) {
    int e = errno;
    [[maybe_unused]] int rc = ::chdir("/");
    return fail("move onto /", e);
  }
  if (::chroot(".") != 0) return fail("chroot", errno);
  if (::chdir("/") != 0) return fail("chdir /", errno);
  log.info("root", "{} {} is / ({}{})", fstype, r.tag, block ? "over its upper, " : "",
           r.ro ? "ro: its mount points in memory until sealed" : "rw");
  return base::Ok{};
}

base::Status stage_read_only(const std::string& lower, const std::string& upper, const std::string& target,
                             std::uint32_t upper_mib, const std::string& upper_dev) {
  auto fail = [](const std::string& what, int e) { return base::errno_error(e, what); };
  struct stat st {};
  if (::stat(lower.c_str(), &st) != 0) return fail("stat " + lower, errno);
  if (auto d = mkdir_p(upper); !d) return fail("mkdir " + upper, d.error().err);
  if (upper_dev.empty()) {
    const std::string opts = upper_mib ? fmt::format("mode=0700,size={}m", upper_mib) : std::string("mode=0700");
    if (::mount("tmpfs", upper.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) != 0)
      return fail(fmt::format("mount tmpfs ({}) on {}", opts, upper), errno);
  } else if (::mount(upper_dev.c_str(), upper.c_str(), "ext4", MS_NOSUID | MS_NODEV, nullptr) != 0) {
    return fail(fmt::format("mount ext4 {} on {}", upper_dev, upper), errno);
  }
  const std::string u = upper + "/u", w = upper + "/w";
  // A scratch disk keeps its layers across boots: an existing u is the layer as the workload left it.
  bool made_u = false;
  for (const std::string& d : {u, w}) {
    if (::mkdir(d.c_str(), 0755) == 0) made_u = made_u || d == u;
    else if (errno != EEXIST) return fail("mkdir " + d, errno);
  }
  // The merged root is the upper layer's directory: it looks as the lower's root does.
  if (made_u && (::chown(u.c_str(), st.st_uid, st.st_gid) != 0 || ::chmod(u.c_str(), st.st_mode & 07777) != 0))
    return fail("chown/chmod " + u, errno);
  const std::string opts = fmt::format("lowerdir={},upperdir={},workdir={}", lower, u, w);
  if (::mount("overlay", target.c_str(), "overlay", 0, opts.c_str()) != 0)
    return fail(fmt::format("mount overlay ({}) on {}", opts, target), errno);
  return base::Ok{};
}

base::Status seal_read_only(const std::string& at) {
  if (::mount(nullptr, at.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0)
    return base::errno_error(errno, "remount " + at + " read-only");
  return base::Ok{};
}

}  // namespace nes::init
