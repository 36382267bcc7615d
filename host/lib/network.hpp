// A VM's network, as one value: the mode (`neshost run --network`), published ports (`-p`),
// extra hosts entries (`--add-host`) and the resolver (`--dns`). From it come both halves that must
// agree: the boot descriptor's `network` section (what the init configures, docs/protocol.md
// "Network") and the VMM's side (QEMU's -netdev/-device arguments, and passt's command line in
// passt mode, the default `user` network). Pure functions, no I/O: an embedder building its own QEMU line uses the same ones
// `neshost run` does (docs/host.md "Networking", docs/network.md says why it is built this way).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"
#include "protocol/messages.hpp"

namespace nes::host {

/// How the guest reaches a network (`--network MODE`; podman's names: `pasta`, `slirp4netns`).
enum class NetworkMode {
  none,   ///< no NIC: loopback only
  passt,  ///< passt (`user`, the default; no privileges): outbound NAT; the host's loopback closed
  slirp,  ///< QEMU's built-in libslirp: outbound NAT; the host's loopback *open* at the gateway
  netns,  ///< the NIC takes over an existing network namespace's interface (the CNI model)
};
/// "none", "passt", "slirp", "netns".
std::string_view to_string(NetworkMode m);

/// The user-mode network every `passt`/`slirp` guest gets (QEMU's slirp defaults, which passt is
/// told too): the guest 10.0.2.15/24, the gateway 10.0.2.2, the resolver 10.0.2.3 (forwarded to
/// the host's own), the NIC's MAC 52:54:00:12:34:56 (QEMU's first default MAC).
struct UserNet {
  static proto::IpPrefix guest();
  static proto::IpAddr gateway();  // also the address `--add-host NAME:host-gateway` names
  static proto::IpAddr dns();
  static proto::MacAddr mac();
};

/// TCP or UDP (a published port's protocol).
enum class IpProto { tcp, udp };

/// One published port (docker's `-p [IP:]HOST:GUEST[/tcp|/udp]`): connections to `host_ip`:`host_port`
/// on the host reach `guest_port` in the guest. `host_ip` defaults to 0.0.0.0, as docker's does.
struct PortMapping {
  proto::IpAddr host_ip{};  // family 4 all zero: every IPv4 address
  std::uint16_t host_port = 0;   // 1..65535
  std::uint16_t guest_port = 0;  // 1..65535
  IpProto proto = IpProto::tcp;
  bool operator==(const PortMapping&) const = default;
};
/// Parses `-p`'s value: "8080:80", "127.0.0.1:8080:80", "[::1]:8080:80", each with an optional
/// "/tcp" or "/udp". Errors name the flag and say what was expected (`--publish 70000:80: host port
/// must be 1..65535`).
Result<PortMapping> parse_publish(std::string_view v);
/// docker port's text: "80/tcp -> 127.0.0.1:8080".
std::string to_string(const PortMapping& p);
/// -p's text as docker users write it: "127.0.0.1:8080:80", "8080:80/udp" (0.0.0.0 left out),
/// "[::1]:8080:80": for messages naming the flag.
std::string publish_text(const PortMapping& p);
/// docker ps's text of one published port: "127.0.0.1:8080->80/tcp" ("[::1]:8080->80/udp").
std::string ps_port_text(const PortMapping& p);
/// ps_port_text()'s inverse (for the monitor record's `ports`, which hold that text):
/// "127.0.0.1:8080->80/tcp", "[::1]:53->5353/udp"; parse_ps_port_text(ps_port_text(m)) == m.
/// Error: anything else ("not a published port 'TEXT' (expected IP:HOST->GUEST/tcp|udp)").
Result<PortMapping> parse_ps_port_text(std::string_view text);

/// One extra /etc/hosts entry (`--add-host NAME:IP`); `ip` unset: docker's `host-gateway`, the
/// address at which the guest reaches the host's loopback (it opens that path for this VM only).
struct ExtraHost {
  std::string name;               // 1..253 of [A-Za-z0-9._-]
  std::optional<proto::IpAddr> ip;
  bool operator==(const ExtraHost&) const = default;
};
/// Parses `--add-host`: "NAME:IP" (an IPv6 IP may be in brackets), "NAME=IP" (docker 25's
/// spelling), "NAME:host-gateway". Errors name the flag.
Result<ExtraHost> parse_add_host(std::string_view v);

/// The interface a `netns` guest takes over: read from the namespace before boot (vm/netns.hpp),
/// and the tap in that namespace its traffic is mirrored to.
struct NetnsLink {
  std::string name;                   // the interface in the namespace (e.g. eth0)
  proto::MacAddr mac{};               // the guest's NIC gets this MAC, so peers' ARP caches hold
  std::uint32_t mtu = 0;
  std::vector<proto::IpPrefix> addresses;
  std::vector<proto::NetRoute> routes;  // `mac` unset (the one interface)
  std::string tap;                    // the tap QEMU attaches to (in the namespace)
  bool operator==(const NetnsLink&) const = default;
};

/// The whole network of one VM.
struct NetworkSpec {
  NetworkMode mode = NetworkMode::passt;
  std::filesystem::path netns;        // netns mode: the namespace's path (/var/run/netns/NAME, /proc/PID/ns/net)
  std::optional<NetnsLink> link;      // netns mode: filled in from the namespace before boot
  std::vector<PortMapping> publish;   // passt/slirp only
  std::vector<ExtraHost> hosts;
  std::vector<proto::IpAddr> dns;     // ≤ 3; empty: user modes 10.0.2.3, netns/none the root's own file
  std::vector<std::string> dns_search, dns_options;
  bool operator==(const NetworkSpec&) const = default;
};
/// `--network`'s value: "none", "user" (= "passt", "pasta"), "slirp" (= "slirp4netns"),
/// "netns:PATH" (PATH absolute).
/// Sets mode and netns.
/// Error: an unknown mode (names the flag and the choices).
Status parse_network_mode(std::string_view v, NetworkSpec& into);

/// The spec's cross-checks, each an error naming the flags: `-p` needs passt or slirp; an IPv6 host
/// address (user modes are IPv4 only for now); a host port published twice (same protocol and address); `host-gateway` needs passt or slirp; a malformed `--dns-option` (1..64 printable bytes, ≤ 16); more than 3
/// `--dns`; netns mode without a path; a netns-mode spec passed to guest_network() without `link`.
Status check_network(const NetworkSpec& s);

/// The boot descriptor's `network` for this spec (needs `link` in netns mode). none: only what
/// `--add-host`/`--dns` ask for (no interface), or nullopt if neither. Errors: check_network()'s.
Result<std::optional<proto::Network>> guest_network(const NetworkSpec& s);

/// What the VMM side needs from outside the spec: in passt mode, QEMU's end of the connected
/// socket passt serves (an fd number valid in QEMU's process).
struct NetBackendIo {
  std::optional<int> passt_fd;
};
/// QEMU's arguments for the NIC: none → {}; passt → a `stream` netdev on io.passt_fd; slirp →
/// a `user` netdev with `hostfwd=` per published port; netns → a `tap` netdev on link->tap (QEMU
/// runs in the namespace). Always one virtio-net-pci with the guest's MAC and no option ROM.
/// Errors: check_network()'s; passt mode without io.passt_fd.
Result<std::vector<std::string>> qemu_net_args(const NetworkSpec& s, const NetBackendIo& io);

/// The same NIC's device as QMP device_add arguments (id "nic0", on PCIe port `bus`, its netdev
/// "net0" given on the command line as qemu_net_args() gives it): for plugging it into a
/// restored snapshot (host/vm/snapshot.hpp), whose saved machine has no NIC. The backend stays
/// on the command line: it is no device state, and QEMU 7.2's stream netdev connects a
/// QMP-passed descriptor off the monitor's thread, where its name is unknown. Errors:
/// check_network()'s; mode none (no NIC).
Result<std::string> qmp_nic_device(const NetworkSpec& s, std::string_view bus);

/// passt's command line for a `passt` guest (docs/network.md): foreground, quiet, serving the
/// connected socket `fd` (an fd number valid in passt's process), IPv4, the UserNet addresses,
/// DNS forwarded from 10.0.2.3, `-t`/`-u` per published port, and the gateway *not* mapped to
/// the host's loopback (`--no-map-gw`) unless an `--add-host` names host-gateway.
/// `program`: passt's path or name. Error: not passt mode.
Result<std::vector<std::string>> passt_argv(const NetworkSpec& s, const std::string& program, int fd);

}  // namespace nes::host
