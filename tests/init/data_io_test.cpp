// The init's data-channel I/O (nesinit/data_io.hpp) against a socketpair as the data channel and
// the real pipes make_stdio opens: the workload's output framed on the channel (direct frames,
// spliced) with both eofs and its accounts in OutputsDone; the host's stdin written to the
// workload's pipe and closed at the host's EOF; held() counting bytes unread in a pipe; close()
// ending the channel; an exec refused without a channel. Every poll is bounded (no sleeps).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "data_io.hpp"
#include "loop.hpp"
#include "protocol/frame.hpp"

using namespace nes;
using namespace nes::init;

namespace {

/// The verdicts DataIo hands the loop, kept for the test to look at.
struct Sink final : DataEvents {
  std::vector<std::string> errors;
  std::vector<ev::OutputsDone> done;
  std::vector<ev::ExecOutputsDone> exec_done;
  std::vector<ev::ExecClosed> closed;
  void push(ev::DataError&& e) override { errors.push_back(e.reason); }
  void push(ev::DataLost&& e) override { errors.push_back("lost: " + e.reason); }
  void push(ev::OutputsDone&& e) override { done.push_back(std::move(e)); }
  void push(ev::ExecOutputsDone&& e) override { exec_done.push_back(std::move(e)); }
  void push(ev::ExecClosed&& e) override { closed.push_back(std::move(e)); }
};

/// A data channel: the init's end (`guest`, for DataIo) and the host's (`host`, non-blocking).
struct Wire {
  base::Fd guest, host;
  Wire() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    guest.reset(sv[0]);
    host.reset(sv[1]);
  }
  /// Everything the host side can read now.
  std::string drain() {
    std::string got;
    char buf[65536];
    ssize_t n;
    while ((n = ::read(host.get(), buf, sizeof buf)) > 0) got.append(buf, static_cast<std::size_t>(n));
    return got;
  }
};

/// One loop round as Pid1 does it: the poll set, a bounded poll, then the I/O found ready.
void round(DataIo& io) {
  pollfd p[DataIo::kPollFds];
  const std::size_t n = io.poll_set(p, monotonic_ms());
  ::poll(p, static_cast<nfds_t>(n), 1000);
  io.on_poll(p);
}

}  // namespace

TEST_CASE("the workload's output goes out framed, both eofs, and OutputsDone carries the accounts") {
  Log log(2, LogLevel::quiet);
  Sink sink;
  Wire ch;
  DataIo io(log, sink);
  const proto::Stdio stdio;  // pipes, lossless, no stdin
  io.connected(std::move(ch.guest), false, act::DialData{0, stdio});
  auto child = io.open_workload(stdio);
  REQUIRE(child);
  CHECK_FALSE(child->terminal);
  REQUIRE(::write(child->fd[1], "hello", 5) == 5);
  REQUIRE(::write(child->fd[2], "oops", 4) == 4);
  io.workload_spawned();  // the child's ends close: the pipes read EOF after their bytes
  CHECK(io.held(0) == 9);

  std::string wire;
  for (int i = 0; i < 50 && sink.done.empty(); ++i) {
    round(io);
    wire += ch.drain();
  }
  REQUIRE(sink.done.size() == 1);
  wire += ch.drain();
  CHECK(sink.done[0].out == ev::OutputAccount{5, 0, true});
  REQUIRE(sink.done[0].err);
  CHECK(*sink.done[0].err == ev::OutputAccount{4, 0, true});

  proto::FrameDecoder dec({proto::FrameSender::guest, false, false, false});
  std::string out, err;
  std::string_view in = wire;
  while (auto f = dec.next(in)) {
    if (f->kind != proto::FrameKind::data) continue;
    (f->stream == proto::Stream::out ? out : err) += f->data;
  }
  CHECK_FALSE(dec.failed());
  CHECK(out == "hello");
  CHECK(err == "oops");
  CHECK(dec.at_eof(proto::Stream::out));
  CHECK(dec.at_eof(proto::Stream::err));
  CHECK(sink.errors.empty());
  CHECK(io.held(0) == 0);

  ev::Flushing f;
  io.report(f);
  CHECK(f.data_open);
  CHECK(f.outputs_done);
  CHECK_FALSE(f.data_unsent);
  io.close();
  ev::Flushing after;
  io.report(after);
  CHECK_FALSE(after.data_open);
}

TEST_CASE("the host's stdin reaches the workload's pipe; the host's EOF closes it") {
  Log log(2, LogLevel::quiet);
  Sink sink;
  Wire ch;
  DataIo io(log, sink);
  proto::Stdio stdio;
  stdio.attach_stdin = true;
  io.connected(std::move(ch.guest), false, act::DialData{0, stdio});
  auto child = io.open_workload(stdio);
  REQUIRE(child);
  // The workload's stdin: a copy of the child's end, kept past the spawn (as the child's own).
  base::Fd workload_in(::fcntl(child->fd[0], F_DUPFD_CLOEXEC, 3));
  REQUIRE(workload_in);
  io.workload_spawned();
  std::string frames;
  proto::append_data(frames, proto::Stream::in, "typed\n");
  proto::append_eof(frames, proto::Stream::in);
  REQUIRE(::write(ch.host.get(), frames.data(), frames.size()) == static_cast<ssize_t>(frames.size()));
  REQUIRE(::shutdown(ch.host.get(), SHUT_WR) == 0);

  std::string got;
  char buf[64];
  for (int i = 0; i < 50; ++i) {
    round(io);
    pollfd p{workload_in.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) continue;
    ssize_t n = ::read(workload_in.get(), buf, sizeof buf);
    if (n <= 0) break;  // EOF: the init closed its end
    got.append(buf, static_cast<std::size_t>(n));
  }
  CHECK(got == "typed\n");
  CHECK(sink.errors.empty());
}

TEST_CASE("a frame the host may not send closes the data channel with DataError") {
  Log log(2, LogLevel::quiet);
  Sink sink;
  Wire ch;
  DataIo io(log, sink);
  const proto::Stdio stdio;  // no stdin: a stdin frame is a framing error
  io.connected(std::move(ch.guest), false, act::DialData{0, stdio});
  auto child = io.open_workload(stdio);
  REQUIRE(child);
  io.workload_spawned();
  std::string frames;
  proto::append_data(frames, proto::Stream::in, "x");
  REQUIRE(::write(ch.host.get(), frames.data(), frames.size()) == static_cast<ssize_t>(frames.size()));
  for (int i = 0; i < 50 && sink.errors.empty(); ++i) round(io);
  REQUIRE(sink.errors.size() == 1);
  ev::Flushing f;
  io.report(f);
  CHECK_FALSE(f.data_open);
}

TEST_CASE("an exec without a data channel is refused (EAGAIN), its process closed") {
  Log log(2, LogLevel::quiet);
  Sink sink;
  DataIo io(log, sink);
  auto r = io.open_exec(1, proto::Stdio{});
  REQUIRE_FALSE(r);
  CHECK(r.error().err == EAGAIN);
  io.exec_spawned(1, false);
  CHECK(io.held(1) == 0);
  io.close_exec(1);
  CHECK(sink.closed.empty());
}
