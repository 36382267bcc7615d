// The channel's transports: a Unix stream socket, a virtio-serial port found by name, or vsock.
// All carry the same byte protocol; this file only finds and opens the fd.
// Safety: an AF_VSOCK socket is only ever connected in guest mode (dial refuses otherwise);
// tests exercise the vsock address handling only (docs/facts.md: CID 2 here is the machine's own
// hypervisor).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "base/fd.hpp"
#include "base/result.hpp"
#include "config.hpp"

namespace nes::init {

/// The sockaddr for a vsock address (AF_VSOCK, svm_cid, svm_port) in a sockaddr_storage, and
/// its length. Pure: builds bytes, opens nothing.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
};
SockAddr vsock_sockaddr(const VsockAddr& a);
/// The sockaddr_un for a Unix path (length checked by parse_channel: <= 107 bytes).
SockAddr unix_sockaddr(const UnixAddr& a);

/// Find the virtio-serial port named `name`: the directory D under `sysfs_dir` (default
/// /sys/class/virtio-ports) whose `name` file holds it (trailing newline ignored); returns
/// `dev_dir`/D (e.g. /dev/vport0p1), or nullopt if no port has that name (yet).
std::optional<std::string> find_virtio_port(const std::string& name,
                                            const std::string& sysfs_dir = "/sys/class/virtio-ports",
                                            const std::string& dev_dir = "/dev");

/// How dialling waits: `wait(ms, fd)` returns after at most `ms` milliseconds, or earlier when
/// `fd` (if >= 0) is writable; false means "abandon dialling" (a shutdown signal arrived).
using DialWait = std::function<bool(std::uint32_t ms, int fd)>;

/// A SOCK_STREAM socket of `domain` (non-blocking, CLOEXEC) connected to `a` without ever
/// blocking: a connect that is in progress (vsock, TCP) is waited for through `wait`, up to
/// `deadline_ms` on `now_ms`'s clock. The error's `err`: ETIMEDOUT past the deadline, ECANCELED
/// when `wait` said abandon, EAGAIN for a Unix listener whose backlog is full; its message is
/// strerror(err).
base::Result<base::Fd> connect_socket(int domain, const SockAddr& a, std::uint64_t deadline_ms, const DialWait& wait,
                   const std::function<std::uint64_t()>& now_ms);

/// One attempt: a connected/opened fd (O_CLOEXEC, non-blocking), or the error (err = errno,
/// message = strerror). `guest` must be true for vsock, else EPERM without creating any socket.
/// An in-progress connect is bounded by `deadline_ms` and cut short by `wait` (see
/// connect_socket).
base::Result<base::Fd> dial_once(const Channel& c, bool guest, std::uint64_t deadline_ms, const DialWait& wait,
              const std::function<std::uint64_t()>& now_ms);
/// dial_once without waiting: an in-progress connect fails at once with ETIMEDOUT.
base::Result<base::Fd> dial_once(const Channel& c, bool guest);

/// Whether a failed attempt's errno is worth retrying: the peer is not there *yet* (no listener,
/// no port, its host side not connected) or the attempt was cut short (ECANCELED: a signal).
bool retryable(int err);

}  // namespace nes::init
