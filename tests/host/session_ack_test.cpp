// The host Session's hardening rules, event by event, without sockets or a clock:
//  - no `shutdown` (the guest's ack) before the outcome record is durable, never for a failed one;
//  - a running workload is ended by `stop`, grace, `shutdown`; a guest that then reports nothing
//    is recorded as `stopped` (143), not as a host failure;
//  - the wall limit runs from boot/first `started` and is never re-armed after that;
//  - every revision of v2 the reference shipped is accepted;
//  - guest-triggered event lines are bounded and escaped.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "host/lib/escape.hpp"
#include "host/lib/session.hpp"
#include "protocol/codec.hpp"
#include "support.hpp"

using namespace nes;
using namespace nes::host;

namespace {

struct Probe {
  Session s;
  proto::LineReader reader;       // the loop's framing of the guest stream
  std::vector<std::string> sent;  // message types sent to the guest, in order
  std::vector<Record> writes;
  std::vector<std::string> logs;  // "kind detail"
  std::vector<std::pair<TimerKind, std::chrono::milliseconds>> armed;
  int destroys = 0, finished = 0;
  WallTime t{std::chrono::seconds(1'700'000'000)};

  explicit Probe(SessionConfig c) : s(std::move(c)), reader(s.config().line_cap) {}
  static SessionConfig cfg(OnExitPolicy p = OnExitPolicy::stop) {
    SessionConfig c;
    c.vm = "vm1";
    c.generation = 1;
    c.descriptor = test::sample_boot();
    c.on_exit = p;
    c.ready_timeout = std::chrono::milliseconds(1500);
    c.stop_timeout = std::chrono::milliseconds(700);
    c.grace = std::chrono::milliseconds(300);
    return c;
  }
  void pump() {
    for (auto& a : s.take())
      std::visit(
          [&](auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, act::Send>)
              sent.emplace_back(proto::type_name(x.msg));
            else if constexpr (std::is_same_v<T, act::ArmTimer>) armed.emplace_back(x.kind, x.after);
            else if constexpr (std::is_same_v<T, act::WriteRecord>) writes.push_back(x.record);
            else if constexpr (std::is_same_v<T, act::CallDestroy>) ++destroys;
            else if constexpr (std::is_same_v<T, act::Log>) logs.push_back(x.kind + " " + x.detail);
            else if constexpr (std::is_same_v<T, act::Finished>) ++finished;
          },
          a);
  }
  void booted() {
    s.vm_started(t);
    REQUIRE(s.stream_opened(t));
    feed(test::ready_line());
    REQUIRE(sent == std::vector<std::string>{"boot"});
  }
  void feed(std::string_view b) { feed_lines(s, reader, b, t); pump(); }
  /// The guest stream ends (with what its reader held); the next stream gets a fresh reader.
  void eof() {
    s.stream_closed(reader.pending(), t);
    reader = proto::LineReader(s.config().line_cap);
  }
  void fire(TimerKind k) { s.timer_fired(k, t); pump(); }
  void durable() { REQUIRE(!writes.empty()); s.record_durable(writes.back()); pump(); }
  long count(std::string_view type) const { return std::count(sent.begin(), sent.end(), type); }
  long armed_count(TimerKind k) const {
    return std::count_if(armed.begin(), armed.end(), [&](auto& a) { return a.first == k; });
  }
  std::size_t logged(std::string_view kind) const {
    return std::count_if(logs.begin(), logs.end(), [&](auto& l) { return l.starts_with(kind); });
  }
};

}  // namespace

TEST_CASE("shutdown() while the record is being written sends nothing until it is durable") {
  // The reported sequence: vm_started, stream opened, ready, workload_exited{3}, shutdown().
  Probe p(Probe::cfg());
  p.booted();
  p.feed(test::exited_line(3));
  REQUIRE(p.writes.size() == 1);
  REQUIRE(p.s.shutdown(p.t));
  p.pump();
  CHECK(p.count("shutdown") == 0);  // the guest would take it as the ack and power off
  CHECK(p.count("stop") == 0);      // the workload already ended
  p.durable();
  CHECK(p.count("shutdown") == 1);
  CHECK(p.logged("shutdown_sent ack of the recorded outcome") == 1);
}

TEST_CASE("a record that failed is never acknowledged; the stop deadline destroys the VM") {
  Probe p(Probe::cfg());
  p.booted();
  p.feed(test::exited_line(3));
  p.s.record_failed("fsync: EIO");
  p.pump();
  REQUIRE(p.s.shutdown(p.t));
  p.pump();
  p.feed(test::ready_line());  // a restarted guest: still nothing that reads as an ack
  CHECK(p.count("shutdown") == 0);
  CHECK(p.logged("record_failed fsync: EIO") == 1);
  REQUIRE(p.armed_count(TimerKind::stop) == 1);
  p.fire(TimerKind::stop);
  CHECK(p.destroys == 1);
  p.s.vm_exited(p.t);
  p.pump();
  CHECK(p.s.finished());
  CHECK(p.count("shutdown") == 0);
}

TEST_CASE("a restarted guest after an outcome that is not durable yet gets no shutdown until it is") {
  Probe p(Probe::cfg(OnExitPolicy::keep));
  p.booted();
  p.feed(test::exited_line(0));
  REQUIRE(p.s.shutdown(p.t));
  p.feed(test::ready_line());  // second ready: the guest restarted
  CHECK(p.count("shutdown") == 0);
  p.durable();
  CHECK(p.count("shutdown") == 1);
}

TEST_CASE("shutdown() of a running workload: stop, grace, shutdown; the report is acked once durable") {
  Probe p(Probe::cfg());
  p.booted();
  p.feed(test::started_line(9));
  REQUIRE(p.s.shutdown(p.t));
  p.pump();
  CHECK(p.sent == std::vector<std::string>{"boot", "stop"});  // no shutdown the guest could take for an ack
  REQUIRE(p.armed_count(TimerKind::grace) == 1);
  p.fire(TimerKind::grace);  // the workload ignored SIGTERM
  CHECK(p.sent == std::vector<std::string>{"boot", "stop", "shutdown"});
  p.feed(test::signalled_line(9));  // the guest escalated
  CHECK(p.count("shutdown") == 1);  // not before durable
  p.durable();
  CHECK(p.count("shutdown") == 2);
  CHECK(p.s.outcome()->outcome == proto::Outcome::signalled);
}

TEST_CASE("shutdown() of a running workload that exits within the grace: one shutdown, the ack") {
  Probe p(Probe::cfg());
  p.booted();
  REQUIRE(p.s.shutdown(p.t));
  p.feed(test::signalled_line(15));
  p.fire(TimerKind::grace);  // late: the guest already reported
  CHECK(p.count("shutdown") == 0);
  p.durable();
  CHECK(p.sent == std::vector<std::string>{"boot", "stop", "shutdown"});
}

TEST_CASE("the host ended the session and the guest reported nothing: outcome stopped, 143") {
  for (int how = 0; how < 2; ++how) {
    CAPTURE(how);
    Probe p(Probe::cfg());
    p.booted();
    REQUIRE(p.s.shutdown(p.t));
    p.pump();
    p.fire(TimerKind::grace);
    if (how == 0) p.eof();  // the reference powers off without a report
    p.s.vm_exited(p.t);
    if (how == 1) p.eof();
    p.pump();
    REQUIRE(p.s.outcome());
    CHECK(p.s.outcome()->outcome == proto::Outcome::stopped);
    CHECK(p.s.outcome()->exit_status == 143);
    CHECK(p.s.outcome()->reason.find("the host ended the session") != std::string::npos);
  }
  // Without a host request the same end is still the host-side failure it was.
  Probe q(Probe::cfg());
  q.booted();
  q.eof();
  q.pump();
  CHECK(q.s.outcome()->outcome == proto::Outcome::channel_lost);
}

TEST_CASE("wall limit from started: armed at boot (no started ever), never re-armed by started lines") {
  auto c = Probe::cfg();
  c.wall_timeout = std::chrono::milliseconds(2000);
  c.wall_from_started = true;
  Probe p(c);
  p.booted();
  CHECK(p.armed_count(TimerKind::wall) == 1);  // at boot: an earlier v2 guest never sends started
  for (int i = 0; i < 10; ++i) p.feed(test::started_line(7));
  CHECK(p.armed_count(TimerKind::wall) == 2);  // the first started moves it once
  p.fire(TimerKind::wall);
  REQUIRE(p.s.outcome());
  CHECK(p.s.outcome()->outcome == proto::Outcome::timeout);
  // `--timeout`: stop, grace, shutdown (the help's promise), the shutdown only once durable.
  CHECK(p.sent == std::vector<std::string>{"boot", "stop"});
  p.fire(TimerKind::grace);
  CHECK(p.count("shutdown") == 0);
  p.durable();
  CHECK(p.sent == std::vector<std::string>{"boot", "stop", "shutdown"});
  p.feed(test::signalled_line(9));  // the guest's report after the host's outcome: acked
  CHECK(p.count("shutdown") == 2);
  CHECK(p.s.outcome()->outcome == proto::Outcome::timeout);
}

TEST_CASE("wall limit also ends a kept VM's workload") {
  auto c = Probe::cfg(OnExitPolicy::keep);
  c.wall_timeout = std::chrono::milliseconds(2000);
  Probe p(c);
  p.booted();
  p.fire(TimerKind::wall);
  p.durable();
  CHECK(p.sent == std::vector<std::string>{"boot", "stop"});
}

TEST_CASE("every v2 revision: fieldless started, mount_failed/start_failed with only reason") {
  {
    Probe p(Probe::cfg());
    p.booted();
    p.feed("{\"type\":\"mounted\"}\n{\"type\":\"started\"}\n");
    CHECK(!p.s.outcome());
    CHECK(p.logged("started") == 1);
    p.feed("{\"type\":\"start_failed\",\"reason\":\"exec: boom\"}\n");
    REQUIRE(p.s.outcome());
    CHECK(p.s.outcome()->outcome == proto::Outcome::start_failed);
    CHECK(p.s.outcome()->exit_status == 126);  // class other
    CHECK(p.s.outcome()->reason == "workload failed to start (other): exec: boom");
  }
  {
    Probe p(Probe::cfg());
    p.booted();
    p.feed("{\"type\":\"mount_failed\",\"reason\":\"no such tag\"}\n");
    REQUIRE(p.s.outcome());
    CHECK(p.s.outcome()->outcome == proto::Outcome::mount_failed);
    CHECK(p.s.outcome()->exit_status == 125);
    CHECK(p.s.outcome()->reason == "share (unnamed) failed to mount: no such tag");
  }
  // A present field must still be well-formed.
  auto bad = proto::decode_guest(R"({"type":"started","pid":0})");
  CHECK(std::holds_alternative<proto::DecodeError>(bad));
  auto d = proto::decode_guest(R"({"type":"mount_failed","reason":"r"})");
  REQUIRE(std::holds_alternative<proto::GuestMessage>(d));
  auto& mf = std::get<proto::MountFailed>(std::get<proto::GuestMessage>(d));
  CHECK(!mf.tag);
  CHECK(!mf.err);
  CHECK(proto::encode(proto::GuestMessage{mf}) == R"({"type":"mount_failed","reason":"r"})");
}

TEST_CASE("guest-triggered event lines are bounded whatever the guest repeats") {
  Probe p(Probe::cfg());
  p.booted();
  std::string err_line = "{\"type\":\"protocol_error\",\"reason\":\"" + std::string(900, 'x') + "\"}\n";
  std::string chunk;
  for (int i = 0; i < 2000; ++i) chunk += err_line;
  p.feed(chunk);
  chunk.clear();
  for (int i = 0; i < 20000; ++i) chunk += test::started_line(7);
  p.feed(chunk);
  p.feed("{\"type\":\"mounted\"}\n{\"type\":\"mounted\"}\n{\"type\":\"hello\"}\n");
  std::size_t bytes = 0;
  for (auto& l : p.logs) bytes += l.size();
  CHECK(p.logged("guest_protocol_error") == 11);  // 10, then "further ones are not logged"
  CHECK(p.logged("started") == 11);
  CHECK(bytes < 16 * 1024);  // before: 1.85 MB and 360 KB of event lines
}

TEST_CASE("guest text reaches event lines escaped: no ESC/BEL, no forged line") {
  Probe p(Probe::cfg());
  p.booted();
  p.feed(R"({"type":"\u001b[2J\u001b]0;pwned\u0007\nvm0 outcome exited exit_status=0 reason=FAKE"})" "\n");
  p.feed(R"({"type":"protocol_error","reason":"a\u001bb\nc\u009bd"})" "\n");
  p.feed(R"({"type":"mount_failed","tag":"t\u0007","reason":"r\r\nvm0 outcome exited"})" "\n");
  REQUIRE(p.logs.size() > 3);
  for (auto& l : p.logs) {
    CAPTURE(l);
    for (unsigned char c : l) CHECK((c >= 0x20 && c != 0x7f));
    CHECK(l.find("\xc2\x9b") == std::string::npos);
  }
  CHECK(p.logged("skipped unknown type '\\x1b[2J\\x1b]0;pwned\\x07\\nvm0 outcome") == 1);
  CHECK(p.logged("guest_protocol_error a\\x1bb\\nc\\u009bd") == 1);
}

TEST_CASE("escape_text: printable UTF-8 kept, controls and invalid bytes escaped") {
  CHECK(escape_text("plain text: äöü ✓ 😀") == "plain text: äöü ✓ 😀");
  CHECK(escape_text("a\\b") == "a\\\\b");
  CHECK(escape_text(std::string("\0\x1b\x7f", 3)) == "\\x00\\x1b\\x7f");
  CHECK(escape_text("\xc2\x85\xc2\xa0") == "\\u0085\xc2\xa0");  // NEL escaped, NBSP kept
  CHECK(escape_text("\xff\xc3") == "\\xff\\xc3");
  CHECK(escape_text("\xed\xa0\x80") == "\\xed\\xa0\\x80");  // a surrogate is not UTF-8
}
