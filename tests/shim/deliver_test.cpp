// deliver_when_ready (host/shim/deliver.hpp): a control request that comes while the VM boots is
// sent again until the monitor takes it, bounded; against a fake monitor on a thread of the test
// (a Unix socket answering "error: the guest is not ready yet ..." N times, then "ok").
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>

#include "host/shim/deliver.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes;
namespace fs = std::filesystem;

namespace {

/// A monitor's control socket at `path` that answers its first `refusals` requests with the
/// monitor's "not ready" and the rest with `final` (one line each), on a thread of its own.
struct FakeMonitor {
  int fd = -1;
  std::atomic<int> requests{0};
  std::string last;
  std::thread t;
  FakeMonitor(const fs::path& path, int refusals, std::string final, int total) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 8) == 0);
    t = std::thread([this, refusals, final, total] {
      for (int i = 0; i < total; ++i) {
        int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) return;
        char buf[256];
        ssize_t n = ::read(c, buf, sizeof buf);
        if (n > 0) last.assign(buf, static_cast<std::size_t>(n));
        const int k = requests++;
        std::string reply = k < refusals ? "error: the guest is not ready yet: pause it once it runs\n" : final + "\n";
        (void)!::write(c, reply.data(), reply.size());
        ::close(c);
      }
    });
  }
  ~FakeMonitor() {
    ::shutdown(fd, SHUT_RDWR);
    t.join();
    ::close(fd);
  }
};

/// Runs `io` until `got` is set (bounded: 20 s).
void run_until(boost::asio::io_context& io, const std::optional<host::Status>& got) {
  for (int i = 0; i < 20000 && !got; ++i) {
    io.run_for(std::chrono::milliseconds(1));
    io.restart();
  }
  REQUIRE(got);
}

}  // namespace

TEST_CASE("not_ready_yet: no monitor yet and the guest's two not-ready answers; anything else is final") {
  CHECK(shim::not_ready_yet(host::Error{"no monitor at /x/control.sock: No such file or directory"}));
  CHECK(shim::not_ready_yet(host::Error{"error: the guest is not ready yet: pause it once it runs"}));
  CHECK(shim::not_ready_yet(host::Error{"error: kill: no booted session to signal"}));
  CHECK(!shim::not_ready_yet(host::Error{"error: the VM is stopping"}));
  CHECK(!shim::not_ready_yet(host::Error{"error: kill: the session is over"}));
}

TEST_CASE("a pause the guest cannot take yet is sent again until it can, then answered Ok, once") {
  test::TempDir tmp("shimdeliver");
  const fs::path sock = tmp.path / "control.sock";
  FakeMonitor m(sock, 3, "ok", 4);
  boost::asio::io_context io;
  std::optional<host::Status> got;
  int calls = 0;
  shim::deliver_when_ready(io, sock, cli::control::Request{cli::control::Pause{}}, std::chrono::seconds(10),
                           [] { return true; }, [&](host::Status s) { ++calls, got = std::move(s); });
  run_until(io, got);
  CHECK(*got);
  CHECK(calls == 1);
  CHECK(m.requests == 4);
  CHECK(m.last == "pause\n");
}

TEST_CASE("a refusal other than not-ready is the answer at once; a socket that never appears, the bound's error") {
  test::TempDir tmp("shimdeliver");
  {
    const fs::path sock = tmp.path / "control.sock";
    FakeMonitor m(sock, 0, "error: the VM is stopping", 1);
    boost::asio::io_context io;
    std::optional<host::Status> got;
    shim::deliver_when_ready(io, sock, cli::control::Request{cli::control::Pause{}}, std::chrono::seconds(10),
                             [] { return true; }, [&](host::Status s) { got = std::move(s); });
    run_until(io, got);
    REQUIRE(!*got);
    CHECK(got->error().message == "error: the VM is stopping");
    CHECK(m.requests == 1);
  }
  boost::asio::io_context io;
  std::optional<host::Status> got;
  shim::deliver_when_ready(io, tmp.path / "never.sock", cli::control::Request{cli::control::Resume{}},
                           std::chrono::milliseconds(100), [] { return true; }, [&](host::Status s) { got = std::move(s); });
  run_until(io, got);
  REQUIRE(!*got);
  CHECK(got->error().message.starts_with("no monitor at "));
  CHECK(got->error().message.find(" (still not ready after ") != std::string::npos);
  // The task ended meanwhile: given up, said so.
  std::optional<host::Status> gone;
  shim::deliver_when_ready(io, tmp.path / "never.sock", cli::control::Request{cli::control::Resume{}},
                           std::chrono::seconds(10), [] { return false; }, [&](host::Status s) { gone = std::move(s); });
  run_until(io, gone);
  REQUIRE(!*gone);
  CHECK(gone->error().message == "the task is no longer running");
}
