// The session state machine driven directly: events in, actions out, for every path of the protocol
// and docs/protocol.md. No I/O, no clock: timers fire because the test says so.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <csignal>

#include "nesinit/session.hpp"
#include "tests/support/init_session.hpp"

using namespace nes::init;
using namespace nes::init::test;
namespace proto = nes::proto;

namespace {



std::vector<int> group_signals(const Actions& as) {
  std::vector<int> out;
  for (auto& s : only<act::SignalGroup>(as)) out.push_back(s.signo);
  return out;
}
std::vector<int> all_signals(const Actions& as) {
  std::vector<int> out;
  for (auto& s : only<act::SignalAll>(as)) out.push_back(s.signo);
  return out;
}
/// The halt the final act is asked for: `as` begins the final flush (act::Flush), and once the
/// loop reports nothing left to send, the session powers off (tested on its own below).
std::optional<proto::Halt> power_off(Session& s, const Actions& as) {
  if (only<act::Flush>(as).empty()) return std::nullopt;
  CHECK(only<act::PowerOff>(as).empty());  // never before the flush
  auto p = only<act::PowerOff>(s.handle(ev::Flushing{}));
  if (p.empty()) return std::nullopt;
  return p.front().halt;
}

proto::Boot make_boot(bool terminal = true) {
  proto::Boot b;
  b.exec.argv = {"/bin/true"};
  b.geometry = {1920, 1080, 60, false};
  b.on_exit.terminal = terminal;
  return b;
}


constexpr SessionOptions kOpt{1000, 300, 5000, proto::Halt::poweroff};

/// A session brought to `running` with workload pid 42.
Session running(bool terminal = true, SessionOptions o = kOpt) {
  Session s(o);
  s.handle(ev::ChannelUp{});
  s.handle(msg(make_boot(terminal)));
  s.handle(ev::MountsDone{});
  s.handle(ev::Started{42});
  REQUIRE(s.phase() == Phase::running);
  return s;
}

}  // namespace

TEST_CASE("happy path: ready, boot, mounted, started, workload_exited, ack, power-off") {
  Session s(kOpt);
  auto a = s.handle(ev::ChannelUp{});
  CHECK(sent(a) == std::vector<std::string>{"ready"});
  CHECK(armed(a, Timer::boot, 5000));
  CHECK(s.phase() == Phase::awaiting_boot);

  proto::Boot b = make_boot();
  b.mounts = {proto::Mount{"work", "/work", false, proto::FsType::virtiofs}};
  b.hostname = "web";
  a = s.handle(msg(b));
  CHECK(cancelled(a, Timer::boot));
  // Each action carries all the loop needs: it never reads the session's descriptor.
  auto m = only<act::Mount>(a);
  REQUIRE(m.size() == 1);
  CHECK(m[0].mounts == b.mounts);
  CHECK_FALSE(m[0].root);
  CHECK(sent(a).empty());
  CHECK(s.phase() == Phase::mounting);

  a = s.handle(ev::MountsDone{});
  CHECK(sent(a) == std::vector<std::string>{"mounted"});
  auto sp = only<act::Spawn>(a);
  REQUIRE(sp.size() == 1);
  CHECK(sp[0].exec == b.exec);
  CHECK(sp[0].geometry == b.geometry);
  CHECK(sp[0].hostname == std::optional<std::string>("web"));
  CHECK_FALSE(sp[0].stdio);

  a = s.handle(ev::Started{42});
  REQUIRE(only<act::Send>(a).size() == 1);
  CHECK(std::get<proto::Started>(only<act::Send>(a)[0].msg).pid == 42);
  CHECK(s.workload_alive());

  a = s.handle(ev::Exited{proto::WorkloadExited::code(3)});
  REQUIRE(only<act::Send>(a).size() == 1);
  CHECK(std::get<proto::WorkloadExited>(only<act::Send>(a)[0].msg) == proto::WorkloadExited::code(3));
  // Terminal: ordered shutdown begins; the workload is gone, so step 2 at once.
  CHECK(s.phase() == Phase::shutting_down);
  CHECK(group_signals(a).empty());
  CHECK(all_signals(a) == std::vector<int>{SIGTERM});
  CHECK(armed(a, Timer::ack, 300));
  CHECK(armed(a, Timer::all_grace, 1000));
  CHECK(!power_off(s, a));

  a = s.handle(ev::NoChildren{});
  CHECK(s.stage() == Stage::await_ack);
  CHECK(!power_off(s, a));  // not before the ack

  a = s.handle(msg(proto::Shutdown{}));
  CHECK(power_off(s, a) == proto::Halt::poweroff);
  CHECK(s.phase() == Phase::done);
  // Nothing after the final act.
  CHECK(s.handle(ev::Eof{}).empty());
  CHECK(s.handle(msg(proto::Stop{})).empty());
}

TEST_CASE("exactly one boot is acted on; a second is ignored and logged") {
  Session s = running();
  auto a = s.handle(msg(make_boot()));
  CHECK(only<act::Mount>(a).empty());
  CHECK(only<act::Spawn>(a).empty());
  CHECK(sent(a).empty());
  REQUIRE(only<act::Note>(a).size() == 1);
  CHECK(only<act::Note>(a)[0].severity == Severity::warn);
  CHECK(s.phase() == Phase::running);
}

TEST_CASE("unknown types are skipped; malformed lines get protocol_error and are not acted on") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  auto a = s.handle(ev::Message{proto::UnknownMessage{"resize"}});
  CHECK(sent(a).empty());
  CHECK(only<act::Note>(a).size() == 1);
  CHECK(s.phase() == Phase::awaiting_boot);

  a = s.handle(ev::Message{proto::DecodeError{"boot.exec.uid: expected u32"}});
  REQUIRE(only<act::Send>(a).size() == 1);
  CHECK(std::get<proto::ProtocolError>(only<act::Send>(a)[0].msg).reason == "boot.exec.uid: expected u32");
  CHECK(s.phase() == Phase::awaiting_boot);

  // Through the real codec: a line with a bad field, then an over-long line.
  a = s.handle(ev::Line{proto::Line{proto::Line::Kind::text, R"({"type":"kill","signal":0})", 26}});
  CHECK(sent(a) == std::vector<std::string>{"protocol_error"});
  a = s.handle(ev::Line{proto::Line{proto::Line::Kind::too_long, "", 2000000}});
  CHECK(sent(a) == std::vector<std::string>{"protocol_error"});
  a = s.handle(ev::Line{proto::Line{proto::Line::Kind::text, "not json", 8}});
  CHECK(sent(a) == std::vector<std::string>{"protocol_error"});
  CHECK(s.phase() == Phase::awaiting_boot);
  // A valid boot line through the codec is acted on.
  a = s.handle(ev::Line{proto::Line{proto::Line::Kind::text,
      R"({"type":"boot","exec":{"argv":["/bin/true"],"uid":0,"gid":0},"geometry":{"width":1,"height":2,"fps":3},"on_exit":{"terminal":false}})", 0}});
  CHECK(only<act::Mount>(a).size() == 1);
  REQUIRE(s.boot());
  CHECK(s.boot()->on_exit.terminal == false);
}

TEST_CASE("no boot within boot_timeout_ms: ordered shutdown, no ack wait") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  auto a = s.handle(ev::TimerFired{Timer::boot});
  CHECK(s.phase() == Phase::shutting_down);
  CHECK(all_signals(a) == std::vector<int>{SIGTERM});
  a = s.handle(ev::NoChildren{});
  CHECK(power_off(s, a) == proto::Halt::poweroff);
  CHECK(!s.outcome());
}

TEST_CASE("a stale timer (cancelled by boot) does nothing") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  s.handle(msg(make_boot()));
  CHECK(s.handle(ev::TimerFired{Timer::boot}).empty());
  CHECK(s.phase() == Phase::mounting);
}

TEST_CASE("EOF before boot: ordered shutdown") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  auto a = s.handle(ev::Eof{});
  CHECK(s.phase() == Phase::shutting_down);
  CHECK(!s.channel_open());
  a = s.handle(ev::NoChildren{});
  CHECK(power_off(s, a));
}

TEST_CASE("shutdown before boot: ordered shutdown, nothing to acknowledge") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  auto a = s.handle(msg(proto::Shutdown{}));
  CHECK(all_signals(a) == std::vector<int>{SIGTERM});
  a = s.handle(ev::NoChildren{});
  CHECK(power_off(s, a));
}

// ---- the first dial ------------------------------------------------------------------------------
namespace {
constexpr SessionOptions kDialOpt{1000, 300, 5000, proto::Halt::poweroff, 2000};

std::vector<std::string> notes(const Actions& as) {
  std::vector<std::string> out;
  for (auto& n : only<act::Note>(as)) out.push_back(n.phase + ": " + n.text);
  return out;
}
bool noted(const Actions& as, std::string_view text) {
  for (auto& n : notes(as))
    if (n.find(text) != std::string::npos) return true;
  return false;
}
/// The dial's end without a channel: no message, the ordered shutdown (nothing to wait for but
/// the other processes), then power-off.
void gives_up(Session& s, const Actions& a) {
  CHECK(sent(a).empty());
  CHECK_FALSE(s.dialling());
  CHECK(only<act::Dial>(a).empty());
  CHECK(s.phase() == Phase::shutting_down);
  CHECK(all_signals(a) == std::vector<int>{SIGTERM});
  CHECK(noted(a, "begin: no channel"));
  CHECK(power_off(s, s.handle(ev::NoChildren{})) == proto::Halt::poweroff);
}
}  // namespace

TEST_CASE("dial: the session starts it, arms its deadline and asks for one attempt") {
  Session s(kDialOpt);
  auto a = s.handle(ev::Start{"unix:/run/x.sock"});
  CHECK(s.dialling());
  CHECK(s.phase() == Phase::idle_before_channel);
  CHECK(armed(a, Timer::dial, 2000));
  auto d = only<act::Dial>(a);
  REQUIRE(d.size() == 1);
  CHECK(d[0].attempt_ms == 2000);  // the loop bounds it by the next timer: the deadline
  CHECK_FALSE(d[0].need_peer);     // a virtio port is taken before its host side connects
  CHECK(noted(a, "dial: unix:/run/x.sock (up to 2000 ms)"));
  CHECK(sent(a).empty());
  CHECK(s.handle(ev::Start{"unix:/run/x.sock"}).empty());  // once
}

TEST_CASE("dial: a retryable failure dials again after the backoff (10 ms doubling to 500 ms)") {
  Session s(kDialOpt);
  s.handle(ev::Start{"unix:/x"});
  std::vector<std::uint32_t> waits;
  for (int i = 0; i < 8; ++i) {
    auto f = s.handle(ev::DialFailed{"No such file or directory", true});
    CHECK(only<act::Dial>(f).empty());  // not before the backoff ends
    for (auto& t : only<act::ArmTimer>(f))
      if (t.timer == Timer::redial) waits.push_back(t.ms);
    auto again = only<act::Dial>(s.handle(ev::TimerFired{Timer::redial}));
    REQUIRE(again.size() == 1);
    CHECK_FALSE(again[0].need_peer);
  }
  CHECK(waits == std::vector<std::uint32_t>{10, 20, 40, 80, 160, 320, 500, 500});
  // Connected: the deadline and the backoff are cancelled; the session begins with ready.
  auto up = s.handle(ev::ChannelUp{});
  CHECK(sent(up) == std::vector<std::string>{"ready"});
  CHECK(cancelled(up, Timer::dial));
  CHECK(noted(up, "dial: unix:/x connected (attempt 9)"));
  CHECK_FALSE(s.dialling());
  CHECK(s.phase() == Phase::awaiting_boot);
  CHECK(s.handle(ev::TimerFired{Timer::dial}).empty());  // cancelled: a late expiry does nothing
}

TEST_CASE("dial: a failure that is not retryable gives up at once: ordered shutdown") {
  Session s(kDialOpt);
  s.handle(ev::Start{"unix:/x"});
  auto a = s.handle(ev::DialFailed{"Permission denied", false});
  CHECK(noted(a, "channel: dialling unix:/x failed: Permission denied"));
  CHECK(cancelled(a, Timer::dial));
  gives_up(s, a);
}

TEST_CASE("dial: the deadline gives up with the last attempt's error: ordered shutdown") {
  Session s(kDialOpt);
  s.handle(ev::Start{"unix:/x"});
  s.handle(ev::DialFailed{"No such file or directory"});
  s.handle(ev::TimerFired{Timer::redial});
  auto f = s.handle(ev::DialFailed{"Resource temporarily unavailable"});
  CHECK(armed(f, Timer::redial, 20));
  auto a = s.handle(ev::TimerFired{Timer::dial});
  CHECK(noted(a, "dialling unix:/x failed: Resource temporarily unavailable"));
  CHECK(cancelled(a, Timer::redial));  // no attempt after the deadline
  gives_up(s, a);
  CHECK(only<act::Dial>(s.handle(ev::TimerFired{Timer::redial})).empty());
}

TEST_CASE("dial: SIGTERM, SIGINT or SIGPWR before the channel is up abandons it: ordered shutdown") {
  for (int sig : {SIGTERM, SIGINT, SIGPWR}) {
    CAPTURE(sig);
    Session s(kDialOpt);
    s.handle(ev::Start{"unix:/x"});
    s.handle(ev::DialFailed{"Connection refused"});  // in the backoff
    auto a = s.handle(ev::Signal{sig});
    CHECK(noted(a, fmt::format("dialling unix:/x abandoned: signal {}", sig)));
    CHECK(cancelled(a, Timer::dial));
    CHECK(cancelled(a, Timer::redial));
    gives_up(s, a);
    // A channel that connects anyway (the attempt was under way) changes nothing.
    CHECK(sent(s.handle(ev::ChannelUp{})).empty());
  }
}

TEST_CASE("dial: other signals before the channel is up are dropped; dialling goes on") {
  Session s(kDialOpt);
  s.handle(ev::Start{"unix:/x"});
  for (int sig : {SIGHUP, SIGUSR1, SIGWINCH, SIGCHLD, SIGTTIN}) {
    auto a = s.handle(ev::Signal{sig});
    CHECK(group_signals(a).empty());  // no workload yet
    CHECK(only<act::Dial>(a).empty());
    CHECK(s.dialling());
  }
  // An attempt a signal cut short is retryable (ECANCELED): the backoff, then the next attempt.
  CHECK(armed(s.handle(ev::DialFailed{"Operation canceled", true}), Timer::redial, 10));
  CHECK(only<act::Dial>(s.handle(ev::TimerFired{Timer::redial})).size() == 1);
  CHECK(sent(s.handle(ev::ChannelUp{})) == std::vector<std::string>{"ready"});
}

TEST_CASE("redial: its attempts are short and need the port's host side (need_peer)") {
  Session s(kDialOpt);
  s.handle(ev::Start{"unix:/x"});
  s.handle(ev::ChannelUp{});
  auto b = make_boot();
  b.reconnect_ms = 4000;
  s.handle(msg(b));
  s.handle(ev::MountsDone{});
  s.handle(ev::Started{42});
  auto d = only<act::Dial>(s.handle(ev::Eof{}));
  REQUIRE(d.size() == 1);
  CHECK(d[0].attempt_ms == kRedialAttemptMs);
  CHECK(d[0].need_peer);
  // A failure that would end the first dial does not end a redial: the window bounds it.
  auto f = s.handle(ev::DialFailed{"Permission denied", false});
  CHECK(armed(f, Timer::redial, 10));
  CHECK(s.reconnecting());
}

TEST_CASE("warm start: boot.entropy and boot.realtime_ns are one act::Seed, before the data channel and the shares") {
  auto first = [](const Actions& as, auto pick) {
    for (std::size_t i = 0; i < as.size(); ++i)
      if (pick(as[i])) return static_cast<int>(i);
    return -1;
  };
  auto is_seed = [](const Action& x) { return std::holds_alternative<act::Seed>(x); };
  proto::Boot b = make_boot();
  b.mounts = {proto::Mount{"work", "/work", false, proto::FsType::virtiofs}};
  b.entropy = proto::Entropy{};
  (*b.entropy)[0] = 7;
  (*b.entropy)[31] = 9;
  b.realtime_ns = 1765000000123456789ull;
  {
    Session s(kOpt);
    s.handle(ev::ChannelUp{});
    auto a = s.handle(msg(b));
    auto sd = only<act::Seed>(a);
    REQUIRE(sd.size() == 1);
    CHECK(sd[0].entropy == b.entropy);
    CHECK(sd[0].realtime_ns == b.realtime_ns);
    const int mount = first(a, [](const Action& x) { return std::holds_alternative<act::Mount>(x); });
    REQUIRE(mount >= 0);
    CHECK(first(a, is_seed) < mount);
    CHECK(s.phase() == Phase::mounting);
    // Nothing comes back from it: the shares' result goes on as without it.
    CHECK(sent(s.handle(ev::MountsDone{})) == std::vector<std::string>{"mounted"});
  }
  {  // with stdio, before the data channel's dial; each field alone
    proto::Boot e = make_boot();
    e.stdio = proto::Stdio{};
    e.realtime_ns = 5;
    Session s(kOpt);
    s.handle(ev::ChannelUp{});
    auto a = s.handle(msg(e));
    auto sd = only<act::Seed>(a);
    REQUIRE(sd.size() == 1);
    CHECK_FALSE(sd[0].entropy);
    CHECK(sd[0].realtime_ns == std::optional<std::uint64_t>(5));
    const int dial = first(a, [](const Action& x) { return std::holds_alternative<act::DialData>(x); });
    REQUIRE(dial >= 0);
    CHECK(first(a, is_seed) < dial);
  }
  {  // neither: no Seed
    Session s(kOpt);
    s.handle(ev::ChannelUp{});
    CHECK(only<act::Seed>(s.handle(msg(make_boot()))).empty());
  }
  {  // a sandbox: the kernel's pool and clock are the machine's: skipped, the boot goes on
    SessionOptions o = kOpt;
    o.may_seed = false;
    Session s(o);
    s.handle(ev::ChannelUp{});
    auto a = s.handle(msg(b));
    CHECK(only<act::Seed>(a).empty());
    CHECK(only<act::Mount>(a).size() == 1);
    CHECK(sent(a).empty());
  }
}

TEST_CASE("a sandbox: a root share is mount_failed (EPERM); a hostname is skipped with a warning") {
  SessionOptions o = kOpt;
  o.may_switch_root = false;
  o.may_set_hostname = false;
  Session s(o);
  s.handle(ev::ChannelUp{});
  proto::Boot b = make_boot();
  b.root = proto::Root{"rootfs", true};
  auto a = s.handle(msg(b));
  CHECK(only<act::Mount>(a).empty());  // nothing is mounted
  REQUIRE(sent(a) == std::vector<std::string>{"mount_failed"});
  auto f = std::get<proto::MountFailed>(only<act::Send>(a)[0].msg);
  CHECK(f.err == EPERM);
  CHECK(f.tag == std::optional<std::string>("rootfs"));

  Session h(o);
  h.handle(ev::ChannelUp{});
  proto::Boot hb = make_boot();
  hb.hostname = "web";
  h.handle(msg(hb));
  auto m = h.handle(ev::MountsDone{});
  auto sp = only<act::Spawn>(m);
  REQUIRE(sp.size() == 1);
  CHECK_FALSE(sp[0].hostname);
  CHECK(noted(m, "'web' not set"));
}

TEST_CASE("EOF while the workload runs: its one SIGTERM, then ordered shutdown") {
  Session s = running();
  auto a = s.handle(ev::Eof{});
  CHECK(group_signals(a) == std::vector<int>{SIGTERM});
  CHECK(only<act::SignalGroup>(a).at(0).pgid == 42);  // the workload's group, from `started`
  CHECK(armed(a, Timer::workload_grace, 1000));
  CHECK(all_signals(a).empty());
  a = s.handle(ev::Exited{proto::WorkloadExited::killed(15)});
  CHECK(sent(a).empty());  // nobody to send to, but the outcome is recorded
  REQUIRE(s.outcome());
  CHECK(std::get<proto::WorkloadExited>(*s.outcome()) == proto::WorkloadExited::killed(15));
  CHECK(all_signals(a) == std::vector<int>{SIGTERM});
  a = s.handle(ev::NoChildren{});
  CHECK(power_off(s, a));  // EOF: nobody left to acknowledge
}

TEST_CASE("at most one SIGTERM: stop, stop, kill{15}, shutdown and EOF share it") {
  Session s = running();
  auto a = s.handle(msg(proto::Stop{}));
  CHECK(group_signals(a) == std::vector<int>{SIGTERM});
  CHECK(armed(a, Timer::workload_grace, 1000));
  CHECK(s.term_sent());
  CHECK(group_signals(s.handle(msg(proto::Stop{}))).empty());
  CHECK(group_signals(s.handle(msg(proto::Kill{15}))).empty());
  a = s.handle(msg(proto::Shutdown{}));
  CHECK(group_signals(a).empty());  // still waiting out the first SIGTERM's grace
  CHECK(s.stage() == Stage::workload_term);
  CHECK(group_signals(s.handle(ev::Signal{SIGTERM})).empty());
  CHECK(group_signals(s.handle(ev::Eof{})).empty());
  // Grace over: SIGKILL, never a second SIGTERM.
  a = s.handle(ev::TimerFired{Timer::workload_grace});
  CHECK(group_signals(a) == std::vector<int>{SIGKILL});
  CHECK(armed(a, Timer::workload_kill, kKillWaitMs));
  a = s.handle(ev::Exited{proto::WorkloadExited::killed(9)});
  CHECK(cancelled(a, Timer::workload_kill));
  CHECK(all_signals(a) == std::vector<int>{SIGTERM});
}

TEST_CASE("grace runs from the first SIGTERM: expired before shutdown means SIGKILL at once") {
  Session s = running();
  s.handle(msg(proto::Stop{}));
  auto a = s.handle(ev::TimerFired{Timer::workload_grace});
  CHECK(group_signals(a).empty());  // not shutting down: stop is SIGTERM only
  CHECK(s.phase() == Phase::running);
  a = s.handle(msg(proto::Shutdown{}));
  CHECK(group_signals(a) == std::vector<int>{SIGKILL});
  CHECK(s.stage() == Stage::workload_kill);
}

TEST_CASE("shutdown while running: SIGTERM, workload exits, report, ack wait, power-off") {
  Session s = running();
  auto a = s.handle(msg(proto::Shutdown{}));
  CHECK(group_signals(a) == std::vector<int>{SIGTERM});
  a = s.handle(ev::Exited{proto::WorkloadExited::killed(15)});
  CHECK(sent(a) == std::vector<std::string>{"workload_exited"});
  CHECK(armed(a, Timer::ack, 300));
  a = s.handle(ev::NoChildren{});
  CHECK(!power_off(s, a));
  // A shutdown sent before the outcome is not its ack; the next one is.
  a = s.handle(msg(proto::Shutdown{}));
  CHECK(power_off(s, a));
}

TEST_CASE("workload that survives SIGKILL: the shutdown goes on without it") {
  Session s = running();
  s.handle(msg(proto::Shutdown{}));
  s.handle(ev::TimerFired{Timer::workload_grace});
  auto a = s.handle(ev::TimerFired{Timer::workload_kill});
  CHECK(all_signals(a) == std::vector<int>{SIGTERM});
  CHECK(s.stage() == Stage::all_term);
}

TEST_CASE("stragglers: kill(-1, SIGTERM), grace, kill(-1, SIGKILL), bounded wait") {
  Session s = running();
  s.handle(ev::Exited{proto::WorkloadExited::code(0)});
  CHECK(s.stage() == Stage::all_term);
  auto a = s.handle(ev::TimerFired{Timer::all_grace});
  CHECK(all_signals(a) == std::vector<int>{SIGKILL});
  CHECK(armed(a, Timer::all_kill, kKillWaitMs));
  CHECK(s.stage() == Stage::all_kill);
  a = s.handle(ev::TimerFired{Timer::all_kill});
  CHECK(s.stage() == Stage::await_ack);
  a = s.handle(ev::TimerFired{Timer::ack});
  CHECK(power_off(s, a));
}

TEST_CASE("ack: power-off after ack_timeout_ms without the host's shutdown") {
  Session s = running();
  s.handle(ev::Exited{proto::WorkloadExited::code(1)});
  s.handle(ev::NoChildren{});
  CHECK(s.stage() == Stage::await_ack);
  auto a = s.handle(ev::TimerFired{Timer::ack});
  CHECK(power_off(s, a));
}

TEST_CASE("ack: EOF counts as the acknowledgement") {
  Session s = running();
  s.handle(ev::Exited{proto::WorkloadExited::code(1)});
  s.handle(ev::NoChildren{});
  auto a = s.handle(ev::Eof{});
  CHECK(power_off(s, a));
}

TEST_CASE("ack: arriving before the stragglers are gone, power-off waits for them") {
  Session s = running();
  s.handle(ev::Exited{proto::WorkloadExited::code(1)});
  auto a = s.handle(msg(proto::Shutdown{}));
  CHECK(cancelled(a, Timer::ack));
  CHECK(!power_off(s, a));
  CHECK(s.stage() == Stage::all_term);
  a = s.handle(ev::NoChildren{});
  CHECK(power_off(s, a));
}

TEST_CASE("not terminal: stay up after the exit, until shutdown (which is also the ack)") {
  Session s = running(false);
  auto a = s.handle(ev::Exited{proto::WorkloadExited::code(7)});
  CHECK(sent(a) == std::vector<std::string>{"workload_exited"});
  CHECK(s.phase() == Phase::settled);
  CHECK(all_signals(a).empty());
  CHECK(only<act::ArmTimer>(a).empty());
  // Stray lines change nothing.
  CHECK(sent(s.handle(msg(proto::Stop{}))).empty());
  CHECK(s.phase() == Phase::settled);
  a = s.handle(msg(proto::Shutdown{}));
  CHECK(all_signals(a) == std::vector<int>{SIGTERM});
  a = s.handle(ev::NoChildren{});
  CHECK(power_off(s, a));
}

TEST_CASE("mount_failed: nothing starts; terminal shuts down, not terminal waits") {
  for (bool terminal : {true, false}) {
    CAPTURE(terminal);
    Session s(kOpt);
    s.handle(ev::ChannelUp{});
    s.handle(msg(make_boot(terminal)));
    auto a = s.handle(ev::MountFailed{proto::MountFailed{"work", "mount virtiofs work on /w: ENODEV", 19}});
    CHECK(sent(a) == std::vector<std::string>{"mount_failed"});
    CHECK(only<act::Spawn>(a).empty());
    CHECK(s.phase() == (terminal ? Phase::shutting_down : Phase::settled));
    // A late MountsDone (impossible in the loop) would not start anything either.
    CHECK(only<act::Spawn>(s.handle(ev::MountsDone{})).empty());
  }
}

TEST_CASE("start_failed: reported, no workload_exited follows, terminal shuts down") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  s.handle(msg(make_boot()));
  s.handle(ev::MountsDone{});
  auto a = s.handle(ev::StartFailed{proto::StartFailed{"execve /nonexistent: ENOENT", 2,
                                                      proto::StartFailClass::not_found}});
  CHECK(sent(a) == std::vector<std::string>{"start_failed"});
  CHECK(!s.workload_alive());
  CHECK(s.phase() == Phase::shutting_down);
  CHECK(sent(s.handle(ev::Exited{proto::WorkloadExited::code(127)})).empty());
  REQUIRE(s.outcome());
  CHECK(std::holds_alternative<proto::StartFailed>(*s.outcome()));
}

TEST_CASE("outcome finality: the first final event stands") {
  Session s = running();
  s.handle(ev::Exited{proto::WorkloadExited::code(0)});
  s.handle(ev::Exited{proto::WorkloadExited::code(1)});
  s.handle(ev::StartFailed{proto::StartFailed{"x", 1, proto::StartFailClass::other}});
  s.handle(msg(make_boot()));
  REQUIRE(s.outcome());
  CHECK(std::get<proto::WorkloadExited>(*s.outcome()) == proto::WorkloadExited::code(0));
}

TEST_CASE("signals to PID 1: shutdown set, forwarded set, the rest ignored") {
  for (int sig : {SIGTERM, SIGINT, SIGPWR}) {
    CAPTURE(sig);
    Session s = running();
    auto a = s.handle(ev::Signal{sig});
    CHECK(s.phase() == Phase::shutting_down);
    CHECK(group_signals(a) == std::vector<int>{SIGTERM});
  }
  for (int sig : {SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH, SIGCONT}) {
    CAPTURE(sig);
    Session s = running();
    CHECK(group_signals(s.handle(ev::Signal{sig})) == std::vector<int>{sig});
    CHECK(s.phase() == Phase::running);
    Session idle(kOpt);
    idle.handle(ev::ChannelUp{});
    CHECK(group_signals(idle.handle(ev::Signal{sig})).empty());
  }
  for (int sig : {SIGTSTP, SIGTTIN, SIGTTOU, SIGPIPE, SIGALRM, SIGRTMIN + 3}) {
    CAPTURE(sig);
    Session s = running();
    auto a = s.handle(ev::Signal{sig});
    CHECK(group_signals(a).empty());
    CHECK(all_signals(a).empty());
    CHECK(s.phase() == Phase::running);
  }
}

TEST_CASE("kill{signal}: to the group while running; nothing before start or after exit") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  CHECK(group_signals(s.handle(msg(proto::Kill{9}))).empty());
  Session r = running(false);
  CHECK(group_signals(r.handle(msg(proto::Kill{10}))) == std::vector<int>{10});
  CHECK(group_signals(r.handle(msg(proto::Kill{9}))) == std::vector<int>{9});
  r.handle(ev::Exited{proto::WorkloadExited::killed(9)});
  CHECK(group_signals(r.handle(msg(proto::Kill{9}))).empty());
  CHECK(group_signals(r.handle(msg(proto::Stop{}))).empty());
}

TEST_CASE("halt: the descriptor's on_exit.halt wins over the configuration") {
  SessionOptions o = kOpt;
  o.halt = proto::Halt::reboot;
  {
    Session s(o);  // no descriptor: the configuration
    s.handle(ev::ChannelUp{});
    s.handle(ev::Eof{});
    CHECK(power_off(s, s.handle(ev::NoChildren{})) == proto::Halt::reboot);
  }
  Session s(o);
  s.handle(ev::ChannelUp{});
  proto::Boot b = make_boot();
  b.on_exit.halt = proto::Halt::poweroff;
  s.handle(msg(b));
  s.handle(ev::MountsDone{});
  s.handle(ev::Started{9});
  s.handle(ev::Exited{proto::WorkloadExited::code(0)});
  s.handle(ev::NoChildren{});
  CHECK(power_off(s, s.handle(msg(proto::Shutdown{}))) == proto::Halt::poweroff);
}

TEST_CASE("a workload that exits before started is sent: started, then workload_exited") {
  // The loop registers the pid before it can reap, so the events always come in this order.
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  s.handle(msg(make_boot()));
  s.handle(ev::MountsDone{});
  auto a1 = s.handle(ev::Started{5});
  auto a2 = s.handle(ev::Exited{proto::WorkloadExited::code(0)});
  CHECK(sent(a1) == std::vector<std::string>{"started"});
  CHECK(sent(a2) == std::vector<std::string>{"workload_exited"});
}

TEST_CASE("every exit code and signal is reported as it came") {
  for (int c = 0; c <= 255; ++c) {
    Session s = running();
    auto a = s.handle(ev::Exited{proto::WorkloadExited::code(static_cast<std::uint8_t>(c))});
    REQUIRE(only<act::Send>(a).size() == 1);
    CHECK(std::get<proto::WorkloadExited>(only<act::Send>(a)[0].msg).exit_code == c);
  }
  for (int sig = 1; sig <= 64; ++sig) {
    Session s = running();
    auto a = s.handle(ev::Exited{proto::WorkloadExited::killed(static_cast<std::uint8_t>(sig))});
    auto w = std::get<proto::WorkloadExited>(only<act::Send>(a)[0].msg);
    CHECK(w.signal == sig);
    CHECK(!w.exit_code);
  }
}

// ---- channel survival (boot.reconnect_ms) ------------------------------------------------------

namespace {
Session surviving(std::uint32_t window = 4000, bool terminal = true) {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  proto::Boot b = make_boot(terminal);
  b.reconnect_ms = window;
  b.vm = "web";
  b.generation = 3;
  s.handle(msg(b));
  s.handle(ev::MountsDone{});
  s.handle(ev::Started{42});
  REQUIRE(s.phase() == Phase::running);
  return s;
}
std::optional<proto::Resume> resume_of(const Actions& as) {
  for (auto& snd : only<act::Send>(as))
    if (auto* r = std::get_if<proto::Ready>(&snd.msg)) return r->resume;
  return std::nullopt;
}
}  // namespace

TEST_CASE("survival: EOF while running leaves the workload alone and redials with backoff") {
  Session s = surviving();
  auto a = s.handle(ev::Eof{});
  CHECK(group_signals(a).empty());
  CHECK(s.reconnecting());
  CHECK(s.phase() == Phase::running);
  CHECK(armed(a, Timer::reconnect, 4000));
  CHECK(only<act::Dial>(a).size() == 1);
  // A failed attempt arms the backoff, 10 ms doubling to 500 ms; each expiry dials once more.
  std::vector<std::uint32_t> waits;
  for (int i = 0; i < 8; ++i) {
    auto f = s.handle(ev::DialFailed{"unix:/x: Connection refused"});
    for (auto& t : only<act::ArmTimer>(f))
      if (t.timer == Timer::redial) waits.push_back(t.ms);
    CHECK(only<act::Dial>(s.handle(ev::TimerFired{Timer::redial})).size() == 1);
  }
  CHECK(waits == std::vector<std::uint32_t>{10, 20, 40, 80, 160, 320, 500, 500});
  // Back: a resumed ready with the host's names, nothing else owed.
  auto up = s.handle(ev::ChannelUp{});
  CHECK(sent(up) == std::vector<std::string>{"ready"});
  auto r = resume_of(up);
  REQUIRE(r);
  CHECK(*r == proto::Resume{"web", 3, true, false});
  CHECK(cancelled(up, Timer::reconnect));
  CHECK_FALSE(s.reconnecting());
  CHECK(group_signals(up).empty());
  // The session goes on as before.
  auto x = s.handle(ev::Exited{proto::WorkloadExited::code(7)});
  CHECK(sent(x) == std::vector<std::string>{"workload_exited"});
}

TEST_CASE("survival: an outcome reached while the channel is down is re-sent after the resumed ready") {
  Session s = surviving();
  s.handle(ev::Eof{});
  auto x = s.handle(ev::Exited{proto::WorkloadExited::code(7)});
  CHECK(sent(x).empty());  // nobody to send it to
  s.handle(ev::NoChildren{});
  CHECK(s.stage() == Stage::await_ack);
  CHECK_FALSE(power_off(s, x));
  auto up = s.handle(ev::ChannelUp{});
  CHECK(sent(up) == std::vector<std::string>{"ready", "workload_exited"});
  CHECK(resume_of(up)->outcome_pending);
  CHECK(armed(up, Timer::ack, kOpt.ack_timeout_ms));
  // Lost again before the ack: survived again; the ack then ends it.
  auto e2 = s.handle(ev::Eof{});
  CHECK(s.reconnecting());
  CHECK_FALSE(power_off(s, e2));
  auto up2 = s.handle(ev::ChannelUp{});
  CHECK(sent(up2) == std::vector<std::string>{"ready", "workload_exited"});
  CHECK(power_off(s, s.handle(msg(proto::Shutdown{}))) == proto::Halt::poweroff);
}

TEST_CASE("survival: the window over is today's shutdown; window 0 is today's behaviour") {
  Session s = surviving(2000);
  s.handle(ev::Eof{});
  auto w = s.handle(ev::TimerFired{Timer::reconnect});
  CHECK(group_signals(w) == std::vector<int>{SIGTERM});
  CHECK(s.phase() == Phase::shutting_down);
  CHECK(only<act::Dial>(s.handle(ev::TimerFired{Timer::redial})).empty());  // no more attempts

  Session z = surviving(0);
  auto e = z.handle(ev::Eof{});
  CHECK(group_signals(e) == std::vector<int>{SIGTERM});
  CHECK(only<act::Dial>(e).empty());
  CHECK_FALSE(z.reconnecting());
}

TEST_CASE("survival: not after the host's shutdown, not after the ack, not before boot") {
  Session s = surviving();
  s.handle(ev::Exited{proto::WorkloadExited::code(0)});
  s.handle(ev::NoChildren{});
  s.handle(msg(proto::Shutdown{}));  // the ack: the final flush already
  CHECK(s.stage() == Stage::flush);

  Session k = surviving(4000, false);
  k.handle(ev::Exited{proto::WorkloadExited::code(0)});
  CHECK(k.phase() == Phase::settled);
  k.handle(msg(proto::Shutdown{}));
  k.handle(ev::Eof{});
  CHECK_FALSE(k.reconnecting());

  Session b(kOpt);
  b.handle(ev::ChannelUp{});
  auto eb = b.handle(ev::Eof{});
  CHECK_FALSE(b.reconnecting());
  CHECK(only<act::Dial>(eb).empty());
  CHECK(b.phase() == Phase::shutting_down);
}

TEST_CASE("survival: SIGTERM to PID 1 while redialling still shuts down in order") {
  Session s = surviving();
  s.handle(ev::Eof{});
  auto t = s.handle(ev::Signal{SIGTERM});
  CHECK(group_signals(t) == std::vector<int>{SIGTERM});
  auto x = s.handle(ev::Exited{proto::WorkloadExited::killed(SIGTERM)});
  s.handle(ev::NoChildren{});
  CHECK(s.stage() == Stage::await_ack);  // the outcome is owed: the window bounds the wait
  auto over = s.handle(ev::TimerFired{Timer::reconnect});
  CHECK(power_off(s, over));
}

TEST_CASE("fencing: every line after boot names the boot's generation; none before it") {
  Session s(kOpt);
  auto up = s.handle(ev::ChannelUp{});
  REQUIRE(only<act::Send>(up).size() == 1);
  CHECK_FALSE(only<act::Send>(up)[0].generation);  // the first ready: no boot yet
  proto::Boot b = make_boot();
  b.reconnect_ms = 4000;
  b.vm = "web";
  b.generation = 3;
  s.handle(msg(b));
  Actions all = s.handle(ev::MountsDone{});
  for (auto& a : s.handle(ev::Started{42})) all.push_back(a);
  for (auto& a : s.handle(msg(proto::ListProcesses{}))) all.push_back(a);
  for (auto& a : s.handle(ev::ProcessList{})) all.push_back(a);
  for (auto& a : s.handle(ev::Eof{})) all.push_back(a);
  for (auto& a : s.handle(ev::ChannelUp{})) all.push_back(a);  // the resumed ready
  for (auto& a : s.handle(ev::Exited{proto::WorkloadExited::code(7)})) all.push_back(a);
  CHECK(sent(all) == std::vector<std::string>{"mounted", "started", "processes", "ready", "workload_exited"});
  for (auto& snd : only<act::Send>(all)) CHECK(snd.generation == std::optional<std::uint64_t>(3));
  // A boot without a generation (an older host): nothing is added.
  Session o = running();
  auto x = o.handle(ev::Exited{proto::WorkloadExited::code(1)});
  REQUIRE(only<act::Send>(x).size() == 1);
  CHECK_FALSE(only<act::Send>(x)[0].generation);
}

TEST_CASE("survival: an ack timeout within the window is a loss: close, redial, ready + the outcome, until acked") {
  Session s = surviving(4000);
  auto x = s.handle(ev::Exited{proto::WorkloadExited::code(7)});
  CHECK(sent(x) == std::vector<std::string>{"workload_exited"});
  CHECK(armed(x, Timer::ack, kOpt.ack_timeout_ms));
  s.handle(ev::NoChildren{});
  CHECK(s.stage() == Stage::await_ack);
  // The host stalls past the ack timeout (its record write is slow, or it is dying).
  auto t1 = s.handle(ev::TimerFired{Timer::ack});
  CHECK(only<act::Flush>(t1).empty());     // not today's power-off
  CHECK(only<act::CloseChannel>(t1).size() == 1);
  CHECK(only<act::Dial>(t1).size() == 1);  // redial at once
  CHECK(armed(t1, Timer::ack_window, 4000));
  CHECK(armed(t1, Timer::reconnect, 4000));
  CHECK_FALSE(s.channel_open());
  CHECK(s.reconnecting());
  CHECK(s.handle(ev::Eof{}).empty());  // the closed channel's EOF is no second loss
  CHECK(s.reconnecting());
  // Whichever host answers gets the resumed ready and the outcome again.
  auto up = s.handle(ev::ChannelUp{});
  CHECK(sent(up) == std::vector<std::string>{"ready", "workload_exited"});
  CHECK(*resume_of(up) == proto::Resume{"web", 3, true, true});
  CHECK(armed(up, Timer::ack, kOpt.ack_timeout_ms));
  // It stalls too: again a loss; the window still runs from the first timeout (not re-armed).
  auto t2 = s.handle(ev::TimerFired{Timer::ack});
  CHECK(only<act::CloseChannel>(t2).size() == 1);
  CHECK_FALSE(armed(t2, Timer::ack_window, 4000));
  auto up2 = s.handle(ev::ChannelUp{});
  CHECK(sent(up2) == std::vector<std::string>{"ready", "workload_exited"});
  // A host acknowledges: the window is cancelled, the final flush, power-off.
  auto ack = s.handle(msg(proto::Shutdown{}));
  CHECK(cancelled(ack, Timer::ack_window));
  CHECK(power_off(s, ack) == proto::Halt::poweroff);
}

TEST_CASE("survival: the outcome kept for the whole window and never acknowledged: today's power-off") {
  {
    Session s = surviving(4000);  // the window ends while redialling
    s.handle(ev::Exited{proto::WorkloadExited::code(7)});
    s.handle(ev::NoChildren{});
    s.handle(ev::TimerFired{Timer::ack});
    REQUIRE(s.reconnecting());
    auto over = s.handle(ev::TimerFired{Timer::ack_window});
    CHECK_FALSE(s.reconnecting());
    CHECK(power_off(s, over) == proto::Halt::poweroff);
  }
  {
    Session s = surviving(4000);  // ... or while connected to a host that never acknowledges
    s.handle(ev::Exited{proto::WorkloadExited::code(7)});
    s.handle(ev::NoChildren{});
    s.handle(ev::TimerFired{Timer::ack});
    s.handle(ev::ChannelUp{});
    auto over = s.handle(ev::TimerFired{Timer::ack_window});
    CHECK(power_off(s, over) == proto::Halt::poweroff);
  }
  {
    Session z = surviving(0);  // window 0: the ack timeout powers off, as before
    z.handle(ev::Exited{proto::WorkloadExited::code(7)});
    z.handle(ev::NoChildren{});
    auto t = z.handle(ev::TimerFired{Timer::ack});
    CHECK(only<act::CloseChannel>(t).empty());
    CHECK(power_off(z, t) == proto::Halt::poweroff);
  }
}

namespace {
/// A session whose workload exited 0 and whose outcome the host acknowledged: the final flush.
Session flushing(Actions* began = nullptr) {
  Session s = running();
  s.handle(ev::Exited{proto::WorkloadExited::code(0)});
  s.handle(ev::NoChildren{});
  Actions a = s.handle(msg(proto::Shutdown{}));
  REQUIRE(s.stage() == Stage::flush);
  if (began) *began = a;
  return s;
}
bool warned(const Actions& as, std::string_view text) {
  for (auto& n : only<act::Note>(as))
    if (n.severity == Severity::warn && n.text.find(text) != std::string::npos) return true;
  return false;
}
}  // namespace

TEST_CASE("final flush: acknowledged, it waits for the receipt with no deadline while the host is connected") {
  Actions a;
  Session s = flushing(&a);
  CHECK(only<act::Flush>(a).size() == 1);
  CHECK(only<act::ArmTimer>(a).empty());  // a live host is never timed out
  ev::Flushing f;
  f.data_open = true;
  f.data_unsent = true;
  f.output_bytes = 1 << 20;
  for (int i = 0; i < 50; ++i) {  // a slow reader: no progress, many rounds
    a = s.handle(f);
    CHECK(only<act::ArmTimer>(a).empty());
    CHECK(only<act::PowerOff>(a).empty());
  }
  f.written = 65536;  // progress re-arms nothing either
  CHECK(only<act::ArmTimer>(s.handle(f)).empty());
  // The receipt after every byte: power-off, nothing lost.
  ev::Flushing done;
  done.data_open = true;
  done.outputs_done = true;
  done.receipt = true;
  done.out = {8 << 20, 0, true};
  done.err = {0, 0, true};
  a = s.handle(done);
  CHECK(only<act::PowerOff>(a).size() == 1);
  CHECK(sent(a).empty());
}

TEST_CASE("final flush: the host hangs up while its receipt is awaited: bounded from then on") {
  Session s = flushing();
  ev::Flushing f;
  f.data_open = true;
  f.data_unsent = true;
  f.output_bytes = 4096;
  f.channel_open = false;
  auto a = s.handle(f);
  CHECK(warned(a, "hung up"));
  CHECK(armed(a, Timer::flush_idle, kFlushIdleMs));
  CHECK(armed(a, Timer::flush_cap, kFlushMaxMs));
  a = s.handle(ev::TimerFired{Timer::flush_idle});
  CHECK(only<act::PowerOff>(a).size() == 1);
  CHECK(warned(a, "4096 byte(s) of the workload's output not sent"));
}

TEST_CASE("final flush: unacknowledged, timed by the session; the receipt ends it") {
  Actions a;
  Session s = running();
  s.handle(ev::Exited{proto::WorkloadExited::code(0)});
  s.handle(ev::NoChildren{});
  a = s.handle(ev::TimerFired{Timer::ack});  // nobody acknowledged the outcome
  REQUIRE(s.stage() == Stage::flush);
  CHECK(only<act::Flush>(a).size() == 1);
  CHECK(only<act::PowerOff>(a).empty());
  CHECK(armed(a, Timer::flush_idle, kFlushIdleMs));
  CHECK(armed(a, Timer::flush_cap, kFlushMaxMs));
  // The session's past is over: nothing else is acted on now.
  CHECK(s.handle(ev::Signal{SIGTERM}).empty());
  CHECK(s.handle(ev::Eof{}).empty());
  CHECK(s.handle(msg(proto::Stop{})).empty());
  CHECK(s.handle(ev::TimerFired{Timer::ack}).empty());

  ev::Flushing f;
  f.control_queued = true;  // the outcome's line not written yet, no progress
  CHECK(s.handle(f).empty());
  f.written = 40;  // progress: the idle timer starts again
  a = s.handle(f);
  CHECK(armed(a, Timer::flush_idle, kFlushIdleMs));
  CHECK(only<act::PowerOff>(a).empty());
  // Written is not received: every frame written and both outputs at EOF, but the host has not
  // closed the data channel yet.
  ev::Flushing d;
  d.data_open = true;
  d.outputs_done = true;
  d.written = 5;
  CHECK(only<act::PowerOff>(s.handle(d)).empty());
  d.written = 0;
  d.receipt = true;
  a = s.handle(d);
  REQUIRE(only<act::PowerOff>(a).size() == 1);
  CHECK(only<act::PowerOff>(a)[0].halt == proto::Halt::poweroff);
  CHECK(cancelled(a, Timer::flush_idle));
  CHECK(cancelled(a, Timer::flush_cap));
  CHECK_FALSE(warned(a, "not sent"));
  CHECK(s.phase() == Phase::done);
  CHECK(s.handle(ev::Flushing{}).empty());
}

TEST_CASE("final flush: nothing left powers off at once; a closed data channel owes nothing") {
  Session s = flushing();
  ev::Flushing f;
  f.data_open = false;  // the channel broke or was never there: its output cannot be owed
  f.data_unsent = true;
  f.output_bytes = 100;
  CHECK(only<act::PowerOff>(s.handle(f)).size() == 1);
}

/// A session whose outcome nobody acknowledged in time: the bounded final flush.
Session flushing_unacked() {
  Session s = running();
  s.handle(ev::Exited{proto::WorkloadExited::code(0)});
  s.handle(ev::NoChildren{});
  s.handle(ev::TimerFired{Timer::ack});
  REQUIRE(s.stage() == Stage::flush);
  return s;
}

TEST_CASE("final flush: kFlushIdleMs without progress powers off, naming the output not sent") {
  Session s = flushing_unacked();
  ev::Flushing f;
  f.data_open = true;
  f.data_unsent = true;
  f.output_bytes = 4096;
  CHECK(s.handle(f).empty());
  auto a = s.handle(ev::TimerFired{Timer::flush_idle});
  CHECK(only<act::PowerOff>(a).size() == 1);
  CHECK(warned(a, "4096 byte(s) of the workload's output not sent"));

  // Only a control line left (a host that stopped reading): power-off without that warning.
  Session c = flushing_unacked();
  ev::Flushing q;
  q.control_queued = true;
  c.handle(q);
  a = c.handle(ev::TimerFired{Timer::flush_idle});
  CHECK(only<act::PowerOff>(a).size() == 1);
  CHECK_FALSE(warned(a, "not sent"));
}

TEST_CASE("final flush: progress keeps it going, kFlushMaxMs ends it whatever moves") {
  Session s = flushing_unacked();
  ev::Flushing f;
  f.data_open = true;
  f.written = 65536;  // a slow port still moving a big output's tail
  for (int i = 0; i < 20; ++i) {
    auto a = s.handle(f);
    CHECK(armed(a, Timer::flush_idle, kFlushIdleMs));
    CHECK(only<act::PowerOff>(a).empty());
  }
  f.output_bytes = 7;
  s.handle(f);
  auto a = s.handle(ev::TimerFired{Timer::flush_cap});
  CHECK(only<act::PowerOff>(a).size() == 1);
  CHECK(warned(a, "7 byte(s)"));
}

TEST_CASE("list_processes: the loop reads the list, the session sends it, in any phase; nothing changes") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  auto a = s.handle(msg(proto::ListProcesses{}));
  CHECK(only<act::ListProcesses>(a).size() == 1);
  CHECK(sent(a).empty());
  CHECK(s.phase() == Phase::awaiting_boot);  // before boot too: it changes nothing
  const proto::Processes list{{{1, 0, 0, "/init"}, {42, 1, 0, "/bin/true"}}, 0};
  a = s.handle(ev::ProcessList{list});
  REQUIRE(sent(a) == std::vector<std::string>{"processes"});
  CHECK(std::get<proto::Processes>(only<act::Send>(a)[0].msg) == list);
  Session r = running();
  a = r.handle(msg(proto::ListProcesses{}));
  CHECK(only<act::ListProcesses>(a).size() == 1);
  CHECK(group_signals(a).empty());
  CHECK(r.phase() == Phase::running);
  // The channel gone meanwhile: the list is not sent (nothing to send it on).
  r.handle(ev::Eof{});
  CHECK(sent(r.handle(ev::ProcessList{list})).empty());
}

// ---- exec: more processes beside the workload ----------------------------------------------------

namespace {
/// A session brought to `running` with its stdio on the data channel (boot.stdio), pid 42.
Session running_with_stdio() {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  proto::Boot b = make_boot(true);
  b.stdio = proto::Stdio{};
  b.stdio->drain_ms = 250;
  s.handle(msg(b));
  s.handle(ev::DataUp{});
  s.handle(ev::MountsDone{});
  s.handle(ev::Started{42});
  REQUIRE(s.phase() == Phase::running);
  return s;
}
proto::ExecProcess exec_of(std::uint16_t proc, bool with_stdio) {
  proto::ExecProcess x;
  x.proc = proc;
  x.exec.argv = {"/bin/sh", "-c", "exit 3"};
  x.exec.uid = 1000;
  if (with_stdio) x.stdio = proto::Stdio{};
  return x;
}
template <class M>
M sent_msg(const Actions& as) {
  for (auto& s : only<act::Send>(as))
    if (auto* m = std::get_if<M>(&s.msg)) return *m;
  FAIL("not sent");
  return M{};
}
}  // namespace

TEST_CASE("exec: spawned with all its data; started, reaped, its output at EOF, then exec_exited") {
  Session s = running_with_stdio();
  auto a = s.handle(msg(exec_of(1, true)));
  auto sp = only<act::SpawnExec>(a);
  REQUIRE(sp.size() == 1);
  CHECK(sp[0].proc == 1);
  CHECK(sp[0].exec.argv == std::vector<std::string>{"/bin/sh", "-c", "exit 3"});
  CHECK(sp[0].exec.uid == 1000);
  CHECK(sp[0].geometry.width == 1920);
  CHECK(sp[0].stdio.has_value());
  CHECK(s.execs() == 1);
  a = s.handle(ev::ExecStarted{1, 77});
  CHECK(sent_msg<proto::ExecStarted>(a) == proto::ExecStarted{1, 77});
  // Reaped first: held for its output, bounded by the drain window.
  a = s.handle(ev::ExecReaped{77, proto::WorkloadExited::code(3)});
  CHECK(sent(a).empty());
  CHECK(armed(a, Timer::exec_drain, 250));
  a = s.handle(ev::ExecOutputsDone{1});
  CHECK(sent_msg<proto::ExecExited>(a) == proto::ExecExited{1, 3, std::nullopt});
  CHECK(only<act::CloseExec>(a).size() == 1);
  CHECK(cancelled(a, Timer::exec_drain));
  CHECK(s.execs() == 0);
  // The workload and the session go on.
  CHECK(s.phase() == Phase::running);
  CHECK(s.workload_alive());
  // Output done first, then the reap: reported at once.
  s.handle(msg(exec_of(2, true)));
  s.handle(ev::ExecStarted{2, 78});
  CHECK(sent(s.handle(ev::ExecOutputsDone{2})).empty());
  a = s.handle(ev::ExecReaped{78, proto::WorkloadExited::killed(9)});
  CHECK(sent_msg<proto::ExecExited>(a) == proto::ExecExited{2, std::nullopt, 9});
}

TEST_CASE("exec: output still open after the reap (a background child): reported when the drain window ends") {
  Session s = running_with_stdio();
  s.handle(msg(exec_of(5, true)));
  s.handle(ev::ExecStarted{5, 90});
  s.handle(ev::ExecReaped{90, proto::WorkloadExited::code(0)});
  auto a = s.handle(ev::TimerFired{Timer::exec_drain});
  CHECK(sent(a).empty());
  REQUIRE(only<act::CheckHeld>(a).size() == 1);
  CHECK(only<act::CheckHeld>(a)[0].proc == 5);
  // Output still waiting for the host (a slow exec client): the window starts again.
  a = s.handle(ev::Held{5, 4096});
  CHECK(sent(a).empty());
  CHECK(armed(a, Timer::exec_drain, 250));
  a = s.handle(ev::TimerFired{Timer::exec_drain});
  a = s.handle(ev::Held{5, 0});
  CHECK(sent_msg<proto::ExecExited>(a) == proto::ExecExited{5, 0, std::nullopt});
  CHECK(only<act::CloseExec>(a).front().proc == 5);
  // Its streams closed before their EOF (the background child holds them): their accounts now,
  // nothing given up.
  a = s.handle(ev::ExecClosed{5, {100, 0, false}, ev::OutputAccount{0, 0, false}, false});
  REQUIRE(sent(a) == std::vector<std::string>{"output_end", "output_end"});
  CHECK(std::get<proto::OutputEnd>(only<act::Send>(a)[0].msg) == proto::OutputEnd{5, proto::Stream::out, 100, 0});
  CHECK(std::get<proto::OutputEnd>(only<act::Send>(a)[1].msg) == proto::OutputEnd{5, proto::Stream::err, 0, 0});
  // Its late outputs-done changes nothing.
  CHECK(sent(s.handle(ev::ExecOutputsDone{5})).empty());
}

TEST_CASE("exec: refused with exec_failed naming why; nothing spawned") {
  {
    Session s(kOpt);  // before the workload runs
    s.handle(ev::ChannelUp{});
    auto a = s.handle(msg(exec_of(1, false)));
    CHECK(only<act::SpawnExec>(a).empty());
    CHECK(sent_msg<proto::ExecFailed>(a).reason == "exec: the workload is not running (phase awaiting_boot)");
  }
  {
    Session s = running();  // no data channel
    auto a = s.handle(msg(exec_of(1, true)));
    CHECK(only<act::SpawnExec>(a).empty());
    CHECK(sent_msg<proto::ExecFailed>(a).reason == "exec.stdio: this session has no data channel (boot.stdio unset)");
    // Without stdio it runs on /dev/null.
    CHECK(only<act::SpawnExec>(s.handle(msg(exec_of(1, false)))).size() == 1);
    auto dup = s.handle(msg(exec_of(1, false)));
    CHECK(only<act::SpawnExec>(dup).empty());
    CHECK(sent_msg<proto::ExecFailed>(dup).reason == "exec.proc: process 1 is already running");
  }
  {
    Session s = running();
    for (std::uint16_t i = 1; i <= proto::kExecMax; ++i) CHECK(only<act::SpawnExec>(s.handle(msg(exec_of(i, false)))).size() == 1);
    auto a = s.handle(msg(exec_of(100, false)));
    CHECK(only<act::SpawnExec>(a).empty());
    CHECK(sent_msg<proto::ExecFailed>(a).proc == 100);
  }
  {
    // The spawn itself failed: reported as exec_failed, its slot freed.
    Session s = running();
    s.handle(msg(exec_of(3, false)));
    auto a = s.handle(ev::ExecFailed{3, proto::StartFailed{"exec nope: No such file or directory", 2, proto::StartFailClass::not_found}});
    CHECK(sent_msg<proto::ExecFailed>(a) ==
          proto::ExecFailed{3, "exec nope: No such file or directory", 2, proto::StartFailClass::not_found});
    CHECK(s.execs() == 0);
  }
}

TEST_CASE("exec.container / exec.in: the container goes to the spawn; `in` resolves to its PID 1, or is refused") {
  Session s = running();
  proto::ExecProcess c = exec_of(1, false);
  c.container = proto::Container{"/run/nes/pod/c1/rootfs", "web", false};
  auto a = s.handle(msg(c));
  auto sp = only<act::SpawnExec>(a);
  REQUIRE(sp.size() == 1);
  CHECK(sp[0].container == c.container);
  CHECK(sp[0].in_pid == 0);
  // Not started yet: nothing to join.
  proto::ExecProcess in = exec_of(2, false);
  in.in = 1;
  a = s.handle(msg(in));
  CHECK(only<act::SpawnExec>(a).empty());
  CHECK(sent_msg<proto::ExecFailed>(a) ==
        proto::ExecFailed{2, "exec.in: no container is running as process 1", std::nullopt, proto::StartFailClass::other});
  s.handle(ev::ExecStarted{1, 600});
  a = s.handle(msg(in));
  sp = only<act::SpawnExec>(a);
  REQUIRE(sp.size() == 1);
  CHECK(sp[0].in_pid == 600);
  CHECK(!sp[0].container);
  // A process that is not a container (started without exec.container) cannot be joined.
  s.handle(ev::ExecStarted{2, 601});
  proto::ExecProcess in2 = exec_of(3, false);
  in2.in = 2;
  CHECK(sent_msg<proto::ExecFailed>(s.handle(msg(in2))).reason == "exec.in: no container is running as process 2");
  // Unknown, and ended (reaped) containers are refused; the container's end is an exec_exited,
  // never the session's.
  in2.in = 9;
  CHECK(sent_msg<proto::ExecFailed>(s.handle(msg(in2))).reason == "exec.in: no container is running as process 9");
  a = s.handle(ev::ExecReaped{600, proto::WorkloadExited::code(4)});
  a = s.handle(ev::ExecOutputsDone{1});
  CHECK(sent_msg<proto::ExecExited>(a) == proto::ExecExited{1, 4, std::nullopt});
  CHECK(s.phase() == Phase::running);
  CHECK(s.workload_alive());
  in2.in = 1;
  in2.proc = 4;
  CHECK(sent_msg<proto::ExecFailed>(s.handle(msg(in2))).reason == "exec.in: no container is running as process 1");
  // kill{proc} reaches a container's PID 1 (its group, in the init's pid namespace).
  proto::ExecProcess c2 = exec_of(5, false);
  c2.container = proto::Container{"/r2"};
  s.handle(msg(c2));
  s.handle(ev::ExecStarted{5, 700});
  auto g = only<act::SignalGroup>(s.handle(msg(proto::Kill{9, 5})));
  REQUIRE(g.size() == 1);
  CHECK(g[0].pgid == 700);
}

TEST_CASE("exec: kill{signal, proc} goes to that process's group only; the workload's SIGTERM is untouched") {
  Session s = running();
  s.handle(msg(exec_of(1, false)));
  s.handle(ev::ExecStarted{1, 500});
  auto a = s.handle(msg(proto::Kill{15, 1}));
  auto g = only<act::SignalGroup>(a);
  REQUIRE(g.size() == 1);
  CHECK((g[0].signo == 15 && g[0].pgid == 500));
  CHECK(!s.term_sent());
  // No such process (never started, or reported): nothing is signalled.
  CHECK(only<act::SignalGroup>(s.handle(msg(proto::Kill{9, 7}))).empty());
  s.handle(ev::ExecReaped{500, proto::WorkloadExited::killed(15)});
  s.handle(ev::ExecOutputsDone{1});
  CHECK(only<act::SignalGroup>(s.handle(msg(proto::Kill{9, 1}))).empty());
}

TEST_CASE("a boot with stdio and no data channel address: start_failed at once, nothing dialled") {
  SessionOptions o = kOpt;
  o.has_data_channel = false;
  Session s(o);
  s.handle(ev::ChannelUp{});
  proto::Boot b = make_boot();
  b.stdio = proto::Stdio{};
  auto a = s.handle(msg(b));
  CHECK(only<act::DialData>(a).empty());
  CHECK(only<act::Mount>(a).empty());
  CHECK_FALSE(armed(a, Timer::data_dial, o.connect_timeout_ms));
  REQUIRE(sent(a) == std::vector<std::string>{"start_failed"});
  auto f = std::get<proto::StartFailed>(only<act::Send>(a)[0].msg);
  CHECK(f.cls == proto::StartFailClass::other);
  CHECK(f.err == 0);
  CHECK(f.reason == "data channel: no address configured (--data-channel=ADDR or nesinit.data=ADDR)");
  CHECK(s.phase() == Phase::shutting_down);
  // Without stdio the same session options dial nothing and mount at once.
  Session plain(o);
  plain.handle(ev::ChannelUp{});
  CHECK(only<act::Mount>(plain.handle(msg(make_boot()))).size() == 1);
}

TEST_CASE("spawn: the workload's fds 0-2 without stdio are the console only where the options say so") {
  for (bool console : {false, true}) {
    SessionOptions o = kOpt;
    o.console_stdio = console;
    Session s(o);
    s.handle(ev::ChannelUp{});
    s.handle(msg(make_boot()));
    auto sp = only<act::Spawn>(s.handle(ev::MountsDone{}));
    REQUIRE(sp.size() == 1);
    CHECK(sp[0].console == console);
    CHECK_FALSE(sp[0].stdio);
  }
}

TEST_CASE("output_end: each stream's account goes out once, before the outcome, when its eof is framed") {
  Session s = running_with_stdio();
  CHECK(sent(s.handle(ev::Exited{proto::WorkloadExited::code(7)})).empty());
  auto a = s.handle(ev::OutputsDone{{8388608, 0, false}, ev::OutputAccount{64, 0, true}});
  REQUIRE(sent(a) == std::vector<std::string>{"output_end", "output_end", "workload_exited"});
  CHECK(std::get<proto::OutputEnd>(only<act::Send>(a)[0].msg) == proto::OutputEnd{0, proto::Stream::out, 8388608, 0});
  CHECK(std::get<proto::OutputEnd>(only<act::Send>(a)[1].msg) == proto::OutputEnd{0, proto::Stream::err, 64, 0});
  CHECK_FALSE(warned(a, "given up"));
  s.handle(ev::NoChildren{});
  s.handle(msg(proto::Shutdown{}));
  ev::Flushing done;
  done.data_open = true;
  done.outputs_done = true;
  done.receipt = true;
  a = s.handle(done);
  CHECK(sent(a).empty());  // once per stream
  CHECK(only<act::PowerOff>(a).size() == 1);
  // With a terminal: one stream, one account.
  Session t = running_with_stdio();
  t.handle(ev::Exited{proto::WorkloadExited::code(0)});
  a = t.handle(ev::OutputsDone{{10, 0, true}, std::nullopt});
  CHECK(sent(a) == std::vector<std::string>{"output_end", "workload_exited"});
}

TEST_CASE("final flush: the host closes the data channel before the output's end: output_end, exact") {
  Session s = running_with_stdio();
  s.handle(ev::Exited{proto::WorkloadExited::code(7)});
  s.handle(ev::TimerFired{Timer::drain});
  auto a = s.handle(ev::Held{0, 0});  // a straggler holds stdout open; nothing of it waits
  REQUIRE(sent(a) == std::vector<std::string>{"workload_exited"});
  s.handle(ev::NoChildren{});
  a = s.handle(msg(proto::Shutdown{}));
  REQUIRE(s.stage() == Stage::flush);
  CHECK(only<act::ArmTimer>(a).empty());
  ev::Flushing f;
  f.data_open = true;
  f.receipt = true;  // closed by the host before stdout's end: it gave up on purpose
  f.out = {5000000, 3388608, false};
  f.err = ev::OutputAccount{12, 0, true};
  a = s.handle(f);
  REQUIRE(sent(a) == std::vector<std::string>{"output_end", "output_end"});
  CHECK(std::get<proto::OutputEnd>(only<act::Send>(a)[0].msg) == proto::OutputEnd{0, proto::Stream::out, 5000000, 3388608});
  CHECK(std::get<proto::OutputEnd>(only<act::Send>(a)[1].msg) == proto::OutputEnd{0, proto::Stream::err, 12, 0});
  CHECK(warned(a, "stdout: 3388608 byte(s) given up, 5000000 sent"));
  CHECK_FALSE(warned(a, "stderr"));
  CHECK(only<act::PowerOff>(a).empty());  // the lines go out first
  CHECK(armed(a, Timer::flush_idle, kFlushIdleMs));  // bounded now
  f.control_queued = true;
  CHECK(only<act::PowerOff>(s.handle(f)).empty());
  f.control_queued = false;
  a = s.handle(f);
  CHECK(sent(a).empty());  // once
  CHECK(only<act::PowerOff>(a).size() == 1);
}

// Issue 44, the init-e2e-stdio failure: the init had written all of the workload's output to
// the data channel (nothing given up: unsent 0) when the host died without reading it. Its
// output_end lines died with the host, and the init logged nothing, since it gave up nothing
// itself: the only record of what it sent was gone.
TEST_CASE("output_end that no host confirmed: logged in full before the final act, however little was given up") {
  Session s = running_with_stdio();
  auto a = s.handle(ev::OutputsDone{{4194304, 0, true}, ev::OutputAccount{0, 0, true}});
  REQUIRE(sent(a) == std::vector<std::string>{"output_end", "output_end"});
  CHECK_FALSE(warned(a, "given up"));  // nothing given up: nothing to say yet
  a = s.handle(ev::Exited{proto::WorkloadExited::code(0)});
  REQUIRE(sent(a) == std::vector<std::string>{"workload_exited"});
  s.handle(ev::NoChildren{});
  s.handle(ev::Eof{});  // the host died: no `shutdown` after the outcome
  REQUIRE(s.stage() == Stage::flush);
  ev::Flushing f;
  f.channel_open = false;
  f.outputs_done = true;
  f.out = {4194304, 0, true};
  f.err = ev::OutputAccount{0, 0, true};
  a = s.handle(f);
  REQUIRE(only<act::PowerOff>(a).size() == 1);
  CHECK(warned(a, "stdout: 0 byte(s) given up, 4194304 sent: no host confirmed this account"));
  CHECK(warned(a, "stderr: 0 byte(s) given up, 0 sent: no host confirmed this account"));
  // The notes come before the final act (the loop performs actions in order).
  std::size_t note_at = a.size(), off_at = a.size();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (auto* n = std::get_if<act::Note>(&a[i]); n && n->text.find("4194304 sent") != std::string::npos) note_at = i;
    if (std::holds_alternative<act::PowerOff>(a[i])) off_at = i;
  }
  CHECK(note_at < off_at);

  // The flush's bounds end it the same way (the 1 s idle bound with output still owed).
  Session t = running_with_stdio();
  t.handle(ev::OutputsDone{{100, 0, true}, ev::OutputAccount{0, 0, true}});
  t.handle(ev::Exited{proto::WorkloadExited::code(0)});
  t.handle(ev::NoChildren{});
  t.handle(ev::Eof{});
  f.data_open = true;
  f.data_unsent = true;
  f.out = {100, 0, true};
  CHECK(only<act::PowerOff>(t.handle(f)).empty());
  a = t.handle(ev::TimerFired{Timer::flush_idle});
  REQUIRE(only<act::PowerOff>(a).size() == 1);
  CHECK(warned(a, "stdout: 0 byte(s) given up, 100 sent: no host confirmed this account"));

  // A host that acknowledged the outcome sent after them read them: nothing more is logged.
  Session u = running_with_stdio();
  u.handle(ev::OutputsDone{{100, 0, true}, ev::OutputAccount{0, 0, true}});
  u.handle(ev::Exited{proto::WorkloadExited::code(0)});
  u.handle(ev::NoChildren{});
  u.handle(msg(proto::Shutdown{}));
  ev::Flushing done;
  done.data_open = true;
  done.outputs_done = true;
  done.receipt = true;
  a = u.handle(done);
  REQUIRE(only<act::PowerOff>(a).size() == 1);
  CHECK_FALSE(warned(a, "no host confirmed"));

  // Already logged (bytes given up when sent): not again; the stream that was not is.
  Session v = running_with_stdio();
  v.handle(ev::OutputsDone{{100, 7, true}, ev::OutputAccount{3, 0, true}});
  v.handle(ev::Exited{proto::WorkloadExited::code(0)});
  v.handle(ev::NoChildren{});
  v.handle(ev::Eof{});
  f = ev::Flushing{};
  f.channel_open = false;
  f.outputs_done = true;
  a = v.handle(f);
  REQUIRE(only<act::PowerOff>(a).size() == 1);
  CHECK_FALSE(warned(a, "stdout"));
  CHECK(warned(a, "stderr: 0 byte(s) given up, 3 sent: no host confirmed this account"));
}

TEST_CASE("exec: its streams closed after the data channel went: output_end with its accounts") {
  Session s = running_with_stdio();
  s.handle(msg(exec_of(3, true)));
  s.handle(ev::ExecStarted{3, 91});
  // The data channel is gone: 700 bytes were thrown away, stderr ended before (eof framed).
  auto a = s.handle(ev::ExecClosed{3, {1000, 700, false}, ev::OutputAccount{5, 0, true}, false});
  REQUIRE(sent(a) == std::vector<std::string>{"output_end", "output_end"});
  CHECK(sent_msg<proto::OutputEnd>(a) == proto::OutputEnd{3, proto::Stream::out, 1000, 700});
  CHECK(warned(a, "process 3 stdout: 700 byte(s) given up, 1000 sent"));
  // Both at EOF before: their accounts went with ExecOutputsDone, nothing now.
  CHECK(sent(s.handle(ev::ExecClosed{4, {10, 0, true}, ev::OutputAccount{0, 0, true}, true})).empty());
}

TEST_CASE("boot.network: the Mount action carries it and the hostname; network_failed is final, nothing starts") {
  Session s(kOpt);
  auto a = s.handle(ev::ChannelUp{});
  // The ready announces every feature this init implements.
  auto ready = std::get<proto::Ready>(only<act::Send>(a).at(0).msg);
  CHECK(ready.features == proto::all_features());
  proto::Boot b = make_boot();
  b.hostname = "web";
  b.network = proto::Network{};
  b.network->interfaces.push_back({{2, 0, 0, 0, 0, 1}, 1400, {}});
  a = s.handle(msg(b));
  auto m = only<act::Mount>(a);
  REQUIRE(m.size() == 1);
  CHECK(m[0].network == b.network);
  CHECK(m[0].hostname == std::optional<std::string>("web"));
  const proto::NetworkFailed f{"02:00:00:00:00:01", "find", "no link", ENODEV};
  a = s.handle(ev::NetworkFailed{f});
  REQUIRE(sent(a) == std::vector<std::string>{"network_failed"});
  CHECK(std::get<proto::NetworkFailed>(only<act::Send>(a)[0].msg) == f);
  CHECK(only<act::Spawn>(a).empty());
  REQUIRE(s.outcome());
  CHECK(std::holds_alternative<proto::NetworkFailed>(*s.outcome()));
  // A late MountsDone (cannot happen, but must not start anything) is ignored.
  CHECK(only<act::Spawn>(s.handle(ev::MountsDone{})).empty());
}

TEST_CASE("boot.network in a sandbox that may not configure one: network_failed (EPERM) before any mount") {
  SessionOptions o = kOpt;
  o.may_configure_network = false;
  Session s(o);
  s.handle(ev::ChannelUp{});
  proto::Boot b = make_boot();
  b.network = proto::Network{};
  auto a = s.handle(msg(b));
  CHECK(only<act::Mount>(a).empty());
  REQUIRE(sent(a) == std::vector<std::string>{"network_failed"});
  auto f = std::get<proto::NetworkFailed>(only<act::Send>(a)[0].msg);
  CHECK(f.step == "namespace");
  CHECK(f.err == EPERM);
}

TEST_CASE("data resume: a data channel lost when the final flush begins is redialled; its rings wait for a host") {
  // The adoption race (tests/host/adopt_test.py "twice"): the monitor killed right after the
  // workload's last output, the exit reported meanwhile, the host taking over acknowledges it;
  // the flush must go on redialling the data channel, or what its rings hold is lost.
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  proto::Boot b = make_boot(true);
  b.reconnect_ms = 4000;
  b.vm = "web";
  b.generation = 3;
  b.stdio = proto::Stdio{};
  b.stdio->replay_bytes = 65536;
  s.handle(msg(b));
  s.handle(ev::DataUp{});
  s.handle(ev::MountsDone{});
  s.handle(ev::Started{42});
  REQUIRE(s.phase() == Phase::running);
  auto a = s.handle(ev::DataLost{"EOF without the host's close"});
  REQUIRE(only<act::DialData>(a).size() == 1);
  CHECK(only<act::DialData>(a)[0].redial);
  CHECK(armed(a, Timer::data_reconnect, 4000));
  a = s.handle(ev::DataFailed{"no listener", ECONNREFUSED, true});
  CHECK(armed(a, Timer::data_redial, kRedialFirstMs));
  // The workload ends; its output is framed (in the replay ring), the host acknowledges.
  s.handle(ev::Exited{proto::WorkloadExited::code(3)});
  s.handle(ev::OutputsDone{{71, 0, true}, ev::OutputAccount{0, 0, true}});
  s.handle(ev::NoChildren{});
  a = s.handle(msg(proto::Shutdown{}));
  REQUIRE(s.stage() == Stage::flush);
  CHECK_FALSE(cancelled(a, Timer::data_redial));
  CHECK_FALSE(cancelled(a, Timer::data_reconnect));
  ev::Flushing f;  // the loop: a lost channel is open and owes its rings
  f.data_open = true;
  f.data_unsent = true;
  f.outputs_done = true;
  CHECK(only<act::PowerOff>(s.handle(f)).empty());
  a = s.handle(ev::TimerFired{Timer::data_redial});
  REQUIRE(only<act::DialData>(a).size() == 1);
  a = s.handle(ev::DataFailed{"no listener", ECONNREFUSED, true});  // heard during the flush too
  CHECK(armed(a, Timer::data_redial, 2 * kRedialFirstMs));
  CHECK(only<act::DialData>(s.handle(ev::TimerFired{Timer::data_redial})).size() == 1);
  s.handle(ev::DataUp{});
  CHECK(only<act::PowerOff>(s.handle(f)).empty());
  // The new host replays, takes both eofs and closes: the receipt.
  ev::Flushing done;
  done.data_open = true;
  done.outputs_done = true;
  done.receipt = true;
  done.out = {71, 0, true};
  done.err = ev::OutputAccount{0, 0, true};
  CHECK(only<act::PowerOff>(s.handle(done)).size() == 1);
}
