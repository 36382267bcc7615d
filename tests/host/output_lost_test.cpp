// Output the host did not deliver (docs/host.md "Output lost"), with the guest's two channels
// scripted by the test over socketpairs: the exact loss of an `output_lost` (unsent + sent -
// bytes received, frames still in flight when the channel closed included) as an event, a gap
// in workload.log and the record's `lost`; a report that comes before the stream's data has
// ended here is settled only once it has; the host ends the wait on purpose only (shutdown()
// after the outcome); its deadlines restart while output still moves (the stop deadline, an
// exec'd process's window) and cut only a channel at rest. Every wait is on an event or bytes.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/socket.h>

#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <fstream>
#include <iterator>

#include "host/lib/data_channel.hpp"
#include "support.hpp"

// The cases live in the library's namespace: its types unqualified, the test support as test::.
namespace nes::host {
namespace {

using namespace std::chrono_literals;
using test::write_all;

/// The embedder's view through StdioHooks: each stream's bytes, and the closed hook's error
/// ("" = a clean close).
struct Seen {
  std::string out, err;
  std::optional<std::string> closed;
};

/// Data frames of `bytes` on `stream` of process `proc` (split at the frame cap).
std::string frames(proto::Stream stream, std::string_view bytes, std::uint16_t proc = 0) {
  std::string f;
  while (!bytes.empty()) {
    auto n = std::min<std::size_t>(bytes.size(), proto::kFrameDataMax);
    proto::append_data(f, stream, bytes.substr(0, n), proc);
    bytes.remove_prefix(n);
  }
  return f;
}

std::string line(const proto::GuestMessage& m) { return proto::encode_line(m); }

/// One VM with both channels' guest ends held by the test.
struct Vm {
  std::shared_ptr<Seen> seen = std::make_shared<Seen>();
  test::Harness h;
  Fd life, data;  // the guest's ends
  std::string in;  // host lines read, not yet taken

  explicit Vm(std::function<void(HostOptions&)> more = {}, std::chrono::milliseconds stop = 2s)
      : h([s = seen, more](HostOptions& o) {
          o.stdio.data = [s](const std::string&, proto::Stream st, std::string_view b) {
            (st == proto::Stream::err ? s->err : s->out).append(b);
          };
          o.stdio.closed = [s](const std::string&, const std::string& e) { s->closed = e; };
          if (more) more(o);
        }) {
    auto c = h.config("o");
    c.stop_timeout = stop;
    c.descriptor.stdio = proto::Stdio{};
    REQUIRE(h.host->add_vm(c));
    auto life_pair = testing::stream_pair();
    REQUIRE(life_pair);
    REQUIRE(h.host->attach_stream("o", std::move(life_pair->first)));
    life = std::move(life_pair->second);
    auto data_pair = testing::stream_pair();
    REQUIRE(data_pair);
    REQUIRE(h.host->attach_data_stream("o", std::move(data_pair->first)));
    data = std::move(data_pair->second);
    REQUIRE(h.host->vm_started("o"));
  }

  /// The next host line's type on the lifecycle channel.
  std::string next() {
    REQUIRE(h.run_until([&] {
      char b[4096];
      ssize_t n;
      while ((n = ::recv(life.get(), b, sizeof b, MSG_DONTWAIT)) > 0) in.append(b, static_cast<std::size_t>(n));
      return in.find('\n') != std::string::npos;
    }));
    auto nl = in.find('\n');
    std::string l = in.substr(0, nl);
    in.erase(0, nl + 1);
    return testing::host_type(l);
  }
  void say(std::string_view bytes) { write_all(life.get(), bytes); }
  /// ready, boot, started: the workload runs.
  void boot() {
    say(testing::ready_line());
    REQUIRE(next() == "boot");
    say(testing::started_line(9));
    REQUIRE(h.run_until([&] { return h.has_event("o", "started"); }));
  }
  /// The workload exits with `code`; the host records it and acknowledges (`shutdown`).
  void exit_acked(int code) {
    say(testing::exited_line(code));
    REQUIRE(next() == "shutdown");
  }
  /// The guest powers off: its lifecycle channel closes, the VMM exits.
  void power_off() {
    life.reset();
    REQUIRE(h.host->vm_exited("o"));
    REQUIRE(h.run_until([&] { return h.has_event("o", "finished"); }));
  }
  std::string detail(const std::string& kind) const {
    for (auto& e : h.events)
      if (e.vm == "o" && e.kind == kind) return e.detail;
    return "(no " + kind + " event)";
  }
  /// The eof frames of the workload's stdout and stderr.
  void send_eofs() {
    std::string eofs;
    proto::append_eof(eofs, proto::Stream::out);
    proto::append_eof(eofs, proto::Stream::err);
    write_all(data.get(), eofs);
  }
  std::string log() const {
    std::ifstream f(h.state / "o" / "workload.log", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
};

}  // namespace

TEST_CASE("output_lost after the host ended the wait: loss = unsent + sent - received, in-flight frames included") {
  Vm v;
  v.boot();
  // 100 000 bytes of stdout reach the embedder.
  write_all(v.data.get(), frames(proto::Stream::out, std::string(100000, 'a')));
  REQUIRE(v.h.run_until([&] { return v.seen->out.size() == 100000; }));
  // A slow consumer: reads stop (the one read in flight still completes: 10 000 bytes); 50 000
  // bytes more wait in the socket, unread.
  REQUIRE(v.h.host->pause_output("o", true));
  write_all(v.data.get(), frames(proto::Stream::out, std::string(10000, 'b')));
  REQUIRE(v.h.run_until([&] { return v.seen->out.size() == 110000; }));
  write_all(v.data.get(), frames(proto::Stream::out, std::string(50000, 'b')));
  v.exit_acked(0);
  // The guest holds its power-off for the receipt; the host owes the rest of the output.
  CHECK(v.h.host->output_owed("o"));
  CHECK(!v.h.has_event("o", "output_lost"));
  // `neshost stop` of a draining VM: the host ends the wait on purpose, closing the channel
  // before its eofs.
  REQUIRE(v.h.host->shutdown("o"));
  REQUIRE(v.h.run_until([&] { return v.seen->closed.has_value(); }));
  CHECK(v.detail("output_cut") == "the VM was stopped while its output was still being read");
  CHECK(!v.h.host->output_owed("o"));
  // The guest counts: 180 000 bytes framed onto the channel (20 000 of them still in the VMM's
  // queue when it closed), 3 000 never framed. Nothing of stderr was lost.
  v.say(line(proto::OutputEnd{0, proto::Stream::out, 180000, 3000}) +
        line(proto::OutputEnd{0, proto::Stream::err, 0, 0}));
  v.power_off();
  const std::uint64_t lost = 3000 + 180000 - 110000;
  CHECK(v.detail("output_lost") == fmt::format("stdout {} bytes", lost));
  CHECK(v.h.count_events("o", "output_lost") == 1);
  CHECK(!v.h.has_event("o", "output_truncated"));
  CHECK(v.seen->out == std::string(100000, 'a') + std::string(10000, 'b'));
  // The log has a gap where the bytes are missing (the CRI convention of a lossy drop).
  const std::string log = v.log();
  CHECK(log.find(fmt::format(" stdout F:g1 [neshost: {} bytes of stdout lost]\n", lost)) != std::string::npos);
  // The record, amended after the outcome: the first outcome stays, the loss is added.
  auto rec = v.h.record("o");
  REQUIRE(rec);
  CHECK(rec->outcome == proto::Outcome::exited);
  CHECK(rec->exit_status == 0);
  CHECK(rec->lost.out == lost);
  CHECK(!rec->lost.err);
  CHECK(rec->truncated.empty());
  CHECK(rec->lost_reason == "the VM was stopped while its output was still being read");
  CHECK(reported_status(*rec) == 125);
  CHECK(v.h.session("o").outcome()->lost.out == lost);  // what serve_vm() returns from
  CHECK(v.h.has_event("o", "record_amended"));
  REQUIRE(describe_loss(*rec).size() == 1);
  CHECK(describe_loss(*rec)[0] ==
        fmt::format("{} bytes of stdout lost: the VM was stopped while its output was still being read", lost));
}

TEST_CASE("a report before the stream's data has ended here is settled when it has: received is final then") {
  Vm v;
  v.boot();
  REQUIRE(v.h.host->pause_output("o", true));
  // The read in flight takes the first 1 000 bytes; the next 29 000 wait unread.
  write_all(v.data.get(), frames(proto::Stream::out, std::string(1000, 'c')));
  REQUIRE(v.h.run_until([&] { return v.seen->out.size() == 1000; }));
  write_all(v.data.get(), frames(proto::Stream::out, std::string(29000, 'c')));
  v.exit_acked(4);
  // The guest gave up on stdout (sent 40 000, 10 000 of them lost in transport; 500 never
  // framed) while 29 000 of the 30 000 that reached the host are still unread; it closes
  // the channel and powers off. The VMM's exit races the lifecycle channel's last lines.
  v.say(line(proto::OutputEnd{0, proto::Stream::out, 40000, 500}) + line(proto::OutputEnd{0, proto::Stream::err, 0, 0}));
  v.data.reset();
  v.power_off();
  // Counted against the 30 000 read at the end (the finished VM's channel is drained), not
  // against the 1 000 read when the report came.
  CHECK(v.seen->out == std::string(30000, 'c'));
  CHECK(v.detail("output_lost") == "stdout 10500 bytes");
  auto rec = v.h.record("o");
  CHECK(rec->exit_status == 4);
  CHECK(rec->lost.out == 10500u);
  CHECK(rec->lost_reason == "the data channel closed before its end");
  CHECK(reported_status(*rec) == 125);
}

TEST_CASE("the stop deadline restarts while a slow consumer holds the output: nothing destroyed, nothing lost") {
  Vm v({}, 300ms);
  v.boot();
  REQUIRE(v.h.host->pause_output("o", true));
  const std::string out(50000, 'd');
  write_all(v.data.get(), frames(proto::Stream::out, out));
  v.exit_acked(0);
  // 300 ms after the ack the deadline fires with the output still unread: restarted, not cut.
  REQUIRE(v.h.run_until([&] { return v.h.has_event("o", "stop_deferred") || v.h.destroyed["o"] > 0; }));
  CHECK(v.h.destroyed["o"] == 0);
  CHECK(!v.h.has_event("o", "output_cut"));
  // The consumer catches up; the eofs come; the host closes the channel (the receipt).
  REQUIRE(v.h.host->pause_output("o", false));
  v.send_eofs();
  REQUIRE(v.h.run_until([&] { return v.seen->closed.has_value(); }));
  CHECK(*v.seen->closed == "");
  v.power_off();
  CHECK(v.seen->out == out);
  CHECK(v.h.destroyed["o"] == 0);
  CHECK(!v.h.has_event("o", "output_lost"));
  CHECK(!v.h.has_event("o", "output_truncated"));
  auto rec = v.h.record("o");
  CHECK(rec->lost.empty());
  CHECK(rec->truncated.empty());
  CHECK(reported_status(*rec) == 0);
}

TEST_CASE("a channel at rest at the stop deadline is cut, the guest gets data_drain, then destroy; no count: truncated") {
  Vm v([](HostOptions& o) { o.data_drain = 200ms; }, 300ms);
  v.h.on_destroy = [&](const std::string& vm) {
    boost::asio::post(v.h.io, [&, vm] {
      v.life.reset();  // the VMM is killed: its channel closes
      (void)v.h.host->vm_exited(vm);
    });
  };
  v.boot();
  write_all(v.data.get(), frames(proto::Stream::out, std::string(1000, 'e')));
  REQUIRE(v.h.run_until([&] { return v.seen->out.size() == 1000; }));
  v.exit_acked(0);
  // Nothing moves and the guest (an init without the receipt's output_lost) never powers off.
  REQUIRE(v.h.run_until([&] { return v.h.has_event("o", "finished"); }));
  CHECK(v.detail("output_cut") == "the guest did not power off within the stop deadline (300 ms)");
  CHECK(v.h.destroyed["o"] == 1);
  // The destroy came data_drain after the cut, never before it.
  std::size_t cut = 0, destroy = 0;
  for (std::size_t i = 0; i < v.h.events.size(); ++i) {
    if (v.h.events[i].kind == "output_cut") cut = i;
    if (v.h.events[i].kind == "destroy") destroy = i;
  }
  CHECK(cut < destroy);
  CHECK(v.detail("output_truncated").find("stdout: its eof never arrived (1000 bytes received)") == 0);
  auto rec = v.h.record("o");
  CHECK(rec->truncated.out == 1000u);
  CHECK(rec->truncated.err == 0u);
  CHECK(rec->lost.empty());
  CHECK(reported_status(*rec) == 125);
  CHECK(v.log().find(" stdout F:g1 [neshost: stdout truncated: its eof never arrived (1000 bytes received)]\n") !=
        std::string::npos);
}

TEST_CASE("shutdown() before the outcome cuts nothing: the stopped workload's output is drained") {
  Vm v;
  v.boot();
  REQUIRE(v.h.host->pause_output("o", true));
  write_all(v.data.get(), frames(proto::Stream::out, std::string(20000, 'f')));
  REQUIRE(v.h.host->shutdown("o"));  // SIGINT to `neshost run` while the workload runs
  REQUIRE(v.next() == "stop");
  CHECK(!v.h.host->output_owed("o"));
  CHECK(!v.h.has_event("o", "output_cut"));
  v.exit_acked(15);
  CHECK(v.h.host->output_owed("o"));
  REQUIRE(v.h.host->pause_output("o", false));
  v.send_eofs();
  REQUIRE(v.h.run_until([&] { return v.seen->closed.has_value(); }));
  v.power_off();
  CHECK(v.seen->out == std::string(20000, 'f'));
  CHECK(reported_status(*v.h.record("o")) == 15);
}

TEST_CASE("the host ends the VM on purpose before the outcome: its stop deadline is kept, then what is owed is cut") {
  Vm v({}, 300ms);
  v.boot();
  REQUIRE(v.h.host->pause_output("o", true));
  write_all(v.data.get(), frames(proto::Stream::out, std::string(1000, 'g')));  // the read in flight
  REQUIRE(v.h.run_until([&] { return v.seen->out.size() == 1000; }));
  write_all(v.data.get(), frames(proto::Stream::out, std::string(9000, 'g')));
  REQUIRE(v.h.host->shutdown("o"));  // SIGINT to `neshost run`, `neshost stop`
  REQUIRE(v.next() == "stop");
  v.exit_acked(0);
  // A consumer that never catches up does not hold an end the host asked for: at the deadline
  // the channel is cut (not restarted), and the guest counts.
  REQUIRE(v.h.run_until([&] { return v.seen->closed.has_value(); }));
  CHECK(!v.h.has_event("o", "stop_deferred"));
  CHECK(v.detail("output_cut") == "the VM was stopped while its output was still being read");
  v.say(line(proto::OutputEnd{0, proto::Stream::out, 10000, 0}) + line(proto::OutputEnd{0, proto::Stream::err, 0, 0}));
  v.power_off();
  CHECK(v.h.destroyed["o"] == 0);  // it powered off within data_drain
  CHECK(v.h.record("o")->lost.out == 9000u);
}

TEST_CASE("an exec'd process's window restarts while its output is held back; then all of it, no loss") {
  Vm v([](HostOptions& o) { o.data_drain = 100ms; });
  v.boot();
  struct ExecSeen {
    std::string out;
    std::optional<ExecEnd> end;
    int lost = 0;
  };
  auto xs = std::make_shared<ExecSeen>();
  ExecHooks hooks;
  hooks.data = [xs](proto::Stream, std::string_view b) { xs->out.append(b); };
  hooks.lost = [xs](proto::Stream, std::optional<std::uint64_t>, std::uint64_t) { ++xs->lost; };
  hooks.ended = [xs](const ExecEnd& e) { xs->end = e; };
  proto::Exec ex;
  ex.argv = {"/bin/cat", "/big"};
  auto proc = v.h.host->exec("o", ex, proto::Stdio{}, hooks);
  REQUIRE(proc);
  REQUIRE(v.next() == "exec");
  v.say(line(proto::ExecStarted{*proc, 50}));
  REQUIRE(v.h.run_until([&] { return v.h.has_event("o", "exec_started"); }));
  // A slow `neshost exec` client: the monitor pauses the channel; the process's output and
  // eofs wait in the socket while its exec_exited arrives on the lifecycle channel.
  REQUIRE(v.h.host->pause_output("o", true));
  const std::string out(70000, 'x');
  write_all(v.data.get(), frames(proto::Stream::out, out.substr(0, 1000), *proc));  // the read in flight
  REQUIRE(v.h.run_until([&] { return xs->out.size() == 1000; }));
  std::string f = frames(proto::Stream::out, out.substr(1000), *proc);
  proto::append_eof(f, proto::Stream::out, *proc);
  proto::append_eof(f, proto::Stream::err, *proc);
  write_all(v.data.get(), f);
  v.say(line(proto::ExecExited{*proc, 0, std::nullopt}));
  // Its 100 ms window ends with the output unread: restarted, the process not ended.
  REQUIRE(v.h.run_until([&] { return v.h.has_event("o", "exec_output_wait") || xs->end.has_value(); }));
  CHECK(!xs->end);
  REQUIRE(v.h.host->pause_output("o", false));
  REQUIRE(v.h.run_until([&] { return xs->end.has_value(); }));
  CHECK(xs->out == out);
  CHECK(xs->lost == 0);
  REQUIRE(std::holds_alternative<proto::ExecExited>(*xs->end));
  CHECK(exec_exit_status(*xs->end) == 0);
}

TEST_CASE("an exec'd process whose streams end without their eofs: its lost hook says so before ended") {
  Vm v;
  v.boot();
  struct ExecSeen {
    std::vector<std::string> lost;
    bool ended = false;
    std::size_t lost_at_end = 0;
  };
  auto xs = std::make_shared<ExecSeen>();
  ExecHooks hooks;
  hooks.lost = [xs](proto::Stream s, std::optional<std::uint64_t> bytes, std::uint64_t received) {
    xs->lost.push_back(fmt::format("{} {} {}", proto::to_string(s), bytes ? std::to_string(*bytes) : "?", received));
  };
  hooks.ended = [xs](const ExecEnd&) {
    xs->ended = true;
    xs->lost_at_end = xs->lost.size();
  };
  proto::Exec ex;
  ex.argv = {"/bin/sh"};
  auto proc = v.h.host->exec("o", ex, proto::Stdio{}, hooks);
  REQUIRE(proc);
  REQUIRE(v.next() == "exec");
  v.say(line(proto::ExecStarted{*proc, 51}));
  write_all(v.data.get(), frames(proto::Stream::out, "partial", *proc));
  // The guest counted stdout (sent 7 + 93 in flight, 900 never framed), not stderr.
  v.say(line(proto::ExecExited{*proc, 0, std::nullopt}) + line(proto::OutputEnd{*proc, proto::Stream::out, 100, 900}));
  REQUIRE(v.h.run_until([&] { return v.h.has_event("o", "exec_exited"); }));
  v.data.reset();  // the channel ends before its eofs
  REQUIRE(v.h.run_until([&] { return xs->ended; }));
  CHECK(xs->lost_at_end == 2);
  CHECK(xs->lost == std::vector<std::string>{"stdout 993 7", "stderr ? 0"});
  CHECK(v.detail("output_lost") == fmt::format("proc={} stdout 993 bytes", *proc));
}

}  // namespace nes::host
