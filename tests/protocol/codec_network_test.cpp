// boot.network and ready.features (docs/protocol.md "Network", "Features"): the exact error for
// each malformed field, named by its path, and the bounds.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "support.hpp"

using namespace nes::proto;
using namespace nes::proto::test;

namespace {

/// The reference boot line with `"network": <network>` added.
std::string boot_with(const std::string& network) {
  std::string line = encode(HostMessage{reference_boot()});
  line.pop_back();  // the closing brace
  return line + ",\"network\":" + network + "}";
}

/// The error decode_host gives for a boot with this network section ("ok" if none).
std::string error_of(const std::string& network) { return summary(decode_host(boot_with(network))); }

const std::string kIface = R"({"mac":"52:54:00:12:34:56","addresses":["10.0.2.15/24"]})";

}  // namespace

TEST_CASE("a network section decodes to its values") {
  auto d = decode_host(boot_with(R"({"interfaces":[{"mac":"52:54:00:AB:cd:EF","mtu":1400,"addresses":["10.0.2.15/24","fd00::2/64"]}],
      "routes":[{"to":"0.0.0.0/0","via":"10.0.2.2"}],"dns":{"nameservers":["10.0.2.3"],"search":["lan"],"options":["ndots:1"]},
      "hosts":[{"name":"db","ip":"10.0.2.9"}]})"));
  REQUIRE(summary(d) == "ok");
  const Boot& b = std::get<Boot>(std::get<HostMessage>(d));
  REQUIRE(b.network);
  const Network& n = *b.network;
  REQUIRE(n.interfaces.size() == 1);
  CHECK(n.interfaces[0].mac == MacAddr{0x52, 0x54, 0x00, 0xab, 0xcd, 0xef});
  CHECK(n.interfaces[0].mtu == 1400);
  CHECK(n.interfaces[0].addresses == std::vector<IpPrefix>{{ip("10.0.2.15"), 24}, {ip("fd00::2"), 64}});
  REQUIRE(n.routes.size() == 1);
  CHECK(n.routes[0].to == IpPrefix{ip("0.0.0.0"), 0});
  CHECK(n.routes[0].via == ip("10.0.2.2"));
  CHECK(!n.routes[0].mac);
  CHECK(n.dns == Dns{{ip("10.0.2.3")}, {"lan"}, {"ndots:1"}});
  CHECK(n.hosts == std::vector<HostEntry>{{"db", ip("10.0.2.9")}});
  // Written back in canonical form: lower-case MAC, inet_ntop's text.
  const std::string enc = encode(HostMessage{b});
  CHECK(enc.find(R"("mac":"52:54:00:ab:cd:ef")") != std::string::npos);
  CHECK(enc.find(R"("addresses":["10.0.2.15/24","fd00::2/64"])") != std::string::npos);
  // null is "no network", as absent.
  auto nul = decode_host(boot_with("null"));
  REQUIRE(summary(nul) == "ok");
  CHECK(!std::get<Boot>(std::get<HostMessage>(nul)).network);
}

TEST_CASE("malformed network fields: each error names its path") {
  struct Case {
    std::string network, error;
  };
  const std::vector<Case> cases = {
      {R"([])", "error:boot.network: expected object"},
      {R"({"interfaces":{}})", "error:boot.network.interfaces: expected array of objects"},
      {R"({"interfaces":[{}]})", "error:boot.network.interfaces[0].mac: missing"},
      {R"({"interfaces":[{"mac":"52:54:00:12:34"}]})", "error:boot.network.interfaces[0].mac: expected MAC address"},
      {R"({"interfaces":[{"mac":"52-54-00-12-34-56"}]})", "error:boot.network.interfaces[0].mac: expected MAC address"},
      {R"({"interfaces":[{"mac":"52:54:00:12:34:5g"}]})", "error:boot.network.interfaces[0].mac: expected MAC address"},
      {R"({"interfaces":[{"mac":"52:54:00:12:34:56","mtu":67}]})", "error:boot.network.interfaces[0].mtu: expected integer 0 or 68..65535, got 67"},
      {R"({"interfaces":[{"mac":"52:54:00:12:34:56","mtu":65536}]})", "error:boot.network.interfaces[0].mtu: expected integer 0 or 68..65535, got 65536"},
      {R"({"interfaces":[{"mac":"52:54:00:12:34:56","mtu":-1}]})", "error:boot.network.interfaces[0].mtu: expected unsigned 32-bit integer"},
      {R"({"interfaces":[{"mac":"52:54:00:12:34:56","addresses":["10.0.2.15"]}]})", "error:boot.network.interfaces[0].addresses[0]: expected address/prefix (CIDR)"},
      {R"({"interfaces":[{"mac":"52:54:00:12:34:56","addresses":["10.0.2.15/33"]}]})", "error:boot.network.interfaces[0].addresses[0]: expected prefix length 0..32"},
      {R"({"interfaces":[{"mac":"52:54:00:12:34:56","addresses":["fd00::1/129"]}]})", "error:boot.network.interfaces[0].addresses[0]: expected prefix length 0..128"},
      {R"({"interfaces":[{"mac":"52:54:00:12:34:56","addresses":["10.0.2.15/024"]}]})", "error:boot.network.interfaces[0].addresses[0]: expected address/prefix (CIDR)"},
      {R"({"interfaces":[{"mac":"52:54:00:12:34:56","addresses":["999.0.2.15/24"]}]})", "error:boot.network.interfaces[0].addresses[0]: expected address/prefix (CIDR)"},
      {R"({"interfaces":[{"mac":"52:54:00:12:34:56","addresses":["10.0.2.15/2 4"]}]})", "error:boot.network.interfaces[0].addresses[0]: expected address/prefix (CIDR)"},
      {"{\"interfaces\":[" + kIface + "," + kIface + "]}", "error:boot.network.interfaces[1].mac: same as interfaces[0].mac"},
      {R"({"routes":[{"to":"0.0.0.0/0"}]})", "error:boot.network.routes[0]: a route needs an interface"},
      {"{\"interfaces\":[" + kIface + R"(],"routes":[{}]})", "error:boot.network.routes[0].to: missing"},
      {"{\"interfaces\":[" + kIface + R"(],"routes":[{"to":"0.0.0.0/0","via":"fd00::1"}]})", "error:boot.network.routes[0].via: address family differs"},
      {"{\"interfaces\":[" + kIface + R"(],"routes":[{"to":"0.0.0.0/0","via":"gw"}]})", "error:boot.network.routes[0].via: expected IPv4 or IPv6 address, got \"gw\""},
      {"{\"interfaces\":[" + kIface + R"(],"routes":[{"to":"0.0.0.0/0","mac":"02:00:00:00:00:01"}]})", "error:boot.network.routes[0].mac: names no interface"},
      {R"({"dns":{"nameservers":["1.1.1.1","1.1.1.2","1.1.1.3","1.1.1.4"]}})", "error:boot.network.dns.nameservers: more than 3 elements"},
      {R"({"dns":{"search":["a b"]}})", "error:boot.network.dns.search[0]: expected name of 1..253"},
      {R"({"dns":{"search":[""]}})", "error:boot.network.dns.search[0]: expected name of 1..253"},
      {R"({"dns":{"options":["ndots: 1"]}})", "error:boot.network.dns.options[0]: expected option of 1..64 printable ASCII bytes"},
      {R"({"dns":{"nameservers":"1.1.1.1"}})", "error:boot.network.dns.nameservers: expected array of addresses"},
      {R"({"hosts":[{"name":"db"}]})", "error:boot.network.hosts[0].ip: missing"},
      {R"({"hosts":[{"ip":"10.0.0.1"}]})", "error:boot.network.hosts[0].name: missing"},
      {R"({"hosts":[{"name":"db\nevil","ip":"10.0.0.1"}]})", "error:boot.network.hosts[0].name: expected name of 1..253"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.network);
    const std::string got = error_of(c.network);
    CHECK_MESSAGE(starts_with(got, c.error), got);
  }
}

TEST_CASE("bounds: interfaces, addresses, routes and hosts are capped") {
  std::string ifaces = "[";
  for (int i = 0; i < 9; ++i) ifaces += fmt::format("{}{{\"mac\":\"02:00:00:00:00:{:02x}\"}}", i ? "," : "", i);
  CHECK(starts_with(error_of("{\"interfaces\":" + ifaces + "]}"), "error:boot.network.interfaces: more than 8 elements"));
  std::string hosts = "[";
  for (int i = 0; i < 257; ++i) hosts += fmt::format("{}{{\"name\":\"h{}\",\"ip\":\"10.0.0.1\"}}", i ? "," : "", i);
  CHECK(starts_with(error_of("{\"hosts\":" + hosts + "]}"), "error:boot.network.hosts: more than 256 elements"));
}

TEST_CASE("ready.features: an array of strings; absent is none") {
  auto d = decode_guest(R"({"type":"ready","protocol_version":2,"features":["stdio","network","future-thing"]})");
  REQUIRE(summary(d) == "ok");
  auto r = std::get<Ready>(std::get<GuestMessage>(d));
  CHECK(r.features == std::vector<std::string>{"stdio", "network", "future-thing"});
  CHECK(!std::get<Ready>(std::get<GuestMessage>(decode_guest(R"({"type":"ready","protocol_version":2})"))).features);
  CHECK(starts_with(summary(decode_guest(R"({"type":"ready","protocol_version":2,"features":"stdio"})")),
                    "error:ready.features: expected array of strings"));
  CHECK(starts_with(summary(decode_guest(R"({"type":"ready","protocol_version":2,"features":[1]})")),
                    "error:ready.features[0]: expected string"));
  // Our init's list, and the reference's line unchanged when there is none.
  CHECK(encode(GuestMessage{Ready{}}) == R"({"type":"ready","protocol_version":2})");
  CHECK(encode(GuestMessage{Ready{2, std::nullopt, all_features()}}) ==
        R"({"type":"ready","protocol_version":2,"features":["stdio","root","reconnect","exec","network","data_resume","container",)"
        R"("groups","mount_fs","hostname","halt","entropy","realtime","container_mounts","resources","container_stats",)"
        R"("container_update","root_block"]})");
  // Decoded back, every name survives (an older host ignores those it does not know).
  auto back = decode_guest(encode(GuestMessage{Ready{2, std::nullopt, all_features()}}));
  REQUIRE(summary(back) == "ok");
  CHECK(std::get<Ready>(std::get<GuestMessage>(back)).features == all_features());
}

TEST_CASE("network_failed: interface, step and reason required; its status is 125") {
  auto d = decode_guest(R"({"type":"network_failed","interface":"lo","step":"up","reason":"x","errno":1})");
  REQUIRE(summary(d) == "ok");
  CHECK(std::get<NetworkFailed>(std::get<GuestMessage>(d)) == NetworkFailed{"lo", "up", "x", 1});
  CHECK(starts_with(summary(decode_guest(R"({"type":"network_failed","step":"up","reason":"x"})")),
                    "error:network_failed.interface: missing"));
  CHECK(exit_status(NetworkFailed{}) == 125);
  CHECK(exit_status(Outcome::network_failed) == 125);
  CHECK(outcome_from_string("network_failed") == Outcome::network_failed);
}

TEST_CASE("boot.stdio.replay_bytes (data channel resume): written only when set, range-checked") {
  Boot b = reference_boot();
  b.stdio = Stdio{};
  const std::string off = encode(HostMessage{b});
  CHECK(off.find("replay_bytes") == std::string::npos);  // byte-identical without it
  b.stdio->replay_bytes = 1u << 20;
  const std::string on = encode(HostMessage{b});
  CHECK(on.find(R"("replay_bytes":1048576)") != std::string::npos);
  auto d = decode_host(on);
  REQUIRE(std::holds_alternative<HostMessage>(d));
  CHECK(std::get<Boot>(std::get<HostMessage>(d)).stdio->replay_bytes == 1u << 20);
  auto with = [&](const std::string& v) {
    std::string line = encode(HostMessage{reference_boot()});
    line.pop_back();
    return summary(decode_host(line + R"(,"stdio":{"replay_bytes":)" + v + "}}"));
  };
  CHECK(with("0") == "ok");
  CHECK(with("4096") == "ok");
  CHECK(starts_with(with("4095"), "error:boot.stdio.replay_bytes: expected integer 0 or 4096..67108864, got 4095"));
  CHECK(starts_with(with("67108865"), "error:boot.stdio.replay_bytes: expected integer 0 or 4096..67108864"));
  CHECK(starts_with(with("-1"), "error:boot.stdio.replay_bytes: expected integer 0 or 4096..67108864"));
}
