// The workload's stdio without fds: StdioCore (buffers, framing, flow control, stdin, resize,
// framing errors) and the session's stdio rules (the data channel dialled before the mounts,
// workload_exited held until both outputs are at EOF or the drain window ends). Then make_stdio's
// real pipes and PTY.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <algorithm>
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <vector>

#include "nesinit/session.hpp"
#include "tests/support/init_session.hpp"
#include "nesinit/stdio.hpp"
#include "protocol/frame.hpp"

using namespace nes::init;
using namespace nes::init::test;
namespace proto = nes::proto;
using proto::Stream;

namespace {

/// Everything the core wants written now, written in full (a host that keeps up).
std::string drain_tx(StdioCore& c) {
  std::string all;
  for (std::string_view v = c.tx(); !v.empty(); v = c.tx()) {
    all.append(v);
    c.sent(v.size());
  }
  return all;
}

/// Decodes guest frames as a host would.
std::vector<proto::Frame> frames(std::string_view wire, bool terminal = false, bool lossy = false) {
  proto::FrameDecoder d({proto::FrameSender::guest, terminal, false, lossy});
  std::vector<proto::Frame> out;
  while (auto f = d.next(wire)) out.push_back(std::move(*f));
  REQUIRE_MESSAGE(!d.failed(), d.error());
  REQUIRE(wire.empty());
  return out;
}

std::string data_of(const std::vector<proto::Frame>& fs, Stream s) {
  std::string out;
  for (auto& f : fs)
    if (f.stream == s && f.kind == proto::FrameKind::data) out += f.data;
  return out;
}

proto::Stdio pipes(std::uint32_t cap = 4096, bool lossy = false, bool in = false) {
  proto::Stdio s;
  s.buffer_bytes = cap;
  s.mode = lossy ? proto::StdioMode::lossy : proto::StdioMode::lossless;
  s.attach_stdin = in;
  return s;
}

proto::Frame fdata(std::string d) {
  proto::Frame f;
  f.stream = Stream::in;
  f.kind = proto::FrameKind::data;
  f.data = std::move(d);
  return f;
}
proto::Frame feof(Stream s = Stream::in) {
  proto::Frame f;
  f.stream = s;
  f.kind = proto::FrameKind::eof;
  return f;
}
proto::Frame fresize(std::uint16_t r, std::uint16_t c) {
  proto::Frame f;
  f.stream = Stream::in;
  f.kind = proto::FrameKind::resize;
  f.rows = r;
  f.cols = c;
  return f;
}

std::string host_frames(std::initializer_list<proto::Frame> fs) {
  std::string out;
  for (auto& f : fs) proto::append_frame(out, f);
  return out;
}

}  // namespace

TEST_CASE("output: bytes per stream become data frames in order; eof follows the last byte") {
  StdioCore c(pipes());
  c.on_output(Stream::out, "hello ");
  c.on_output(Stream::err, "oops");
  c.on_output(Stream::out, "world");
  c.on_output_eof(Stream::out);
  CHECK(!c.outputs_done());
  c.on_output_eof(Stream::err);
  CHECK(c.outputs_done());
  const auto fs = frames(drain_tx(c));
  CHECK(data_of(fs, Stream::out) == "hello world");
  CHECK(data_of(fs, Stream::err) == "oops");
  REQUIRE(fs.size() >= 2);
  int eofs = 0;
  for (auto& f : fs) eofs += f.kind == proto::FrameKind::eof;
  CHECK(eofs == 2);
  CHECK(fs.back().kind == proto::FrameKind::eof);
  CHECK(!c.tx_pending());
  CHECK(c.buffered() == 0);
}

TEST_CASE("lossless: at most buffer_bytes unsent per stream, then the pipe is not read") {
  StdioCore c(pipes(4096));
  CHECK(c.out_room(Stream::out) == 4096);
  c.on_output(Stream::out, std::string(4000, 'a'));
  CHECK(c.out_room(Stream::out) == 96);
  c.on_output(Stream::out, std::string(96, 'b'));
  CHECK(c.out_room(Stream::out) == 0);          // full: the workload will block in write(2)
  CHECK(c.out_room(Stream::err) == 4096);       // the other stream is independent
  // A host that reads nothing: tx() frames at most one frame per stream; nothing is lost.
  std::string_view v = c.tx();
  CHECK(v.size() == 4096 + proto::kFrameHeader);
  CHECK(c.out_room(Stream::out) == 4096);       // framed bytes left the stream's buffer
  c.on_output(Stream::out, std::string(4096, 'c'));
  CHECK(c.out_room(Stream::out) == 0);
  CHECK(c.buffered() == 2 * 4096 + proto::kFrameHeader);
  const auto fs = frames(drain_tx(c));
  CHECK(data_of(fs, Stream::out) == std::string(4000, 'a') + std::string(96, 'b') + std::string(4096, 'c'));
}

TEST_CASE("lossy: the oldest unsent bytes are dropped and counted, before the next data") {
  StdioCore c(pipes(4096, true));
  CHECK(c.out_room(Stream::out) == kStdioChunk);  // always read
  std::string all;
  for (int i = 0; i < 10; ++i) {
    std::string chunk(1000, static_cast<char>('0' + i));
    all += chunk;
    c.on_output(Stream::out, chunk);
  }
  c.on_output_eof(Stream::out);
  c.on_output_eof(Stream::err);
  const auto fs = frames(drain_tx(c), false, true);
  REQUIRE(fs.size() >= 2);
  CHECK(fs[0].kind == proto::FrameKind::dropped);
  CHECK(fs[0].dropped == 10000 - 4096);
  CHECK(data_of(fs, Stream::out) == all.substr(10000 - 4096));
  // More than the whole ring in one read: only the newest cap bytes are kept.
  StdioCore d(pipes(4096, true));
  d.on_output(Stream::err, std::string(5000, 'x') + std::string(4096, 'y'));
  const auto gs = frames(drain_tx(d), false, true);
  REQUIRE(gs.size() == 2);
  CHECK(gs[0].dropped == 5000);
  CHECK(gs[1].data == std::string(4096, 'y'));
}

TEST_CASE("the two streams take turns: a flood on stdout does not starve stderr") {
  StdioCore c(pipes(1 << 20));
  c.on_output(Stream::out, std::string(5 * proto::kFrameDataMax, 'o'));
  std::string_view first = c.tx();
  c.sent(first.size());
  c.on_output(Stream::err, "E");
  const auto fs = frames(std::string(c.tx()));
  bool err_seen = false;
  for (auto& f : fs) err_seen |= f.stream == Stream::err;
  CHECK(err_seen);
}

TEST_CASE("the channel gone: output is read and discarded, EOF still tracked") {
  StdioCore c(pipes(4096));
  c.on_output(Stream::out, std::string(4096, 'a'));
  CHECK(c.out_room(Stream::out) == 0);
  c.channel_closed();
  CHECK(c.out_room(Stream::out) == kStdioChunk);
  c.on_output(Stream::out, std::string(100000, 'b'));
  CHECK(c.buffered() == 0);
  CHECK(c.tx().empty());
  c.on_output_eof(Stream::out);
  c.on_output_eof(Stream::err);
  CHECK(c.outputs_done());
}

/// A direct frame as the loop moves it: its header, then `payload` taken from the pipe.
std::string direct_frame(StdioCore& c, Stream s, const std::string& payload) {
  auto f = c.direct_begin(s, payload.size());
  REQUIRE(f);
  REQUIRE(f->bytes == payload.size());
  REQUIRE(c.direct_pending());
  CHECK(c.direct_pending()->stream == s);
  CHECK(c.direct_pending()->left == payload.size());
  c.direct_taken(payload.size());
  CHECK(c.direct_pending()->left == 0);
  c.direct_done();
  return std::string(f->header, sizeof f->header) + payload;
}

TEST_CASE("direct: lossless pipes; a frame's header, then exactly its payload from the pipe, nothing between") {
  StdioCore c(pipes(1 << 20));
  REQUIRE(c.direct_mode());
  CHECK(c.direct_room(Stream::out) == proto::kFrameDataMax);
  auto f = c.direct_begin(Stream::out, 100000);  // more than a frame waits: one frame's worth
  REQUIRE(f);
  CHECK(f->bytes == proto::kFrameDataMax);
  std::string wire(f->header, sizeof f->header);
  // While the payload is on its way nothing else may be framed, and no second frame begins.
  c.on_output_eof(Stream::err);
  CHECK(c.tx_pending());
  CHECK(c.tx().empty());
  CHECK(c.direct_room(Stream::err) == 0);
  CHECK(c.direct_room(Stream::out) == 0);
  CHECK(c.buffered() == proto::kFrameDataMax);
  c.direct_taken(1000);
  CHECK(c.direct_pending()->left == proto::kFrameDataMax - 1000);
  c.direct_taken(proto::kFrameDataMax - 1000);
  c.direct_done();
  wire += std::string(proto::kFrameDataMax, 'a');
  // Then stderr's eof, framed the usual way; then direct frames again.
  const std::string eof = drain_tx(c);
  CHECK(!eof.empty());
  wire += eof;
  wire += direct_frame(c, Stream::out, "tail");
  c.on_output_eof(Stream::out);
  CHECK(c.direct_room(Stream::out) == 0);  // at EOF
  wire += drain_tx(c);
  const auto fs = frames(wire);
  REQUIRE(fs.size() == 4);
  CHECK(fs[0].data == std::string(proto::kFrameDataMax, 'a'));
  CHECK((fs[1].stream == Stream::err && fs[1].kind == proto::FrameKind::eof));
  CHECK(fs[2].data == "tail");
  CHECK((fs[3].stream == Stream::out && fs[3].kind == proto::FrameKind::eof));
  CHECK(c.outputs_done());
  CHECK(!c.tx_pending());
}

TEST_CASE("direct: bytes already buffered go first; the streams take turns") {
  StdioCore c(pipes(1 << 20));
  // Bytes read the copying way (they came between FIONREAD and the read): framed before any
  // direct frame, so the stream's order holds.
  c.on_output(Stream::out, "early ");
  CHECK(c.direct_room(Stream::out) == 0);
  CHECK(c.direct_room(Stream::err) == 0);
  std::string wire = drain_tx(c);
  CHECK(c.direct_room(Stream::out) > 0);
  const Stream first = c.first_stream();
  wire += direct_frame(c, first, "one");
  CHECK(c.first_stream() != first);  // the other stream's turn
  wire += direct_frame(c, c.first_stream(), "two");
  CHECK(c.first_stream() == first);
  const auto fs = frames(wire);
  CHECK(data_of(fs, Stream::out) == (first == Stream::out ? "early one" : "early two"));
  CHECK(data_of(fs, Stream::err) == (first == Stream::out ? "two" : "one"));
}

TEST_CASE("direct: not for lossy output or a terminal; the channel gone ends a frame in progress") {
  CHECK(!StdioCore(pipes(4096, true)).direct_mode());
  proto::Stdio t;
  t.terminal = proto::Terminal{24, 80};
  StdioCore term(t);
  CHECK(!term.direct_mode());
  CHECK(term.direct_room(Stream::out) == 0);
  CHECK(!term.direct_begin(Stream::out, 10));
  StdioCore c(pipes(4096));
  REQUIRE(c.direct_begin(Stream::out, 10));
  c.channel_closed();
  CHECK(!c.direct_pending());
  CHECK(!c.direct_mode());
  CHECK(!c.tx_pending());
  CHECK(c.out_room(Stream::out) == kStdioChunk);  // read and discarded from now on
}

TEST_CASE("direct: a channel that cannot splice gets the frame as copies, and copies from then on") {
  StdioCore c(pipes(1 << 20));
  auto f = c.direct_begin(Stream::err, 6);
  REQUIRE(f);
  std::string wire(f->header, 3);  // part of the header was already sent when splicing failed
  c.direct_fill(std::string_view(f->header + 3, sizeof f->header - 3));
  c.direct_fill("abc");
  c.direct_taken(3);
  CHECK(c.tx_pending());
  wire += drain_tx(c);
  c.direct_fill("def");
  c.direct_taken(3);
  c.direct_done();
  wire += drain_tx(c);
  CHECK(!c.direct_mode());
  CHECK(c.direct_room(Stream::out) == 0);
  c.on_output(Stream::out, "copied");
  wire += drain_tx(c);
  const auto fs = frames(wire);
  CHECK(data_of(fs, Stream::err) == "abcdef");
  CHECK(data_of(fs, Stream::out) == "copied");
}

TEST_CASE("stdin: data to the workload in order, bounded; eof closes it after the last byte") {
  StdioCore c(pipes(4096, false, true));
  CHECK(c.rx_room() > 0);
  const std::string wire = host_frames({fdata("abc"),
                                        fdata("def\n"),
                                        feof()});
  // Any split.
  for (std::size_t i = 0; i < wire.size(); ++i) c.on_rx(std::string_view(wire).substr(i, 1));
  CHECK(c.in_pending() == "abcdef\n");
  CHECK(!c.in_close_due());  // not before its bytes are written
  c.in_written(3);
  CHECK(c.in_pending() == "def\n");
  c.in_written(4);
  CHECK(c.in_close_due());
  c.in_closed();
  CHECK(!c.in_close_due());
  CHECK(c.rx_error().empty());
}

TEST_CASE("stdin: the buffer is bounded; a full buffer stops reading the data channel") {
  StdioCore c(pipes(4096, false, true));
  // A host with 1 MiB of stdin for a workload that reads nothing; the loop reads at most rx_room().
  std::string wire;
  for (int i = 0; i < 1024; ++i) proto::append_data(wire, Stream::in, std::string(1000, static_cast<char>('a' + i % 26)));
  std::size_t off = 0;
  while (c.rx_room() > 0 && off < wire.size()) {
    const std::size_t n = std::min(c.rx_room(), wire.size() - off);
    c.on_rx(std::string_view(wire).substr(off, n));
    off += n;
  }
  CHECK(c.rx_room() == 0);
  CHECK(off < wire.size());
  CHECK(c.in_pending().size() <= kStdinCap);
  CHECK(c.in_pending().size() > kStdinCap / 2);
  c.in_written(c.in_pending().size());
  CHECK(c.rx_room() > 0);  // written: the channel is read again
  CHECK(c.rx_error().empty());
}

TEST_CASE("stdin: after the workload closed it, more data is discarded, not an error") {
  StdioCore c(pipes(4096, false, true));
  c.in_closed();
  c.on_rx(host_frames({fdata("late")}));
  CHECK(c.in_pending().empty());
  CHECK(c.rx_error().empty());
}

TEST_CASE("terminal: resize is taken once; eof becomes ^D; stderr does not exist") {
  proto::Stdio s;
  s.terminal = proto::Terminal{24, 80};
  s.attach_stdin = true;
  StdioCore c(s);
  c.on_rx(host_frames({fresize(50, 132)}));
  auto r = c.take_resize();
  REQUIRE(r);
  CHECK(*r == proto::Terminal{50, 132});
  CHECK(!c.take_resize());
  c.on_rx(host_frames({fdata("\x03"), feof()}));
  CHECK(c.in_pending() == "\x03\x04");
  c.on_output(Stream::out, "x");
  c.on_output_eof(Stream::out);
  CHECK(c.outputs_done());  // the PTY is the only output
  const auto fs = frames(drain_tx(c), true);
  REQUIRE(fs.size() == 2);
  CHECK(fs[1] == feof(Stream::out));
}

TEST_CASE("terminal without stdin: data is a framing error, a stray eof is no ^D") {
  proto::Stdio s;
  s.terminal = proto::Terminal{24, 80};
  StdioCore c(s);
  c.on_rx(host_frames({feof()}));
  CHECK(c.in_pending().empty());
  c.on_rx(host_frames({fdata("x")}));
  CHECK(c.rx_error() == "data frame on stdin: stdin not attached (frame at byte 8)");
  CHECK(c.rx_room() == 0);
}

TEST_CASE("framing errors from the host are named; EOF inside a frame is one") {
  StdioCore c(pipes(4096, false, true));
  c.on_rx(std::string("\x07\x00\x00\x00\x00\x00\x00\x01x", 9));
  CHECK(c.rx_error() == "data frame: stream 7 unknown (frame at byte 0)");
  CHECK(c.rx_room() == 0);
  StdioCore d(pipes(4096, false, true));
  d.on_rx(std::string("\x00\x00\x00", 3));
  d.on_rx_eof();
  CHECK(d.rx_error() == "data channel closed inside a frame (at byte 3)");
  StdioCore e(pipes(4096, false, true));
  e.on_rx_eof();  // a clean EOF is stdin's eof
  CHECK(e.rx_error().empty());
  CHECK(e.in_close_due());
}

// ---- the session's stdio rules --------------------------------------------------------------------

namespace {
constexpr SessionOptions kOpt{1000, 300, 5000, proto::Halt::poweroff};

proto::Boot stdio_boot(std::uint32_t drain_ms = 500) {
  proto::Boot b;
  b.exec.argv = {"/bin/true"};
  b.on_exit.terminal = true;
  b.stdio = proto::Stdio{};
  b.stdio->drain_ms = drain_ms;
  return b;
}

Session running_with_stdio(std::uint32_t drain_ms = 500) {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  auto a = s.handle(msg(stdio_boot(drain_ms)));
  REQUIRE(only<act::DialData>(a).size() == 1);
  REQUIRE(only<act::Mount>(a).empty());  // the data channel first
  a = s.handle(ev::DataUp{});
  REQUIRE(only<act::Mount>(a).size() == 1);
  s.handle(ev::MountsDone{});
  s.handle(ev::Started{42});
  REQUIRE(s.phase() == Phase::running);
  return s;
}
}  // namespace

TEST_CASE("session: without stdio nothing changes (no data channel, the exit reported at once)") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  proto::Boot b = stdio_boot();
  b.stdio.reset();
  auto a = s.handle(msg(b));
  CHECK(only<act::DialData>(a).empty());
  CHECK(only<act::Mount>(a).size() == 1);
  s.handle(ev::MountsDone{});
  s.handle(ev::Started{42});
  a = s.handle(ev::Exited{proto::WorkloadExited::code(0)});
  CHECK(sent(a) == std::vector<std::string>{"workload_exited"});
}

TEST_CASE("session: the data channel cannot be dialled: start_failed (other), nothing mounted") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  s.handle(msg(stdio_boot()));
  auto a = s.handle(ev::DataFailed{"data channel unix:/x: Connection refused", 111});
  REQUIRE(sent(a) == std::vector<std::string>{"start_failed"});
  auto f = std::get<proto::StartFailed>(only<act::Send>(a)[0].msg);
  CHECK(f.cls == proto::StartFailClass::other);
  CHECK(f.err == 111);
  CHECK(f.reason.find("data channel") != std::string::npos);
  CHECK(only<act::Mount>(a).empty());
  CHECK(s.phase() == Phase::shutting_down);
}

TEST_CASE("session: the data channel's dial is bounded and retried like the first dial") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  auto a = s.handle(msg(stdio_boot()));
  auto d = only<act::DialData>(a);
  REQUIRE(d.size() == 1);
  CHECK(d[0].attempt_ms == kOpt.connect_timeout_ms);
  CHECK(d[0].stdio == *stdio_boot().stdio);  // the action carries what the loop needs
  CHECK(armed(a, Timer::data_dial, kOpt.connect_timeout_ms));
  std::vector<std::uint32_t> waits;
  for (int i = 0; i < 3; ++i) {
    auto f = s.handle(ev::DataFailed{"data channel unix:/x: Connection refused", ECONNREFUSED, true});
    CHECK(sent(f).empty());
    CHECK(only<act::DialData>(f).empty());
    for (auto& t : only<act::ArmTimer>(f))
      if (t.timer == Timer::data_redial) waits.push_back(t.ms);
    CHECK(only<act::DialData>(s.handle(ev::TimerFired{Timer::data_redial})).size() == 1);
  }
  CHECK(waits == std::vector<std::uint32_t>{10, 20, 40});
  auto up = s.handle(ev::DataUp{});
  CHECK(only<act::Mount>(up).size() == 1);
  CHECK(cancelled(up, Timer::data_dial));
  CHECK(s.handle(ev::TimerFired{Timer::data_dial}).empty());
}

TEST_CASE("session: the data channel's deadline: start_failed with the last attempt's error") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  s.handle(msg(stdio_boot()));
  s.handle(ev::DataFailed{"data channel unix:/x: No such file or directory", ENOENT, true});
  auto a = s.handle(ev::TimerFired{Timer::data_dial});
  REQUIRE(sent(a) == std::vector<std::string>{"start_failed"});
  auto f = std::get<proto::StartFailed>(only<act::Send>(a)[0].msg);
  CHECK(f.err == ENOENT);
  CHECK(f.reason == "data channel unix:/x: No such file or directory");
  CHECK(cancelled(a, Timer::data_redial));
  CHECK(only<act::Mount>(a).empty());
  CHECK(s.phase() == Phase::shutting_down);
  CHECK(only<act::DialData>(s.handle(ev::TimerFired{Timer::data_redial})).empty());
}

TEST_CASE("session: SIGTERM while the data channel is dialled: start_failed (EINTR), then shutdown") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  s.handle(msg(stdio_boot()));
  auto a = s.handle(ev::Signal{SIGTERM});
  REQUIRE(sent(a) == std::vector<std::string>{"start_failed"});
  auto f = std::get<proto::StartFailed>(only<act::Send>(a)[0].msg);
  CHECK(f.err == EINTR);
  CHECK(f.reason == "data channel: dialling abandoned: signal 15");
  CHECK(cancelled(a, Timer::data_dial));
  CHECK(s.phase() == Phase::shutting_down);
  CHECK(only<act::Mount>(s.handle(ev::DataUp{})).empty());  // an attempt under way changes nothing
}

TEST_CASE("session: EOF while the data channel is dialled: nothing starts, the dial ends") {
  Session s(kOpt);
  s.handle(ev::ChannelUp{});
  s.handle(msg(stdio_boot()));
  auto a = s.handle(ev::Eof{});
  CHECK(s.phase() == Phase::shutting_down);
  CHECK(cancelled(a, Timer::data_dial));
  CHECK(sent(a).empty());
  CHECK(only<act::Mount>(s.handle(ev::DataUp{})).empty());
}

TEST_CASE("session: outputs at EOF before the reap: the exit goes out at the reap") {
  Session s = running_with_stdio();
  // The streams' accounts go out at their EOF; the exit at the reap.
  CHECK(sent(s.handle(ev::OutputsDone{})) == std::vector<std::string>{"output_end", "output_end"});
  auto a = s.handle(ev::Exited{proto::WorkloadExited::code(7)});
  CHECK(sent(a) == std::vector<std::string>{"workload_exited"});
}

TEST_CASE("session: reaped first: held until both outputs are at EOF") {
  Session s = running_with_stdio();
  auto a = s.handle(ev::Exited{proto::WorkloadExited::code(7)});
  CHECK(sent(a).empty());
  CHECK(armed(a, Timer::drain, 500));
  CHECK(s.phase() == Phase::running);
  a = s.handle(ev::OutputsDone{});
  REQUIRE(sent(a) == std::vector<std::string>{"output_end", "output_end", "workload_exited"});
  CHECK(std::get<proto::WorkloadExited>(only<act::Send>(a)[2].msg) == proto::WorkloadExited::code(7));
  CHECK(s.phase() == Phase::shutting_down);
  // The drain timer was cancelled: firing it now does nothing.
  CHECK(sent(s.handle(ev::TimerFired{Timer::drain})).empty());
}

TEST_CASE("session: a straggler keeps stdout open: the exit goes out when the drain window ends") {
  Session s = running_with_stdio(250);
  auto a = s.handle(ev::Exited{proto::WorkloadExited::killed(9)});
  CHECK(armed(a, Timer::drain, 250));
  // The window's end asks what is held; output still waiting for the host starts it again.
  a = s.handle(ev::TimerFired{Timer::drain});
  CHECK(sent(a).empty());
  REQUIRE(only<act::CheckHeld>(a).size() == 1);
  CHECK(only<act::CheckHeld>(a)[0].proc == 0);
  a = s.handle(ev::Held{0, 65536});
  CHECK(sent(a).empty());
  CHECK(armed(a, Timer::drain, 250));
  a = s.handle(ev::TimerFired{Timer::drain});
  CHECK(only<act::CheckHeld>(a).size() == 1);
  a = s.handle(ev::Held{0, 0});  // nothing waits: only the straggler holds the pipe open
  REQUIRE(sent(a) == std::vector<std::string>{"workload_exited"});
  CHECK(std::get<proto::WorkloadExited>(only<act::Send>(a)[0].msg) == proto::WorkloadExited::killed(9));
  // Then the ordered shutdown removes the straggler.
  CHECK(!only<act::SignalAll>(a).empty());
  // The straggler gone, the streams end: their accounts, the exit not again.
  CHECK(sent(s.handle(ev::OutputsDone{})) == std::vector<std::string>{"output_end", "output_end"});
}

TEST_CASE("session: a shutdown while the exit is held waits for it, then reports before powering off") {
  Session s = running_with_stdio();
  s.handle(msg(proto::Stop{}));
  auto a = s.handle(msg(proto::Shutdown{}));
  a = s.handle(ev::Exited{proto::WorkloadExited::killed(15)});
  CHECK(sent(a).empty());
  a = s.handle(ev::NoChildren{});
  CHECK(only<act::Flush>(a).empty());  // the outcome is not out yet
  a = s.handle(ev::OutputsDone{});
  CHECK(sent(a) == std::vector<std::string>{"output_end", "output_end", "workload_exited"});
  CHECK(only<act::Flush>(a).empty());  // now the host gets its chance to ack
  a = s.handle(msg(proto::Shutdown{}));
  CHECK(only<act::Flush>(a).size() == 1);  // the final flush, then power-off
}

TEST_CASE("session: a framing error is reported as protocol_error; the session goes on") {
  Session s = running_with_stdio();
  auto a = s.handle(ev::DataError{"data frame: stream 7 unknown (frame at byte 0)"});
  REQUIRE(sent(a) == std::vector<std::string>{"protocol_error"});
  CHECK(std::get<proto::ProtocolError>(only<act::Send>(a)[0].msg).reason ==
        "data channel: data frame: stream 7 unknown (frame at byte 0)");
  CHECK(s.phase() == Phase::running);
}

// ---- real fds ------------------------------------------------------------------------------------

TEST_CASE("make_stdio: pipes (stdin /dev/null unless attached), non-blocking and close-on-exec") {
  auto r = make_stdio(pipes());
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  StdioFds& f = *r;
  CHECK(!f.terminal);
  CHECK(!f.in);
  for (int fd : {f.out.get(), f.err.get()}) {
    CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
    CHECK((::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
  }
  char c;
  CHECK(::read(f.child_in.get(), &c, 1) == 0);  // /dev/null
  CHECK(::write(f.child_out.get(), "o", 1) == 1);
  CHECK(::read(f.out.get(), &c, 1) == 1);
  CHECK(c == 'o');
  CHECK(::read(f.out.get(), &c, 1) == -1);  // non-blocking, empty
  auto w = make_stdio(pipes(4096, false, true));
  REQUIRE_MESSAGE(w.ok(), w.error().message);
  StdioFds& g = *w;
  REQUIRE(g.in);
  CHECK(::write(g.in.get(), "i", 1) == 1);
  CHECK(::read(g.child_in.get(), &c, 1) == 1);
  CHECK(c == 'i');
}

TEST_CASE("make_stdio: lossless pipes hold the stream's buffer (output waits there for splice)") {
  auto r = make_stdio(pipes(1 << 20));
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  StdioFds& f = *r;
  // As root (the tests' PID 1 and a guest's) the kernel grows them; otherwise up to
  // fs.pipe-max-size, and a smaller pipe says so.
  const int got = ::fcntl(f.out.get(), F_GETPIPE_SZ);
  CHECK(f.pipes_hold_buffer == (got >= (1 << 20) && ::fcntl(f.err.get(), F_GETPIPE_SZ) >= (1 << 20)));
  if (::geteuid() == 0) CHECK(f.pipes_hold_buffer);
  auto lossy = make_stdio(pipes(1 << 20, true));
  REQUIRE_MESSAGE(lossy.ok(), lossy.error().message);
  CHECK(!lossy->pipes_hold_buffer);  // lossy output is always read at once
}

TEST_CASE("make_stdio: a PTY of the asked size; bytes both ways") {
  proto::Stdio s;
  s.terminal = proto::Terminal{33, 111};
  auto r = make_stdio(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  StdioFds& f = *r;
  CHECK(f.terminal);
  CHECK(::isatty(f.child_in.get()));
  winsize ws{};
  REQUIRE(::ioctl(f.child_in.get(), TIOCGWINSZ, &ws) == 0);
  CHECK(ws.ws_row == 33);
  CHECK(ws.ws_col == 111);
  CHECK(::write(f.child_in.get(), "t", 1) == 1);
  char c = 0;
  pollfd p{f.out.get(), POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  CHECK(::read(f.out.get(), &c, 1) == 1);
  CHECK(c == 't');
}

TEST_CASE("exec: the workload's core hands other processes' frames over; an exec'd core frames as its process") {
  proto::Stdio st;
  st.attach_stdin = true;
  StdioCore wl(st);
  REQUIRE(wl.open_process(3, st));
  std::string wire;
  proto::append_data(wire, Stream::in, "for-three", 3);
  proto::append_data(wire, Stream::in, "for-wl");
  proto::append_eof(wire, Stream::in, 3);
  wl.on_rx(wire);
  CHECK(wl.rx_error().empty());
  CHECK(wl.in_pending() == "for-wl");
  CHECK(wl.rx_room() == 0);  // foreign frames not yet taken: nothing more is read
  auto fs = wl.take_foreign();
  REQUIRE(fs.size() == 2);
  StdioCore three(st, 3);
  for (auto& f : fs) three.on_frame(f);
  CHECK(three.in_pending() == "for-three");
  three.in_written(9);
  CHECK(three.in_close_due());
  CHECK(wl.rx_room() > 0);
  // Output of process 3 is framed as process 3.
  three.on_output(Stream::err, "e");
  three.on_output_eof(Stream::err);
  three.on_output_eof(Stream::out);
  std::string tx(three.tx());
  three.sent(tx.size());
  proto::FrameDecoder d(proto::FrameRules{proto::FrameSender::guest, false, false, false});
  REQUIRE(d.open_process(3, proto::FrameRules{proto::FrameSender::guest, false, false, false}));
  std::string_view in = tx;
  std::vector<proto::Frame> out;
  while (auto f = d.next(in)) out.push_back(*f);
  REQUIRE(!d.failed());
  REQUIRE(out.size() == 3);
  for (auto& f : out) CHECK(f.proc == 3);
  CHECK(std::count_if(out.begin(), out.end(), [](const proto::Frame& f) {
          return f.stream == Stream::err && f.kind == proto::FrameKind::data && f.data == "e";
        }) == 1);
  CHECK(three.outputs_done());
  // Closed: its late frames are skipped, not an error.
  wl.close_process(3);
  std::string late;
  proto::append_data(late, Stream::in, "late", 3);
  wl.on_rx(late);
  CHECK(wl.rx_error().empty());
  CHECK(wl.take_foreign().empty());
}
