// The init's rtnetlink requests for boot.network (docs/init.md "Network"): add an address, add a
// route, on the shared builder and parser (base/netlink.hpp: bring a link up, list the links, the
// socket). No socket here: building and parsing are pure, tested alone
// (tests/init/netlink_test.cpp); nesinit/network.cpp sends them. Why not `ip`: the workload's root
// may have none, and the init must not depend on what it runs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/netlink.hpp"
#include "protocol/messages.hpp"

namespace nes::init::nl {

using base::nl::get_links;
using base::nl::Link;
using base::nl::Reply;
using base::nl::Request;
using base::nl::set_link_up;

/// RTM_NEWADDR (CREATE|EXCL): `a` on `ifindex` (IFA_LOCAL and IFA_ADDRESS; IPv6 with
/// IFA_F_NODAD, so the address is usable at once: the VMM's network has no duplicate).
Request add_address(int ifindex, const proto::IpPrefix& a);
/// RTM_NEWROUTE (CREATE|EXCL) in the main table, protocol "boot": `r.to` via `r.via` (scope
/// universe) or on-link (scope link) out of `ifindex`.
Request add_route(int ifindex, const proto::NetRoute& r);

/// Parse one datagram `data` answering request `seq`: links (RTM_NEWLINK) appended to `links`,
/// an nlmsgerr or NLMSG_DONE ends it. Messages with another sequence number are skipped.
inline Reply parse(std::span<const std::byte> data, std::uint32_t seq, std::vector<Link>& links) {
  return base::nl::parse(data, seq, [&](std::uint16_t type, std::span<const std::byte> body) {
    return type != RTM_NEWLINK || base::nl::parse_link(body, links);
  });
}

}  // namespace nes::init::nl
