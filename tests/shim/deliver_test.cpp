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

/// One delivery and what it must come to.
struct Case {
  const char* what;
  bool socket;             // a FakeMonitor listens (else the socket never appears)
  int refusals;            // its "not ready" answers before `final`
  const char* final;       // its answer after them
  std::chrono::milliseconds bound;
  bool wanted;             // still_wanted()'s answer
  bool ok;                 // done's status
  const char* message;     // its error: equal, or (ending in '*') starting with the rest
  const char* contains;    // and containing this ("" none)
  int requests;            // the monitor saw this many
};

const Case kCases[] = {
    {"not ready three times, then ok: answered Ok, once", true, 3, "ok", std::chrono::seconds(10), true, true, "", "", 4},
    {"a refusal other than not-ready: the answer at once", true, 0, "error: the VM is stopping",
     std::chrono::seconds(10), true, false, "error: the VM is stopping", "", 1},
    {"a socket that never appears: the bound's error", false, 0, "", std::chrono::milliseconds(100), true, false,
     "no monitor at *", " (still not ready after ", 0},
    {"the task ended meanwhile: given up, said so", false, 0, "", std::chrono::seconds(10), false, false,
     "the task is no longer running", "", 0},
};

TEST_CASE("deliver_when_ready: each case's answer, once") {
  for (const Case& k : kCases) {
    CAPTURE(k.what);
    test::TempDir tmp("shimdeliver");
    const fs::path sock = tmp.path / "control.sock";
    std::optional<FakeMonitor> m;
    if (k.socket) m.emplace(sock, k.refusals, k.final, k.refusals + 1);
    boost::asio::io_context io;
    std::optional<host::Status> got;
    int calls = 0;
    const bool wanted = k.wanted;
    shim::deliver_when_ready(io, sock, cli::control::Request{cli::control::Pause{}}, k.bound,
                             [wanted] { return wanted; }, [&](host::Status s) { ++calls, got = std::move(s); });
    run_until(io, got);
    CHECK(calls == 1);
    CHECK(bool(*got) == k.ok);
    if (!k.ok) {
      const std::string msg = got->error().message, want = k.message;
      if (want.ends_with('*')) CHECK(msg.starts_with(want.substr(0, want.size() - 1)));
      else CHECK(msg == want);
      CHECK(msg.find(k.contains) != std::string::npos);
    }
    if (m) {
      CHECK(m->requests == k.requests);
      CHECK(m->last == "pause\n");
    }
  }
}

TEST_CASE("control_attempt: no socket is 'again'; any reply of the monitor is the answer (not-ready too)") {
  test::TempDir tmp("shimdeliver");
  const fs::path sock = tmp.path / "control.sock";
  auto none = shim::control_attempt(sock, cli::control::CloseStdin{});
  CHECK(none.again);
  REQUIRE(!none.status);
  CHECK(none.status.error().message.starts_with("no monitor at "));
  FakeMonitor m(sock, 1, "ok", 2);
  auto first = shim::control_attempt(sock, cli::control::CloseStdin{});
  CHECK(!first.again);
  REQUIRE(!first.status);
  CHECK(first.status.error().message == "error: the guest is not ready yet: pause it once it runs");
  auto second = shim::control_attempt(sock, cli::control::CloseStdin{});
  CHECK(!second.again);
  CHECK(second.status);
  CHECK(m.last == "close-stdin\n");
}

TEST_CASE("retry_when_ready: tries until its attempt answers; past the bound 'gave_up' with the last error") {
  boost::asio::io_context io;
  int tries = 0;
  std::optional<host::Status> got;
  shim::Delivered how{};
  shim::retry_when_ready(
      io, [&] { return ++tries < 3 ? shim::Attempt{true, host::Error{"not yet"}} : shim::Attempt{false, host::Ok{}}; },
      std::chrono::seconds(10), [] { return true; }, [&](host::Status s, shim::Delivered h) { got = std::move(s), how = h; });
  run_until(io, got);
  CHECK(*got);
  CHECK(how == shim::Delivered::answered);
  CHECK(tries == 3);
  got.reset();
  shim::retry_when_ready(
      io, [] { return shim::Attempt{true, host::Error{"no monitor at /x yet"}}; }, std::chrono::milliseconds(60),
      [] { return true; }, [&](host::Status s, shim::Delivered h) { got = std::move(s), how = h; });
  run_until(io, got);
  REQUIRE(!*got);
  CHECK(how == shim::Delivered::gave_up);
  CHECK(got->error().message.starts_with("no monitor at /x yet (still not ready after "));
}
