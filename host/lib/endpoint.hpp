// Endpoints: where a guest's byte stream arrives. Identity comes only from the endpoint (which
// socket, which vsock CID), never from guest data (docs/host.md "Identity").
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "host/lib/base.hpp"

struct sockaddr_vm;

namespace nes::host {

/// Capacity of sockaddr_un::sun_path on Linux, in bytes, including the terminating NUL.
inline constexpr std::size_t kSunPathSize = 108;

/// Firecracker / Cloud Hypervisor: a guest connection to vsock port `port` arrives on the Unix
/// socket `<uds_path>_<port>` (their hybrid-vsock convention; docs/facts.md "VMM facts").
std::string firecracker_vsock_path(std::string_view uds_path, std::uint32_t port);
/// libkrun: krun_add_vsock_port(ctx, port, path) maps the port to exactly `path`.
std::string libkrun_vsock_path(std::string_view path);

/// How to create a per-VM Unix listener.
struct UnixListenOptions {
  std::string path;
  mode_t mode = 0600;                 // socket file mode (a jailed VMM may need group access)
  std::optional<uid_t> owner;         // chown the socket (a jailed VMM may run as another user)
  std::optional<gid_t> group;
  int backlog = 16;
};

/// Check a path fits sun_path: error "unix socket path is N bytes; at most 107 fit in sun_path".
Status check_sun_path(std::string_view path);

/// Bind and listen on a Unix socket: create a missing parent directory with mode 0700; if the path
/// exists, probe it with connect(): a live listener means "in use" (refused, never stolen); a dead
/// socket is unlinked; anything that is not a socket is refused. Then chmod/chown as asked.
/// Returns the listening fd (non-blocking, CLOEXEC).
Result<Fd> listen_unix(const UnixListenOptions& opt);

/// VMADDR_CID_ANY.
inline constexpr std::uint32_t kVsockCidAny = 0xFFFFFFFFu;
/// The host's own CID; guests dial it (docs/protocol.md "Transport").
inline constexpr std::uint32_t kVsockCidHost = 2;

/// A sockaddr_vm for `cid:port` (svm_family AF_VSOCK). Pure: builds bytes, opens nothing.
sockaddr_vm vsock_address(std::uint32_t cid, std::uint32_t port);
/// The CID in an address accept() returned; nullopt if it is not an AF_VSOCK address of the
/// right size.
std::optional<std::uint32_t> vsock_peer_cid(const void* addr, std::size_t len);

/// Peer CID -> VM id, for a vhost-vsock listener on VMADDR_CID_ANY. Guest CIDs are >= 3
/// (0 hypervisor, 1 local, 2 host, 0xFFFFFFFF any are reserved).
class CidRegistry {
 public:
  /// Map `cid` to `vm`. Errors: reserved CID, CID already mapped to another VM.
  Status add(std::uint32_t cid, std::string vm);
  /// Forget `cid`.
  void remove(std::uint32_t cid);
  /// Forget every CID mapped to `vm`.
  void remove_vm(const std::string& vm);
  /// The VM of an accepted peer; nullopt = unknown CID, refuse the connection.
  std::optional<std::string> lookup(std::uint32_t cid) const;
  std::size_t size() const { return map_.size(); }

 private:
  std::map<std::uint32_t, std::string> map_;
};

/// Create, bind and listen an AF_VSOCK socket on VMADDR_CID_ANY:port (non-blocking, CLOEXEC).
/// Never used by tests on these machines (docs/facts.md: never touch AF_VSOCK here).
Result<Fd> listen_vsock(std::uint32_t port, int backlog = 128);

/// Parse "unix:PATH", "vsock:PORT" or "fd:N" (--listen). `kind` is the prefix.
struct ListenSpec {
  enum class Kind { unix_path, vsock, fd } kind = Kind::unix_path;
  std::string path;
  std::uint32_t port = 0;
  int fd = -1;
};
Result<ListenSpec> parse_listen_spec(std::string_view s);

}  // namespace nes::host
