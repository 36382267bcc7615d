// boot.network: the guest's interfaces, routes and resolver, configured by PID 1 before the
// workload starts (docs/init.md "Network", docs/protocol.md "Network"). Links are found by MAC
// and set up over rtnetlink (nesinit/netlink.hpp); /etc/resolv.conf, /etc/hosts and /etc/hostname
// are given to the workload as docker gives them: files of their own bound over the root's.
#pragma once

#include <optional>
#include <string>

#include "base/result.hpp"
#include "log.hpp"
#include "protocol/messages.hpp"

namespace nes::init {

/// /etc/resolv.conf's text for `dns` (resolv.conf(5)): `nameserver` lines, then `search` and
/// `options` lines if any.
std::string render_resolv_conf(const proto::Dns& dns);

/// /etc/hosts' text (hosts(5)), as docker writes it: the localhost lines, `hostname` on each
/// address of the first interface (if both are set), then `net.hosts` in order.
std::string render_hosts(const proto::Network& net, const std::optional<std::string>& hostname);

/// How long configure_network waits for a link with a descriptor's MAC to appear (the NIC's
/// driver probes it asynchronously after its module loads): ms.
inline constexpr int kLinkWaitMs = 5000;

/// Configure `net`: for each interface, find the link with its MAC (waiting up to `link_wait_ms`),
/// set its MTU and bring it up, add its addresses; then the routes; then bind resolv.conf (if
/// `net.dns`), hosts and hostname (if `hostname`) over /etc's. Stops at the first failure and
/// returns the network_failed to report: the interface (MAC, or "files"), the step, the reason
/// and errno. `lo` is left as bring-up set it.
base::StatusOf<proto::NetworkFailed> configure_network(const proto::Network& net,
                                                       const std::optional<std::string>& hostname,
                                                       const Log& log, int link_wait_ms = kLinkWaitMs);

}  // namespace nes::init
