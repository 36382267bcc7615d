#include "host/lib/network.hpp"

#include <fmt/format.h>

#include <charconv>

#include "host/lib/record.hpp"
#include "protocol/codec.hpp"

namespace nes::host {

namespace {

proto::IpAddr v4(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
  proto::IpAddr x;
  x.family = 4;
  x.bytes[0] = a, x.bytes[1] = b, x.bytes[2] = c, x.bytes[3] = d;
  return x;
}

/// A decimal port 1..65535; nullopt otherwise.
std::optional<std::uint16_t> port_number(std::string_view s) {
  unsigned v = 0;
  if (s.empty() || s.size() > 5 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 1 || v > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(v);
}

bool any_address(const proto::IpAddr& a) {
  for (auto b : a.bytes)
    if (b) return false;
  return true;
}

bool user_mode(NetworkMode m) { return m == NetworkMode::passt || m == NetworkMode::slirp; }

/// QEMU's and passt's text of a host address: "" for 0.0.0.0 (every address).
std::string bind_text(const proto::IpAddr& a) { return any_address(a) && a.family == 4 ? "" : proto::ip_text(a); }

}  // namespace

std::string_view to_string(NetworkMode m) {
  switch (m) {
    case NetworkMode::none: return "none";
    case NetworkMode::passt: return "passt";
    case NetworkMode::slirp: return "slirp";
    case NetworkMode::netns: return "netns";
  }
  return "?";
}

proto::IpPrefix UserNet::guest() { return {v4(10, 0, 2, 15), 24}; }
proto::IpAddr UserNet::gateway() { return v4(10, 0, 2, 2); }
proto::IpAddr UserNet::dns() { return v4(10, 0, 2, 3); }
proto::MacAddr UserNet::mac() { return {0x52, 0x54, 0x00, 0x12, 0x34, 0x56}; }

Result<PortMapping> parse_publish(std::string_view v) {
  auto bad = [&](std::string_view why) { return Error{fmt::format("--publish {}: {}", v, why)}; };
  PortMapping m;
  std::string_view s = v;
  if (auto slash = s.rfind('/'); slash != std::string_view::npos) {
    std::string_view proto = s.substr(slash + 1);
    if (proto == "tcp") m.proto = IpProto::tcp;
    else if (proto == "udp") m.proto = IpProto::udp;
    else return bad("the protocol must be tcp or udp");
    s = s.substr(0, slash);
  }
  // [IP:]HOST:GUEST; an IPv6 IP is bracketed ("[::1]:8080:80").
  std::string_view ip;
  if (!s.empty() && s[0] == '[') {
    auto close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return bad("expected [IP:]HOST:GUEST[/tcp|/udp] (an IPv6 address in brackets)");
    ip = s.substr(1, close - 1);
    s = s.substr(close + 2);
  } else {
    auto first = s.find(':'), last = s.rfind(':');
    if (first == std::string_view::npos) return bad("expected [IP:]HOST:GUEST[/tcp|/udp] (a host port is required)");
    if (first != last) {
      ip = s.substr(0, first);
      s = s.substr(first + 1);
    }
  }
  auto colon = s.find(':');
  if (colon == std::string_view::npos || s.find(':', colon + 1) != std::string_view::npos)
    return bad("expected [IP:]HOST:GUEST[/tcp|/udp]");
  if (!ip.empty()) {
    auto a = proto::ip_from_text(ip);
    if (!a) return bad(fmt::format("'{}' is not an IPv4 or IPv6 address", ip));
    m.host_ip = *a;
  }
  auto hp = port_number(s.substr(0, colon)), gp = port_number(s.substr(colon + 1));
  if (!hp) return bad(fmt::format("host port '{}' must be 1..65535", s.substr(0, colon)));
  if (!gp) return bad(fmt::format("guest port '{}' must be 1..65535", s.substr(colon + 1)));
  m.host_port = *hp, m.guest_port = *gp;
  return m;
}

std::string to_string(const PortMapping& p) {
  std::string ip = proto::ip_text(p.host_ip);
  if (p.host_ip.family == 6) ip = "[" + ip + "]";
  return fmt::format("{}/{} -> {}:{}", p.guest_port, p.proto == IpProto::tcp ? "tcp" : "udp", ip, p.host_port);
}

std::string publish_text(const PortMapping& p) {
  std::string ip;
  if (p.host_ip.family == 6) ip = "[" + proto::ip_text(p.host_ip) + "]:";
  else if (!any_address(p.host_ip)) ip = proto::ip_text(p.host_ip) + ":";
  return fmt::format("{}{}:{}{}", ip, p.host_port, p.guest_port, p.proto == IpProto::udp ? "/udp" : "");
}

std::string ps_port_text(const PortMapping& p) {
  std::string ip = proto::ip_text(p.host_ip);
  if (p.host_ip.family == 6) ip = "[" + ip + "]";
  return fmt::format("{}:{}->{}/{}", ip, p.host_port, p.guest_port, p.proto == IpProto::tcp ? "tcp" : "udp");
}

Result<PortMapping> parse_ps_port_text(std::string_view text) {
  // "IP:HOST->GUEST/PROTO" is -p's "IP:HOST:GUEST/PROTO" with an arrow; the IP always present.
  auto arrow = text.find("->");
  auto slash = text.rfind('/');
  if (arrow != std::string_view::npos && arrow > 0 && slash != std::string_view::npos && slash > arrow &&
      (text[0] == '[' || text.find(':') < arrow)) {
    auto m = parse_publish(fmt::format("{}:{}", text.substr(0, arrow), text.substr(arrow + 2)));
    if (m) return m;
  }
  return Error{fmt::format("not a published port '{}' (expected IP:HOST->GUEST/tcp|udp)", text)};
}

Result<ExtraHost> parse_add_host(std::string_view v) {
  auto bad = [&](std::string_view why) { return Error{fmt::format("--add-host {}: {}", v, why)}; };
  auto sep = v.find_first_of(":=");
  if (sep == std::string_view::npos) return bad("expected NAME:IP or NAME:host-gateway");
  ExtraHost h{std::string(v.substr(0, sep)), std::nullopt};
  std::string_view ip = v.substr(sep + 1);
  if (!proto::valid_dns_name(h.name)) return bad("the name must be 1..253 of letters, digits, '-', '.', '_'");
  if (ip == "host-gateway") return h;
  if (ip.size() >= 2 && ip.front() == '[' && ip.back() == ']') ip = ip.substr(1, ip.size() - 2);
  auto a = proto::ip_from_text(ip);
  if (!a) return bad(fmt::format("'{}' is not an IPv4 or IPv6 address (or host-gateway)", ip));
  h.ip = *a;
  return h;
}

Status parse_network_mode(std::string_view v, NetworkSpec& into) {
  if (v == "none") return into.mode = NetworkMode::none, Ok();
  if (v == "user" || v == "passt" || v == "pasta") return into.mode = NetworkMode::passt, Ok();
  if (v == "slirp" || v == "slirp4netns") return into.mode = NetworkMode::slirp, Ok();
  if (v.starts_with("netns:")) {
    std::filesystem::path p(v.substr(6));
    if (!p.is_absolute())
      return Error{fmt::format("--network {}: netns:PATH needs an absolute path to a network namespace", v)};
    into.mode = NetworkMode::netns;
    into.netns = std::move(p);
    return Ok();
  }
  return Error{fmt::format("--network {}: unknown mode (user, passt, slirp, none or netns:PATH)", v)};
}

Status check_network(const NetworkSpec& s) {
  const auto mode = to_string(s.mode);
  if (!s.publish.empty() && !user_mode(s.mode))
    return Error{fmt::format("--publish needs --network user (passt) or slirp (it is {}: {})", mode,
                             s.mode == NetworkMode::none ? "the guest has no NIC"
                                                         : "the namespace's own address is the VM's")};
  // passt runs IPv4-only (--ipv4-only) and QEMU's hostfwd= takes no IPv6 address: an IPv6 host
  // address would only fail once they start.
  for (const auto& p : s.publish)
    if (p.host_ip.family == 6)
      return Error{fmt::format("--publish {}: an IPv6 host address is not supported (the VM's user-mode network "
                               "is IPv4; publish on an IPv4 address such as 127.0.0.1 or 0.0.0.0)", publish_text(p))};
  for (std::size_t i = 0; i < s.publish.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) {
      const auto &a = s.publish[i], &b = s.publish[j];
      bool overlap = a.proto == b.proto && a.host_port == b.host_port &&
                     (a.host_ip == b.host_ip || any_address(a.host_ip) || any_address(b.host_ip));
      if (overlap) return Error{fmt::format("--publish {}: host port {} is published twice", publish_text(a), a.host_port)};
    }
  for (const auto& h : s.hosts)
    if (!h.ip && !user_mode(s.mode))
      return Error{fmt::format("--add-host {}:host-gateway needs --network user (passt) or slirp (it is {})", h.name, mode)};
  if (s.dns.size() > proto::kNetMaxNameservers)
    return Error{fmt::format("--dns: at most {} nameservers (resolv.conf's MAXNS), got {}",
                             proto::kNetMaxNameservers, s.dns.size())};
  if (s.dns_search.size() > proto::kNetMaxSearch)
    return Error{fmt::format("--dns-search: at most {} domains, got {}", proto::kNetMaxSearch, s.dns_search.size())};
  for (const auto& d : s.dns_search)
    if (!proto::valid_dns_name(d))
      return Error{fmt::format("--dns-search {}: a domain is 1..253 of letters, digits, '-', '.', '_'", d)};
  if (s.dns_options.size() > proto::kNetMaxOptions)
    return Error{fmt::format("--dns-option: at most {} options, got {}", proto::kNetMaxOptions, s.dns_options.size())};
  for (const auto& o : s.dns_options)
    if (!proto::valid_dns_option(o))
      return Error{fmt::format("--dns-option '{}': a resolv.conf option is 1..64 printable bytes, no spaces", o)};
  if (s.hosts.size() > proto::kNetMaxHosts)
    return Error{fmt::format("--add-host: at most {} entries, got {}", proto::kNetMaxHosts, s.hosts.size())};
  if (s.mode == NetworkMode::netns && s.netns.empty()) return Error{"--network netns:PATH: no PATH"};
  return Ok();
}

Result<std::optional<proto::Network>> guest_network(const NetworkSpec& s) {
  if (auto c = check_network(s); !c) return c.error();
  proto::Network n;
  const bool has_link = s.mode != NetworkMode::none;
  if (user_mode(s.mode)) {
    n.interfaces.push_back({UserNet::mac(), 0, {UserNet::guest()}});
    n.routes.push_back({{v4(0, 0, 0, 0), 0}, UserNet::gateway(), std::nullopt});
  } else if (s.mode == NetworkMode::netns) {
    if (!s.link) return Error{fmt::format("--network netns:{}: the namespace's interface was not read", s.netns.native())};
    n.interfaces.push_back({s.link->mac, s.link->mtu, s.link->addresses});
    n.routes = s.link->routes;
  }
  for (const auto& h : s.hosts) n.hosts.push_back({h.name, h.ip ? *h.ip : UserNet::gateway()});
  if (!s.dns.empty() || !s.dns_search.empty() || !s.dns_options.empty() || user_mode(s.mode)) {
    proto::Dns d;
    d.nameservers = s.dns;
    if (d.nameservers.empty() && user_mode(s.mode)) d.nameservers.push_back(UserNet::dns());
    d.search = s.dns_search;
    d.options = s.dns_options;
    n.dns = std::move(d);
  }
  if (!has_link && n.hosts.empty() && !n.dns) return std::optional<proto::Network>();
  return std::optional<proto::Network>(std::move(n));
}

Result<std::vector<std::string>> qemu_net_args(const NetworkSpec& s, const NetBackendIo& io) {
  if (auto c = check_network(s); !c) return c.error();
  std::vector<std::string> a;
  proto::MacAddr mac = UserNet::mac();
  switch (s.mode) {
    case NetworkMode::none: return a;
    case NetworkMode::passt:
      if (!io.passt_fd) return Error{"--network passt: no socket to passt (NetBackendIo::passt_fd)"};
      // QEMU 7.2's stream netdev on an inherited, connected socket: passt's qemu protocol.
      a = {"-netdev", fmt::format("stream,id=net0,server=off,addr.type=fd,addr.str={}", *io.passt_fd)};
      break;
    case NetworkMode::slirp: {
      std::string nd = fmt::format("user,id=net0,net=10.0.2.0/24,host={},dns={},ipv6=off",
                                   proto::ip_text(UserNet::gateway()), proto::ip_text(UserNet::dns()));
      for (const auto& p : s.publish)
        nd += fmt::format(",hostfwd={}:{}:{}-:{}", p.proto == IpProto::tcp ? "tcp" : "udp",
                          bind_text(p.host_ip), p.host_port, p.guest_port);
      a = {"-netdev", nd};
      break;
    }
    case NetworkMode::netns:
      if (!s.link || s.link->tap.empty())
        return Error{fmt::format("--network netns:{}: no tap was made in the namespace", s.netns.native())};
      mac = s.link->mac;
      a = {"-netdev", fmt::format("tap,id=net0,ifname={},script=no,downscript=no", s.link->tap)};
      break;
  }
  // romfile=: no PXE option ROM (nothing boots from the network; it costs boot time and a file).
  a.insert(a.end(), {"-device", fmt::format("virtio-net-pci,netdev=net0,mac={},romfile=", proto::mac_text(mac))});
  return a;
}

Result<std::string> qmp_nic_device(const NetworkSpec& s, std::string_view bus) {
  if (auto c = check_network(s); !c) return c.error();
  if (s.mode == NetworkMode::none) return Error{"--network none: no NIC to plug in"};
  if (s.mode == NetworkMode::netns && (!s.link || s.link->tap.empty()))
    return Error{fmt::format("--network netns:{}: no tap was made in the namespace", s.netns.native())};
  const proto::MacAddr mac = s.mode == NetworkMode::netns ? s.link->mac : UserNet::mac();
  return fmt::format(R"({{"driver":"virtio-net-pci","id":"nic0","netdev":"net0","mac":"{}","romfile":"","bus":{}}})",
                     proto::mac_text(mac), json_string(bus));
}

Result<std::vector<std::string>> passt_argv(const NetworkSpec& s, const std::string& program, int fd) {
  if (s.mode != NetworkMode::passt)
    return Error{fmt::format("passt serves --network passt only (it is {})", to_string(s.mode))};
  if (auto c = check_network(s); !c) return c.error();
  bool host_gateway = false;
  for (const auto& h : s.hosts) host_gateway = host_gateway || !h.ip;
  std::vector<std::string> a{program, "--foreground", "--quiet", "--fd", std::to_string(fd), "--ipv4-only",
                             "--address", proto::ip_text(UserNet::guest().addr), "--netmask",
                             std::to_string(UserNet::guest().len), "--gateway", proto::ip_text(UserNet::gateway()),
                             "--dns-forward", proto::ip_text(UserNet::dns()), "--no-dhcp"};
  if (!host_gateway) a.push_back("--no-map-gw");
  for (const auto& p : s.publish) {
    std::string ip = bind_text(p.host_ip);
    a.push_back(p.proto == IpProto::tcp ? "--tcp-ports" : "--udp-ports");
    a.push_back(fmt::format("{}{}{}:{}", ip, ip.empty() ? "" : "/", p.host_port, p.guest_port));
  }
  return a;
}

}  // namespace nes::host
