// The guest's process list (procs.hpp): a procfs laid out by the test, every rule exact, then
// this machine's own /proc for a real process.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/wait.h>

#include <csignal>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "nesinit/procs.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes::init;
namespace fs = std::filesystem;
namespace proto = nes::proto;

namespace {
void fake(const fs::path& proc, int pid, const std::string& stat, const std::string& cmdline, int uid) {
  const fs::path d = proc / std::to_string(pid);
  fs::create_directories(d);
  std::ofstream(d / "stat") << stat;
  std::ofstream(d / "status") << "Name:\tx\nUmask:\t0022\nState:\tS\nUid:\t" << uid << "\t" << uid << "\t0\t0\n";
  std::ofstream(d / "cmdline", std::ios::binary) << cmdline;
}
}  // namespace

TEST_CASE("read_processes: by pid, kernel threads left out, argv joined, [comm] without one; the totals") {
  nes::test::TempDir t;
  fake(t.path, 1, "1 (nesinit) S 0 1 1 0 -1 4194560", std::string("/init\0", 6), 0);
  fake(t.path, 2, "2 (kthreadd) S 0 0 0 0 -1 2129984", "", 0);  // flags with PF_KTHREAD
  fake(t.path, 9, "9 (kworker/0:1) I 2 0 0 0 -1 69238880", "", 0);
  fake(t.path, 40, "40 (sh) S 1 40 40 0 -1 4194560", std::string("/bin/sh\0-c\0sleep 9\0", 19), 1000);
  fake(t.path, 41, "41 (a) b) Z 40 40 40 0 -1 4227084", "", 1000);  // a zombie: no cmdline; ')' inside comm
  fs::create_directories(t.path / "self");                   // not a pid
  fs::create_directories(t.path / "43");                     // exited while being read: no stat
  auto p = read_processes(t.path.string());
  REQUIRE(p.processes.size() == 3);
  CHECK(p.truncated == 0);
  CHECK(p.processes[0] == proto::ProcessInfo{1, 0, 0, "/init"});
  CHECK(p.processes[1] == proto::ProcessInfo{40, 1, 1000, "/bin/sh -c sleep 9"});
  CHECK(p.processes[2] == proto::ProcessInfo{41, 40, 1000, "[a) b]"});  // comm "a) b"
  CHECK_FALSE(p.totals);  // no meminfo, no stat
  // The totals beside the list (top's summary): meminfo in KiB, stat's cpu line in USER_HZ ticks.
  std::ofstream(t.path / "meminfo") << "MemTotal:         250000 kB\nMemFree:          200000 kB\n"
                                       "MemAvailable:     220000 kB\nBuffers:            1000 kB\n";
  std::ofstream(t.path / "stat") << "cpu  10 2 30 900 5 4 3 0 0 0\ncpu0 10 2 30 900 5 4 3 0 0 0\nintr 1\n";
  auto q = read_processes(t.path.string());
  REQUIRE(q.totals);
  CHECK(*q.totals == proto::GuestTotals{250000ull * 1024, 220000ull * 1024, (10 + 2) * 10000ull, (30 + 4 + 3) * 10000ull});
  std::ofstream(t.path / "stat") << "intr 1\n";  // no cpu line: no totals rather than zeros
  CHECK_FALSE(read_processes(t.path.string()).totals);
}

TEST_CASE("read_processes: commands cut at a UTF-8 boundary, the list at kProcessesMax") {
  nes::test::TempDir t;
  std::string lng(proto::kProcessCmdMax - 1, 'x');
  lng += "\xc3\xa9tail";  // a two-byte character across the cut
  fake(t.path, 1, "1 (init) S 0 1 1 0 -1 0", lng, 0);
  // pid 1 and 516 more: 517 in all, 5 over the cap.
  for (int pid = 3; pid < 3 + static_cast<int>(proto::kProcessesMax) + 4; ++pid)
    fake(t.path, pid, std::to_string(pid) + " (w) S 1 1 1 0 -1 0", "w", 0);
  auto p = read_processes(t.path.string());
  REQUIRE(p.processes.size() == proto::kProcessesMax);
  CHECK(p.processes[0].cmd == std::string(proto::kProcessCmdMax - 1, 'x'));
  CHECK(p.truncated == 5);
  CHECK(read_processes((t.path / "missing").string()).processes.empty());
}

TEST_CASE("read_processes: this machine's /proc lists a real child with its argv and parent") {
  int gate[2];
  REQUIRE(::pipe2(gate, O_CLOEXEC) == 0);
  pid_t c = ::fork();
  REQUIRE(c >= 0);
  if (c == 0) {
    ::execlp("sleep", "sleep", "30", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(gate[1]);
  char b;
  REQUIRE(::read(gate[0], &b, 1) == 0);  // EOF: the exec closed the child's end, its argv is set
  ::close(gate[0]);
  int found = 0;
  for (const auto& pi : read_processes().processes)
    if (pi.pid == c) {
      ++found;
      CHECK(pi.cmd == "sleep 30");
      CHECK(pi.ppid == ::getpid());
      CHECK(pi.uid == ::getuid());
    }
  ::kill(c, SIGKILL);
  ::waitpid(c, nullptr, 0);
  CHECK(found == 1);
}
