// The host end of the data channel over real socketpairs, with a scripted guest on the other end
// (frames built with the shared encoder, protocol/frame.hpp): stdout/stderr kept apart and
// byte-exact to the embedder and into workload.log (checked by a parser of this test's own),
// framing errors ending only the data channel (the outcome still recorded), a slow embedder
// (paused output: the guest blocks, the lifecycle goes on), stdin and resize frames to the guest.
// Everything waits for events (Harness::run_until), never for time.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/socket.h>

#include <fstream>
#include <random>
#include <regex>
#include <thread>

#include "host/lib/data_channel.hpp"
#include "support.hpp"

using namespace nes;
using namespace nes::host;
using namespace nes::test;
using namespace std::chrono_literals;

namespace {

/// What the embedder saw through StdioHooks.
struct Seen {
  std::string out, err;
  int eof_out = 0, eof_err = 0;
  std::uint64_t dropped = 0;
  std::optional<std::string> closed;  // the closed hook's error ("" = clean)
  int writable = 0;
};

struct DataHarness {
  std::shared_ptr<Seen> seen = std::make_shared<Seen>();
  Harness h;
  explicit DataHarness(std::function<void(HostOptions&)> more = {})
      : h([s = seen, more](HostOptions& o) {
          o.stdio.data = [s](const std::string&, proto::Stream st, std::string_view b) {
            (st == proto::Stream::err ? s->err : s->out).append(b);
          };
          o.stdio.eof = [s](const std::string&, proto::Stream st) {
            ++(st == proto::Stream::err ? s->eof_err : s->eof_out);
          };
          o.stdio.dropped = [s](const std::string&, proto::Stream, std::uint64_t n) { s->dropped += n; };
          o.stdio.closed = [s](const std::string&, const std::string& e) { s->closed = e; };
          o.stdio.stdin_writable = [s](const std::string&) { ++s->writable; };
          if (more) more(o);
        }) {}

  SessionConfig config(std::string vm, proto::Stdio stdio = {}) {
    auto c = h.config(std::move(vm));
    c.descriptor.stdio = stdio;
    return c;
  }
  /// A socketpair: one end handed to the host as the VM's data channel, the other returned.
  Fd attach(const std::string& vm) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    REQUIRE(h.host->attach_data_stream(vm, Fd(sv[0])));
    return Fd(sv[1]);
  }
  /// The whole lifecycle of a workload that exits with `code`.
  std::shared_ptr<GuestLog> control(const std::string& path, int code) {
    return h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"},
                          step::Send{started_line(9) + exited_line(code)}, step::Expect{"shutdown"},
                          step::WaitClose{}});
  }
};

std::string frames_out(std::string_view out, std::string_view err) {
  std::string f;
  proto::append_data(f, proto::Stream::out, out);
  proto::append_data(f, proto::Stream::err, err);
  return f;
}

/// workload.log read back by a parser of this test's own: every line must match the CRI format.
struct LogBack {
  std::string out, err;
  bool all_valid = true;
};
LogBack read_log(const std::filesystem::path& p) {
  static const std::regex line(
      R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z (stdout|stderr) (P|F):g\d+ ([\s\S]*)$)");  // g: the generation
  LogBack b;
  std::ifstream in(p, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  std::size_t pos = 0;
  while (pos < all.size()) {
    auto nl = all.find('\n', pos);
    if (nl == std::string::npos) {
      b.all_valid = false;
      break;
    }
    std::string l = all.substr(pos, nl - pos);
    pos = nl + 1;
    std::smatch m;
    if (!std::regex_match(l, m, line)) {
      b.all_valid = false;
      continue;
    }
    auto& dst = m[1] == "stdout" ? b.out : b.err;
    dst += m[3].str();
    if (m[2] == "F") dst += '\n';
  }
  return b;
}

std::string every_byte(std::size_t n) {
  std::mt19937 rng(11);
  std::string s;
  for (int b = 0; b < 256; ++b) s += static_cast<char>(b);
  while (s.size() < n) s += static_cast<char>(rng() & 0xff);
  return s;
}

}  // namespace

TEST_CASE("stdout and stderr apart, every byte value, eofs: to the embedder and into workload.log") {
  DataHarness d;
  auto path = d.h.add(d.config("a"));
  Fd g = d.attach("a");
  std::string out = every_byte(200000), err = "warning: one\nno newline";
  write_all(g.get(), frames_out(out, err));
  std::string eofs;
  proto::append_eof(eofs, proto::Stream::out);
  proto::append_eof(eofs, proto::Stream::err);
  write_all(g.get(), eofs);
  auto c = d.control(path, 0);
  REQUIRE(d.h.run_until([&] { return d.seen->eof_out == 1 && d.seen->eof_err == 1; }));
  CHECK(d.seen->out == out);
  CHECK(d.seen->err == err);
  g.reset();  // the guest closes the channel
  REQUIRE(d.h.run_until([&] { return d.seen->closed.has_value(); }));
  CHECK(*d.seen->closed == "");
  REQUIRE(d.h.run_until([&] { return d.h.durable("a"); }));
  REQUIRE(d.h.host->vm_exited("a"));
  REQUIRE(d.h.run_until([&] { return d.h.has_event("a", "finished"); }));
  // The log is closed before "finished": complete now.
  auto lb = read_log(d.h.state / "a" / "workload.log");
  CHECK(lb.all_valid);
  CHECK(lb.out == out);
  CHECK(lb.err == err);
}

TEST_CASE("framing errors end the data channel with a named error; the outcome is still recorded") {
  struct Bad {
    const char* name;
    std::string bytes;
    const char* says;
  };
  std::string after_eof;
  proto::append_eof(after_eof, proto::Stream::out);
  proto::append_data(after_eof, proto::Stream::out, "late");
  std::vector<Bad> bad = {
      {"unknown stream", std::string("\x07\x00\x00\x00\x00\x00\x00\x01x", 9), "stream 7"},
      {"unknown kind", std::string("\x01\x09\x00\x00\x00\x00\x00\x00", 8), "kind"},
      {"unknown process", std::string("\x01\x00\x01\x00\x00\x00\x00\x01x", 9), "of process 256: no such process"},
      {"oversized", std::string("\x01\x00\x00\x00\x00\x01\x00\x01", 8), "65537"},
      {"data after eof", after_eof, "eof"},
      {"stdin from the guest", std::string("\x00\x00\x00\x00\x00\x00\x00\x01x", 9), "stdin"},
      {"dropped in lossless mode", std::string("\x01\x03\x00\x00\x00\x00\x00\x08", 8) + std::string(8, '\0'), "dropped"},
  };
  for (auto& b : bad) {
    CAPTURE(b.name);
    DataHarness d;
    auto path = d.h.add(d.config("v"));
    Fd g = d.attach("v");
    write_all(g.get(), frames_out("before\n", ""));
    write_all(g.get(), b.bytes);
    REQUIRE(d.h.run_until([&] { return d.seen->closed.has_value(); }));
    CHECK(d.seen->closed->find(b.says) != std::string::npos);
    CHECK(d.h.has_event("v", "data_error"));
    CHECK(d.seen->out == "before\n");
    // The lifecycle is untouched: the outcome arrives, is recorded, the session finishes.
    auto c = d.control(path, 3);
    REQUIRE(d.h.run_until([&] { return d.h.durable("v"); }));
    CHECK(d.h.record("v")->exit_status == 3);
    REQUIRE(d.h.host->vm_exited("v"));
    REQUIRE(d.h.run_until([&] { return d.h.has_event("v", "finished"); }));
    auto lb = read_log(d.h.state / "v" / "workload.log");
    CHECK(lb.all_valid);
    // Nothing already written to the log is lost; a stream the error cut short (no eof, and no
    // output_lost from this guest) is said to be truncated, in the log and in the record.
    const bool out_ended = std::string_view(b.name) == "data after eof";
    CHECK(lb.out == (out_ended ? "before\n" : "before\n[neshost: stdout truncated: its eof never arrived (7 bytes received)]\n"));
    CHECK(lb.err == "[neshost: stderr truncated: its eof never arrived (0 bytes received)]\n");
    auto rec = d.h.record("v");
    CHECK(rec->exit_status == 3);
    CHECK(rec->truncated.err == 0u);
    CHECK(rec->truncated.out == (out_ended ? std::nullopt : std::optional<std::uint64_t>(7)));
    CHECK(reported_status(*rec) == 125);
  }
}

TEST_CASE("closed in the middle of a frame is an error too; a second data connection is refused") {
  DataHarness d;
  auto path = d.h.add(d.config("m"));
  Fd g = d.attach("m");
  std::string f = frames_out("abcdef", "");
  write_all(g.get(), std::string_view(f).substr(0, f.size() - 2));
  g.reset();
  REQUIRE(d.h.run_until([&] { return d.seen->closed.has_value(); }));
  CHECK(d.seen->closed->find("middle of a frame") != std::string::npos);
  Fd again = d.attach("m");
  REQUIRE(d.h.run_until([&] { return d.h.has_event("m", "data_refused"); }));
}

TEST_CASE("a descriptor without stdio refuses a data channel") {
  DataHarness d;
  auto path = d.h.add(d.h.config("n"));
  Fd g = d.attach("n");
  REQUIRE(d.h.run_until([&] { return d.h.has_event("n", "data_refused"); }));
  CHECK(!d.seen->closed);
}

TEST_CASE("a slow embedder: output paused, the guest blocks, the outcome still goes through; then all of it") {
  DataHarness d;
  auto path = d.h.add(d.config("s"));
  REQUIRE(d.h.host->pause_output("s", true));
  Fd g = d.attach("s");
  const std::string big = every_byte(8u << 20);  // far beyond the socket buffers
  std::atomic<bool> wrote{false};
  std::thread writer([&] {
    std::string f = frames_out(big, "");
    proto::append_eof(f, proto::Stream::out);
    proto::append_eof(f, proto::Stream::err);
    std::string_view b(f);
    while (!b.empty()) {
      ssize_t n = ::write(g.get(), b.data(), b.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      b.remove_prefix(static_cast<std::size_t>(n));
    }
    wrote = true;
  });
  // On every path: unblock the writer (its socket shut down) and join it.
  struct Joiner {
    std::thread& t;
    int fd;
    ~Joiner() {
      ::shutdown(fd, SHUT_RDWR);
      if (t.joinable()) t.join();
    }
  } joiner{writer, g.get()};
  auto c = d.control(path, 5);
  REQUIRE(d.h.run_until([&] { return d.h.durable("s"); }));
  CHECK(d.h.record("s")->exit_status == 5);
  CHECK(!wrote.load());        // the guest is held back: nobody read its output
  CHECK(d.seen->out.empty());  // and the embedder got nothing while paused
  REQUIRE(d.h.host->pause_output("s", false));
  REQUIRE(d.h.run_until([&] { return d.seen->eof_out == 1; }));
  CHECK(d.seen->out.size() == big.size());
  CHECK(d.seen->out == big);
}

TEST_CASE("stdin data and eof, resize: frames the guest decodes; refusals name why") {
  DataHarness d;
  proto::Stdio st;
  st.attach_stdin = true;
  st.terminal = proto::Terminal{24, 80};
  auto path = d.h.add(d.config("i", st));
  Fd g = d.attach("i");
  REQUIRE(d.h.run_until([&] { return d.h.has_event("i", "data_connected"); }));
  REQUIRE(d.h.host->send_stdin("i", "abc\n"));
  REQUIRE(d.h.host->send_resize("i", 50, 132));
  CHECK(d.h.host->send_resize("i", 0, 80).error().message.find("zero") != std::string::npos);
  REQUIRE(d.h.host->send_stdin_eof("i"));
  CHECK(d.h.host->send_stdin("i", "x").error().message.find("eof") != std::string::npos);
  proto::FrameRules r;
  r.sender = proto::FrameSender::host;
  r.input = true;
  r.terminal = true;
  proto::FrameDecoder dec(r);
  std::vector<proto::Frame> got;
  std::string buf;
  REQUIRE(d.h.run_until([&] {
    char b[4096];
    ssize_t n = ::recv(g.get(), b, sizeof b, MSG_DONTWAIT);
    if (n > 0) {
      std::string_view in(b, static_cast<std::size_t>(n));
      while (auto f = dec.next(in)) got.push_back(*f);
    }
    return got.size() >= 3 || dec.failed();
  }));
  REQUIRE(!dec.failed());
  REQUIRE(got.size() == 3);
  CHECK(got[0].kind == proto::FrameKind::data);
  CHECK(got[0].data == "abc\n");
  CHECK(got[1].kind == proto::FrameKind::resize);
  CHECK(got[1].rows == 50);
  CHECK(got[1].cols == 132);
  CHECK(got[2].kind == proto::FrameKind::eof);
  CHECK(got[2].stream == proto::Stream::in);

  // Without stdin attached and without a terminal: refused, naming the field.
  DataHarness e;
  auto p2 = e.h.add(e.config("j"));
  Fd g2 = e.attach("j");
  REQUIRE(e.h.run_until([&] { return e.h.has_event("j", "data_connected"); }));
  CHECK(e.h.host->send_stdin("j", "x").error().message.find("stdio.stdin") != std::string::npos);
  CHECK(e.h.host->send_resize("j", 5, 5).error().message.find("terminal") != std::string::npos);
  CHECK(!e.h.host->send_stdin("nope", "x"));
}

TEST_CASE("stdin is bounded: a guest that does not read gets at most stdin_cap queued") {
  DataHarness d([](HostOptions& o) { o.stdin_cap = 64 * 1024; });
  proto::Stdio st;
  st.attach_stdin = true;
  auto path = d.h.add(d.config("b", st));
  Fd g = d.attach("b");
  REQUIRE(d.h.run_until([&] { return d.h.has_event("b", "data_connected"); }));
  std::string chunk(16 * 1024, 'z');
  std::size_t accepted = 0;
  // Until refused: the socket buffer takes some, then the queue fills to its cap.
  for (int i = 0; i < 10000; ++i) {
    if (!d.h.host->send_stdin("b", chunk)) break;
    accepted += chunk.size();
    d.h.io.poll();
  }
  CHECK(accepted < 64u << 20);
  // The guest reads everything: the writable hook fires.
  std::size_t drained = 0;
  REQUIRE(d.h.run_until([&] {
    char b[65536];
    ssize_t n;
    while ((n = ::recv(g.get(), b, sizeof b, MSG_DONTWAIT)) > 0) drained += static_cast<std::size_t>(n);
    return d.seen->writable >= 1;
  }));
  CHECK(drained > 0);
}

TEST_CASE("lossy mode: drop counts reach the embedder and appear in the log") {
  DataHarness d;
  proto::Stdio st;
  st.mode = proto::StdioMode::lossy;
  auto path = d.h.add(d.config("l", st));
  Fd g = d.attach("l");
  std::string f;
  proto::append_data(f, proto::Stream::out, "one\n");
  proto::append_dropped(f, proto::Stream::out, 12345);
  proto::append_data(f, proto::Stream::out, "two\n");
  proto::append_eof(f, proto::Stream::out);
  proto::append_eof(f, proto::Stream::err);
  write_all(g.get(), f);
  g.reset();
  REQUIRE(d.h.run_until([&] { return d.seen->closed.has_value(); }));
  CHECK(*d.seen->closed == "");
  CHECK(d.seen->dropped == 12345);
  CHECK(d.h.has_event("l", "output_dropped"));
  auto c = d.control(path, 0);
  REQUIRE(d.h.run_until([&] { return d.h.durable("l"); }));
  REQUIRE(d.h.host->vm_exited("l"));
  REQUIRE(d.h.run_until([&] { return d.h.has_event("l", "finished"); }));
  auto lb = read_log(d.h.state / "l" / "workload.log");
  CHECK(lb.out == "one\n[neshost: 12345 bytes of stdout dropped]\ntwo\n");
}

TEST_CASE("firecracker_data_path is <uds>_7001") {
  CHECK(firecracker_data_path("/run/fc/v.sock") == "/run/fc/v.sock_7001");
}

TEST_CASE("exec: its own streams by process number, stdin after started, kill to it, ended only after its output") {
  DataHarness d;
  proto::Stdio st;
  auto path = d.h.add(d.config("x", st));
  Fd g = d.attach("x");
  auto enc = [](proto::GuestMessage m) { return proto::encode_line(m); };
  auto c = d.h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{started_line(9)},
                            step::Expect{"exec"}, step::Send{enc(proto::ExecStarted{1, 50})}, step::Expect{"kill"},
                            step::Send{enc(proto::ExecExited{1, std::nullopt, 9}) + exited_line(0)},
                            step::Expect{"shutdown"}, step::WaitClose{}});
  REQUIRE(d.h.run_until([&] { return d.h.has_event("x", "started"); }));

  struct ExecSeen {
    std::optional<std::int32_t> pid;
    std::string out, err;
    int eofs = 0;
    std::optional<ExecEnd> end;
    int eofs_at_end = -1;
  };
  auto xs = std::make_shared<ExecSeen>();
  ExecHooks hooks;
  hooks.started = [xs](std::int32_t pid) { xs->pid = pid; };
  hooks.data = [xs](proto::Stream s, std::string_view b) { (s == proto::Stream::err ? xs->err : xs->out).append(b); };
  hooks.eof = [xs](proto::Stream) { ++xs->eofs; };
  hooks.ended = [xs](const ExecEnd& e) {
    xs->end = e;
    xs->eofs_at_end = xs->eofs;
  };
  proto::Exec ex;
  ex.argv = {"/bin/sh", "-c", "cat"};
  proto::Stdio xst;
  xst.attach_stdin = true;
  // Before it started: no stdin for it (the guest would not know the number yet).
  auto proc = d.h.host->exec("x", ex, xst, hooks);
  REQUIRE(proc);
  CHECK(*proc == 1);
  CHECK(!d.h.host->send_stdin("x", "early", 1));
  REQUIRE(d.h.run_until([&] { return xs->pid.has_value(); }));
  CHECK(*xs->pid == 50);
  REQUIRE(d.h.host->send_stdin("x", "in", 1));
  REQUIRE(d.h.host->send_stdin_eof("x", 1));
  // The guest side reads them framed as process 1.
  proto::FrameDecoder in_dec(proto::FrameRules{proto::FrameSender::host, false, false, false});
  REQUIRE(in_dec.open_process(1, proto::FrameRules{proto::FrameSender::host, false, true, false}));
  std::vector<proto::Frame> got;
  REQUIRE(d.h.run_until([&] {
    char buf[256];
    ssize_t n = ::recv(g.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      std::string_view v(buf, static_cast<std::size_t>(n));
      while (auto f = in_dec.next(v)) got.push_back(*f);
    }
    return got.size() >= 2 || in_dec.failed();
  }));
  REQUIRE(!in_dec.failed());
  CHECK((got[0].proc == 1 && got[0].kind == proto::FrameKind::data && got[0].data == "in"));
  CHECK((got[1].proc == 1 && got[1].kind == proto::FrameKind::eof));
  // kill{9, proc 1}; the guest reports it killed, but its output is not in yet: no end.
  REQUIRE(d.h.host->kill_exec("x", 1, 9));
  REQUIRE(d.h.run_until([&] { return d.h.has_event("x", "exec_exited"); }));
  CHECK(!xs->end);
  std::string f;
  proto::append_data(f, proto::Stream::out, "hello", 1);
  proto::append_data(f, proto::Stream::err, "oops", 1);
  proto::append_eof(f, proto::Stream::out, 1);
  proto::append_eof(f, proto::Stream::err, 1);
  proto::append_data(f, proto::Stream::out, "workload");
  write_all(g.get(), f);
  REQUIRE(d.h.run_until([&] { return xs->end.has_value(); }));
  CHECK(xs->out == "hello");
  CHECK(xs->err == "oops");
  CHECK(xs->eofs_at_end == 2);
  REQUIRE(std::holds_alternative<proto::ExecExited>(*xs->end));
  CHECK(exec_exit_status(*xs->end) == 137);
  // The workload's own output is not the exec's.
  REQUIRE(d.h.run_until([&] { return d.seen->out == "workload"; }));
  // Over: no more stdin or kills for it.
  CHECK(!d.h.host->kill_exec("x", 1, 9));
  CHECK(!d.h.host->send_stdin("x", "late", 1));
  REQUIRE(d.h.run_until([&] { return d.h.durable("x"); }));
}

TEST_CASE("exec: exec_failed ends it with 127/126; an exec after the outcome is refused") {
  proto::ExecFailed f{1, "no", 2, proto::StartFailClass::not_found};
  CHECK(exec_exit_status(f) == 127);
  f.cls = proto::StartFailClass::other;
  CHECK(exec_exit_status(f) == 126);
  CHECK(exec_exit_status(proto::ExecExited{1, 4, std::nullopt}) == 4);
  CHECK(exec_exit_status(proto::ExecExited{1, std::nullopt, 9}) == 137);
  CHECK(exec_exit_status(ExecLost{"lost"}) == 125);

  DataHarness d;
  auto path = d.h.add(d.config("y"));
  Fd g = d.attach("y");
  auto c = d.h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{started_line(9)},
                            step::Expect{"exec"},
                            step::Send{proto::encode_line(proto::GuestMessage{
                                proto::ExecFailed{1, "exec /nope: No such file or directory", 2, proto::StartFailClass::not_found}})}, 
                            step::Send{exited_line(0)}, step::Expect{"shutdown"}, step::WaitClose{}});
  REQUIRE(d.h.run_until([&] { return d.h.has_event("y", "started"); }));
  std::optional<ExecEnd> end;
  ExecHooks hooks;
  hooks.ended = [&](const ExecEnd& x) { end = x; };
  proto::Exec ex;
  ex.argv = {"/nope"};
  REQUIRE(d.h.host->exec("y", ex, std::nullopt, hooks));
  REQUIRE(d.h.run_until([&] { return end.has_value(); }));
  REQUIRE(std::holds_alternative<proto::ExecFailed>(*end));
  CHECK(exec_exit_status(*end) == 127);
  REQUIRE(d.h.run_until([&] { return d.h.durable("y"); }));
  auto late = d.h.host->exec("y", ex, std::nullopt, {});
  REQUIRE(!late);
  CHECK(late.error().message == "exec: the workload has ended");
}
