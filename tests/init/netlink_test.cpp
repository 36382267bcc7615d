// The init's rtnetlink requests and reply parsing (nesinit/netlink.hpp), byte by byte against the
// kernel's UAPI structures; and the /etc files it writes (nesinit/network.hpp). The requests
// against a real kernel: tests/init/e2e_network_test.cpp.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <linux/if.h>
#include <linux/if_addr.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>

#include <cstring>
#include <map>
#include <vector>

#include "nesinit/netlink.hpp"
#include "nesinit/network.hpp"

using namespace nes;
using namespace nes::init;

namespace {

proto::IpAddr ip(const char* text) {
  proto::IpAddr a;
  if (inet_pton(AF_INET, text, a.bytes.data()) == 1) return a.family = 4, a;
  REQUIRE(inet_pton(AF_INET6, text, a.bytes.data()) == 1);
  return a.family = 6, a;
}

/// A request taken apart: its header, its family header's bytes and its attributes by type.
struct Parsed {
  nlmsghdr h{};
  std::vector<std::byte> family;
  std::map<int, std::vector<std::byte>> attrs;
};

template <class Family>
Parsed take_apart(std::span<const std::byte> b) {
  Parsed p;
  REQUIRE(b.size() >= sizeof(nlmsghdr));
  std::memcpy(&p.h, b.data(), sizeof p.h);
  REQUIRE(p.h.nlmsg_len == b.size());
  const std::size_t fam_at = NLMSG_HDRLEN;
  p.family.assign(b.begin() + fam_at, b.begin() + fam_at + sizeof(Family));
  std::size_t at = fam_at + NLMSG_ALIGN(sizeof(Family));
  while (at < b.size()) {
    rtattr a;
    REQUIRE(at + sizeof a <= b.size());
    std::memcpy(&a, b.data() + at, sizeof a);
    REQUIRE(a.rta_len >= sizeof a);
    REQUIRE(at + a.rta_len <= b.size());
    CHECK(p.attrs.count(a.rta_type) == 0);
    p.attrs[a.rta_type].assign(b.begin() + at + RTA_LENGTH(0), b.begin() + at + a.rta_len);
    at += RTA_ALIGN(a.rta_len);
  }
  CHECK(at == b.size());
  return p;
}

template <class T>
T as(const std::vector<std::byte>& v) {
  T t{};
  REQUIRE(v.size() == sizeof t);
  std::memcpy(&t, v.data(), sizeof t);
  return t;
}

std::vector<std::byte> bytes_of(const void* p, std::size_t n) {
  auto* b = static_cast<const std::byte*>(p);
  return {b, b + n};
}

/// Append one netlink message (header + payload, aligned) to `out`.
void put_msg(std::vector<std::byte>& out, std::uint16_t type, std::uint32_t seq, const std::vector<std::byte>& payload) {
  nlmsghdr h{};
  h.nlmsg_len = static_cast<std::uint32_t>(NLMSG_HDRLEN + payload.size());
  h.nlmsg_type = type;
  h.nlmsg_seq = seq;
  auto hb = bytes_of(&h, sizeof h);
  out.insert(out.end(), hb.begin(), hb.end());
  out.resize(out.size() + NLMSG_HDRLEN - sizeof h);
  out.insert(out.end(), payload.begin(), payload.end());
  out.resize(NLMSG_ALIGN(out.size()));
}

void put_attr(std::vector<std::byte>& out, std::uint16_t type, const void* data, std::size_t len) {
  rtattr a{};
  a.rta_type = type;
  a.rta_len = static_cast<unsigned short>(RTA_LENGTH(len));
  auto ab = bytes_of(&a, sizeof a);
  out.insert(out.end(), ab.begin(), ab.end());
  auto db = bytes_of(data, len);
  out.insert(out.end(), db.begin(), db.end());
  out.resize(out.size() + RTA_SPACE(len) - RTA_LENGTH(len));
}

std::vector<std::byte> link_payload(int index, const char* name, const std::vector<std::uint8_t>& mac) {
  ifinfomsg i{};
  i.ifi_index = index;
  auto p = bytes_of(&i, sizeof i);
  put_attr(p, IFLA_IFNAME, name, std::strlen(name) + 1);
  if (!mac.empty()) put_attr(p, IFLA_ADDRESS, mac.data(), mac.size());
  return p;
}

}  // namespace

TEST_CASE("set_link_up: RTM_NEWLINK on the index, IFF_UP in flags and change, IFLA_MTU only if given") {
  auto r = nl::set_link_up(7, 1400);
  auto p = take_apart<ifinfomsg>(r.bytes(42));
  CHECK(p.h.nlmsg_type == RTM_NEWLINK);
  CHECK(p.h.nlmsg_flags == (NLM_F_REQUEST | NLM_F_ACK));
  CHECK(p.h.nlmsg_seq == 42);
  auto i = as<ifinfomsg>(p.family);
  CHECK(i.ifi_index == 7);
  CHECK(i.ifi_flags == IFF_UP);
  CHECK(i.ifi_change == IFF_UP);
  CHECK(as<std::uint32_t>(p.attrs.at(IFLA_MTU)) == 1400);
  auto plain = nl::set_link_up(7, 0);
  CHECK(take_apart<ifinfomsg>(plain.bytes(1)).attrs.empty());
}

TEST_CASE("add_address: IPv4 local and address; IPv6 with NODAD") {
  auto v4 = take_apart<ifaddrmsg>(nl::add_address(3, {ip("10.0.2.15"), 24}).bytes(1));
  CHECK(v4.h.nlmsg_type == RTM_NEWADDR);
  CHECK(v4.h.nlmsg_flags == (NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL));
  auto m = as<ifaddrmsg>(v4.family);
  CHECK(m.ifa_family == AF_INET);
  CHECK(m.ifa_prefixlen == 24);
  CHECK(m.ifa_index == 3);
  const std::vector<std::byte> want = bytes_of(ip("10.0.2.15").bytes.data(), 4);
  CHECK(v4.attrs.at(IFA_LOCAL) == want);
  CHECK(v4.attrs.at(IFA_ADDRESS) == want);
  CHECK(v4.attrs.count(IFA_FLAGS) == 0);
  auto v6 = take_apart<ifaddrmsg>(nl::add_address(3, {ip("fd00::2"), 64}).bytes(2));
  auto m6 = as<ifaddrmsg>(v6.family);
  CHECK(m6.ifa_family == AF_INET6);
  CHECK(m6.ifa_prefixlen == 64);
  CHECK(v6.attrs.at(IFA_LOCAL) == bytes_of(ip("fd00::2").bytes.data(), 16));
  CHECK(as<std::uint32_t>(v6.attrs.at(IFA_FLAGS)) == IFA_F_NODAD);
}

TEST_CASE("add_route: default via a gateway (universe), on-link subnet (link scope), out of the index") {
  auto def = take_apart<rtmsg>(nl::add_route(4, {{ip("0.0.0.0"), 0}, ip("10.0.2.2"), std::nullopt}).bytes(1));
  CHECK(def.h.nlmsg_type == RTM_NEWROUTE);
  auto m = as<rtmsg>(def.family);
  CHECK(m.rtm_family == AF_INET);
  CHECK(m.rtm_dst_len == 0);
  CHECK(m.rtm_table == RT_TABLE_MAIN);
  CHECK(m.rtm_protocol == RTPROT_BOOT);
  CHECK(m.rtm_scope == RT_SCOPE_UNIVERSE);
  CHECK(m.rtm_type == RTN_UNICAST);
  CHECK(def.attrs.count(RTA_DST) == 0);  // the default route has no destination attribute
  CHECK(def.attrs.at(RTA_GATEWAY) == bytes_of(ip("10.0.2.2").bytes.data(), 4));
  CHECK(as<std::uint32_t>(def.attrs.at(RTA_OIF)) == 4);
  auto onlink = take_apart<rtmsg>(nl::add_route(4, {{ip("fd01::"), 48}, std::nullopt, std::nullopt}).bytes(1));
  auto m6 = as<rtmsg>(onlink.family);
  CHECK(m6.rtm_family == AF_INET6);
  CHECK(m6.rtm_dst_len == 48);
  CHECK(m6.rtm_scope == RT_SCOPE_LINK);
  CHECK(onlink.attrs.at(RTA_DST) == bytes_of(ip("fd01::").bytes.data(), 16));
  CHECK(onlink.attrs.count(RTA_GATEWAY) == 0);
}

TEST_CASE("get_links: a dump request") {
  auto p = take_apart<ifinfomsg>(nl::get_links().bytes(9));
  CHECK(p.h.nlmsg_type == RTM_GETLINK);
  CHECK((p.h.nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP);
}

TEST_CASE("parse: a dump's links, then DONE; other sequence numbers skipped") {
  std::vector<std::byte> d;
  put_msg(d, RTM_NEWLINK, 5, link_payload(1, "lo", {0, 0, 0, 0, 0, 0}));
  put_msg(d, RTM_NEWLINK, 4, link_payload(9, "stale", {1, 2, 3, 4, 5, 6}));  // an earlier request's
  put_msg(d, RTM_NEWLINK, 5, link_payload(2, "eth0", {0x52, 0x54, 0, 0x12, 0x34, 0x56}));
  put_msg(d, RTM_NEWLINK, 5, link_payload(3, "tun0", {}));  // no hardware address
  std::vector<nl::Link> links;
  auto r = nl::parse(d, 5, links);
  CHECK(!r.done);
  CHECK(!r.malformed);
  REQUIRE(links.size() == 3);
  CHECK(links[1].index == 2);
  CHECK(links[1].name == "eth0");
  CHECK(links[1].has_mac);
  CHECK(links[1].mac == proto::MacAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56});
  CHECK(!links[2].has_mac);
  std::vector<std::byte> done;
  int zero = 0;
  put_msg(done, NLMSG_DONE, 5, bytes_of(&zero, sizeof zero));
  auto r2 = nl::parse(done, 5, links);
  CHECK(r2.done);
  CHECK(r2.error == 0);
}

TEST_CASE("parse: an nlmsgerr ends a request with its errno; overruns are malformed, never read past") {
  nlmsgerr e{};
  e.error = -EEXIST;
  std::vector<std::byte> d;
  put_msg(d, NLMSG_ERROR, 3, bytes_of(&e, sizeof e));
  std::vector<nl::Link> links;
  auto r = nl::parse(d, 3, links);
  CHECK(r.done);
  CHECK(r.error == EEXIST);
  // A header that claims more than the datagram holds.
  auto cut = d;
  cut.resize(cut.size() - 4);
  CHECK(nl::parse(cut, 3, links).malformed);
  // An attribute that claims more than its message holds.
  std::vector<std::byte> bad;
  auto payload = link_payload(2, "eth0", {1, 2, 3, 4, 5, 6});
  rtattr over{};
  std::memcpy(&over, payload.data() + NLMSG_ALIGN(sizeof(ifinfomsg)), sizeof over);
  over.rta_len = 200;
  std::memcpy(payload.data() + NLMSG_ALIGN(sizeof(ifinfomsg)), &over, sizeof over);
  put_msg(bad, RTM_NEWLINK, 3, payload);
  CHECK(nl::parse(bad, 3, links).malformed);
  // Every truncation of a good datagram: never a crash, never a link read past the end.
  std::vector<std::byte> good;
  put_msg(good, RTM_NEWLINK, 3, link_payload(2, "eth0", {1, 2, 3, 4, 5, 6}));
  for (std::size_t n = 0; n < good.size(); ++n) {
    std::vector<nl::Link> l;
    (void)nl::parse(std::span(good.data(), n), 3, l);
    CHECK(l.empty());
  }
}

TEST_CASE("the /etc files: resolv.conf and hosts as docker writes them") {
  proto::Dns dns{{ip("10.0.2.3"), ip("2001:db8::53")}, {"lan", "corp.example"}, {"ndots:2"}};
  CHECK(render_resolv_conf(dns) ==
        "# written by nesinit from the boot descriptor (boot.network.dns)\n"
        "nameserver 10.0.2.3\nnameserver 2001:db8::53\nsearch lan corp.example\noptions ndots:2\n");
  CHECK(render_resolv_conf({}) == "# written by nesinit from the boot descriptor (boot.network.dns)\n");
  proto::Network net;
  net.interfaces.push_back({{2, 0, 0, 0, 0, 1}, 0, {{ip("10.0.2.15"), 24}}});
  net.hosts.push_back({"host.docker.internal", ip("10.0.2.2")});
  const std::string hosts = render_hosts(net, std::string("web"));
  CHECK(hosts.starts_with("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"));
  CHECK(hosts.ends_with("10.0.2.15\tweb\n10.0.2.2\thost.docker.internal\n"));
  CHECK(render_hosts(net, std::nullopt).find("web") == std::string::npos);
}
