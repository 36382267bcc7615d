// The reaper against real children. The test process is a subreaper (PR_SET_CHILD_SUBREAPER), so
// grandchildren whose parent died come back to it as orphans, as they would to PID 1.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <vector>

#include "nesinit/reaper.hpp"

using namespace nes::init;
namespace proto = nes::proto;

namespace {

/// SIGCHLD blocked for the test's duration (as in PID 1), the test process a subreaper; on exit
/// every child still around is killed and collected.
struct ChildScope {
  sigset_t old;
  std::vector<pid_t> kids;
  ChildScope() {
    REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &s, &old);
  }
  ~ChildScope() {
    for (pid_t p : kids) ::kill(p, SIGKILL);
    while (::waitpid(-1, nullptr, 0) > 0 || errno == EINTR) {
    }
    timespec zero{0, 0};
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGCHLD);
    while (::sigtimedwait(&s, nullptr, &zero) > 0) {
    }
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
  }
  template <class F>
  pid_t fork_child(F body) {
    pid_t p = ::fork();
    REQUIRE(p >= 0);
    if (p == 0) {
      body();
      ::_exit(0);
    }
    kids.push_back(p);
    return p;
  }
};

/// Wait (bounded, 10 s) for the next SIGCHLD. Returns false on timeout.
bool wait_sigchld() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGCHLD);
  timespec ts{10, 0};
  return ::sigtimedwait(&s, nullptr, &ts) == SIGCHLD;
}

/// Block until `pid` has exited, without reaping it (waitid WNOWAIT).
void until_zombie(pid_t pid) {
  siginfo_t si{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOWAIT) == 0);
}

/// Reap until the workload's status arrives (bounded by SIGCHLD waits).
proto::WorkloadExited reap_workload(Reaper& r, unsigned* orphans = nullptr) {
  for (int i = 0; i < 100; ++i) {
    Reaped x = r.reap();
    if (orphans) *orphans += x.orphans;
    if (x.workload) return *x.workload;
    REQUIRE(wait_sigchld());
  }
  FAIL("workload never reaped");
  return {};
}

}  // namespace

TEST_CASE("to_exit: codes and signals, never a code for a kill") {
  CHECK(to_exit(0) == proto::WorkloadExited::code(0));
  CHECK(to_exit(3 << 8) == proto::WorkloadExited::code(3));
  CHECK(to_exit(255 << 8) == proto::WorkloadExited::code(255));
  CHECK(to_exit(9) == proto::WorkloadExited::killed(9));
  CHECK(to_exit(15 | 0x80) == proto::WorkloadExited::killed(15));  // core dumped
}

TEST_CASE("every exit code 0..255 is delivered exactly once") {
  ChildScope cs;
  Reaper r;
  for (int code = 0; code <= 255; ++code) {
    pid_t p = cs.fork_child([code] { ::_exit(code); });
    r.watch(p);
    auto w = reap_workload(r);
    CHECK(w.exit_code == code);
    CHECK(!w.signal);
    CHECK(r.watched() == 0);
    CHECK(!r.reap().workload);  // exactly once
  }
  CHECK(r.orphans_total() == 0);
}

TEST_CASE("signals: the signal, and no exit code") {
  ChildScope cs;
  Reaper r;
  for (int sig : {SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGSEGV, SIGABRT, SIGUSR1, SIGRTMIN + 1, 64}) {
    CAPTURE(sig);
    pid_t p = cs.fork_child([sig] {
      ::signal(sig, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::kill(::getpid(), sig);
      ::_exit(0);  // SIGRTMIN+n default action is terminate, so unreachable
    });
    r.watch(p);
    auto w = reap_workload(r);
    CHECK(w.signal == sig);
    CHECK(!w.exit_code);
  }
}

TEST_CASE("orphans: a grandchild reparented to the subreaper is reaped and counted") {
  ChildScope cs;
  Reaper r;
  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  // The workload forks a grandchild that outlives it, then exits 0.
  pid_t w = cs.fork_child([&] {
    if (::fork() == 0) {
      ::close(gate[1]);
      char c;
      [[maybe_unused]] auto n = ::read(gate[0], &c, 1);  // until the test closes the gate
      ::_exit(5);
    }
    ::_exit(0);
  });
  ::close(gate[0]);
  r.watch(w);
  unsigned orphans = 0;
  auto x = reap_workload(r, &orphans);
  CHECK(x.exit_code == 0);
  CHECK(orphans == 0);
  ::close(gate[1]);  // now the orphan exits
  for (int i = 0; i < 100 && orphans == 0; ++i) {
    Reaped y = r.reap();
    orphans += y.orphans;
    CHECK(!y.workload);
    if (orphans == 0) REQUIRE(wait_sigchld());
  }
  CHECK(orphans == 1);
  CHECK(r.orphans_total() == 1);
  CHECK(r.reap().no_children);
}

TEST_CASE("a workload that exits before it is registered is not lost") {
  ChildScope cs;
  Reaper r;
  pid_t p = cs.fork_child([] { ::_exit(7); });
  until_zombie(p);  // it has exited; nobody has reaped it
  r.watch(p);
  CHECK(r.reap() == Reaped{proto::WorkloadExited::code(7), {}, 0, true});
}

TEST_CASE("merged SIGCHLD: one signal for many exits, one reap collects them all") {
  ChildScope cs;
  Reaper r;
  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < 20; ++i)
    pids.push_back(cs.fork_child([&, i] {
      ::close(gate[1]);
      char c;
      [[maybe_unused]] auto n = ::read(gate[0], &c, 1);
      ::_exit(i);
    }));
  ::close(gate[0]);
  r.watch(pids[7]);
  ::close(gate[1]);  // all exit at once
  for (pid_t p : pids) until_zombie(p);
  // Twenty exits, but a standard signal is pending at most once.
  sigset_t pend;
  ::sigpending(&pend);
  CHECK(sigismember(&pend, SIGCHLD));
  CHECK(wait_sigchld());
  timespec zero{0, 0};
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGCHLD);
  CHECK(::sigtimedwait(&s, nullptr, &zero) == -1);  // no second SIGCHLD
  CHECK(r.reap() == Reaped{proto::WorkloadExited::code(7), {}, 19, true});
}

TEST_CASE("nothing to reap: no children, or children still running") {
  ChildScope cs;
  Reaper r;
  Reaped x = r.reap();
  CHECK(x.no_children);
  CHECK(!x.workload);
  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  pid_t p = cs.fork_child([&] {
    ::close(gate[1]);
    char c;
    [[maybe_unused]] auto n = ::read(gate[0], &c, 1);
    ::_exit(0);
  });
  ::close(gate[0]);
  r.watch(p);
  x = r.reap();
  CHECK(!x.no_children);
  CHECK(!x.workload);
  ::close(gate[1]);
  CHECK(reap_workload(r).exit_code == 0);
}

TEST_CASE("exec'd pids: each status delivered once in execs, apart from the workload's and orphans'") {
  ChildScope cs;
  Reaper r;
  pid_t w = cs.fork_child([] { ::_exit(1); });
  r.watch(w);
  std::vector<pid_t> ex;
  for (int i = 0; i < static_cast<int>(proto::kExecMax); ++i) {
    pid_t p = cs.fork_child([i] { ::_exit(10 + i); });
    REQUIRE(r.watch_exec(p));
    ex.push_back(p);
  }
  CHECK(!r.watch_exec(99999));  // every slot taken
  pid_t orphan = cs.fork_child([] { ::_exit(0); });
  (void)orphan;
  std::vector<ExecReaped> got;
  std::optional<proto::WorkloadExited> wl;
  unsigned orphans = 0;
  for (int round = 0; round < 200 && (got.size() < ex.size() || !wl || orphans < 1); ++round) {
    Reaped x = r.reap();
    got.insert(got.end(), x.execs.begin(), x.execs.end());
    if (x.workload) wl = x.workload;
    orphans += x.orphans;
    if (got.size() < ex.size() || !wl || orphans < 1) REQUIRE(wait_sigchld());
  }
  REQUIRE(got.size() == ex.size());
  for (std::size_t i = 0; i < ex.size(); ++i) {
    auto it = std::find_if(got.begin(), got.end(), [&](const ExecReaped& e) { return e.pid == ex[i]; });
    REQUIRE(it != got.end());
    CHECK(it->status == proto::WorkloadExited::code(static_cast<std::uint8_t>(10 + i)));
  }
  CHECK(wl == proto::WorkloadExited::code(1));
  CHECK(orphans == 1);
  // The slots are free again; forget() frees one unreaped.
  pid_t again = cs.fork_child([] { ::_exit(5); });
  CHECK(r.watch_exec(again));
  r.forget(again);
  until_zombie(again);
  Reaped x = r.reap();
  CHECK(x.execs.empty());
  CHECK(x.orphans == 1);
}
