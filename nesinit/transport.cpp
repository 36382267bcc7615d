#include "transport.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/vm_sockets.h>
#include <poll.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/small_file.hpp"

namespace nes::init {

SockAddr vsock_sockaddr(const VsockAddr& a) {
  SockAddr s;
  auto* vm = reinterpret_cast<sockaddr_vm*>(&s.storage);
  vm->svm_family = AF_VSOCK;
  vm->svm_cid = a.cid;
  vm->svm_port = a.port;
  s.len = sizeof(sockaddr_vm);
  return s;
}

SockAddr unix_sockaddr(const UnixAddr& a) {
  SockAddr s;
  auto* un = reinterpret_cast<sockaddr_un*>(&s.storage);
  un->sun_family = AF_UNIX;
  std::size_t n = std::min(a.path.size(), sizeof(un->sun_path) - 1);
  std::memcpy(un->sun_path, a.path.data(), n);
  s.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n + 1);
  return s;
}

std::optional<std::string> find_virtio_port(const std::string& name, const std::string& sysfs_dir,
                                            const std::string& dev_dir) {
  DIR* d = ::opendir(sysfs_dir.c_str());
  if (!d) return std::nullopt;
  std::optional<std::string> found;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    // A port's name is short (the VMM's `name=` property): 128 bytes are enough to compare.
    auto text = base::read_small_file((sysfs_dir + "/" + e->d_name + "/name").c_str(), 128, {.longer = base::Longer::truncate});
    if (!text) continue;
    std::string_view v(*text);
    while (!v.empty() && (v.back() == '\n' || v.back() == '\0')) v.remove_suffix(1);
    if (v == name) {
      found = dev_dir + "/" + e->d_name;
      break;
    }
  }
  ::closedir(d);
  return found;
}

base::Result<base::Fd> connect_socket(int domain, const SockAddr& a, std::uint64_t deadline_ms, const DialWait& wait,
                                      const std::function<std::uint64_t()>& now_ms) {
  // Never a blocking connect(): PID 1 has every signal blocked, so nothing would cut it short
  // (a Unix listener with a full backlog blocks it until a slot frees; vsock until the kernel's
  // own connect timeout).
  base::Fd fd(::socket(domain, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return base::errno_error(errno);
  int r;
  do r = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.len);
  while (r != 0 && errno == EINTR);
  if (r == 0) return fd;
  int e = errno;
  // A Unix socket answers at once (EAGAIN: backlog full, retried after the session's backoff); vsock and
  // TCP report EINPROGRESS and finish later: wait for writability up to the deadline.
  while (e == EINPROGRESS) {
    const std::uint64_t now = now_ms();
    if (now >= deadline_ms) {
      e = ETIMEDOUT;
      break;
    }
    if (!wait(static_cast<std::uint32_t>(std::min<std::uint64_t>(deadline_ms - now, 1u << 30)), fd.get())) {
      e = ECANCELED;
      break;
    }
    pollfd p{fd.get(), POLLOUT, 0};
    if (::poll(&p, 1, 0) != 1) continue;
    int soerr = 0;
    socklen_t len = sizeof soerr;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) soerr = errno;
    if (soerr == 0) return fd;
    e = soerr;
  }
  return base::errno_error(e);  // fd closed on the way out
}

base::Result<base::Fd> dial_once(const Channel& c, bool guest, std::uint64_t deadline_ms, const DialWait& wait,
                                 const std::function<std::uint64_t()>& now_ms) {
  if (auto* u = std::get_if<UnixAddr>(&c))
    return connect_socket(AF_UNIX, unix_sockaddr(*u), deadline_ms, wait, now_ms);
  if (auto* p = std::get_if<VirtioPortAddr>(&c)) {
    auto dev = find_virtio_port(p->name);
    if (!dev) return base::errno_error(ENOENT);
    base::Fd fd(::open(dev->c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    if (!fd) return base::errno_error(errno);
    return fd;
  }
  // vsock: only a real guest dials it (never a test, never a sandbox).
  if (!guest) return base::errno_error(EPERM);
  return connect_socket(AF_VSOCK, vsock_sockaddr(std::get<VsockAddr>(c)), deadline_ms, wait, now_ms);
}

base::Result<base::Fd> dial_once(const Channel& c, bool guest) {
  return dial_once(c, guest, 0, [](std::uint32_t, int) { return true; }, [] { return std::uint64_t{0}; });
}

bool retryable(int err) {
  switch (err) {
    case ENOENT:        // socket path / virtio port not there yet
    case ECONNREFUSED:  // nobody listening yet
    case ECONNRESET:    // vsock: host listener not up yet
    case ENODEV:        // vsock transport not loaded yet
    case EAGAIN:
    case EINTR:
    case ETIMEDOUT:
    case ENXIO:         // virtio port present but host side not ready
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EADDRNOTAVAIL:
    case EAFNOSUPPORT:  // vsock module still loading
    case ENOTCONN:      // virtio port open, its host side not connected (yet)
    case ECANCELED:     // the attempt was cut short by a signal, not refused
      return true;
    default:
      return false;
  }
}

}  // namespace nes::init
