// The host Session fed arbitrary guest bytes and events in any order, the way host/lib/host.cpp
// would (timers fire only while armed, a record completes only while one is being written).
// Asserted after every event:
//  - no ack before durable: no `shutdown` goes out while an outcome exists that is not durable,
//    and none ever after the record failed;
//  - one outcome, one WriteRecord; nothing sent after Finished;
//  - at most line_cap + 1 bytes of guest data held;
//  - event details carry no control bytes (escaped), and guest-triggered kinds are rate-limited;
//  - the output is cut (act::CutOutput) only while the data channel is open, and only once there
//    is an outcome or the host ends the VM on purpose; a finished session has no timer armed;
//  - at most one `boot` per session (a guest that starts over is never booted again), and it
//    names the session's generation;
//  - fencing: a line naming another generation is recorded nothing from (its outcome never
//    becomes the record).
#include <array>
#include <map>

#include "fuzz_util.hpp"
#include "host/lib/session.hpp"
#include "protocol/codec.hpp"

using namespace nes;
using namespace nes::host;
using nes::fuzz::require;

namespace {
constexpr std::string_view kLines[] = {
    "{\"type\":\"ready\",\"protocol_version\":2}\n",
    "{\"type\":\"ready\",\"protocol_version\":1}\n",
    "{\"type\":\"mounted\"}\n",
    "{\"type\":\"started\",\"pid\":7}\n",
    "{\"type\":\"started\"}\n",
    "{\"type\":\"workload_exited\",\"exit_code\":3}\n",
    "{\"type\":\"workload_exited\",\"signal\":9}\n",
    "{\"type\":\"workload_exited\",\"exit_code\":3,\"signal\":9}\n",
    "{\"type\":\"start_failed\",\"reason\":\"x\",\"errno\":2,\"class\":\"not_found\"}\n",
    "{\"type\":\"start_failed\",\"reason\":\"x\"}\n",
    "{\"type\":\"mount_failed\",\"tag\":\"w\",\"reason\":\"x\",\"errno\":19}\n",
    "{\"type\":\"mount_failed\",\"reason\":\"x\"}\n",
    "{\"type\":\"network_failed\",\"interface\":\"52:54:00:12:34:56\",\"step\":\"find\",\"reason\":\"x\",\"errno\":19}\n",
    "{\"type\":\"ready\",\"protocol_version\":2,\"features\":[\"stdio\",\"root\",\"reconnect\",\"exec\",\"network\"]}\n",
    "{\"type\":\"ready\",\"protocol_version\":2,\"features\":[]}\n",
    "{\"type\":\"protocol_error\",\"reason\":\"\\u001b[2J\"}\n",
    "{\"type\":\"\\u001b]0;x\\u0007\"}\n",
    "not json\n",
    "{\"type\":\"ready\"",
    "{\"type\":\"exec_started\",\"proc\":1,\"pid\":9}\n",
    "{\"type\":\"exec_started\",\"proc\":2,\"pid\":9}\n",
    "{\"type\":\"exec_exited\",\"proc\":1,\"exit_code\":0}\n",
    "{\"type\":\"exec_exited\",\"proc\":2,\"signal\":9}\n",
    "{\"type\":\"exec_failed\",\"proc\":1,\"reason\":\"x\",\"class\":\"not_found\"}\n",
    "{\"type\":\"exec_exited\",\"proc\":7,\"exit_code\":1}\n",
    // Fencing (the envelope's generation; the session's is 1).
    "{\"type\":\"workload_exited\",\"exit_code\":3,\"generation\":1}\n",
    "{\"type\":\"started\",\"pid\":7,\"generation\":1}\n",
    "{\"type\":\"started\",\"pid\":7,\"generation\":0}\n",
    "{\"type\":\"ready\",\"protocol_version\":2,\"resume\":{\"vm\":\"vm0\",\"generation\":1,\"started\":true,"
    "\"outcome_pending\":true},\"generation\":1}\n",
    "{\"type\":\"ready\",\"protocol_version\":2,\"resume\":{\"vm\":\"vm0\",\"generation\":2,\"started\":true,"
    "\"outcome_pending\":false},\"generation\":2}\n",
};
/// A line of another generation: its outcome (exited 42) must never be recorded.
constexpr std::string_view kStaleExit = "{\"type\":\"workload_exited\",\"exit_code\":42,\"generation\":2}\n";

struct Model {
  std::map<TimerKind, bool> armed;
  std::optional<Record> writing;  // a WriteRecord the "worker pool" has not completed
  int writes = 0;
  bool failed = false;
  bool finished = false;
  bool data_open = false;  // the "loop's" data channel: opened, closed, or cut by CutOutput
  std::map<std::uint16_t, bool> execs;  // processes exec() started (true: not ended yet)
  std::map<std::uint16_t, bool> exec_armed;
  std::map<std::string, int> kinds;
  int boots = 0;
};

void check(Session& s, const proto::LineReader& reader, Model& m) {
  auto acts = s.take();
  bool shutdown_sent = false;
  for (auto& a : acts) {
    if (auto* x = std::get_if<act::Send>(&a)) {
      require(!m.finished, "nothing is sent after Finished");
      require(proto::validate(x->msg).ok(), "every message sent decodes as itself");
      if (auto* b = std::get_if<proto::Boot>(&x->msg)) {
        require(++m.boots == 1, "at most one boot per session");
        require(b->generation == s.config().generation, "the boot names the session's generation");
      }
      if (std::holds_alternative<proto::Shutdown>(x->msg)) shutdown_sent = true;
    } else if (auto* x = std::get_if<act::ArmTimer>(&a)) {
      m.armed[x->kind] = true;
    } else if (auto* x = std::get_if<act::CancelTimer>(&a)) {
      m.armed[x->kind] = false;
    } else if (auto* x = std::get_if<act::WriteRecord>(&a)) {
      require(++m.writes == 1, "one WriteRecord per session");
      require(!(x->record.outcome == proto::Outcome::exited && x->record.exit_code == 42),
              "a line of another generation is never recorded");
      m.writing = x->record;
    } else if (auto* x = std::get_if<act::Log>(&a)) {
      for (unsigned char ch : x->detail) require(ch >= 0x20 && ch != 0x7f, "event details are escaped");
      require(x->detail.size() < 8192, "an event detail is bounded");
      int n = ++m.kinds[x->kind];
      if (x->kind == "started" || x->kind == "mounted" || x->kind == "guest_protocol_error" ||
          x->kind == "skipped" || x->kind == "connected" || x->kind == "refused")
        require(n <= 11, "guest-triggered event lines are rate-limited");
    } else if (auto* x = std::get_if<act::ArmExecTimer>(&a)) {
      require(m.execs[x->proc], "an exec timer only for a process not ended");
      m.exec_armed[x->proc] = true;
    } else if (auto* x = std::get_if<act::CancelExecTimer>(&a)) {
      m.exec_armed[x->proc] = false;
    } else if (auto* x = std::get_if<act::ExecEnded>(&a)) {
      require(m.execs.count(x->proc) && m.execs[x->proc], "a process exec() started ends once");
      m.execs[x->proc] = false;
      m.exec_armed[x->proc] = false;  // the loop forgets it and its timer
    } else if (std::holds_alternative<act::CutOutput>(a)) {
      require(m.data_open, "the output is cut only while the data channel is open");
      require(s.outcome() || s.ended_by_host(), "the output is cut only after the outcome or when the host ends the VM");
      m.data_open = false;  // the loop closes it: the session hears data_closed
      s.data_closed(false);
    } else if (std::holds_alternative<act::Finished>(a)) {
      require(!m.finished, "Finished once");
      m.finished = true;
    }
  }
  if (shutdown_sent) {
    require(!m.failed, "no shutdown (ack) for a record that failed");
    require(!s.outcome() || s.durable(), "no shutdown (ack) before the outcome is durable");
  }
  require(reader.buffered() <= s.config().line_cap + 1, "guest bytes held <= line_cap + 1");
  if (s.finished()) {
    for (auto& [k, on] : m.armed) require(!on, "a finished session leaves no timer armed");
    for (auto& [p, live] : m.execs) require(!live, "a finished session has ended every process exec() started");
  }
  // data_closed above may have queued actions: the next check sees them.
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Cursor c(data, size);
  SessionConfig cfg;
  cfg.vm = "vm0";
  cfg.descriptor.exec.argv = {"/bin/true"};
  cfg.on_exit = static_cast<OnExitPolicy>(c.pick(3));
  cfg.line_cap = 64 + c.pick(256);
  cfg.ready_timeout = std::chrono::milliseconds(1000);
  cfg.stop_timeout = std::chrono::milliseconds(1000);
  cfg.grace = std::chrono::milliseconds(500);
  if (c.pick(2)) cfg.wall_timeout = std::chrono::milliseconds(2000);
  cfg.wall_from_started = c.pick(2);
  if (c.pick(2)) cfg.reconnect = std::chrono::milliseconds(1000);  // channel survival: redial windows
  Session s(cfg);
  proto::LineReader reader(cfg.line_cap);  // the loop's: a fresh one per accepted stream
  Model m;
  WallTime t{std::chrono::seconds(1'700'000'000)};
  for (int steps = 0; !c.empty() && steps < 400; ++steps) {
    t += std::chrono::milliseconds(c.pick(200));
    switch (c.pick(18)) {
      case 0: case 1: case 2: {
        // The loop reads a stream only while the session keeps it open.
        auto line = c.pick(8) == 0 ? kStaleExit : kLines[c.pick(std::size(kLines))];
        if (s.stream_open()) feed_lines(s, reader, line, t);
        break;
      }
      case 3: {
        auto bytes = c.bytes(300);
        if (s.stream_open()) feed_lines(s, reader, bytes, t);
        break;
      }
      case 4:
        if (s.stream_opened(t)) reader = proto::LineReader(cfg.line_cap);
        break;
      case 5: s.stream_closed(reader.pending(), t); break;
      case 6: {
        TimerKind k = static_cast<TimerKind>(c.pick(kTimerKinds));
        if (m.armed[k]) {
          m.armed[k] = false;
          // The data link's state as the loop reads it when the deadline fires.
          s.timer_fired(k, t, DataLinkState{m.data_open, m.data_open && c.pick(2) == 1});
        }
        break;
      }
      case 7: s.vm_started(t); break;
      case 8: s.vm_exited(t); break;
      case 9:
        if (m.writing) {
          Record r = *m.writing;
          if (c.pick(4) == 0) r.reason = "recorded first by another process";  // same generation
          m.writing.reset();
          s.record_durable(r);
        }
        break;
      case 10:
        if (m.writing) {
          m.writing.reset();
          m.failed = true;
          s.record_failed("fsync: EIO");
        }
        break;
      case 11: (void)s.shutdown(t); break;
      case 12:
        if (c.pick(2)) (void)s.stop();
        else (void)s.kill(static_cast<int>(c.pick(70)));
        break;
      case 13:
        if (!m.data_open) {
          m.data_open = true;
          s.data_opened();
        }
        break;
      case 14:
        if (m.data_open) {
          m.data_open = false;
          s.data_closed(c.pick(2) == 1);
        }
        break;
      case 15: {
        proto::ExecProcess x;
        x.proc = static_cast<std::uint16_t>(1 + c.pick(2));
        if (m.execs[x.proc]) break;  // the loop numbers only free processes
        x.exec.argv = {"/bin/true"};
        if (c.pick(2)) {
          x.stdio = proto::Stdio{};
          if (c.pick(2)) x.stdio->terminal = proto::Terminal{};
        }
        if (s.exec(x)) m.execs[x.proc] = true;
        break;
      }
      case 16:
        if (m.data_open) s.exec_eof(static_cast<std::uint16_t>(1 + c.pick(2)), c.pick(2) ? proto::Stream::err : proto::Stream::out);
        break;
      case 17: {
        auto proc = static_cast<std::uint16_t>(1 + c.pick(2));
        if (m.exec_armed[proc]) {
          m.exec_armed[proc] = false;
          s.exec_timer_fired(proc, DataLinkState{m.data_open, m.data_open && c.pick(2) == 1});
        }
        break;
      }
    }
    check(s, reader, m);
  }
  return 0;
}
