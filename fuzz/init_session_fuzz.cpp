// The init's Session fed arbitrary host lines and events in any order (timers fire only while
// armed, as loop.cpp does). Asserted after every event:
//  - never two SIGTERMs to the workload's group;
//  - never two final outcomes sent (mount_failed, network_failed, start_failed, workload_exited);
//  - the final flush begins at most once, and only after the ack (`shutdown` after the outcome),
//    EOF, the ack timeout, or with no outcome to acknowledge;
//  - power-off at most once, only after the flush began; nothing at all after it;
//  - a flush without a deadline never after the host hung up (a live host is never timed out;
//    a gone one may not hold the power-off for ever);
//  - at most one output_end per stream of the workload (an exec's number may be reused by a
//    later process, which gets accounts of its own);
//  - fencing: every line sent after a `boot` that named a generation carries that generation;
//  - the init closes its channel on its own (act::CloseChannel) only to keep an outcome no host
//    acknowledged, inside a reconnect window.
#include <csignal>
#include <set>
#include <utility>

#include "fuzz_util.hpp"
#include "nesinit/session.hpp"
#include "protocol/codec.hpp"

using namespace nes;
using namespace nes::init;
using nes::fuzz::require;

namespace {
constexpr std::string_view kLines[] = {
    R"({"type":"boot","exec":{"argv":["/bin/true"],"uid":0,"gid":0},"geometry":{"width":1,"height":2,"fps":3},"on_exit":{"terminal":true}})",
    R"({"type":"boot","exec":{"argv":["/bin/true"],"uid":0,"gid":0},"geometry":{"width":1,"height":2,"fps":3},"on_exit":{"terminal":false}})",
    R"({"type":"boot","exec":{"argv":["/bin/true"],"uid":0,"gid":0},"geometry":{"width":1,"height":2,"fps":3},"on_exit":{"terminal":true},"reconnect_ms":50,"vm":"v","generation":2})",
    R"({"type":"boot","exec":{"argv":["/bin/true"],"uid":0,"gid":0},"geometry":{"width":1,"height":2,"fps":3},"on_exit":{"terminal":false},"reconnect_ms":50})",
    // Data channel resume (boot.stdio.replay_bytes): the data channel's loss, redial and the
    // exit held until the output is delivered.
    R"({"type":"boot","exec":{"argv":["/bin/true"],"uid":0,"gid":0},"geometry":{"width":1,"height":2,"fps":3},"on_exit":{"terminal":true},"reconnect_ms":50,"vm":"v","generation":2,"stdio":{"stdin":true,"terminal":null,"mode":"lossless","buffer_bytes":4096,"drain_ms":50,"replay_bytes":4096}})",
    R"({"type":"stop"})",
    R"({"type":"shutdown"})",
    R"({"type":"kill","signal":15})",
    R"({"type":"kill","signal":9})",
    R"({"type":"kill","signal":1})",
    R"({"type":"hello"})",
    R"({"type":"boot"})",
    "garbage",
};

struct Model {
  bool armed[kTimerCount] = {};
  int sigterms = 0;
  bool outcome_sent = false;
  bool acked = false;      // a `shutdown` line reached the session after the outcome was sent
  bool eof = false;        // EOF (or the channel never came up)
  bool ack_fired = false;  // the ack timer fired while armed
  bool window_over = false;  // the reconnect window ended while armed
  std::optional<proto::GuestMessage> final_sent;  // re-sent after a resume: always the same
  bool flushing = false;   // act::Flush came
  bool powered_off = false;
  bool hung_up = false;    // a flush report said the lifecycle channel is gone
  std::set<std::pair<std::uint16_t, int>> accounted;  // output_end sent: (proc, stream)
};
ev::OutputAccount account(fuzz::Cursor& c) {
  return {c.pick(5000), c.pick(2) ? 0 : c.pick(5000), c.pick(2) == 1};
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Cursor c(data, size);
  SessionOptions o;
  o.grace_ms = 100;
  o.ack_timeout_ms = 100;
  o.boot_timeout_ms = 100;
  o.connect_timeout_ms = 100;
  Session s(o);
  Model m;
  for (int steps = 0; !c.empty() && steps < 400; ++steps) {
    Event e = ev::NoChildren{};
    bool is_shutdown_line = false;
    switch (c.pick(20)) {
      case 0: e = ev::ChannelUp{}; break;
      case 1: if (c.pick(2)) e = ev::Start{"unix:/x"}; else e = ev::DialFailed{"refused", false}; break;
      case 2: case 3: {
        std::string_view l = kLines[c.pick(std::size(kLines))];
        is_shutdown_line = l == R"({"type":"shutdown"})";
        e = ev::Line{proto::Line{proto::Line::Kind::text, std::string(l), l.size()}};
        break;
      }
      case 4: {
        std::string_view b = c.bytes(200);
        auto d = proto::decode_host(b);
        if (auto* hm = std::get_if<proto::HostMessage>(&d)) is_shutdown_line = std::holds_alternative<proto::Shutdown>(*hm);
        e = ev::Line{proto::Line{proto::Line::Kind::text, std::string(b), b.size()}};
        break;
      }
      case 5: e = ev::Line{proto::Line{proto::Line::Kind::too_long, "", 1u << 21}}; break;
      case 6: e = ev::Eof{}; break;
      case 7: e = ev::MountsDone{}; break;
      case 8:
        e = c.pick(2) ? Event{ev::MountFailed{proto::MountFailed{"w", "x", 19}}}
                      : Event{ev::NetworkFailed{proto::NetworkFailed{"52:54:00:12:34:56", "find", "x", 19}}};
        break;
      case 9: e = ev::Started{static_cast<std::int32_t>(2 + c.pick(100))}; break;
      case 10: e = ev::StartFailed{proto::StartFailed{"x", 2, proto::StartFailClass::not_found}}; break;
      case 11:
        e = c.pick(2) ? ev::Exited{proto::WorkloadExited::code(static_cast<std::uint8_t>(c.byte()))}
                      : ev::Exited{proto::WorkloadExited::killed(static_cast<std::uint8_t>(1 + c.pick(64)))};
        break;
      case 12: e = ev::Signal{static_cast<int>(1 + c.pick(64))}; break;
      case 14: e = ev::DialFailed{"refused"}; break;
      case 15: {
        ev::Flushing f;
        f.written = c.pick(2) ? 0 : 100;
        f.control_queued = c.pick(2);
        f.data_open = c.pick(2);
        f.data_unsent = c.pick(2);
        f.outputs_done = c.pick(2);
        f.receipt = c.pick(2);
        f.output_bytes = c.pick(1000);
        f.channel_open = c.pick(4) != 0;
        f.out = account(c);
        if (c.pick(2)) f.err = account(c);
        else f.err.reset();
        e = f;
        break;
      }
      case 16:
        switch (c.pick(3)) {
          case 0: e = ev::DataUp{}; break;
          case 1: e = ev::DataLost{"EOF without the host's close"}; break;
          default: e = ev::DataFailed{"refused", 111, c.pick(2) == 1}; break;
        }
        break;
      case 17: e = ev::Held{static_cast<std::uint16_t>(c.pick(3)), c.pick(2) ? 0 : c.pick(70000)}; break;
      case 18: e = ev::OutputsDone{account(c), account(c)}; break;
      case 19: e = ev::ExecClosed{static_cast<std::uint16_t>(1 + c.pick(3)), account(c), account(c), c.pick(2) == 1}; break;
      case 13: {
        Timer t = static_cast<Timer>(c.pick(kTimerCount));
        if (!m.armed[static_cast<int>(t)]) continue;
        m.armed[static_cast<int>(t)] = false;
        if (t == Timer::ack) m.ack_fired = true;
        if (t == Timer::reconnect || t == Timer::ack_window) m.window_over = true;
        e = ev::TimerFired{t};
        break;
      }
    }
    const bool channel_was_open = s.channel_open();
    if (std::holds_alternative<ev::Eof>(e) && channel_was_open) m.eof = true;
    if (is_shutdown_line && m.outcome_sent && channel_was_open) m.acked = true;
    if (auto* f = std::get_if<ev::Flushing>(&e); f && m.flushing && !f->channel_open) m.hung_up = true;
    Actions acts = s.handle(e);
    if (m.powered_off) require(acts.empty(), "nothing happens after power-off");
    for (auto& a : acts) {
      if (auto* x = std::get_if<act::SignalGroup>(&a)) {
        if (x->signo == SIGTERM) require(++m.sigterms <= 1, "never two SIGTERMs to the workload");
      } else if (auto* x = std::get_if<act::Send>(&a)) {
        const auto& g = x->msg;
        if (s.boot() && s.boot()->generation)
          require(x->generation == s.boot()->generation, "every line after boot carries its generation");
        else
          require(!x->generation, "no generation before a boot named one");
        if (auto* oe = std::get_if<proto::OutputEnd>(&g); oe && oe->proc == 0)
          require(m.accounted.insert({oe->proc, static_cast<int>(oe->stream)}).second, "one output_end per stream");
        if (std::holds_alternative<proto::MountFailed>(g) || std::holds_alternative<proto::NetworkFailed>(g) ||
            std::holds_alternative<proto::StartFailed>(g) ||
            std::holds_alternative<proto::WorkloadExited>(g)) {
          if (m.final_sent) require(*m.final_sent == g, "never two different final outcomes");
          m.final_sent = g;
          m.outcome_sent = true;
        }
      } else if (auto* x = std::get_if<act::ArmTimer>(&a)) {
        m.armed[static_cast<int>(x->timer)] = true;
      } else if (auto* x = std::get_if<act::CancelTimer>(&a)) {
        m.armed[static_cast<int>(x->timer)] = false;
      } else if (std::holds_alternative<act::CloseChannel>(a)) {
        require(m.outcome_sent && !m.acked, "the channel is closed on purpose only to keep an unacknowledged outcome");
        require(s.boot() && s.boot()->reconnect_ms > 0, "... and only with a reconnect window");
      } else if (std::holds_alternative<act::Flush>(a)) {
        require(!m.flushing, "the final flush begins once");
        require(!m.outcome_sent || m.acked || m.eof || m.ack_fired || m.window_over,
                "the final flush only after the ack, EOF, the ack timeout or the reconnect window");
        m.flushing = true;
      } else if (std::holds_alternative<act::PowerOff>(a)) {
        require(!m.powered_off, "power-off once");
        require(m.flushing, "power-off only after the final flush");
        m.powered_off = true;
      }
    }
    if (m.flushing && !m.powered_off && !m.armed[static_cast<int>(Timer::flush_idle)] &&
        !m.armed[static_cast<int>(Timer::flush_cap)])
      require(!m.hung_up, "a flush without a deadline never after the host hung up");
  }
  return 0;
}
