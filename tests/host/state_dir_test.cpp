// A state dir that someone else can write into must fail safe: every open inside it is
// O_NOFOLLOW and openat-relative, only regular files are read, a record's `vm` is checked when
// read, and every directory is 0700. Each case plants what an attacker (or an accident) would.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "host/lib/record.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/host_record.hpp"

using namespace nes;
using namespace nes::host;
namespace fs = std::filesystem;

namespace {
using TempDir = nes::test::TempDir;
Record rec(std::string vm, std::uint64_t gen, int code) {
  Record r = nes::test::exited_record(std::move(vm), gen, code);
  r.started_at = WallTime{std::chrono::nanoseconds(1'764'499'200'000'000'000LL)};
  r.finished_at = r.started_at;
  return r;
}
unsigned mode_of(const fs::path& p) {
  struct stat st{};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}
}  // namespace

TEST_CASE("a symlinked VM dir is refused, its target untouched") {
  TempDir t;
  fs::path state = t.path / "state", elsewhere = t.path / "elsewhere";
  fs::create_directories(state);
  fs::create_directories(elsewhere);
  fs::create_directory_symlink(elsewhere, state / "vm1");
  auto w = write_record(state, rec("vm1", 1, 0));
  REQUIRE(!w);
  CHECK(w.error().message.find("is a symlink") != std::string::npos);
  CHECK(!fs::exists(elsewhere / "outcome.json"));
  CHECK(!fs::exists(elsewhere / ".lock"));
  auto r = read_record(state, "vm1");
  CHECK(!r);
  CHECK(!open_vm_dir(state, "vm1", true));
}

TEST_CASE("a dangling .lock symlink is not followed: its target is not created") {
  TempDir t;
  fs::path state = t.path / "state";
  fs::create_directories(state / "vm1");
  fs::create_symlink(t.path / "created-by-us", state / "vm1" / ".lock");
  auto w = write_record(state, rec("vm1", 1, 0));
  REQUIRE(!w);
  CHECK(w.error().message.find(".lock: is a symlink") != std::string::npos);
  CHECK(!fs::exists(t.path / "created-by-us"));
}

TEST_CASE("a planted record naming another VM with a higher generation neither wins nor is read") {
  TempDir t;
  fs::path state = t.path / "state";
  fs::create_directories(state / "vm1");
  {
    std::ofstream f(state / "vm1" / "outcome.json");
    f << encode_record(rec("other", 99, 0));
  }
  auto before = read_record(state, "vm1");
  REQUIRE(!before);  // not vm1's record: `wait vm1` must not answer 0 from it
  CHECK(before.error().message.find("names vm \"other\"") != std::string::npos);
  auto w = write_record(state, rec("vm1", 1, 7));
  REQUIRE(w);
  CHECK(w->kind == WriteResult::Kind::written);  // before: stale, and serve recorded 125
  auto after = read_record(state, "vm1");
  REQUIRE(after);
  REQUIRE(*after);
  CHECK((*after)->vm == "vm1");
  CHECK((*after)->exit_status == 7);
}

TEST_CASE("a FIFO at outcome.json: read refuses it without blocking; write replaces it") {
  TempDir t;
  fs::path state = t.path / "state";
  fs::create_directories(state / "vm1");
  REQUIRE(::mkfifo((state / "vm1" / "outcome.json").c_str(), 0600) == 0);
  auto r = read_record(state, "vm1");  // before: open(2) blocked for a writer forever
  REQUIRE(!r);
  CHECK(r.error().message.find("not a regular file") != std::string::npos);
  auto w = write_record(state, rec("vm1", 1, 0));
  REQUIRE(w);
  CHECK(fs::is_regular_file(state / "vm1" / "outcome.json"));
}

TEST_CASE("a symlink at outcome.json is not read through, and is replaced by the write") {
  TempDir t;
  fs::path state = t.path / "state";
  fs::create_directories(state / "vm1");
  {
    std::ofstream f(t.path / "target.json");
    f << encode_record(rec("vm1", 5, 9));
  }
  fs::create_symlink(t.path / "target.json", state / "vm1" / "outcome.json");
  CHECK(!read_record(state, "vm1"));
  auto w = write_record(state, rec("vm1", 1, 0));
  REQUIRE(w);
  CHECK(w->kind == WriteResult::Kind::written);
  CHECK(!fs::is_symlink(state / "vm1" / "outcome.json"));
  std::ifstream f(t.path / "target.json");
  std::string s((std::istreambuf_iterator<char>(f)), {});
  CHECK(s.find("\"generation\":5") != std::string::npos);  // the target is unchanged
}

TEST_CASE("directories are 0700, files 0600, an existing open VM dir is tightened") {
  TempDir t;
  fs::path state = t.path / "a" / "state";
  REQUIRE(write_record(state, rec("vm1", 1, 0)));
  CHECK(mode_of(t.path / "a") == 0700);
  CHECK(mode_of(state) == 0700);
  CHECK(mode_of(state / "vm1") == 0700);
  CHECK(mode_of(state / "vm1" / "outcome.json") == 0600);
  CHECK(mode_of(state / "vm1" / ".lock") == 0600);
  fs::create_directories(state / "vm2");
  fs::permissions(state / "vm2", fs::perms(0755));
  REQUIRE(open_vm_dir(state, "vm2", true));
  CHECK(mode_of(state / "vm2") == 0700);
}

TEST_CASE("open_vm_file: regular files only, never through a symlink") {
  TempDir t;
  fs::path state = t.path / "state";
  auto f = open_vm_file(state, "vm1", "neshost-run.pid", O_WRONLY | O_CREAT | O_TRUNC);
  REQUIRE(f);
  CHECK(mode_of(state / "vm1" / "neshost-run.pid") == 0600);
  fs::create_symlink(t.path / "x", state / "vm1" / "console.log");
  CHECK(!open_vm_file(state, "vm1", "console.log", O_WRONLY | O_CREAT | O_TRUNC));
  CHECK(!fs::exists(t.path / "x"));
  fs::create_directory(state / "vm1" / "dir");
  CHECK(!open_vm_file(state, "vm1", "dir", O_RDONLY));
}
