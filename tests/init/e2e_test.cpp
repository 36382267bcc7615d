// End-to-end: the real static init as PID 1 of a fresh pid + mount namespace, over a Unix socket,
// against a scripted host (harness.hpp). Asserts the messages, the logged phase order, the
// namespace init's wait status (SIGINT = power-off, SIGHUP = reboot), real mounts, and the bug
// scenarios S1-S8, S10, S11 of tests/init/scenarios.md.
// This binary doubles as a probe run *inside* the sandbox: `init_e2e_test probe statvfs PATH` /
// `probe write PATH` (argv[1] == "probe", before doctest sees anything).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <sys/statvfs.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>

#include "e2e_checks.hpp"

using namespace nes::init::test;
namespace proto = nes::proto;
namespace fs = std::filesystem;

namespace {

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  return std::string(buf, static_cast<std::size_t>(n));
}

int probe(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[2]) == "statvfs") {
    struct statvfs s {};
    if (::statvfs(argv[3], &s) != 0) {
      std::printf("statvfs-error %d\n", errno);
      return 1;
    }
    std::printf("statvfs %s nosuid=%d nodev=%d ro=%d\n", argv[3], (s.f_flag & ST_NOSUID) ? 1 : 0,
                (s.f_flag & ST_NODEV) ? 1 : 0, (s.f_flag & ST_RDONLY) ? 1 : 0);
    return 0;
  }
  if (argc >= 4 && std::string(argv[2]) == "write") {
    std::string p = std::string(argv[3]) + "/probe-file";
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = fd < 0 ? errno : 0;
    if (fd >= 0) ::close(fd);
    std::printf("write %s %s\n", argv[3], e == 0 ? "ok" : e == EROFS ? "EROFS" : std::strerror(e));
    return 0;
  }
  return 2;
}

/// Runs one ordinary terminal session to its end: boot, started, workload_exited, ack, exit.
struct Outcome {
  std::optional<proto::WorkloadExited> exited;
  std::optional<proto::StartFailed> start_failed;
  std::optional<int> status;
};

Outcome run_once(const std::vector<std::string>& argv, SandboxOptions o = {}) {
  Sandbox sb(std::move(o));
  Outcome r;
  if (!sb.accept()) return r;
  if (!sb.expect<proto::Ready>()) return r;
  sb.send(make_boot(argv));
  if (!sb.expect<proto::Mounted>()) return r;
  auto m = sb.next();
  if (!m) return r;
  if (auto* f = std::get_if<proto::StartFailed>(&*m)) {
    r.start_failed = *f;
  } else if (std::holds_alternative<proto::Started>(*m)) {
    if (auto x = sb.expect<proto::WorkloadExited>(20000)) r.exited = *x;
  }
  sb.send(proto::Shutdown{});
  r.status = sb.wait_exit();
  return r;
}


std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "probe") return probe(argc, argv);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

TEST_CASE("not PID 1: only --help, --version, --self-check; anything else exits 2") {
  auto run = [](std::string args) {
    std::string cmd = init_bin() + " " + args + " >/dev/null 2>&1";
    int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  CHECK(run("--version") == 0);
  CHECK(run("--help") == 0);
  CHECK(run("--self-check") == 0);
  CHECK(run("") == 2);
  CHECK(run("--channel=unix:/nonexistent") == 2);
}

TEST_CASE("sandbox: a full cycle, the logged phase order, power-off ends the namespace with SIGINT") {
  Sandbox sb({.init_args = {"--grace-ms=2000"}});
  REQUIRE(sb.accept());
  auto ready = sb.expect<proto::Ready>();
  REQUIRE(ready);
  CHECK(ready->protocol_version == 2);
  sb.send(make_boot({"/bin/sh", "-c", "echo hello-from-workload; exit 3"}));
  CHECK(sb.expect<proto::Mounted>());
  auto started = sb.expect<proto::Started>();
  REQUIRE(started);
  CHECK(started->pid >= 2);
  const proto::WorkloadExited exited = next_exit(sb);
  CHECK(exited == proto::WorkloadExited::code(3));
  sb.send(proto::Shutdown{});
  auto st = sb.wait_exit();
  REQUIRE(st);
  CHECK(powered_off(st));
  CHECK(sb.out().find("hello-from-workload\n") != std::string::npos);
  std::string missing;
  CHECK_MESSAGE(in_order(sb.err(), {"nesinit: mode: sandbox", "nesinit: config: channel=unix:",
                                    "nesinit: dial: ", "connected", "nesinit: send: ready",
                                    "nesinit: boot: argv[0]=/bin/sh", "nesinit: mounted:",
                                    "nesinit: send: mounted", "nesinit: spawn: /bin/sh",
                                    "nesinit: started: pid", "nesinit: send: started",
                                    "nesinit: exited: exit_code 3", "nesinit: send: workload_exited",
                                    "nesinit: shutdown: begin: terminal outcome",
                                    "nesinit: term-all:", "nesinit: shutdown: no processes left",
                                    "nesinit: ack: host acknowledged", "nesinit: poweroff: reboot(RB_POWER_OFF)"},
                         &missing),
                "missing or out of order: " << missing << "\n" << sb.err());
}

TEST_CASE("reboot: --halt=reboot ends the namespace with SIGHUP; the descriptor's halt wins") {
  {
    Sandbox sb({.init_args = {"--halt=reboot"}});
    REQUIRE_MESSAGE(sb.start(make_boot({"/bin/true"})), sb.last_error());
    REQUIRE(sb.expect<proto::WorkloadExited>());
    sb.send(proto::Shutdown{});
    auto st = sb.wait_exit();
    CHECK(rebooted(st));
    CHECK(sb.err().find("nesinit: reboot: reboot(RB_AUTOBOOT)") != std::string::npos);
  }
  {
    Sandbox sb{SandboxOptions{}};
    auto b = make_boot({"/bin/true"});
    b.on_exit.halt = proto::Halt::reboot;
    REQUIRE_MESSAGE(sb.start(b), sb.last_error());
    REQUIRE(sb.expect<proto::WorkloadExited>());
    sb.send(proto::Shutdown{});
    CHECK(rebooted(sb.wait_exit()));
  }
  {
    Sandbox sb({.init_args = {"--halt=reboot"}});
    auto b = make_boot({"/bin/true"});
    b.on_exit.halt = proto::Halt::poweroff;
    REQUIRE_MESSAGE(sb.start(b), sb.last_error());
    REQUIRE(sb.expect<proto::WorkloadExited>());
    CHECK(sb.shutdown_powered_off());
  }
}

TEST_CASE("mounts for real: tmpfs and bind, nosuid/nodev by statvfs, ro by EROFS, reverse unmount") {
  Sandbox sb{SandboxOptions{}};
  const fs::path src = sb.dir() / "src";
  fs::create_directories(src);
  std::ofstream(src / "hello") << "from the host\n";
  const std::string t = (sb.dir() / "m" / "tmp").string();
  const std::string rw = (sb.dir() / "m" / "rw").string();
  const std::string ro = (sb.dir() / "m" / "deep" / "ro").string();
  const std::string exe = self_exe();
  auto b = make_boot({"/bin/sh", "-c",
                      exe + " probe statvfs " + t + "; " + exe + " probe statvfs " + rw + "; " + exe +
                          " probe statvfs " + ro + "; " + exe + " probe write " + t + "; " + exe +
                          " probe write " + rw + "; " + exe + " probe write " + ro + "; cat " + ro + "/hello"});
  b.mounts = {proto::Mount{"scratch", t, false, proto::FsType::tmpfs},
              proto::Mount{src.string(), rw, false, proto::FsType::bind},
              proto::Mount{src.string(), ro, true, proto::FsType::bind}};
  REQUIRE_MESSAGE(sb.start(b), sb.last_error());
  const proto::WorkloadExited x = next_exit(sb);
  CHECK(x == proto::WorkloadExited::code(0));
  CHECK(sb.shutdown_powered_off());
  const std::string& o = sb.out();
  CAPTURE(o);
  CHECK(o.find("statvfs " + t + " nosuid=1 nodev=1 ro=0") != std::string::npos);
  CHECK(o.find("statvfs " + rw + " nosuid=1 nodev=1 ro=0") != std::string::npos);
  CHECK(o.find("statvfs " + ro + " nosuid=1 nodev=1 ro=1") != std::string::npos);
  CHECK(o.find("write " + t + " ok") != std::string::npos);
  CHECK(o.find("write " + rw + " ok") != std::string::npos);
  CHECK(o.find("write " + ro + " EROFS") != std::string::npos);
  CHECK(o.find("from the host") != std::string::npos);
  // The rw bind wrote through to the host directory; the tmpfs did not.
  CHECK(fs::exists(src / "probe-file"));
  std::string missing;
  CHECK_MESSAGE(in_order(sb.err(), {"nesinit: mount: tmpfs scratch on " + t, "nesinit: mount: bind " + src.string() + " on " + rw,
                                    "nesinit: mount: bind " + src.string() + " on " + ro + " (ro,",
                                    "nesinit: unmount: " + ro, "nesinit: unmount: " + rw, "nesinit: unmount: " + t},
                         &missing),
                missing << "\n" << sb.err());
  // Nothing the sandbox mounted is visible here.
  std::ifstream mi("/proc/self/mountinfo");
  std::stringstream ss;
  ss << mi.rdbuf();
  CHECK(ss.str().find(sb.dir().string()) == std::string::npos);
}

TEST_CASE("mounts: a missing bind source is mount_failed and nothing starts") {
  Sandbox sb{SandboxOptions{}};
  REQUIRE(sb.accept());
  REQUIRE(sb.expect<proto::Ready>());
  const std::string t = (sb.dir() / "m" / "tmp").string();
  const std::string marker = (sb.dir() / "ran").string();
  auto b = make_boot({"/bin/sh", "-c", "touch " + marker});
  b.mounts = {proto::Mount{"scratch", t, false, proto::FsType::tmpfs},
              proto::Mount{(sb.dir() / "no-such-source").string(), (sb.dir() / "m" / "b").string(), false,
                           proto::FsType::bind}};
  sb.send(b);
  auto f = sb.expect<proto::MountFailed>();
  REQUIRE_MESSAGE(f, sb.last_error());
  CHECK(f->tag == (sb.dir() / "no-such-source").string());
  CHECK(f->err == ENOENT);
  sb.send(proto::Shutdown{});
  // No started, no workload_exited: the next thing is the end of the channel.
  CHECK(!sb.next());
  CHECK(sb.last_error() == "EOF");
  CHECK(powered_off(sb.wait_exit()));
  CHECK(!fs::exists(marker));
  CHECK(sb.err().find("nesinit: spawn:") == std::string::npos);
  CHECK(sb.err().find("nesinit: unmount: " + t) != std::string::npos);  // the one that did mount
}

namespace {
std::string link_of(const std::string& path) {
  char buf[256];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("(" + path + ": none)");
}
}  // namespace

TEST_CASE("mounts: a sandbox's shares go into its own private mount namespace, even when the one it was started in is shared") {
  // The namespace the init starts in has `/` shared (its own peer group, nothing outside the
  // test's namespace): a share mounted there, or in a copy of it that is not made private,
  // shows up in that namespace's mountinfo. The `unshare` process stays in it.
  SandboxOptions o;
  o.wrapper = {"/bin/sh", "-c", "mount --make-rshared / && exec \"$@\"", "sh"};
  for (bool with_share : {false, true}) {
    CAPTURE(with_share);
    Sandbox sb{o};
    REQUIRE(sb.accept());
    REQUIRE(sb.expect<proto::Ready>());
    const std::string t = (sb.dir() / "m" / "scratch").string();
    auto b = make_boot({"/bin/sh", "-c", "readlink /proc/self/ns/mnt"});
    if (with_share) b.mounts = {proto::Mount{"scratch", t, false, proto::FsType::tmpfs}};
    sb.send(b);
    REQUIRE_MESSAGE(sb.expect<proto::Mounted>(), sb.last_error() << "\n" << sb.err());
    REQUIRE(sb.expect<proto::Started>());
    const proto::WorkloadExited x = next_exit(sb);
    CHECK(x == proto::WorkloadExited::code(0));
    // The share is still mounted (the init waits for the ack): not in the starting namespace.
    const std::string parent = "/proc/" + std::to_string(sb.unshare_pid());
    std::ifstream mi(parent + "/mountinfo");
    std::stringstream ss;
    ss << mi.rdbuf();
    CHECK(!ss.str().empty());
    CHECK(ss.str().find(t) == std::string::npos);
    // Without a share the workload runs in the namespace it was started in (none was made).
    const std::string parent_ns = link_of(parent + "/ns/mnt");
    CHECK(parent_ns.rfind("mnt:[", 0) == 0);
    if (with_share) CHECK(sb.out().find(parent_ns) == std::string::npos);
    else CHECK(sb.out() == parent_ns + "\n");
    sb.send(proto::Shutdown{});
    CHECK(powered_off(sb.wait_exit()));
  }
}

TEST_CASE("boot: environment with the geometry variables; cwd; exec.env wins") {
  Sandbox sb{SandboxOptions{}};
  auto b = make_boot({"sh", "-c", "echo W=$NESINIT_WIDTH H=$NESINIT_HEIGHT F=$NESINIT_FPS HDR=$NESINIT_HDR A=$A P=$(pwd)"});
  b.exec.env = {{"A", "b c"}, {"NESINIT_FPS", "24"}};
  b.exec.cwd = "/proc";
  b.geometry = {3840, 2160, 60, true};
  REQUIRE_MESSAGE(sb.start(b), sb.last_error());
  REQUIRE(sb.expect<proto::WorkloadExited>());
  CHECK(sb.shutdown_powered_off());
  CHECK(sb.out().find("W=3840 H=2160 F=24 HDR=1 A=b c P=/proc\n") != std::string::npos);
}

TEST_CASE("protocol: malformed lines get protocol_error, unknown types are skipped, a second boot is ignored") {
  Sandbox sb{SandboxOptions{}};
  REQUIRE(sb.accept());
  REQUIRE(sb.expect<proto::Ready>());
  sb.send_raw("this is not json\n");
  auto pe = sb.expect<proto::ProtocolError>();
  REQUIRE(pe);
  CHECK(!pe->reason.empty());
  sb.send_raw("{\"type\":\"telemetry\",\"x\":1}\n");
  sb.send_raw("{\"type\":\"boot\",\"exec\":{\"argv\":[],\"uid\":0,\"gid\":0}}\n");
  pe = sb.expect<proto::ProtocolError>();
  REQUIRE(pe);
  auto gate = (sb.dir() / "gate").string();
  sb.send(make_boot({"/bin/sh", "-c", "while [ ! -e " + gate + " ]; do sleep 0.05; done; exit 9"}));
  sb.send(make_boot({"/bin/sh", "-c", "exit 1"}));
  REQUIRE(sb.expect<proto::Mounted>());
  REQUIRE(sb.expect<proto::Started>());
  std::ofstream(gate) << "";
  const proto::WorkloadExited x = next_exit(sb);
  CHECK(x == proto::WorkloadExited::code(9));
  CHECK(sb.shutdown_powered_off());
  CHECK(sb.err().find("skipped unknown type 'telemetry'") != std::string::npos);
  CHECK(sb.err().find("another boot") != std::string::npos);
}

TEST_CASE("boot and shutdown in one write: the workload starts, gets its SIGTERM, is reported") {
  Sandbox sb{SandboxOptions{}};
  REQUIRE(sb.accept());
  REQUIRE(sb.expect<proto::Ready>());
  sb.send_raw(proto::encode_line(proto::HostMessage{make_boot({"sleep", "1000"})}) +
              proto::encode_line(proto::HostMessage{proto::Shutdown{}}));
  REQUIRE(sb.expect<proto::Mounted>());
  REQUIRE(sb.expect<proto::Started>());
  const proto::WorkloadExited x = next_exit(sb);
  CHECK(x.signal == SIGTERM);
  CHECK(sb.shutdown_powered_off());
}

TEST_CASE("--log=quiet: a clean session writes nothing but the workload's output") {
  Sandbox sb{SandboxOptions{.log = "quiet"}};
  REQUIRE_MESSAGE(sb.start(make_boot({"/bin/sh", "-c", "echo only-this"})), sb.last_error());
  REQUIRE(sb.expect<proto::WorkloadExited>());
  CHECK(sb.shutdown_powered_off());
  CHECK(sb.out() == "only-this\n");
  CHECK(sb.err() == "");
}

TEST_CASE("kill{signal}: the host's signal reaches the workload's group") {
  Sandbox sb{SandboxOptions{}};
  REQUIRE_MESSAGE(sb.start(make_boot({"/bin/sh", "-c", "trap 'echo GOT-USR2; exit 12' USR2; echo UP; while :; do sleep 0.05; done"})), sb.last_error());
  REQUIRE(sb.wait_stdout("UP\n"));
  sb.send(proto::Kill{static_cast<std::uint8_t>(SIGUSR2)});
  const proto::WorkloadExited x = next_exit(sb);
  CHECK(x == proto::WorkloadExited::code(12));
  CHECK(sb.shutdown_powered_off());
  CHECK(sb.out().find("GOT-USR2") != std::string::npos);
}

TEST_CASE("an over-long line (2 MiB) is refused without ending the session") {
  Sandbox sb{SandboxOptions{}};
  REQUIRE(sb.accept());
  REQUIRE(sb.expect<proto::Ready>());
  sb.send_raw("{\"type\":\"boot\",\"x\":\"" + std::string(2u << 20, 'a') + "\"}\n");
  auto pe = sb.expect<proto::ProtocolError>();
  REQUIRE_MESSAGE(pe, sb.last_error());
  sb.send(make_boot({"/bin/true"}));
  REQUIRE(sb.expect<proto::Mounted>());
  REQUIRE(sb.expect<proto::Started>());
  CHECK(sb.expect<proto::WorkloadExited>() == proto::WorkloadExited::code(0));
  CHECK(sb.shutdown_powered_off());
}

TEST_CASE("no boot within boot_timeout_ms: ordered shutdown and power-off") {
  Sandbox sb({.init_args = {"--boot-timeout-ms=200"}});
  REQUIRE(sb.accept());
  REQUIRE(sb.expect<proto::Ready>());
  CHECK(!sb.next());
  CHECK(powered_off(sb.wait_exit()));
  CHECK(sb.err().find("no boot within 200 ms") != std::string::npos);
}

TEST_CASE("EOF before boot: ordered shutdown") {
  Sandbox sb{SandboxOptions{}};
  REQUIRE(sb.accept());
  REQUIRE(sb.expect<proto::Ready>());
  sb.close_channel();
  CHECK(powered_off(sb.wait_exit()));
  CHECK(sb.err().find("shutdown: begin: channel EOF") != std::string::npos);
}

TEST_CASE("no host listening: bounded dial, then ordered shutdown") {
  Sandbox sb({.init_args = {"--connect-timeout-ms=300"}, .listen = false});
  CHECK(powered_off(sb.wait_exit()));
  CHECK(sb.err().find("failed") != std::string::npos);
  CHECK(sb.err().find("shutdown: begin: no channel") != std::string::npos);
}

TEST_CASE("EOF while the workload runs: its one SIGTERM, then power-off") {
  Sandbox sb({.init_args = {"--grace-ms=60000"}});
  REQUIRE_MESSAGE(sb.start(make_boot({"sleep", "1000"})), sb.last_error());
  sb.close_channel();
  CHECK(powered_off(sb.wait_exit()));
  CHECK(sb.err().find("exited: signal 15") != std::string::npos);
}

TEST_CASE("signals to PID 1: SIGTERM from inside shuts down; SIGUSR1 is forwarded to the workload") {
  for (int sig : {SIGTERM, SIGINT, SIGPWR}) {
    CAPTURE(sig);
    Sandbox sb{SandboxOptions{}};
    REQUIRE_MESSAGE(sb.start(make_boot({"/bin/sh", "-c", "kill -" + std::to_string(sig) + " 1; exec sleep 1000"})), sb.last_error());
    const proto::WorkloadExited x = next_exit(sb);
    CHECK(x.signal == SIGTERM);  // the workload's one SIGTERM (shutdown step 1)
    CHECK(sb.shutdown_powered_off());
    CHECK(sb.err().find("shutdown: begin: signal " + std::to_string(sig)) != std::string::npos);
  }
  {
    Sandbox sb{SandboxOptions{}};
    REQUIRE_MESSAGE(sb.start(make_boot({"/bin/sh", "-c", "trap 'echo GOT-USR1; exit 5' USR1; kill -USR1 1; while :; do sleep 0.05; done"})), sb.last_error());
    const proto::WorkloadExited x = next_exit(sb);
    CHECK(x == proto::WorkloadExited::code(5));
    CHECK(sb.shutdown_powered_off());
    CHECK(sb.out().find("GOT-USR1") != std::string::npos);
  }
}

TEST_CASE("not terminal: the init stays up after the exit, kill is harmless, shutdown ends it") {
  Sandbox sb{SandboxOptions{}};
  REQUIRE_MESSAGE(sb.start(make_boot({"/bin/sh", "-c", "exit 4"}, false)), sb.last_error());
  const proto::WorkloadExited x = next_exit(sb);
  CHECK(x.exit_code == 4);
  sb.send(proto::Kill{9});
  sb.send_raw("garbage\n");
  CHECK(sb.expect<proto::ProtocolError>());  // still serving the channel
  CHECK(sb.shutdown_powered_off());
}

TEST_CASE("hostname: set in its own UTS namespace; refused in the machine's") {
  {
    Sandbox sb({.unshare_args = {"--uts"}});
    auto b = make_boot({"/bin/sh", "-c", "echo HN=$(cat /proc/sys/kernel/hostname)"});
    b.hostname = "nesbox-test";
    REQUIRE_MESSAGE(sb.start(b), sb.last_error());
    REQUIRE(sb.expect<proto::WorkloadExited>());
    CHECK(sb.shutdown_powered_off());
    CHECK(sb.out().find("HN=nesbox-test\n") != std::string::npos);
  }
  char before[256] = {};
  ::gethostname(before, sizeof before - 1);
  {
    Sandbox sb{SandboxOptions{}};
    auto b = make_boot({"/bin/true"});
    b.hostname = "must-not-rename-the-machine";
    REQUIRE_MESSAGE(sb.start(b), sb.last_error());
    REQUIRE(sb.expect<proto::WorkloadExited>());
    CHECK(sb.shutdown_powered_off());
    CHECK(sb.err().find("shares the machine's UTS namespace") != std::string::npos);
  }
  char after[256] = {};
  ::gethostname(after, sizeof after - 1);
  CHECK(std::string(before) == std::string(after));
}

// ---- scenarios (tests/init/scenarios.md) ------------------------------------------

TEST_CASE("S1 merged SIGCHLD: workload and orphan exit together, 1000 runs, always exit_code 0") {
  int ok = 0, runs = 1000;
  for (int i = 0; i < runs; ++i) {
    // Vary the last sleep around the orphan's 10 ms so the two exits collide in every order.
    char last[32];
    std::snprintf(last, sizeof last, "%.4f", 0.0070 + 0.0002 * (i % 20));
    auto r = run_once({"bash", "-c", std::string("bash -c 'sleep 0.01 & kill -9 $BASHPID'; sleep ") + last});
    bool good = r.exited && *r.exited == proto::WorkloadExited::code(0) && powered_off(r.status);
    if (!good) {
      FAIL_CHECK("run " << i << " failed: exited=" << (r.exited ? proto::encode(proto::GuestMessage{*r.exited}) : "none"));
      break;
    }
    ++ok;
  }
  CHECK(ok == runs);
}

TEST_CASE("S2 every exit code 0..255") {
  for (int n = 0; n <= 255; ++n) {
    auto r = run_once({"sh", "-c", "exit " + std::to_string(n)});
    REQUIRE_MESSAGE(r.exited, "code " << n);
    CHECK(r.exited->exit_code == n);
    CHECK(!r.exited->signal);
    CHECK(powered_off(r.status));
  }
}

TEST_CASE("S3 killed by SIGTERM: signal 15, no exit_code, status 143") {
  auto r = run_once({"sh", "-c", "kill -TERM $$"});
  REQUIRE(r.exited);
  CHECK(r.exited->signal == 15);
  CHECK(!r.exited->exit_code);
  CHECK(proto::exit_status(*r.exited) == 143);
}

TEST_CASE("S4 killed by SIGKILL: signal 9, never 9 as a code, status 137") {
  auto r = run_once({"sh", "-c", "kill -9 $$"});
  REQUIRE(r.exited);
  CHECK(r.exited->signal == 9);
  CHECK(!r.exited->exit_code);
  CHECK(proto::exit_status(*r.exited) == 137);
}

TEST_CASE("S5 exec failures: not found (127), not executable (126), found through the descriptor's PATH") {
  auto nf = run_once({"/nonexistent"});
  REQUIRE(nf.start_failed);
  CHECK(nf.start_failed->cls == proto::StartFailClass::not_found);
  CHECK(nf.start_failed->err == ENOENT);
  CHECK(proto::exit_status(*nf.start_failed) == 127);
  CHECK(!nf.exited);
  CHECK(powered_off(nf.status));

  auto ne = run_once({"/etc/passwd"});
  REQUIRE(ne.start_failed);
  CHECK(ne.start_failed->cls == proto::StartFailClass::not_executable);
  CHECK(ne.start_failed->err == EACCES);
  CHECK(proto::exit_status(*ne.start_failed) == 126);

  // start_failed is final: no workload_exited follows it on the wire.
  Sandbox sb{SandboxOptions{}};
  const fs::path bin = sb.dir() / "bin";
  fs::create_directories(bin);
  std::ofstream(bin / "only-here") << "#!/bin/sh\necho ran-through-path\nexit 6\n";
  fs::permissions(bin / "only-here", fs::perms::owner_all);
  auto b = make_boot({"only-here"});
  b.exec.env = {{"PATH", "/nonexistent:" + bin.string()}};
  REQUIRE_MESSAGE(sb.start(b), sb.last_error());
  const proto::WorkloadExited x = next_exit(sb);
  CHECK(x.exit_code == 6);
  CHECK(sb.shutdown_powered_off());
  CHECK(sb.out().find("ran-through-path") != std::string::npos);

  Sandbox s2{SandboxOptions{}};
  REQUIRE(s2.accept());
  REQUIRE(s2.expect<proto::Ready>());
  s2.send(make_boot({"/nonexistent"}));
  REQUIRE(s2.expect<proto::Mounted>());
  REQUIRE(s2.expect<proto::StartFailed>());
  s2.send(proto::Shutdown{});
  CHECK(!s2.next());
  CHECK(s2.last_error() == "EOF");
  CHECK(powered_off(s2.wait_exit()));
}

TEST_CASE("S6 no SIGTERM handler, grace 60 s: stop kills it with 15, never 9") {
  Sandbox sb({.init_args = {"--grace-ms=60000"}});
  REQUIRE_MESSAGE(sb.start(make_boot({"sleep", "1000"})), sb.last_error());
  sb.send(proto::Stop{});
  const proto::WorkloadExited x = next_exit(sb);
  CHECK(x.signal == 15);
  CHECK(!x.exit_code);
  CHECK(sb.shutdown_powered_off());
  CHECK(sb.err().find("signal 9 to group") == std::string::npos);
}

TEST_CASE("S7 grandchild with a slow SIGTERM handler finishes before power-off") {
  Sandbox sb({.init_args = {"--grace-ms=4000"}});
  const std::string ok = (sb.dir() / "ok").string();
  const auto b = make_boot({"sh", "-c",
                            "sh -c \"trap \\\"sleep 1; echo CLEAN >" + ok +
                                "\\\" TERM; echo TRAP-SET; while :; do sleep 0.1; done\" & sleep 1000"});
  REQUIRE_MESSAGE(sb.start(b), sb.last_error());
  // The grandchild must have its handler before the shutdown is asked for.
  REQUIRE(sb.wait_stdout("TRAP-SET\n"));
  sb.send(proto::Shutdown{});
  const proto::WorkloadExited x = next_exit(sb);
  CHECK(x.signal == 15);  // the workload's own status
  CHECK(sb.shutdown_powered_off());
  std::ifstream f(ok);
  std::string line;
  std::getline(f, line);
  CHECK(line == "CLEAN");
}

TEST_CASE("S8 orphans never left as zombies") {
  Sandbox sb{SandboxOptions{}};
  const auto b = make_boot({"sh", "-c",
                            "for i in 1 2 3 4 5; do sh -c \"sh -c \\\"sleep 1\\\" &\" & wait; done; sleep 3; "
                            "echo ZOMBIES=$(grep -l '^State:.*Z' /proc/[0-9]*/status | wc -l)"});
  REQUIRE_MESSAGE(sb.start(b), sb.last_error());
  auto x = sb.expect<proto::WorkloadExited>(30000);
  REQUIRE(x);
  CHECK(x->exit_code == 0);
  CHECK(sb.shutdown_powered_off());
  CHECK(sb.out().find("ZOMBIES=0\n") != std::string::npos);
}

TEST_CASE("S10 exactly one SIGTERM: stop then shutdown, TERM1 once, never TERM2") {
  Sandbox sb({.init_args = {"--grace-ms=1500"}});
  REQUIRE_MESSAGE(sb.start(make_boot({"sh", "-c", "n=0; trap 'n=$((n+1)); echo TERM$n' TERM; echo READY; while :; do sleep 0.1; done"})), sb.last_error());
  REQUIRE(sb.wait_stdout("READY\n"));
  sb.send(proto::Stop{});
  REQUIRE(sb.wait_stdout("TERM1\n"));
  sb.send(proto::Shutdown{});
  const proto::WorkloadExited x = next_exit(sb);
  CHECK(x.signal == 9);  // it ignored the one SIGTERM; grace over, SIGKILL
  CHECK(sb.shutdown_powered_off());
  CHECK(count(sb.out(), "TERM1") == 1);
  CHECK(sb.out().find("TERM2") == std::string::npos);
  CHECK(count(sb.err(), "signal 15 to group") == 1);
}

TEST_CASE("S11 the exit code survives the shutdown: acked by EOF, and by ack timeout") {
  {
    Sandbox sb{SandboxOptions{}};
    REQUIRE_MESSAGE(sb.start(make_boot({"false"})), sb.last_error());
    const proto::WorkloadExited x = next_exit(sb);
    CHECK(x == proto::WorkloadExited::code(1));
    sb.close_channel();
    CHECK(powered_off(sb.wait_exit()));
  }
  {
    Sandbox sb({.init_args = {"--ack-timeout-ms=300"}});
    REQUIRE_MESSAGE(sb.start(make_boot({"false"})), sb.last_error());
    const proto::WorkloadExited x = next_exit(sb);
    CHECK(x == proto::WorkloadExited::code(1));
    // No ack: the init powers off after ack_timeout_ms; nothing replaces the outcome.
    CHECK(!sb.next());
    CHECK(sb.last_error() == "EOF");
    CHECK(powered_off(sb.wait_exit()));
    CHECK(sb.err().find("no acknowledgement within 300 ms") != std::string::npos);
  }
}
