// Crash durability: a writer process is SIGKILLed at each step of the write protocol (temp
// written, fsynced, renamed, dir fsynced). Afterwards a reader sees the old record or the new one,
// never a torn one, and ignores leftover temp files; the next write cleans them up.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdlib>

#include "host/lib/record.hpp"
#include "support.hpp"
#include "tests/support/host_record.hpp"

extern char** environ;

using namespace nes;
using namespace nes::host;
namespace fs = std::filesystem;

namespace {

/// A child process, killed and reaped on destruction whatever happens.
struct Child {
  pid_t pid = -1;
  explicit Child(std::vector<std::string> argv) {
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    REQUIRE(::posix_spawn(&pid, a[0], nullptr, nullptr, a.data(), environ) == 0);
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      int st;
      ::waitpid(pid, &st, 0);
    }
  }
  /// Block until the child stops or exits; returns the wait status.
  int wait_state() {
    int st = 0;
    REQUIRE(::waitpid(pid, &st, WUNTRACED) == pid);
    if (!WIFSTOPPED(st)) pid = -1;
    return st;
  }
};

fs::path writer_bin() {
  // Built next to this test.
  return fs::canonical("/proc/self/exe").parent_path() / "record_writer";
}

std::size_t temp_count(const fs::path& dir) {
  std::size_t n = 0;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().ends_with(".tmp")) ++n;
  return n;
}

}  // namespace

TEST_CASE("SIGKILL at each step: old or new record, never torn; temps ignored and cleaned") {
  nes::test::TempDir t;
  auto state = t.path / "state";
  std::uint64_t gen = 1;
  {
    Child c({writer_bin().string(), state.string(), "vm", "1", "1"});
    int st = c.wait_state();
    REQUIRE(WIFEXITED(st));
    REQUIRE(WEXITSTATUS(st) == 0);
  }
  for (auto step : {WriteStep::temp_written, WriteStep::temp_fsynced, WriteStep::renamed,
                    WriteStep::dir_fsynced}) {
    CAPTURE(to_string(step));
    std::uint64_t next = gen + 1;
    Child c({writer_bin().string(), state.string(), "vm", std::to_string(next),
             std::to_string(next % 256), std::string(to_string(step))});
    int st = c.wait_state();
    REQUIRE(WIFSTOPPED(st));  // it is parked exactly after `step`
    REQUIRE(::kill(c.pid, SIGKILL) == 0);
    st = c.wait_state();
    REQUIRE(WIFSIGNALED(st));
    CHECK(WTERMSIG(st) == SIGKILL);

    auto r = read_record(state, "vm");
    REQUIRE(r);   // parses: never torn
    REQUIRE(*r);  // never missing
    bool before_rename = step == WriteStep::temp_written || step == WriteStep::temp_fsynced;
    if (before_rename) {
      CHECK((*r)->generation == gen);   // the old one
      CHECK(temp_count(state / "vm") == 1);  // the dead writer's temp, ignored by the reader
    } else {
      CHECK((*r)->generation == next);  // the new one
      CHECK(temp_count(state / "vm") == 0);
      gen = next;
    }
    CHECK((*r)->exit_code == std::optional<std::uint8_t>(gen % 256));
  }
  // The next writer removes leftovers and records normally.
  auto w = write_record(state, nes::test::exited_record("vm", gen + 10, 0, "after the crashes"));
  REQUIRE(w);
  CHECK(w->kind == WriteResult::Kind::written);
  CHECK(temp_count(state / "vm") == 0);
}

TEST_CASE("a writer killed while holding the lock does not block the next one") {
  nes::test::TempDir t;
  auto state = t.path / "state";
  Child c({writer_bin().string(), state.string(), "vm", "5", "5", "temp_fsynced"});
  REQUIRE(WIFSTOPPED(c.wait_state()));
  // While it is stopped it holds the flock: a bounded writer gives up with a clear error.
  Record r = nes::test::exited_record("vm", 6, 6);
  WriteOptions quick;
  quick.lock_tries = 2;
  auto blocked = write_record(state, r, quick);
  REQUIRE(!blocked);
  CHECK(blocked.error().message.find("held by another writer") != std::string::npos);
  ::kill(c.pid, SIGKILL);
  c.wait_state();
  // The kernel drops a dead process's flock.
  auto ok = write_record(state, r);
  REQUIRE(ok);
  CHECK((*read_record(state, "vm"))->generation == 6);
}
