// One process of a task (host/shim/process.hpp), as the task and an exec both use it: State's
// answer by phase (the task's pid before Start is the shim's), Wait's and Delete's, the stdin
// hold of open_streams (the FIFO's writer the shim keeps), stop() closing it, report_exit
// answering every waiter once, and open_stdio's /dev/null, file:// and errors.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "containerd_pb.h"
#include "host/shim/process.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes;
namespace v2 = containerd::task::v2;
namespace types = containerd::v1::types;

TEST_CASE("state by phase: the task's pid before it started is the shim's, an exec's is its own") {
  shim::Process task;
  task.id = "t";
  task.phase = shim::Phase::created;
  task.stdout_path = "/run/out";
  task.terminal = true;
  v2::StateResponse s = task.state("/b");
  CHECK(s.id() == "t");
  CHECK(s.exec_id().empty());
  CHECK(s.bundle() == "/b");
  CHECK(s.pid() == static_cast<std::uint32_t>(::getpid()));
  CHECK(s.status() == types::CREATED);
  CHECK(s.stdout() == "/run/out");
  CHECK(s.terminal());
  CHECK_FALSE(s.has_exited_at());

  shim::Process x;
  x.id = "e1";
  x.exec = true;
  x.phase = shim::Phase::created;
  CHECK(x.state("/b").pid() == 0);
  CHECK(x.state("/b").exec_id() == "e1");
  x.pid = 42;
  x.phase = shim::Phase::running;
  CHECK(x.state("/b").status() == types::RUNNING);
  x.stop(7, 1'500'000'123);
  s = x.state("/b");
  CHECK(s.status() == types::STOPPED);
  CHECK(s.pid() == 42);
  CHECK(s.exit_status() == 7);
  CHECK(s.exited_at().seconds() == 1);
  CHECK(s.exited_at().nanos() == 500'000'123);
  CHECK(x.delete_response().pid() == 42);
  CHECK(x.delete_response().exit_status() == 7);
  CHECK(x.wait_response().exit_status() == 7);
}

TEST_CASE("report_exit answers every waiter once, with the exit status") {
  shim::Publisher events{"", "default"};  // no containerd: events dropped
  shim::Process p;
  p.id = "t";
  int answered = 0;
  for (int i = 0; i < 3; ++i)
    p.waiters.push_back([&](ttrpc::Reply r) {
      ++answered;
      CHECK(r.status.ok());
      v2::WaitResponse w;
      REQUIRE(w.ParseFromString(r.payload));
      CHECK(w.exit_status() == 137);
    });
  p.stop(137, 5);
  p.report_exit(events, "t");
  CHECK(answered == 3);
  CHECK(p.waiters.empty());
  p.report_exit(events, "t");
  CHECK(answered == 3);
}

TEST_CASE("open_streams: FIFOs, the stdin hold until stop, /dev/null for none") {
  test::TempDir tmp{"shimproc"};
  const std::string in = (tmp.path / "in").string(), out = (tmp.path / "out").string();
  REQUIRE(::mkfifo(in.c_str(), 0600) == 0);
  REQUIRE(::mkfifo(out.c_str(), 0600) == 0);
  shim::Process p;
  p.stdin_path = in;
  p.stdout_path = out;  // no reader: opened read-write, so output waits in it
  auto s = p.open_streams();
  REQUIRE(s);
  CHECK(s->in);
  CHECK(s->out);
  CHECK(s->err);  // /dev/null
  CHECK(p.stdin_hold);
  CHECK((::fcntl(s->in.get(), F_GETFL) & O_NONBLOCK) == 0);
  p.stop(0, 0);
  CHECK_FALSE(p.stdin_hold);
  CHECK(p.phase == shim::Phase::stopped);
}

TEST_CASE("open_stdio: file:// appends, is for output only; a missing path names itself") {
  test::TempDir tmp{"shimproc"};
  const std::string log = "file://" + (tmp.path / "log").string();
  auto f = shim::open_stdio(log, false);
  REQUIRE(f);
  CHECK(::write(f->get(), "x", 1) == 1);
  auto in = shim::open_stdio(log, true);
  REQUIRE_FALSE(in);
  CHECK(in.error().message.find("output only") != std::string::npos);
  auto missing = shim::open_stdio((tmp.path / "nope").string(), true);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message.find("nope") != std::string::npos);
}
