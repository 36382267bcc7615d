#include "host/lib/endpoint.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
// clang-format off
#include <linux/vm_sockets.h>
// clang-format on

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fmt/format.h>

#include "protocol/limits.hpp"

namespace nes::host {

std::string firecracker_vsock_path(std::string_view uds_path, std::uint32_t port) {
  return fmt::format("{}_{}", uds_path, port);
}

std::string libkrun_vsock_path(std::string_view path) { return std::string(path); }

static_assert(kSunPathSize == proto::kUnixPathMax + 1, "one sun_path size for both ends");

Status check_sun_path(std::string_view path) {
  if (path.empty()) return Error{"unix socket path is empty"};
  if (path.find('\0') != std::string_view::npos) return Error{"unix socket path contains a NUL byte"};
  if (path.size() >= kSunPathSize)
    return Error{fmt::format("unix socket path is {} bytes; at most {} fit in sun_path: {}",
                             path.size(), kSunPathSize - 1, path)};
  return Ok{};
}

namespace {
sockaddr_un unix_address(std::string_view path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

/// Is something listening at `path`? connect() with a non-blocking socket: success or EAGAIN
/// (backlog full) = live; ECONNREFUSED = a dead socket file.
Result<bool> probe_live(const std::string& path) {
  Fd s{::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  if (!s) return Error{fmt::format("socket: {}", std::strerror(errno))};
  auto a = unix_address(path);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return true;
  if (errno == EAGAIN || errno == EINPROGRESS) return true;
  if (errno == ECONNREFUSED) return false;
  if (errno == ENOENT) return false;
  return Error{fmt::format("probing {}: {}", path, std::strerror(errno))};
}
}  // namespace

Result<Fd> listen_unix(const UnixListenOptions& opt) {
  if (auto s = check_sun_path(opt.path); !s) return s.error();
  std::string parent = opt.path;
  if (auto slash = parent.rfind('/'); slash != std::string::npos && slash > 0) {
    parent.resize(slash);
    if (::mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST)
      return Error{fmt::format("mkdir {}: {}", parent, std::strerror(errno))};
  }
  struct stat st{};
  if (::lstat(opt.path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return Error{fmt::format("{}: exists and is not a socket; refusing to replace it", opt.path)};
    auto live = probe_live(opt.path);
    if (!live) return live.error();
    if (*live) return Error{fmt::format("{}: in use by a live listener", opt.path)};
    if (::unlink(opt.path.c_str()) != 0 && errno != ENOENT)
      return Error{fmt::format("unlink stale {}: {}", opt.path, std::strerror(errno))};
  }
  Fd s{::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  if (!s) return Error{fmt::format("socket: {}", std::strerror(errno))};
  auto a = unix_address(opt.path);
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    return Error{fmt::format("bind {}: {}", opt.path, std::strerror(errno))};
  // The parent is 0700 when we created it, so the window before chmod exposes nothing.
  if (::chmod(opt.path.c_str(), opt.mode) != 0) {
    int e = errno;
    ::unlink(opt.path.c_str());
    return Error{fmt::format("chmod {}: {}", opt.path, std::strerror(e))};
  }
  if (opt.owner || opt.group) {
    if (::lchown(opt.path.c_str(), opt.owner ? *opt.owner : static_cast<uid_t>(-1),
                 opt.group ? *opt.group : static_cast<gid_t>(-1)) != 0) {
      int e = errno;
      ::unlink(opt.path.c_str());
      return Error{fmt::format("chown {}: {}", opt.path, std::strerror(e))};
    }
  }
  if (::listen(s.get(), opt.backlog) != 0) {
    int e = errno;
    ::unlink(opt.path.c_str());
    return Error{fmt::format("listen {}: {}", opt.path, std::strerror(e))};
  }
  return s;
}

sockaddr_vm vsock_address(std::uint32_t cid, std::uint32_t port) {
  sockaddr_vm a{};
  a.svm_family = AF_VSOCK;
  a.svm_cid = cid;
  a.svm_port = port;
  return a;
}

std::optional<std::uint32_t> vsock_peer_cid(const void* addr, std::size_t len) {
  if (addr == nullptr || len < sizeof(sockaddr_vm)) return std::nullopt;
  sockaddr_vm a;
  std::memcpy(&a, addr, sizeof a);
  if (a.svm_family != AF_VSOCK) return std::nullopt;
  return a.svm_cid;
}

Status CidRegistry::add(std::uint32_t cid, std::string vm) {
  if (cid <= kVsockCidHost || cid == kVsockCidAny)
    return Error{fmt::format("cid: {} is reserved; guest CIDs are 3..4294967294", cid)};
  auto [it, inserted] = map_.emplace(cid, vm);
  if (!inserted && it->second != vm)
    return Error{fmt::format("cid: {} is already mapped to vm '{}'", cid, it->second)};
  return Ok{};
}

void CidRegistry::remove(std::uint32_t cid) { map_.erase(cid); }

void CidRegistry::remove_vm(const std::string& vm) {
  std::erase_if(map_, [&](const auto& kv) { return kv.second == vm; });
}

std::optional<std::string> CidRegistry::lookup(std::uint32_t cid) const {
  auto it = map_.find(cid);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

Result<Fd> listen_vsock(std::uint32_t port, int backlog) {
  Fd s{::socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  if (!s) return Error{fmt::format("socket(AF_VSOCK): {}", std::strerror(errno))};
  auto a = vsock_address(kVsockCidAny, port);
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    return Error{fmt::format("bind vsock:{}: {}", port, std::strerror(errno))};
  if (::listen(s.get(), backlog) != 0)
    return Error{fmt::format("listen vsock:{}: {}", port, std::strerror(errno))};
  return s;
}

Result<ListenSpec> parse_listen_spec(std::string_view s) {
  auto number = [](std::string_view v, std::uint64_t max) -> std::optional<std::uint64_t> {
    std::uint64_t x = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || p != v.data() + v.size() || v.empty() || x > max) return std::nullopt;
    return x;
  };
  ListenSpec spec;
  if (s.starts_with("unix:")) {
    spec.kind = ListenSpec::Kind::unix_path;
    spec.path = std::string(s.substr(5));
    if (auto st = check_sun_path(spec.path); !st) return Error{"--listen: " + st.error().message};
    return spec;
  }
  if (s.starts_with("vsock:")) {
    auto p = number(s.substr(6), 0xFFFFFFFEu);
    if (!p) return Error{fmt::format("--listen: bad vsock port '{}' (expected 0..4294967294)", s.substr(6))};
    spec.kind = ListenSpec::Kind::vsock;
    spec.port = static_cast<std::uint32_t>(*p);
    return spec;
  }
  if (s.starts_with("fd:")) {
    auto p = number(s.substr(3), 1u << 30);
    if (!p) return Error{fmt::format("--listen: bad fd '{}'", s.substr(3))};
    spec.kind = ListenSpec::Kind::fd;
    spec.fd = static_cast<int>(*p);
    return spec;
  }
  return Error{fmt::format("--listen: expected unix:PATH, vsock:PORT or fd:N, got '{}'", s)};
}

}  // namespace nes::host
