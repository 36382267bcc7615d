#include "netlink.hpp"

#include <algorithm>
#include <cstring>

#include <linux/if.h>
#include <linux/if_addr.h>
#include <linux/if_arp.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>

namespace nes::init::nl {

namespace {
unsigned char family_of(const proto::IpAddr& a) { return a.family == 6 ? AF_INET6 : AF_INET; }
std::size_t addr_len(const proto::IpAddr& a) { return a.family == 6 ? 16 : 4; }
}  // namespace

Request add_address(int ifindex, const proto::IpPrefix& a) {
  ifaddrmsg m{};
  m.ifa_family = family_of(a.addr);
  m.ifa_prefixlen = a.len;
  m.ifa_scope = RT_SCOPE_UNIVERSE;
  m.ifa_index = static_cast<unsigned>(ifindex);
  if (a.addr.family == 6) m.ifa_flags = IFA_F_NODAD;
  Request r(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &m, sizeof m);
  r.attr(IFA_LOCAL, a.addr.bytes.data(), addr_len(a.addr));
  r.attr(IFA_ADDRESS, a.addr.bytes.data(), addr_len(a.addr));
  if (a.addr.family == 6) r.attr_u32(IFA_FLAGS, IFA_F_NODAD);
  return r;
}

Request add_route(int ifindex, const proto::NetRoute& rt) {
  rtmsg m{};
  m.rtm_family = family_of(rt.to.addr);
  m.rtm_dst_len = rt.to.len;
  m.rtm_table = RT_TABLE_MAIN;
  m.rtm_protocol = RTPROT_BOOT;
  m.rtm_scope = rt.via ? RT_SCOPE_UNIVERSE : RT_SCOPE_LINK;
  m.rtm_type = RTN_UNICAST;
  Request r(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, &m, sizeof m);
  if (rt.to.len) r.attr(RTA_DST, rt.to.addr.bytes.data(), addr_len(rt.to.addr));
  if (rt.via) r.attr(RTA_GATEWAY, rt.via->bytes.data(), addr_len(*rt.via));
  r.attr_u32(RTA_OIF, static_cast<std::uint32_t>(ifindex));
  return r;
}

}  // namespace nes::init::nl
