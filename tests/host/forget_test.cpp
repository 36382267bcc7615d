// Host::forget_vm: a long-lived embedder drops finished VMs, so its memory does not grow with
// every VM it ever ran; a live session cannot be forgotten; the record stays answerable from disk.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "support.hpp"

using namespace nes;
using namespace nes::host;
using namespace nes::test;

TEST_CASE("forget_vm: refused while live, then the VM is gone from the Host, its record is not") {
  Harness h;
  auto path = h.add(h.config("f"));
  auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{exited_line(5)},
                          step::Expect{"shutdown"}, step::Close{}});
  REQUIRE(h.run_until([&] { return g->done; }));
  CHECK_FALSE(h.host->forget_vm("f"));  // still waiting for vm_exited
  REQUIRE(h.host->vm_exited("f"));
  REQUIRE(h.run_until([&] { return h.finished("f"); }));
  REQUIRE(h.host->forget_vm("f"));
  CHECK(h.host->session("f") == nullptr);
  CHECK_FALSE(h.host->forget_vm("f"));  // not registered any more
  CHECK(h.host->live_sessions() == 0);
  std::optional<WaitResult> r;
  h.host->async_wait("f", [&](WaitResult w) { r = std::move(w); });
  REQUIRE(h.run_until([&] { return r.has_value(); }));
  REQUIRE(*r);
  CHECK((*r)->exit_status == 5);
  // The id can be registered again (a new run), generation free to start over.
  CHECK(h.host->add_vm(h.config("f")));
}

TEST_CASE("forget_vm: many VMs run and forgotten leave nothing registered") {
  Harness h;
  for (int i = 0; i < 50; ++i) {
    std::string id = "m" + std::to_string(i);
    auto path = h.add(h.config(id));
    auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{exited_line(0)},
                            step::Expect{"shutdown"}, step::Close{}});
    REQUIRE(h.run_until([&] { return g->done; }));
    REQUIRE(h.host->vm_exited(id));
    REQUIRE(h.run_until([&] { return h.finished(id); }));
    REQUIRE(h.host->forget_vm(id));
  }
  for (int i = 0; i < 50; ++i) CHECK(h.host->session("m" + std::to_string(i)) == nullptr);
}

namespace {
/// A VM `id` whose guest took `boot` over a socketpair and hung up: the session waits for its
/// redial (SessionConfig::reconnect, an hour: only cancelling ends that timer).
void lose_stream_in_reconnect_window(Harness& h, const std::string& id, SessionConfig c) {
  c.reconnect = std::chrono::hours(1);
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  REQUIRE(h.host->add_vm(c));
  REQUIRE(h.host->attach_stream(id, Fd{sv[0]}));
  REQUIRE(h.host->vm_started(id));
  auto log = std::make_shared<GuestLog>();
  asio::local::stream_protocol::socket s(h.io);
  s.assign(asio::local::stream_protocol(), sv[1]);
  asio::co_spawn(h.io, run_script(std::move(s), {step::Send{ready_line()}, step::Expect{"boot"}, step::Close{}}, log),
                 asio::detached);
  REQUIRE(h.run_until([&] { return log->done && h.host->session(id)->awaiting_redial(); }));
  CHECK(log->error == "");
}

/// With the Harness's work guard gone, the loop returns as soon as nothing is pending: a timer
/// left armed (the hour-long reconnect window) keeps it running until the bound instead.
bool loop_runs_out_of_work(Harness& h) {
  h.work.reset();
  h.io.run_for(std::chrono::seconds(20));
  return h.io.stopped();
}
}  // namespace

TEST_CASE("a generation superseded inside its reconnect window leaves no timer armed") {
  Harness h;
  lose_stream_in_reconnect_window(h, "r", h.config("r"));
  REQUIRE(h.host->add_vm(h.config("r", OnExitPolicy::stop, 2)));  // gen 2: never started, no timer
  CHECK(loop_runs_out_of_work(h));
}

TEST_CASE("a session that gave up on its VM inside the reconnect window, forgotten, leaves no timer armed") {
  Harness h;
  auto c = h.config("g");
  c.stop_timeout = std::chrono::milliseconds(20);  // destroy, then give up: the VM never exits
  lose_stream_in_reconnect_window(h, "g", c);
  REQUIRE(h.host->shutdown("g"));
  REQUIRE(h.run_until([&] { return h.finished("g"); }));
  CHECK(h.destroyed["g"] == 1);
  CHECK(h.record("g")->outcome == proto::Outcome::stopped);
  REQUIRE(h.host->forget_vm("g"));
  CHECK(loop_runs_out_of_work(h));
}
