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
constexpr std::size_t align(std::size_t n) { return (n + NLMSG_ALIGNTO - 1) & ~std::size_t(NLMSG_ALIGNTO - 1); }
unsigned char family_of(const proto::IpAddr& a) { return a.family == 6 ? AF_INET6 : AF_INET; }
std::size_t addr_len(const proto::IpAddr& a) { return a.family == 6 ? 16 : 4; }
}  // namespace

Request::Request(std::uint16_t type, std::uint16_t flags, const void* hdr, std::size_t len) {
  nlmsghdr h{};
  h.nlmsg_type = type;
  h.nlmsg_flags = static_cast<std::uint16_t>(NLM_F_REQUEST | NLM_F_ACK | flags);
  buf_.resize(align(sizeof h) + align(len));
  std::memcpy(buf_.data(), &h, sizeof h);
  std::memcpy(buf_.data() + align(sizeof h), hdr, len);
}

void Request::attr(std::uint16_t type, const void* data, std::size_t len) {
  rtattr a{};
  a.rta_type = type;
  a.rta_len = static_cast<unsigned short>(RTA_LENGTH(len));
  std::size_t at = buf_.size();
  buf_.resize(at + RTA_SPACE(len));
  std::memcpy(buf_.data() + at, &a, sizeof a);
  std::memcpy(buf_.data() + at + RTA_LENGTH(0), data, len);
}

std::span<const std::byte> Request::bytes(std::uint32_t seq) {
  auto* h = reinterpret_cast<nlmsghdr*>(buf_.data());
  h->nlmsg_len = static_cast<std::uint32_t>(buf_.size());
  h->nlmsg_seq = seq;
  return buf_;
}

std::uint16_t Request::type() const { return reinterpret_cast<const nlmsghdr*>(buf_.data())->nlmsg_type; }

Request set_link_up(int ifindex, std::uint32_t mtu) {
  ifinfomsg i{};
  i.ifi_family = AF_UNSPEC;
  i.ifi_index = ifindex;
  i.ifi_flags = IFF_UP;
  i.ifi_change = IFF_UP;
  Request r(RTM_NEWLINK, 0, &i, sizeof i);
  if (mtu) r.attr_u32(IFLA_MTU, mtu);
  return r;
}

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

Request get_links() {
  ifinfomsg i{};
  i.ifi_family = AF_UNSPEC;
  return Request(RTM_GETLINK, NLM_F_DUMP, &i, sizeof i);
}

Reply parse(std::span<const std::byte> data, std::uint32_t seq, std::vector<Link>& links) {
  Reply out;
  std::size_t at = 0;
  while (at + sizeof(nlmsghdr) <= data.size()) {
    nlmsghdr h;
    std::memcpy(&h, data.data() + at, sizeof h);
    if (h.nlmsg_len < sizeof h || h.nlmsg_len > data.size() - at) return out.malformed = true, out;
    const std::byte* body = data.data() + at + align(sizeof h);
    const std::size_t body_len = h.nlmsg_len - std::min<std::size_t>(h.nlmsg_len, align(sizeof h));
    if (h.nlmsg_seq == seq) {
      if (h.nlmsg_type == NLMSG_DONE) return out.done = true, out;
      if (h.nlmsg_type == NLMSG_ERROR) {
        nlmsgerr e;
        if (body_len < sizeof e) return out.malformed = true, out;
        std::memcpy(&e, body, sizeof e);
        out.done = true;
        out.error = e.error < 0 ? -e.error : e.error;
        return out;
      }
      if (h.nlmsg_type == RTM_NEWLINK && body_len >= sizeof(ifinfomsg)) {
        ifinfomsg i;
        std::memcpy(&i, body, sizeof i);
        Link l;
        l.index = i.ifi_index;
        std::size_t a = align(sizeof i);
        while (a + sizeof(rtattr) <= body_len) {
          rtattr ra;
          std::memcpy(&ra, body + a, sizeof ra);
          if (ra.rta_len < sizeof ra || ra.rta_len > body_len - a) return out.malformed = true, out;
          const std::byte* val = body + a + RTA_LENGTH(0);
          const std::size_t vlen = ra.rta_len - RTA_LENGTH(0);
          if (ra.rta_type == IFLA_ADDRESS && vlen == 6) {
            std::memcpy(l.mac.data(), val, 6);
            l.has_mac = true;
          } else if (ra.rta_type == IFLA_IFNAME && vlen > 0) {
            l.name.assign(reinterpret_cast<const char*>(val), strnlen(reinterpret_cast<const char*>(val), vlen));
          }
          a += RTA_ALIGN(ra.rta_len);
        }
        links.push_back(std::move(l));
      }
    }
    at += align(h.nlmsg_len);
  }
  return out;
}

}  // namespace nes::init::nl
