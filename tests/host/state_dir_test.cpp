// host/lib/state_dir.hpp, the one owner of a VM's state dir: the VM id check, the file names (the
// on-disk contract, checked here as literals), the paths, the per-VM lock, the durable writes.
// And a state dir that someone else can write into must fail safe: every open inside it is
// O_NOFOLLOW and openat-relative, only regular files are read, a record's `vm` is checked when
// read, and every directory is 0700. Each such case plants what an attacker (or an accident)
// would.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "host/lib/record.hpp"
#include "host/lib/state_dir.hpp"
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
  auto f = open_vm_file(state, "vm1", "console.log", O_WRONLY | O_CREAT | O_TRUNC);
  REQUIRE(f);
  CHECK(mode_of(state / "vm1" / "console.log") == 0600);
  CHECK(mode_of(state / "vm1") == 0700);
  fs::create_symlink(t.path / "x", state / "vm1" / "workload.log");
  auto sym = open_vm_file(state, "vm1", "workload.log", O_WRONLY | O_CREAT | O_TRUNC);
  REQUIRE(!sym);
  CHECK(sym.error().message.find("workload.log: is a symlink") != std::string::npos);
  CHECK(!fs::exists(t.path / "x"));
  fs::create_directory(state / "vm1" / "dir");
  CHECK(!open_vm_file(state, "vm1", "dir", O_RDONLY));
  REQUIRE(::mkfifo((state / "vm1" / "fifo").c_str(), 0600) == 0);
  auto fifo = open_vm_file(state, "vm1", "fifo", O_RDONLY);  // not blocked waiting for a writer
  REQUIRE(!fifo);
  CHECK(fifo.error().message.find("not a regular file") != std::string::npos);
  auto none = open_vm_file(state, "vm2", "console.log", O_RDONLY);  // no O_CREAT: nothing made
  REQUIRE(!none);
  CHECK(!fs::exists(state / "vm2"));
}

TEST_CASE("check_vm_id: 1..64 bytes of [A-Za-z0-9._-], not starting with '.' or '-'") {
  for (std::string ok : {"a", "vm-1.a_B", "A9", "a.", "a-", "ctr-0123456789abcdef01234567", "_x"})
    CHECK_MESSAGE(check_vm_id(ok), ok);
  CHECK(check_vm_id(std::string(64, 'a')));
  auto why = [](std::string_view id) {
    auto s = check_vm_id(id);
    REQUIRE(!s);
    return s.error().message;
  };
  CHECK(why("") == "vm id is empty");
  CHECK(why(std::string(65, 'a')) == "vm id is 65 bytes; at most 64");
  CHECK(why(".") == "vm id '.' starts with '.'");
  CHECK(why("..") == "vm id '..' starts with '.'");
  CHECK(why(".hidden") == "vm id '.hidden' starts with '.'");
  CHECK(why("-x") == "vm id '-x' starts with '-'");
  CHECK(why("a/b") == "vm id may hold only [A-Za-z0-9._-]; got byte 0x2f");
  CHECK(why("a b") == "vm id may hold only [A-Za-z0-9._-]; got byte 0x20");
  CHECK(why(std::string("a\0b", 3)) == "vm id may hold only [A-Za-z0-9._-]; got byte 0x00");
  CHECK(why("caf\xc3\xa9") == "vm id may hold only [A-Za-z0-9._-]; got byte 0xc3");
  CHECK(why("a\n") == "vm id may hold only [A-Za-z0-9._-]; got byte 0x0a");
}

TEST_CASE("check_name: the shared rule, 1..64 of [A-Za-z0-9._-], any first byte; errors name `what`") {
  for (const std::string& ok : std::vector<std::string>{"a", ".x", "-x", "_", std::string(64, 'z')})
    CHECK_MESSAGE(check_name("name", ok), ok);
  CHECK(check_name("port_name", "").error().message == "port_name is empty");
  CHECK(check_name("port_name", std::string(65, 'a')).error().message == "port_name is 65 bytes; at most 64");
  CHECK(check_name("port_name", "nes 0").error().message == "port_name may hold only [A-Za-z0-9._-]; got byte 0x20");
}

TEST_CASE("every way into a VM's dir checks the id first: a bad one touches nothing") {
  TempDir t;
  fs::path state = t.path / "state";
  for (const std::string& bad : std::vector<std::string>{"", "..", "../escape", "a/b", "-x", std::string(65, 'v')}) {
    CAPTURE(bad);
    CHECK(!open_vm_dir(state, bad, true));
    CHECK(!open_vm_file(state, bad, "console.log", O_WRONLY | O_CREAT));
    CHECK(!write_record(state, rec(bad, 1, 0)));
    CHECK(!read_record(state, bad));
  }
  CHECK(!fs::exists(state));  // not even the state dir was made
  CHECK(!fs::exists(t.path / "escape"));
}

TEST_CASE("the file names of a VM's dir: the on-disk contract, each one distinct") {
  // Literals on purpose: neshost, the shim, scripts and users read these names from disk.
  CHECK(std::string_view(kOutcomeFile) == "outcome.json");
  CHECK(std::string_view(kMonitorFile) == "monitor.json");
  CHECK(std::string_view(kStopFile) == "stop.json");
  CHECK(std::string_view(kControlSocket) == "control.sock");
  CHECK(std::string_view(kWorkloadLog) == "workload.log");
  CHECK(std::string_view(kConsoleLog) == "console.log");
  CHECK(std::string_view(kMonitorLog) == "monitor.log");
  CHECK(std::string_view(kLockFile) == ".lock");
  CHECK(virtiofsd_log_name("nes.v0") == "virtiofsd-nes.v0.log");
  std::vector<std::string_view> all = {kOutcomeFile, kMonitorFile, kStopFile, kControlSocket,
                                       kWorkloadLog, kConsoleLog, kMonitorLog, kLockFile};
  for (std::size_t i = 0; i < all.size(); ++i) {
    CHECK(check_vm_id(all[i]).ok() == (all[i][0] != '.'));  // plain names, no '/'
    for (std::size_t j = i + 1; j < all.size(); ++j) CHECK(all[i] != all[j]);
  }
  const fs::path s = "/st";
  CHECK(vm_path(s, "vm1", "x.log") == fs::path("/st/vm1/x.log"));
  CHECK(record_path(s, "vm1") == fs::path("/st/vm1/outcome.json"));
  CHECK(monitor_path(s, "vm1") == fs::path("/st/vm1/monitor.json"));
  CHECK(stop_path(s, "vm1") == fs::path("/st/vm1/stop.json"));
  CHECK(control_path(s, "vm1") == fs::path("/st/vm1/control.sock"));
}

TEST_CASE("a record lands at record_path(), its lock at .lock, and nothing else is left") {
  TempDir t;
  fs::path state = t.path / "state";
  REQUIRE(write_record(state, rec("vm1", 1, 0)));
  CHECK(fs::is_regular_file(record_path(state, "vm1")));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(state / "vm1")) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{".lock", "outcome.json"});
}

TEST_CASE("lock_vm: exclusive across open files, bounded, released with its Fd") {
  TempDir t;
  fs::path state = t.path / "state";
  auto d = open_vm_dir(state, "vm1", true);
  REQUIRE(d);
  REQUIRE(*d);
  auto held = lock_vm(d->get(), state / "vm1");
  REQUIRE(held);
  CHECK(mode_of(state / "vm1" / ".lock") == 0600);
  auto second = lock_vm(d->get(), state / "vm1", 2);  // another open file description: refused
  REQUIRE(!second);
  CHECK(second.error().message.find(".lock: still held by another writer") != std::string::npos);
  // A record writer takes the same lock.
  WriteOptions o;
  o.lock_tries = 2;
  auto w = write_record(state, rec("vm1", 1, 0), o);
  REQUIRE(!w);
  CHECK(w.error().message.find("still held by another writer") != std::string::npos);
  held->reset();
  CHECK(lock_vm(d->get(), state / "vm1", 1));
  CHECK(write_record(state, rec("vm1", 1, 0), o));
}

TEST_CASE("lock_vm: a symlink or a FIFO at .lock is refused, its target not created") {
  TempDir t;
  fs::path state = t.path / "state";
  auto d = open_vm_dir(state, "vm1", true);
  REQUIRE(d);
  fs::create_symlink(t.path / "made", state / "vm1" / ".lock");
  auto l = lock_vm(d->get(), state / "vm1", 1);
  REQUIRE(!l);
  CHECK(l.error().message.find(".lock: is a symlink") != std::string::npos);
  CHECK(!fs::exists(t.path / "made"));
  fs::remove(state / "vm1" / ".lock");
  REQUIRE(::mkfifo((state / "vm1" / ".lock").c_str(), 0600) == 0);
  l = lock_vm(d->get(), state / "vm1", 1);
  REQUIRE(!l);
  CHECK(l.error().message.find("not a regular file") != std::string::npos);
}

TEST_CASE("write_durable: replaces the file whole, 0600, no temp left; an error names it") {
  TempDir t;
  fs::path dir = t.path / "d";
  REQUIRE(make_dirs_durable(dir));
  CHECK(mode_of(dir) == 0700);
  REQUIRE(write_durable(dir, "stop.json", "one\n"));
  REQUIRE(write_durable(dir, "stop.json", "two\n"));
  std::ifstream f(dir / "stop.json");
  std::string s((std::istreambuf_iterator<char>(f)), {});
  CHECK(s == "two\n");
  CHECK(mode_of(dir / "stop.json") == 0600);
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  CHECK(n == 1);
  auto bad = write_durable(t.path / "missing", "stop.json", "x");
  REQUIRE(!bad);
  CHECK(bad.error().message.find((t.path / "missing").string()) != std::string::npos);
  CHECK(!fs::exists(t.path / "missing"));
}

TEST_CASE("make_dirs_durable: every missing directory 0700; a file in the way is named") {
  TempDir t;
  REQUIRE(make_dirs_durable(t.path / "a" / "b" / "c"));
  CHECK(mode_of(t.path / "a") == 0700);
  CHECK(mode_of(t.path / "a" / "b" / "c") == 0700);
  CHECK(make_dirs_durable(t.path / "a" / "b"));  // existing: fine
  { std::ofstream(t.path / "file") << "x"; }
  auto s = make_dirs_durable(t.path / "file");
  REQUIRE(!s);
  CHECK(s.error().message.find("exists and is not a directory") != std::string::npos);
}
