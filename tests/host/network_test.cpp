// host/lib/network.hpp: the flags' parsers (docker's -p and --add-host syntax, every error naming
// its flag), the cross-checks, and both halves built from one spec: the descriptor's `network`
// (checked by the codec's own validate) and QEMU's/passt's arguments.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "host/lib/network.hpp"
#include "protocol/codec.hpp"

using namespace nes;
using host::IpProto;
using host::NetworkMode;
using host::NetworkSpec;

namespace {
proto::IpAddr ip(const char* t) { return *proto::ip_from_text(t); }
bool has(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }
std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + " ";
  return s;
}
}  // namespace

TEST_CASE("parse_publish: docker's forms") {
  auto a = host::parse_publish("8080:80");
  REQUIRE(a);
  CHECK(a->host_ip == ip("0.0.0.0"));
  CHECK(a->host_port == 8080);
  CHECK(a->guest_port == 80);
  CHECK(a->proto == IpProto::tcp);
  auto b = host::parse_publish("127.0.0.1:5353:53/udp");
  REQUIRE(b);
  CHECK(b->host_ip == ip("127.0.0.1"));
  CHECK(b->proto == IpProto::udp);
  CHECK(host::to_string(*b) == "53/udp -> 127.0.0.1:5353");
  auto c = host::parse_publish("[::1]:8443:443/tcp");
  REQUIRE(c);
  CHECK(c->host_ip == ip("::1"));
  CHECK(host::to_string(*c) == "443/tcp -> [::1]:8443");
}

TEST_CASE("parse_ps_port_text: ps_port_text's inverse") {
  for (auto v : {"8080:80", "127.0.0.1:5353:53/udp", "[::1]:8443:443/tcp", "0.0.0.0:1:65535/udp"}) {
    auto m = host::parse_publish(v);
    REQUIRE(m);
    auto back = host::parse_ps_port_text(host::ps_port_text(*m));
    REQUIRE_MESSAGE(back, v);
    CHECK(*back == *m);
  }
  auto m = host::parse_ps_port_text("127.0.0.1:8080->80/tcp");
  REQUIRE(m);
  CHECK(host::to_string(*m) == "80/tcp -> 127.0.0.1:8080");  // what `neshost port` prints
  for (auto bad : {"", "garbage", "8080->80/tcp", "127.0.0.1:8080->80", "127.0.0.1:8080->80/sctp",
                   "127.0.0.1:0->80/tcp", "[::1]:53->5353", "->80/tcp", "127.0.0.1:8080:80/tcp"}) {
    auto r = host::parse_ps_port_text(bad);
    REQUIRE_MESSAGE(!r, bad);
    CHECK(r.error().message == std::string("not a published port '") + bad + "' (expected IP:HOST->GUEST/tcp|udp)");
  }
}

TEST_CASE("parse_publish: every malformed value names the flag and the part") {
  struct Bad { const char* v; const char* says; };
  for (auto [v, says] : {Bad{"80", "a host port is required"}, Bad{"0:80", "host port '0' must be 1..65535"},
                         Bad{"70000:80", "host port '70000' must be 1..65535"},
                         Bad{"8080:65536", "guest port '65536' must be 1..65535"},
                         Bad{"8080:80/sctp", "the protocol must be tcp or udp"},
                         Bad{"1.2.3:8080:80", "'1.2.3' is not an IPv4 or IPv6 address"},
                         Bad{"a:b:c:d", "expected [IP:]HOST:GUEST"}, Bad{"[::1:80:80", "in brackets"},
                         Bad{"08080:80", "must be 1..65535"}, Bad{":80", "host port '' must be 1..65535"},
                         Bad{"8080:-1", "guest port '-1'"}}) {
    auto r = host::parse_publish(v);
    REQUIRE_MESSAGE(!r, v);
    CHECK_MESSAGE(r.error().message.find(std::string("--publish ") + v) == 0, r.error().message);
    CHECK_MESSAGE(r.error().message.find(says) != std::string::npos, r.error().message);
  }
}

TEST_CASE("parse_add_host and parse_network_mode") {
  auto a = host::parse_add_host("db:10.1.2.3");
  REQUIRE(a);
  CHECK(a->name == "db");
  CHECK(a->ip == ip("10.1.2.3"));
  auto g = host::parse_add_host("host.docker.internal:host-gateway");
  REQUIRE(g);
  CHECK(!g->ip);
  auto e = host::parse_add_host("v6=[fd00::1]");
  REQUIRE(e);
  CHECK(e->ip == ip("fd00::1"));
  for (const char* v : {"nocolon", ":1.2.3.4", "bad name:1.2.3.4", "x:300.1.1.1"}) {
    auto r = host::parse_add_host(v);
    REQUIRE_MESSAGE(!r, v);
    CHECK(r.error().message.find(std::string("--add-host ") + v) == 0);
  }
  NetworkSpec s;
  CHECK(s.mode == NetworkMode::passt);  // docker's default: a network; the host's loopback closed
  for (auto name : {"user", "passt", "pasta"}) {
    s.mode = NetworkMode::none;
    REQUIRE(host::parse_network_mode(name, s));
    CHECK(s.mode == NetworkMode::passt);
  }
  for (auto name : {"slirp", "slirp4netns"}) {  // QEMU's libslirp (podman's name: slirp4netns)
    s.mode = NetworkMode::none;
    REQUIRE(host::parse_network_mode(name, s));
    CHECK(s.mode == NetworkMode::slirp);
  }
  REQUIRE(host::parse_network_mode("none", s));
  CHECK(s.mode == NetworkMode::none);
  REQUIRE(host::parse_network_mode("netns:/var/run/netns/pod1", s));
  CHECK(s.mode == NetworkMode::netns);
  CHECK(s.netns == "/var/run/netns/pod1");
  auto bad = host::parse_network_mode("bridge", s);
  REQUIRE(!bad);
  CHECK(bad.error().message == "--network bridge: unknown mode (user, passt, slirp, none or netns:PATH)");
  CHECK(!host::parse_network_mode("netns:relative/path", s));
}

TEST_CASE("check_network: what the flags mean together") {
  NetworkSpec s;
  s.publish.push_back(*host::parse_publish("127.0.0.1:8080:80"));
  CHECK(host::check_network(s));
  s.publish.push_back(*host::parse_publish("8080:81"));  // 0.0.0.0 covers 127.0.0.1
  auto twice = host::check_network(s);
  REQUIRE(!twice);
  CHECK(twice.error().message.find("host port 8080 is published twice") != std::string::npos);
  s.publish.back().proto = IpProto::udp;  // another protocol: fine
  CHECK(host::check_network(s));
  s.publish.push_back(*host::parse_publish("[::1]:8443:443"));
  auto v6 = host::check_network(s);
  REQUIRE(!v6);
  CHECK(v6.error().message.find("--publish [::1]:8443:443: an IPv6 host address is not supported") == 0);
  s.publish.pop_back();
  CHECK(host::publish_text(s.publish[0]) == "127.0.0.1:8080:80");
  CHECK(host::ps_port_text(s.publish[1]) == "0.0.0.0:8080->81/udp");
  s.mode = NetworkMode::none;
  auto none = host::check_network(s);
  REQUIRE(!none);
  CHECK(none.error().message.find("--publish needs --network user (passt) or slirp") == 0);
  s.publish.clear();
  s.hosts.push_back(*host::parse_add_host("h:host-gateway"));
  CHECK(!host::check_network(s));
  s.hosts = {*host::parse_add_host("h:10.0.0.1")};
  s.dns = {ip("1.1.1.1"), ip("8.8.8.8"), ip("9.9.9.9"), ip("1.0.0.1")};
  auto dns = host::check_network(s);
  REQUIRE(!dns);
  CHECK(dns.error().message.find("--dns: at most 3") == 0);
}

TEST_CASE("guest_network: user mode, and the descriptor the init accepts") {
  NetworkSpec s;
  s.hosts.push_back(*host::parse_add_host("hostsvc:host-gateway"));
  s.dns_search = {"example.test"};
  auto n = host::guest_network(s);
  REQUIRE(n);
  REQUIRE(*n);
  const proto::Network& net = **n;
  REQUIRE(net.interfaces.size() == 1);
  CHECK(net.interfaces[0].mac == host::UserNet::mac());
  CHECK(proto::prefix_text(net.interfaces[0].addresses.at(0)) == "10.0.2.15/24");
  REQUIRE(net.routes.size() == 1);
  CHECK(proto::prefix_text(net.routes[0].to) == "0.0.0.0/0");
  CHECK(proto::ip_text(*net.routes[0].via) == "10.0.2.2");
  REQUIRE(net.hosts.size() == 1);
  CHECK(proto::ip_text(net.hosts[0].ip) == "10.0.2.2");  // host-gateway
  REQUIRE(net.dns);
  CHECK(proto::ip_text(net.dns->nameservers.at(0)) == "10.0.2.3");
  CHECK(net.dns->search == std::vector<std::string>{"example.test"});
  // The init decodes exactly this (the codec's own check).
  proto::Boot b;
  b.exec.argv = {"/bin/true"};
  b.network = net;
  CHECK(proto::validate(proto::HostMessage{b}));
}

TEST_CASE("guest_network: none and netns") {
  NetworkSpec s;
  s.mode = NetworkMode::none;
  auto n = host::guest_network(s);
  REQUIRE(n);
  CHECK(!*n);  // nothing asked: no section, today's behaviour
  s.hosts.push_back(*host::parse_add_host("db:192.0.2.7"));
  n = host::guest_network(s);
  REQUIRE(n);
  REQUIRE(*n);
  CHECK((*n)->interfaces.empty());
  CHECK(!(*n)->dns);  // the root's own resolv.conf
  CHECK((*n)->hosts.size() == 1);

  NetworkSpec ns;
  REQUIRE(host::parse_network_mode("netns:/run/netns/x", ns));
  CHECK(!host::guest_network(ns));  // the link not read yet
  host::NetnsLink l;
  l.name = "eth0";
  l.mac = {0x02, 0, 0, 0, 0, 7};
  l.mtu = 1400;
  l.addresses = {{ip("10.88.0.5"), 16}};
  l.routes = {{{ip("0.0.0.0"), 0}, ip("10.88.0.1"), std::nullopt}};
  l.tap = "nes0";
  ns.link = l;
  n = host::guest_network(ns);
  REQUIRE(n);
  REQUIRE(*n);
  CHECK((*n)->interfaces.at(0).mac == l.mac);
  CHECK((*n)->interfaces.at(0).mtu == 1400);
  CHECK((*n)->routes == l.routes);
  auto q = host::qemu_net_args(ns, {});
  REQUIRE(q);
  CHECK(joined(*q) == "-netdev tap,id=net0,ifname=nes0,script=no,downscript=no "
                      "-device virtio-net-pci,netdev=net0,mac=02:00:00:00:00:07,romfile= ");
}

TEST_CASE("qemu_net_args and passt_argv: one spec, both sides") {
  NetworkSpec s;
  s.mode = NetworkMode::passt;
  s.publish = {*host::parse_publish("127.0.0.1:8080:80"), *host::parse_publish("5353:53/udp")};
  CHECK(!host::qemu_net_args(s, {}));  // passt mode needs passt's socket
  auto q = host::qemu_net_args(s, {5});
  REQUIRE(q);
  CHECK(joined(*q) == "-netdev stream,id=net0,server=off,addr.type=fd,addr.str=5 "
                      "-device virtio-net-pci,netdev=net0,mac=52:54:00:12:34:56,romfile= ");
  auto p = host::passt_argv(s, "passt", 3);
  REQUIRE(p);
  CHECK(has(*p, "--no-map-gw"));  // the host's loopback closed by default
  CHECK(joined(*p).find("--fd 3 ") != std::string::npos);
  CHECK(joined(*p).find("--tcp-ports 127.0.0.1/8080:80 ") != std::string::npos);
  CHECK(joined(*p).find("--udp-ports 5353:53 ") != std::string::npos);
  CHECK(joined(*p).find("--address 10.0.2.15 --netmask 24 --gateway 10.0.2.2 --dns-forward 10.0.2.3") !=
        std::string::npos);
  s.hosts.push_back(*host::parse_add_host("h:host-gateway"));
  p = host::passt_argv(s, "passt", 3);
  REQUIRE(p);
  CHECK(!has(*p, "--no-map-gw"));  // host-gateway opens it, for this VM only

  s.mode = NetworkMode::slirp;
  CHECK(!host::passt_argv(s, "passt", 3));
  q = host::qemu_net_args(s, {});
  REQUIRE(q);
  CHECK(q->at(1) == "user,id=net0,net=10.0.2.0/24,host=10.0.2.2,dns=10.0.2.3,ipv6=off,"
                    "hostfwd=tcp:127.0.0.1:8080-:80,hostfwd=udp::5353-:53");
  s.mode = NetworkMode::none;
  s.publish.clear();
  s.hosts.clear();
  q = host::qemu_net_args(s, {});
  REQUIRE(q);
  CHECK(q->empty());
}
