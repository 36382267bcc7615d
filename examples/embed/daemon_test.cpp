// The daemon against scripted guests (the installed harness, <nes/host/lib/testing.hpp>): no VM, no
// init. Four VMs on their Firecracker-style sockets: exit 3, killed by SIGKILL, a hostile first
// line, a guest that never speaks. Each outcome must be printed once, with its exit status, and
// each good guest must get its boot descriptor and the `shutdown` ack.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <nes/host/lib/testing.hpp>

#include "daemon.hpp"

namespace t = nes::host::testing;

static int failed = 0;
#define CHECK(c) ((c) ? void() : (void)(++failed, std::fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c)))

int main() {
  char tmpl[] = "/tmp/nes-embed-XXXXXX";
  if (!::mkdtemp(tmpl)) return 2;
  const std::filesystem::path tmp = tmpl;
  {
    boost::asio::io_context io;
    std::vector<std::string> out;
    embed::Options o{tmp / "vms", 7000, tmp / "state", {"a", "b", "c", "d"}, {"/bin/true"},
                     std::chrono::milliseconds(500)};
    embed::Daemon d(io, o, [&](const std::string& l) { out.push_back(l); });
    auto s = d.start();
    CHECK(s.ok());
    CHECK(d.socket_path("a") == (tmp / "vms/a.vsock_7000").string());
    auto a = t::spawn_guest_at(io, d.socket_path("a"), t::exits_with(3));
    auto b = t::spawn_guest_at(io, d.socket_path("b"), t::killed_by(9));
    auto c = t::spawn_guest_at(io, d.socket_path("c"), t::hostile("{\"type\":\"ready\",\"protocol_version\":\n"));
    auto g = t::spawn_guest_at(io, d.socket_path("d"), t::silent());
    // Bounded: every guest's end is an event (an outcome, or the 500 ms ready deadline).
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (s.ok() && !(d.done() && a->done && b->done && c->done && g->done) &&
           std::chrono::steady_clock::now() < until)
      io.run_one_for(std::chrono::milliseconds(50));
    std::sort(out.begin(), out.end());
    CHECK(d.done());
    CHECK((out == std::vector<std::string>{"a exited 3", "b signalled 137", "c protocol_error 125",
                                           "d no_ready 125"}));
    CHECK(d.failures() == 4);
    for (auto* log : {a.get(), b.get()}) {
      CHECK(log->error.empty());
      CHECK(std::count_if(log->lines.begin(), log->lines.end(),
                          [](auto& l) { return t::host_type(l) == "shutdown"; }) >= 1);
    }
    CHECK(!a->lines.empty() && a->lines.front().find("\"NES_VM\":\"a\"") != std::string::npos);
    for (auto& l : out) std::printf("%s\n", l.c_str());
  }
  std::filesystem::remove_all(tmp);
  std::printf("%s\n", failed ? "FAIL" : "ok");
  return failed ? 1 : 0;
}
