#include "guest.hpp"

#include <fcntl.h>
#include <linux/random.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/fd.hpp"
#include "base/small_file.hpp"
#include "mounts.hpp"

namespace nes::init {

namespace {
void mount_if_absent(const Log& log, const char* src, const char* target, const char* fstype,
                     unsigned long flags, const char* data) {
  if (is_mount_point(target)) {
    log.debug("bringup", "{} already mounted", target);
    return;
  }
  if (auto d = mkdir_p(target); !d) {
    log.warn("bringup", "mkdir {}: {}", target, d.error().message);
    return;
  }
  if (::mount(src, target, fstype, flags, data) != 0)
    log.warn("bringup", "mount {} on {}: {}", fstype, target, std::strerror(errno));
  else
    log.debug("bringup", "mounted {} on {}", fstype, target);
}
}  // namespace

void guest_early(const Log& log) {
  // devtmpfs before anything else: /dev/console lives there when the initramfs has no node.
  bool dev_err = false;
  if (!is_mount_point("/dev")) {
    ::mkdir("/dev", 0755);
    dev_err = ::mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755") != 0 && errno != EBUSY;
  }
  int dev_errno = errno;
  // fds 0-2: whichever are closed get the console, so nothing opened later lands on them.
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0) continue;
    int c = ::open("/dev/console", O_RDWR | O_NOCTTY);
    if (c < 0) c = ::open("/dev/null", O_RDWR | O_NOCTTY);
    if (c >= 0 && c != fd) {
      ::dup2(c, fd);
      ::close(c);
    }
  }
  if (dev_err) log.warn("bringup", "mount devtmpfs on /dev: {}", std::strerror(dev_errno));
}

void guest_mounts_and_net(const Log& log) {
  mount_if_absent(log, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  mount_if_absent(log, "sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  mount_if_absent(log, "devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "mode=0620,ptmxmode=0666");
  mount_if_absent(log, "shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  mount_if_absent(log, "run", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
  mount_if_absent(log, "cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  if (auto lo = loopback_up(); !lo) log.warn("bringup", "lo up: {}", lo.error().message);
  // Ctrl-Alt-Del (a VMM's "reset" key) then reaches PID 1 as SIGINT: an ordered shutdown instead
  // of an immediate reboot. EINVAL: not supported here; harmless.
  if (::reboot(RB_DISABLE_CAD) != 0 && errno != EINVAL)
    log.warn("bringup", "reboot(RB_DISABLE_CAD): {}", std::strerror(errno));
  log.debug("bringup", "file systems and lo ready");  // before nesinit.log is read: debug
}

base::Status loopback_up() {
  base::Fd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) return base::errno_error(errno, "socket");
  ifreq ifr {};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (::ioctl(s.get(), SIOCGIFFLAGS, &ifr) != 0) return base::errno_error(errno, "SIOCGIFFLAGS");
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
  if (::ioctl(s.get(), SIOCSIFFLAGS, &ifr) != 0) return base::errno_error(errno, "SIOCSIFFLAGS");
  return base::Ok{};
}

std::vector<std::string> parse_modules_list(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    auto hash = line.find('#');
    if (hash != std::string_view::npos) line = line.substr(0, hash);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r'))
      line.remove_suffix(1);
    if (!line.empty()) out.emplace_back(line);
  }
  return out;
}

namespace {

/// A modules list file, parsed; nullopt (logged at debug) if it cannot be read. A list, not a
/// payload: bounded at 1 MiB. A file of the user's image: a symlink is followed.
std::optional<std::vector<std::string>> read_modules_list(const Log& log, const std::string& path) {
  auto text = base::read_small_file(path.c_str(), 1u << 20, {.longer = base::Longer::truncate, .follow_symlink = true});
  if (!text) {
    log.debug("modules", "{}", text.error().message);
    return std::nullopt;
  }
  return parse_modules_list(*text);
}

}  // namespace

int load_modules(const Log& log, const std::optional<std::vector<std::string>>& only, const std::string& dir,
                 const char* proc_modules) {
  // A kernel built without module support (the lean guest kernel, everything built in) has no
  // /proc/modules; one initramfs serves it and Debian's kernel, so its modules are not for this one.
  if (::access(proc_modules, F_OK) != 0) {
    log.info("modules", "the kernel has no module support (/proc/modules): none loaded");
    return 0;
  }
  std::vector<std::string> paths;  // in load order, each once
  auto add = [&](const std::vector<std::string>& list) {
    for (const auto& p : list)
      if (std::find(paths.begin(), paths.end(), p) == paths.end()) paths.push_back(p);
  };
  if (only) {
    for (const auto& name : *only) {
      auto group = read_modules_list(log, dir + "/modules.d/" + name);
      if (!group) {
        log.info("modules", "no group for {}: loading the whole list", name);
        paths.clear();
        if (auto all = read_modules_list(log, dir + "/modules")) add(*all);
        break;
      }
      add(*group);
    }
  } else if (auto all = read_modules_list(log, dir + "/modules")) {
    add(*all);
  }
  int failed = 0, loaded = 0;
  for (const std::string& path : paths) {
    base::Fd mfd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!mfd) {
      log.warn("modules", "{}: {}", path, std::strerror(errno));
      ++failed;
      continue;
    }
    long r = ::syscall(SYS_finit_module, mfd.get(), "", 0);
    int e = errno;
    if (r == 0) {
      ++loaded;
      log.debug("modules", "loaded {}", path);
    } else if (e == EEXIST) {
      log.debug("modules", "{} already loaded", path);
    } else {
      log.warn("modules", "{}: {}", path, std::strerror(e));
      ++failed;
    }
  }
  log.info("modules", "{} loaded, {} failed", loaded, failed);
  return failed;
}

void seed(const std::optional<proto::Entropy>& entropy, const std::optional<std::uint64_t>& realtime_ns,
          const Log& log) {
  if (entropy) {
    struct {  // struct rand_pool_info with its buffer
      int entropy_count;  // bits credited
      int buf_size;       // bytes
      std::uint8_t buf[proto::kEntropyBytes];
    } add{8 * static_cast<int>(proto::kEntropyBytes), static_cast<int>(proto::kEntropyBytes), {}};
    std::memcpy(add.buf, entropy->data(), sizeof add.buf);
    base::Fd fd(::open("/dev/urandom", O_WRONLY | O_CLOEXEC));
    const char* step = !fd ? "open /dev/urandom"
                       : ::ioctl(fd.get(), RNDADDENTROPY, &add) != 0 ? "RNDADDENTROPY"
                       : ::ioctl(fd.get(), RNDRESEEDCRNG) != 0      ? "RNDRESEEDCRNG"
                                                                    : nullptr;
    if (step) log.warn("seed", "{}: {}", step, std::strerror(errno));
    else log.info("seed", "{} bytes of entropy added, CRNG reseeded", proto::kEntropyBytes);
  }
  if (realtime_ns) {
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    const auto to = static_cast<std::int64_t>(*realtime_ns);
    const std::int64_t off = to - (static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec);
    if (off > kClockStepNs || off < -kClockStepNs) {
      const timespec ts{static_cast<time_t>(to / 1000000000), static_cast<long>(to % 1000000000)};
      if (::clock_settime(CLOCK_REALTIME, &ts) != 0) log.warn("seed", "clock_settime: {}", std::strerror(errno));
      else log.info("seed", "clock stepped by {} ms", off / 1000000);
    }
  }
}

}  // namespace nes::init
