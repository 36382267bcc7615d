#include "container.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

namespace nes::init {

namespace {
constexpr unsigned long kNoSuidDevExec = MS_NOSUID | MS_NODEV | MS_NOEXEC;
}  // namespace

std::vector<ContainerStep> plan_container(const proto::Container& c, const std::vector<std::string>& etc) {
  using S = ContainerStep;
  const std::string& r = c.root;
  std::vector<S> s;
  s.push_back({S::mount, "", "/", nullptr, MS_REC | MS_PRIVATE});
  s.push_back({S::mount, r, r, nullptr, MS_BIND | MS_REC});
  s.push_back({S::mkdir, r + "/proc", "", nullptr, 0555});
  s.push_back({S::mount, "proc", r + "/proc", "proc", kNoSuidDevExec});
  s.push_back({S::mkdir, r + "/dev", "", nullptr, 0755});
  s.push_back({S::mount, "tmpfs", r + "/dev", "tmpfs", MS_NOSUID | MS_STRICTATIME, "mode=755,size=65536k"});
  for (const char* d : {"null", "zero", "full", "random", "urandom", "tty"}) {
    s.push_back({S::touch, r + "/dev/" + d, "", nullptr, 0666});
    s.push_back({S::mount, std::string("/dev/") + d, r + "/dev/" + d, nullptr, MS_BIND});
  }
  s.push_back({S::mkdir, r + "/dev/pts", "", nullptr, 0755});
  s.push_back({S::mount, "devpts", r + "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"});
  s.push_back({S::symlink, "pts/ptmx", r + "/dev/ptmx"});
  s.push_back({S::symlink, "/proc/self/fd", r + "/dev/fd"});
  s.push_back({S::symlink, "/proc/self/fd/0", r + "/dev/stdin"});
  s.push_back({S::symlink, "/proc/self/fd/1", r + "/dev/stdout"});
  s.push_back({S::symlink, "/proc/self/fd/2", r + "/dev/stderr"});
  s.push_back({S::mkdir, r + "/dev/shm", "", nullptr, 01777});
  s.push_back({S::mount, "shm", r + "/dev/shm", "tmpfs", kNoSuidDevExec, "mode=1777,size=65536k"});
  s.push_back({S::mkdir, r + "/dev/mqueue", "", nullptr, 0755});
  s.push_back({S::mount, "mqueue", r + "/dev/mqueue", "mqueue", kNoSuidDevExec});
  s.push_back({S::mkdir, r + "/sys", "", nullptr, 0555});
  s.push_back({S::mount, "sysfs", r + "/sys", "sysfs", kNoSuidDevExec | MS_RDONLY});
  bool etc_dir = false;
  for (const std::string& f : etc) {
    if (f == "hostname" && c.hostname) continue;  // the VM's name is not the container's
    if (!etc_dir) s.push_back({S::mkdir, r + "/etc", "", nullptr, 0755});
    etc_dir = true;
    s.push_back({S::touch, r + "/etc/" + f, "", nullptr, 0644});
    s.push_back({S::mount, "/etc/" + f, r + "/etc/" + f, nullptr, MS_BIND});
  }
  if (c.readonly) s.push_back({S::mount, "", r, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY});
  s.push_back({S::pivot, r, ""});
  if (c.hostname) s.push_back({S::hostname, *c.hostname, ""});
  return s;
}

int run_container(const std::vector<ContainerStep>& steps, int& failed) {
  failed = 0;
  for (const ContainerStep& s : steps) {
    int rc = 0;
    switch (s.kind) {
      case ContainerStep::mount:
        rc = ::mount(s.a.empty() ? nullptr : s.a.c_str(), s.b.c_str(), s.fstype, s.flags, s.data);
        break;
      case ContainerStep::mkdir:
        rc = ::mkdir(s.a.c_str(), static_cast<mode_t>(s.flags));
        if (rc != 0 && errno == EEXIST) rc = 0;
        break;
      case ContainerStep::touch: {
        int fd = ::open(s.a.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY, static_cast<mode_t>(s.flags));
        rc = fd < 0 ? -1 : ::close(fd);
        break;
      }
      case ContainerStep::symlink:
        rc = ::symlink(s.a.c_str(), s.b.c_str());
        if (rc != 0 && errno == EEXIST) rc = 0;
        break;
      case ContainerStep::pivot:
        // pivot_root(".", "."), then the old root (now under the new one) detached. The
        // initramfs cannot be pivoted away from (EINVAL): move the root onto / and chroot.
        rc = ::chdir(s.a.c_str());
        if (rc == 0 && ::syscall(SYS_pivot_root, ".", ".") == 0) {
          rc = ::umount2(".", MNT_DETACH);
        } else if (rc == 0 && errno == EINVAL) {
          rc = ::mount(".", "/", nullptr, MS_MOVE, nullptr);
          if (rc == 0) rc = ::chroot(".");
        } else {
          rc = -1;
        }
        if (rc == 0) rc = ::chdir("/");
        break;
      case ContainerStep::hostname:
        rc = ::sethostname(s.a.data(), s.a.size());
        break;
    }
    if (rc != 0) return errno ? errno : EIO;
    ++failed;
  }
  return 0;
}

std::string describe(const ContainerStep& s) {
  switch (s.kind) {
    case ContainerStep::mount:
      if (s.flags & MS_REMOUNT) return fmt::format("remount {} read-only", s.b);
      if (s.flags & MS_PRIVATE) return "make the mounts private";
      return fmt::format("mount {} on {}", s.a, s.b);
    case ContainerStep::mkdir: return fmt::format("mkdir {}", s.a);
    case ContainerStep::touch: return fmt::format("create {}", s.a);
    case ContainerStep::symlink: return fmt::format("symlink {}", s.b);
    case ContainerStep::pivot: return fmt::format("pivot_root into {}", s.a);
    case ContainerStep::hostname: return fmt::format("sethostname {}", s.a);
  }
  return "?";
}

JoinPlan plan_join(pid_t pid) {
  const std::string p = fmt::format("/proc/{}/", pid);
  return {{p + "ns/uts", p + "ns/pid", p + "ns/mnt"}, p + "root"};
}

int join_container(const JoinPlan& j, int& failed) {
  // Every file is opened before any setns: after the mount namespace's, /proc is the container's.
  static constexpr int kTypes[3] = {CLONE_NEWUTS, CLONE_NEWPID, CLONE_NEWNS};
  int fd[4] = {-1, -1, -1, -1};
  int err = 0;
  for (failed = 0; failed < 4; ++failed) {
    const std::string& path = failed < 3 ? j.ns[failed] : j.root;
    fd[failed] = ::open(path.c_str(), (failed < 3 ? O_RDONLY : O_PATH | O_DIRECTORY) | O_CLOEXEC);
    if (fd[failed] < 0) {
      err = errno;
      break;
    }
  }
  for (int i = 0; err == 0 && i < 3; ++i)
    if (::setns(fd[i], kTypes[i]) != 0) err = errno, failed = i;
  if (err == 0 && (::fchdir(fd[3]) != 0 || ::chroot(".") != 0 || ::chdir("/") != 0)) err = errno, failed = 3;
  for (int f : fd)
    if (f >= 0) ::close(f);
  return err;
}

}  // namespace nes::init
