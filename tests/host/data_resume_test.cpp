// Data channel resume, the host's end (docs/protocol.md "Data channel resume"): one DataLink over
// a real socketpair, event by event, with a scripted guest (frames from the shared encoder): the
// hello checked against the session (another VM or generation refused, nothing handed on), the
// host's positions first, a replay continuing the tallies, a position jump counted as a gap, a
// position behind what was received refused naming the stream, acks of what is safe, stdin kept
// until the guest acknowledges it and re-sent from the guest's position (none twice), the close
// frame before a close on purpose, a loss that is not a close.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "host/lib/data_channel.hpp"

using namespace nes;
using namespace nes::host;
using namespace std::chrono_literals;
namespace asio = boost::asio;
using proto::FrameKind;
using proto::Stream;

namespace {

struct Seen {
  std::string out, err;
  std::uint64_t dropped = 0;
  std::vector<std::string> events;  // "kind detail"
  std::optional<std::string> closed;
};

/// One DataLink on a socketpair; `guest` is the scripted guest's end (non-blocking reads).
struct Link {
  asio::io_context io;
  Seen seen;
  StdioHooks hooks;
  std::shared_ptr<DataResume> resume = std::make_shared<DataResume>();
  std::shared_ptr<DataLink> link;
  int guest = -1;
  proto::FrameDecoder dec{proto::FrameRules{proto::FrameSender::host, false, true, false, true}};
  std::vector<proto::Frame> got;

  explicit Link(bool in = true) {
    resume->vm = "vm1";
    resume->generation = 4;
    hooks.data = [this](const std::string&, Stream s, std::string_view b) { (s == Stream::err ? seen.err : seen.out).append(b); };
    hooks.dropped = [this](const std::string&, Stream, std::uint64_t n) { seen.dropped += n; };
    stdio.attach_stdin = in;
  }
  proto::Stdio stdio;
  void start() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    guest = sv[1];
    ::fcntl(guest, F_SETFL, O_NONBLOCK);
    DataLink::Config c;
    c.vm = "vm1";
    c.stdio = stdio;
    c.hooks = &hooks;
    c.emit = [this](std::string k, std::string d) { seen.events.push_back(k + " " + d); };
    c.on_closed = [this](const std::string& e) { seen.closed = e; };
    c.resume = resume;
    c.resume_required = true;
    link = std::make_shared<DataLink>(io, sv[0], AF_UNIX, std::move(c));
    link->start();
  }
  ~Link() {
    if (guest >= 0) ::close(guest);
  }
  void send(const std::string& w) { REQUIRE(::write(guest, w.data(), w.size()) == static_cast<ssize_t>(w.size())); }
  /// Runs the loop until `pred` holds (bounded), reading what the host sent meanwhile.
  bool until(const std::function<bool()>& pred) {
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < end) {
      io.restart();
      io.run_for(5ms);
      char buf[4096];
      ssize_t n;
      while ((n = ::read(guest, buf, sizeof buf)) > 0) {
        std::string_view v(buf, static_cast<std::size_t>(n));
        while (auto f = dec.next(v)) got.push_back(std::move(*f));
        REQUIRE_MESSAGE(!dec.failed(), dec.error());
      }
      if (pred()) return true;
    }
    return false;
  }
  bool has_event(std::string_view prefix) const {
    for (auto& e : seen.events)
      if (e.rfind(prefix, 0) == 0) return true;
    return false;
  }
};

std::string hello(std::uint64_t gen = 4, std::string vm = "vm1") {
  std::string w;
  proto::append_hello(w, gen, vm);
  return w;
}
std::string position(Stream s, std::uint64_t p) {
  std::string w;
  proto::append_position(w, s, p);
  return w;
}
std::string data(Stream s, std::string_view b) {
  std::string w;
  proto::append_data(w, s, b);
  return w;
}

}  // namespace

TEST_CASE("the hello of another generation or VM is refused: nothing handed on, the link counts as lost") {
  for (auto [gen, vm] : {std::pair<std::uint64_t, std::string>{5, "vm1"}, {4, "vm2"}}) {
    Link l;
    l.start();
    l.send(hello(gen, vm) + data(Stream::out, "never"));
    REQUIRE(l.until([&] { return l.seen.closed.has_value(); }));
    CHECK(l.seen.out.empty());
    CHECK(l.has_event("data_refused the guest's hello names"));
    CHECK(l.link->lost());  // the session waits on for its own guest
  }
}

TEST_CASE("a guest without a hello is refused when the boot turned resume on") {
  Link l;
  l.start();
  l.send(data(Stream::out, "x"));
  REQUIRE(l.until([&] { return l.seen.closed.has_value(); }));
  CHECK(*l.seen.closed == "data channel: expected the guest's hello frame first (boot.stdio.replay_bytes is set)");
  CHECK(l.seen.out.empty());
}

TEST_CASE("positions first; a replay continues the tallies; a jump is a counted gap; behind is refused") {
  Link l(false);
  l.resume->pos[0] = 10;  // this session received 10 bytes of stdout on an earlier link
  l.start();
  l.send(hello());
  REQUIRE(l.until([&] { return l.got.size() >= 2; }));
  CHECK(l.got[0].kind == FrameKind::position);
  CHECK(l.got[0].stream == Stream::out);
  CHECK(l.got[0].position == 10);
  CHECK(l.got[1].stream == Stream::err);
  CHECK(l.got[1].position == 0);
  l.send(position(Stream::out, 10) + data(Stream::out, "abc") + position(Stream::err, 5) + data(Stream::err, "e"));
  REQUIRE(l.until([&] { return l.seen.err == "e"; }));
  CHECK(l.seen.out == "abc");
  CHECK(l.link->tally(0, Stream::out).received == 13);
  CHECK(l.resume->pos[0] == 13);
  CHECK(l.seen.dropped == 5);  // stderr 0..5 was gone from the guest's ring
  CHECK(l.resume->gap[1] == 5);
  CHECK(l.has_event("output_dropped stderr 5 bytes"));
  // Without a log, what the embedder took is safe: acked (at once past kAckStep, else after kAckDelay).
  REQUIRE(l.until([&] {
    for (auto& f : l.got)
      if (f.kind == FrameKind::ack && f.stream == Stream::out && f.position == 13) return true;
    return false;
  }));
  l.send(position(Stream::out, 12));
  REQUIRE(l.until([&] { return l.seen.closed.has_value(); }));
  CHECK(*l.seen.closed == "position frame on stdout: position 12 behind the 13 bytes received");
}

TEST_CASE("stdin: kept until acked, re-sent from the guest's position on the next link, none twice") {
  Link l;
  l.start();
  l.send(hello() + position(Stream::in, 0));
  REQUIRE(l.until([&] { return l.got.size() >= 2; }));
  REQUIRE(l.link->send_stdin("0123456789"));
  REQUIRE(l.link->send_stdin_eof());
  REQUIRE(l.until([&] { return l.got.size() >= 4; }));
  CHECK(l.resume->in_sent == 10);
  CHECK(l.resume->in_unacked == "0123456789");
  std::string a;
  proto::append_ack(a, Stream::in, 4);
  l.send(a);
  REQUIRE(l.until([&] { return l.resume->in_acked == 4; }));
  CHECK(l.resume->in_unacked == "456789");
  // The guest goes (no close frame from us): a loss.
  ::shutdown(l.guest, SHUT_RDWR);
  REQUIRE(l.until([&] { return l.seen.closed.has_value(); }));
  CHECK(l.link->lost());
  // The next link: the guest took 7 bytes; the rest and the eof come again.
  Link m;
  m.resume = l.resume;
  m.start();
  m.send(hello() + position(Stream::in, 7));
  REQUIRE(m.until([&] {
    for (auto& f : m.got)
      if (f.kind == FrameKind::eof) return true;
    return false;
  }));
  std::string in;
  for (auto& f : m.got)
    if (f.kind == FrameKind::data) in += f.data;
  CHECK(in == "789");
  // A position outside what was sent and not acknowledged is refused.
  Link n;
  n.resume = l.resume;
  n.start();
  n.send(hello() + position(Stream::in, 11));
  REQUIRE(n.until([&] { return n.seen.closed.has_value(); }));
  CHECK(*n.seen.closed == "position frame on stdin: position 11 outside the 7..10 bytes sent and not acknowledged");
}

TEST_CASE("a host taking over learns stdin's position from the guest") {
  Link l;
  l.resume->in_known = false;
  l.start();
  l.send(hello() + position(Stream::in, 1234));
  REQUIRE(l.until([&] { return l.resume->in_known; }));
  CHECK(l.resume->in_sent == 1234);
  REQUIRE(l.link->send_stdin("x"));
  CHECK(l.resume->in_sent == 1235);
}

TEST_CASE("stdin window: counted from what the workload took (the guest's acks), a takeover's from its handshake ack") {
  // The guest received 100 000 bytes and its workload took 1 000 (docs/protocol.md "Acks"): the
  // 99 000 it holds count against the window, so the guest's buffer (twice the window) always
  // has room to read the channel its output acks share.
  Link l;
  l.resume->in_known = false;
  l.start();
  std::string a;
  proto::append_ack(a, Stream::in, 1000);
  l.send(hello() + position(Stream::in, 100000) + a);
  REQUIRE(l.until([&] { return l.resume->in_known && l.resume->in_taken == 1000; }));
  CHECK(l.resume->in_sent == 100000);
  const std::string chunk(16384, 'x');
  std::size_t sent = 0;
  while (l.link->send_stdin(chunk).ok()) {
    sent += chunk.size();
    REQUIRE(sent < (1u << 20));
    l.until([] { return true; });  // written to the socket: only the window refuses
  }
  CHECK(sent == 163840);  // the first send at or past kStdinWindow - 99 000 is refused
  CHECK(l.resume->in_sent - l.resume->in_taken >= proto::kStdinWindow);
  // The workload takes: the window moves with the ack, the unacknowledged copy is trimmed.
  std::string b;
  proto::append_ack(b, Stream::in, 100000 + 65536);
  l.send(b);
  REQUIRE(l.until([&] { return l.resume->in_taken == 100000 + 65536; }));
  CHECK(l.resume->in_unacked.size() == sent - 65536);
  CHECK(l.link->send_stdin(chunk).ok());
}

TEST_CASE("a close on purpose sends the close frame first; the receipt waits for what is safe") {
  Link l(false);
  l.start();
  l.send(hello() + position(Stream::out, 0) + position(Stream::err, 0) + data(Stream::out, "z"));
  std::string e;
  proto::append_eof(e, Stream::out);
  proto::append_eof(e, Stream::err);
  l.send(e);
  REQUIRE(l.until([&] { return l.seen.closed.has_value(); }));
  CHECK(!l.link->lost());
  bool close_frame = false;
  for (auto& f : l.got) close_frame |= f.kind == FrameKind::close;
  CHECK(close_frame);
  CHECK(*l.seen.closed == "");
}

TEST_CASE("a stdin eof given before the handshake is kept and goes out after the guest's stdin position") {
  Link l;
  l.resume->in_known = false;  // a host taking over: it learns stdin's position from the guest
  l.start();
  REQUIRE(l.link->send_stdin_eof());  // before any hello: kept, not refused
  l.send(hello() + position(Stream::in, 3));
  REQUIRE(l.until([&] {
    for (auto& f : l.got)
      if (f.kind == FrameKind::eof && f.stream == Stream::in) return true;
    return false;
  }));
  CHECK(l.resume->in_eof);
}

TEST_CASE("the receipt goes out after a resume when the eofs came on an earlier link") {
  Link l(false);
  l.resume->pos[0] = 2;
  l.resume->eof[0] = l.resume->eof[1] = true;  // both streams ended on the lost link
  l.start();
  std::string w = hello() + position(Stream::out, 2) + position(Stream::err, 0);
  proto::append_eof(w, Stream::out);  // the guest replays its eofs: repeats, skipped
  proto::append_eof(w, Stream::err);
  l.send(w);
  REQUIRE(l.until([&] { return l.seen.closed.has_value(); }));
  bool close_frame = false;
  for (auto& f : l.got) close_frame |= f.kind == FrameKind::close;
  CHECK(close_frame);
  CHECK(*l.seen.closed == "");
}

TEST_CASE("a position above 2^53-1 is refused naming the stream") {
  Link l(false);
  l.start();
  l.send(hello() + position(Stream::out, ~std::uint64_t{0}));
  REQUIRE(l.until([&] { return l.seen.closed.has_value(); }));
  CHECK(*l.seen.closed == "position frame on stdout: position 18446744073709551615 above 2^53-1");
}
