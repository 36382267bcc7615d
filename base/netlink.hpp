// rtnetlink(7) by hand, shared by the init (configuring boot.network, nesinit/network.cpp) and the
// host (reading a network namespace's interface and wiring a tap to it, host/vm/netns.cpp): a
// request builder (nlmsghdr + family header + attributes, nested ones too), the walk over the
// kernel's answer (messages, then attributes) and a socket that sends one request and reads its
// answer with bounded waits. No knowledge of any one request beyond the two both sides send
// (bring a link up, list the links); each side builds its own on Request. Header-only, std and
// the kernel's UAPI only (the init is measured in KiB: no iostream, no std::function).
// Unit tests: tests/init/netlink_test.cpp; against a real kernel: tests/init/e2e_network_test.cpp
// and tests/host/netns_test.cpp.
#pragma once

#include <linux/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/fd.hpp"
#include "base/result.hpp"

namespace nes::base::nl {

/// NLMSG_ALIGN as a function: netlink messages and attributes are padded to 4 bytes.
constexpr std::size_t align(std::size_t n) { return (n + NLMSG_ALIGNTO - 1) & ~std::size_t(NLMSG_ALIGNTO - 1); }

/// One request: an nlmsghdr, the family header (ifinfomsg, ifaddrmsg, rtmsg, tcmsg) and its
/// attributes, each padded to NLA_ALIGNTO (4 bytes). Flags always include NLM_F_REQUEST and
/// NLM_F_ACK (the kernel answers every request with an nlmsgerr, 0 for success).
class Request {
 public:
  /// `type` RTM_*, `flags` beyond REQUEST|ACK (NLM_F_CREATE, NLM_F_EXCL, NLM_F_DUMP),
  /// `hdr`/`len` the family header copied after the nlmsghdr.
  Request(std::uint16_t type, std::uint16_t flags, const void* hdr, std::size_t len) {
    nlmsghdr h{};
    h.nlmsg_type = type;
    h.nlmsg_flags = static_cast<std::uint16_t>(NLM_F_REQUEST | NLM_F_ACK | flags);
    buf_.resize(align(sizeof h) + align(len));
    std::memcpy(buf_.data(), &h, sizeof h);
    std::memcpy(buf_.data() + align(sizeof h), hdr, len);
  }
  /// Append attribute `type` with `len` bytes of `data` (rtattr, padded). Out of line: one copy.
  [[gnu::noinline]] void attr(std::uint16_t type, const void* data, std::size_t len) {
    rtattr a{};
    a.rta_type = type;
    a.rta_len = static_cast<unsigned short>(RTA_LENGTH(len));
    std::size_t at = buf_.size();
    buf_.resize(at + RTA_SPACE(len));
    std::memcpy(buf_.data() + at, &a, sizeof a);
    std::memcpy(buf_.data() + at + RTA_LENGTH(0), data, len);
  }
  void attr_u32(std::uint16_t type, std::uint32_t v) { attr(type, &v, sizeof v); }
  void attr_u8(std::uint16_t type, std::uint8_t v) { attr(type, &v, sizeof v); }
  /// A string attribute, NUL-terminated (IFLA_IFNAME, TCA_KIND).
  void attr_str(std::uint16_t type, std::string_view s) {
    std::string z(s);
    attr(type, z.c_str(), z.size() + 1);
  }
  /// Open a nested attribute `type` (NLA_F_NESTED set, as iproute2 sends them): the attributes
  /// appended until end_nest(the returned offset) are its value.
  std::size_t begin_nest(std::uint16_t type) {
    const std::size_t at = buf_.size();
    attr(static_cast<std::uint16_t>(type | NLA_F_NESTED), &at, 0);
    return at;
  }
  /// Close the nest begun at `at`: its length now covers what was appended since.
  void end_nest(std::size_t at) {
    rtattr a;
    std::memcpy(&a, buf_.data() + at, sizeof a);
    a.rta_len = static_cast<unsigned short>(buf_.size() - at);
    std::memcpy(buf_.data() + at, &a, sizeof a);
  }
  /// The message with its length and sequence number `seq` filled in.
  std::span<const std::byte> bytes(std::uint32_t seq) {
    auto* h = reinterpret_cast<nlmsghdr*>(buf_.data());
    h->nlmsg_len = static_cast<std::uint32_t>(buf_.size());
    h->nlmsg_seq = seq;
    return buf_;
  }
  std::uint16_t type() const { return reinterpret_cast<const nlmsghdr*>(buf_.data())->nlmsg_type; }

 private:
  std::vector<std::byte> buf_;
};

/// RTM_NEWLINK on `ifindex`: IFF_UP set, and IFLA_MTU if `mtu` is not 0.
inline Request set_link_up(int ifindex, std::uint32_t mtu) {
  ifinfomsg i{};
  i.ifi_family = AF_UNSPEC;
  i.ifi_index = ifindex;
  i.ifi_flags = IFF_UP;
  i.ifi_change = IFF_UP;
  Request r(RTM_NEWLINK, 0, &i, sizeof i);
  if (mtu) r.attr_u32(IFLA_MTU, mtu);
  return r;
}

/// RTM_GETLINK dump of every link.
inline Request get_links() {
  ifinfomsg i{};
  i.ifi_family = AF_UNSPEC;
  return Request(RTM_GETLINK, NLM_F_DUMP, &i, sizeof i);
}

/// What one datagram of the kernel's answer holds.
struct Reply {
  bool done = false;  // NLMSG_DONE, or the nlmsgerr that ends a request
  int error = 0;      // from nlmsgerr: 0 or a positive errno
  bool malformed = false;  // a header or attribute overruns the datagram: stop reading
};

/// Walk one datagram `data` answering request `seq`: `on_message(type, body)` for each message of
/// that sequence number other than the end (body: the family header and its attributes; its
/// return false marks the datagram malformed), an nlmsgerr or NLMSG_DONE ends it. Messages with
/// another sequence number are skipped.
template <class F>
Reply parse(std::span<const std::byte> data, std::uint32_t seq, F&& on_message) {
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
      if (!on_message(h.nlmsg_type, std::span(body, body_len))) return out.malformed = true, out;
    }
    at += align(h.nlmsg_len);
  }
  return out;
}

/// Walk the attributes of `body` after its family header of `hdr_len` bytes (or of a nested
/// attribute's value, hdr_len 0): `on_attr(type, value)` for each, type without NLA_F_NESTED.
/// false if an attribute overruns `body` (nothing past it is read); a body shorter than its
/// header holds none. Always inlined: each parser has its one walk (the init's size is measured).
template <class F>
[[gnu::always_inline]] inline bool attrs(std::span<const std::byte> body, std::size_t hdr_len, F&& on_attr) {
  std::size_t a = align(hdr_len);
  while (a + sizeof(rtattr) <= body.size()) {
    rtattr ra;
    std::memcpy(&ra, body.data() + a, sizeof ra);
    if (ra.rta_len < sizeof ra || ra.rta_len > body.size() - a) return false;
    on_attr(static_cast<std::uint16_t>(ra.rta_type & NLA_TYPE_MASK),
            body.subspan(a + RTA_LENGTH(0), ra.rta_len - RTA_LENGTH(0)));
    a += RTA_ALIGN(ra.rta_len);
  }
  return true;
}

/// A link as RTM_NEWLINK describes it: its index, flags (IFF_*), name, hardware address (if it
/// has one of 6 bytes: Ethernet) and MTU.
struct Link {
  int index = 0;
  unsigned flags = 0;
  std::string name;
  bool has_mac = false;
  std::array<std::uint8_t, 6> mac{};
  std::uint32_t mtu = 0;
};

/// The link an RTM_NEWLINK `body` describes, appended to `links`; false if malformed. A body
/// shorter than an ifinfomsg is skipped (true, nothing appended).
inline bool parse_link(std::span<const std::byte> body, std::vector<Link>& links) {
  if (body.size() < sizeof(ifinfomsg)) return true;
  ifinfomsg i;
  std::memcpy(&i, body.data(), sizeof i);
  Link l;
  l.index = i.ifi_index;
  l.flags = i.ifi_flags;
  const bool ok = attrs(body, sizeof i, [&](std::uint16_t type, std::span<const std::byte> v) {
    if (type == IFLA_ADDRESS && v.size() == 6) {
      std::memcpy(l.mac.data(), v.data(), 6);
      l.has_mac = true;
    } else if (type == IFLA_IFNAME && !v.empty()) {
      auto* s = reinterpret_cast<const char*>(v.data());
      l.name.assign(s, strnlen(s, v.size()));
    } else if (type == IFLA_MTU && v.size() == 4) {
      std::memcpy(&l.mtu, v.data(), 4);
    }
  });
  if (ok) links.push_back(std::move(l));
  return ok;
}

/// A NETLINK_ROUTE socket in the calling thread's network namespace (fixed at open): one request
/// at a time, answered before the next, every wait bounded.
class Socket {
 public:
  /// socket(AF_NETLINK, NETLINK_ROUTE). Error: socket(2)'s errno. Inlined at its one call site.
  [[gnu::always_inline]] Status open() {
    fd_ = Fd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
    if (!fd_) return errno_error(errno, "socket(AF_NETLINK)");
    return Ok{};
  }

  /// Send `r` and read its answer: `on_message(type, body)` for each message of a dump (as
  /// parse()). Returns 0 or a positive errno: the kernel's answer, ETIMEDOUT if it says nothing
  /// for 2 s, EBADMSG for a malformed answer, EMSGSIZE past 4096 datagrams.
  template <class F>
  int call(Request& r, F&& on_message) {
    const std::uint32_t seq = ++seq_;
    auto bytes = r.bytes(seq);
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (::sendto(fd_.get(), bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0)
      return errno;
    std::vector<std::byte> buf(32 * 1024);
    for (int datagrams = 0; datagrams < 4096; ++datagrams) {  // a dump of a few links: bounded
      pollfd p{fd_.get(), POLLIN, 0};
      int n = ::poll(&p, 1, 2000);  // the kernel answers at once; 2 s means it never will
      if (n == 0) return ETIMEDOUT;
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      ssize_t got = ::recv(fd_.get(), buf.data(), buf.size(), 0);
      if (got < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      auto reply = parse(std::span(buf.data(), static_cast<std::size_t>(got)), seq, on_message);
      if (reply.malformed) return EBADMSG;
      if (reply.done) return reply.error;
    }
    return EMSGSIZE;
  }
  /// A request whose answer is only its acknowledgement.
  int call(Request& r) {
    return call(r, [](std::uint16_t, std::span<const std::byte>) { return true; });
  }
  /// A request whose answer is only its acknowledgement.
  int call(Request&& r) { return call(r); }

 private:
  Fd fd_;
  std::uint32_t seq_ = 0;
};

}  // namespace nes::base::nl
