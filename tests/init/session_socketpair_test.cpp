// The session once over a real byte stream: a socketpair, the real codec and line framing, a real
// workload spawned and reaped; the host side is a script in the same thread. Only the
// machine-wide acts (kill(-1), reboot) are not performed: the test is not PID 1.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <deque>

#include "nesinit/reaper.hpp"
#include "nesinit/session.hpp"
#include "nesinit/workload.hpp"
#include "protocol/protocol.hpp"

using namespace nes::init;
namespace proto = nes::proto;

namespace {

struct Pair {
  int guest = -1, host = -1;
  Pair() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    guest = sv[0];
    host = sv[1];
  }
  ~Pair() {
    if (guest >= 0) ::close(guest);
    if (host >= 0) ::close(host);
  }
};

void write_all(int fd, const std::string& s) {
  REQUIRE(::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size()));
}

/// Read lines from `fd` (bounded: 10 s per read) until one is complete.
std::optional<proto::Line> read_line(int fd, proto::LineReader& r) {
  for (;;) {
    if (auto l = r.next()) return l;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) return std::nullopt;
    char buf[4096];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return std::nullopt;
    r.feed(std::string_view(buf, static_cast<std::size_t>(n)));
  }
}

/// A minimal driver of the session's actions: sends go to the socket, Mount succeeds (no shares),
/// Spawn really starts the workload, signals are recorded (the test is not PID 1), timers are
/// recorded and never fire by themselves.
struct Driver {
  Session s;
  int fd;
  Reaper reaper;
  std::deque<Event> pending;
  std::vector<int> group_signals, all_signals;
  std::optional<proto::Halt> powered_off;
  pid_t pgid = 0;

  Driver(SessionOptions o, int f) : s(o), fd(f) {}

  void feed(Event e) {
    pending.push_back(std::move(e));
    while (!pending.empty()) {
      Event x = std::move(pending.front());
      pending.pop_front();
      for (Action& a : s.handle(x)) perform(a);
    }
  }
  void perform(Action& a) {
    if (auto* send = std::get_if<act::Send>(&a)) write_all(fd, proto::encode_line(send->msg));
    else if (std::get_if<act::Mount>(&a)) pending.push_back(ev::MountsDone{});
    else if (std::get_if<act::Spawn>(&a)) {
      auto r = spawn(s.boot()->exec, s.boot()->geometry, Stdio::inherit, reaper);
      if (r) pending.push_back(ev::Started{pgid = *r});
      else pending.push_back(ev::StartFailed{r.error()});
    } else if (auto* g = std::get_if<act::SignalGroup>(&a)) {
      group_signals.push_back(g->signo);
      ::kill(-pgid, g->signo);
    } else if (auto* all = std::get_if<act::SignalAll>(&a)) {
      all_signals.push_back(all->signo);
    } else if (std::get_if<act::Flush>(&a)) {
      pending.push_back(ev::Flushing{});  // nothing queued: the lines were written at once
    } else if (auto* p = std::get_if<act::PowerOff>(&a)) {
      powered_off = p->halt;
    }
  }
  /// Read one host line from the socket into the session.
  void pump_line(proto::LineReader& r) {
    auto l = read_line(fd, r);
    REQUIRE(l);
    feed(ev::Line{*l});
  }
  /// Wait for SIGCHLD (blocked) and reap, as PID 1's loop does.
  void wait_and_reap() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    for (int i = 0; i < 100; ++i) {
      Reaped x = reaper.reap();
      if (x.workload) feed(ev::Exited{*x.workload});
      if (x.no_children) {
        if (s.waiting_for_children()) feed(ev::NoChildren{});
        return;
      }
      timespec ts{10, 0};
      REQUIRE(::sigtimedwait(&set, nullptr, &ts) == SIGCHLD);
    }
  }
};

struct BlockChld {
  sigset_t old;
  BlockChld() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &s, &old);
  }
  ~BlockChld() {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
  }
};

proto::GuestMessage host_expect(int fd, proto::LineReader& r) {
  auto l = read_line(fd, r);
  REQUIRE(l);
  auto d = proto::decode_guest(l->text);
  REQUIRE(std::holds_alternative<proto::GuestMessage>(d));
  return std::get<proto::GuestMessage>(d);
}

}  // namespace

TEST_CASE("over a socketpair: ready, boot, mounted, started, workload_exited, shutdown ack") {
  BlockChld bc;
  Pair p;
  Driver d(SessionOptions{1000, 3000, 5000, proto::Halt::poweroff}, p.guest);
  proto::LineReader guest_reader, host_reader;

  d.feed(ev::ChannelUp{});
  auto m = host_expect(p.host, host_reader);
  CHECK(std::get<proto::Ready>(m).protocol_version == 2);

  proto::Boot b;
  b.exec.argv = {"/bin/sh", "-c", "exit 4"};
  b.on_exit.terminal = true;
  // A malformed line first: answered, not acted on.
  write_all(p.host, "{\"type\":\"boot\"}\n");
  write_all(p.host, proto::encode_line(proto::HostMessage{b}));
  d.pump_line(guest_reader);
  CHECK(std::holds_alternative<proto::ProtocolError>(host_expect(p.host, host_reader)));
  d.pump_line(guest_reader);
  CHECK(std::holds_alternative<proto::Mounted>(host_expect(p.host, host_reader)));
  auto started = std::get<proto::Started>(host_expect(p.host, host_reader));
  CHECK(started.pid > 1);

  d.wait_and_reap();
  auto exited = std::get<proto::WorkloadExited>(host_expect(p.host, host_reader));
  CHECK(exited == proto::WorkloadExited::code(4));
  CHECK(d.all_signals == std::vector<int>{SIGTERM});
  CHECK(d.s.stage() == Stage::await_ack);
  CHECK(!d.powered_off);

  write_all(p.host, proto::encode_line(proto::HostMessage{proto::Shutdown{}}));
  d.pump_line(guest_reader);
  CHECK(d.powered_off == proto::Halt::poweroff);
  CHECK(d.group_signals.empty());
}

TEST_CASE("over a socketpair: stop reaches a running workload once; EOF ends the session") {
  BlockChld bc;
  Pair p;
  Driver d(SessionOptions{60000, 3000, 5000, proto::Halt::reboot}, p.guest);
  proto::LineReader guest_reader, host_reader;
  d.feed(ev::ChannelUp{});
  host_expect(p.host, host_reader);
  proto::Boot b;
  b.exec.argv = {"/bin/sleep", "1000"};
  write_all(p.host, proto::encode_line(proto::HostMessage{b}));
  d.pump_line(guest_reader);
  host_expect(p.host, host_reader);  // mounted
  host_expect(p.host, host_reader);  // started
  write_all(p.host, proto::encode_line(proto::HostMessage{proto::Stop{}}));
  write_all(p.host, proto::encode_line(proto::HostMessage{proto::Stop{}}));
  d.pump_line(guest_reader);
  d.pump_line(guest_reader);
  CHECK(d.group_signals == std::vector<int>{SIGTERM});
  d.wait_and_reap();
  CHECK(std::get<proto::WorkloadExited>(host_expect(p.host, host_reader)) ==
        proto::WorkloadExited::killed(SIGTERM));
  ::close(p.host);
  p.host = -1;
  char c;
  CHECK(::read(p.guest, &c, 1) == 0);
  d.feed(ev::Eof{});
  CHECK(d.powered_off == proto::Halt::reboot);
}
