#include "rootfs.hpp"

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "mounts.hpp"

namespace nes::init {

MountStatus switch_root(const proto::Root& r, const Log& log) {
  auto fail = [&](std::string what, int e) -> MountStatus {
    return proto::MountFailed{r.tag, fmt::format("root {}: {}", what, std::strerror(e)), e};
  };
  const std::string nr = kNewRoot;
  if (auto d = mkdir_p(nr); !d) return fail("mkdir " + nr, d.error().err);
  const char* fstype = r.fs == proto::FsType::ninep ? "9p" : "virtiofs";
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
  log.info("root", "{} {} is / ({})", fstype, r.tag, r.ro ? "ro: its mount points in memory until sealed" : "rw");
  return base::Ok{};
}

base::Status stage_read_only(const std::string& lower, const std::string& upper, const std::string& target) {
  auto fail = [](const std::string& what, int e) { return base::errno_error(e, what); };
  struct stat st {};
  if (::stat(lower.c_str(), &st) != 0) return fail("stat " + lower, errno);
  if (auto d = mkdir_p(upper); !d) return fail("mkdir " + upper, d.error().err);
  if (::mount("tmpfs", upper.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700") != 0)
    return fail("mount tmpfs on " + upper, errno);
  const std::string u = upper + "/u", w = upper + "/w";
  for (const std::string& d : {u, w})
    if (::mkdir(d.c_str(), 0755) != 0) return fail("mkdir " + d, errno);
  // The merged root is the upper layer's directory: it looks as the share's root does.
  if (::chown(u.c_str(), st.st_uid, st.st_gid) != 0 || ::chmod(u.c_str(), st.st_mode & 07777) != 0)
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
