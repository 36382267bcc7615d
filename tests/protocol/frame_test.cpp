// Data-channel frames: the encoder against hand-written wire bytes, the decoder against every
// split of a captured sequence, all 256 byte values, and every framing error by name.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "support.hpp"

#include <string>
#include <vector>

using namespace nes::proto;
using namespace nes::proto::test;
using namespace std::literals;

namespace {

std::string bytes(std::initializer_list<int> v) {
  std::string s;
  for (int b : v) s.push_back(static_cast<char>(b));
  return s;
}

/// A guest -> host session as it appears on the wire (written by hand, not by the encoder):
/// "hi\n" on stdout, "e" on stderr, 5 bytes dropped on stdout, "x" on stdout, eof on both.
const std::string kGuestWire =
    bytes({1, 0, 0, 0, 0, 0, 0, 3}) + "hi\n" +
    bytes({2, 0, 0, 0, 0, 0, 0, 1}) + "e" +
    bytes({1, 3, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 5}) +
    bytes({1, 0, 0, 0, 0, 0, 0, 1}) + "x" +
    bytes({1, 1, 0, 0, 0, 0, 0, 0}) +
    bytes({2, 1, 0, 0, 0, 0, 0, 0});

/// A host -> guest session: "abc" on stdin, a resize to 40x132 (0x0028, 0x0084), eof on stdin,
/// then another resize (a terminal outlives its stdin).
const std::string kHostWire =
    bytes({0, 0, 0, 0, 0, 0, 0, 3}) + "abc" +
    bytes({0, 2, 0, 0, 0, 0, 0, 4, 0, 0x28, 0, 0x84}) +
    bytes({0, 1, 0, 0, 0, 0, 0, 0}) +
    bytes({0, 2, 0, 0, 0, 0, 0, 4, 0xff, 0xff, 0, 1});

Frame make(Stream s, FrameKind k) {
  Frame f;
  f.stream = s;
  f.kind = k;
  return f;
}
Frame data(Stream s, std::string d) {
  Frame f = make(s, FrameKind::data);
  f.data = std::move(d);
  return f;
}
Frame eof(Stream s) { return make(s, FrameKind::eof); }
Frame resize(std::uint16_t r, std::uint16_t c) {
  Frame f = make(Stream::in, FrameKind::resize);
  f.rows = r;
  f.cols = c;
  return f;
}
Frame dropped(Stream s, std::uint64_t n) {
  Frame f = make(s, FrameKind::dropped);
  f.dropped = n;
  return f;
}

const std::vector<Frame> kGuestFrames = {data(Stream::out, "hi\n"), data(Stream::err, "e"),
                                         dropped(Stream::out, 5),   data(Stream::out, "x"),
                                         eof(Stream::out),          eof(Stream::err)};
const std::vector<Frame> kHostFrames = {data(Stream::in, "abc"), resize(40, 132), eof(Stream::in),
                                        resize(65535, 1)};

constexpr FrameRules kGuestRules{FrameSender::guest, false, false, true};
constexpr FrameRules kHostRules{FrameSender::host, true, true, false};

/// Feeds `wire` cut at `cuts` (ascending offsets) and collects frames until an error.
std::vector<Frame> decode_split(FrameRules rules, std::string_view wire, const std::vector<std::size_t>& cuts,
                                std::string* error = nullptr) {
  FrameDecoder d(rules);
  std::vector<Frame> out;
  std::size_t prev = 0;
  std::vector<std::size_t> all = cuts;
  all.push_back(wire.size());
  for (std::size_t c : all) {
    std::string_view piece = wire.substr(prev, c - prev);
    prev = c;
    while (auto f = d.next(piece)) out.push_back(std::move(*f));
    if (d.failed()) break;
    CHECK(piece.empty());
  }
  if (error) *error = d.error();
  if (!d.failed()) CHECK(d.idle());
  return out;
}

/// The error a decoder reports for `wire` fed whole ("" if none).
std::string error_for(FrameRules rules, std::string_view wire) {
  std::string err;
  decode_split(rules, wire, {}, &err);
  return err;
}

std::string hdr(int stream, int kind, std::uint32_t len, int r2 = 0, int r3 = 0) {
  return bytes({stream, kind, r2, r3, static_cast<int>(len >> 24) & 0xff, static_cast<int>(len >> 16) & 0xff,
                static_cast<int>(len >> 8) & 0xff, static_cast<int>(len) & 0xff});
}

}  // namespace

TEST_CASE("encoder: every kind, byte for byte as the wire format says") {
  std::string g;
  for (const Frame& f : kGuestFrames) append_frame(g, f);
  CHECK(g == kGuestWire);
  std::string h;
  for (const Frame& f : kHostFrames) h += encode_frame(f);
  CHECK(h == kHostWire);
  std::string x;
  append_resize(x, 40, 132);
  append_dropped(x, Stream::err, 0x0102030405060708ull);
  append_eof(x, Stream::in);
  CHECK(x == bytes({0, 2, 0, 0, 0, 0, 0, 4, 0, 40, 0, 132}) +
                 bytes({2, 3, 0, 0, 0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8}) + bytes({0, 1, 0, 0, 0, 0, 0, 0}));
}

TEST_CASE("encoder: data is split at 64 KiB; nothing for empty data") {
  std::string out;
  append_data(out, Stream::out, "");
  CHECK(out.empty());
  const std::string big(2 * kFrameDataMax + 1, 'z');
  append_data(out, Stream::out, big);
  REQUIRE(out.size() == big.size() + 3 * kFrameHeader);
  CHECK(out.substr(0, 8) == hdr(1, 0, 65536));
  CHECK(out.substr(8 + 65536, 8) == hdr(1, 0, 65536));
  CHECK(out.substr(2 * (8 + 65536), 8) == hdr(1, 0, 1));
  const auto got = decode_split(kGuestRules, out, {});
  REQUIRE(got.size() == 3);
  CHECK(got[0].data.size() == 65536);
  CHECK(got[2].data == "z");
}

TEST_CASE("decoder: the captured sequences, fed whole, byte by byte, and at every split") {
  CHECK(decode_split(kGuestRules, kGuestWire, {}) == kGuestFrames);
  CHECK(decode_split(kHostRules, kHostWire, {}) == kHostFrames);
  for (const auto& [rules, wire, frames] :
       {std::tuple{kGuestRules, kGuestWire, kGuestFrames}, std::tuple{kHostRules, kHostWire, kHostFrames}}) {
    std::vector<std::size_t> every;
    for (std::size_t i = 1; i < wire.size(); ++i) every.push_back(i);
    CHECK(decode_split(rules, wire, every) == frames);
    std::size_t splits = 0;
    for (std::size_t i = 0; i <= wire.size(); ++i) {
      for (std::size_t j = i; j <= wire.size(); ++j) {
        CAPTURE(i);
        CAPTURE(j);
        REQUIRE(decode_split(rules, wire, {i, j}) == frames);
        ++splits;
      }
    }
    MESSAGE("three-way splits checked: " << splits);
  }
}

TEST_CASE("decoder: all 256 byte values in one payload, at every split of its frame") {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  std::string wire;
  append_data(wire, Stream::err, all);
  append_data(wire, Stream::out, all + all);
  for (std::size_t i = 0; i <= wire.size(); ++i) {
    const auto got = decode_split(kGuestRules, wire, {i});
    REQUIRE(got.size() == 2);
    CHECK(got[0] == data(Stream::err, all));
    CHECK(got[1] == data(Stream::out, all + all));
  }
}

TEST_CASE("decoder: holds at most one frame, returns each as soon as it is complete") {
  FrameDecoder d(kGuestRules);
  std::string wire;
  append_data(wire, Stream::out, std::string(kFrameDataMax, 'a'));
  append_eof(wire, Stream::out);
  std::string_view in = wire;
  auto f = d.next(in);
  REQUIRE(f);
  CHECK(f->data.size() == kFrameDataMax);
  CHECK(in.size() == kFrameHeader);  // the eof frame is left for the next call
  CHECK(d.idle());
  CHECK(!d.at_eof(Stream::out));
  f = d.next(in);
  REQUIRE(f);
  CHECK(f->kind == FrameKind::eof);
  CHECK(d.at_eof(Stream::out));
  CHECK(d.offset() == wire.size());
  // A partial header is not idle: EOF of the byte stream here would cut a frame.
  std::string_view part = std::string_view(kGuestWire).substr(0, 5);
  FrameDecoder p(kGuestRules);
  CHECK(!p.next(part));
  CHECK(!p.idle());
  CHECK(!p.failed());
}

TEST_CASE("decoder: every framing error, named, final, with the frame's offset") {
  const std::string ok = hdr(1, 0, 1) + "a";  // one good frame first, so offsets are visible
  struct Case {
    FrameRules rules;
    std::string wire;
    std::string reason;
  };
  const FrameRules tty_guest{FrameSender::guest, true, false, false};
  const FrameRules no_tty_host{FrameSender::host, false, true, false};
  const FrameRules no_input_host{FrameSender::host, true, false, false};
  const std::vector<Case> cases = {
      {kGuestRules, hdr(1, 8, 0), "frame: kind 8 unknown"},
      {kGuestRules, hdr(1, 255, 0), "frame: kind 255 unknown"},
      {kGuestRules, hdr(7, 0, 1) + "a", "data frame: stream 7 unknown"},
      {kGuestRules, hdr(3, 1, 0), "eof frame: stream 3 unknown"},
      {kGuestRules, hdr(1, 0, 1, 0, 1) + "a", "data frame on stdout of process 1: no such process"},
      {kGuestRules, hdr(2, 1, 0, 0x80, 0), "eof frame on stderr of process 32768: no such process"},
      {kGuestRules, hdr(1, 0, 0), "data frame on stdout: length 0 (expected 1..65536)"},
      {kGuestRules, hdr(1, 0, 65537), "data frame on stdout: length 65537 over the cap of 65536 bytes"},
      {kGuestRules, hdr(2, 0, 0xffffffffu), "data frame on stderr: length 4294967295 over the cap of 65536 bytes"},
      {kGuestRules, hdr(1, 1, 1) + "x", "eof frame on stdout: length 1 (expected 0)"},
      {kGuestRules, hdr(1, 3, 4), "dropped frame on stdout: length 4 (expected 8)"},
      {kHostRules, hdr(0, 2, 5), "resize frame on stdin: length 5 (expected 4)"},
      {kHostRules, hdr(0, 2, 4) + bytes({0, 0, 0, 80}), "resize frame on stdin: rows 0 (expected 1..65535)"},
      {kHostRules, hdr(0, 2, 4) + bytes({0, 24, 0, 0}), "resize frame on stdin: cols 0 (expected 1..65535)"},
      {no_tty_host, hdr(0, 2, 4) + bytes({0, 24, 0, 80}), "resize frame on stdin: no terminal"},
      {no_input_host, hdr(0, 0, 1) + "a", "data frame on stdin: stdin not attached"},
      {kGuestRules, hdr(0, 0, 1) + "a", "data frame on stdin: not a guest-to-host frame"},
      {kGuestRules, hdr(1, 2, 4), "resize frame on stdout: not a guest-to-host frame"},
      {kHostRules, hdr(1, 0, 1) + "a", "data frame on stdout: not a host-to-guest frame"},
      {kHostRules, hdr(0, 3, 8), "dropped frame on stdin: not a host-to-guest frame"},
      {kHostRules, hdr(2, 1, 0), "eof frame on stderr: not a host-to-guest frame"},
      {tty_guest, hdr(2, 0, 1) + "a", "data frame on stderr: with a terminal all output is stdout"},
      {tty_guest, hdr(1, 3, 8), "dropped frame on stdout: not in lossy mode"},
      {kGuestRules, hdr(1, 1, 0) + hdr(1, 0, 1) + "a", "data frame on stdout: stream already at eof"},
      {kGuestRules, hdr(2, 1, 0) + hdr(2, 1, 0), "eof frame on stderr: stream already at eof"},
      {kGuestRules, hdr(1, 1, 0) + hdr(1, 3, 8), "dropped frame on stdout: stream already at eof"},
      {kHostRules, hdr(0, 1, 0) + hdr(0, 0, 1) + "a", "data frame on stdin: stream already at eof"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.reason);
    // The first frame of the pair-cases is itself fine; the error names the offending frame.
    const std::size_t bad_at = c.wire.size() >= 16 && c.reason.find("already at eof") != std::string::npos ? 8 : 0;
    CHECK(error_for(c.rules, c.wire) == c.reason + " (frame at byte " + std::to_string(bad_at) + ")");
    if (c.rules.sender == FrameSender::guest && !c.rules.terminal) {
      CHECK(error_for(c.rules, ok + c.wire) == c.reason + " (frame at byte " + std::to_string(bad_at + 9) + ")");
    }
    // Fed byte by byte, the same error; nothing is consumed after it.
    std::vector<std::size_t> every;
    for (std::size_t i = 1; i < c.wire.size(); ++i) every.push_back(i);
    std::string err;
    decode_split(c.rules, c.wire, every, &err);
    CHECK(starts_with(err, c.reason));
    FrameDecoder d(c.rules);
    std::string_view in = c.wire;
    while (d.next(in)) {
    }
    REQUIRE(d.failed());
    std::string_view more = kGuestWire;
    CHECK(!d.next(more));
    CHECK(more.size() == kGuestWire.size());
    CHECK(!d.idle());
  }
}

TEST_CASE("decoder: an oversized length is refused at the header, before any payload arrives") {
  FrameDecoder d(kGuestRules);
  std::string_view in = "\x01\x00\x00\x00\x7f\xff\xff\xff"sv;
  CHECK(!d.next(in));
  CHECK(d.failed());
  CHECK(in.empty());
}

TEST_CASE("decoder: without input attached a stdin eof is harmless; resize outlives stdin") {
  const FrameRules r{FrameSender::host, true, false, false};
  std::string wire;
  append_eof(wire, Stream::in);
  append_resize(wire, 50, 200);
  const auto got = decode_split(r, wire, {});
  REQUIRE(got.size() == 2);
  CHECK(got[1] == resize(50, 200));
}

TEST_CASE("names") {
  CHECK(to_string(Stream::in) == "stdin");
  CHECK(to_string(Stream::out) == "stdout");
  CHECK(to_string(Stream::err) == "stderr");
  CHECK(to_string(FrameKind::dropped) == "dropped");
}

TEST_CASE("decoder: frames of processes started by exec, each by its own rules, closed ones skipped") {
  FrameDecoder d(kGuestRules);  // the workload: lossy pipes
  // An exec'd process with a terminal (stdout only), not lossy.
  REQUIRE(d.open_process(3, FrameRules{FrameSender::guest, true, false, false}));
  std::string wire;
  append_data(wire, Stream::out, "wl");
  append_data(wire, Stream::out, "x3", 3);
  append_eof(wire, Stream::out, 3);
  append_data(wire, Stream::err, "e0");
  std::string_view in = wire;
  std::vector<Frame> got;
  while (auto f = d.next(in)) got.push_back(*f);
  REQUIRE(!d.failed());
  REQUIRE(got.size() == 4);
  CHECK((got[0].proc == 0 && got[0].data == "wl"));
  CHECK((got[1].proc == 3 && got[1].data == "x3" && got[1].stream == Stream::out));
  CHECK((got[2].proc == 3 && got[2].kind == FrameKind::eof));
  CHECK((got[3].proc == 0 && got[3].stream == Stream::err));
  CHECK(!d.at_eof(Stream::out));  // process 3's eof is its own

  // Process 3's rules: stderr is illegal with its terminal; its stdout is at eof.
  {
    FrameDecoder e(kGuestRules);
    REQUIRE(e.open_process(3, FrameRules{FrameSender::guest, true, false, false}));
    std::string w;
    append_data(w, Stream::err, "no", 3);
    std::string_view v = w;
    CHECK(!e.next(v));
    CHECK(e.error() == "data frame on stderr of process 3: with a terminal all output is stdout (frame at byte 0)");
  }
  {
    std::string w;
    append_data(w, Stream::out, "late", 3);
    std::string_view v = w;
    CHECK(!d.next(v));
    CHECK(d.error() == "data frame on stdout of process 3: stream already at eof (frame at byte 38)");
  }
  // Closed: what is still in flight for it is consumed and skipped; a later number is unknown.
  FrameDecoder c(kGuestRules);
  REQUIRE(c.open_process(2, kGuestRules));
  c.close_process(2);
  std::string w;
  append_data(w, Stream::out, std::string(70000, 'z'), 2);
  append_eof(w, Stream::err, 2);
  append_data(w, Stream::out, "after");
  for (std::size_t split : {std::size_t{1}, std::size_t{7}, w.size()}) {
    FrameDecoder cc(kGuestRules);
    REQUIRE(cc.open_process(2, kGuestRules));
    cc.close_process(2);
    std::vector<Frame> fs;
    for (std::size_t at = 0; at < w.size(); at += split) {
      std::string_view part = std::string_view(w).substr(at, split);
      while (auto f = cc.next(part)) fs.push_back(*f);
    }
    REQUIRE(!cc.failed());
    REQUIRE(fs.size() == 1);
    CHECK((fs[0].proc == 0 && fs[0].data == "after"));
  }
  std::string w4;
  append_eof(w4, Stream::out, 4);
  std::string_view v4 = w4;
  CHECK(!c.next(v4));
  CHECK(c.error() == "eof frame on stdout of process 4: no such process (frame at byte 0)");
  // At most kExecMax open at once; process 0 is never "opened".
  FrameDecoder m(kHostRules);
  CHECK(!m.open_process(0, kHostRules));
  for (std::uint16_t i = 1; i <= kExecMax; ++i) CHECK(m.open_process(i, kHostRules));
  CHECK(!m.open_process(100, kHostRules));
  m.close_process(1);
  CHECK(m.open_process(100, kHostRules));
}

TEST_CASE("encoder: the process number is bytes 2-3, big-endian") {
  std::string w;
  append_resize(w, 24, 80, 0x0102);
  CHECK(w == std::string("\x00\x02\x01\x02\x00\x00\x00\x04\x00\x18\x00\x50", 12));
  Frame f;
  f.proc = 65535;
  f.kind = FrameKind::eof;
  f.stream = Stream::err;
  CHECK(encode_frame(f) == std::string("\x02\x01\xff\xff\x00\x00\x00\x00", 8));
}

// ---- data channel resume (docs/protocol.md "Data channel resume") --------------------------------

TEST_CASE("resume frames: encoder byte for byte, decoder round trip under resume rules") {
  std::string g;
  append_hello(g, 3, "web");
  append_position(g, Stream::in, 0x0102);
  append_ack(g, Stream::in, 7);
  append_position(g, Stream::out, 9);
  CHECK(g == bytes({0, 6, 0, 0, 0, 0, 0, 11, 0, 0, 0, 0, 0, 0, 0, 3}) + "web" +
                 bytes({0, 5, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 1, 2}) +
                 bytes({0, 4, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 7}) +
                 bytes({1, 5, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 9}));
  FrameRules guest{FrameSender::guest, false, true, false, true};
  const auto got = decode_split(guest, g, {1, 9, 17, 30});
  REQUIRE(got.size() == 4);
  CHECK(got[0].kind == FrameKind::hello);
  CHECK(got[0].generation == 3);
  CHECK(got[0].data == "web");
  CHECK(got[1].kind == FrameKind::position);
  CHECK(got[1].position == 0x0102);
  CHECK(got[2].kind == FrameKind::ack);
  CHECK(got[2].position == 7);
  CHECK(got[3].stream == Stream::out);
  CHECK(got[3].position == 9);
  for (const Frame& f : got) CHECK(encode_frame(f) == encode_frame(f));  // stable
  std::string h;
  append_position(h, Stream::out, 5);
  append_position(h, Stream::err, 6);
  append_ack(h, Stream::err, 0xffffffffffffffffull);
  append_close(h);
  FrameRules host{FrameSender::host, false, true, false, true};
  const auto hf = decode_split(host, h, {});
  REQUIRE(hf.size() == 4);
  CHECK(hf[2].position == 0xffffffffffffffffull);
  CHECK(hf[3].kind == FrameKind::close);
  std::string re;
  for (const Frame& f : hf) append_frame(re, f);
  CHECK(re == h);
}

TEST_CASE("resume frames: refused without resume, on the wrong stream or with a wrong length") {
  FrameRules guest{FrameSender::guest, false, true, false, true};
  FrameRules guest_noin{FrameSender::guest, false, false, false, true};
  FrameRules host{FrameSender::host, true, true, false, true};
  const std::vector<std::tuple<FrameRules, std::string, std::string>> cases = {
      {kGuestRules, hdr(0, 6, 8) + std::string(8, '\0'), "hello frame on stdin: data channel resume is off (boot.stdio.replay_bytes)"},
      {kHostRules, hdr(1, 4, 8) + std::string(8, '\0'), "ack frame on stdout: data channel resume is off (boot.stdio.replay_bytes)"},
      {guest, hdr(1, 6, 8) + std::string(8, '\0'), "hello frame on stdout: not a guest-to-host frame"},
      {guest, hdr(0, 6, 8, 0, 1) + std::string(8, '\0'), "hello frame on stdin of process 1: no such process"},
      {guest, hdr(0, 6, 7) + std::string(7, '\0'), "hello frame on stdin: length 7 (expected 8..263)"},
      {guest, hdr(0, 6, 264), "hello frame on stdin: length 264 (expected 8..263)"},
      {guest, hdr(1, 4, 8) + std::string(8, '\0'), "ack frame on stdout: not a guest-to-host frame"},
      {guest_noin, hdr(0, 4, 8) + std::string(8, '\0'), "ack frame on stdin: not a guest-to-host frame"},
      {guest, hdr(0, 5, 9) + std::string(9, '\0'), "position frame on stdin: length 9 (expected 8)"},
      {guest_noin, hdr(0, 5, 8) + std::string(8, '\0'), "position frame on stdin: not a guest-to-host frame"},
      {FrameRules{FrameSender::guest, true, false, false, true}, hdr(2, 5, 8) + std::string(8, '\0'),
       "position frame on stderr: not a guest-to-host frame"},
      {guest, hdr(0, 7, 0), "close frame on stdin: not a guest-to-host frame"},
      {host, hdr(0, 5, 8) + std::string(8, '\0'), "position frame on stdin: not a host-to-guest frame"},
      {host, hdr(2, 4, 8) + std::string(8, '\0'), "ack frame on stderr: not a host-to-guest frame"},  // a terminal
      {host, hdr(0, 7, 1) + "x", "close frame on stdin: length 1 (expected 0)"},
      {host, hdr(1, 6, 8) + std::string(8, '\0'), "hello frame on stdout: not a host-to-guest frame"},
  };
  for (const auto& [rules, wire, want] : cases) {
    CAPTURE(want);
    CHECK(error_for(rules, wire) == want + " (frame at byte 0)");
  }
  // Not judged by their stream's eof: a close after stdin's eof is legal.
  CHECK(error_for(host, hdr(0, 1, 0) + hdr(0, 7, 0)).empty());
}
