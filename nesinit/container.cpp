#include "container.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <iterator>

#include <fmt/format.h>

namespace nes::init {

namespace {

constexpr unsigned long kNoSuidDevExec = MS_NOSUID | MS_NODEV | MS_NOEXEC;

/// One row of runc's default mounts: for `mount`, source `src` (a file system's name, or a path of
/// the init's for a bind) on root + `dst`; `mkdir`/`touch` root + `dst` (`flags` its mode);
/// `symlink` root + `dst` pointing to `src`. A table, not code: the init is measured in bytes.
struct Row {
  ContainerStep::Kind kind;
  const char* src;
  const char* dst;
  const char* fstype;
  unsigned long flags;
  const char* data;
};

#define NES_DEV(name) {ContainerStep::touch, nullptr, "/dev/" name, nullptr, 0666, nullptr}, \
                      {ContainerStep::mount, "/dev/" name, "/dev/" name, nullptr, MS_BIND, nullptr}
constexpr Row kRunc[] = {
    {ContainerStep::mkdir, nullptr, "/proc", nullptr, 0555, nullptr},
    {ContainerStep::mount, "proc", "/proc", "proc", kNoSuidDevExec, nullptr},
    {ContainerStep::mkdir, nullptr, "/dev", nullptr, 0755, nullptr},
    {ContainerStep::mount, "tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_STRICTATIME, "mode=755,size=65536k"},
    NES_DEV("null"), NES_DEV("zero"), NES_DEV("full"), NES_DEV("random"), NES_DEV("urandom"), NES_DEV("tty"),
    {ContainerStep::mkdir, nullptr, "/dev/pts", nullptr, 0755, nullptr},
    {ContainerStep::mount, "devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"},
    {ContainerStep::symlink, "pts/ptmx", "/dev/ptmx", nullptr, 0, nullptr},
    {ContainerStep::symlink, "/proc/self/fd", "/dev/fd", nullptr, 0, nullptr},
    {ContainerStep::symlink, "/proc/self/fd/0", "/dev/stdin", nullptr, 0, nullptr},
    {ContainerStep::symlink, "/proc/self/fd/1", "/dev/stdout", nullptr, 0, nullptr},
    {ContainerStep::symlink, "/proc/self/fd/2", "/dev/stderr", nullptr, 0, nullptr},
    {ContainerStep::mkdir, nullptr, "/dev/shm", nullptr, 01777, nullptr},
    {ContainerStep::mount, "shm", "/dev/shm", "tmpfs", kNoSuidDevExec, "mode=1777,size=65536k"},
    {ContainerStep::mkdir, nullptr, "/dev/mqueue", nullptr, 0755, nullptr},
    {ContainerStep::mount, "mqueue", "/dev/mqueue", "mqueue", kNoSuidDevExec, nullptr},
    {ContainerStep::mkdir, nullptr, "/sys", nullptr, 0555, nullptr},
    {ContainerStep::mount, "sysfs", "/sys", "sysfs", kNoSuidDevExec | MS_RDONLY, nullptr},
};
#undef NES_DEV

/// One of the spec's mounts (proto::ContainerMount) under root `r`, as runc makes it: the
/// target's parents, the target (a directory, or an empty file for a bind of a file), the mount,
/// a bind's remount with its flags (a bind ignores them until remounted), its propagation.
/// `dst` resolved inside root `r` as securejoin does for runc: each symlink met on the way is
/// read and followed inside `r` (an absolute target from `r`, `..` never above it), at most 40;
/// the path relative to `r` (starting with '/'), its components then free of symlinks that
/// exist now. What does not exist yet is kept as written.
std::string resolve_in_root(const std::string& r, std::string_view dst) {
  std::string out;  // resolved so far, relative to r
  std::string rest(dst);
  int links = 0;
  while (!rest.empty()) {
    std::size_t i = rest.find_first_not_of('/');
    if (i == std::string::npos) break;
    std::size_t j = rest.find('/', i);
    std::string name = rest.substr(i, j == std::string::npos ? std::string::npos : j - i);
    rest = j == std::string::npos ? std::string() : rest.substr(j);
    if (name == ".") continue;
    if (name == "..") {
      out.resize(out.rfind('/') == std::string::npos ? 0 : out.rfind('/'));
      continue;
    }
    char buf[4096];
    const std::string full = r + out + "/" + name;
    ssize_t n = links < 40 ? ::readlink(full.c_str(), buf, sizeof buf) : -1;
    if (n <= 0 || static_cast<std::size_t>(n) >= sizeof buf) {
      out += "/" + name;
      continue;
    }
    ++links;
    std::string target(buf, static_cast<std::size_t>(n));
    if (target.front() == '/') out.clear();
    rest = target + "/" + rest;
  }
  return out.empty() ? std::string("/") : out;
}

void plan_mount(const proto::ContainerMount& m, const std::string& r, std::vector<ContainerStep>& s) {
  using S = ContainerStep;
  const std::string dst = resolve_in_root(r, m.dst);
  const std::string at = r + dst;
  for (std::size_t i = dst.find('/', 1); i != std::string::npos; i = dst.find('/', i + 1))
    s.push_back({S::mkdir, r + dst.substr(0, i), {}, nullptr, 0755});
  struct stat st {};
  const bool bind = m.fs == proto::FsType::bind;
  const bool file = bind && ::stat(m.src.c_str(), &st) == 0 && !S_ISDIR(st.st_mode);
  s.push_back({file ? S::touch : S::mkdir, at, {}, nullptr, file ? 0644u : 0755u});
  const unsigned long flags = (m.ro ? MS_RDONLY : 0) | (m.nosuid ? MS_NOSUID : 0) | (m.nodev ? MS_NODEV : 0) |
                              (m.noexec ? MS_NOEXEC : 0);
  if (bind) {
    s.push_back({S::mount, m.src, at, nullptr, MS_BIND | MS_REC});
    if (flags) s.push_back({S::mount, {}, at, nullptr, MS_REMOUNT | MS_BIND | flags});
  } else {
    S& t = s.emplace_back(S{S::mount, "tmpfs", at, "tmpfs", flags});
    t.opts = m.data;
  }
  const std::string& p = m.propagation;
  unsigned long prop = p.ends_with("slave") ? MS_SLAVE : p.ends_with("shared") ? MS_SHARED : 0;
  if (prop) s.push_back({S::mount, {}, at, nullptr, prop | (p.front() == 'r' ? MS_REC : 0)});
}

}  // namespace

std::vector<ContainerStep> plan_container(const proto::Container& c, const std::vector<std::string>& etc) {
  using S = ContainerStep;
  const std::string& r = c.root;
  std::vector<S> s;
  s.reserve(std::size(kRunc) + 3 * etc.size() + 6);
  s.push_back({S::mount, {}, "/", nullptr, MS_REC | MS_PRIVATE});
  s.push_back({S::mount, r, r, nullptr, MS_BIND | MS_REC});
  for (const Row& row : kRunc) {
    S& st = s.emplace_back(S{row.kind, {}, {}, row.fstype, row.flags, row.data});
    std::string path = r + row.dst;
    if (row.src) st.a = row.src;
    (row.kind == S::mkdir || row.kind == S::touch ? st.a : st.b) = std::move(path);
  }
  bool etc_dir = false;
  for (const std::string& f : etc) {
    if (f == "hostname" && c.hostname) continue;  // the VM's name is not the container's
    if (!etc_dir) s.push_back({S::mkdir, r + "/etc", {}, nullptr, 0755});
    etc_dir = true;
    const std::string at = r + "/etc/" + f;
    s.push_back({S::touch, at, {}, nullptr, 0644});
    s.push_back({S::mount, "/etc/" + f, at, nullptr, MS_BIND});
  }
  for (const proto::ContainerMount& m : c.mounts) plan_mount(m, r, s);
  if (c.readonly) s.push_back({S::mount, {}, r, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY});
  s.push_back({S::pivot, r, {}});
  if (c.hostname) s.push_back({S::hostname, *c.hostname, {}});
  return s;
}

int run_container(const std::vector<ContainerStep>& steps, int& failed) {
  failed = 0;
  for (const ContainerStep& s : steps) {
    int rc = 0;
    switch (s.kind) {
      case ContainerStep::mount:
        rc = ::mount(s.a.empty() ? nullptr : s.a.c_str(), s.b.c_str(), s.fstype, s.flags,
                     s.data ? s.data : s.opts.empty() ? nullptr : s.opts.c_str());
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
      if (s.flags & MS_REMOUNT) return fmt::format("remount {}{}", s.b, s.flags & MS_RDONLY ? " read-only" : " with its flags");
      if (s.flags & MS_PRIVATE) return "make the mounts private";
      if (s.flags & (MS_SLAVE | MS_SHARED)) return fmt::format("set the propagation of {}", s.b);
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
