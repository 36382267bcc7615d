// nes::host::Host over real Unix sockets: the whole flow, each on_exit policy with its hooks,
// deadlines, wait() before/after/from disk, generations, refusal of a second live session, API;
// the library's threads leave process signals to the embedder.
// Everything waits for events (Harness::run_until), never for time.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "host/lib/log_writer.hpp"
#include "support.hpp"
#include "tests/support/host_record.hpp"

using namespace nes;
using namespace nes::host;
using namespace nes::test;
using namespace std::chrono_literals;

TEST_CASE("full flow: ready, boot, started, exited -> durable record -> shutdown ack -> finished") {
  Harness h;
  std::optional<WaitResult> early;
  auto path = h.add(h.config("a"));
  h.host->async_wait("a", [&](WaitResult r) { early = std::move(r); });  // before the outcome
  auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"},
                          step::Send{started_line(11) + exited_line(42)}, step::Expect{"shutdown"},
                          step::Close{}});
  REQUIRE(h.run_until([&] { return g->done; }));
  CHECK(g->error == "");
  REQUIRE(h.run_until([&] { return early.has_value(); }));
  REQUIRE(*early);
  CHECK((*early)->exit_status == 42);
  CHECK((*early)->outcome == proto::Outcome::exited);
  auto rec = h.record("a");
  REQUIRE(rec);
  CHECK(*rec == **early);
  CHECK(!h.finished("a"));  // stop policy: waits for the embedder's vm_exited
  REQUIRE(h.host->vm_exited("a"));
  REQUIRE(h.run_until([&] { return h.finished("a"); }));
  CHECK(!std::filesystem::exists(path));  // our socket is gone with the session
  std::optional<WaitResult> late;
  h.host->async_wait("a", [&](WaitResult r) { late = std::move(r); });  // after
  REQUIRE(h.run_until([&] { return late.has_value(); }));
  CHECK(**late == **early);
  for (auto k : {"connected", "ready", "boot_sent", "started", "outcome", "recorded", "shutdown_sent",
                 "vm_exited", "finished"})
    CHECK_MESSAGE(h.has_event("a", k), k);
}

namespace {
/// SigBlk (/proc/self/task/TID/status, a hex mask: bit N-1 is signal N) of every thread of this
/// process but the calling one.
std::map<pid_t, std::uint64_t> other_threads_blocked() {
  std::map<pid_t, std::uint64_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    const pid_t tid = static_cast<pid_t>(std::stol(e.path().filename().string()));
    if (tid == ::gettid()) continue;
    std::ifstream f(e.path() / "status");
    for (std::string l; std::getline(f, l);)
      if (l.starts_with("SigBlk:")) out[tid] = std::stoull(l.substr(7), nullptr, 16);
  }
  return out;
}
}  // namespace

TEST_CASE("the library's threads never take a process signal: they are left to the embedder") {
  // neshost run blocks SIGINT/SIGTERM in its own thread once the VM is finished and reads them
  // from a signalfd in its last writes: a worker of ours with them unblocked took the signal
  // instead (asio's handler swallowed it, or with none left the default action ended neshost
  // with its reader's bytes uncounted).
  sigset_t mine;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &mine);
  REQUIRE(!sigismember(&mine, SIGTERM));
  const auto before = other_threads_blocked();
  Harness h;  // the Host: its worker pool
  TempDir tmp;
  LogOptions o;
  o.path = tmp.path / "workload.log";
  auto log = AsyncLog::start(o, 1 << 20, {});  // the workload log's writer thread
  REQUIRE(log);
  auto now = other_threads_blocked();
  std::size_t started = 0;
  for (auto [tid, blocked] : now) {
    if (before.contains(tid)) continue;
    ++started;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGPIPE})
      CHECK_MESSAGE((blocked >> (sig - 1) & 1) == 1, "thread ", tid, " takes signal ", sig);
  }
  CHECK(started >= 2);  // the pool's and the log's
  ::pthread_sigmask(SIG_SETMASK, nullptr, &mine);
  CHECK(!sigismember(&mine, SIGTERM));  // the creator's own mask is as it was
  CHECK((*log)->close(std::chrono::seconds(30)));
}

TEST_CASE("wait() as a coroutine") {
  Harness h;
  auto path = h.add(h.config("co"));
  std::optional<WaitResult> got;
  asio::co_spawn(h.io, [&]() -> asio::awaitable<void> { got = co_await h.host->wait("co"); },
                 asio::detached);
  auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"},
                          step::Send{signalled_line(15)}, step::WaitClose{}});
  REQUIRE(h.run_until([&] { return got.has_value(); }));
  REQUIRE(*got);
  CHECK((*got)->exit_status == 143);
  CHECK((*got)->signal == std::optional<std::uint8_t>(15));
}

TEST_CASE("on_exit stop: no vm_exited -> destroy hook past the deadline") {
  Harness h;
  auto c = h.config("s");
  c.stop_timeout = 100ms;
  auto path = h.add(c);
  h.on_destroy = [&](const std::string& vm) { (void)h.host->vm_exited(vm); };  // the VMM is killed
  auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{exited_line(0)},
                          step::Expect{"shutdown"}, step::WaitClose{}});
  REQUIRE(h.run_until([&] { return h.finished("s"); }));
  CHECK(h.destroyed["s"] == 1);
  CHECK(h.removed["s"] == 0);
  CHECK(h.record("s")->exit_status == 0);
}

TEST_CASE("on_exit keep: booted with terminal=false, no ack, VM kept until shutdown()") {
  Harness h;
  auto path = h.add(h.config("k", OnExitPolicy::keep));
  auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{exited_line(7)},
                          step::Expect{"shutdown"}, step::Close{}});
  REQUIRE(h.run_until([&] { return h.durable("k"); }));
  REQUIRE(h.run_until([&] { return h.has_event("k", "kept"); }));
  auto boot = proto::decode_host(g->lines.at(0));
  CHECK_FALSE(std::get<proto::Boot>(std::get<proto::HostMessage>(boot)).on_exit.terminal);
  CHECK(g->lines.size() == 1);  // no shutdown yet
  CHECK(!g->done);
  REQUIRE(h.host->shutdown("k"));
  REQUIRE(h.run_until([&] { return g->done; }));
  CHECK(g->error == "");
  REQUIRE(h.host->vm_exited("k"));
  REQUIRE(h.run_until([&] { return h.finished("k"); }));
  CHECK(h.removed["k"] == 0);
  CHECK(h.destroyed["k"] == 0);
}

TEST_CASE("on_exit remove: remove hook after durable and vm_exited") {
  Harness h;
  auto path = h.add(h.config("r", OnExitPolicy::remove));
  auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{exited_line(5)},
                          step::Expect{"shutdown"}, step::Close{}});
  REQUIRE(h.run_until([&] { return g->done && h.has_event("r", "disconnected"); }));
  CHECK(h.removed["r"] == 0);
  REQUIRE(h.host->vm_exited("r"));
  REQUIRE(h.run_until([&] { return h.finished("r"); }));
  CHECK(h.removed["r"] == 1);
  CHECK(h.record("r")->exit_status == 5);
}

TEST_CASE("version mismatch over a socket") {
  Harness h;
  auto path = h.add(h.config("v"));
  auto g = h.guest(path, {step::Send{ready_line(1)}, step::WaitClose{}});
  REQUIRE(h.run_until([&] { return h.durable("v"); }));
  REQUIRE(h.run_until([&] { return g->done; }));
  CHECK(g->lines.empty());  // no descriptor to a guest of another version
  auto rec = h.record("v");
  CHECK(rec->outcome == proto::Outcome::version_mismatch);
  CHECK(rec->reason == "guest speaks protocol version 1; this host speaks version 2");
  CHECK(rec->exit_status == 125);
}

TEST_CASE("ready deadline from vm_started: no_ready, then the stop policy") {
  Harness h;
  auto c = h.config("n");
  c.ready_timeout = 150ms;
  c.stop_timeout = 100ms;
  auto path = h.add(c);
  REQUIRE(h.run_until([&] { return h.durable("n"); }));
  CHECK(h.record("n")->outcome == proto::Outcome::no_ready);
  CHECK(h.record("n")->reason == "no `ready` within 150 ms of vm_started");
  REQUIRE(h.run_until([&] { return h.destroyed["n"] == 1; }));
  // A guest that shows up late is refused: the generation has its outcome.
  auto g = h.guest(path, {step::Send{ready_line()}, step::WaitClose{}});
  REQUIRE(h.run_until([&] { return g->done; }));
  CHECK(g->lines.empty());
}

TEST_CASE("the deadline runs from vm_started, not from registration or accept") {
  Harness h;
  auto c = h.config("late");
  c.ready_timeout = 100ms;
  REQUIRE(h.host->add_vm(c));
  UnixListenOptions u;
  u.path = (h.tmp.path / "late.sock").string();
  REQUIRE(h.host->listen_unix("late", u));
  asio::steady_timer t(h.io, 300ms);  // longer than the deadline: nothing may happen meanwhile
  bool fired = false;
  t.async_wait([&](auto) { fired = true; });
  REQUIRE(h.run_until([&] { return fired; }));
  CHECK(!h.session("late").outcome());
  REQUIRE(h.host->vm_started("late"));
  REQUIRE(h.run_until([&] { return h.durable("late"); }));
  CHECK(h.record("late")->outcome == proto::Outcome::no_ready);
}

TEST_CASE("stale generation: an older generation never overwrites a newer record") {
  Harness h;
  Record newer = exited_record("g", 7, 1, "from generation 7");
  REQUIRE(write_record(h.state, newer));
  auto path = h.add(h.config("g", OnExitPolicy::stop, 5));
  std::optional<WaitResult> got;
  auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{exited_line(2)},
                          step::WaitClose{}});
  // Generation 7 is on disk, newer than ours: wait() answers at once with it.
  h.host->async_wait("g", [&](WaitResult r) { got = std::move(r); });
  REQUIRE(h.run_until([&] { return got.has_value(); }));
  REQUIRE(*got);
  CHECK((*got)->generation == 7);
  REQUIRE(h.run_until([&] { return h.has_event("g", "record_failed"); }));
  CHECK(h.record("g")->generation == 7);
  CHECK(h.record("g")->reason == "from generation 7");
}

TEST_CASE("a newer registration supersedes a live older generation; its late events are ignored") {
  Harness h;
  auto path1 = h.add(h.config("sup", OnExitPolicy::stop, 1));
  auto g1 = h.guest(path1, {step::Send{ready_line()}, step::Expect{"boot"}, step::WaitClose{}});
  REQUIRE(h.run_until([&] { return h.has_event("sup", "boot_sent"); }));
  std::optional<WaitResult> old_wait;
  h.host->async_wait("sup", [&](WaitResult r) { old_wait = std::move(r); });
  REQUIRE(h.host->add_vm(h.config("sup", OnExitPolicy::stop, 2)));
  CHECK(!h.host->add_vm(h.config("sup", OnExitPolicy::stop, 2)));  // same generation: refused
  REQUIRE(h.run_until([&] { return g1->done; }));
  CHECK(g1->host_closed);
  REQUIRE(h.run_until([&] { return old_wait.has_value(); }));
  CHECK(!*old_wait);
  UnixListenOptions u;
  u.path = (h.tmp.path / "sup2.sock").string();
  REQUIRE(h.host->listen_unix("sup", u));
  REQUIRE(h.host->vm_started("sup"));
  auto g2 = h.guest(u.path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{exited_line(9)},
                             step::Expect{"shutdown"}, step::Close{}});
  REQUIRE(h.run_until([&] { return h.durable("sup"); }));
  CHECK(h.record("sup")->generation == 2);
  CHECK(h.record("sup")->exit_status == 9);
}

TEST_CASE("wait(): from disk for an unregistered VM, error when nothing is recorded") {
  Harness h;
  Record r = signalled_record("old", 3, 9, "earlier process");
  REQUIRE(write_record(h.state, r));
  std::optional<WaitResult> a, b;
  h.host->async_wait("old", [&](WaitResult x) { a = std::move(x); });
  h.host->async_wait("never", [&](WaitResult x) { b = std::move(x); });
  REQUIRE(h.run_until([&] { return a && b; }));
  REQUIRE(*a);
  CHECK((*a)->exit_status == 137);
  REQUIRE(!*b);
  CHECK(b->error().message.find("no recorded outcome") != std::string::npos);
}

TEST_CASE("wait(): immediate when the current generation is already on disk (host restarted)") {
  Harness h;
  Record r = exited_record("again", 4, 0, "recorded before a host restart");
  REQUIRE(write_record(h.state, r));
  h.add(h.config("again", OnExitPolicy::stop, 4));
  std::optional<WaitResult> got;
  h.host->async_wait("again", [&](WaitResult x) { got = std::move(x); });
  REQUIRE(h.run_until([&] { return got.has_value(); }));
  REQUIRE(*got);
  CHECK((*got)->reason == "recorded before a host restart");
}

TEST_CASE("a second live connection for the same VM is refused; the first is unaffected") {
  Harness h;
  auto path = h.add(h.config("two"));
  auto g1 = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::WaitClose{}});
  REQUIRE(h.run_until([&] { return g1->lines.size() == 1; }));
  auto g2 = h.guest(path, {step::Send{ready_line()}, step::WaitClose{}});
  REQUIRE(h.run_until([&] { return g2->done; }));
  CHECK(g2->lines.empty());
  CHECK(g2->host_closed);
  CHECK(h.has_event("two", "refused"));
  CHECK(!h.session("two").outcome());
  CHECK(h.session("two").stream_open());
  CHECK(!g1->done);
  REQUIRE(h.host->shutdown("two"));
  REQUIRE(h.run_until([&] { return g1->lines.size() == 2; }));
  CHECK(g1->lines.back() == R"({"type":"stop"})");  // a running workload: stop, grace, shutdown
}

TEST_CASE("attach_stream: an already-connected fd (socketpair)") {
  Harness h;
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  REQUIRE(h.host->add_vm(h.config("fd")));
  REQUIRE(h.host->attach_stream("fd", Fd{sv[0]}));
  REQUIRE(h.host->vm_started("fd"));
  auto log = std::make_shared<GuestLog>();
  asio::local::stream_protocol::socket s(h.io);
  s.assign(asio::local::stream_protocol(), sv[1]);
  asio::co_spawn(h.io, run_script(std::move(s), {step::Send{ready_line()}, step::Expect{"boot"},
                                                 step::Send{exited_line(77)}, step::Expect{"shutdown"},
                                                 step::Close{}}, log),
                 asio::detached);
  REQUIRE(h.run_until([&] { return log->done && h.durable("fd"); }));
  CHECK(log->error == "");
  CHECK(h.record("fd")->exit_status == 77);
}

TEST_CASE("API stop and kill reach the guest; bad signal names the field") {
  Harness h;
  auto path = h.add(h.config("api"));
  auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Expect{"stop"},
                          step::Expect{"kill"}, step::Send{signalled_line(9)}, step::Expect{"shutdown"},
                          step::Close{}});
  REQUIRE(h.run_until([&] { return h.has_event("api", "boot_sent"); }));
  REQUIRE(h.host->stop("api"));
  auto bad = h.host->kill("api", 99);
  REQUIRE(!bad);
  CHECK(bad.error().message.find("signal") == 0);
  REQUIRE(h.host->kill("api", 9));
  REQUIRE(h.run_until([&] { return g->done; }));
  CHECK(g->error == "");
  CHECK(g->lines.at(2) == R"({"type":"kill","signal":9})");
  CHECK(h.record("api")->exit_status == 137);
  CHECK(!h.host->stop("nobody"));
}

TEST_CASE("durable writes run on the worker pool, never on the io_context thread") {
  std::thread::id io_thread = std::this_thread::get_id(), writer;
  Harness h([&](HostOptions& o) {
    o.write.at_step = [&](WriteStep) {
      writer = std::this_thread::get_id();
      return 0;
    };
  });
  auto path = h.add(h.config("pool"));
  auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{exited_line(1)},
                          step::WaitClose{}});
  REQUIRE(h.run_until([&] { return h.durable("pool"); }));
  CHECK(writer != std::thread::id{});
  CHECK(writer != io_thread);
}

TEST_CASE("a record that cannot be written surfaces the error in wait()") {
  Harness h([](HostOptions& o) {
    o.write.attempts = 2;
    o.write.at_step = [](WriteStep s) { return s == WriteStep::temp_fsynced ? EIO : 0; };
  });
  auto path = h.add(h.config("eio"));
  std::optional<WaitResult> got;
  h.host->async_wait("eio", [&](WaitResult r) { got = std::move(r); });
  auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{exited_line(1)},
                          step::WaitClose{}});
  REQUIRE(h.run_until([&] { return got.has_value(); }));
  REQUIRE(!*got);
  CHECK(got->error().message.find("after 2 attempts") != std::string::npos);
  CHECK(h.has_event("eio", "record_failed"));
}

namespace {
/// A VM whose guest end is a socketpair the test writes to directly.
struct PairGuest {
  int fd = -1;
  PairGuest(Harness& h, const std::string& vm) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    REQUIRE(h.host->add_vm(h.config(vm)));
    REQUIRE(h.host->attach_stream(vm, Fd{sv[0]}));
    REQUIRE(h.host->vm_started(vm));
    fd = sv[1];
  }
  ~PairGuest() { close(); }
  void send(const std::string& s) { REQUIRE(::write(fd, s.data(), s.size()) == (ssize_t)s.size()); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};
}  // namespace

TEST_CASE("the guest's last report before power-off is not lost to a racing vm_exited") {
  Harness h;
  PairGuest g(h, "race");
  g.send(ready_line());
  REQUIRE(h.run_until([&] { return h.has_event("race", "boot_sent"); }));
  REQUIRE(h.host->vm_exited("race"));  // the embedder saw the VMM exit before we read its report
  CHECK(!h.session("race").outcome());
  g.send(exited_line(9));
  g.close();
  REQUIRE(h.run_until([&] { return h.finished("race"); }));
  CHECK(h.record("race")->outcome == proto::Outcome::exited);
  CHECK(h.record("race")->exit_status == 9);
}

TEST_CASE("vm_exited with a stream that never ends: channel_lost after the stop deadline") {
  Harness h;
  PairGuest g(h, "hang");
  g.send(ready_line());
  REQUIRE(h.run_until([&] { return h.has_event("hang", "boot_sent"); }));
  REQUIRE(h.host->vm_exited("hang"));
  REQUIRE(h.run_until([&] { return h.finished("hang"); }));
  CHECK(h.record("hang")->outcome == proto::Outcome::channel_lost);
}

namespace {
bool acked(const GuestLog& g) {
  for (auto& l : g.lines)
    if (l.starts_with(R"({"type":"shutdown")")) return true;
  return false;
}
}  // namespace

TEST_CASE("outcomes final while a record is being written go as one group commit; a failed fsync "
          "in it fails every record of it and none is acked") {
  for (bool fail : {false, true}) {
    CAPTURE(fail);
    std::mutex mu;
    std::condition_variable cv;
    bool released = false;
    std::atomic<bool> plugged{false};
    std::atomic<int> state_fsyncs{0};
    Harness h([&](HostOptions& o) {
      o.write.attempts = 2;
      o.writer_threads = 1;  // one batch in flight: which records share a batch is then certain
      // The first record's write (VM "plug") holds the writer until the others are queued.
      o.write.at_step = [&](WriteStep s) {
        if (s == WriteStep::temp_written && !plugged.exchange(true)) {
          std::unique_lock<std::mutex> l(mu);
          if (!cv.wait_for(l, 30s, [&] { return released; })) return ETIMEDOUT;
        }
        return 0;
      };
      o.write.fsync = [&, state = o.state_dir](int fd) {
        struct stat a{}, b{};
        if (::fstat(fd, &a) == 0 && ::stat(state.c_str(), &b) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev)
          ++state_fsyncs;
        char link[4096] = {};
        ssize_t n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link, sizeof link - 1);
        if (fail && n > 0 && std::string_view(link).find("/g3/.outcome.json.") != std::string_view::npos)
          return EIO;
        return ::fsync(fd) == 0 ? 0 : errno;
      };
    });
    auto script = [](int code) {
      return std::vector<Step>{step::Send{ready_line()}, step::Expect{"boot"},
                               step::Send{exited_line(code)}, step::WaitClose{}};
    };
    auto plug = h.guest(h.add(h.config("plug")), script(0));
    REQUIRE(h.run_until([&] { return plugged.load(); }));
    std::vector<std::shared_ptr<GuestLog>> gs;
    for (int i = 1; i <= 4; ++i) gs.push_back(h.guest(h.add(h.config("g" + std::to_string(i))), script(i)));
    REQUIRE(h.run_until([&] {
      for (int i = 1; i <= 4; ++i)
        if (!h.has_event("g" + std::to_string(i), "outcome")) return false;
      return true;
    }));
    CHECK(!acked(*plug));  // its record is not durable yet
    {
      std::lock_guard<std::mutex> l(mu);
      released = true;
    }
    cv.notify_all();
    REQUIRE(h.run_until([&] {
      if (!acked(*plug)) return false;
      for (int i = 1; i <= 4; ++i) {
        auto vm = "g" + std::to_string(i);
        if (fail ? !h.has_event(vm, "record_failed") : !acked(*gs[i - 1])) return false;
      }
      return true;
    }));
    CHECK(h.durable("plug"));
    for (int i = 1; i <= 4; ++i) {
      auto vm = "g" + std::to_string(i);
      CAPTURE(vm);
      CHECK(h.durable(vm) == !fail);
      CHECK(acked(*gs[i - 1]) == !fail);
      CHECK(h.record(vm).has_value() == !fail);
    }
    if (fail) {
      // vm g3's temp failed; g1, g2, g4 were in the same round and fail with it.
      CHECK(h.count_events("g1", "record_failed") == 1);
      for (auto& e : h.events)
        if (e.kind == "record_failed") CHECK(e.detail.find("one group commit of 4 records") != std::string::npos);
      CHECK(state_fsyncs == 1);  // the plug's round only: the failed round never got that far
    } else {
      CHECK(state_fsyncs == 2);  // one round for the plug, one for g1..g4 together
    }
  }
}
