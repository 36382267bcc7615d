// Endpoints: Unix listener rules (mode, parent 0700, stale vs live, sun_path), VMM path helpers,
// vsock address handling and CID registry. AF_VSOCK sockets are never created here.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <linux/vm_sockets.h>

#include "host/lib/endpoint.hpp"
#include "support.hpp"

using namespace nes::host;
namespace fs = std::filesystem;

TEST_CASE("VMM path helpers") {
  CHECK(firecracker_vsock_path("/run/fc/v.sock", 7000) == "/run/fc/v.sock_7000");
  CHECK(libkrun_vsock_path("/run/krun/port7000") == "/run/krun/port7000");
}

TEST_CASE("sun_path length is checked with a clear error") {
  CHECK(check_sun_path(std::string(107, 'a')));
  auto e = check_sun_path(std::string(108, 'a'));
  REQUIRE(!e);
  CHECK(e.error().message.find("108 bytes") != std::string::npos);
  CHECK(e.error().message.find("at most 107") != std::string::npos);
  CHECK(!check_sun_path(""));
}

TEST_CASE("listen_unix: default 0600, parent created 0700, chmod as asked") {
  nes::test::TempDir t;
  UnixListenOptions o;
  o.path = (t.path / "run" / "g.sock").string();
  auto fd = listen_unix(o);
  REQUIRE(fd);
  struct stat st{};
  REQUIRE(::stat(o.path.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(::stat((t.path / "run").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  UnixListenOptions o2;
  o2.path = (t.path / "run" / "h.sock").string();
  o2.mode = 0660;
  o2.owner = ::getuid();
  o2.group = ::getgid();
  auto fd2 = listen_unix(o2);
  REQUIRE(fd2);
  REQUIRE(::stat(o2.path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);
}

TEST_CASE("listen_unix: a live listener is never stolen; a stale socket is replaced") {
  nes::test::TempDir t;
  UnixListenOptions o;
  o.path = (t.path / "live.sock").string();
  auto first = listen_unix(o);
  REQUIRE(first);
  auto second = listen_unix(o);
  REQUIRE(!second);
  CHECK(second.error().message.find("in use") != std::string::npos);
  first->reset();  // the listener dies, its file stays: stale
  REQUIRE(fs::exists(o.path));
  auto third = listen_unix(o);
  CHECK(third);
}

TEST_CASE("listen_unix: a non-socket at the path is refused") {
  nes::test::TempDir t;
  UnixListenOptions o;
  o.path = (t.path / "file").string();
  { std::ofstream(o.path) << "precious"; }
  auto r = listen_unix(o);
  REQUIRE(!r);
  CHECK(r.error().message.find("not a socket") != std::string::npos);
  CHECK(fs::file_size(o.path) == 8);
}

TEST_CASE("vsock address building and peer CID extraction (no AF_VSOCK socket is created)") {
  auto a = vsock_address(kVsockCidAny, 7000);
  CHECK(a.svm_family == AF_VSOCK);
  CHECK(a.svm_cid == VMADDR_CID_ANY);
  CHECK(a.svm_port == 7000u);
  CHECK(kVsockCidHost == VMADDR_CID_HOST);
  auto peer = vsock_address(42, 1234);
  CHECK(vsock_peer_cid(&peer, sizeof peer) == std::optional<std::uint32_t>(42));
  CHECK(!vsock_peer_cid(&peer, sizeof peer - 1));
  CHECK(!vsock_peer_cid(nullptr, 0));
  sockaddr_un u{};
  u.sun_family = AF_UNIX;
  CHECK(!vsock_peer_cid(&u, sizeof u));
}

TEST_CASE("CID registry: reserved CIDs refused, duplicates refused, unknown CIDs unmapped") {
  CidRegistry r;
  for (std::uint32_t bad : {0u, 1u, 2u, 0xFFFFFFFFu}) CHECK(!r.add(bad, "vm"));
  CHECK(r.add(3, "a"));
  CHECK(r.add(3, "a"));  // idempotent
  auto dup = r.add(3, "b");
  REQUIRE(!dup);
  CHECK(dup.error().message.find("'a'") != std::string::npos);
  CHECK(r.add(4, "b"));
  CHECK(r.lookup(3) == std::optional<std::string>("a"));
  CHECK(!r.lookup(5));
  r.remove(3);
  CHECK(!r.lookup(3));
}

TEST_CASE("--listen specs") {
  auto u = parse_listen_spec("unix:/run/x.sock");
  REQUIRE(u);
  CHECK(u->kind == ListenSpec::Kind::unix_path);
  CHECK(u->path == "/run/x.sock");
  auto v = parse_listen_spec("vsock:7000");
  REQUIRE(v);
  CHECK(v->port == 7000u);
  auto f = parse_listen_spec("fd:3");
  REQUIRE(f);
  CHECK(f->fd == 3);
  CHECK(parse_listen_spec("tcp:1").error().message.find("--listen") == 0);
  CHECK(!parse_listen_spec("vsock:x"));
  CHECK(!parse_listen_spec("vsock:4294967295"));
  CHECK(!parse_listen_spec("unix:" + std::string(200, 'a')));
}
