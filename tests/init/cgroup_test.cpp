// A container's cgroup (nesinit/cgroup.hpp) against a directory of plain files shaped as
// cgroupfs's: what write_resources writes to each file, read_stats' parsing of the kernel's
// formats, the update that would go below what the container uses refused with both figures,
// and the cgroup a joining process is put in. The kernel's own behaviour is the VM tests'.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "cgroup.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes;
using nes::init::ContainerCgroups;

namespace {

void put(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }
std::string get(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
/// A cgroup directory as the kernel makes one (the files write_resources and read_stats touch).
void fake_cgroup(const std::filesystem::path& d) {
  std::filesystem::create_directories(d);
  for (const char* f : {"memory.max", "pids.max"}) put(d / f, "max\n");
  put(d / "cpu.max", "max 100000\n");
  put(d / "cpu.weight", "100\n");
  put(d / "memory.reclaim", "");
  put(d / "cgroup.procs", "");
}

}  // namespace

TEST_CASE("write_resources writes each set field to its file in cgroup v2's format; unset ones stay") {
  test::TempDir t("nes-cg");
  fake_cgroup(t.path);
  proto::ContainerResources r;
  r.memory_max = 64u << 20;
  r.cpu_quota = 50000;
  r.pids_max = 0;  // no limit
  REQUIRE(init::write_resources(t.path.string(), r));
  CHECK(get(t.path / "memory.max") == "67108864");
  CHECK(get(t.path / "cpu.max") == "50000 100000");  // the period kept from the file
  CHECK(get(t.path / "pids.max") == "max");
  CHECK(get(t.path / "cpu.weight") == "100\n");  // untouched
  // A period alone keeps the quota the file has; a weight.
  r = {};
  r.cpu_period = 20000;
  r.cpu_weight = 39;
  REQUIRE(init::write_resources(t.path.string(), r));
  CHECK(get(t.path / "cpu.max") == "50000 20000");
  CHECK(get(t.path / "cpu.weight") == "39");
  // quota 0: "max".
  r = {};
  r.cpu_quota = 0;
  REQUIRE(init::write_resources(t.path.string(), r));
  CHECK(get(t.path / "cpu.max") == "max 20000");
}

TEST_CASE("an update below what the container uses is refused naming the field and both figures, nothing written") {
  test::TempDir t("nes-cg");
  fake_cgroup(t.path);
  put(t.path / "memory.current", "8388608\n");
  proto::ContainerResources r;
  r.memory_max = 4u << 20;
  auto s = init::write_resources(t.path.string(), r, true);
  REQUIRE_FALSE(s);
  CHECK(s.error().message ==
        "memory_max: 4194304 bytes is below the 8388608 bytes the container uses (memory.current, after reclaim); not lowered");
  CHECK(get(t.path / "memory.max") == "max\n");
  CHECK(get(t.path / "memory.reclaim") == "4194304");  // the kernel was asked to give back the difference first
  // At Start (no use yet to protect) and above the use: written.
  REQUIRE(init::write_resources(t.path.string(), r));
  r.memory_max = 16u << 20;
  REQUIRE(init::write_resources(t.path.string(), r, true));
  CHECK(get(t.path / "memory.max") == "16777216");
  // A file the kernel lacks (a controller off): the field and the file are named.
  std::filesystem::remove(t.path / "pids.max");
  r = {};
  r.pids_max = 10;
  s = init::write_resources(t.path.string(), r);
  REQUIRE_FALSE(s);
  CHECK(s.error().message.starts_with("pids_max: write 10 to " + (t.path / "pids.max").string() + ": "));
}

TEST_CASE("read_stats parses the kernel's files; a gone cgroup is an error") {
  test::TempDir t("nes-cg");
  fake_cgroup(t.path);
  put(t.path / "memory.current", "5242880\n");
  put(t.path / "memory.max", "67108864\n");
  put(t.path / "memory.stat", "anon 4194304\nfile 1048576\nkernel 0\nanon_thp 0\n");
  put(t.path / "memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n");
  put(t.path / "cpu.stat", "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\nnr_periods 5\nnr_throttled 2\nthrottled_usec 777\n");
  put(t.path / "pids.current", "3\n");
  auto s = init::read_stats(t.path.string());
  REQUIRE(s);
  CHECK(s->memory_current == 5242880);
  CHECK(s->memory_max == 67108864);
  CHECK(s->memory_anon == 4194304);
  CHECK(s->memory_file == 1048576);
  CHECK(s->oom_kills == 1);
  CHECK(s->cpu_usage_usec == 1234);
  CHECK(s->cpu_user_usec == 1000);
  CHECK(s->cpu_system_usec == 234);
  CHECK(s->cpu_nr_periods == 5);
  CHECK(s->cpu_nr_throttled == 2);
  CHECK(s->cpu_throttled_usec == 777);
  CHECK(s->pids_current == 3);
  CHECK(s->pids_max == 0);  // "max"
  auto gone = init::read_stats((t.path / "nope").string());
  REQUIRE_FALSE(gone);
  CHECK(gone.error().message.ends_with("/nope/memory.current: the cgroup is gone"));
}

TEST_CASE("ContainerCgroups: a cgroup per container, limits written, removed once its PID 1 was reaped") {
  test::TempDir t("nes-cg");
  put(t.path / "cgroup.subtree_control", "");
  ContainerCgroups cg(t.path.string());
  proto::ContainerResources r;
  r.memory_max = 1u << 20;
  // The kernel makes a cgroup's files with its directory; here the directory is made by create()
  // and the write then fails: the error names the field, and nothing is left.
  auto bad = cg.create(3, r);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.starts_with("memory_max: write 1048576 to "));
  CHECK_FALSE(std::filesystem::exists(t.path / "ctr-3"));
  // Without limits: made, its cgroup.procs returned.
  auto ok = cg.create(4, std::nullopt);
  REQUIRE(ok);
  CHECK(*ok == (t.path / "ctr-4" / "cgroup.procs").string());
  CHECK(std::filesystem::is_directory(t.path / "ctr-4"));
  CHECK_FALSE(cg.running(4));
  cg.started(4, 1234);
  CHECK(cg.running(4) == (t.path / "ctr-4").string());
  cg.reaped(999);  // another process: nothing happens
  CHECK(std::filesystem::is_directory(t.path / "ctr-4"));
  cg.reaped(1234);
  CHECK_FALSE(cg.running(4));
  CHECK_FALSE(std::filesystem::exists(t.path / "ctr-4"));
  // A start that failed: removed at once.
  REQUIRE(cg.create(5, std::nullopt));
  cg.failed(5);
  CHECK_FALSE(std::filesystem::exists(t.path / "ctr-5"));
}

TEST_CASE("procs_of: the container cgroup a joining process goes to, from /proc/PID/cgroup") {
  test::TempDir t("nes-cg");
  std::filesystem::create_directories(t.path / "proc/7");
  std::filesystem::create_directories(t.path / "proc/8");
  std::filesystem::create_directories(t.path / "proc/9");
  put(t.path / "proc/7/cgroup", "0::/ctr-12\n");
  put(t.path / "proc/8/cgroup", "0::/\n");
  put(t.path / "proc/9/cgroup", "0::/ctr-1/../x\n");
  ContainerCgroups cg("/sys/fs/cgroup");
  CHECK(cg.procs_of(7, (t.path / "proc").string()) == "/sys/fs/cgroup/ctr-12/cgroup.procs");
  CHECK(cg.procs_of(8, (t.path / "proc").string()).empty());
  CHECK(cg.procs_of(9, (t.path / "proc").string()).empty());
  CHECK(cg.procs_of(10, (t.path / "proc").string()).empty());
}
