// The real static init as PID 1 of a fresh pid + mount namespace, where it must never block:
// a dial against a live listener whose backlog is full (cut short by SIGTERM, bounded by
// --connect-timeout-ms), a stderr pipe nobody reads, and no signalfd at all (fail hard, before
// the loop). Each wait is on an event with a bound; none is a sleep.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <csignal>

#include "e2e_checks.hpp"

using namespace nes;
using namespace nes::init::test;

namespace {
}  // namespace

TEST_CASE("dial against a full backlog: SIGTERM cuts it short") {
  // Before: connect() blocked until the backlog freed (never, here), SIGTERM acted only then.
  Sandbox sb({.init_args = {"--connect-timeout-ms=120000"}, .full_backlog = true});
  REQUIRE_MESSAGE(sb.wait_stderr("nesinit: dial: unix:"), sb.err());
  REQUIRE(sb.signal_init(SIGTERM));
  auto st = sb.wait_exit(15000);  // the backlog stays full all along
  CHECK_MESSAGE(powered_off(st), sb.err());
  CHECK(sb.err().find("abandoned: signal 15") != std::string::npos);
  CHECK(sb.err().find("shutdown: begin: no channel") != std::string::npos);
}

TEST_CASE("dial against a full backlog: --connect-timeout-ms bounds it") {
  Sandbox sb({.init_args = {"--connect-timeout-ms=500"}, .full_backlog = true});
  auto st = sb.wait_exit(15000);
  CHECK_MESSAGE(powered_off(st), sb.err());
  CHECK(sb.err().find("failed: Resource temporarily unavailable") != std::string::npos);
  CHECK(sb.err().find("connected") == std::string::npos);
}

TEST_CASE("stderr is a full pipe nobody reads: PID 1 still serves stop and SIGTERM") {
  // Before: the first log line blocked PID 1 in write(2); no `ready` was ever sent.
  Sandbox sb({.init_args = {"--ack-timeout-ms=60000"}, .log = "debug", .stderr_unread = true});
  REQUIRE_MESSAGE(sb.start(make_boot({"sleep", "1000"})), sb.last_error());
  sb.send(proto::Stop{});
  const proto::WorkloadExited x = next_exit(sb);
  CHECK(x.signal == SIGTERM);
  // The init now waits for the ack. Drain the pipe, then ack: the next line it logs is the count
  // of the lines it dropped.
  sb.read_stderr();
  CHECK(sb.shutdown_powered_off());
  CHECK_MESSAGE(sb.err().starts_with("nesinit: log: warning: "), sb.err().substr(0, 200));
  CHECK(sb.err().find("line(s) dropped (output not read)") != std::string::npos);
  CHECK(sb.err().find("host acknowledged the outcome") != std::string::npos);
}

TEST_CASE("no signalfd (no fd left for it): fail hard before the loop") {
  // RLIMIT_NOFILE 3: fds 0-2 only. Before: the error was logged and the loop ran blind (it dialled
  // and never saw SIGCHLD or SIGTERM).
  Sandbox sb({.wrapper = {"prlimit", "--nofile=3", "--"}});
  auto st = sb.wait_exit(15000);
  REQUIRE(st);
  CHECK_MESSAGE((WIFEXITED(*st) && WEXITSTATUS(*st) == 1), sb.err());
  CHECK(sb.err().find("nesinit: loop: error: signalfd: ") != std::string::npos);
  CHECK(sb.err().find("nesinit: dial:") == std::string::npos);
}
