// StdioMux without fds, event by event: whose frames go out next on the shared data channel
// (turns; a begun turn finished first), how much may be read from the host (the least room of
// any stdin), which core a host frame goes to, and when a closed process's core goes. What a
// host would decode from the bytes written is checked with the guest-side FrameDecoder rules.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "nesinit/stdio_mux.hpp"
#include "protocol/frame.hpp"

using namespace nes::init;
namespace proto = nes::proto;
using proto::Stream;

namespace {

proto::Stdio pipes(bool in = false) {
  proto::Stdio s;
  s.buffer_bytes = 1u << 20;
  s.attach_stdin = in;
  return s;
}

/// One write the loop made: whose turn it was and how many bytes.
struct Write {
  std::uint16_t proc;
  std::size_t bytes;
};

/// Writes what the mux offers, at most `cap` bytes a write (a channel that takes that much), until
/// nothing is due or `max` writes were made; every byte is appended to `wire`.
std::vector<Write> drain(StdioMux& m, std::string& wire, std::size_t cap = SIZE_MAX, std::size_t max = SIZE_MAX) {
  std::vector<Write> ws;
  while (ws.size() < max) {
    auto t = m.tx();
    if (!t) break;
    REQUIRE(!t->bytes.empty());
    const std::size_t n = std::min(cap, t->bytes.size());
    wire.append(t->bytes.substr(0, n));
    ws.push_back({t->proc, n});
    m.sent(n);
  }
  return ws;
}

/// The turns in order: consecutive writes of one process are one turn.
std::vector<std::uint16_t> turns(const std::vector<Write>& ws) {
  std::vector<std::uint16_t> out;
  for (const Write& w : ws)
    if (out.empty() || out.back() != w.proc) out.push_back(w.proc);
  return out;
}

/// Decodes the wire as the host does, with processes `procs` open (lossless pipes): every frame,
/// or a failed CHECK naming the framing error (a process's bytes inside another's frame).
std::vector<proto::Frame> decode(std::string_view wire, std::initializer_list<std::uint16_t> procs) {
  const proto::FrameRules rules{proto::FrameSender::guest, false, false, false};
  proto::FrameDecoder d(rules);
  for (std::uint16_t p : procs) REQUIRE(d.open_process(p, rules));
  std::vector<proto::Frame> out;
  while (auto f = d.next(wire)) out.push_back(std::move(*f));
  REQUIRE_MESSAGE(!d.failed(), d.error());
  REQUIRE(wire.empty());
  return out;
}

std::string data_of(const std::vector<proto::Frame>& fs, std::uint16_t proc, Stream s = Stream::out) {
  std::string out;
  for (const proto::Frame& f : fs)
    if (f.proc == proc && f.stream == s && f.kind == proto::FrameKind::data) out += f.data;
  return out;
}

/// Host frames for process `proc`'s stdin.
std::string stdin_data(std::uint16_t proc, std::string_view bytes) {
  std::string out;
  proto::append_data(out, Stream::in, bytes, proc);
  return out;
}

}  // namespace

TEST_CASE("turns: the workload and two exec'd processes each get one batch in turn") {
  StdioMux m(pipes());
  m.workload().direct_unsupported();
  REQUIRE(m.open(1, pipes()));
  REQUIRE(m.open(2, pipes()));
  // More than one batch (kTxBatch) each: every process needs two turns.
  const std::string big(kTxBatch + 1000, 'w');
  m.workload().on_output(Stream::out, big);
  m.core(1)->on_output(Stream::out, std::string(kTxBatch + 1000, '1'));
  m.core(2)->on_output(Stream::out, std::string(kTxBatch + 1000, '2'));
  std::string wire;
  CHECK(turns(drain(m, wire)) == std::vector<std::uint16_t>{0, 1, 2, 0, 1, 2});
  auto fs = decode(wire, {1, 2});
  CHECK(data_of(fs, 0) == big);
  CHECK(data_of(fs, 1) == std::string(kTxBatch + 1000, '1'));
  CHECK(data_of(fs, 2) == std::string(kTxBatch + 1000, '2'));
  CHECK(!m.tx_pending());
}

TEST_CASE("turns: after the workload's turn the next process goes, even while the workload has more") {
  StdioMux m(pipes());
  m.workload().direct_unsupported();
  REQUIRE(m.open(1, pipes()));
  m.workload().on_output(Stream::out, std::string(3 * kTxBatch, 'w'));
  std::string wire;
  CHECK(turns(drain(m, wire, SIZE_MAX, 1)) == std::vector<std::uint16_t>{0});
  m.core(1)->on_output(Stream::out, "one");
  auto ws = drain(m, wire);
  REQUIRE(ws.size() >= 2);
  CHECK(ws[0].proc == 1);  // not the workload again
  CHECK(turns(ws) == std::vector<std::uint16_t>{1, 0});
  CHECK(data_of(decode(wire, {1}), 1) == "one");
}

TEST_CASE("turns: a half-written batch is finished before another process's frames") {
  StdioMux m(pipes());
  m.workload().direct_unsupported();
  REQUIRE(m.open(1, pipes()));
  REQUIRE(m.open(2, pipes()));
  m.core(1)->on_output(Stream::out, std::string(1000, 'a'));
  std::string wire;
  // A channel that takes 7 bytes at a time: the frame's header is split, then its payload.
  auto first = drain(m, wire, 7, 2);
  CHECK(turns(first) == std::vector<std::uint16_t>{1});
  // Output of the others arrives mid-frame: they wait for process 1's batch.
  m.workload().on_output(Stream::out, "wl");
  m.core(2)->on_output(Stream::err, "two");
  auto rest = drain(m, wire, 7);
  std::vector<std::uint16_t> t = turns(rest);
  REQUIRE(t.size() == 3);
  CHECK(t[0] == 1);
  std::size_t ones = 0;
  for (const Write& w : rest) {
    if (w.proc != 1) break;
    ones += w.bytes;
  }
  CHECK(14 + ones == proto::kFrameHeader + 1000);  // exactly the rest of that frame, then a turn
  auto fs = decode(wire, {1, 2});
  CHECK(data_of(fs, 1) == std::string(1000, 'a'));
  CHECK(data_of(fs, 0) == "wl");
  CHECK(data_of(fs, 2, Stream::err) == "two");
}

TEST_CASE("turns: the workload's direct frame holds the channel until it is moved in full") {
  StdioMux m(pipes());  // lossless pipes: direct frames
  REQUIRE(m.open(1, pipes()));
  StdioCore& wl = m.workload();
  REQUIRE(wl.direct_mode());
  auto f = wl.direct_begin(Stream::out, 100);
  REQUIRE(f);
  auto t = m.tx();
  REQUIRE(t);
  CHECK(t->proc == 0);
  REQUIRE(t->direct);
  CHECK(t->direct->left == 100);
  m.core(1)->on_output(Stream::out, "one");
  wl.direct_taken(60);
  t = m.tx();
  REQUIRE((t && t->direct));  // still the workload's turn: 40 payload bytes to go
  wl.direct_taken(40);
  wl.direct_done();
  t = m.tx();
  REQUIRE(t);
  CHECK(t->proc == 1);
  CHECK(!t->direct);
}

TEST_CASE("turns: a direct frame finished as copies (no splice) keeps its turn until the copies are out") {
  StdioMux m(pipes());
  REQUIRE(m.open(1, pipes()));
  StdioCore& wl = m.workload();
  auto f = wl.direct_begin(Stream::out, 5);
  REQUIRE(f);
  auto t = m.tx();
  REQUIRE((t && t->direct && t->proc == 0));
  // The channel took no spliced pages: the header and payload are queued as bytes instead.
  wl.direct_fill(std::string_view(f->header, sizeof f->header));
  wl.direct_fill("hello");
  wl.direct_taken(5);
  wl.direct_done();
  m.core(1)->on_output(Stream::out, "one");
  std::string wire;
  auto ws = drain(m, wire, 3);
  REQUIRE(!ws.empty());
  CHECK(turns(ws) == std::vector<std::uint16_t>{0, 1});
  auto fs = decode(wire, {1});
  CHECK(data_of(fs, 0) == "hello");
  CHECK(data_of(fs, 1) == "one");
}

TEST_CASE("rx_room: the least room of any open stdin; a full one stops reading") {
  StdioMux m(pipes(true));
  REQUIRE(m.open(1, pipes(true)));
  REQUIRE(m.open(2, pipes()));  // no stdin: never limits
  CHECK(m.rx_room() == kStdioChunk);
  // Process 1 holds bytes: the room is what is left for one more whole frame beyond them.
  std::string chunk(50000, 'x');
  std::size_t held = 0;
  while (held + 50000 + proto::kFrameDataMax <= kStdinCap - kStdioChunk) {
    m.on_rx(stdin_data(1, chunk));
    held += 50000;
  }
  REQUIRE(m.rx_error().empty());
  CHECK(m.core(1)->in_pending().size() == held);
  CHECK(m.rx_room() == std::min(kStdinCap - proto::kFrameDataMax - held, kStdioChunk));
  // Full: nothing is read until its bytes are written to its stdin.
  while (m.rx_room() > 0) {
    m.on_rx(stdin_data(1, chunk));
    held += 50000;
  }
  CHECK(held + proto::kFrameDataMax > kStdinCap);
  CHECK(held <= kStdinCap);
  m.core(1)->in_written(held);
  CHECK(m.rx_room() == kStdioChunk);
  // The workload's own stdin counts the same way.
  std::size_t held0 = 0;
  while (m.rx_room() > 0) {
    m.on_rx(stdin_data(0, chunk));
    held0 += 50000;
  }
  CHECK(m.workload().in_pending().size() == held0);
  CHECK(held0 + proto::kFrameDataMax > kStdinCap);
  // A closed process's stdin no longer holds the channel back.
  m.workload().in_written(held0);
  while (m.rx_room() > 0) m.on_rx(stdin_data(1, chunk));
  CHECK(m.rx_room() == 0);
  m.close(1);
  CHECK(m.rx_room() == kStdioChunk);
}

TEST_CASE("routing: frames go to their process's core; a closed one's are skipped; an unknown one is an error") {
  StdioMux m(pipes(true));
  REQUIRE(m.open(1, pipes(true)));
  REQUIRE(m.open(2, pipes(true)));
  m.on_rx(stdin_data(2, "to-two") + stdin_data(0, "to-wl") + stdin_data(1, "to-one"));
  REQUIRE(m.rx_error().empty());
  CHECK(m.workload().in_pending() == "to-wl");
  CHECK(m.core(1)->in_pending() == "to-one");
  CHECK(m.core(2)->in_pending() == "to-two");
  m.close(2);
  CHECK(m.core(2) == nullptr);
  m.on_rx(stdin_data(2, "late"));
  CHECK(m.rx_error().empty());
  CHECK(m.rx_room() > 0);
  m.on_rx(stdin_data(9, "never opened"));
  CHECK(m.rx_error().find("process 9: no such process") != std::string::npos);
}

TEST_CASE("close: while its batch is half-written the core stays until the batch is out, then goes") {
  StdioMux m(pipes());
  m.workload().direct_unsupported();
  REQUIRE(m.open(1, pipes()));
  REQUIRE(m.open(2, pipes()));
  m.core(1)->on_output(Stream::out, std::string(3 * kTxBatch, 'a'));  // more than one batch
  m.core(2)->on_output(Stream::out, "two");
  std::string wire;
  REQUIRE(turns(drain(m, wire, 1000, 1)) == std::vector<std::uint16_t>{1});
  m.close(1);
  CHECK(m.core(1) == nullptr);  // closed: no more reads, no frames from the host
  CHECK(m.holds(1));            // ... but its half-written batch goes out first
  m.close(2);                   // not mid-turn: gone at once, its output discarded
  CHECK(!m.holds(2));
  auto ws = drain(m, wire);
  CHECK(turns(ws) == std::vector<std::uint16_t>{1});
  CHECK(!m.holds(1));
  CHECK(!m.tx_pending());
  auto fs = decode(wire, {1, 2});
  const std::string one = data_of(fs, 1);
  CHECK(one.size() == kTxBatch);  // the one batch begun (four full frames), nothing after it
  CHECK(data_of(fs, 2).empty());
  // Its number is free again once the core is gone (the host may not reuse it; the guest copes).
  CHECK(m.open(1, pipes()));
}

TEST_CASE("close: a number still held by a closed process's turn is refused; at most kExecMax open") {
  StdioMux m(pipes());
  m.workload().direct_unsupported();
  REQUIRE(m.open(1, pipes()));
  m.core(1)->on_output(Stream::out, "x");
  std::string wire;
  REQUIRE(drain(m, wire, 2, 1).size() == 1);
  m.close(1);
  CHECK(m.open(1, pipes()) == nullptr);
  CHECK(m.open(0, pipes()) == nullptr);
  for (std::uint16_t p = 2; p < 2 + proto::kExecMax; ++p) REQUIRE(m.open(p, pipes()));
  CHECK(m.open(100, pipes()) == nullptr);  // kExecMax open at once
  drain(m, wire);
  CHECK(!m.holds(1));
}

TEST_CASE("channel closed: no turn under way, closed cores go, every core discards and stdin ends") {
  StdioMux m(pipes(true));
  m.workload().direct_unsupported();
  REQUIRE(m.open(1, pipes(true)));
  m.core(1)->on_output(Stream::out, "abc");
  std::string wire;
  REQUIRE(drain(m, wire, 2, 1).size() == 1);
  m.close(1);
  m.on_rx(stdin_data(0, "in"));
  m.channel_closed();
  CHECK(!m.holds(1));
  CHECK(!m.channel_open());
  CHECK(!m.tx());
  CHECK(!m.tx_pending());
  CHECK(m.rx_room() == 0);
  CHECK(m.workload().in_pending().empty());
  // A process opened afterwards discards its output as the others do.
  StdioCore* two = m.open(2, pipes());
  REQUIRE(two);
  CHECK(!two->channel_open());
  two->on_output(Stream::out, "lost");
  CHECK(!m.tx_pending());
}

TEST_CASE("an exec'd process's outputs are done once its frames are written: its report closes it") {
  // The slow_exec CI failure: the init reported `exec_exited` (and closed the process, its core
  // discarded) while its core still held bytes its output_end called sent; the host waited for
  // them in vain and reported them lost.
  StdioMux m(pipes());
  REQUIRE(m.open(1, pipes()));
  const std::string bytes(100000, 'x');
  m.core(1)->on_output(Stream::out, bytes);
  m.core(1)->on_output_eof(Stream::out);
  m.core(1)->on_output_eof(Stream::err);
  CHECK(!m.take_outputs_done(1));  // read in full, none of it written
  std::string wire;
  drain(m, wire, 4096, 1);  // a short write: the rest still held
  CHECK(!m.take_outputs_done(1));
  drain(m, wire);
  CHECK(m.take_outputs_done(1));
  m.close(1);
  const auto fs = decode(wire, {1});
  CHECK(data_of(fs, 1) == bytes);
  int eofs = 0;
  for (const proto::Frame& f : fs) eofs += f.proc == 1 && f.kind == proto::FrameKind::eof;
  CHECK(eofs == 2);
}

TEST_CASE("outputs done: reported once per process, never for a closed one") {
  StdioMux m(pipes());
  REQUIRE(m.open(1, pipes()));
  REQUIRE(m.open(2, pipes()));
  CHECK(!m.take_outputs_done(0));
  m.workload().on_output_eof(Stream::out);
  m.workload().on_output_eof(Stream::err);
  CHECK(m.take_outputs_done(0));
  CHECK(!m.take_outputs_done(0));
  m.core(1)->on_output_eof(Stream::out);
  m.core(1)->on_output_eof(Stream::err);
  CHECK(!m.take_outputs_done(1));  // an exec'd process's eofs are not written yet
  std::string wire;
  drain(m, wire);
  CHECK(m.take_outputs_done(1));
  CHECK(!m.take_outputs_done(1));
  m.core(2)->on_output_eof(Stream::out);
  m.core(2)->on_output_eof(Stream::err);
  m.close(2);
  CHECK(!m.take_outputs_done(2));
  CHECK(!m.take_outputs_done(7));
}

TEST_CASE("host EOF: every open process's stdin ends after what it holds; a partial frame is an error instead") {
  StdioMux m(pipes(true));
  REQUIRE(m.open(1, pipes(true)));
  REQUIRE(m.open(2, pipes(true)));
  m.on_rx(stdin_data(1, "last"));
  m.close(2);
  m.on_rx_eof();
  CHECK(m.rx_error().empty());
  CHECK(m.workload().in_close_due());
  CHECK(m.core(1)->in_pending() == "last");
  CHECK(!m.core(1)->in_close_due());  // its bytes first
  m.core(1)->in_written(4);
  CHECK(m.core(1)->in_close_due());

  StdioMux p(pipes(true));
  REQUIRE(p.open(1, pipes(true)));
  const std::string f = stdin_data(1, "cut");
  p.on_rx(std::string_view(f).substr(0, f.size() - 1));
  p.on_rx_eof();
  CHECK(!p.rx_error().empty());
  CHECK(!p.core(1)->in_close_due());
}

TEST_CASE("a process opened after the host's sending side ended: its stdin is at eof from the start") {
  // After the host's EOF no frame can come for anyone: a stdin left open would never end.
  StdioMux m(pipes(true));
  m.on_rx_eof();
  REQUIRE(m.rx_error().empty());
  StdioCore* one = m.open(1, pipes(true));
  REQUIRE(one);
  CHECK(one->in_close_due());
  proto::Stdio tty = pipes(true);
  tty.terminal = proto::Terminal{24, 80};
  StdioCore* two = m.open(2, tty);
  REQUIRE(two);
  CHECK(two->in_pending() == "\x04");  // a PTY has no half-close: its ^D

  // The channel gone (a framing error, a failed write): the same.
  StdioMux c(pipes(true));
  c.channel_closed();
  StdioCore* three = c.open(3, pipes(true));
  REQUIRE(three);
  CHECK(three->in_close_due());
  // Without stdin attached there is nothing to end.
  StdioCore* four = c.open(4, pipes());
  REQUIRE(four);
  CHECK(!four->in_close_due());
}
