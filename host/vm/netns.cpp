// `--network netns:PATH`: read the namespace's interface, tie a tap to it with tc mirred
// (host/vm/netns.hpp; docs/network.md "netns mode").
#include "host/vm/netns.hpp"

#include <fcntl.h>
#include <linux/if_addr.h>
#include <linux/if_ether.h>
#include <linux/if_link.h>
#include <linux/if_tun.h>
#include <linux/nsfs.h>
#include <linux/pkt_cls.h>
#include <linux/pkt_sched.h>
#include <linux/tc_act/tc_mirred.h>
#include <arpa/inet.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "base/netlink.hpp"
#include "host/lib/signals_blocked.hpp"

namespace nes::vm {

using host::Error;
using host::Result;
namespace nl = base::nl;

namespace {

std::string flag(const std::filesystem::path& p) { return fmt::format("--network netns:{}", p.native()); }

/// Runs `f` (returning a Result) on a new thread that has joined the network namespace `nsfd`;
/// the caller's thread is never moved. The thread takes no process signal.
template <class F>
auto in_netns(int nsfd, const std::filesystem::path& path, F f) -> decltype(f()) {
  std::optional<decltype(f())> out;
  {
    host::SignalsBlocked quiet;
    std::thread t([&] {
      if (::setns(nsfd, CLONE_NEWNET) != 0) {
        out.emplace(Error{fmt::format("{}: setns: {}", flag(path), std::strerror(errno)), errno});
        return;
      }
      out.emplace(f());
    });
    t.join();
  }
  return std::move(*out);
}

/// An address as RTM_NEWADDR describes it.
struct Addr {
  int index = 0;
  unsigned char family = 0, prefix = 0, scope = 0;
  proto::IpAddr ip;
  bool has_ip = false;
};

/// A route as RTM_NEWROUTE describes it.
struct Route {
  rtmsg m{};
  std::uint32_t table = 0;
  int oif = 0;
  proto::IpAddr dst, via;
  bool has_via = false, multipath = false;
};

proto::IpAddr ip_of(unsigned char family, std::span<const std::byte> v, bool& ok) {
  proto::IpAddr a;
  a.family = family == AF_INET6 ? 6 : 4;
  const std::size_t n = a.family == 6 ? 16 : 4;
  ok = v.size() == n;
  if (ok) std::memcpy(a.bytes.data(), v.data(), n);
  return a;
}

int dump_links(nl::Socket& s, std::vector<nl::Link>& links) {
  auto r = nl::get_links();
  return s.call(r, [&](std::uint16_t type, std::span<const std::byte> body) {
    return type != RTM_NEWLINK || nl::parse_link(body, links);
  });
}

int dump_addrs(nl::Socket& s, std::vector<Addr>& out) {
  ifaddrmsg m{};
  m.ifa_family = AF_UNSPEC;
  nl::Request r(RTM_GETADDR, NLM_F_DUMP, &m, sizeof m);
  return s.call(r, [&](std::uint16_t type, std::span<const std::byte> body) {
    if (type != RTM_NEWADDR || body.size() < sizeof(ifaddrmsg)) return true;
    ifaddrmsg h;
    std::memcpy(&h, body.data(), sizeof h);
    if (h.ifa_family != AF_INET && h.ifa_family != AF_INET6) return true;
    Addr a{static_cast<int>(h.ifa_index), h.ifa_family, h.ifa_prefixlen, h.ifa_scope, {}, false};
    bool have_local = false;
    const bool ok = nl::attrs(body, sizeof h, [&](std::uint16_t t, std::span<const std::byte> v) {
      bool good = false;
      if (t == IFA_LOCAL) {  // the local address (IFA_ADDRESS is the peer's on a point-to-point link)
        a.ip = ip_of(h.ifa_family, v, good);
        a.has_ip = have_local = good;
      } else if (t == IFA_ADDRESS && !have_local) {
        a.ip = ip_of(h.ifa_family, v, good);
        a.has_ip = good;
      }
    });
    if (ok && a.has_ip) out.push_back(a);
    return ok;
  });
}

int dump_routes(nl::Socket& s, std::vector<Route>& out) {
  rtmsg m{};
  m.rtm_family = AF_UNSPEC;
  nl::Request r(RTM_GETROUTE, NLM_F_DUMP, &m, sizeof m);
  return s.call(r, [&](std::uint16_t type, std::span<const std::byte> body) {
    if (type != RTM_NEWROUTE || body.size() < sizeof(rtmsg)) return true;
    Route rt;
    std::memcpy(&rt.m, body.data(), sizeof rt.m);
    if (rt.m.rtm_family != AF_INET && rt.m.rtm_family != AF_INET6) return true;
    rt.table = rt.m.rtm_table;
    rt.dst.family = rt.via.family = rt.m.rtm_family == AF_INET6 ? 6 : 4;
    bool ok = true;
    const bool walked = nl::attrs(body, sizeof rt.m, [&](std::uint16_t t, std::span<const std::byte> v) {
      bool good = true;
      if (t == RTA_TABLE && v.size() == 4) std::memcpy(&rt.table, v.data(), 4);
      else if (t == RTA_OIF && v.size() == 4) std::memcpy(&rt.oif, v.data(), 4);
      else if (t == RTA_DST) rt.dst = ip_of(rt.m.rtm_family, v, good);
      else if (t == RTA_GATEWAY) rt.via = ip_of(rt.m.rtm_family, v, good), rt.has_via = good;
      else if (t == RTA_MULTIPATH) rt.multipath = true;
      ok = ok && good;
    });
    if (walked && ok) out.push_back(rt);
    return walked;
  });
}

std::string errtext(int e) { return std::strerror(e); }

/// The link to take over (see read_netns_link), from what the namespace holds.
Result<nl::Link> choose(const std::vector<nl::Link>& links, const std::vector<Addr>& addrs,
                        const std::filesystem::path& path, std::string_view ifname) {
  auto has_v4 = [&](int index) {
    for (const auto& a : addrs)
      if (a.index == index && a.family == AF_INET) return true;
    return false;
  };
  if (!ifname.empty()) {
    for (const auto& l : links) {
      if (l.name != ifname) continue;
      if (l.flags & IFF_LOOPBACK) return Error{fmt::format("{}: {} is the loopback interface", flag(path), ifname)};
      return l;
    }
    std::string names;
    for (const auto& l : links) names += (names.empty() ? "" : ", ") + l.name;
    return Error{fmt::format("{}: no interface {} in the namespace (found: {})", flag(path), ifname, names)};
  }
  std::vector<const nl::Link*> ok;
  std::string found;
  for (const auto& l : links) {
    std::string why;
    if (l.flags & IFF_LOOPBACK) why = "loopback";
    else if (!(l.flags & IFF_UP)) why = "down";
    else if (!has_v4(l.index)) why = "no IPv4 address";
    else ok.push_back(&l);
    found += fmt::format("{}{}{}", found.empty() ? "" : ", ", l.name, why.empty() ? "" : " (" + why + ")");
  }
  if (ok.size() == 1) return *ok.front();
  if (ok.empty())
    return Error{fmt::format("{}: no interface to take over (one that is up, not loopback, with an IPv4 address); "
                             "found: {}", flag(path), found.empty() ? "none" : found)};
  return Error{fmt::format("{}: {} interfaces could be taken over (up, with an IPv4 address): {}; the VM takes exactly one",
                           flag(path), ok.size(), found)};
}

Result<host::NetnsLink> read_in_namespace(const std::filesystem::path& path, std::string_view ifname) {
  nl::Socket s;
  if (auto o = s.open(); !o) return Error{fmt::format("{}: {}", flag(path), o.error().message), o.error().err};
  std::vector<nl::Link> links;
  std::vector<Addr> addrs;
  std::vector<Route> routes;
  if (int e = dump_links(s, links)) return Error{fmt::format("{}: list links: {}", flag(path), errtext(e)), e};
  if (int e = dump_addrs(s, addrs)) return Error{fmt::format("{}: list addresses: {}", flag(path), errtext(e)), e};
  if (int e = dump_routes(s, routes)) return Error{fmt::format("{}: list routes: {}", flag(path), errtext(e)), e};
  auto l = choose(links, addrs, path, ifname);
  if (!l) return l.error();
  if (!l->has_mac)
    return Error{fmt::format("{}: {} has no Ethernet address (only an Ethernet link can be mirrored to a tap)",
                             flag(path), l->name)};
  host::NetnsLink out;
  out.name = l->name;
  out.mac = l->mac;
  out.mtu = l->mtu;
  for (const auto& a : addrs) {
    if (a.index != l->index) continue;
    if (a.family == AF_INET ? a.scope == RT_SCOPE_HOST : a.scope != RT_SCOPE_UNIVERSE) continue;
    out.addresses.push_back({a.ip, a.prefix});
  }
  for (const auto& r : routes) {
    if (r.oif != l->index || r.multipath || r.table != RT_TABLE_MAIN || r.m.rtm_type != RTN_UNICAST) continue;
    if (r.m.rtm_protocol == RTPROT_KERNEL) continue;  // derived from an address: the guest derives it too
    out.routes.push_back({{r.dst, r.m.rtm_dst_len}, r.has_via ? std::optional(r.via) : std::nullopt, std::nullopt});
  }
  if (out.addresses.size() > proto::kNetMaxAddresses)
    return Error{fmt::format("{}: {} has {} addresses, more than {}", flag(path), l->name, out.addresses.size(),
                             proto::kNetMaxAddresses)};
  if (out.routes.size() > proto::kNetMaxRoutes)
    return Error{fmt::format("{}: {} has {} routes, more than {}", flag(path), l->name, out.routes.size(),
                             proto::kNetMaxRoutes)};
  return out;
}

/// tcmsg for `ifindex` with `parent` and `handle`.
tcmsg tc_of(int ifindex, std::uint32_t parent, std::uint32_t handle, std::uint32_t info = 0) {
  tcmsg t{};
  t.tcm_family = AF_UNSPEC;
  t.tcm_ifindex = ifindex;
  t.tcm_parent = parent;
  t.tcm_handle = handle;
  t.tcm_info = info;
  return t;
}

constexpr std::uint32_t kIngressHandle = TC_H_MAKE(TC_H_INGRESS, 0);  // ffff:

/// RTM_NEWQDISC / RTM_DELQDISC: the ingress qdisc (ffff:) of `ifindex`.
nl::Request ingress_qdisc(int ifindex, bool add) {
  tcmsg t = tc_of(ifindex, TC_H_INGRESS, kIngressHandle);
  nl::Request r(add ? RTM_NEWQDISC : RTM_DELQDISC, add ? NLM_F_CREATE | NLM_F_EXCL : 0, &t, sizeof t);
  if (add) r.attr_str(TCA_KIND, "ingress");
  return r;
}

/// RTM_NEWTFILTER on `from`'s ingress: u32, one key matching every packet (mask 0), every
/// protocol, action mirred egress redirect to `to` (the packet stolen from `from`'s stack): what
/// `tc filter add dev FROM parent ffff: protocol all u32 match u32 0 0 action mirred egress
/// redirect dev TO` sends. u32 rather than matchall: every kernel with tc has it (matchall is a
/// separate module, CONFIG_NET_CLS_MATCHALL, not built everywhere).
nl::Request redirect_filter(int from, int to) {
  tcmsg t = tc_of(from, kIngressHandle, 0, TC_H_MAKE(0u, htons(ETH_P_ALL)));
  nl::Request r(RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_EXCL, &t, sizeof t);
  r.attr_str(TCA_KIND, "u32");
  const auto opts = r.begin_nest(TCA_OPTIONS);
  // The selector and its one key (tc_u32_sel ends in a flexible array): mask 0 at offset 0, so
  // every packet matches.
  std::byte sel[sizeof(tc_u32_sel) + sizeof(tc_u32_key)]{};
  tc_u32_sel head{};
  head.flags = TC_U32_TERMINAL;
  head.nkeys = 1;
  std::memcpy(sel, &head, sizeof head);
  r.attr(TCA_U32_SEL, sel, sizeof sel);
  const auto acts = r.begin_nest(TCA_U32_ACT);
  const auto first = r.begin_nest(1);  // the first action (actions are numbered from 1)
  r.attr_str(TCA_ACT_KIND, "mirred");
  const auto aopts = r.begin_nest(TCA_ACT_OPTIONS);
  tc_mirred m{};
  m.action = TC_ACT_STOLEN;
  m.eaction = TCA_EGRESS_REDIR;
  m.ifindex = static_cast<std::uint32_t>(to);
  r.attr(TCA_MIRRED_PARMS, &m, sizeof m);
  r.end_nest(aopts);
  r.end_nest(first);
  r.end_nest(acts);
  r.end_nest(opts);
  return r;
}

/// RTM_NEWLINK on `ifindex`: IPv6 address generation off (the tap gets no link-local address,
/// so the namespace's own stack sends nothing into the guest's wire).
nl::Request no_ipv6_addrgen(int ifindex) {
  ifinfomsg i{};
  i.ifi_family = AF_UNSPEC;
  i.ifi_index = ifindex;
  nl::Request r(RTM_NEWLINK, 0, &i, sizeof i);
  const auto spec = r.begin_nest(IFLA_AF_SPEC);
  const auto v6 = r.begin_nest(AF_INET6);
  r.attr_u8(IFLA_INET6_ADDR_GEN_MODE, IN6_ADDR_GEN_MODE_NONE);
  r.end_nest(v6);
  r.end_nest(spec);
  return r;
}

nl::Request del_link(int ifindex) {
  ifinfomsg i{};
  i.ifi_family = AF_UNSPEC;
  i.ifi_index = ifindex;
  return nl::Request(RTM_DELLINK, 0, &i, sizeof i);
}

/// The index of link `name`, 0 if none.
int index_of(nl::Socket& s, const std::string& name, int& err) {
  std::vector<nl::Link> links;
  err = dump_links(s, links);
  for (const auto& l : links)
    if (l.name == name) return l.index;
  return 0;
}

/// A persistent tap `name` in the calling thread's namespace. 0 or errno; `step` says which call.
int make_tap(const std::string& name, std::string& step) {
  host::Fd tun(::open("/dev/net/tun", O_RDWR | O_CLOEXEC));
  if (!tun) return step = "open /dev/net/tun", errno;
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, name.data(), std::min(name.size(), sizeof ifr.ifr_name - 1));
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
  if (::ioctl(tun.get(), TUNSETIFF, &ifr) != 0) return step = "TUNSETIFF", errno;
  if (::ioctl(tun.get(), TUNSETPERSIST, 1) != 0) return step = "TUNSETPERSIST", errno;
  return 0;
}

std::string hint(int e) { return e == EEXIST ? " (is another VM attached to this namespace?)" : ""; }

}  // namespace

Result<host::Fd> open_netns(const std::filesystem::path& path) {
  host::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error{fmt::format("{}: not a network namespace ({})", flag(path), std::strerror(errno)), errno};
  int type = ::ioctl(fd.get(), NS_GET_NSTYPE);
  if (type == CLONE_NEWNET) return fd;
  std::string what;
  if (type < 0) {
    struct stat st{};
    if (::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode)) what = "a regular file";
    else if (S_ISDIR(st.st_mode)) what = "a directory";
    else what = fmt::format("not a namespace file: {}", std::strerror(errno));
  } else {
    switch (type) {
      case CLONE_NEWNS: what = "a mnt namespace"; break;
      case CLONE_NEWPID: what = "a pid namespace"; break;
      case CLONE_NEWUTS: what = "a uts namespace"; break;
      case CLONE_NEWIPC: what = "an ipc namespace"; break;
      case CLONE_NEWUSER: what = "a user namespace"; break;
      case CLONE_NEWCGROUP: what = "a cgroup namespace"; break;
      default: what = fmt::format("a namespace of type {:#x}", type);
    }
  }
  return Error{fmt::format("{}: not a network namespace ({})", flag(path), what), EINVAL};
}

Result<host::NetnsLink> read_netns_link(int nsfd, const std::filesystem::path& path, std::string_view ifname) {
  return in_netns(nsfd, path, [&] { return read_in_namespace(path, ifname); });
}

std::string netns_tap_name(std::string_view vm_id) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (unsigned char c : vm_id) h = (h ^ c) * 1099511628211ull;
  return fmt::format("nes{:012x}", h & 0xffffffffffffull);
}

NetnsAttachment& NetnsAttachment::operator=(NetnsAttachment&& o) noexcept {
  if (this != &o) {
    teardown();
    path_ = std::move(o.path_);
    ns_ = std::move(o.ns_);
    link_ = std::move(o.link_);
    link_index_ = o.link_index_;
    tap_made_ = o.tap_made_;
    link_qdisc_made_ = o.link_qdisc_made_;
    log_ = std::move(o.log_);
  }
  return *this;
}

Result<NetnsAttachment> NetnsAttachment::attach(const std::filesystem::path& path, const std::string& tap,
                                                std::string_view ifname, NetnsLog log) {
  if (tap.empty() || tap.size() >= IFNAMSIZ)
    return Error{fmt::format("{}: tap name '{}': expected 1..{} characters", flag(path), tap, IFNAMSIZ - 1)};
  NetnsAttachment a;
  a.path_ = path;
  a.log_ = log ? std::move(log) : [](std::string_view line) { fmt::print(stderr, "neshost: {}\n", line); };
  auto ns = open_netns(path);
  if (!ns) return ns.error();
  a.ns_ = std::move(*ns);
  auto link = read_netns_link(a.ns_.get(), path, ifname);
  if (!link) return link.error();
  a.link_ = std::move(*link);
  a.link_.tap = tap;
  auto made = in_netns(a.ns_.get(), path, [&]() -> host::Status {
    nl::Socket s;
    if (auto o = s.open(); !o) return Error{fmt::format("{}: {}", flag(path), o.error().message), o.error().err};
    int err = 0;
    a.link_index_ = index_of(s, a.link_.name, err);
    if (!a.link_index_) return Error{fmt::format("{}: {} is gone: {}", flag(path), a.link_.name, errtext(err ? err : ENODEV))};
    if (index_of(s, tap, err))
      return Error{fmt::format("{}: a link named {} exists already (left by a VM that did not end? delete it)", flag(path), tap), EEXIST};
    std::string step;
    if (int e = make_tap(tap, step)) return Error{fmt::format("{}: tap {}: {}: {}", flag(path), tap, step, errtext(e)), e};
    a.tap_made_ = true;
    const int tap_index = index_of(s, tap, err);
    if (!tap_index) return Error{fmt::format("{}: tap {} made but not listed: {}", flag(path), tap, errtext(err ? err : ENODEV))};
    if (int e = s.call(no_ipv6_addrgen(tap_index)); e && e != EAFNOSUPPORT)  // a kernel without IPv6: nothing to turn off
      return Error{fmt::format("{}: tap {}: IPv6 address generation off: {}", flag(path), tap, errtext(e)), e};
    if (int e = s.call(nl::set_link_up(tap_index, a.link_.mtu)))
      return Error{fmt::format("{}: tap {} up with MTU {}: {}", flag(path), tap, a.link_.mtu, errtext(e)), e};
    if (int e = s.call(ingress_qdisc(a.link_index_, true)))
      return Error{fmt::format("{}: ingress qdisc on {}: {}{}", flag(path), a.link_.name, errtext(e), hint(e)), e};
    a.link_qdisc_made_ = true;
    if (int e = s.call(ingress_qdisc(tap_index, true)))
      return Error{fmt::format("{}: ingress qdisc on {}: {}", flag(path), tap, errtext(e)), e};
    if (int e = s.call(redirect_filter(a.link_index_, tap_index)))
      return Error{fmt::format("{}: tc filter {} -> {} (u32, mirred egress redirect): {}", flag(path), a.link_.name, tap, errtext(e)), e};
    if (int e = s.call(redirect_filter(tap_index, a.link_index_)))
      return Error{fmt::format("{}: tc filter {} -> {} (u32, mirred egress redirect): {}", flag(path), tap, a.link_.name, errtext(e)), e};
    return host::Ok{};
  });
  if (!made) return made.error();  // `a` tears down what was made
  return a;
}

NetnsAttachment NetnsAttachment::reclaim(host::Fd ns, const std::filesystem::path& path, const std::string& tap,
                                         const std::string& ifname, NetnsLog log) {
  NetnsAttachment a;
  a.path_ = path;
  a.log_ = log ? std::move(log) : [](std::string_view line) { fmt::print(stderr, "neshost: {}\n", line); };
  a.ns_ = std::move(ns);
  a.link_.name = ifname;
  a.link_.tap = tap;
  if (a.ns_) {
    // Only while the tap is there: without it the attachment is gone already, and a qdisc on the
    // interface may be another attachment's.
    int tap_index = 0;
    auto found = in_netns(a.ns_.get(), path, [&]() -> host::Status {
      nl::Socket s;
      if (auto o = s.open(); !o) return Error{o.error().message, o.error().err};
      int err = 0;
      tap_index = index_of(s, tap, err);
      a.link_index_ = index_of(s, ifname, err);
      return host::Ok{};
    });
    a.tap_made_ = found && tap_index > 0;
    a.link_qdisc_made_ = a.tap_made_ && a.link_index_ > 0;
  }
  return a;
}

void NetnsAttachment::teardown() {
  if (!ns_) return;
  if (tap_made_ || link_qdisc_made_) {
    auto done = in_netns(ns_.get(), path_, [&]() -> host::Status {
      nl::Socket s;
      if (auto o = s.open(); !o) return Error{o.error().message, o.error().err};
      if (link_qdisc_made_) {
        if (int e = s.call(ingress_qdisc(link_index_, false)))
          log_(fmt::format("{}: teardown: ingress qdisc on {}: {}", flag(path_), link_.name, errtext(e)));
      }
      if (tap_made_) {
        int err = 0;
        const int tap_index = index_of(s, link_.tap, err);
        if (!tap_index) log_(fmt::format("{}: teardown: tap {}: not found: {}", flag(path_), link_.tap, errtext(err ? err : ENODEV)));
        else if (int e = s.call(del_link(tap_index)))
          log_(fmt::format("{}: teardown: delete tap {}: {}", flag(path_), link_.tap, errtext(e)));
      }
      return host::Ok{};
    });
    if (!done) log_(fmt::format("{}: teardown: {}", flag(path_), done.error().message));
  }
  tap_made_ = link_qdisc_made_ = false;
  ns_.reset();
}

}  // namespace nes::vm
