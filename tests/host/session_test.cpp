// Sans-I/O tests of host/lib/session.hpp: every guest message path, each on_exit policy, deadlines,
// version mismatch, policy overriding `terminal`, finality, bounded memory. No sockets, no clock.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <map>
#include <doctest/doctest.h>

#include <fmt/format.h>

#include "host/lib/session.hpp"
#include "protocol/codec.hpp"
#include "support.hpp"

using namespace nes;
using namespace nes::host;
using nes::test::sample_boot;

namespace {

/// A Session plus everything it asked for, split by kind.
struct Probe {
  Session s;
  proto::LineReader reader;          // the loop's framing of the guest stream
  std::vector<proto::HostMessage> sent;  // messages sent to the guest
  std::vector<Record> writes;
  std::vector<std::string> logs;     // "kind detail"
  std::vector<TimerKind> armed, cancelled;
  int closes = 0, destroys = 0, removes = 0, finished = 0;
  std::vector<proto::Processes> lists;  // act::Processes, in order
  std::vector<std::string> cuts;        // act::CutOutput reasons, in order
  std::vector<std::pair<std::uint16_t, std::chrono::milliseconds>> exec_arms;  // act::ArmExecTimer
  std::vector<std::uint16_t> exec_cancels;                                    // act::CancelExecTimer
  std::vector<std::pair<std::uint16_t, ExecEnd>> exec_ends;                   // act::ExecEnded
  std::vector<std::string> order;       // "report"/"end" per exec action, in order
  std::vector<std::chrono::milliseconds> stop_arms;  // each ArmTimer{stop}'s duration
  std::vector<std::chrono::milliseconds> wall_arms;  // each ArmTimer{wall}'s duration
  WallTime t{std::chrono::seconds(1'700'000'000)};

  explicit Probe(OnExitPolicy p = OnExitPolicy::stop, std::size_t cap = proto::kDefaultLineCap)
      : s(cfg(p, cap)), reader(cap) {}
  explicit Probe(const SessionConfig& c) : s(c), reader(c.line_cap) {}
  static SessionConfig cfg(OnExitPolicy p, std::size_t cap) {
    SessionConfig c;
    c.vm = "vm1";
    c.generation = 4;
    c.descriptor = sample_boot();
    c.on_exit = p;
    c.line_cap = cap;
    c.ready_timeout = std::chrono::milliseconds(1500);
    c.stop_timeout = std::chrono::milliseconds(700);
    return c;
  }
  void pump() {
    for (auto& a : s.take()) {
      std::visit(
          [&](auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, act::Send>) sent.push_back(x.msg);
            else if constexpr (std::is_same_v<T, act::CloseStream>) ++closes;
            else if constexpr (std::is_same_v<T, act::ArmTimer>) {
              armed.push_back(x.kind);
              if (x.kind == TimerKind::stop) stop_arms.push_back(x.after);
              if (x.kind == TimerKind::wall) wall_arms.push_back(x.after);
            }
            else if constexpr (std::is_same_v<T, act::CancelTimer>) cancelled.push_back(x.kind);
            else if constexpr (std::is_same_v<T, act::WriteRecord>) writes.push_back(x.record);
            else if constexpr (std::is_same_v<T, act::CallDestroy>) ++destroys;
            else if constexpr (std::is_same_v<T, act::CallRemove>) ++removes;
            else if constexpr (std::is_same_v<T, act::Log>) logs.push_back(x.kind + " " + x.detail);
            else if constexpr (std::is_same_v<T, act::Finished>) ++finished;
            else if constexpr (std::is_same_v<T, act::Processes>) lists.push_back(x.list);
            else if constexpr (std::is_same_v<T, act::CutOutput>) cuts.push_back(x.reason);
            else if constexpr (std::is_same_v<T, act::ArmExecTimer>) exec_arms.emplace_back(x.proc, x.after);
            else if constexpr (std::is_same_v<T, act::CancelExecTimer>) exec_cancels.push_back(x.proc);
            else if constexpr (std::is_same_v<T, act::ExecReport>) order.push_back("report");
            else if constexpr (std::is_same_v<T, act::ExecEnded>) {
              exec_ends.emplace_back(x.proc, x.end);
              order.push_back("end");
            }
          },
          a);
    }
  }
  void start() { s.vm_started(t); CHECK(s.stream_opened(t)); pump(); }
  void feed(std::string_view b) { feed_lines(s, reader, b, t); pump(); }
  /// The guest stream ends (with what its reader held); the next stream gets a fresh reader.
  void eof() {
    s.stream_closed(reader.pending(), t);
    reader = proto::LineReader(s.config().line_cap);
  }
  void booted() { start(); feed(test::ready_line()); }
  std::string last_type() const { return sent.empty() ? "" : std::string(proto::type_name(sent.back())); }
  bool logged(std::string_view kind) const {
    for (auto& l : logs) if (l.starts_with(kind)) return true;
    return false;
  }
  /// Complete the durable write as the worker pool would.
  void durable() { REQUIRE(!writes.empty()); s.record_durable(writes.back()); pump(); }
  const Record& outcome() const { REQUIRE(s.outcome()); return *s.outcome(); }
};

proto::Boot boot_of(const proto::HostMessage& m) {
  REQUIRE(std::holds_alternative<proto::Boot>(m));
  return std::get<proto::Boot>(m);
}

}  // namespace

TEST_CASE("ready -> boot descriptor, then exited -> record -> shutdown ack -> stop policy") {
  Probe p;
  p.booted();
  REQUIRE(p.sent.size() == 1);
  auto boot = boot_of(p.sent[0]);
  CHECK(boot.exec.argv == sample_boot().exec.argv);
  CHECK(boot.on_exit.terminal);
  CHECK(std::count(p.cancelled.begin(), p.cancelled.end(), TimerKind::ready) == 1);
  p.feed("{\"type\":\"mounted\"}\n");
  p.feed(test::started_line(42));
  CHECK(p.logged("started pid=42"));
  p.feed(test::exited_line(3));
  REQUIRE(p.writes.size() == 1);
  auto& r = p.writes[0];
  CHECK(r.vm == "vm1");
  CHECK(r.generation == 4);
  CHECK(r.outcome == proto::Outcome::exited);
  CHECK(r.exit_code == std::optional<std::uint8_t>(3));
  CHECK(!r.signal);
  CHECK(r.exit_status == 3);
  CHECK(p.sent.size() == 1);  // no ack before durable
  p.durable();
  CHECK(p.last_type() == "shutdown");
  CHECK(p.armed.back() == TimerKind::stop);
  CHECK(!p.s.finished());
  p.eof();  // guest powered off
  p.s.vm_exited(p.t);
  p.pump();
  CHECK(p.s.finished());
  CHECK(p.removes == 0);
  CHECK(p.destroys == 0);
}

TEST_CASE("signalled, start_failed, mount_failed map through protocol's status table") {
  {
    Probe p;
    p.booted();
    p.feed(test::signalled_line(9));
    CHECK(p.outcome().outcome == proto::Outcome::signalled);
    CHECK(p.outcome().signal == std::optional<std::uint8_t>(9));
    CHECK(!p.outcome().exit_code);
    CHECK(p.outcome().exit_status == 137);
  }
  {
    Probe p;
    p.booted();
    p.feed(R"({"type":"start_failed","reason":"no such file","errno":2,"class":"not_found"})" "\n");
    CHECK(p.outcome().outcome == proto::Outcome::start_failed);
    CHECK(p.outcome().exit_status == 127);
    CHECK(p.outcome().reason.find("not_found") != std::string::npos);
    CHECK(p.outcome().reason.find("no such file") != std::string::npos);
  }
  {
    Probe p;
    p.booted();
    p.feed(R"({"type":"start_failed","reason":"perm","errno":13,"class":"not_executable"})" "\n");
    CHECK(p.outcome().exit_status == 126);
  }
  {
    Probe p;
    p.booted();
    p.feed(R"({"type":"mount_failed","tag":"work","reason":"bad","errno":19})" "\n");
    CHECK(p.outcome().outcome == proto::Outcome::mount_failed);
    CHECK(p.outcome().exit_status == 125);
    CHECK(p.outcome().reason.find("'work'") != std::string::npos);
  }
}

TEST_CASE("guest protocol_error and unknown types are logged, the session goes on") {
  Probe p;
  p.booted();
  p.feed(R"({"type":"protocol_error","reason":"boot.exec: bad"})" "\n");
  p.feed(R"({"type":"future_thing","x":1})" "\n");
  CHECK(p.logged("guest_protocol_error"));
  CHECK(p.logged("skipped unknown type 'future_thing'"));
  CHECK(!p.s.outcome());
  p.feed(test::exited_line(0));
  CHECK(p.outcome().outcome == proto::Outcome::exited);
}

TEST_CASE("the first final event wins; later ones and garbage are only logged") {
  Probe p;
  p.booted();
  p.feed(test::exited_line(5));
  p.feed(test::signalled_line(15));
  p.feed("garbage\n");
  p.feed(std::string(3 << 20, 'x') + "\n");
  CHECK(p.writes.size() == 1);
  CHECK(p.outcome().exit_code == std::optional<std::uint8_t>(5));
  CHECK(p.logged("ignored_after_outcome"));
  CHECK(p.logged("protocol_error_after_outcome"));
  CHECK(p.closes == 0);  // every guest message is still consumed
}

TEST_CASE("version mismatch names both versions and closes") {
  Probe p;
  p.start();
  p.feed(test::ready_line(1));
  CHECK(p.outcome().outcome == proto::Outcome::version_mismatch);
  CHECK(p.outcome().reason.find("version 1") != std::string::npos);
  CHECK(p.outcome().reason.find("version 2") != std::string::npos);
  CHECK(p.outcome().exit_status == 125);
  CHECK(p.closes == 1);
  CHECK(p.sent.empty());
}

TEST_CASE("ready deadline: armed at vm_started, no_ready when it fires first") {
  Probe p;
  p.s.vm_started(p.t);
  p.pump();
  REQUIRE(p.armed.size() == 1);
  CHECK(p.armed[0] == TimerKind::ready);
  CHECK(p.s.stream_opened(p.t));
  p.feed("{\"type\":\"rea");  // slowloris
  p.s.timer_fired(TimerKind::ready, p.t);
  p.pump();
  CHECK(p.outcome().outcome == proto::Outcome::no_ready);
  CHECK(p.outcome().reason.find("1500 ms") != std::string::npos);
  CHECK(p.closes == 1);
  // ready deadline that fires after ready is harmless
  Probe q;
  q.booted();
  q.s.timer_fired(TimerKind::ready, q.t);
  q.pump();
  CHECK(!q.s.outcome());
}

TEST_CASE("policy overrides the descriptor's terminal") {
  Probe keep(OnExitPolicy::keep);
  keep.booted();
  CHECK_FALSE(boot_of(keep.sent[0]).on_exit.terminal);  // descriptor said true
  Probe stop(OnExitPolicy::stop);
  stop.s = Session([] {
    auto c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
    c.descriptor.on_exit.terminal = false;
    return c;
  }());
  stop.booted();
  CHECK(boot_of(stop.sent[0]).on_exit.terminal);
}

TEST_CASE("on_exit keep: no ack until shutdown(), then as stop") {
  Probe p(OnExitPolicy::keep);
  p.booted();
  p.feed(test::exited_line(0));
  p.durable();
  CHECK(p.sent.size() == 1);  // only boot: the VM is kept
  CHECK(p.logged("kept"));
  CHECK(!p.s.finished());
  CHECK(p.s.shutdown(p.t));
  p.pump();
  CHECK(p.last_type() == "shutdown");
  p.s.vm_exited(p.t);
  p.pump();
  CHECK(p.s.finished());
  CHECK(p.removes == 0);
}

TEST_CASE("shutdown() while the workload runs: stop first; the shutdown acks the durable outcome") {
  Probe p;
  p.booted();
  CHECK(p.s.shutdown(p.t));
  p.pump();
  CHECK(p.last_type() == "stop");  // not a shutdown: the guest could take that for the ack
  auto before = p.sent.size();
  p.feed(test::signalled_line(15));
  CHECK(p.sent.size() == before);      // nothing is acked before the record is durable
  p.durable();
  REQUIRE(p.sent.size() == before + 1);
  CHECK(p.last_type() == "shutdown");  // the ack: the guest powers off without its ack timeout
  CHECK(p.logged("shutdown_sent ack of the recorded outcome"));
  CHECK(p.s.shutdown(p.t));            // idempotent afterwards
  p.pump();
  CHECK(p.sent.size() == before + 1);
}

TEST_CASE("on_exit remove: remove hook only after durable and vm_exited") {
  Probe p(OnExitPolicy::remove);
  p.booted();
  p.feed(test::exited_line(1));
  p.s.vm_exited(p.t);  // before the record is durable
  p.pump();
  CHECK(p.removes == 0);
  p.durable();
  CHECK(p.removes == 1);
  CHECK(p.s.finished());
}

TEST_CASE("on_exit stop: destroy past the stop deadline, then give up") {
  Probe p(OnExitPolicy::stop);
  p.booted();
  p.feed(test::exited_line(2));
  p.durable();
  p.s.timer_fired(TimerKind::stop, p.t);
  p.pump();
  CHECK(p.destroys == 1);
  CHECK(!p.s.finished());
  p.s.timer_fired(TimerKind::stop, p.t);
  p.pump();
  CHECK(p.s.finished());
  CHECK(p.logged("gave_up"));
}

TEST_CASE("remove: record failure never removes") {
  Probe p(OnExitPolicy::remove);
  p.booted();
  p.feed(test::exited_line(1));
  p.s.record_failed("disk on fire");
  p.pump();
  p.s.vm_exited(p.t);
  p.pump();
  CHECK(p.s.finished());
  CHECK(p.removes == 0);
}

TEST_CASE("vm_exited before an outcome: queued bytes are read first") {
  Probe p;
  p.booted();
  p.s.vm_exited(p.t);
  p.pump();
  CHECK(!p.s.outcome());           // waiting for the stream to drain
  p.feed(test::exited_line(9));    // the report written just before power-off
  CHECK(p.outcome().exit_code == std::optional<std::uint8_t>(9));
  p.durable();
  CHECK(p.s.finished());
}

TEST_CASE("vm_exited before an outcome: the deadline restarts while lines still arrive, bounded") {
  Probe p;
  p.booted();
  p.s.vm_exited(p.t);
  p.pump();
  p.feed(test::started_line());          // a loaded host still reading the guest's backlog
  p.s.timer_fired(TimerKind::stop, p.t);
  p.pump();
  CHECK(!p.s.outcome());                 // not lost: lines arrived since the deadline was armed
  CHECK(p.armed.back() == TimerKind::stop);
  p.feed(test::exited_line(4));          // the report, read late
  CHECK(p.outcome().exit_code == std::optional<std::uint8_t>(4));
  // Nothing new since the last restart: the next deadline ends the wait.
  Probe q;
  q.booted();
  q.s.vm_exited(q.t);
  q.pump();
  for (int i = 0; i < 12; ++i) {  // a stream that never stops: at most 10 restarts
    q.feed(test::started_line());
    q.s.timer_fired(TimerKind::stop, q.t);
    q.pump();
  }
  CHECK(q.outcome().outcome == proto::Outcome::channel_lost);
  CHECK(q.outcome().reason.find("stayed open") != std::string::npos);
}

TEST_CASE("vm_exited with no stream: channel_lost at once") {
  Probe p;
  p.s.vm_started(p.t);
  p.s.vm_exited(p.t);
  p.pump();
  CHECK(p.outcome().outcome == proto::Outcome::channel_lost);
  CHECK(p.outcome().reason.find("before `ready`") != std::string::npos);
}

TEST_CASE("EOF: mid-line, before ready, before outcome") {
  {
    Probe p;
    p.booted();
    p.feed("{\"type\":\"workload_ex");
    p.eof();
    p.pump();
    CHECK(p.outcome().outcome == proto::Outcome::channel_lost);
    CHECK(p.outcome().reason == "channel closed in the middle of line 2 (20 bytes)");
  }
  {
    Probe p;  // a stream without `ready` carries no session: not an outcome
    p.start();
    p.feed("{\"type\":\"rea");
    p.eof();
    p.pump();
    CHECK(!p.s.outcome());
    CHECK(p.logged("no_session"));
    CHECK(p.s.stream_opened(p.t));  // another may come
    p.eof();
    p.s.vm_exited(p.t);
    p.pump();
    CHECK(p.outcome().reason == "VM exited before `ready`");
  }
  {
    Probe p;
    p.booted();
    p.eof();
    p.pump();
    CHECK(p.outcome().reason == "channel closed before an outcome");
  }
}

TEST_CASE("a guest that starts over (second ready on its stream) is refused: one boot, one outcome, shutdown") {
  Probe p;
  p.booted();
  p.feed(test::started_line());
  p.feed(test::ready_line());  // the guest started over in the same generation
  CHECK(p.logged("guest_restarted protocol error: a second `ready` on this stream in generation 4"));
  REQUIRE(p.writes.size() == 1);
  CHECK(p.outcome().outcome == proto::Outcome::channel_lost);
  CHECK(p.outcome().exit_status == 125);
  CHECK(p.outcome().reason.find("the guest started over (a second `ready` on its stream after `boot`)") != std::string::npos);
  CHECK(p.sent.size() == 1);  // no second boot
  CHECK(p.closes == 0);       // the stream stays: the guest gets its shutdown on it
  // Event by event: a report now is after the outcome (not recorded), then the durable record
  // lets the `shutdown` (a request: the restarted guest reported nothing) go out.
  p.feed(test::exited_line(6));
  CHECK(p.writes.size() == 1);
  CHECK(p.sent.size() == 1);  // nothing before the record is durable
  p.durable();
  CHECK(p.outcome().outcome == proto::Outcome::channel_lost);
  CHECK(p.last_type() == "shutdown");
  // Again and again: never a boot.
  for (int i = 0; i < 3; ++i) p.feed(test::ready_line());
  CHECK(std::count_if(p.sent.begin(), p.sent.end(),
                      [](auto& m) { return std::holds_alternative<proto::Boot>(m); }) == 1);
  CHECK(p.writes.size() == 1);
}

TEST_CASE("a second ready before any boot (the host ended it first) is refused as well, as stopped") {
  Probe p;
  p.start();
  REQUIRE(p.s.shutdown(p.t));
  p.pump();
  p.feed(test::ready_line());
  CHECK(p.last_type() == "shutdown");  // no boot: the host asked for the end
  p.feed(test::ready_line());          // it started over anyway
  REQUIRE(p.writes.size() == 1);
  CHECK(p.outcome().outcome == proto::Outcome::stopped);
  CHECK(std::none_of(p.sent.begin(), p.sent.end(), [](auto& m) { return std::holds_alternative<proto::Boot>(m); }));
}

TEST_CASE("a second live stream is refused; none after the outcome") {
  Probe p;
  p.booted();
  CHECK_FALSE(p.s.stream_opened(p.t));
  p.feed(test::exited_line(0));
  p.eof();
  CHECK_FALSE(p.s.stream_opened(p.t));
}

TEST_CASE("malformed and over-long lines -> protocol_error with the reason; nothing after is acted on") {
  Probe p;
  p.booted();
  p.feed("{\"type\":\"workload_exited\",\"exit_code\":300}\n" + test::exited_line(1));
  CHECK(p.outcome().outcome == proto::Outcome::protocol_error);
  CHECK(p.outcome().reason.find("line 2") != std::string::npos);
  CHECK(p.outcome().reason.find("exit_code") != std::string::npos);
  CHECK(p.closes == 1);
  CHECK(p.writes.size() == 1);

  Probe q(OnExitPolicy::stop, 64);
  q.booted();
  q.feed(std::string(100, 'a') + "\n");
  CHECK(q.outcome().outcome == proto::Outcome::protocol_error);
  CHECK(q.outcome().reason.find("64-byte cap") != std::string::npos);
}

TEST_CASE("endless line: judged at the cap, not at a newline; memory stays bounded") {
  Probe p(OnExitPolicy::stop, 1000);
  p.booted();
  for (int i = 0; i < 3; ++i) p.feed(std::string(300, 'z'));
  CHECK(!p.s.outcome());
  CHECK(p.reader.buffered() == 900);  // the loop's reader holds the unfinished line
  p.feed(std::string(300, 'z'));
  CHECK(p.outcome().outcome == proto::Outcome::protocol_error);
  CHECK(p.outcome().reason.find("line 2: more than 1000 bytes without a newline") != std::string::npos);
  CHECK(p.reader.buffered() == 0);  // past the cap its bytes are dropped, not held
  CHECK(p.reader.dropping());
  CHECK(p.closes == 1);
  p.feed(std::string(5000, 'z'));   // more of it changes nothing and holds nothing
  CHECK(p.reader.buffered() == 0);
  CHECK(p.writes.size() == 1);
}

TEST_CASE("message before ready is a protocol error; unknown type before ready is skipped") {
  Probe p;
  p.start();
  p.feed("{\"type\":\"hello\"}\n");
  CHECK(!p.s.outcome());
  p.feed(test::started_line());
  CHECK(p.outcome().outcome == proto::Outcome::protocol_error);
  CHECK(p.outcome().reason.find("expected `ready` first") != std::string::npos);
}

TEST_CASE("any guest message type before ready is named in the protocol error") {
  // The types past the first seven (processes, exec_*) are named from the codec's table too.
  Probe p;
  p.start();
  p.feed(R"({"type":"processes","processes":[{"pid":1,"ppid":0,"uid":0,"cmd":"/init"}]})" "\n");
  CHECK(p.outcome().outcome == proto::Outcome::protocol_error);
  CHECK(p.outcome().reason == "line 1: expected `ready` first, got `processes`");
}

TEST_CASE("wall timeout -> outcome timeout (124)") {
  auto c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
  c.wall_timeout = std::chrono::milliseconds(5000);
  Probe p;
  p.s = Session(c);
  p.booted();
  CHECK(std::count(p.armed.begin(), p.armed.end(), TimerKind::wall) == 1);
  p.s.timer_fired(TimerKind::wall, p.t);
  p.pump();
  CHECK(p.outcome().outcome == proto::Outcome::timeout);
  CHECK(p.outcome().exit_status == 124);
  CHECK(p.last_type() == "stop");  // stop, grace, shutdown
  p.durable();
  p.s.timer_fired(TimerKind::grace, p.t);
  p.pump();
  CHECK(p.last_type() == "shutdown");
}

TEST_CASE("a takeover keeps the VM's start and re-arms what is left of the wall limit") {
  auto c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
  const WallTime first_start{std::chrono::seconds(1'699'999'000)};
  c.resume = true;
  c.started_at = first_start;
  c.wall_timeout = std::chrono::milliseconds(5000);
  c.wall_from_started = true;
  c.wall_left = std::chrono::milliseconds(1234);
  Probe p(c);
  p.s.vm_started(p.t);  // the replacement's `now`
  p.pump();
  CHECK(p.s.started_at() == first_start);
  REQUIRE(p.wall_arms.size() == 1);
  CHECK(p.wall_arms[0] == std::chrono::milliseconds(1234));
  CHECK(p.logged("wall_rearmed"));
  p.s.timer_fired(TimerKind::wall, p.t);
  p.pump();
  CHECK(p.outcome().outcome == proto::Outcome::timeout);
  CHECK(p.outcome().exit_status == 124);
  CHECK(p.outcome().started_at == first_start);
  // A deadline already due fires at once; without a recorded one nothing is armed.
  c.wall_left = std::chrono::milliseconds(-50);
  Probe due(c);
  due.s.vm_started(due.t);
  due.pump();
  REQUIRE(due.wall_arms.size() == 1);
  CHECK(due.wall_arms[0] == std::chrono::milliseconds(0));
  c.wall_left.reset();
  Probe none(c);
  none.s.vm_started(none.t);
  none.pump();
  CHECK(none.wall_arms.empty());
}

TEST_CASE("API: stop before boot is queued, kill validates, shutdown before ready skips boot") {
  Probe p;
  p.start();
  CHECK(p.s.stop());
  CHECK_FALSE(p.s.kill(9));  // no booted session
  p.feed(test::ready_line());
  REQUIRE(p.sent.size() == 2);
  CHECK(p.last_type() == "stop");
  CHECK_FALSE(p.s.kill(0));
  CHECK_FALSE(p.s.kill(65));
  CHECK(p.s.kill(64));
  p.pump();
  CHECK(p.last_type() == "kill");

  Probe q;
  q.start();
  CHECK(q.s.shutdown(q.t));
  q.feed(test::ready_line());
  REQUIRE(q.sent.size() == 1);
  CHECK(q.last_type() == "shutdown");
}

TEST_CASE("durable record of the same generation written first wins") {
  Probe p;
  p.booted();
  p.feed(test::exited_line(3));
  Record earlier = p.writes.back();
  earlier.outcome = proto::Outcome::signalled;
  earlier.exit_code.reset();
  earlier.signal = 15;
  earlier.exit_status = 143;
  p.s.record_durable(earlier);
  p.pump();
  CHECK(p.outcome().exit_status == 143);
  CHECK(p.logged("already_recorded"));
}

TEST_CASE("guest text in a reason is bounded") {
  Probe p;
  p.booted();
  std::string huge(100000, 'r');
  p.feed(R"({"type":"start_failed","reason":")" + huge + R"(","errno":2,"class":"other"})" "\n");
  CHECK(p.outcome().reason.size() < 2000);
}

TEST_CASE("vm_exited, then EOF of a stream that never said ready: channel_lost at once") {
  Probe p;
  p.start();
  p.feed("{\"ty");
  p.s.vm_exited(p.t);
  p.pump();
  CHECK(!p.s.outcome());  // waiting for the stream to drain
  p.eof();
  p.pump();
  CHECK(p.outcome().reason == "VM exited before `ready`");
  p.durable();
  CHECK(p.s.finished());
}

TEST_CASE("gave up waiting for the VM before the record was durable: finish once it is") {
  Probe p;
  p.booted();
  CHECK(p.s.shutdown(p.t));
  p.pump();
  p.s.timer_fired(TimerKind::stop, p.t);  // destroy
  p.s.timer_fired(TimerKind::stop, p.t);  // give up: no outcome; the host asked -> stopped
  p.pump();
  CHECK(p.destroys == 1);
  CHECK(p.outcome().outcome == proto::Outcome::stopped);
  CHECK(!p.s.finished());
  p.durable();
  CHECK(p.s.finished());
}

// ---- channel survival (SessionConfig::reconnect, resume) ----------------------------------------

namespace {
std::string resume_line(std::string vm, std::uint64_t gen, bool started, bool pending) {
  return proto::encode(proto::GuestMessage{proto::Ready{
             proto::kProtocolVersion, proto::Resume{std::move(vm), gen, started, pending}}}) + "\n";
}
std::string exited_line(int code) {
  return proto::encode(proto::GuestMessage{proto::WorkloadExited::code(static_cast<std::uint8_t>(code))}) + "\n";
}
}  // namespace

TEST_CASE("survival: boot carries the window and the names; a loss after boot is no outcome yet") {
  Probe p;
  SessionConfig c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
  c.reconnect = std::chrono::milliseconds(5000);
  p.s = Session(c);
  p.booted();
  auto b = boot_of(p.sent.back());
  CHECK(b.reconnect_ms == 5000);
  CHECK(b.vm == "vm1");
  CHECK(b.generation == 4u);
  p.eof();
  p.pump();
  CHECK_FALSE(p.s.outcome());
  CHECK(p.s.awaiting_redial());
  CHECK(std::count(p.armed.begin(), p.armed.end(), TimerKind::reconnect) == 1);
  // The guest redials and resumes: no second boot; the outcome then arrives and is acked.
  const auto boots = p.sent.size();
  CHECK(p.s.stream_opened(p.t));
  p.feed(resume_line("vm1", 4, true, false));
  CHECK(p.logged("resumed"));
  CHECK(p.sent.size() == boots);
  p.feed(exited_line(7));
  p.durable();
  CHECK(p.outcome().exit_status == 7);
  CHECK(p.last_type() == "shutdown");
  CHECK(p.writes.size() == 1);
}

TEST_CASE("survival: the window over is channel_lost; without a window a loss is at once") {
  Probe p;
  SessionConfig c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
  c.reconnect = std::chrono::milliseconds(1000);
  p.s = Session(c);
  p.booted();
  p.eof();
  p.s.timer_fired(TimerKind::reconnect, p.t);
  p.pump();
  REQUIRE(p.s.outcome());
  CHECK(p.outcome().outcome == proto::Outcome::channel_lost);
  CHECK(p.outcome().reason.find("did not resume within 3000 ms") != std::string::npos);

  Probe q;
  q.booted();
  q.eof();
  q.pump();
  REQUIRE(q.s.outcome());
  CHECK(q.outcome().outcome == proto::Outcome::channel_lost);
}

TEST_CASE("survival: a fresh ready on a new stream after the VM exited mid-redial is no second boot") {
  // Found by fuzz/host_session: boot; the stream lost (a redial awaited); a new stream; the VM
  // exits (nobody is left to redial), then a fresh `ready` arrives on that stream. One boot per
  // session: it is a guest that started over, recorded as channel_lost, the stream closed.
  SessionConfig c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
  c.reconnect = std::chrono::milliseconds(5000);
  Probe p(c);
  p.booted();
  REQUIRE(p.sent.size() == 1);
  p.eof();
  p.pump();
  CHECK(p.s.awaiting_redial());
  CHECK(p.s.stream_opened(p.t));
  p.s.vm_exited(p.t);
  p.pump();
  CHECK_FALSE(p.s.awaiting_redial());
  const auto closes = p.closes;
  p.feed(test::ready_line());
  CHECK(std::count_if(p.sent.begin(), p.sent.end(),
                      [](auto& m) { return std::holds_alternative<proto::Boot>(m); }) == 1);
  CHECK(p.logged("resume_expected"));
  REQUIRE(p.s.outcome());
  CHECK(p.outcome().outcome == proto::Outcome::channel_lost);
  CHECK(p.closes == closes + 1);
}

TEST_CASE("survival: a fresh host (resume) takes over one generation and refuses anything else") {
  SessionConfig c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
  c.resume = true;
  c.descriptor = {};
  {
    Probe p;
    p.s = Session(c);
    p.start();
    p.feed(resume_line("vm1", 4, true, true));
    CHECK(p.logged("resumed"));
    CHECK(p.sent.empty());  // never a boot
    p.feed(exited_line(3));
    p.durable();
    CHECK(p.outcome().exit_status == 3);
    CHECK(p.last_type() == "shutdown");
  }
  {
    Probe p;  // another generation: refused, the stream closed, nothing recorded
    p.s = Session(c);
    p.start();
    p.feed(resume_line("vm1", 3, true, true));
    CHECK(p.logged("resume_refused"));
    CHECK(p.closes == 1);
    CHECK_FALSE(p.s.outcome());
    CHECK(p.sent.empty());
  }
  {
    Probe p;  // another VM's name: refused (the endpoint decides who the peer is)
    p.s = Session(c);
    p.start();
    p.feed(resume_line("other", 4, true, true));
    CHECK(p.logged("resume_refused"));
    CHECK_FALSE(p.s.outcome());
  }
  {
    Probe p;  // a fresh ready where a resume was expected: the guest restarted
    p.s = Session(c);
    p.start();
    p.feed(test::ready_line());
    REQUIRE(p.s.outcome());
    CHECK(p.outcome().outcome == proto::Outcome::channel_lost);
    CHECK(p.sent.empty());
  }
  {
    Probe p;  // a host that booted nothing and has no window refuses a resume
    p.start();
    p.feed(resume_line("vm1", 4, true, true));
    CHECK(p.logged("resume_refused"));
    CHECK_FALSE(p.s.outcome());
  }
}

TEST_CASE("survival: an outcome re-sent after the record is durable is acked, recorded once") {
  Probe p(OnExitPolicy::keep);
  SessionConfig c = Probe::cfg(OnExitPolicy::keep, proto::kDefaultLineCap);
  c.reconnect = std::chrono::milliseconds(5000);
  p.s = Session(c);
  p.booted();
  p.feed(exited_line(5));
  p.durable();
  p.eof();
  p.pump();
  CHECK(p.s.awaiting_redial());
  CHECK(p.s.stream_opened(p.t));
  p.feed(resume_line("vm1", 4, true, true));
  p.feed(exited_line(5));
  CHECK(p.writes.size() == 1);
  CHECK(p.s.shutdown(p.t));
  p.pump();
  CHECK(p.last_type() == "shutdown");
}

TEST_CASE("a terminal size set before boot is the descriptor's; once boot went out it is refused") {
  auto c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
  c.descriptor.stdio = proto::Stdio{};
  Session plain(c);
  CHECK(!plain.set_terminal_size(33, 101));  // no terminal asked for
  c.descriptor.stdio->terminal = proto::Terminal{24, 80};
  Session s(c);
  CHECK(!s.set_terminal_size(0, 5));
  CHECK(s.set_terminal_size(33, 101));
  WallTime t{std::chrono::seconds(1'700'000'000)};
  s.vm_started(t);
  CHECK(s.stream_opened(t));
  proto::LineReader reader(c.line_cap);
  feed_lines(s, reader, test::ready_line(), t);
  std::optional<proto::Boot> boot;
  for (auto& a : s.take())
    if (auto* send = std::get_if<act::Send>(&a)) boot = boot_of(send->msg);
  REQUIRE(boot);
  REQUIRE(boot->stdio);
  CHECK(boot->stdio->terminal == proto::Terminal{33, 101});
  CHECK(!s.set_terminal_size(40, 120));
}

TEST_CASE("API: list_processes needs a guest that sent ready; its processes line becomes act::Processes") {
  Probe p;
  p.start();
  CHECK_FALSE(p.s.list_processes());  // no ready yet
  p.feed(test::ready_line());
  REQUIRE(p.s.list_processes());
  p.pump();
  CHECK(p.last_type() == "list_processes");
  p.feed(R"({"type":"processes","processes":[{"pid":1,"ppid":0,"uid":0,"cmd":"/init"}],"truncated":2})" "\n");
  REQUIRE(p.lists.size() == 1);
  CHECK(p.lists[0] == proto::Processes{{{1, 0, 0, "/init"}}, 2});
  CHECK(!p.s.outcome());  // it changes nothing of the session
  // A malformed list is a protocol error like any other line, not a list.
  p.feed(R"({"type":"processes","processes":[{"pid":0,"ppid":0,"uid":0,"cmd":"x"}]})" "\n");
  CHECK(p.lists.size() == 1);
}

// ---- the stop deadline and the data channel: one decision, event by event ----

TEST_CASE("stop deadline with output moving: restarts as armed (once said), never cuts, until at rest") {
  Probe p;
  p.booted();
  p.s.data_opened();
  p.feed(test::exited_line(0));
  p.durable();  // stop policy: the ack, the stop deadline (700 ms)
  REQUIRE(p.stop_arms.size() == 1);
  CHECK(p.stop_arms.back() == std::chrono::milliseconds(700));
  for (int i = 0; i < 3; ++i) {
    p.s.timer_fired(TimerKind::stop, p.t, DataLinkState{true, true});
    p.pump();
    CHECK(p.stop_arms.back() == std::chrono::milliseconds(700));  // restarted, the same length
  }
  CHECK(p.stop_arms.size() == 4);
  CHECK(std::count_if(p.logs.begin(), p.logs.end(), [](auto& l) { return l.starts_with("stop_deferred"); }) == 1);
  CHECK(p.cuts.empty());
  CHECK(p.destroys == 0);
  // At rest now, the outcome in: the output still owed is cut; the guest gets data_drain (2 s).
  p.s.timer_fired(TimerKind::stop, p.t, DataLinkState{true, false});
  p.pump();
  REQUIRE(p.cuts.size() == 1);
  CHECK(p.cuts[0] == "the guest did not power off within the stop deadline (700 ms)");
  CHECK(p.stop_arms.back() == std::chrono::milliseconds(2000));
  CHECK(p.destroys == 0);
  // The loop closed it (the guest's eofs missing): then the deadline runs its course.
  p.s.data_closed(false);
  p.s.timer_fired(TimerKind::stop, p.t, DataLinkState{});
  p.pump();
  CHECK(p.destroys == 1);
}

TEST_CASE("stop deadline, the host ending the VM: moving output does not restart it; cut, then destroy") {
  Probe p;
  p.booted();
  p.s.data_opened();
  p.feed(test::exited_line(0));
  p.durable();
  CHECK(p.s.shutdown(p.t));  // after the outcome, the data channel open: cut at once
  p.pump();
  REQUIRE(p.cuts.size() == 1);
  CHECK(p.cuts[0] == "the VM was stopped while its output was still being read");
  CHECK(p.s.ended_by_host());
  p.s.data_closed(false);
  p.s.timer_fired(TimerKind::stop, p.t, DataLinkState{});
  p.pump();
  CHECK(p.destroys == 1);
}

TEST_CASE("stop deadline before the outcome: at rest and not ended by the host, the deadline runs its course") {
  Probe p;
  p.booted();
  p.s.data_opened();
  p.s.vm_exited(p.t);  // the stream stays open: the stop deadline bounds the wait for its EOF
  p.pump();
  REQUIRE(p.stop_arms.size() == 1);
  p.s.timer_fired(TimerKind::stop, p.t, DataLinkState{true, false});
  p.pump();
  CHECK(p.cuts.empty());
  REQUIRE(p.s.outcome());
  CHECK(p.outcome().outcome == proto::Outcome::channel_lost);
}

TEST_CASE("the wall limit ends the VM on purpose: its deadline is kept while output moves, and what is owed is cut") {
  Probe p;
  auto c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
  c.wall_timeout = std::chrono::milliseconds(5000);
  p.s = Session(c);
  p.booted();
  p.s.data_opened();
  p.s.timer_fired(TimerKind::wall, p.t);
  p.pump();
  REQUIRE(p.s.outcome());
  CHECK(p.outcome().outcome == proto::Outcome::timeout);
  CHECK(p.cuts.empty());  // the workload gets `stop` and its grace first
  p.s.timer_fired(TimerKind::stop, p.t, DataLinkState{true, true});
  p.pump();
  REQUIRE(p.cuts.size() == 1);
  CHECK(p.cuts[0] == "the VM reached its time limit while its output was still being read");
  CHECK(p.stop_arms.back() == std::chrono::milliseconds(2000));
}

TEST_CASE("kill after the outcome with the data channel open cuts the output; with it closed, nothing") {
  Probe p;
  p.booted();
  p.s.data_opened();
  p.feed(test::exited_line(0));
  CHECK(p.s.kill(9));
  p.pump();
  REQUIRE(p.cuts.size() == 1);
  CHECK(p.cuts[0] == "the VM was killed (signal 9) while its output was still being read");
  p.s.data_closed(true);
  CHECK(p.s.kill(9));
  p.pump();
  CHECK(p.cuts.size() == 1);
}

TEST_CASE("phases: awaiting_ready -> ready -> booted -> finished; the stop phase and the record by enum") {
  Probe p;
  CHECK(p.s.phase() == Phase::awaiting_ready);
  p.start();
  CHECK(p.s.stream().link == Link::connected);
  p.feed(test::ready_line());
  CHECK(p.s.phase() == Phase::booted);
  CHECK(p.s.stream().link == Link::booted);
  p.feed(test::exited_line(0));
  CHECK(p.s.record_state() == RecordState::writing);
  CHECK(p.s.stream().reported);
  p.durable();
  CHECK(p.s.record_state() == RecordState::durable);
  CHECK(p.s.stream().shutdown == ShutdownSent::ack);
  CHECK(p.s.stop_phase() == StopPhase::awaiting_exit);
  p.s.timer_fired(TimerKind::stop, p.t);
  p.pump();
  CHECK(p.s.stop_phase() == StopPhase::destroyed);
  p.s.timer_fired(TimerKind::stop, p.t);
  p.pump();
  CHECK(p.s.stop_phase() == StopPhase::gave_up);
  CHECK(p.s.phase() == Phase::finished);
  // Finished: every timer kind cancelled, none left armed.
  for (std::size_t k = 0; k < kTimerKinds; ++k)
    CHECK(std::count(p.cancelled.begin(), p.cancelled.end(), static_cast<TimerKind>(k)) >= 1);
}

// ---- processes exec() started: their end decided here, event by event ----

namespace {
proto::ExecProcess exec_of(std::uint16_t proc, bool with_stdio) {
  proto::ExecProcess x;
  x.proc = proc;
  x.exec.argv = {"/bin/sh"};
  if (with_stdio) x.stdio = proto::Stdio{};
  return x;
}
std::string exec_line(std::string_view type, std::uint16_t proc, std::string_view rest) {
  return fmt::format("{{\"type\":\"{}\",\"proc\":{}{}}}\n", type, proc, rest);
}
}  // namespace

TEST_CASE("exec with stdio: started cancels the answer's bound; exited waits for both eofs, then ends") {
  Probe p;
  p.booted();
  p.s.data_opened();
  REQUIRE(p.s.exec(exec_of(1, true)));
  p.pump();
  REQUIRE(p.exec_arms.size() == 1);
  CHECK(p.exec_arms[0] == std::pair<std::uint16_t, std::chrono::milliseconds>{1, std::chrono::milliseconds(10000)});
  p.feed(exec_line("exec_started", 1, ",\"pid\":5"));
  CHECK(p.exec_cancels == std::vector<std::uint16_t>{1});
  p.feed(exec_line("exec_started", 1, ",\"pid\":5"));  // a repeat tells nothing
  CHECK(std::count(p.order.begin(), p.order.end(), "report") == 1);
  p.feed(exec_line("exec_exited", 1, ",\"exit_code\":4"));
  CHECK(p.exec_ends.empty());  // its output is still owed: the window (data_drain)
  REQUIRE(p.exec_arms.size() == 2);
  CHECK(p.exec_arms[1].second == std::chrono::milliseconds(2000));
  p.s.exec_eof(1, proto::Stream::out);
  p.pump();
  CHECK(p.exec_ends.empty());
  p.s.exec_eof(1, proto::Stream::err);
  p.pump();
  REQUIRE(p.exec_ends.size() == 1);
  auto* x = std::get_if<proto::ExecExited>(&p.exec_ends[0].second);
  REQUIRE(x);
  CHECK(x->exit_code == std::optional<std::uint8_t>(4));
  CHECK(p.order == std::vector<std::string>{"report", "report", "end"});  // exited reported, then the end
  p.s.exec_eof(1, proto::Stream::err);  // late: nothing more
  p.s.exec_timer_fired(1, {});
  p.pump();
  CHECK(p.exec_ends.size() == 1);
}

TEST_CASE("exec window after exec_exited: restarts while output moves (said once), ends at rest") {
  Probe p;
  p.booted();
  p.s.data_opened();
  REQUIRE(p.s.exec(exec_of(2, true)));
  p.feed(exec_line("exec_started", 2, ",\"pid\":5") + exec_line("exec_exited", 2, ",\"signal\":9"));
  for (int i = 0; i < 2; ++i) {
    p.s.exec_timer_fired(2, DataLinkState{true, true});
    p.pump();
  }
  CHECK(p.exec_ends.empty());
  CHECK(p.exec_arms.back().second == std::chrono::milliseconds(2000));
  CHECK(std::count_if(p.logs.begin(), p.logs.end(), [](auto& l) { return l.starts_with("exec_output_wait"); }) == 1);
  p.s.exec_timer_fired(2, DataLinkState{true, false});
  p.pump();
  REQUIRE(p.exec_ends.size() == 1);
  CHECK(std::holds_alternative<proto::ExecExited>(p.exec_ends[0].second));
}

TEST_CASE("exec ends: no answer in time is lost; exec_failed at once; without stdio exited ends at once") {
  Probe p;
  p.booted();
  REQUIRE(p.s.exec(exec_of(1, false)));
  REQUIRE(p.s.exec(exec_of(2, false)));
  REQUIRE(p.s.exec(exec_of(3, false)));
  p.pump();
  p.s.exec_timer_fired(1, {});
  p.feed(exec_line("exec_failed", 2, ",\"reason\":\"no such file\",\"class\":\"not_found\""));
  p.feed(exec_line("exec_started", 3, ",\"pid\":5") + exec_line("exec_exited", 3, ",\"exit_code\":0"));
  p.feed(exec_line("exec_exited", 9, ",\"exit_code\":0"));  // never asked for: nothing
  REQUIRE(p.exec_ends.size() == 3);
  CHECK(std::get<ExecLost>(p.exec_ends[0].second).reason == "no answer to exec in time (an init without exec?)");
  CHECK(std::holds_alternative<proto::ExecFailed>(p.exec_ends[1].second));
  CHECK(std::holds_alternative<proto::ExecExited>(p.exec_ends[2].second));
}

TEST_CASE("exec.container / exec.in: sent to an init that announces \"container\"; refused, naming the field, to one that does not") {
  {
    Probe p;
    p.booted();  // ready with all_features(): "container" among them
    proto::ExecProcess x = exec_of(1, false);
    x.container = proto::Container{"/run/nes/pod/c1/rootfs", "web", false};
    REQUIRE(p.s.exec(x));
    p.pump();
    REQUIRE(std::holds_alternative<proto::ExecProcess>(p.sent.back()));
    CHECK(std::get<proto::ExecProcess>(p.sent.back()).container == x.container);
    // A malformed field is refused before anything is sent, named as the guest would.
    proto::ExecProcess bad = exec_of(2, false);
    bad.container = proto::Container{"relative"};
    auto st = p.s.exec(bad);
    REQUIRE(!st);
    CHECK(st.error().message.starts_with("exec.container.root: expected absolute path"));
  }
  {
    Probe p;
    p.start();
    p.feed(R"({"type":"ready","protocol_version":2,"features":["stdio","exec"]})" "\n");
    proto::ExecProcess x = exec_of(1, false);
    x.in = 3;
    auto st = p.s.exec(x);
    REQUIRE(!st);
    CHECK(st.error().message == R"(exec.in: the guest's init does not implement containers (no "container" in ready.features))");
    CHECK(p.s.exec(exec_of(1, false)));  // a plain exec still goes
  }
}

TEST_CASE("exec and the end of the VM: the data channel closing ends those exited; the stream closing, the rest") {
  Probe p;
  p.booted();
  p.s.data_opened();
  REQUIRE(p.s.exec(exec_of(1, true)));
  REQUIRE(p.s.exec(exec_of(2, true)));
  p.feed(exec_line("exec_started", 1, ",\"pid\":5") + exec_line("exec_exited", 1, ",\"exit_code\":0"));
  p.feed(exec_line("exec_started", 2, ",\"pid\":6"));
  p.s.data_closed(true);  // its streams are gone: 1 (exited) ends, 2 runs on
  p.pump();
  REQUIRE(p.exec_ends.size() == 1);
  CHECK(p.exec_ends[0].first == 1);
  p.feed("not json\n");  // a protocol violation closes the stream
  REQUIRE(p.exec_ends.size() == 2);
  CHECK(p.exec_ends[1].first == 2);
  CHECK(std::get<ExecLost>(p.exec_ends[1].second).reason ==
        "the guest's stream closed before the process's end was reported");
}

TEST_CASE("features: a descriptor field the guest's init lacks is refused before boot, naming it") {
  struct Case {
    const char* ready;
    std::string field;  // what the descriptor needs; "" = nothing beyond the v2 base
    bool refused;
  };
  const std::string old_ready = R"({"type":"ready","protocol_version":2})" "\n";
  const std::string some = R"({"type":"ready","protocol_version":2,"features":["stdio","exec"]})" "\n";
  const std::string rooted = R"({"type":"ready","protocol_version":2,"features":["stdio","exec","root"]})" "\n";
  const std::vector<Case> cases = {
      // Issue 47: a block root needs root_block besides root; a share root does not.
      {rooted.c_str(), "root", false}, {rooted.c_str(), "root.fs", true},
      {old_ready.c_str(), "", false}, {old_ready.c_str(), "stdio", true}, {old_ready.c_str(), "network", true},
      {some.c_str(), "stdio", false}, {some.c_str(), "root", true},      {some.c_str(), "network", true},
      // Issue 44: the reference's additive fields, each refused by an init that does not name it.
      {old_ready.c_str(), "exec.groups", true},  {some.c_str(), "exec.groups", true},
      {old_ready.c_str(), "mounts[].fs", true},  {some.c_str(), "mounts[].fs", true},
      {old_ready.c_str(), "hostname", true},     {some.c_str(), "hostname", true},
      {old_ready.c_str(), "on_exit.halt", true}, {some.c_str(), "on_exit.halt", true},
      {old_ready.c_str(), "entropy", true},      {some.c_str(), "entropy", true},
      {old_ready.c_str(), "realtime_ns", true},  {some.c_str(), "realtime_ns", true},
  };
  const std::map<std::string, std::string> feature_of = {
      {"stdio", "stdio"},         {"root", "root"},         {"network", "network"},
      {"exec.groups", "groups"},  {"mounts[].fs", "mount_fs"}, {"hostname", "hostname"},
      {"on_exit.halt", "halt"},   {"entropy", "entropy"},   {"realtime_ns", "realtime"},
      {"root.fs", "root_block"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.ready);
    CAPTURE(c.field);
    SessionConfig cfg = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
    if (c.field == "stdio") cfg.descriptor.stdio = proto::Stdio{};
    if (c.field == "root") cfg.descriptor.root = proto::Root{"r"};
    if (c.field == "root.fs") cfg.descriptor.root = proto::Root{"disk0", false, proto::FsType::erofs, 64};
    if (c.field == "network") cfg.descriptor.network = proto::Network{};
    if (c.field == "exec.groups") cfg.descriptor.exec.groups = {10, 20};
    if (c.field == "mounts[].fs") cfg.descriptor.mounts.push_back(proto::Mount{"scratch", "/scratch", false, proto::FsType::tmpfs});
    if (c.field == "hostname") cfg.descriptor.hostname = "box";
    if (c.field == "on_exit.halt") cfg.descriptor.on_exit.halt = proto::Halt::reboot;
    if (c.field == "entropy") cfg.descriptor.entropy = proto::Entropy{};
    if (c.field == "realtime_ns") cfg.descriptor.realtime_ns = 1;
    Probe p(cfg);
    p.start();
    p.feed(c.ready);
    if (c.refused) {
      CHECK(p.outcome().outcome == proto::Outcome::version_mismatch);
      CHECK(p.outcome().exit_status == 125);
      CHECK(p.outcome().reason.find("lacks feature '" + feature_of.at(c.field) + "'") != std::string::npos);
      CHECK(p.outcome().reason.find("boot." + c.field) != std::string::npos);
      CHECK(p.sent.empty());  // no boot went out
      CHECK(p.closes == 1);
    } else {
      REQUIRE(p.sent.size() == 1);
      CHECK(std::holds_alternative<proto::Boot>(p.sent[0]));
    }
  }
  // Our init names them all: every one of these fields goes out to it.
  for (const auto& [field, feature] : feature_of) {
    CAPTURE(field);
    SessionConfig cfg = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
    cfg.descriptor.exec.groups = {10};
    cfg.descriptor.mounts.push_back(proto::Mount{"/srv", "/srv", true, proto::FsType::bind});
    cfg.descriptor.hostname = "box";
    cfg.descriptor.on_exit.halt = proto::Halt::reboot;
    cfg.descriptor.entropy = proto::Entropy{};
    cfg.descriptor.realtime_ns = 1;
    cfg.descriptor.root = proto::Root{"disk0", true, proto::FsType::ext4, 0, "scratch0"};
    Probe p(cfg);
    p.start();
    p.feed(test::ready_line());
    REQUIRE(p.sent.size() == 1);
    CHECK(std::holds_alternative<proto::Boot>(p.sent[0]));
  }
}

TEST_CASE("features: an exec with supplementary groups is refused by an init that lacks 'groups'") {
  Probe p;
  p.start();
  p.feed(R"({"type":"ready","protocol_version":2,"features":["stdio","exec"]})" "\n");
  REQUIRE(p.sent.size() == 1);
  proto::ExecProcess x = exec_of(1, false);
  x.exec.groups = {10};
  auto st = p.s.exec(x);
  REQUIRE_FALSE(st);
  CHECK(st.error().message.find("exec.groups: the guest's init does not implement supplementary groups") == 0);
  x.exec.groups.clear();
  CHECK(p.s.exec(x));  // without groups, as before
}

TEST_CASE("network_failed is a final outcome: 125, the reason names interface and step") {
  Probe p;
  p.start();
  p.feed(test::ready_line());
  p.feed(R"({"type":"network_failed","interface":"52:54:00:12:34:56","step":"route","reason":"0.0.0.0/0 via 10.0.2.2: Network is unreachable","errno":101})" "\n");
  CHECK(p.outcome().outcome == proto::Outcome::network_failed);
  CHECK(p.outcome().exit_status == 125);
  CHECK(p.outcome().reason == "network: 52:54:00:12:34:56 route (errno 101): 0.0.0.0/0 via 10.0.2.2: Network is unreachable");
}

// ---- fencing: the generation in every guest line after boot (docs/protocol.md "Fencing") ------

namespace {
std::string gen_line(const proto::GuestMessage& m, std::optional<std::uint64_t> gen) {
  return proto::encode_line(m, proto::GuestEnvelope{gen});
}
}  // namespace

TEST_CASE("fencing: boot names the generation even without a reconnect window") {
  Probe p;
  p.booted();
  auto b = boot_of(p.sent.at(0));
  CHECK(b.generation == 4u);
  CHECK(b.reconnect_ms == 0);
  CHECK_FALSE(b.vm);  // the names beyond the generation stay with channel survival
}

TEST_CASE("fencing: lines of this generation and lines without one (an older init) are taken") {
  Probe p;
  p.booted();
  p.feed(gen_line(proto::Mounted{}, 4));
  p.feed(gen_line(proto::Started{9}, std::nullopt));  // an init that predates the field
  CHECK(p.logged("started pid=9"));
  p.feed(gen_line(proto::WorkloadExited::code(7), 4));
  CHECK(p.outcome().exit_code == std::optional<std::uint8_t>(7));
  CHECK_FALSE(p.logged("generation_refused"));
}

TEST_CASE("fencing: a line of another generation is refused, nothing of it recorded, the stream closed") {
  SUBCASE("without a window: the stream's loss is the outcome, with the refusal as its reason") {
    Probe p;
    p.booted();
    p.feed(test::started_line(9));
    p.feed(gen_line(proto::WorkloadExited::code(7), 3));  // generation 3's report, on generation 4
    CHECK(p.logged("generation_refused line 3: workload_exited.generation: expected 4 (this session's), got 3"));
    CHECK(p.closes == 1);
    REQUIRE(p.writes.size() == 1);
    CHECK(p.outcome().outcome == proto::Outcome::channel_lost);  // not `exited 7`
    CHECK(p.outcome().reason.find("the host refused the guest's stream (generation_refused") != std::string::npos);
    p.feed(test::exited_line(7));  // nothing is read after the refusal
    CHECK(p.outcome().outcome == proto::Outcome::channel_lost);
  }
  SUBCASE("with a window: nothing decided; the right guest may come back and report") {
    SessionConfig c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
    c.reconnect = std::chrono::milliseconds(5000);
    Probe p(c);
    p.booted();
    p.feed(gen_line(proto::WorkloadExited::code(7), 5));  // a later generation's
    CHECK(p.logged("generation_refused"));
    CHECK(p.closes == 1);
    CHECK(p.writes.empty());
    CHECK(p.s.awaiting_redial());
    CHECK(p.s.stream_opened(p.t));
    p.reader = proto::LineReader(c.line_cap);
    p.feed(gen_line(proto::Ready{proto::kProtocolVersion, proto::Resume{"vm1", 4, true, false}, {}}, 4));
    CHECK(p.logged("resumed"));
    p.feed(gen_line(proto::WorkloadExited::code(3), 4));
    REQUIRE(p.writes.size() == 1);
    CHECK(p.outcome().exit_code == std::optional<std::uint8_t>(3));
  }
}

TEST_CASE("fencing: a resumed ready is judged by its resume; an envelope that contradicts it is refused") {
  SessionConfig c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
  c.resume = true;
  c.descriptor = {};
  {
    Probe p(c);  // generation 3's guest resuming with a host of generation 4: resume_refused
    p.start();
    p.feed(gen_line(proto::Ready{proto::kProtocolVersion, proto::Resume{"vm1", 3, true, true}, {}}, 3));
    CHECK(p.logged("resume_refused the guest resumes VM vm1 generation 3; this is VM vm1 generation 4"));
    CHECK_FALSE(p.logged("generation_refused"));
    CHECK(p.writes.empty());
  }
  {
    Probe p(c);  // its resume says 4, its envelope 3: not this session's
    p.start();
    p.feed(gen_line(proto::Ready{proto::kProtocolVersion, proto::Resume{"vm1", 4, true, true}, {}}, 3));
    CHECK(p.logged("generation_refused line 1: ready.generation: expected 4 (this session's), got 3"));
    CHECK_FALSE(p.logged("resumed"));
    CHECK(p.writes.empty());
  }
}

TEST_CASE("fencing: a malformed generation is a protocol error naming the field") {
  Probe p;
  p.booted();
  p.feed("{\"type\":\"started\",\"pid\":9,\"generation\":0}\n");
  CHECK(p.outcome().outcome == proto::Outcome::protocol_error);
  CHECK(p.outcome().reason == "line 2: started.generation: expected integer 1..9007199254740991, got 0");
}

TEST_CASE("survival: a resumed ready on the stream that carried the session (a virtio port) is a resume") {
  SessionConfig c = Probe::cfg(OnExitPolicy::keep, proto::kDefaultLineCap);
  c.reconnect = std::chrono::milliseconds(5000);
  Probe p(c);
  p.booted();
  p.feed(exited_line(5));
  p.durable();
  REQUIRE(p.s.shutdown(p.t));
  p.pump();
  CHECK(p.last_type() == "shutdown");  // the ack; the guest did not see it (it timed out first)
  const auto sent = p.sent.size();
  // The guest gave up waiting, reopened its port and resumes on the same host stream.
  p.feed(gen_line(proto::Ready{proto::kProtocolVersion, proto::Resume{"vm1", 4, true, true}, {}}, 4));
  CHECK(p.logged("resumed"));
  CHECK_FALSE(p.logged("guest_restarted"));
  // No boot and no `stop`: its outcome is pending and already durable here, so the ack goes out
  // at once (the guest takes any `shutdown` after its report as the ack).
  CHECK(p.sent.size() == sent + 1);
  CHECK(p.last_type() == "shutdown");
  p.feed(exited_line(5));  // the outcome again: recorded once, acknowledged once on this stream
  CHECK(p.sent.size() == sent + 1);
  CHECK(p.writes.size() == 1);
  // Another VM's resume on it: refused, the stream closed, nothing recorded.
  p.feed(gen_line(proto::Ready{proto::kProtocolVersion, proto::Resume{"vm2", 4, true, true}, {}}, 4));
  CHECK(p.logged("resume_refused"));
  CHECK(p.closes == 1);
  CHECK(p.writes.size() == 1);
}

TEST_CASE("a restored snapshot: the saved ready is the first stream's first line; realtime_ns stamped at send") {
  SessionConfig c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
  std::string saved = test::ready_line();
  saved.pop_back();  // without its '\n', as snapshot.json keeps it
  c.saved_ready = saved;
  c.descriptor.realtime_ns = 1;  // "stamp it"
  Probe p(c);
  p.s.vm_started(p.t);
  CHECK(p.s.stream_opened(p.t));  // no line from the guest: the saved one is taken
  p.pump();
  REQUIRE(p.sent.size() == 1);
  auto boot = boot_of(p.sent[0]);
  CHECK(boot.realtime_ns == std::optional<std::uint64_t>(static_cast<std::uint64_t>(p.t.time_since_epoch().count())));
  CHECK(std::count(p.cancelled.begin(), p.cancelled.end(), TimerKind::ready) == 1);
  // The guest goes on as after any boot.
  p.feed("{\"type\":\"mounted\"}\n");
  p.feed(test::started_line(7));
  p.feed(test::exited_line(5));
  REQUIRE(p.writes.size() == 1);
  CHECK(p.writes[0].exit_status == 5);
}

TEST_CASE("a restored snapshot whose saved ready is another version: refused, the stream closed at once") {
  SessionConfig c = Probe::cfg(OnExitPolicy::stop, proto::kDefaultLineCap);
  std::string saved = test::ready_line(1);
  saved.pop_back();
  c.saved_ready = saved;
  Probe p(c);
  p.s.vm_started(p.t);
  CHECK(!p.s.stream_opened(p.t));  // the saved line ended it
  p.pump();
  CHECK(p.outcome().outcome == proto::Outcome::version_mismatch);
  CHECK(p.sent.empty());
}
