// Data channel resume in the init's sans-I/O core (docs/protocol.md "Data channel resume"),
// event by event: the hello and stdin position first, nothing else before the host's positions,
// replay from a position inside the ring / at its end / before its start (a gap, counted) /
// ahead of what was sent (an error naming the stream), acks freeing the ring, a full ring in
// lossless mode (framing stops) and lossy mode (the oldest leave, counted only when a resume
// needs them), stdin's position and acks, and the mux holding every process back until the
// handshake is over.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "nesinit/stdio.hpp"
#include "nesinit/stdio_mux.hpp"
#include "protocol/frame.hpp"

using namespace nes::init;
namespace proto = nes::proto;
using proto::FrameKind;
using proto::Stream;

namespace {

std::string drain_tx(StdioCore& c) {
  std::string all;
  for (std::string_view v = c.tx(); !v.empty(); v = c.tx()) {
    all.append(v);
    c.sent(v.size());
  }
  return all;
}

/// Decodes the guest's frames as a host with resume would.
std::vector<proto::Frame> frames(std::string_view wire, bool lossy = false, bool in = false) {
  proto::FrameDecoder d({proto::FrameSender::guest, false, in, lossy, true});
  std::vector<proto::Frame> out;
  while (auto f = d.next(wire)) out.push_back(std::move(*f));
  REQUIRE_MESSAGE(!d.failed(), d.error());
  REQUIRE(wire.empty());
  return out;
}

std::string data_of(const std::vector<proto::Frame>& fs, Stream s) {
  std::string out;
  for (auto& f : fs)
    if (f.stream == s && f.kind == FrameKind::data) out += f.data;
  return out;
}

proto::Stdio stdio(std::uint32_t replay, bool lossy = false, bool in = false) {
  proto::Stdio s;
  s.buffer_bytes = 4096;
  s.replay_bytes = replay;
  s.mode = lossy ? proto::StdioMode::lossy : proto::StdioMode::lossless;
  s.attach_stdin = in;
  return s;
}

/// The host's frames as bytes.
std::string positions(std::uint64_t out, std::uint64_t err) {
  std::string w;
  proto::append_position(w, Stream::out, out);
  proto::append_position(w, Stream::err, err);
  return w;
}
std::string ack(Stream s, std::uint64_t pos) {
  std::string w;
  proto::append_ack(w, s, pos);
  return w;
}

/// A core with resume on, its first handshake done (positions 0).
StdioCore linked(std::uint32_t replay, bool lossy = false, bool in = false) {
  StdioCore c(stdio(replay, lossy, in));
  c.enable_resume(7, "vm1");
  drain_tx(c);
  c.on_rx(positions(0, 0));
  REQUIRE(c.linked());
  drain_tx(c);
  return c;
}

}  // namespace

TEST_CASE("handshake: hello and stdin position first; nothing else until every position came") {
  StdioCore c(stdio(4096, false, true));
  c.enable_resume(7, "vm1");
  CHECK(!c.direct_mode());  // spliced bytes would leave no copy for the ring
  c.on_output(Stream::out, "early");
  auto f = frames(drain_tx(c), false, true);
  REQUIRE(f.size() == 3);
  CHECK(f[0].kind == FrameKind::hello);
  CHECK(f[0].generation == 7);
  CHECK(f[0].data == "vm1");
  CHECK(f[1].kind == FrameKind::position);
  CHECK(f[1].stream == Stream::in);
  CHECK(f[1].position == 0);
  CHECK(f[2].kind == FrameKind::ack);  // what the workload took: the host's stdin window starts there
  CHECK(f[2].stream == Stream::in);
  CHECK(f[2].position == 0);
  CHECK(!c.linked());
  std::string one;
  proto::append_position(one, Stream::out, 0);
  c.on_rx(one);
  CHECK(drain_tx(c).size() == proto::kFrameHeader + 8);  // stdout's position only: stderr's not come
  c.on_rx([] {
    std::string w;
    proto::append_position(w, Stream::err, 0);
    return w;
  }());
  CHECK(c.linked());
  f = frames(drain_tx(c), false, true);
  CHECK(f.front().kind == FrameKind::position);
  CHECK(f.front().stream == Stream::err);
  CHECK(data_of(f, Stream::out) == "early");
}

TEST_CASE("handshake: stdin data before the host's positions is an error") {
  StdioCore c(stdio(4096, false, true));
  c.enable_resume(1, "v");
  drain_tx(c);
  std::string w;
  proto::append_data(w, Stream::in, "x");
  c.on_rx(w);
  CHECK(c.rx_error() == "data frame on stdin: before the host's positions");
}

TEST_CASE("replay from a position inside the ring, at its end, and before its start (a counted gap)") {
  StdioCore c = linked(4096);
  c.on_output(Stream::out, "abcdef");
  drain_tx(c);
  CHECK(c.ring_size(Stream::out) == 6);
  c.channel_lost();
  CHECK(c.tx().empty());
  c.channel_resumed();
  drain_tx(c);  // the hello
  c.on_rx(positions(2, 0));  // the host has "ab"
  auto f = frames(drain_tx(c));
  CHECK(f[0].kind == FrameKind::position);
  CHECK(f[0].position == 2);
  CHECK(data_of(f, Stream::out) == "cdef");
  CHECK(c.framed(Stream::out) == 6);
  // At its end: nothing to replay.
  c.channel_lost();
  c.channel_resumed();
  drain_tx(c);
  c.on_rx(positions(6, 0));
  f = frames(drain_tx(c));
  CHECK(data_of(f, Stream::out).empty());
  CHECK(f[0].position == 6);
  CHECK(c.gap(Stream::out) == 0);
}

TEST_CASE("a position before the ring's start: the guest's position jumps; sent excludes the gap") {
  StdioCore c = linked(4096, true);
  c.on_output(Stream::out, std::string(4000, 'a'));
  drain_tx(c);
  c.on_output(Stream::out, std::string(1000, 'b'));  // the ring keeps the newest 4096 bytes
  drain_tx(c);
  CHECK(c.ring_start(Stream::out) == 904);
  c.channel_lost();
  c.channel_resumed();
  drain_tx(c);
  c.on_rx(positions(100, 0));
  auto f = frames(drain_tx(c), true);
  CHECK(f[0].kind == FrameKind::position);
  CHECK(f[0].position == 904);  // 804 bytes gone: the host counts them
  CHECK(data_of(f, Stream::out).size() == 4096);
  CHECK(c.gap(Stream::out) == 804);
  CHECK(c.framed(Stream::out) == 5000 - 804);
  CHECK(c.framed_total(Stream::out) == 5000);
}

TEST_CASE("a host asking again from before an earlier gap: each position is counted once") {
  // Found by fuzz/data_frame_fuzz (corpus crash-gap-counted-twice): the gap was added again on
  // every resume from an old position, so sent (framed - gap) wrapped below zero.
  StdioCore c = linked(4096, true);
  c.on_output(Stream::out, std::string(4000, 'a'));
  drain_tx(c);
  c.on_output(Stream::out, std::string(1000, 'b'));  // the ring keeps the newest 4096: starts at 904
  drain_tx(c);
  for (int i = 0; i < 3; ++i) {
    c.channel_lost();
    c.channel_resumed();
    drain_tx(c);
    c.on_rx(positions(100, 0));
    CHECK(frames(drain_tx(c), true)[0].position == 904);
    CHECK(c.gap(Stream::out) == 804);
    CHECK(c.framed(Stream::out) == 5000 - 804);
  }
  // A later gap adds only its new positions.
  c.on_output(Stream::out, std::string(1000, 'b'));  // ring now starts at 1904
  drain_tx(c);
  c.channel_lost();
  c.channel_resumed();
  drain_tx(c);
  c.on_rx(positions(0, 0));
  CHECK(frames(drain_tx(c), true)[0].position == 1904);
  CHECK(c.gap(Stream::out) == 1904 - 100);
  CHECK(c.framed(Stream::out) <= c.framed_total(Stream::out));
}

TEST_CASE("a position ahead of what was sent is an error naming the stream; so is an ack") {
  StdioCore c = linked(4096);
  c.on_output(Stream::err, "xyz");
  drain_tx(c);
  c.on_rx(ack(Stream::err, 4));
  CHECK(c.rx_error() == "ack frame on stderr: position 4 ahead of the 3 bytes sent");
  StdioCore d = linked(4096);
  d.on_output(Stream::err, "xyz");
  drain_tx(d);
  d.channel_lost();
  d.channel_resumed();
  drain_tx(d);
  d.on_rx(positions(0, 9));
  CHECK(d.rx_error() == "position frame on stderr: position 9 ahead of the 3 bytes sent");
  // A position outside a handshake.
  StdioCore e = linked(4096);
  std::string w;
  proto::append_position(w, Stream::out, 0);
  e.on_rx(w);
  CHECK(e.rx_error() == "position frame on stdout: not during a handshake");
}

TEST_CASE("acks free the ring; a stale ack is harmless") {
  StdioCore c = linked(4096);
  c.on_output(Stream::out, "0123456789");
  drain_tx(c);
  c.on_rx(ack(Stream::out, 4));
  CHECK(c.ring_start(Stream::out) == 4);
  CHECK(c.ring_size(Stream::out) == 6);
  c.on_rx(ack(Stream::out, 2));
  CHECK(c.ring_start(Stream::out) == 4);
  c.on_rx(ack(Stream::out, 10));
  CHECK(c.ring_size(Stream::out) == 0);
  CHECK(c.rx_error().empty());
}

TEST_CASE("lossless: a full ring stops framing; the buffer then fills and reading stops") {
  StdioCore c = linked(4096);
  c.on_output(Stream::out, std::string(4096, 'a'));
  drain_tx(c);
  CHECK(c.ring_size(Stream::out) == 4096);
  c.on_output(Stream::out, std::string(4096, 'b'));
  CHECK(drain_tx(c).empty());             // nothing framed: the ring is full
  CHECK(c.out_room(Stream::out) == 0);    // and the buffer: the workload blocks
  c.on_rx(ack(Stream::out, 1000));
  auto f = frames(drain_tx(c));
  CHECK(data_of(f, Stream::out) == std::string(1000, 'b'));
  CHECK(c.out_room(Stream::out) == 1000);
}

TEST_CASE("lossy: the ring never stops framing; the dropped count of a lost batch is due again") {
  StdioCore c = linked(4096, true);
  c.on_output(Stream::out, std::string(5000, 'a'));  // over the 4096 buffer: 904 dropped
  std::string_view v = c.tx();
  REQUIRE(!v.empty());
  c.sent(3);  // the batch (dropped, then data) dies half-written
  c.channel_lost();
  c.channel_resumed();
  drain_tx(c);
  c.on_rx(positions(0, 0));
  auto f = frames(drain_tx(c), true);
  std::uint64_t dropped = 0;
  for (auto& x : f)
    if (x.kind == FrameKind::dropped) dropped += x.dropped;
  CHECK(dropped == 904);
  CHECK(data_of(f, Stream::out) == std::string(4096, 'a'));
}

TEST_CASE("eof is framed again on a resume; output held meanwhile goes after the replay") {
  StdioCore c = linked(4096);
  c.on_output(Stream::out, "end");
  c.on_output_eof(Stream::out);
  c.on_output_eof(Stream::err);
  drain_tx(c);
  c.channel_lost();
  c.channel_resumed();
  drain_tx(c);
  c.on_rx(positions(1, 0));
  auto f = frames(drain_tx(c));
  CHECK(data_of(f, Stream::out) == "nd");
  int eofs = 0;
  for (auto& x : f) eofs += x.kind == FrameKind::eof;
  CHECK(eofs == 2);
}

TEST_CASE("stdin: acked as the workload takes it, every kStdinAckStep; the hello says received and taken") {
  StdioCore c = linked(4096, false, true);
  std::string w;
  proto::append_data(w, Stream::in, std::string(kStdinAckStep, 'i'));
  c.on_rx(w);
  CHECK(drain_tx(c).empty());  // received, not taken: no ack (the host's window still counts it)
  c.in_written(kStdinAckStep - 1);
  CHECK(drain_tx(c).empty());  // under the step
  CHECK(c.stdin_taken() == kStdinAckStep - 1);
  c.in_written(1);
  auto f = frames(drain_tx(c), false, true);
  REQUIRE(f.size() == 1);
  CHECK(f[0].kind == FrameKind::ack);
  CHECK(f[0].position == kStdinAckStep);
  w.clear();
  proto::append_data(w, Stream::in, "tail");
  c.on_rx(w);
  CHECK(drain_tx(c).empty());
  CHECK(c.stdin_position() == kStdinAckStep + 4);
  CHECK(c.stdin_taken() == kStdinAckStep);
  c.channel_lost();
  c.channel_resumed();
  f = frames(drain_tx(c), false, true);
  REQUIRE(f.size() == 3);
  CHECK(f[1].kind == FrameKind::position);
  CHECK(f[1].position == kStdinAckStep + 4);  // the host re-sends from here: none twice
  CHECK(f[2].kind == FrameKind::ack);
  CHECK(f[2].position == kStdinAckStep);      // held, not taken: the window starts here
  c.on_rx(positions(0, 0));
  CHECK(c.in_pending() == "tail");            // kept across the loss
  c.in_written(4);
  // The host's eof again after a resume ends stdin once.
  w.clear();
  proto::append_eof(w, Stream::in);
  c.on_rx(w);
  CHECK(c.in_close_due());
}

TEST_CASE("stdin: a workload that closed its stdin takes (discards) what comes; a PTY's ^D is no payload byte") {
  StdioCore c = linked(4096, false, true);
  c.in_closed();
  std::string w;
  proto::append_data(w, Stream::in, std::string(kStdinAckStep, 'd'));
  c.on_rx(w);
  auto f = frames(drain_tx(c), false, true);
  REQUIRE(f.size() == 1);
  CHECK(f[0].kind == FrameKind::ack);
  CHECK(f[0].position == kStdinAckStep);

  proto::Stdio t = stdio(4096, false, true);
  t.terminal = proto::Terminal{24, 80};
  StdioCore p(t);
  p.enable_resume(7, "vm1");
  drain_tx(p);
  std::string pos;
  proto::append_position(pos, Stream::out, 0);
  p.on_rx(pos);
  REQUIRE(p.linked());
  drain_tx(p);
  w.clear();
  proto::append_data(w, Stream::in, "ab");
  proto::append_eof(w, Stream::in);
  p.on_rx(w);
  CHECK(p.in_pending() == "ab\x04");
  CHECK(p.stdin_taken() == 0);
  p.in_written(2);
  CHECK(p.stdin_taken() == 2);
  p.in_written(1);  // the ^D
  CHECK(p.stdin_taken() == 2);
  CHECK(p.stdin_position() == 2);
}

TEST_CASE("the host's close frame: its EOF is on purpose") {
  StdioCore c = linked(4096);
  CHECK(!c.host_closed());
  std::string w;
  proto::append_close(w);
  c.on_rx(w);
  CHECK(c.host_closed());
}

TEST_CASE("mux: no process's frames go before the workload's handshake; execs lose their streams") {
  StdioMux m(stdio(4096));
  m.workload().enable_resume(2, "m");
  proto::Stdio xs;
  StdioCore* x = m.open(1, xs);
  REQUIRE(x);
  x->on_output(Stream::out, "exec");
  auto t = m.tx();
  REQUIRE(t);
  CHECK(t->proc == 0);
  auto f = frames(t->bytes);
  CHECK(f[0].kind == FrameKind::hello);
  m.sent(t->bytes.size());
  CHECK(!m.tx());  // waiting for positions: nothing of process 1 either
  m.on_rx(positions(0, 0));
  // Then both take turns: the workload's positions and process 1's output both go out.
  std::vector<std::uint16_t> turns;
  while (auto u = m.tx()) {
    turns.push_back(u->proc);
    m.sent(u->bytes.size());
  }
  CHECK(std::count(turns.begin(), turns.end(), 0) >= 1);
  CHECK(std::count(turns.begin(), turns.end(), 1) == 1);
  m.channel_lost();
  CHECK(!m.tx());
  CHECK(m.core(1)->channel_open() == false);  // not resumed: its client ended with the host
  m.channel_resumed();
  t = m.tx();
  REQUIRE(t);
  CHECK(frames(t->bytes)[0].kind == FrameKind::hello);
}
