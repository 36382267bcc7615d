// The monitor's control socket (host/monitor/control.hpp, monitor.hpp): every request and reply
// encoded to its exact text and parsed back, every malformed field refused with its error text,
// the bounds on each side of the limit; then the real server (ControlServer + control_handler)
// over a real Unix socket with fake handlers (no VM) against the real clients: stop, kill, ps,
// an exec's waiting/started/exit sequence, errors and malformed lines. No sleeps: every wait is
// a blocking read that the server's reply ends; the server's loop thread is joined, the temp dir
// removed.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <fmt/format.h>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "host/monitor/control.hpp"
#include "host/monitor/monitor.hpp"
#include "protocol/codec.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes;
using namespace nes::monitor;
namespace ctl = nes::monitor::control;
namespace fs = std::filesystem;

namespace {

proto::ExecProcess sample_exec() {
  proto::ExecProcess m;
  m.proc = 1;
  m.exec.argv = {"sh", "-c", "true"};
  return m;
}
constexpr std::string_view kSampleExecJson =
    R"({"type":"exec","proc":1,"exec":{"argv":["sh","-c","true"],"env":{},"cwd":null,"uid":0,"gid":0}})";

proto::Processes sample_processes() {
  proto::Processes p;
  p.processes.push_back({1, 0, 0, "/sbin/nesinit"});
  p.processes.push_back({7, 1, 1000, "sleep 1000"});
  return p;
}

/// The error parse_request(line) gives ("" when it parses).
std::string request_error(std::string_view line) {
  auto r = ctl::parse_request(line);
  return r ? std::string() : r.error().message;
}
std::string reply_error(std::string_view line) {
  auto r = ctl::parse_reply(line);
  return r ? std::string() : r.error().message;
}

void check_request(const ctl::Request& r, std::string_view line) {
  CAPTURE(line);
  CHECK(ctl::encode(r) == line);
  auto back = ctl::parse_request(line);
  REQUIRE(back.ok());
  CHECK(*back == r);
  CHECK(ctl::validate(r).ok());
}

void check_reply(const ctl::Reply& r, std::string_view line) {
  CAPTURE(line);
  CHECK(ctl::encode(r) == line);
  auto back = ctl::parse_reply(line);
  REQUIRE(back.ok());
  CHECK(*back == r);
  CHECK(ctl::validate(r).ok());
}

}  // namespace

TEST_CASE("every request: its exact line, and back") {
  check_request(ctl::Stop{}, "stop");
  check_request(ctl::Ps{}, "ps");
  check_request(ctl::Pause{}, "pause");
  check_request(ctl::Resume{}, "resume");
  check_request(ctl::Wait{1}, "wait 1");
  check_request(ctl::CloseStdin{}, "close-stdin");
  check_request(ctl::Wait{65535}, "wait 65535");
  check_request(ctl::Kill{9, std::nullopt}, "kill 9");
  check_request(ctl::Kill{15, 3}, "kill 15 3");
  check_request(ctl::Kill{1, 65535}, "kill 1 65535");
  check_request(ctl::Kill{64, std::nullopt}, "kill 64");
  check_request(ctl::Resize{24, 80, std::nullopt}, "resize 24 80");
  check_request(ctl::Resize{50, 132, 7}, "resize 50 132 7");
  check_request(ctl::Resize{65535, 1, 65535}, "resize 65535 1 65535");
  check_request(ctl::Exec{false, false, false, sample_exec()}, "exec - " + std::string(kSampleExecJson));
  check_request(ctl::Exec{true, true, true, sample_exec()}, "exec ecu " + std::string(kSampleExecJson));
  check_request(ctl::Exec{true, false, false, sample_exec()}, "exec e " + std::string(kSampleExecJson));
  check_request(ctl::Exec{true, false, true, sample_exec()}, "exec eu " + std::string(kSampleExecJson));
  check_request(ctl::Resources{proto::ContainerResourcesRequest{3, std::nullopt}},
                R"(resources {"type":"container_resources","proc":3})");
  check_request(ctl::Resources{proto::ContainerResourcesRequest{4, proto::ContainerResources{67108864, std::nullopt,
                                                                                             std::nullopt, std::nullopt, 0}}},
                R"(resources {"type":"container_resources","proc":4,"update":{"memory_max":67108864,"pids_max":0}})");
  // FLAGS in any order parse the same; written back in the order ecu.
  auto any_order = ctl::parse_request("exec uce " + std::string(kSampleExecJson));
  REQUIRE(any_order.ok());
  CHECK(*any_order == ctl::Request{ctl::Exec{true, true, true, sample_exec()}});
  // A number with leading zeros is the number (written back without them).
  auto zeros = ctl::parse_request("kill 009 0003");
  REQUIRE(zeros.ok());
  CHECK(*zeros == ctl::Request{ctl::Kill{9, 3}});
}

TEST_CASE("every reply: its exact line, and back") {
  check_reply(ctl::Ok{}, "ok");
  check_reply(ctl::Error{"no such process"}, "error: no such process");
  check_reply(ctl::Error{""}, "error: ");
  check_reply(ctl::Waiting{}, "ok waiting for the workload to start");
  check_reply(ctl::Started{1234, 2}, "ok started 1234 2");
  check_reply(ctl::Started{2147483647, 65535}, "ok started 2147483647 65535");
  check_reply(ctl::Exited{0, ""}, "ok exit 0");
  check_reply(ctl::Exited{255, ""}, "ok exit 255");
  check_reply(ctl::Exited{125, "12 bytes of stdout lost: the data channel closed before its end"},
              "ok exit 125 12 bytes of stdout lost: the data channel closed before its end");
  check_reply(ctl::ProcessList{sample_processes()},
              R"(ok {"type":"processes","processes":[{"pid":1,"ppid":0,"uid":0,"cmd":"/sbin/nesinit"},)"
              R"({"pid":7,"ppid":1,"uid":1000,"cmd":"sleep 1000"}]})");
  check_reply(ctl::ResourcesReply{proto::ContainerResourcesReply{3, std::string("memory_max: refused"), std::nullopt}},
              R"(ok {"type":"container_resources_reply","proc":3,"error":"memory_max: refused"})");
  // What monitors and clients before this definition tolerated, parsed the same.
  auto w = ctl::parse_reply("ok waiting");
  REQUIRE(w.ok());
  CHECK(std::holds_alternative<ctl::Waiting>(*w));
  auto w2 = ctl::parse_reply("ok waiting for the VM");
  REQUIRE(w2.ok());
  CHECK(std::holds_alternative<ctl::Waiting>(*w2));
  auto trailing = ctl::parse_reply("ok exit 3 ");
  REQUIRE(trailing.ok());
  CHECK(*trailing == ctl::Reply{ctl::Exited{3, ""}});

  CHECK_FALSE(ctl::is_final(ctl::Waiting{}));
  CHECK_FALSE(ctl::is_final(ctl::Started{1, 1}));
  for (const ctl::Reply& r : {ctl::Reply{ctl::Ok{}}, ctl::Reply{ctl::Error{"x"}}, ctl::Reply{ctl::Exited{0, ""}},
                              ctl::Reply{ctl::ProcessList{}}})
    CHECK(ctl::is_final(r));
}

TEST_CASE("resources: a malformed container_resources is refused naming the field") {
  auto r = ctl::parse_request("resources");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message == "resources: expected JSON (a container_resources message)");
  r = ctl::parse_request(R"(resources {"type":"container_resources","proc":0})");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message == "resources: JSON: container_resources.proc: expected integer 1..65535, got 0");
  r = ctl::parse_request(R"(resources {"type":"container_resources","proc":1,"update":{"memory_max":-1}})");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message ==
        "resources: JSON: container_resources.update.memory_max: expected integer 0..9007199254740991, got -1");
  r = ctl::parse_request(R"(resources {"type":"list_processes"})");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message == "resources: JSON: expected a `container_resources` message");
}

TEST_CASE("malformed requests: each field refused, named") {
  CHECK(request_error("") == "request: empty");
  CHECK(request_error(std::string(ctl::kRequestMax + 1, 'a')) == "request: over 65536 bytes (65537)");
  CHECK(request_error("stop\nps") == "request: contains a newline");
  CHECK(request_error("frob") == "unknown request 'frob'");
  CHECK(request_error("STOP") == "unknown request 'STOP'");
  CHECK(request_error(" stop") == "unknown request ' stop'");
  CHECK(request_error("\x1b[2J") == "unknown request '\\x1b[2J'");
  CHECK(request_error(std::string(100, 'z')) == "unknown request '" + std::string(64, 'z') + "' (100 bytes)");
  // At the bound exactly: read, then refused for what it says.
  CHECK(request_error(std::string(ctl::kRequestMax, 'a')).starts_with("unknown request 'aaaa"));

  CHECK(request_error("stop now") == "stop: expected no arguments, got 'now'");
  CHECK(request_error("stop ") == "stop: expected no arguments, got ''");
  CHECK(request_error("ps -ef") == "ps: expected no arguments, got '-ef'");

  CHECK(request_error("close-stdin now") == "close-stdin: expected no arguments, got 'now'");
  CHECK(request_error("wait") == "wait: expected PROC");
  CHECK(request_error("wait 1 2") == "wait: expected PROC");
  CHECK(request_error("wait 0") == "wait: PROC: expected an integer 1..65535, got '0'");
  CHECK(request_error("wait 65536") == "wait: PROC: expected an integer 1..65535, got '65536'");
  CHECK(request_error("kill") == "kill: expected SIGNAL [PROC]");
  CHECK(request_error("kill 9 1 2") == "kill: expected SIGNAL [PROC]");
  CHECK(request_error("kill 0") == "kill: SIGNAL: expected an integer 1..64, got '0'");
  CHECK(request_error("kill 65") == "kill: SIGNAL: expected an integer 1..64, got '65'");
  CHECK(request_error("kill -9") == "kill: SIGNAL: expected an integer 1..64, got '-9'");
  CHECK(request_error("kill +9") == "kill: SIGNAL: expected an integer 1..64, got '+9'");
  CHECK(request_error("kill KILL") == "kill: SIGNAL: expected an integer 1..64, got 'KILL'");
  CHECK(request_error("kill 9x") == "kill: SIGNAL: expected an integer 1..64, got '9x'");
  CHECK(request_error("kill 99999999999999999999999") ==
        "kill: SIGNAL: expected an integer 1..64, got '99999999999999999999999'");
  CHECK(request_error("kill  9") == "kill: SIGNAL: expected an integer 1..64, got ''");
  CHECK(request_error("kill 9 0") == "kill: PROC: expected an integer 1..65535, got '0'");
  CHECK(request_error("kill 9 65536") == "kill: PROC: expected an integer 1..65535, got '65536'");
  CHECK(request_error("kill 9 ") == "kill: PROC: expected an integer 1..65535, got ''");

  CHECK(request_error("resize") == "resize: expected ROWS COLS [PROC], each 1..65535");
  CHECK(request_error("resize 24") == "resize: expected ROWS COLS [PROC], each 1..65535");
  CHECK(request_error("resize 1 2 3 4") == "resize: expected ROWS COLS [PROC], each 1..65535");
  CHECK(request_error("resize 0 80") == "resize: ROWS: expected an integer 1..65535, got '0'");
  CHECK(request_error("resize 24 65536") == "resize: COLS: expected an integer 1..65535, got '65536'");
  CHECK(request_error("resize 24 80 0") == "resize: PROC: expected an integer 1..65535, got '0'");
  CHECK(request_error("resize 24 8O") == "resize: COLS: expected an integer 1..65535, got '8O'");

  const std::string json(kSampleExecJson);
  CHECK(request_error("exec") == "exec: expected FLAGS JSON");
  CHECK(request_error("exec -") == "exec: expected FLAGS JSON");
  const std::string flags_error = "exec: FLAGS: expected '-' or letters of 'ecu' (each at most once), got ";
  CHECK(request_error("exec x " + json) == flags_error + "'x'");
  CHECK(request_error("exec ee " + json) == flags_error + "'ee'");
  CHECK(request_error("exec -e " + json) == flags_error + "'-e'");
  CHECK(request_error("exec  " + json) == flags_error + "''");
  CHECK(request_error("exec - {").starts_with("exec: JSON: "));
  CHECK(request_error("exec - ").starts_with("exec: JSON: "));
  CHECK(request_error(R"(exec - {"type":"kill","signal":9})") == "exec: JSON: expected an `exec` message");
  CHECK(request_error(R"(exec - {"type":"frob"})") == "exec: JSON: expected an `exec` message");
  // The protocol's own checks name the field inside the JSON.
  CHECK(request_error(R"(exec - {"type":"exec","proc":1,"exec":{"argv":[],"env":{},"cwd":null,"uid":0,"gid":0}})")
            .starts_with("exec: JSON: exec.exec.argv: expected non-empty array"));
}

TEST_CASE("malformed replies: each field refused, named") {
  CHECK(reply_error("") == "reply: empty");
  CHECK(reply_error(std::string(ctl::kReplyMax + 1, 'a')) == "reply: over 1048576 bytes (1048577)");
  CHECK(reply_error("ok\nok") == "reply: contains a newline");
  CHECK(reply_error("okay") == "unknown reply 'okay'");
  CHECK(reply_error("ok ") == "unknown reply 'ok '");
  CHECK(reply_error("OK") == "unknown reply 'OK'");
  CHECK(reply_error("error:x") == "unknown reply 'error:x'");
  CHECK(reply_error("ok waitingroom") == "unknown reply 'ok waitingroom'");

  CHECK(reply_error("error: " + std::string(ctl::kErrorMessageMax + 1, 'e')) ==
        "error: MESSAGE: over 4096 bytes (4097)");
  CHECK(reply_error("error: " + std::string(ctl::kErrorMessageMax, 'e')).empty());

  CHECK(reply_error("ok started") == "started: expected PID PROC");
  CHECK(reply_error("ok started 5") == "started: expected PID PROC");
  CHECK(reply_error("ok started 5 6 7") == "started: expected PID PROC");
  CHECK(reply_error("ok started 0 1") == "started: PID: expected an integer 1..2147483647, got '0'");
  CHECK(reply_error("ok started 2147483648 1") == "started: PID: expected an integer 1..2147483647, got '2147483648'");
  CHECK(reply_error("ok started -5 1") == "started: PID: expected an integer 1..2147483647, got '-5'");
  CHECK(reply_error("ok started 5 0") == "started: PROC: expected an integer 1..65535, got '0'");
  CHECK(reply_error("ok started 5 65536") == "started: PROC: expected an integer 1..65535, got '65536'");

  CHECK(reply_error("ok exit") == "exit: expected STATUS [WHY]");
  CHECK(reply_error("ok exit 256") == "exit: STATUS: expected an integer 0..255, got '256'");
  CHECK(reply_error("ok exit -1") == "exit: STATUS: expected an integer 0..255, got '-1'");
  CHECK(reply_error("ok exit x why") == "exit: STATUS: expected an integer 0..255, got 'x'");
  CHECK(reply_error("ok exit  why") == "exit: STATUS: expected an integer 0..255, got ''");
  CHECK(reply_error("ok exit 1 " + std::string(ctl::kExitWhyMax + 1, 'w')) == "exit: WHY: over 1024 bytes (1025)");
  CHECK(reply_error("ok exit 1 " + std::string(ctl::kExitWhyMax, 'w')).empty());

  CHECK(reply_error("ok {").starts_with("ps: JSON: "));
  CHECK(reply_error(R"(ok {"type":"ready","protocol_version":2})") == "ps: JSON: expected a `processes` message");
  CHECK(reply_error(R"(ok {"type":"processes","processes":[{"pid":0,"ppid":0,"uid":0,"cmd":"x"}]})")
            .starts_with("ps: JSON: processes"));
}

TEST_CASE("encode keeps one line within the bounds; validate says what cannot be written") {
  CHECK(ctl::encode(ctl::Error{"two\nlines"}) == "error: two lines");
  CHECK(ctl::encode(ctl::Error{std::string(5000, 'e')}).size() == 7 + ctl::kErrorMessageMax);
  CHECK(ctl::encode(ctl::Exited{125, "a\nb"}) == "ok exit 125 a b");
  CHECK(ctl::encode(ctl::Exited{1, std::string(2000, 'w')}).size() == 10 + ctl::kExitWhyMax);
  CHECK_FALSE(ctl::validate(ctl::Error{"two\nlines"}).ok());
  CHECK_FALSE(ctl::validate(ctl::Exited{1, std::string(2000, 'w')}).ok());

  auto v = ctl::validate(ctl::Kill{0, std::nullopt});
  REQUIRE_FALSE(v.ok());
  CHECK(v.error().message == "kill: SIGNAL: expected an integer 1..64, got '0'");
  CHECK(ctl::validate(ctl::Resize{0, 80, std::nullopt}).error().message ==
        "resize: ROWS: expected an integer 1..65535, got '0'");
  CHECK(ctl::validate(ctl::Kill{9, 0}).error().message == "kill: PROC: expected an integer 1..65535, got '0'");
  CHECK(ctl::validate(ctl::Started{0, 1}).error().message ==
        "started: PID: expected an integer 1..2147483647, got '0'");
  CHECK(ctl::validate(ctl::Exited{256, ""}).error().message == "exit: STATUS: expected an integer 0..255, got '256'");
  // An exec the protocol refuses, or too big for one request line.
  proto::ExecProcess empty_argv = sample_exec();
  empty_argv.exec.argv.clear();
  CHECK(ctl::validate(ctl::Exec{false, false, false, empty_argv})
            .error()
            .message.starts_with("exec: JSON: exec.exec.argv: expected non-empty array"));
  proto::ExecProcess big = sample_exec();
  big.exec.env["BIG"] = std::string(ctl::kRequestMax, 'x');
  CHECK(ctl::validate(ctl::Exec{false, false, false, big}).error().message == "request: over 65536 bytes (65646)");
  proto::ExecProcess not_utf8 = sample_exec();
  not_utf8.exec.argv.push_back("\xff");
  CHECK(ctl::validate(ctl::Exec{false, false, false, not_utf8}).error().message ==
        "request: a field cannot be written as it is (over its bound, a newline, or not UTF-8)");
}

TEST_CASE("fencing: a request aimed at a generation, its exact line, and back; malformed prefixes named") {
  using T = ctl::Targeted;
  std::vector<std::pair<T, std::string>> cases = {
      {T{3, ctl::Stop{}, std::nullopt}, "generation 3 stop"},
      {T{1, ctl::Kill{9, 2}, std::nullopt}, "generation 1 kill 9 2"},
      {T{ctl::kGenerationMax, ctl::Resize{24, 80, std::nullopt}, std::nullopt}, "generation 9007199254740991 resize 24 80"},
      {T{7, ctl::Ps{}, std::nullopt}, "generation 7 ps"},
      {T{std::nullopt, ctl::Kill{15, std::nullopt}, std::nullopt}, "kill 15"},  // no target: the bare request
  };
  for (auto& [t, line] : cases) {
    CAPTURE(line);
    CHECK(ctl::encode(t) == line);
    auto back = ctl::parse_targeted(line);
    REQUIRE(back.ok());
    CHECK(*back == t);
    CHECK(ctl::validate(t).ok());
  }
  ctl::Targeted x{5, ctl::Exec{true, false, false, sample_exec()}, std::nullopt};
  auto xb = ctl::parse_targeted(ctl::encode(x));
  REQUIRE(xb.ok());
  CHECK(*xb == x);
  auto bad = [](std::string_view line) {
    auto r = ctl::parse_targeted(line);
    REQUIRE_FALSE(r.ok());
    return r.error().message;
  };
  CHECK(bad("generation 0 stop") == "generation: G: expected an integer 1..9007199254740991, got '0'");
  CHECK(bad("generation 9007199254740992 stop") ==
        "generation: G: expected an integer 1..9007199254740991, got '9007199254740992'");
  CHECK(bad("generation x stop") == "generation: G: expected an integer 1..9007199254740991, got 'x'");
  CHECK(bad("generation 3") == "generation: expected G REQUEST");
  CHECK(bad("generation 3 frob") == "unknown request 'frob'");
  CHECK(bad("generation 3 generation 3 stop") == "unknown request 'generation 3 stop'");
  // The plain parser (a monitor before the prefix) does not know it: what the client's retry sees.
  CHECK(ctl::parse_request("generation 3 stop").error().message == "unknown request 'generation 3 stop'");
  CHECK_FALSE(ctl::validate(ctl::Targeted{0, ctl::Stop{}, std::nullopt}).ok());
}

// ---- the real server over a real Unix socket ----

namespace {

/// ControlServer with control_handler(handlers) on its own loop thread; stopped and joined on
/// destruction (every path out of a test).
struct Served {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard{io.get_executor()};
  std::unique_ptr<ControlServer> server;
  std::thread loop;
  Served(const fs::path& path, ControlHandlers handlers) {
    auto s = ControlServer::start(io, path, control_handler(std::move(handlers)));
    REQUIRE(s.ok());
    server = std::move(*s);
    loop = std::thread([this] { io.run(); });
  }
  ~Served() {
    guard.reset();
    io.stop();
    loop.join();
    server.reset();
  }
};

/// One raw line to the socket at `path` (any bytes, no validation), and everything the server
/// wrote back until it closed.
std::string raw_exchange(const fs::path& path, std::string_view line) {
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  REQUIRE(::connect(s, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0);
  std::string out(line);
  REQUIRE(::send(s, out.data(), out.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(out.size()));
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::recv(s, buf, sizeof buf, 0)) > 0;) got.append(buf, static_cast<std::size_t>(n));
  ::close(s);
  return got;
}

}  // namespace

TEST_CASE("the server over a Unix socket: stop, kill, resize, ps, exec, errors") {
  nes::test::TempDir dir("ctl");
  const fs::path path = dir.path / "control.sock";
  std::mutex mu;
  std::vector<std::string> calls;  // what the handlers were asked, in order
  auto note = [&](std::string s) {
    std::lock_guard lock(mu);
    calls.push_back(std::move(s));
  };
  ControlRespond running_exec;  // the exec in flight (touched on the loop thread only)
  std::vector<ControlRespond> waiting;  // `wait 7` requests (the loop thread only)

  ControlHandlers h;
  h.stop = [&] {
    note("stop");
    return host::Status{host::Ok{}};
  };
  h.kill = [&](const ctl::Kill& k) -> host::Status {
    note(fmt::format("kill {} {}", k.signal, k.proc.value_or(0)));
    if (k.signal == 15 && !k.proc) return host::Error{"the workload has not started"};
    if (k.proc) {
      if (*k.proc != 7 || !running_exec) return host::Error{fmt::format("no process {}", *k.proc)};
      // The exec'd process dies of it: its final reply on the exec's own connection.
      std::exchange(running_exec, nullptr)(ctl::Exited{128 + k.signal, ""});
      for (auto& w : std::exchange(waiting, {})) w(ctl::Exited{128 + k.signal, ""});
    }
    return host::Ok{};
  };
  h.ps = [&](std::function<void(host::Result<proto::Processes>)> done) {
    note("ps");
    done(sample_processes());
  };
  h.exec = [&](ctl::Exec x, std::vector<host::Fd> fds, ControlRespond respond) {
    note(fmt::format("exec {} fds {}", x.process.exec.argv.at(0), fds.size()));
    if (x.process.exec.argv.at(0) == "/missing") return respond(ctl::Error{"exec: /missing: not found"});
    respond(ctl::Waiting{});
    respond(ctl::Started{42, 7});
    running_exec = std::move(respond);
  };
  // wait: process 7 ends when killed (below); any other is unknown.
  h.wait = [&](const ctl::Wait& w, ControlRespond respond) {
    note(fmt::format("wait {}", w.proc));
    if (w.proc != 7) return respond(ctl::Error{fmt::format("wait: PROC {}: no such process", w.proc)});
    respond(ctl::Started{42, 7});
    waiting.push_back(std::move(respond));
  };
  // resize left unserved.
  Served served(path, std::move(h));

  // stop and kill: "ok", or the handler's error as "error: WHY".
  auto stop = control_request(path, ctl::Stop{});
  REQUIRE(stop.ok());
  CHECK(std::holds_alternative<ctl::Ok>(*stop));
  CHECK(control_call(path, ctl::Kill{9, std::nullopt}).ok());
  auto refused = control_call(path, ctl::Kill{15, std::nullopt});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message == "error: the workload has not started");
  auto kill_reply = control_request(path, ctl::Kill{15, std::nullopt});
  REQUIRE(kill_reply.ok());
  CHECK(*kill_reply == ctl::Reply{ctl::Error{"the workload has not started"}});
  // A handler left empty.
  CHECK(control_call(path, ctl::Resize{24, 80, std::nullopt}).error().message == "error: resize: not served here");
  CHECK(control_call(path, ctl::Pause{}).error().message == "error: pause: not served here");
  CHECK(raw_exchange(path, "pause now\n") == "error: pause: expected no arguments, got 'now'\n");

  // ps: the list, decoded.
  auto ps = guest_processes(path);
  REQUIRE(ps.ok());
  CHECK(*ps == sample_processes());

  // exec: waiting, started, then (killed through another connection) its exit.
  int p[2];
  REQUIRE(::pipe(p) == 0);
  host::Fd rd{p[0]}, wr{p[1]};
  auto cs = ControlSession::open(path, ctl::Exec{true, true, true, sample_exec()}, {rd.get(), wr.get(), wr.get()});
  REQUIRE(cs.ok());
  auto r1 = cs->read_reply(std::chrono::seconds(30));
  REQUIRE(r1.ok());
  CHECK(std::holds_alternative<ctl::Waiting>(*r1));
  auto r2 = cs->read_reply(std::chrono::seconds(30));
  REQUIRE(r2.ok());
  CHECK(*r2 == ctl::Reply{ctl::Started{42, 7}});
  CHECK(control_call(path, ctl::Kill{9, 8}).error().message == "error: no process 8");
  // Another client waits for process 7 on a connection of its own (a replaced shim).
  auto ws = ControlSession::open(path, ctl::Wait{7}, {});
  REQUIRE(ws.ok());
  auto w0 = ws->read_reply(std::chrono::seconds(30));
  REQUIRE(w0.ok());
  CHECK(*w0 == ctl::Reply{ctl::Started{42, 7}});
  CHECK(control_call(path, ctl::Wait{8}).error().message == "error: wait: PROC 8: no such process");
  // Its Started was read only after the wait was registered: the kill comes after.
  CHECK(control_call(path, ctl::Kill{9, 7}).ok());
  auto w1 = ws->read_reply(std::chrono::seconds(30));
  REQUIRE(w1.ok());
  CHECK(*w1 == ctl::Reply{ctl::Exited{137, ""}});
  auto r3 = cs->read_reply(std::chrono::seconds(30));
  REQUIRE(r3.ok());
  CHECK(*r3 == ctl::Reply{ctl::Exited{137, ""}});
  auto r4 = cs->read_reply(std::chrono::seconds(30));  // the final reply closed the connection
  REQUIRE_FALSE(r4.ok());
  CHECK(r4.error().err == ECONNRESET);

  // Clients that go while their exec runs (a SIGKILLed shim) free their connections: more of
  // them than the server serves at once (40), one after another, are each answered.
  for (int i = 0; i < 45; ++i) {
    CAPTURE(i);
    auto gone = ControlSession::open(path, ctl::Exec{false, false, false, sample_exec()}, {});
    REQUIRE(gone.ok());
    auto g1 = gone->read_reply(std::chrono::seconds(30));
    REQUIRE(g1.ok());
    CHECK(std::holds_alternative<ctl::Waiting>(*g1));
    auto g2 = gone->read_reply(std::chrono::seconds(30));
    REQUIRE(g2.ok());
    CHECK(std::holds_alternative<ctl::Started>(*g2));
  }  // each closed here, its exec still "running"
  // The last one's process ends (its reply goes nowhere): the handler lets go of its connection
  // here, on the server's loop, not after the server is gone.
  CHECK(control_call(path, ctl::Kill{9, 7}).ok());

  // An exec that fails: its one reply is the error.
  proto::ExecProcess missing = sample_exec();
  missing.exec.argv = {"/missing"};
  auto cs2 = ControlSession::open(path, ctl::Exec{false, false, false, missing}, {});
  REQUIRE(cs2.ok());
  auto e1 = cs2->read_reply(std::chrono::seconds(30));
  REQUIRE(e1.ok());
  CHECK(*e1 == ctl::Reply{ctl::Error{"exec: /missing: not found"}});

  // Malformed lines, as an old or hostile client might send them: refused, named, one line.
  CHECK(raw_exchange(path, "frob\n") == "error: unknown request 'frob'\n");
  CHECK(raw_exchange(path, "kill 65\n") == "error: kill: SIGNAL: expected an integer 1..64, got '65'\n");
  CHECK(raw_exchange(path, "resize 24\n") == "error: resize: expected ROWS COLS [PROC], each 1..65535\n");
  CHECK(raw_exchange(path, "exec - {}\n").starts_with("error: exec: JSON: "));
  // The wire as clients before this definition wrote it.
  CHECK(raw_exchange(path, "kill 9\n") == "ok\n");
  CHECK(raw_exchange(path, "ps\n").starts_with(R"(ok {"type":"processes","processes":[{"pid":1,)"));

  // Requests a client refuses to send (nothing reaches the server).
  auto bad = control_request(path, ctl::Kill{0, std::nullopt});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message == "kill: SIGNAL: expected an integer 1..64, got '0'");

  std::lock_guard lock(mu);
  std::vector<std::string> want{"stop", "kill 9 0", "kill 15 0", "kill 15 0", "ps", "exec sh fds 3",
                                "kill 9 8", "wait 7", "wait 8", "kill 9 7"};
  want.insert(want.end(), 45, "exec sh fds 0");
  want.insert(want.end(), {"kill 9 7", "exec /missing fds 0", "kill 9 0", "ps"});
  CHECK(calls == want);
}

TEST_CASE("fencing: a monitor refuses a request aimed at another generation; the right one and the bare one pass") {
  nes::test::TempDir dir("ctlgen");
  const fs::path path = dir.path / "control.sock";
  std::mutex mu;
  std::vector<std::string> calls;
  ControlHandlers h;
  h.generation = 4;
  h.stop = [&] {
    std::lock_guard lock(mu);
    calls.push_back("stop");
    return host::Status{host::Ok{}};
  };
  Served served(path, std::move(h));
  auto stale = control_request(path, ctl::Targeted{3, ctl::Stop{}, std::nullopt});
  REQUIRE(stale.ok());
  CHECK(*stale == ctl::Reply{ctl::Error{
                      "generation: this monitor serves generation 4 of the VM; the request targets generation 3"}});
  CHECK(control_call(path, ctl::Targeted{5, ctl::Stop{}, std::nullopt}).error().message.find("targets generation 5") !=
        std::string::npos);
  {
    std::lock_guard lock(mu);
    CHECK(calls.empty());  // neither reached the handler
  }
  CHECK(control_call(path, ctl::Targeted{4, ctl::Stop{}, std::nullopt}).ok());
  CHECK(control_call(path, ctl::Stop{}).ok());  // an older client: not checked
  CHECK(raw_exchange(path, "generation 0 stop\n") ==
        "error: generation: G: expected an integer 1..9007199254740991, got '0'\n");
  std::lock_guard lock(mu);
  CHECK(calls == std::vector<std::string>{"stop", "stop"});
}

TEST_CASE("fencing: a monitor that predates the prefix gets the bare request once") {
  // A server that parses with the plain parser, as monitors before the prefix did.
  nes::test::TempDir dir("ctlold");
  const fs::path path = dir.path / "control.sock";
  boost::asio::io_context io;
  std::vector<std::string> lines;
  auto s = ControlServer::start(io, path, [&](std::string_view line, std::vector<host::Fd>, ControlServer::Reply send) {
    lines.emplace_back(line);
    auto r = ctl::parse_request(line);
    send(ctl::encode(r ? ctl::Reply{ctl::Ok{}} : ctl::Reply{ctl::Error{r.error().message}}), false);
  });
  REQUIRE(s.ok());
  std::thread loop([&] { io.run_for(std::chrono::seconds(30)); });
  auto r = control_request(path, ctl::Targeted{3, ctl::Kill{9, std::nullopt}, std::nullopt});
  io.stop();
  loop.join();
  REQUIRE(r.ok());
  CHECK(std::holds_alternative<ctl::Ok>(*r));
  CHECK(lines == std::vector<std::string>{"generation 3 kill 9", "kill 9"});
}

TEST_CASE("journaled controls: `seq S` after any generation, its exact line, and back; malformed ones named") {
  using T = ctl::Targeted;
  const std::vector<std::pair<T, std::string>> cases{
      {T{std::nullopt, ctl::Kill{10, std::nullopt}, 1}, "seq 1 kill 10"},
      {T{3, ctl::Kill{9, 2}, 17}, "generation 3 seq 17 kill 9 2"},
      {T{std::nullopt, ctl::Pause{}, ctl::kSeqMax}, "seq 9007199254740991 pause"},
      {T{std::nullopt, ctl::Resume{}, 5}, "seq 5 resume"},
  };
  for (const auto& [t, line] : cases) {
    CHECK(ctl::encode(t) == line);
    auto back = ctl::parse_targeted(line);
    REQUIRE(back.ok());
    CHECK(*back == t);
    CHECK(ctl::validate(t).ok());
  }
  auto bad = [](std::string_view l) { return ctl::parse_targeted(l).error().message; };
  CHECK(bad("seq 0 pause") == "seq: S: expected an integer 1..9007199254740991, got '0'");
  CHECK(bad("seq x pause") == "seq: S: expected an integer 1..9007199254740991, got 'x'");
  CHECK(bad("seq 4") == "seq: expected S REQUEST");
  CHECK(bad("seq 4 seq 5 pause") == "unknown request 'seq 5 pause'");
  CHECK(bad("seq 4 generation 3 pause") == "unknown request 'generation 3 pause'");  // generation first
  CHECK_FALSE(ctl::validate(T{std::nullopt, ctl::Stop{}, 0}).ok());
}

TEST_CASE("journaled controls: a sequence number the monitor applied is answered Ok, not applied again") {
  nes::test::TempDir dir("ctlseq");
  const fs::path path = dir.path / "control.sock";
  std::mutex mu;
  std::vector<std::string> calls;
  bool refuse = true;
  ControlHandlers h;
  h.kill = [&](const ctl::Kill& k) {
    std::lock_guard lock(mu);
    calls.push_back(fmt::format("kill {}", k.signal));
    return host::Status{host::Ok{}};
  };
  h.pause = [&] {
    std::lock_guard lock(mu);
    calls.push_back("pause");
    if (std::exchange(refuse, false)) return host::Status{host::Error{"the guest is not ready yet"}};
    return host::Status{host::Ok{}};
  };
  Served served(path, std::move(h));
  using T = ctl::Targeted;
  CHECK(control_call(path, T{std::nullopt, ctl::Kill{10, std::nullopt}, 1}).ok());
  CHECK(control_call(path, T{std::nullopt, ctl::Kill{10, std::nullopt}, 1}).ok());  // its answer was lost: again
  CHECK(control_call(path, T{std::nullopt, ctl::Kill{10, std::nullopt}, 2}).ok());  // a second signal of its own
  CHECK(control_call(path, ctl::Kill{10, std::nullopt}).ok());                       // unnumbered: always applied
  // A refusal is not kept: the same number tried again is applied.
  CHECK_FALSE(control_call(path, T{std::nullopt, ctl::Pause{}, 3}).ok());
  CHECK(control_call(path, T{std::nullopt, ctl::Pause{}, 3}).ok());
  CHECK(control_call(path, T{std::nullopt, ctl::Pause{}, 3}).ok());
  // The last kSeqsKept are kept: 4..67 push 1 out (applied again), 2 is out too, 67 is kept.
  for (std::uint64_t s = 4; s < 4 + ctl::kSeqsKept; ++s) CHECK(control_call(path, T{std::nullopt, ctl::Kill{12, std::nullopt}, s}).ok());
  CHECK(control_call(path, T{std::nullopt, ctl::Kill{10, std::nullopt}, 1}).ok());
  CHECK(control_call(path, T{std::nullopt, ctl::Kill{12, std::nullopt}, 3 + ctl::kSeqsKept}).ok());
  std::lock_guard lock(mu);
  std::vector<std::string> want{"kill 10", "kill 10", "kill 10", "pause", "pause"};
  want.insert(want.end(), ctl::kSeqsKept, "kill 12");
  want.push_back("kill 10");
  CHECK(calls == want);
}

TEST_CASE("journaled controls: a monitor that predates the prefix gets the request without it once") {
  nes::test::TempDir dir("ctlseqold");
  const fs::path path = dir.path / "control.sock";
  boost::asio::io_context io;
  std::vector<std::string> lines;
  auto s = ControlServer::start(io, path, [&](std::string_view line, std::vector<host::Fd>, ControlServer::Reply send) {
    lines.emplace_back(line);
    auto r = ctl::parse_request(line);
    send(ctl::encode(r ? ctl::Reply{ctl::Ok{}} : ctl::Reply{ctl::Error{r.error().message}}), false);
  });
  REQUIRE(s.ok());
  std::thread loop([&] { io.run_for(std::chrono::seconds(30)); });
  auto r = control_request(path, ctl::Targeted{std::nullopt, ctl::Kill{9, std::nullopt}, 4});
  io.stop();
  loop.join();
  REQUIRE(r.ok());
  CHECK(std::holds_alternative<ctl::Ok>(*r));
  CHECK(lines == std::vector<std::string>{"seq 4 kill 9", "kill 9"});
}
