// Unit tests of vm::Vmm (host/vm/vmm.hpp): a VMM booted, its exit seen on the io_context once its
// output is drained, killed, stopped; a restore refused by a scripted QMP peer, its process ended.
// Real processes (/bin/sh stands in for QEMU), no QEMU.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <filesystem>

#include "host/vm/vmm.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/vm/capture.hpp"

using namespace nes::vm;
using namespace std::chrono_literals;
using nes::test::Capture;

namespace {

/// A QMP peer on `path` that greets as QEMU `version` once `go` (a pipe) is readable (at most 10 s) and answers every request `{"return":{}}`
/// with its id; `seen` gets each request line. Serves one connection, until it closes.
struct FakeQmp {
  nes::host::Fd listener;
  std::thread th;
  std::mutex mu;
  std::string seen;
  FakeQmp(const std::filesystem::path& path, std::string version, int go) {
    listener.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener.get(), 1) == 0);
    th = std::thread([this, version, go] {
      nes::host::Fd c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!c) return;
      pollfd p{go, POLLIN, 0};
      (void)::poll(&p, 1, 10000);
      const std::string greet = R"({"QMP":{"version":{"qemu":{"major":)" + version.substr(0, 1) +
                                R"(,"minor":)" + version.substr(2, 1) + R"(,"micro":)" + version.substr(4, 1) +
                                R"(},"package":""},"capabilities":[]}})" + "\n";
      (void)!::write(c.get(), greet.data(), greet.size());
      std::string buf;
      char b[4096];
      for (ssize_t n; (n = ::read(c.get(), b, sizeof b)) > 0;) {
        buf.append(b, static_cast<std::size_t>(n));
        for (std::size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
          const std::string line = buf.substr(0, nl);
          {
            std::lock_guard l(mu);
            seen += line + "\n";
          }
          std::smatch m;
          if (std::regex_search(line, m, std::regex(R"("id":(\d+))"))) {
            const std::string reply = R"({"return":{},"id":)" + m[1].str() + "}\n";
            (void)!::write(c.get(), reply.data(), reply.size());
          }
        }
      }
    });
  }
  ~FakeQmp() {
    ::shutdown(listener.get(), SHUT_RDWR);
    if (th.joinable()) th.join();
  }
  std::string requests() {
    std::lock_guard l(mu);
    return seen;
  }
};

}  // namespace

TEST_CASE("boot: the exit is reported on the io_context once, after the console is drained") {
  boost::asio::io_context io;
  Capture out;
  VmmLaunch l;
  l.argv = {"/bin/sh", "-c", "echo first; echo last; exit 3"};
  l.console = out.sink();
  auto v = Vmm::boot(io, std::move(l));
  REQUIRE(v.ok());
  int calls = 0;
  std::optional<ProcessExit> got;
  std::string console_then;
  (*v)->watch_exit([&](std::optional<ProcessExit> e) {
    ++calls;
    got = e;
    console_then = out.get();
  });
  io.run_for(10s);
  CHECK(calls == 1);
  REQUIRE(got.has_value());
  CHECK(got->code == 3);
  CHECK(console_then == "first\nlast\n");  // every line before the exit is told
}

TEST_CASE("boot: a program that cannot start is \"cannot start QEMU: ...\", naming it") {
  boost::asio::io_context io;
  VmmLaunch l;
  l.argv = {"/nonexistent/qemu-system-x86_64"};
  auto v = Vmm::boot(io, std::move(l));
  REQUIRE_FALSE(v.ok());
  CHECK(v.error().message.starts_with("cannot start QEMU: "));
  CHECK(v.error().message.find("/nonexistent/qemu-system-x86_64") != std::string::npos);
}

TEST_CASE("kill: SIGKILL, reported by the exit watch; stop_watching: no report") {
  boost::asio::io_context io;
  VmmLaunch l;
  l.argv = {"/bin/sleep", "100"};
  auto v = Vmm::boot(io, std::move(l));
  REQUIRE(v.ok());
  std::optional<ProcessExit> got;
  (*v)->watch_exit([&](std::optional<ProcessExit> e) { got = e; });
  CHECK_FALSE((*v)->exited_within(0ms));
  (*v)->kill();
  io.run_for(10s);
  REQUIRE(got.has_value());
  CHECK(got->signal == SIGKILL);

  VmmLaunch l2;
  l2.argv = {"/bin/sleep", "100"};
  auto w = Vmm::boot(io, std::move(l2));
  REQUIRE(w.ok());
  bool told = false;
  (*w)->watch_exit([&](std::optional<ProcessExit>) { told = true; });
  (*w)->stop_watching();
  (*w)->stop();  // SIGTERM: sleep ends at once
  CHECK((*w)->exited_within(0ms));
  io.restart();
  io.run_for(200ms);
  CHECK_FALSE(told);
}

TEST_CASE("restore: another QEMU is refused as `refuse` words it; the process is ended") {
  nes::test::TempDir tmp;
  const auto sock = tmp.path / "qmp.sock";
  int go[2];
  REQUIRE(::pipe2(go, O_CLOEXEC) == 0);
  nes::host::Fd go_r(go[0]), go_w(go[1]);
  FakeQmp qmp(sock, "9.9.9", go_r.get());
  boost::asio::io_context io;
  Capture err;
  VmmLaunch l;
  // Its stderr written before the QMP peer greets (it waits for a byte on `go`): all of it precedes
  // the end.
  l.argv = {"/bin/sh", "-c", "echo 'qemu: warning: netdev net0 has no peer' >&2; echo kept >&2; echo >&3; exec sleep 100"};
  l.fds = {{go_w.get(), 3}};
  l.diagnostics = err.sink();
  nes::host::Fd state(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  VmmRestore r;
  r.qmp_socket = sock;
  r.qemu_version = "7.2.0";
  r.state = &state;
  r.refuse = [](nes::host::Error e) { return nes::host::Error{"--snapshot base: " + e.message}; };
  const auto t0 = std::chrono::steady_clock::now();
  auto v = Vmm::restore(io, std::move(l), r);
  REQUIRE_FALSE(v.ok());
  CHECK(v.error().message == "--snapshot base: made with QEMU 7.2.0; this QEMU is 9.9.9");
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // bounded: ended (SIGTERM), not waited for
  CHECK(qmp.requests().find("qmp_capabilities") != std::string::npos);
  // Its stderr was drained to EOF before restore() returned, the NIC's warning left out.
  CHECK(err.get().find("has no peer") == std::string::npos);
  CHECK(err.get().find("kept\n") != std::string::npos);
}
