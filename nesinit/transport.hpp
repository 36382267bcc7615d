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

#include "config.hpp"
#include "log.hpp"

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

/// One attempt: returns a connected/opened fd (O_CLOEXEC, non-blocking), or -errno.
/// `guest` must be true for vsock, else -EPERM without creating any socket.
int dial_once(const Channel& c, bool guest);

/// Whether a failed attempt's errno is worth retrying (the peer is not there *yet*).
bool retryable(int err);

/// Dial with bounded retry: attempts until success, a non-retryable error, or `timeout_ms` total.
/// Between attempts `wait(ms)` is called (backoff 10 ms doubling to 500 ms); it returns false to
/// abandon dialling (e.g. a shutdown signal arrived). Returns the fd, or -errno of the last
/// attempt (-ETIMEDOUT if none was made).
int dial(const Channel& c, bool guest, std::uint32_t timeout_ms,
         const std::function<bool(std::uint32_t)>& wait, const std::function<std::uint64_t()>& now_ms,
         const Log& log);

}  // namespace nes::init
