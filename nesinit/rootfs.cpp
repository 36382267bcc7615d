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
  if (int e = mount_share(r.tag.c_str(), nr.c_str(), fstype, r.ro ? MS_RDONLY : 0, data))
    return fail(fmt::format("mount {} {} on {}", fstype, r.tag, nr), e);
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
  log.info("root", "{} {} is / ({})", fstype, r.tag, r.ro ? "ro" : "rw");
  return base::Ok{};
}

}  // namespace nes::init
