// `--network netns:PATH` on the host (the CNI model, docs/network.md "netns mode"): the VM takes
// over the one interface of an existing network namespace. Before boot the interface's MAC, MTU,
// addresses and routes are read from the namespace (they become the guest's, host::guest_network),
// then a tap is made in that namespace and tied to the interface with tc: an ingress qdisc on
// each and a u32 match-all filter whose action is `mirred egress redirect` to the other (Kata
// Containers' default "tcfilter" model). QEMU runs in the namespace (vm::LaunchOptions::netns_fd)
// and opens the tap by name. Everything in the namespace is done on a short-lived thread that
// setns(2)s into it: the calling thread's namespace never changes. Needs CAP_NET_ADMIN over the
// namespace (and CAP_SYS_ADMIN for setns). rtnetlink by hand (base/netlink.hpp), no `ip`/`tc`.
// Internal to neshost (not installed); tests: tests/host/netns_test.cpp, tests/vm/vm_test.py netns.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "host/lib/base.hpp"
#include "host/lib/network.hpp"

namespace nes::vm {

/// Opens `path` (O_RDONLY|O_CLOEXEC) and checks that it is a network namespace (ioctl
/// NS_GET_NSTYPE == CLONE_NEWNET). Errors (exit 125 at the CLI): "--network netns:PATH: not a
/// network namespace (a regular file)", "(a mnt namespace)", "(No such file or directory)".
host::Result<host::Fd> open_netns(const std::filesystem::path& path);

/// Reads the interface to take over from the namespace `nsfd` (`path` names it in errors):
/// `ifname` empty: the one link that is not loopback, is up and has an IPv4 address; else the
/// link of that name (not loopback). Fills name, mac, mtu, addresses (every IPv4 address that is
/// not host-scoped, every global IPv6 one) and routes (the main table's unicast routes out of
/// it, default included, without the ones the kernel derives from an address, which the guest's
/// kernel derives alike); `tap` stays empty. Errors name what was found: none or several
/// candidates ("found: lo (loopback), eth1 (down)"), a link without an Ethernet address, more
/// addresses or routes than boot.network allows, a netlink failure.
host::Result<host::NetnsLink> read_netns_link(int nsfd, const std::filesystem::path& path, std::string_view ifname = {});

/// The tap's name for VM `vm_id`: "nes" and 12 hex digits of a hash of the id (15 characters,
/// IFNAMSIZ - 1), so two VMs get two names and one VM always the same.
std::string netns_tap_name(std::string_view vm_id);

/// Receives one line for each teardown step that failed (the errors are otherwise ignored).
using NetnsLog = std::function<void(std::string_view)>;

/// What was made in a namespace for one VM: the tap (persistent, IFF_TAP|IFF_NO_PI|IFF_VNET_HDR,
/// up with the interface's MTU, no IPv6 address of its own), the ingress qdiscs and the two
/// redirecting filters; and the namespace's fd, held open so the namespace outlives a CNI
/// plugin's deletion until the VM is gone. Move-only; its destructor tears down (teardown()).
class NetnsAttachment {
 public:
  /// In order: open_netns(path), read_netns_link(…, ifname), check no link named `tap` exists,
  /// create the tap, bring it up, ingress qdisc on the interface and on the tap, the filter
  /// interface → tap, the filter tap → interface. On a failure what was made is torn down again
  /// and the error names the step ("--network netns:PATH: ingress qdisc on eth0: File exists (is
  /// another VM attached?)"). `log`: where teardown reports failures (default: stderr).
  static host::Result<NetnsAttachment> attach(const std::filesystem::path& path, const std::string& tap,
                                              std::string_view ifname = {}, NetnsLog log = {});

  /// What another process made for a VM (its attach(), recorded in vmm.json), to be torn down by
  /// this one (a replacement monitor, or the command that finds the VM's monitor and VMM gone):
  /// the namespace `ns` (an open fd of it: /proc/VMM/ns/net while QEMU runs there, else
  /// open_netns(path)), `tap` and `ifname` by name (`path` for messages). Taken only while the tap
  /// exists (without it the attachment is gone, and a qdisc on `ifname` may be another's); the
  /// interface's qdisc only if `ifname` is there. An empty `ns`: nothing is taken.
  static NetnsAttachment reclaim(host::Fd ns, const std::filesystem::path& path, const std::string& tap,
                                 const std::string& ifname, NetnsLog log = {});

  NetnsAttachment(NetnsAttachment&&) noexcept = default;
  NetnsAttachment& operator=(NetnsAttachment&& o) noexcept;
  NetnsAttachment(const NetnsAttachment&) = delete;
  NetnsAttachment& operator=(const NetnsAttachment&) = delete;
  ~NetnsAttachment() { teardown(); }

  /// The interface taken over, `tap` set: what host::NetworkSpec::link gets.
  const host::NetnsLink& link() const { return link_; }
  /// The namespace (owned): vm::LaunchOptions::netns_fd for QEMU.
  int netns_fd() const { return ns_.get(); }
  /// Deletes the interface's ingress qdisc (its filter goes with it) and the tap (its qdisc and
  /// filter go with it), on a thread in the namespace; each failure goes to the log, none stops
  /// the rest. Then closes the namespace. Idempotent; after it the object holds nothing.
  void teardown();
  /// Forgets what was made without undoing it (closes the namespace fd): for a process that has
  /// handed the VM on to another that owns the same attachment (`neshost run -d`'s creator after
  /// the fork; the monitor tears down).
  void release() {
    tap_made_ = link_qdisc_made_ = false;
    ns_.reset();
  }

 private:
  NetnsAttachment() = default;

  std::filesystem::path path_;
  host::Fd ns_;
  host::NetnsLink link_;
  int link_index_ = 0;
  bool tap_made_ = false, link_qdisc_made_ = false;
  NetnsLog log_;
};

}  // namespace nes::vm
