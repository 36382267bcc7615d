// rtnetlink(7) by hand: the few requests the init sends to configure boot.network (bring a link
// up with its MTU, add an address, add a route, list the links) as byte buffers, and the parsing
// of the kernel's answers. No socket here: building and parsing are pure, tested alone
// (tests/init/netlink_test.cpp); nesinit/network.cpp sends them. Why not `ip`: the workload's root
// may have none, and the init must not depend on what it runs (docs/init.md "Network").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "protocol/messages.hpp"

namespace nes::init::nl {

/// One request: an nlmsghdr, the family header (ifinfomsg, ifaddrmsg or rtmsg) and its
/// attributes, each padded to NLA_ALIGNTO (4 bytes). Flags always include NLM_F_REQUEST and
/// NLM_F_ACK (the kernel answers every request with an nlmsgerr, 0 for success).
class Request {
 public:
  /// `type` RTM_*, `flags` beyond REQUEST|ACK (NLM_F_CREATE, NLM_F_EXCL, NLM_F_DUMP),
  /// `hdr`/`len` the family header copied after the nlmsghdr.
  Request(std::uint16_t type, std::uint16_t flags, const void* hdr, std::size_t len);
  /// Append attribute `type` with `len` bytes of `data` (rtattr, padded).
  void attr(std::uint16_t type, const void* data, std::size_t len);
  void attr_u32(std::uint16_t type, std::uint32_t v) { attr(type, &v, sizeof v); }
  /// The message with its length and sequence number `seq` filled in.
  std::span<const std::byte> bytes(std::uint32_t seq);
  std::uint16_t type() const;

 private:
  std::vector<std::byte> buf_;
};

/// RTM_NEWLINK on `ifindex`: IFF_UP set, and IFLA_MTU if `mtu` is not 0.
Request set_link_up(int ifindex, std::uint32_t mtu);
/// RTM_NEWADDR (CREATE|EXCL): `a` on `ifindex` (IFA_LOCAL and IFA_ADDRESS; IPv6 with
/// IFA_F_NODAD, so the address is usable at once: the VMM's network has no duplicate).
Request add_address(int ifindex, const proto::IpPrefix& a);
/// RTM_NEWROUTE (CREATE|EXCL) in the main table, protocol "boot": `r.to` via `r.via` (scope
/// universe) or on-link (scope link) out of `ifindex`.
Request add_route(int ifindex, const proto::NetRoute& r);
/// RTM_GETLINK dump of every link.
Request get_links();

/// A link as RTM_NEWLINK describes it: its index, name and hardware address (if it has one of 6
/// bytes: Ethernet).
struct Link {
  int index = 0;
  std::string name;
  bool has_mac = false;
  proto::MacAddr mac{};
};

/// What one datagram of the kernel's answer holds.
struct Reply {
  bool done = false;  // NLMSG_DONE, or the nlmsgerr that ends a request
  int error = 0;      // from nlmsgerr: 0 or a positive errno
  bool malformed = false;  // a header or attribute overruns the datagram: stop reading
};

/// Parse one datagram `data` answering request `seq`: links (RTM_NEWLINK) appended to `links`,
/// an nlmsgerr or NLMSG_DONE ends it. Messages with another sequence number are skipped.
Reply parse(std::span<const std::byte> data, std::uint32_t seq, std::vector<Link>& links);

}  // namespace nes::init::nl
