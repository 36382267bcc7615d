// The reconcile rule over planted state dirs: monitors are real forked children (alive, exited
// and reaped, zombie), records and monitor files are written by the library or planted by hand
// (corrupt, stale, of another VM). Every child is reaped; every temp dir removed.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "host/lib/log_writer.hpp"
#include "host/monitor/output_resume.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/monitor/stdin_spool.hpp"
#include "host/monitor/vmm_record.hpp"
#include "host/lib/state_dir.hpp"
#include "protocol/status.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes;
using namespace nes::host;
namespace fs = std::filesystem;

namespace {

using nes::test::TempDir;

/// A child that blocks until killed; reaped by the destructor whatever happened.
struct Child {
  pid_t pid = -1;
  bool reaped = false;
  Child() {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Only our read end: a sibling's write end held here would keep it from seeing EOF.
      for (int fd = 3; fd < 1024; ++fd)
        if (fd != p[0]) ::close(fd);
      char c;
      while (::read(p[0], &c, 1) < 0) {}  // EOF when the parent dies or closes: exit
      ::_exit(0);
    }
    ::close(p[0]);
    wfd = p[1];
  }
  /// Let it exit; `reap`: also wait for it (else it stays a zombie until the destructor).
  void end(bool reap) {
    ::close(wfd);
    wfd = -1;
    if (reap) {
      ::waitpid(pid, nullptr, 0);
      reaped = true;
    } else {
      // Wait until it is a zombie, without reaping it: WNOWAIT leaves it in place.
      siginfo_t si{};
      ::waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOWAIT);
    }
  }
  ~Child() {
    if (wfd >= 0) ::close(wfd);
    if (!reaped) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  int wfd = -1;
};

MonitorInfo monitor_of(pid_t pid, std::string vm = "vm-a") {
  MonitorInfo m;
  m.vm = std::move(vm);
  auto id = identity_of(pid);
  REQUIRE(id);
  m.monitor = *id;
  m.created_at = wall_now();
  m.command = {"/bin/sh", "-c", "exit 7"};
  return m;
}

Record record(std::uint64_t gen, proto::Outcome o = proto::Outcome::exited, int code = 7,
              std::string vm = "vm-a") {
  Record r;
  r.vm = std::move(vm);
  r.generation = gen;
  r.outcome = o;
  if (o == proto::Outcome::exited) r.exit_code = static_cast<std::uint8_t>(code);
  r.exit_status = o == proto::Outcome::exited ? code : proto::kStatusHostFailure;
  r.reason = "planted";
  r.started_at = r.finished_at = wall_now();
  return r;
}

VmState state_of(const fs::path& state, std::string_view vm = "vm-a") {
  auto s = reconcile(state, vm);
  REQUIRE(s);
  REQUIRE(s->has_value());
  return **s;
}

void plant(const fs::path& p, std::string_view bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::trunc | std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("identity: pid plus start time plus boot; a zombie or a recycled pid is not alive") {
  auto me = self_identity();
  REQUIRE(me);
  CHECK(me->pid == ::getpid());
  CHECK(is_alive(*me));
  ProcessIdentity recycled = *me;
  recycled.start_time += 1;  // the same pid, another process
  CHECK_FALSE(is_alive(recycled));
  ProcessIdentity other_boot = *me;
  other_boot.boot_id = "00000000-0000-0000-0000-000000000000";
  CHECK_FALSE(is_alive(other_boot));

  Child z;
  auto id = identity_of(z.pid);
  REQUIRE(id);
  CHECK(is_alive(*id));
  z.end(false);  // exited, not reaped: a zombie
  CHECK_FALSE(is_alive(*id));
}

TEST_CASE("monitor.json round-trips; bad fields are named") {
  MonitorInfo m;
  m.vm = "vm-a";
  m.generation = 3;
  m.monitor = {1234, 987654321ull, "b-o-o-t"};
  m.created_at = wall_now();
  m.command = {"/bin/sh", "-c", "echo \"hi\"\n"};
  auto back = parse_monitor(encode_monitor(m));
  REQUIRE(back);
  CHECK(*back == m);
  // `ports` is additive: written only when there are some, absent reads as none.
  CHECK(encode_monitor(m).find("ports") == std::string::npos);
  m.ports = {"127.0.0.1:8080->80/tcp", "0.0.0.0:5353->53/udp"};
  CHECK(encode_monitor(m).find(R"("ports":["127.0.0.1:8080->80/tcp","0.0.0.0:5353->53/udp"])") != std::string::npos);
  back = parse_monitor(encode_monitor(m));
  REQUIRE(back);
  CHECK(*back == m);
  std::string bad = encode_monitor(m);
  bad.replace(bad.find("[\"127"), 1, "[1,");
  CHECK(parse_monitor(bad).error().message.find("ports") == 0);
  CHECK(parse_monitor("{").error().message.find("JSON") != std::string::npos);
  CHECK(parse_monitor(R"({"schema_version":1,"vm":"a","generation":0})").error().message.find("generation") == 0);
  CHECK(parse_monitor(R"({"schema_version":2})").error().message.find("schema_version") == 0);
}

TEST_CASE("no such VM: no directory, or a directory with neither file") {
  TempDir t;
  auto s = reconcile(t.path, "vm-a");
  REQUIRE(s);
  CHECK_FALSE(s->has_value());
  fs::create_directories(t.path / "vm-a");
  plant(t.path / "vm-a" / "console.log", "x");
  s = reconcile(t.path, "vm-a");
  REQUIRE(s);
  CHECK_FALSE(s->has_value());
  CHECK_FALSE(reconcile(t.path, "../x"));
}

TEST_CASE("monitor alive and no outcome -> running; its outcome -> exited(7); then gone -> still exited(7)") {
  TempDir t;
  Child mon;
  auto gen = begin_generation(t.path, monitor_of(mon.pid));
  REQUIRE(gen);
  CHECK(*gen == 1);
  auto s = state_of(t.path);
  CHECK(s.status == VmStatus::running);
  CHECK(s.monitor_alive);
  CHECK_FALSE(s.exit_status);
  CHECK(s.generation == 1);
  REQUIRE(write_record(t.path, record(1)));
  s = state_of(t.path);
  CHECK(s.status == VmStatus::exited);  // a valid outcome wins even while the monitor lives on
  CHECK(s.exit_status == 7);
  mon.end(true);
  s = state_of(t.path);
  CHECK(s.status == VmStatus::exited);
  CHECK(s.exit_status == 7);
  CHECK(s.reason == "exited with code 7");
  CHECK_FALSE(s.monitor_alive);
}

TEST_CASE("monitor gone, record missing -> failed saying why (never running)") {
  TempDir t;
  Child mon;
  REQUIRE(begin_generation(t.path, monitor_of(mon.pid)));
  mon.end(true);
  auto s = state_of(t.path);
  CHECK(s.status == VmStatus::failed);
  CHECK(s.exit_status == 125);
  CHECK(s.reason.find("without recording an outcome") != std::string::npos);
  CHECK(s.reason.find(std::to_string(mon.pid)) != std::string::npos);
}

TEST_CASE("monitor a zombie, record missing -> failed") {
  TempDir t;
  Child mon;
  REQUIRE(begin_generation(t.path, monitor_of(mon.pid)));
  mon.end(false);
  CHECK(state_of(t.path).status == VmStatus::failed);
}

TEST_CASE("monitor gone, record corrupt -> failed with the parse error; alive -> running") {
  TempDir t;
  Child mon;
  REQUIRE(begin_generation(t.path, monitor_of(mon.pid)));
  plant(record_path(t.path, "vm-a"), "{\"schema_version\":1,\"vm\":");
  CHECK(state_of(t.path).status == VmStatus::running);
  mon.end(true);
  auto s = state_of(t.path);
  CHECK(s.status == VmStatus::failed);
  CHECK(s.reason.find("unreadable") != std::string::npos);
  CHECK(s.reason.find("not valid JSON") != std::string::npos);
  // A record naming another VM is not this VM's outcome.
  REQUIRE(fs::remove(record_path(t.path, "vm-a")));
  plant(record_path(t.path, "vm-a"), encode_record(record(1, proto::Outcome::exited, 0, "vm-b")));
  s = state_of(t.path);
  CHECK(s.status == VmStatus::failed);
  CHECK(s.reason.find("another VM") != std::string::npos);
}

TEST_CASE("a monitor file that is corrupt, no record -> failed naming the file") {
  TempDir t;
  plant(monitor_path(t.path, "vm-a"), "garbage");
  auto s = state_of(t.path);
  CHECK(s.status == VmStatus::failed);
  CHECK(s.reason.find("monitor.json") != std::string::npos);
}

TEST_CASE("generations: reuse starts a new one; the older record is stale and ignored") {
  TempDir t;
  {
    Child m1;
    REQUIRE(begin_generation(t.path, monitor_of(m1.pid)) .value() == 1);
    // The same VM id while its monitor lives: refused, nothing changed.
    Child other;
    auto again = begin_generation(t.path, monitor_of(other.pid));
    REQUIRE_FALSE(again);
    CHECK(again.error().message.find("is running") != std::string::npos);
    REQUIRE(write_record(t.path, record(1, proto::Outcome::exited, 3)));
    m1.end(true);
  }
  Child m2;
  auto g2 = begin_generation(t.path, monitor_of(m2.pid));
  REQUIRE(g2);
  CHECK(*g2 == 2);
  auto s = state_of(t.path);
  CHECK(s.status == VmStatus::running);  // generation 1's exited(3) does not speak for 2
  CHECK(s.generation == 2);
  CHECK_FALSE(s.record);
  // A late write of generation 1 (an old monitor finishing) changes nothing for generation 2.
  auto late = write_record(t.path, record(1, proto::Outcome::exited, 9));
  REQUIRE(late);
  CHECK(late->kind == WriteResult::Kind::already_recorded);
  CHECK(state_of(t.path).status == VmStatus::running);
  m2.end(true);
  s = state_of(t.path);
  CHECK(s.status == VmStatus::failed);
  CHECK(s.reason.find("stale") != std::string::npos);
  // Generation 2's record, then a stale generation-1 stop request: still exited.
  REQUIRE(write_record(t.path, record(2, proto::Outcome::exited, 4)));
  auto st = persist_stop(t.path, "vm-a", 1);
  REQUIRE(st);
  s = state_of(t.path);
  CHECK(s.status == VmStatus::exited);
  CHECK(s.exit_status == 4);
  CHECK_FALSE(s.stop_requested);
}

TEST_CASE("a record newer than the monitor file stands (e.g. serve wrote a later generation)") {
  TempDir t;
  Child m;
  REQUIRE(begin_generation(t.path, monitor_of(m.pid)));
  REQUIRE(write_record(t.path, record(5, proto::Outcome::exited, 2)));
  auto s = state_of(t.path);
  CHECK(s.generation == 5);
  CHECK(s.status == VmStatus::exited);
  CHECK(s.exit_status == 2);
}

TEST_CASE("explicit stop persisted first; a late natural exit never overwrites it") {
  TempDir t;
  Child m;
  REQUIRE(begin_generation(t.path, monitor_of(m.pid)));
  auto st = persist_stop(t.path, "vm-a", 1);
  REQUIRE(st);
  CHECK(st->kind == StopResult::Kind::persisted);
  auto s = state_of(t.path);
  CHECK(s.status == VmStatus::running);  // still being stopped
  CHECK(s.stop_requested);
  CHECK(persist_stop(t.path, "vm-a", 1)->kind == StopResult::Kind::already_requested);
  REQUIRE(write_record(t.path, record(1, proto::Outcome::exited, 0)));  // the natural exit, late
  s = state_of(t.path);
  CHECK(s.status == VmStatus::stopped);
  CHECK(s.exit_status == 0);
  CHECK(s.reason.find("stopped on request") == 0);
  m.end(true);
  CHECK(state_of(t.path).status == VmStatus::stopped);
}

TEST_CASE("natural exit recorded first; the stop then finds it final and writes nothing") {
  TempDir t;
  Child m;
  REQUIRE(begin_generation(t.path, monitor_of(m.pid)));
  REQUIRE(write_record(t.path, record(1, proto::Outcome::exited, 7)));
  auto st = persist_stop(t.path, "vm-a", 1);
  REQUIRE(st);
  CHECK(st->kind == StopResult::Kind::already_final);
  REQUIRE(st->record);
  CHECK(st->record->exit_status == 7);
  CHECK_FALSE(fs::exists(stop_path(t.path, "vm-a")));
  CHECK(state_of(t.path).status == VmStatus::exited);
}

TEST_CASE("stop persisted, monitor gone without an outcome -> stopped (143)") {
  TempDir t;
  Child m;
  REQUIRE(begin_generation(t.path, monitor_of(m.pid)));
  REQUIRE(persist_stop(t.path, "vm-a", 1));
  m.end(true);
  auto s = state_of(t.path);
  CHECK(s.status == VmStatus::stopped);
  CHECK(s.exit_status == 143);
}

TEST_CASE("stop and the natural exit race from threads: exactly one order wins, consistently") {
  for (int round = 0; round < 20; ++round) {
    TempDir t;
    Child m;
    REQUIRE(begin_generation(t.path, monitor_of(m.pid)));
    std::optional<StopResult::Kind> kind;
    std::thread stopper([&] { kind = persist_stop(t.path, "vm-a", 1)->kind; });
    std::thread exiter([&] { (void)write_record(t.path, record(1, proto::Outcome::exited, 0)); });
    stopper.join();
    exiter.join();
    auto s = state_of(t.path);
    REQUIRE(kind);
    if (*kind == StopResult::Kind::persisted) CHECK(s.status == VmStatus::stopped);
    else CHECK(s.status == VmStatus::exited);
  }
}

TEST_CASE("failed outcomes reconcile as failed with their reason; list_vms and remove_vm") {
  TempDir t;
  Record r = record(1, proto::Outcome::no_ready);
  r.reason = "no ready within 30000 ms";
  REQUIRE(write_record(t.path, r));
  auto s = state_of(t.path);
  CHECK(s.status == VmStatus::failed);
  CHECK(s.exit_status == 125);
  CHECK(s.reason.find("no ready within") != std::string::npos);

  Child m;
  REQUIRE(begin_generation(t.path, monitor_of(m.pid, "vm-b")));
  fs::create_directories(t.path / ".hidden");
  plant(t.path / "file", "x");
  CHECK(list_vms(t.path) == std::vector<std::string>{"vm-a", "vm-b"});
  auto refused = remove_vm(t.path, "vm-b");
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("running") != std::string::npos);
  // Another live process is not that monitor; the monitor itself may remove its own VM (--rm).
  auto self = self_identity();
  REQUIRE(self);
  CHECK_FALSE(remove_vm(t.path, "vm-b", self));
  auto mon = identity_of(m.pid);
  REQUIRE(mon);
  REQUIRE(begin_generation(t.path, monitor_of(m.pid, "vm-c")));
  REQUIRE(remove_vm(t.path, "vm-c", mon));
  CHECK_FALSE(fs::exists(t.path / "vm-c"));
  m.end(true);
  REQUIRE(remove_vm(t.path, "vm-b"));
  REQUIRE(remove_vm(t.path, "vm-a"));
  CHECK(list_vms(t.path).empty());
  CHECK_FALSE(remove_vm(t.path, "vm-a"));
}

// ---- the VMM that outlives its monitor (vmm.json, docs/host.md "Re-adoption") ----

namespace {
VmmInfo vmm_info(std::uint64_t gen, std::optional<ProcessIdentity> vmm) {
  VmmInfo v;
  v.vm = "vm-a";
  v.generation = gen;
  v.vmm = vmm;
  v.runtime_dir = "/tmp/neshost-abc";
  v.channel_socket = "/tmp/neshost-abc/channel.sock";
  v.data_socket = "/tmp/neshost-abc/data.sock";
  v.sandbox = true;
  v.on_exit = OnExitPolicy::keep;
  v.reconnect = std::chrono::milliseconds(300000);
  v.rm = true;
  return v;
}
}  // namespace

TEST_CASE("vmm.json round-trips; bad fields are named") {
  auto me = self_identity();
  REQUIRE(me);
  VmmInfo v = vmm_info(3, *me);
  v.daemons.push_back({"virtiofsd nes.v0", *me});
  auto back = parse_vmm(encode_vmm(v));
  REQUIRE(back);
  CHECK(*back == v);
  auto none = parse_vmm(encode_vmm(vmm_info(1, std::nullopt)));
  REQUIRE(none);
  CHECK_FALSE(none->vmm);
  auto err = [](std::string text) {
    auto r = parse_vmm(text);
    return r ? std::string() : r.error().message;
  };
  std::string good = encode_vmm(v);
  auto with = [&](std::string from, std::string to) {
    std::string t = good;
    auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  CHECK(err("[]").starts_with("not a JSON object"));
  CHECK(err(with("\"generation\":3", "\"generation\":0")) == "generation: expected an integer >= 1");
  CHECK(err(with("\"vm\":\"vm-a\"", "\"vm\":\"../x\"")) == "vm: expected a VM id");
  CHECK(err(with("\"runtime_dir\":\"/tmp", "\"runtime_dir\":\"tmp")) == "runtime_dir: expected an absolute path");
  CHECK(err(with("\"on_exit\":\"keep\"", "\"on_exit\":\"later\"")) == "on_exit: expected stop, keep or remove");
  VmmInfo bad = v;
  bad.vmm->pid = 0;
  CHECK(err(encode_vmm(bad)) == "vmm.pid: expected a pid");
  bad = v;
  bad.daemons[0].id.pid = 0;
  CHECK(err(encode_vmm(bad)) == "daemons[0].process.pid: expected a pid");
  // stdin's source: absent (an older vmm.json) and null are none; a FIFO and a file round-trip.
  CHECK(good.find("\"stdin\":null") != std::string::npos);
  auto older = parse_vmm(with(",\"stdin\":null", ""));
  REQUIRE(older);
  CHECK_FALSE(older->stdin_source);
  for (auto kind : {VmmStdin::Kind::fifo, VmmStdin::Kind::file}) {
    VmmInfo s = v;
    s.stdin_source = VmmStdin{kind, "/run/containerd/fifo/1/t-stdin", kind == VmmStdin::Kind::file ? 4096u : 0u};
    auto b = parse_vmm(encode_vmm(s));
    REQUIRE(b);
    CHECK(*b == s);
  }
  CHECK(err(with("\"stdin\":null", R"("stdin":{"kind":"tty","path":"/x","offset":0})")) ==
        "stdin.kind: expected fifo or file");
  CHECK(err(with("\"stdin\":null", R"("stdin":{"kind":"fifo","path":"x","offset":0})")) ==
        "stdin.path: expected an absolute path");
  CHECK(err(with("\"stdin\":null", R"("stdin":{"kind":"file","path":"/x","offset":-1})")) ==
        "stdin.offset: expected bytes");
  // The duties a replacement takes over (host/monitor/duties.hpp): absent in an older file, each
  // round-trips, bad ones are named.
  CHECK_FALSE(older->started_at);
  CHECK_FALSE(older->wall_timeout);
  CHECK_FALSE(older->netns);
  VmmInfo d = v;
  d.started_at = WallTime(std::chrono::nanoseconds(1'700'000'000'123'456'789));
  d.wall_timeout = std::chrono::milliseconds(12000);
  d.wall_deadline_ns = 987'654'321'000;
  d.netns = VmmNetns{"/var/run/netns/cni-1", "nes0123456789ab", "eth0"};
  auto db = parse_vmm(encode_vmm(d));
  REQUIRE(db);
  CHECK(*db == d);
  CHECK(err(with("\"stdin\":null", R"("stdin":null,"started_at":"yesterday")")) ==
        "started_at: expected an RFC 3339 time");
  CHECK(err(with("\"stdin\":null", R"("stdin":null,"deadline_boottime_ns":-1)")) ==
        "deadline_boottime_ns: expected nanoseconds");
  CHECK(err(with("\"stdin\":null", R"("stdin":null,"netns":{"path":"/x","tap":"","interface":"eth0"})")) ==
        "netns.tap: expected an interface name");
}

namespace {
/// Byte i of a stdin stream the spool tests write: not periodic in any pipe or page size.
char pattern_at(std::uint64_t i) { return static_cast<char>((i * 7 + i / 251) % 253 + 1); }  // never 0
std::string pattern(std::uint64_t from, std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = pattern_at(from + i);
  return s;
}
/// Writes pattern bytes [0, n) to fd in blocking writes of up to 1 MiB, then (once `before_close`
/// is ready, if given) closes it.
void write_pattern(int fd, std::uint64_t n, std::shared_future<void> before_close = {}) {
  const std::string all = pattern(0, static_cast<std::size_t>(n));
  for (std::uint64_t at = 0; at < n;) {
    ssize_t w = ::write(fd, all.data() + at, static_cast<std::size_t>(std::min<std::uint64_t>(1u << 20, n - at)));
    if (w <= 0) break;
    at += static_cast<std::uint64_t>(w);
  }
  if (before_close.valid()) before_close.wait();
  ::close(fd);
}
}  // namespace

TEST_CASE("stdin.spool: bytes move from a FIFO into the file, holes behind kKeep, a replacement sees both") {
  TempDir t;
  int p[2];
  REQUIRE(::pipe2(p, O_NONBLOCK | O_CLOEXEC) == 0);
  auto sp = StdinSpool::open(t.path, "vm-a", true);
  REQUIRE(sp);
  auto none = sp->take(p[0], 65536);
  REQUIRE(none);
  CHECK((none->bytes == 0 && !none->eof));  // EAGAIN: nothing yet
  // A replacement never creates one: in a VM directory that exists, without a spool, it fails.
  REQUIRE(open_vm_dir(t.path, "vm-b", true));
  CHECK_FALSE(StdinSpool::open(t.path, "vm-b", false));
  CHECK_FALSE(fs::exists(vm_path(t.path, "vm-b", kStdinSpoolFile)));
  {
    // A replacement takes the file as it is: every byte from 0, none touched by the open.
    const std::string head = pattern(0, 5);
    REQUIRE(::write(p[1], head.data(), head.size()) == 5);
    auto h = sp->take(p[0], 65536);
    REQUIRE(h);
    CHECK(h->bytes == 5);
    auto again = StdinSpool::open(t.path, "vm-a", false);
    REQUIRE(again);
    std::string got(5, '\0');
    auto r = again->read_at(0, got.data(), got.size());
    REQUIRE(r);
    CHECK((*r == 5 && got == head && again->held_from() == 0 && again->size() == 5));
  }
  const std::uint64_t n = 6u << 20;
  ::fcntl(p[1], F_SETFL, 0);  // the writer blocks on a full pipe
  // The writer goes on from byte 5.
  std::thread writer([fd = p[1], n] {
    const std::string all = pattern(0, static_cast<std::size_t>(n));
    for (std::uint64_t at = 5; at < n;) {
      ssize_t w = ::write(fd, all.data() + at, static_cast<std::size_t>(std::min<std::uint64_t>(1u << 20, n - at)));
      if (w <= 0) break;
      at += static_cast<std::uint64_t>(w);
    }
    ::close(fd);
  });
  while (sp->size() < n) {
    pollfd pf{p[0], POLLIN, 0};
    REQUIRE(::poll(&pf, 1, 30000) == 1);
    auto r = sp->take(p[0], 65536);
    REQUIRE(r);
    REQUIRE_FALSE(r->eof);
  }
  writer.join();
  CHECK(sp->size() == n);
  CHECK(sp->held_from() == n - StdinSpool::kKeep);  // 2 MiB: whole steps only
  std::string got(1000, '\0');
  auto r = sp->read_at(n - 1000, got.data(), got.size());
  REQUIRE(r);
  CHECK(*r == 1000);
  CHECK(got == pattern(n - 1000, 1000));
  auto eof = sp->take(p[0], 65536);
  REQUIRE(eof);
  CHECK(eof->eof);
  ::close(p[0]);
  auto again = StdinSpool::open(t.path, "vm-a", false);  // a replacement
  REQUIRE(again);
  CHECK(again->size() == n);
  CHECK(again->held_from() == n - StdinSpool::kKeep);
  r = again->read_at(again->held_from(), got.data(), got.size());
  REQUIRE(r);
  CHECK(got == pattern(again->held_from(), 1000));
  struct stat st {};
  REQUIRE(::stat(vm_path(t.path, "vm-a", kStdinSpoolFile).c_str(), &st) == 0);
  CHECK(static_cast<std::uint64_t>(st.st_blocks) * 512 <= StdinSpool::kKeep + (64u << 10));  // bounded on disk
  auto fresh = StdinSpool::open(t.path, "vm-a", true);
  REQUIRE(fresh);
  CHECK((fresh->size() == 0 && fresh->held_from() == 0));
  CHECK_FALSE(StdinSpool::open(t.path, "../x", true));  // the VM id is checked as for every state file
}

TEST_CASE("stdin.spool: a monitor SIGKILLed while it splices loses nothing: spool + FIFO = every byte written") {
  // What read(2) then a tally could not give (the bytes a killed read had taken were gone
  // uncounted): the kernel takes from the pipe exactly what it put in the file.
  for (int round = 0; round < 12; ++round) {
    CAPTURE(round);
    TempDir t;
    int p[2], note[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(note, O_CLOEXEC) == 0);
    // A 1 MiB pipe taken 1 MiB at a time: the kill mostly lands inside a take's copy.
    (void)::fcntl(p[0], F_SETPIPE_SZ, 1 << 20);
    const std::uint64_t n = 8u << 20, kill_after = (256u << 10) + static_cast<std::uint64_t>(round) * 77777;
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(p[1]);
      auto s = StdinSpool::open(t.path, "vm-a", true);
      if (!s) ::_exit(2);
      bool told = false;
      for (;;) {
        pollfd pf{p[0], POLLIN, -1};
        ::poll(&pf, 1, -1);
        auto r = s->take(p[0], 1u << 20);
        if (!r) ::_exit(3);
        if (r->eof) ::_exit(4);
        if (!told && s->size() >= kill_after) {
          told = true;
          (void)!::write(note[1], "k", 1);  // the parent kills us while we go on splicing
        }
      }
    }
    ::close(note[1]);
    std::promise<void> killed;  // the FIFO's EOF only after the kill: the child never ends by itself
    std::thread writer(write_pattern, p[1], n, killed.get_future().share());
    char c;
    REQUIRE(::read(note[0], &c, 1) == 1);
    ::kill(pid, SIGKILL);
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    CHECK((WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL));
    killed.set_value();
    ::close(note[0]);
    // What the killed one left in the FIFO, read to the writer's end.
    std::string rest;
    char b[65536];
    for (ssize_t k; (k = ::read(p[0], b, sizeof b)) > 0;) rest.append(b, static_cast<std::size_t>(k));
    writer.join();
    ::close(p[0]);
    auto sp = StdinSpool::open(t.path, "vm-a", false);
    REQUIRE(sp);
    CHECK(sp->size() >= kill_after);
    CHECK(sp->size() + rest.size() == n);  // nothing taken and not kept
    std::string kept(static_cast<std::size_t>(sp->size() - sp->held_from()), '\0');
    auto r = sp->read_at(sp->held_from(), kept.data(), kept.size());
    REQUIRE(r);
    CHECK(*r == kept.size());
    CHECK(kept == pattern(sp->held_from(), kept.size()));
    CHECK(rest == pattern(sp->size(), rest.size()));
  }
}

TEST_CASE("monitor gone, its VMM alive -> running (orphaned), never failed; VMM gone too -> failed") {
  TempDir t;
  Child monitor, vmm;
  auto m = monitor_of(monitor.pid);
  auto gen = begin_generation(t.path, m);
  REQUIRE(gen);
  auto vid = identity_of(vmm.pid);
  REQUIRE(vid);
  REQUIRE(write_vmm(t.path, vmm_info(*gen, *vid)));
  auto s = state_of(t.path);
  CHECK((s.status == VmStatus::running && s.monitor_alive && s.vmm_alive && !s.orphaned()));
  monitor.end(true);
  s = state_of(t.path);
  CHECK(s.status == VmStatus::running);
  CHECK(s.orphaned());
  CHECK(s.reason.find("its VMM (pid") != std::string::npos);
  CHECK(encode_state(s).find(fmt::format("\"vmm_pid\":{},\"vmm_alive\":true", vmm.pid)) != std::string::npos);
  // An orphaned VM is not replaced by a new generation, nor removed.
  Child other;
  auto refused = begin_generation(t.path, monitor_of(other.pid), std::chrono::milliseconds(0));
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("its VMM pid") != std::string::npos);
  CHECK_FALSE(remove_vm(t.path, "vm-a"));
  // A stop request does not end it while the VMM runs.
  REQUIRE(persist_stop(t.path, "vm-a", *gen));
  CHECK(state_of(t.path).status == VmStatus::running);
  vmm.end(false);  // a zombie is gone
  s = state_of(t.path);
  CHECK((s.status == VmStatus::stopped && !s.vmm_alive));
}

TEST_CASE("take_over_generation: only an orphaned generation, once; monitor.json names the replacement") {
  TempDir t;
  Child monitor, vmm, replacement;
  auto gen = begin_generation(t.path, monitor_of(monitor.pid));
  REQUIRE(gen);
  auto rid = identity_of(replacement.pid);
  REQUIRE(rid);
  // No VMM recorded: nothing to take over.
  auto r = take_over_generation(t.path, "vm-a", *rid);
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("is alive") != std::string::npos);
  monitor.end(true);
  r = take_over_generation(t.path, "vm-a", *rid);
  REQUIRE_FALSE(r);
  CHECK(r.error().message == fmt::format("no VMM of generation {} is recorded", *gen));
  REQUIRE(write_vmm(t.path, vmm_info(*gen, *identity_of(vmm.pid))));
  r = take_over_generation(t.path, "vm-a", *rid);
  REQUIRE(r);
  CHECK((r->generation == *gen && r->monitor == *rid && r->command == std::vector<std::string>{"/bin/sh", "-c", "exit 7"}));
  auto s = state_of(t.path);
  CHECK((s.status == VmStatus::running && s.monitor_alive && !s.orphaned() && s.generation == *gen));
  // A second replacement finds it served.
  Child late;
  auto again = take_over_generation(t.path, "vm-a", *identity_of(late.pid));
  REQUIRE_FALSE(again);
  CHECK(again.error().message.find("is alive") != std::string::npos);
  // Recorded, the replacement gone, the VMM still up (its guest awaiting the ack): still an
  // orphan, taken over to acknowledge and power off; once the VMM is gone, nothing to take over.
  REQUIRE(write_record(t.path, record(*gen)));
  replacement.end(true);
  s = state_of(t.path);
  CHECK((s.status == VmStatus::exited && s.orphaned()));
  auto lid = identity_of(late.pid);
  REQUIRE(lid);
  again = take_over_generation(t.path, "vm-a", *lid);
  REQUIRE(again);
  CHECK(again->monitor == *lid);
  late.end(true);
  vmm.end(true);
  CHECK_FALSE(state_of(t.path).orphaned());
  Child last;
  again = take_over_generation(t.path, "vm-a", *identity_of(last.pid));
  REQUIRE_FALSE(again);
  CHECK(again.error().message.find("is gone") != std::string::npos);
}

TEST_CASE("vmm.json's output sinks: absent is none, a FIFO and a file round-trip, bad ones are named") {
  auto me = self_identity();
  REQUIRE(me);
  VmmInfo v = vmm_info(3, *me);
  const std::string plain = encode_vmm(v);
  CHECK(plain.find("\"stdout\"") == std::string::npos);
  auto back = parse_vmm(plain);
  REQUIRE(back);
  CHECK_FALSE(back->stdout_sink);
  CHECK_FALSE(back->stderr_sink);
  v.stdout_sink = VmmSink{VmmSink::Kind::fifo, "/run/containerd/fifo/1/t-stdout"};
  v.stderr_sink = VmmSink{VmmSink::Kind::file, "/var/log/t.log"};
  auto both = parse_vmm(encode_vmm(v));
  REQUIRE(both);
  CHECK(*both == v);
  std::string text = encode_vmm(v);
  auto at = text.find("\"kind\":\"fifo\"");
  REQUIRE(at != std::string::npos);
  auto r = parse_vmm(std::string(text).replace(at, 13, "\"kind\":\"tty\""));
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "stdout.kind: expected fifo or file");
  at = text.find("\"/var/log/t.log\"");
  r = parse_vmm(std::string(text).replace(at, 16, "\"t.log\""));
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "stderr.path: expected an absolute path");
}

TEST_CASE("output.pos: counts survive the process (a child adds, dies by SIGKILL; the parent reads them)") {
  TempDir t("nes-outpos");
  REQUIRE(open_vm_dir(t.path, "vm-o", true));
  {
    auto tally = monitor::OutputTally::open(t.path, "vm-o", true);
    REQUIRE(tally);
    CHECK(tally->delivered(OutputStream::out) == 0);
    pid_t c = ::fork();
    REQUIRE(c >= 0);
    if (c == 0) {
      tally->add(OutputStream::out, 1000);
      tally->add(OutputStream::err, 7);
      tally->add(OutputStream::out, 24);
      ::kill(::getpid(), SIGKILL);
      ::_exit(1);
    }
    int st = 0;
    REQUIRE(::waitpid(c, &st, 0) == c);
    CHECK(WIFSIGNALED(st));
  }
  auto again = monitor::OutputTally::open(t.path, "vm-o", false);
  REQUIRE(again);
  CHECK(again->delivered(OutputStream::out) == 1024);
  CHECK(again->delivered(OutputStream::err) == 7);
  // A file of another size is refused, naming it.
  ::truncate((t.path / "vm-o" / "output.pos").c_str(), 3);
  auto bad = monitor::OutputTally::open(t.path, "vm-o", false);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.find("output.pos: 3 bytes, not 16") != std::string::npos);
}

TEST_CASE("logged_bytes: a stream's bytes between two positions come back out of workload.log, across rotation") {
  TempDir t("nes-logged");
  LogOptions o;
  o.path = t.path / "workload.log";
  o.max_size = kMinLogSize;
  o.max_files = 3;
  o.generation = 2;
  std::string out_all, err_all;
  {
    auto w = LogWriter::open(o);
    REQUIRE(w);
    for (int i = 1; i <= 6000; ++i) {
      std::string line = fmt::format("n{}\n", i);
      (*w)->write(OutputStream::out, line, wall_now());
      out_all += line;
      if (i % 100 == 0) {
        (*w)->write(OutputStream::err, fmt::format("e{}\n", i), wall_now());
        err_all += fmt::format("e{}\n", i);
      }
      if (i == 5500) (*w)->gap(OutputStream::out, "12 bytes of stdout lost", wall_now());
    }
  }
  const std::uint64_t size = fs::file_size(o.path);
  auto got = monitor::logged_bytes(o.path, OutputStream::out, 2, out_all.size() - 600, out_all.size(), size);
  CHECK(got.missing == 0);
  CHECK(got.bytes == out_all.substr(out_all.size() - 600));
  auto e = monitor::logged_bytes(o.path, OutputStream::err, 2, err_all.size() - 50, err_all.size(), size);
  CHECK(e.bytes == err_all.substr(err_all.size() - 50));
  // Another generation's records are not this one's.
  CHECK(monitor::logged_bytes(o.path, OutputStream::out, 3, 0, 10, size).missing == 10);
  // Rotated away: what the files no longer hold is counted as missing, at the front.
  auto all = monitor::logged_bytes(o.path, OutputStream::out, 2, 0, out_all.size(), size);
  CHECK(all.missing > 0);
  CHECK(all.missing + all.bytes.size() == out_all.size());
  CHECK(all.bytes == out_all.substr(all.missing));
}
