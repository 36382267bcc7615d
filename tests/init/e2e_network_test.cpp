// boot.network for real (docs/init.md "Network"): the static init as PID 1 of a fresh pid + mount
// + net + uts namespace the test makes (`unshare --net`: nothing reaches this machine's network),
// a veth pair created in it before the init starts. The init finds the link by MAC, sets its MTU,
// brings it up, adds IPv4 and IPv6 addresses and routes over rtnetlink, and binds resolv.conf,
// hosts and hostname over /etc's (in the namespace's private mount table only); the workload
// reads what the kernel holds. Failures: network_failed naming the interface and the step, and
// nothing starts.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <arpa/inet.h>

#include <string>

#include "e2e_checks.hpp"
#include "harness.hpp"

using namespace nes;
using namespace nes::init::test;

namespace {

proto::IpAddr ip(const char* text) {
  proto::IpAddr a;
  if (inet_pton(AF_INET, text, a.bytes.data()) == 1) return a.family = 4, a;
  inet_pton(AF_INET6, text, a.bytes.data());
  return a.family = 6, a;
}

constexpr proto::MacAddr kMac{0x02, 0x00, 0x00, 0x00, 0x00, 0x02};

/// The sandbox: its own net (a veth pair, v0 with kMac, its peer v1 up) and uts namespaces, and
/// the init told its network namespace is its own.
SandboxOptions net_sandbox() {
  SandboxOptions o;
  o.unshare_args = {"--net", "--uts"};
  o.wrapper = {"/bin/sh", "-c",
               "ip link add v0 address 02:00:00:00:00:02 type veth peer name v1 && ip link set v1 up && exec \"$@\"",
               "sh"};
  o.init_args = {"--own-netns=1"};
  return o;
}

proto::Network sample() {
  proto::Network n;
  n.interfaces.push_back({kMac, 1400, {{ip("10.9.0.2"), 24}, {ip("fd09::2"), 64}}});
  n.routes.push_back({{ip("0.0.0.0"), 0}, ip("10.9.0.1"), std::nullopt});
  n.routes.push_back({{ip("10.77.0.0"), 16}, std::nullopt, kMac});
  n.dns = proto::Dns{{ip("10.9.0.53")}, {"test.internal"}, {"ndots:3"}};
  n.hosts.push_back({"db.internal", ip("10.9.0.9")});
  return n;
}

}  // namespace

TEST_CASE("network: the link found by MAC, MTU, addresses, routes, resolv.conf, hosts, hostname") {
  Sandbox sb{net_sandbox()};
  auto b = make_boot({"/bin/sh", "-c",
                      "ip -o link show dev v0 | grep -o 'mtu [0-9]*'; ip -o link show dev v0 | grep -o 'state [A-Z]*'; "
                      "ip -o addr show dev v0 | awk '{print $3, $4}'; "
                      "ip route show; ip -6 route show dev v0 | grep fd09; "
                      "echo ==; cat /etc/resolv.conf; echo ==; cat /etc/hosts; echo ==; cat /etc/hostname; hostname"});
  b.hostname = "web1";
  b.network = sample();
  REQUIRE_MESSAGE(sb.start(b), sb.last_error() << "\n" << sb.err());
  const proto::WorkloadExited x = next_exit(sb);
  CHECK(x == proto::WorkloadExited::code(0));
  CHECK(sb.shutdown_powered_off());
  const std::string& out = sb.out();
  CAPTURE(out);
  CHECK(out.starts_with("mtu 1400\nstate UP\n"));  // (this sandbox's /sys is the machine's)
  CHECK(out.find("inet 10.9.0.2/24\n") != std::string::npos);
  CHECK(out.find("inet6 fd09::2/64\n") != std::string::npos);
  CHECK(out.find("default via 10.9.0.1 dev v0 \n") != std::string::npos);  // proto boot: ip(8) omits its default
  CHECK(out.find("10.77.0.0/16 dev v0 scope link \n") != std::string::npos);
  CHECK(out.find("10.9.0.0/24 dev v0 proto kernel scope link src 10.9.0.2") != std::string::npos);
  CHECK(out.find("nameserver 10.9.0.53\nsearch test.internal\noptions ndots:3\n") != std::string::npos);
  CHECK(out.find("127.0.0.1\tlocalhost\n") != std::string::npos);
  CHECK(out.find("10.9.0.2\tweb1\nfd09::2\tweb1\n10.9.0.9\tdb.internal\n") != std::string::npos);
  CHECK(out.find("==\nweb1\nweb1\n") != std::string::npos);
  CHECK(sb.err().find("nesinit: network: 02:00:00:00:00:02") != std::string::npos);
}

TEST_CASE("network: no link with the MAC is network_failed naming it and the step; nothing starts") {
  Sandbox sb{net_sandbox()};
  REQUIRE(sb.accept());
  auto ready = sb.expect<proto::Ready>();
  REQUIRE(ready);
  REQUIRE(ready->features);
  CHECK(std::find(ready->features->begin(), ready->features->end(), "network") != ready->features->end());
  auto b = make_boot({"/bin/sh", "-c", "echo must-not-run"});
  b.network = sample();
  b.network->interfaces[0].mac = {0x02, 0, 0, 0, 0, 0x99};
  b.network->routes.clear();
  sb.send(b);
  auto f = sb.expect<proto::NetworkFailed>(15000);
  REQUIRE_MESSAGE(f, sb.last_error() << "\n" << sb.err());
  CHECK(f->interface == "02:00:00:00:00:99");
  CHECK(f->step == "find");
  CHECK(f->err == ENODEV);
  CHECK(sb.shutdown_powered_off());
  CHECK(sb.out().find("must-not-run") == std::string::npos);
}

TEST_CASE("network: a route the kernel refuses is network_failed at step route") {
  Sandbox sb{net_sandbox()};
  auto b = make_boot({"/bin/sh", "-c", "echo must-not-run"});
  b.network = sample();
  b.network->routes = {{{ip("0.0.0.0"), 0}, ip("192.0.2.1"), std::nullopt}};  // gateway not on any link
  REQUIRE(sb.accept());
  REQUIRE(sb.expect<proto::Ready>());
  sb.send(b);
  auto f = sb.expect<proto::NetworkFailed>();
  REQUIRE_MESSAGE(f, sb.last_error() << "\n" << sb.err());
  CHECK(f->interface == "02:00:00:00:00:02");
  CHECK(f->step == "route");
  CHECK(f->reason.find("0.0.0.0/0 via 192.0.2.1") != std::string::npos);
  CHECK(f->err == ENETUNREACH);
  CHECK(sb.shutdown_powered_off());
  CHECK(sb.out().find("must-not-run") == std::string::npos);
}

TEST_CASE("network: a sandbox that did not say its network namespace is its own refuses boot.network") {
  SandboxOptions o;  // the machine's network namespace: nothing may be configured there
  Sandbox sb{o};
  REQUIRE(sb.accept());
  REQUIRE(sb.expect<proto::Ready>());
  auto b = make_boot({"/bin/sh", "-c", "echo must-not-run"});
  b.network = sample();
  sb.send(b);
  auto f = sb.expect<proto::NetworkFailed>();
  REQUIRE_MESSAGE(f, sb.last_error() << "\n" << sb.err());
  CHECK(f->step == "namespace");
  CHECK(f->err == EPERM);
  CHECK(sb.shutdown_powered_off());
  CHECK(sb.out().find("must-not-run") == std::string::npos);
}
