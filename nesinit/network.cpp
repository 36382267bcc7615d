#include "network.hpp"

#include <fcntl.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "base/fd.hpp"
#include "netlink.hpp"
#include "protocol/codec.hpp"

namespace nes::init {

namespace {

using proto::ip_text;
using proto::mac_text;
using proto::prefix_text;

proto::NetworkFailed failed(std::string iface, std::string step, std::string reason, int err) {
  return proto::NetworkFailed{std::move(iface), std::move(step), std::move(reason), err};
}

/// Send `r` and read its answer; links of a dump go to `links`. 0 or a positive errno.
int call(base::nl::Socket& rtnl, nl::Request r, std::vector<nl::Link>* links = nullptr) {
  std::vector<nl::Link> scratch;  // one instantiation of Socket::call for every request
  std::vector<nl::Link>& out = links ? *links : scratch;
  return rtnl.call(r, [&](std::uint16_t type, std::span<const std::byte> body) {
    return type != RTM_NEWLINK || base::nl::parse_link(body, out);
  });
}

/// The index of the link with `mac`, waiting up to `wait_ms` for it to appear; 0 if none.
int find_link(base::nl::Socket& rtnl, const proto::MacAddr& mac, int wait_ms, int& err) {
  timespec start{};
  ::clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    std::vector<nl::Link> links;
    err = call(rtnl, nl::get_links(), &links);
    if (err) return 0;
    for (const auto& l : links)
      if (l.has_mac && l.mac == mac) return l.index;
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    if ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 >= wait_ms) {
      err = ENODEV;
      return 0;
    }
    timespec tick{0, 20 * 1000 * 1000};  // 20 ms between looks: the driver's probe is not an event here
    ::nanosleep(&tick, nullptr);
  }
}

/// A scratch tmpfs for the /etc files, mounted over /run only while they are bound (in the
/// init's own mount namespace, before the workload exists) and then detached: the binds keep its
/// files and nothing is written into any file system the guest or the machine keeps (a root
/// without /etc gets an empty one to bind over, as runc makes docker's mount points). (A memfd cannot be bound: its mount is not in this namespace.)
class Scratch {
 public:
  static constexpr const char* kAt = "/run";
  int mount() {
    if (::mount("nesinit-etc", kAt, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,mode=0755") != 0) return errno;
    mounted_ = true;
    return 0;
  }
  ~Scratch() {
    if (mounted_) ::umount2(kAt, MNT_DETACH);
  }

  /// Bind a file holding `text` over `target` in /etc (created empty if missing, /etc too). 0 or errno; `step` says
  /// which call failed.
  int bind_text(const char* name, const std::string& text, const char* target, std::string& step) {
    const std::string src = fmt::format("{}/{}", kAt, name);
    {
      base::Fd f(::open(src.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
      if (!f) return step = "create " + src, errno;
      for (std::size_t at = 0; at < text.size();) {
        ssize_t n = ::write(f.get(), text.data() + at, text.size() - at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return step = "write", n < 0 ? errno : EIO;
        at += static_cast<std::size_t>(n);
      }
    }
    struct stat st{};
    if (::stat(target, &st) != 0) {
      if (::mkdir("/etc", 0755) != 0 && errno != EEXIST) return step = "mkdir /etc", errno;
      base::Fd t(::open(target, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
      if (!t) return step = "create", errno;
    }
    if (::mount(src.c_str(), target, nullptr, MS_BIND, nullptr) != 0) return step = "bind", errno;
    return 0;
  }

 private:
  bool mounted_ = false;
};

}  // namespace

std::string render_resolv_conf(const proto::Dns& dns) {
  std::string out = "# written by nesinit from the boot descriptor (boot.network.dns)\n";
  for (const auto& ns : dns.nameservers) out += fmt::format("nameserver {}\n", ip_text(ns));
  if (!dns.search.empty()) {
    out += "search";
    for (const auto& d : dns.search) out += " " + d;
    out += "\n";
  }
  if (!dns.options.empty()) {
    out += "options";
    for (const auto& o : dns.options) out += " " + o;
    out += "\n";
  }
  return out;
}

std::string render_hosts(const proto::Network& net, const std::optional<std::string>& hostname) {
  std::string out =
      "127.0.0.1\tlocalhost\n"
      "::1\tlocalhost ip6-localhost ip6-loopback\n"
      "fe00::0\tip6-localnet\n"
      "ff00::0\tip6-mcastprefix\n"
      "ff02::1\tip6-allnodes\n"
      "ff02::2\tip6-allrouters\n";
  if (hostname && !net.interfaces.empty())
    for (const auto& a : net.interfaces.front().addresses) out += fmt::format("{}\t{}\n", ip_text(a.addr), *hostname);
  for (const auto& h : net.hosts) out += fmt::format("{}\t{}\n", ip_text(h.ip), h.name);
  return out;
}

base::StatusOf<proto::NetworkFailed> configure_network(const proto::Network& net,
                                                       const std::optional<std::string>& hostname,
                                                       const Log& log, int link_wait_ms) {
  base::nl::Socket rtnl;
  if (auto o = rtnl.open(); !o) return failed("-", "netlink", o.error().message, o.error().err);
  std::vector<int> index(net.interfaces.size());
  for (std::size_t i = 0; i < net.interfaces.size(); ++i) {
    const auto& nic = net.interfaces[i];
    const std::string mac = mac_text(nic.mac);
    int err = 0;
    index[i] = find_link(rtnl, nic.mac, link_wait_ms, err);
    if (!index[i])
      return failed(mac, "find", fmt::format("no link with MAC {} within {} ms: {}", mac, link_wait_ms, std::strerror(err)), err);
    if (int e = call(rtnl, nl::set_link_up(index[i], nic.mtu)))
      return failed(mac, nic.mtu ? "mtu" : "up", fmt::format("link {} up{}: {}", index[i],
                    nic.mtu ? fmt::format(" with MTU {}", nic.mtu) : "", std::strerror(e)), e);
    for (const auto& a : nic.addresses) {
      if (int e = call(rtnl, nl::add_address(index[i], a)))
        return failed(mac, "address", fmt::format("{}: {}", prefix_text(a), std::strerror(e)), e);
    }
    log.info("network", "{} (link {}) up{}, {} address(es)", mac, index[i],
             nic.mtu ? fmt::format(" mtu {}", nic.mtu) : "", nic.addresses.size());
  }
  for (const auto& r : net.routes) {
    std::size_t i = 0;
    if (r.mac)
      while (i < net.interfaces.size() && net.interfaces[i].mac != *r.mac) ++i;
    if (i >= index.size()) return failed("-", "route", "no interface for the route", EINVAL);  // codec refuses
    const std::string what = prefix_text(r.to) + (r.via ? " via " + ip_text(*r.via) : std::string());
    if (int e = call(rtnl, nl::add_route(index[i], r)))
      return failed(mac_text(net.interfaces[i].mac), "route", fmt::format("{}: {}", what, std::strerror(e)), e);
    log.info("network", "route {}", what);
  }
  Scratch scratch;
  if (int e = scratch.mount()) return failed("files", "scratch", fmt::format("tmpfs on {}: {}", Scratch::kAt, std::strerror(e)), e);
  std::string step;
  if (net.dns) {
    if (int e = scratch.bind_text("resolv.conf", render_resolv_conf(*net.dns), "/etc/resolv.conf", step))
      return failed("files", "resolv.conf", fmt::format("/etc/resolv.conf: {}: {}", step, std::strerror(e)), e);
  }
  if (int e = scratch.bind_text("hosts", render_hosts(net, hostname), "/etc/hosts", step))
    return failed("files", "hosts", fmt::format("/etc/hosts: {}: {}", step, std::strerror(e)), e);
  if (hostname) {
    if (int e = scratch.bind_text("hostname", *hostname + "\n", "/etc/hostname", step))
      return failed("files", "hostname", fmt::format("/etc/hostname: {}: {}", step, std::strerror(e)), e);
  }
  return base::Ok{};
}

}  // namespace nes::init
