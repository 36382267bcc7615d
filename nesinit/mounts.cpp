#include "mounts.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <unistd.h>

namespace nes::init {

base::Status mkdir_p(const std::string& path) {
  if (path.empty()) return base::errno_error(EINVAL);
  std::string cur;
  std::size_t i = 0;
  while (i < path.size()) {
    std::size_t slash = path.find('/', i + 1);
    cur = path.substr(0, slash);
    i = slash == std::string::npos ? path.size() : slash;
    if (cur.empty() || cur == "/") continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return base::errno_error(errno);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return base::errno_error(errno);
  if (!S_ISDIR(st.st_mode)) return base::errno_error(ENOTDIR);
  return base::Ok{};
}

base::Status make_file(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return base::errno_error(EINVAL);
  if (slash > 0)
    if (auto d = mkdir_p(path.substr(0, slash)); !d) return d;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) {
    const int e = errno;
    // An existing file, directory or device is the mount point as it is (mount(2) decides).
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && !S_ISLNK(st.st_mode)) return base::Ok{};
    return base::errno_error(e);
  }
  ::close(fd);
  return base::Ok{};
}

bool is_mount_point(const std::string& path) {
  if (path == "/") return true;
  struct stat a {}, b {};
  if (::stat(path.c_str(), &a) != 0) return false;
  if (::stat((path + "/..").c_str(), &b) != 0) return false;
  return a.st_dev != b.st_dev || a.st_ino == b.st_ino;
}

base::Status validate_mount(const proto::Mount& m, std::size_t i) {
  auto bad_path = [](const std::string& p) {
    if (p.empty() || p[0] != '/') return "must be an absolute path";
    std::size_t s = 0;
    while (s < p.size()) {
      std::size_t e = p.find('/', s + 1);
      std::string_view comp = std::string_view(p).substr(s + 1, (e == std::string::npos ? p.size() : e) - s - 1);
      if (comp == "." || comp == "..") return "must not contain '.' or '..' components";
      if (e == std::string::npos) break;
      s = e;
    }
    return "";
  };
  auto invalid = [](std::string why) { return base::Error{std::move(why), EINVAL}; };
  if (const char* why = bad_path(m.at); *why) return invalid(fmt::format("mounts[{}].at: {}", i, why));
  if (m.at.find_first_not_of('/') == std::string::npos)
    return invalid(fmt::format("mounts[{}].at: must not be /", i));
  if (m.tag.empty()) return invalid(fmt::format("mounts[{}].tag: must not be empty", i));
  if (m.fs == proto::FsType::bind)
    if (const char* why = bad_path(m.tag); *why)
      return invalid(fmt::format("mounts[{}].tag: bind source {}", i, why));
  return base::Ok{};
}

MountCall mount_call(const proto::Mount& m) {
  unsigned long base = MS_NOSUID | MS_NODEV | (m.ro ? MS_RDONLY : 0);
  switch (m.fs) {
    case proto::FsType::virtiofs: return {m.tag, "virtiofs", base, ""};
    case proto::FsType::ninep: return {m.tag, "9p", base, "trans=virtio,version=9p2000.L"};
    case proto::FsType::tmpfs: return {m.tag, "tmpfs", base, "mode=0755"};
    case proto::FsType::bind: return {m.tag, "", MS_BIND, ""};
    case proto::FsType::erofs:  // never in mounts[]: the codec refuses them there
    case proto::FsType::ext4: break;
  }
  return {m.tag, "virtiofs", base, ""};
}

unsigned long bind_remount_flags(const proto::Mount& m) {
  return MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (m.ro ? MS_RDONLY : 0);
}

int mount_share(const char* source, const char* target, const char* fstype, unsigned long flags,
                const char* data) {
  const bool virtiofs = fstype && std::strcmp(fstype, "virtiofs") == 0;
  for (int slept = 0, tick = 5;; slept += tick, tick = std::min(2 * tick, kShareTickMs)) {
    if (::mount(source, target, fstype, flags, data) == 0) return 0;
    if (errno != EINVAL || !virtiofs || slept >= kShareWaitMs) return errno;
    const timespec ts{0, tick * 1000000L};
    ::nanosleep(&ts, nullptr);
  }
}

MountStatus Shares::mount_all(const std::vector<proto::Mount>& mounts, const Log& log) {
  for (std::size_t i = 0; i < mounts.size(); ++i) {
    const proto::Mount& m = mounts[i];
    if (auto v = validate_mount(m, i); !v)
      return proto::MountFailed{m.tag, v.error().message, v.error().err};
    bool file = false;  // a bind of a single file: its mount point is a file, not a directory
    if (m.fs == proto::FsType::bind) {
      // A missing source is reported as such, not as a failure to create the mount point.
      struct stat st {};
      if (::stat(m.tag.c_str(), &st) != 0) {
        int e = errno;
        return proto::MountFailed{m.tag, fmt::format("bind source {}: {}", m.tag, std::strerror(e)), e};
      }
      file = !S_ISDIR(st.st_mode);
    }
    if (auto iso = isolate(); !iso)
      return proto::MountFailed{m.tag, fmt::format("own mount namespace: {}", iso.error().message), iso.error().err};
    if (auto d = file ? make_file(m.at) : mkdir_p(m.at); !d)
      return proto::MountFailed{m.tag, fmt::format("mount point {}: {}", m.at, d.error().message), d.error().err};
    MountCall c = mount_call(m);
    const char* fstype = c.fstype.empty() ? nullptr : c.fstype.c_str();
    if (int e = mount_share(c.source.c_str(), m.at.c_str(), fstype, c.flags, c.data.empty() ? nullptr : c.data.c_str())) {
      return proto::MountFailed{m.tag, fmt::format("mount {} {} on {}: {}", proto::to_string(m.fs),
                                                   m.tag, m.at, std::strerror(e)), e};
    }
    mounted_.push_back(m.at);
    if (m.fs == proto::FsType::bind &&
        ::mount(nullptr, m.at.c_str(), nullptr, bind_remount_flags(m), nullptr) != 0) {
      int e = errno;
      return proto::MountFailed{m.tag, fmt::format("remount bind {} nosuid,nodev{}: {}", m.at,
                                                   m.ro ? ",ro" : "", std::strerror(e)), e};
    }
    log.info("mount", "{} {} on {} ({},nosuid,nodev)", proto::to_string(m.fs), m.tag, m.at,
             m.ro ? "ro" : "rw");
  }
  return base::Ok{};
}

int Shares::unmount_all(const Log& log) {
  int left = 0;
  while (!mounted_.empty()) {
    std::string at = std::move(mounted_.back());
    mounted_.pop_back();
    if (::umount2(at.c_str(), 0) == 0) {
      log.info("unmount", "{}", at);
      continue;
    }
    int e = errno;
    if (::umount2(at.c_str(), MNT_DETACH) == 0) {
      log.warn("unmount", "{}: {}; lazily detached", at, std::strerror(e));
      continue;
    }
    log.error("unmount", "{}: {}; left mounted", at, std::strerror(errno));
    ++left;
  }
  return left;
}

base::Status Shares::isolate() {
  if (!own_namespace_ || isolated_) return base::Ok{};
  if (::unshare(CLONE_NEWNS) != 0) return base::errno_error(errno, "unshare(CLONE_NEWNS)");
  if (auto p = make_root_private(); !p) return base::errno_error(p.error().err, "make / private");
  isolated_ = true;
  return base::Ok{};
}

base::Status make_root_private() {
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return base::errno_error(errno);
  return base::Ok{};
}

}  // namespace nes::init
