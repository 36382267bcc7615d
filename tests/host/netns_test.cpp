// host/vm/netns.hpp against the real kernel, without a VM: namespaces the test makes (each held
// by a child process blocked on a pipe, named /proc/PID/ns/net, reaped at the end), a veth pair
// between two of them, the interface read back value by value, the tap and both tc redirects
// present after attach and gone after teardown, every refusal; and vm::LaunchOptions::netns_fd
// (the child runs in the namespace). The machine's own namespace is never touched: its link,
// address and route lists are the same before and after. Needs root (CAP_NET_ADMIN, setns).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "host/vm/netns.hpp"
#include "host/vm/process.hpp"
#include "protocol/codec.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes;
using namespace std::chrono_literals;

namespace {

proto::IpAddr ip(const char* t) { return *proto::ip_from_text(t); }

/// stdout of `cmd` (sh -c), its exit status in `status`.
std::string run(const std::string& cmd, int* status = nullptr) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  if (status) *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  return out;
}

/// `cmd` must succeed.
std::string must(const std::string& cmd) {
  int st = 0;
  std::string out = run(cmd, &st);
  INFO(cmd, "\n", out);
  REQUIRE(st == 0);
  return out;
}

/// The machine's (this process's) network as `ip` lists it: links, addresses, routes.
std::string own_network() {
  return must("ip -o link show; ip -o addr show; ip route show table all; ip -6 route show table all");
}

/// A network namespace held by a child blocked on a pipe; reaped on destruction.
class Holder {
 public:
  Holder() {
    int ready[2], hold[2];
    REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(hold, O_CLOEXEC) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(ready[0]);
      ::close(hold[1]);
      char c = ::unshare(CLONE_NEWNET) == 0 ? 'y' : 'n';
      if (::write(ready[1], &c, 1) != 1) ::_exit(1);
      while (::read(hold[0], &c, 1) != 0) {}  // EOF: the test is done with us
      ::_exit(0);
    }
    ::close(ready[1]);
    ::close(hold[0]);
    hold_ = hold[1];
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    ::close(ready[0]);
    REQUIRE(c == 'y');
    path_ = fmt::format("/proc/{}/ns/net", pid_);
    must(in("ip link set lo up"));
  }
  ~Holder() {
    ::close(hold_);
    int st;
    ::waitpid(pid_, &st, 0);
  }
  const std::string& path() const { return path_; }
  pid_t pid() const { return pid_; }
  /// `cmd` run inside this namespace.
  std::string in(const std::string& cmd) const { return fmt::format("nsenter --net={} {}", path_, cmd); }

 private:
  pid_t pid_ = -1;
  int hold_ = -1;
  std::string path_;
};

/// Namespace A with eth0 (02:00:00:99:00:02, MTU 1400, 10.99.0.2/24, fd99::2/64, default routes
/// via 10.99.0.1 and fd99::1, 192.168.77.0/24 via 10.99.0.1) whose veth peer `peer0` is in B
/// (10.99.0.1/24).
struct Pair {
  Holder a, b;
  Pair() {
    must(a.in(fmt::format("ip link add eth0 address 02:00:00:99:00:02 mtu 1400 type veth peer name peer0 netns {}", b.pid())));
    must(a.in("ip addr add 10.99.0.2/24 dev eth0"));
    must(a.in("ip addr add fd99::2/64 dev eth0 nodad"));
    must(a.in("ip link set eth0 up"));
    must(a.in("ip route add default via 10.99.0.1"));
    must(a.in("ip route add 192.168.77.0/24 via 10.99.0.1"));
    must(a.in("ip -6 route add default via fd99::1 dev eth0"));
    must(b.in("ip addr add 10.99.0.1/24 dev peer0"));
    must(b.in("ip link set peer0 up"));
  }
};

}  // namespace

TEST_CASE("read_netns_link: eth0's MAC, MTU, addresses and routes, value by value") {
  REQUIRE(::geteuid() == 0);
  const std::string before = own_network();
  {
    Pair p;
    auto ns = vm::open_netns(p.a.path());
    REQUIRE_MESSAGE(ns, ns.error().message);
    auto l = vm::read_netns_link(ns->get(), p.a.path());
    REQUIRE_MESSAGE(l, l.error().message);
    CHECK(l->name == "eth0");
    CHECK(l->mac == proto::MacAddr{0x02, 0, 0, 0x99, 0, 0x02});
    CHECK(l->mtu == 1400);
    CHECK(l->addresses == std::vector<proto::IpPrefix>{{ip("10.99.0.2"), 24}, {ip("fd99::2"), 64}});
    const std::vector<proto::NetRoute> want = {
        {{ip("0.0.0.0"), 0}, ip("10.99.0.1"), std::nullopt},
        {{ip("192.168.77.0"), 24}, ip("10.99.0.1"), std::nullopt},
        {{ip("::"), 0}, ip("fd99::1"), std::nullopt},
    };
    CHECK(l->routes == want);  // not the kernel's 10.99.0.0/24, fd99::/64, fe80::/64
    CHECK(l->tap.empty());
    // Named explicitly: the same; a name that is not there is an error listing what is.
    auto named = vm::read_netns_link(ns->get(), p.a.path(), "eth0");
    REQUIRE(named);
    CHECK(*named == *l);
    auto none = vm::read_netns_link(ns->get(), p.a.path(), "eth9");
    REQUIRE(!none);
    CHECK(none.error().message == fmt::format("--network netns:{}: no interface eth9 in the namespace (found: lo, eth0)", p.a.path()));
    auto lo = vm::read_netns_link(ns->get(), p.a.path(), "lo");
    REQUIRE(!lo);
    CHECK(lo.error().message.find("lo is the loopback interface") != std::string::npos);
  }
  CHECK(own_network() == before);
}

TEST_CASE("attach: the tap and both redirects exist, up with eth0's MTU; teardown removes them") {
  REQUIRE(::geteuid() == 0);
  const std::string before = own_network();
  {
    Pair p;
    const std::string tap = vm::netns_tap_name("netns-test");
    CHECK(tap.size() == 15);
    CHECK(tap.starts_with("nes"));
    CHECK(vm::netns_tap_name("netns-test") == tap);
    CHECK(vm::netns_tap_name("netns-test2") != tap);
    std::vector<std::string> logged;
    {
      auto a = vm::NetnsAttachment::attach(p.a.path(), tap, {}, [&](std::string_view l) { logged.emplace_back(l); });
      REQUIRE_MESSAGE(a, a.error().message);
      CHECK(a->link().tap == tap);
      CHECK(a->link().name == "eth0");
      CHECK(a->netns_fd() >= 0);
      const std::string link = must(p.a.in("ip -d link show " + tap));
      CHECK(link.find("mtu 1400") != std::string::npos);
      CHECK(link.find(",UP") != std::string::npos);
      CHECK(link.find("tun type tap") != std::string::npos);
      CHECK(link.find("vnet_hdr on") != std::string::npos);
      CHECK(link.find("persist on") != std::string::npos);
      CHECK(must(p.a.in("ip -6 addr show dev " + tap)).empty());  // no link-local address of its own
      const std::string eth_filters = must(p.a.in("tc filter show dev eth0 ingress"));
      INFO(eth_filters);
      CHECK(eth_filters.find("u32") != std::string::npos);
      CHECK(eth_filters.find(fmt::format("mirred (Egress Redirect to device {}) stolen", tap)) != std::string::npos);
      const std::string tap_filters = must(p.a.in("tc filter show dev " + tap + " ingress"));
      INFO(tap_filters);
      CHECK(tap_filters.find("mirred (Egress Redirect to device eth0) stolen") != std::string::npos);
      CHECK(must(p.a.in("tc qdisc show dev eth0")).find("qdisc ingress ffff:") != std::string::npos);

      // A second VM on the same namespace is refused at eth0's qdisc, and removes its own tap.
      auto twice = vm::NetnsAttachment::attach(p.a.path(), vm::netns_tap_name("other"), {}, [&](std::string_view l) { logged.emplace_back(l); });
      REQUIRE(!twice);
      CHECK(twice.error().message ==
            fmt::format("--network netns:{}: ingress qdisc on eth0: File exists (is another VM attached to this namespace?)", p.a.path()));
      int st = 0;
      run(p.a.in("ip link show " + vm::netns_tap_name("other")), &st);
      CHECK(st != 0);
      // The same tap name twice: refused before anything is made.
      auto same = vm::NetnsAttachment::attach(p.a.path(), tap, {}, [&](std::string_view l) { logged.emplace_back(l); });
      REQUIRE(!same);
      CHECK(same.error().message.find(fmt::format("a link named {} exists already", tap)) != std::string::npos);
      CHECK(must(p.a.in("tc filter show dev eth0 ingress")) == eth_filters);  // the first one's still in place

      // Moved: the new owner tears down, the old one holds nothing.
      vm::NetnsAttachment moved = std::move(*a);
      CHECK(a->netns_fd() < 0);
      moved.teardown();
      moved.teardown();  // idempotent
    }
    CHECK(logged.empty());
    int st = 0;
    run(p.a.in("ip link show " + tap), &st);
    CHECK(st != 0);
    CHECK(must(p.a.in("tc qdisc show dev eth0")).find("ingress") == std::string::npos);
    CHECK(must(p.a.in("tc filter show dev eth0 ingress")).empty());
    // eth0 itself is as it was.
    auto ns = vm::open_netns(p.a.path());
    REQUIRE(ns);
    auto l = vm::read_netns_link(ns->get(), p.a.path());
    REQUIRE(l);
    CHECK(l->addresses.size() == 2);
  }
  CHECK(own_network() == before);
}

TEST_CASE("teardown logs what it cannot undo, and goes on") {
  REQUIRE(::geteuid() == 0);
  Pair p;
  std::vector<std::string> logged;
  const std::string tap = vm::netns_tap_name("gone");
  {
    auto a = vm::NetnsAttachment::attach(p.a.path(), tap, {}, [&](std::string_view l) { logged.emplace_back(l); });
    REQUIRE_MESSAGE(a, a.error().message);
    must(p.a.in("ip link del " + tap));  // someone else removed the tap
  }
  REQUIRE(logged.size() == 1);
  CHECK(logged[0].find(fmt::format("teardown: tap {}: not found", tap)) != std::string::npos);
  CHECK(must(p.a.in("tc qdisc show dev eth0")).find("ingress") == std::string::npos);
}

TEST_CASE("open_netns: a path that is not a network namespace") {
  test::TempDir d;
  const auto file = d.path / "plain";
  must("touch " + file.string());
  auto f = vm::open_netns(file);
  REQUIRE(!f);
  CHECK(f.error().message == fmt::format("--network netns:{}: not a network namespace (a regular file)", file.string()));
  auto m = vm::open_netns("/proc/self/ns/mnt");
  REQUIRE(!m);
  CHECK(m.error().message == "--network netns:/proc/self/ns/mnt: not a network namespace (a mnt namespace)");
  auto gone = vm::open_netns(d.path / "missing");
  REQUIRE(!gone);
  CHECK(gone.error().message.ends_with("missing: not a network namespace (No such file or directory)"));
  auto dir = vm::open_netns(d.path);
  REQUIRE(!dir);
  CHECK(dir.error().message.ends_with("not a network namespace (a directory)"));
  // attach refuses it too, before anything.
  auto a = vm::NetnsAttachment::attach(file, "nestest");
  REQUIRE(!a);
  CHECK(a.error().message == f.error().message);
}

TEST_CASE("no usable interface, or several: the error names what was found") {
  REQUIRE(::geteuid() == 0);
  const std::string before = own_network();
  {
    Holder empty;
    auto ns = vm::open_netns(empty.path());
    REQUIRE(ns);
    auto l = vm::read_netns_link(ns->get(), empty.path());
    REQUIRE(!l);
    CHECK(l.error().message == fmt::format("--network netns:{}: no interface to take over (one that is up, not loopback, "
                                           "with an IPv4 address); found: lo (loopback)", empty.path()));
    auto a = vm::NetnsAttachment::attach(empty.path(), "nestest");
    REQUIRE(!a);
    CHECK(a.error().message == l.error().message);

    Pair p;
    must(p.a.in("ip link add dummy0 type veth peer name dummy1"));  // down: not candidates
    auto one = vm::read_netns_link(vm::open_netns(p.a.path())->get(), p.a.path());
    REQUIRE(one);
    must(p.a.in("ip addr add 10.98.0.2/24 dev dummy1"));
    must(p.a.in("ip link set dummy1 up"));
    auto two = vm::read_netns_link(vm::open_netns(p.a.path())->get(), p.a.path());
    REQUIRE(!two);
    CHECK(two.error().message == fmt::format("--network netns:{}: 2 interfaces could be taken over (up, with an IPv4 "
                                             "address): lo (loopback), eth0, dummy1, dummy0 (down); the VM takes exactly one",
                                             p.a.path()));
    auto named = vm::read_netns_link(vm::open_netns(p.a.path())->get(), p.a.path(), "dummy1");
    REQUIRE(named);
    CHECK(named->addresses == std::vector<proto::IpPrefix>{{ip("10.98.0.2"), 24}});
    CHECK(named->routes.empty());
  }
  CHECK(own_network() == before);
}

TEST_CASE("LaunchOptions::netns_fd: the child runs in the namespace") {
  REQUIRE(::geteuid() == 0);
  Holder h;
  auto ns = vm::open_netns(h.path());
  REQUIRE(ns);
  const std::string want = must("readlink " + h.path());
  const std::string ours = must("readlink /proc/self/ns/net");
  REQUIRE(want != ours);
  std::string out;
  std::mutex mu;
  vm::LaunchOptions o;
  o.argv = {"/bin/sh", "-c", "readlink /proc/self/ns/net"};
  o.console = [&](std::string_view s) { std::lock_guard lk(mu); out += s; };
  o.netns_fd = ns->get();
  auto p = vm::VmProcess::launch(std::move(o));
  REQUIRE_MESSAGE(p, p.error().message);
  auto e = (*p)->wait_for(10s);
  REQUIRE(e);
  CHECK(e->code == 0);
  (*p)->finish_output(5s);
  std::lock_guard lk(mu);
  CHECK(out == want);
  // A bad fd: the launch fails, saying setns.
  vm::LaunchOptions bad;
  bad.argv = {"/bin/true"};
  host::Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  bad.netns_fd = devnull.get();
  auto q = vm::VmProcess::launch(std::move(bad));
  REQUIRE(!q);
  CHECK(q.error().message.starts_with("setns into the network namespace: "));
}
