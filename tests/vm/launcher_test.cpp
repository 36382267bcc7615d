// Unit tests of host/vm: QEMU argv, kernel command line, the process launcher (session, death
// signal, descriptors, output drain, kill on every path) and the accelerator choice. Real
// processes, no QEMU (the microVM itself is exercised by tests/vm/run-vm-tests.sh).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "host/vm/accel.hpp"
#include "host/vm/console.hpp"
#include "host/vm/daemon.hpp"
#include "host/vm/passt.hpp"
#include "host/vm/process.hpp"
#include "host/vm/qemu_argv.hpp"
#include "host/vm/sha256.hpp"
#include "host/vm/snapshot.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/vm/capture.hpp"

using namespace nes::vm;
using namespace std::chrono_literals;
using nes::test::Capture;

namespace {

/// A temp directory removed on every path, where a test writes fake VMMs as shell scripts.
struct TempDir : nes::test::TempDir {
  /// An executable `#!/bin/sh` script NAME running `body`.
  std::filesystem::path script(const std::string& name, const std::string& body) {
    auto p = path / name;
    std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
    ::chmod(p.c_str(), 0755);
    return p;
  }
};

bool has_pair(const std::vector<std::string>& a, const std::string& k, const std::string& v) {
  for (std::size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == k && a[i + 1] == v) return true;
  return false;
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

/// LaunchOptions for argv with an optional console sink.
LaunchOptions opts(std::vector<std::string> argv, ByteSink console = {}) {
  LaunchOptions o;
  o.argv = std::move(argv);
  o.console = std::move(console);
  return o;
}

QemuSpec base_spec() {
  QemuSpec s;
  s.kernel = "/k/vmlinuz";
  s.initrd = "/k/initrd.cpio";
  s.append = "console=ttyS0";
  s.channel_socket = "/run/x/channel.sock";
  return s;
}

}  // namespace

TEST_CASE("kernel_cmdline: quiet keeps kernel messages off the console by log level") {
  KernelCmdline c;  // tcg_words false by default: KVM, 2+ vCPUs
  CHECK(kernel_cmdline(c) ==
        "console=ttyS0 quiet loglevel=0 panic=-1 cryptomgr.notests no_timer_check nesinit.channel=virtio-port:nes.0");
  c.console = ConsoleLevel::full;
  c.extra = {"nesinit.log=debug"};
  CHECK(kernel_cmdline(c) ==
        "console=ttyS0 loglevel=7 panic=-1 cryptomgr.notests no_timer_check nesinit.channel=virtio-port:nes.0 nesinit.log=debug");
}

TEST_CASE("kernel_cmdline: under TCG the HPET ticks and a 1-vCPU kernel keeps its SMP lock prefixes") {
  KernelCmdline c;
  c.tcg_words = true;  // the planner's choice for a 1-vCPU TCG guest
  CHECK(kernel_cmdline(c) ==
        "console=ttyS0 quiet loglevel=0 panic=-1 cryptomgr.notests no_timer_check nolapic_timer noreplace-smp "
        "nesinit.channel=virtio-port:nes.0");
  c.tcg_words = false;
  CHECK(kernel_cmdline(c).find("nolapic_timer") == std::string::npos);
  CHECK(kernel_cmdline(c).find("noreplace-smp") == std::string::npos);
}

TEST_CASE("qemu_argv: the measured q35 recipe with the channel as virtio-serial port nes.0") {
  auto r = qemu_argv(base_spec());
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  const auto& a = *r;
  CHECK(a.at(0) == "qemu-system-x86_64");
  CHECK(has_pair(a, "-M", "q35"));
  CHECK(has_pair(a, "-accel", "tcg"));
  CHECK(has_pair(a, "-m", "256"));
  CHECK(has_pair(a, "-smp", "1"));
  CHECK(std::find(a.begin(), a.end(), "-no-reboot") != a.end());
  CHECK(std::find(a.begin(), a.end(), "-nodefaults") != a.end());
  CHECK(has_pair(a, "-kernel", "/k/vmlinuz"));
  CHECK(has_pair(a, "-initrd", "/k/initrd.cpio"));
  CHECK(has_pair(a, "-append", "console=ttyS0"));
  CHECK(has_pair(a, "-serial", "chardev:con0"));
  CHECK(has_pair(a, "-chardev", "socket,id=nes0,server=off,path=/run/x/channel.sock"));
  CHECK(has_pair(a, "-device", "virtserialport,bus=vser0.0,chardev=nes0,name=nes.0"));
  CHECK(std::find(a.begin(), a.end(), "-cpu") == a.end());  // tcg: QEMU's default model
}

TEST_CASE("qemu_argv: TCG's translation buffer as tb-size, under TCG only, bounded") {
  auto s = base_spec();
  s.tcg_tb_mib = 16;
  auto r = qemu_argv(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(has_pair(*r, "-accel", "tcg,tb-size=16"));
  s.accel = Accel::kvm;
  r = qemu_argv(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(has_pair(*r, "-accel", "kvm"));
  s.accel = Accel::tcg;
  s.tcg_tb_mib = 65537;
  r = qemu_argv(s);
  REQUIRE(!r.ok());
  CHECK(r.error().message == "tcg_tb_mib: 65537 MiB is outside 0..65536");
}

TEST_CASE("qemu_argv: free page reporting is a virtio-balloon device, only when asked") {
  auto s = base_spec();
  auto r = qemu_argv(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(std::find_if(r->begin(), r->end(), [](const std::string& x) { return x.find("balloon") != std::string::npos; }) == r->end());
  s.free_page_reporting = true;
  r = qemu_argv(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(has_pair(*r, "-device", "virtio-balloon-pci,id=balloon0,free-page-reporting=on"));
}

TEST_CASE("qemu_argv: kvm, sizes, no initrd, comma in the socket path") {
  auto s = base_spec();
  s.accel = Accel::kvm;
  s.mem_mib = 512;
  s.cpus = 2;
  s.initrd.reset();
  s.channel_socket = "/tmp/a,b/ch.sock";
  auto r = qemu_argv(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(has_pair(*r, "-accel", "kvm"));
  CHECK(has_pair(*r, "-cpu", "host"));
  CHECK(has_pair(*r, "-m", "512"));
  CHECK(has_pair(*r, "-smp", "2"));
  CHECK(std::find(r->begin(), r->end(), "-initrd") == r->end());
  CHECK(has_pair(*r, "-chardev", "socket,id=nes0,server=off,path=/tmp/a,,b/ch.sock"));
}

TEST_CASE("qemu_argv: bad fields are named, no argv is built") {
  auto check = [](QemuSpec s, const char* field) {
    auto r = qemu_argv(s);
    CHECK(!r.ok());
    CHECK_MESSAGE(r.error().message.rfind(field, 0) == 0, r.error().message);
  };
  auto s = base_spec();
  s.kernel.clear();
  check(s, "kernel:");
  s = base_spec();
  s.mem_mib = 16;
  check(s, "mem_mib:");
  s = base_spec();
  s.cpus = 0;
  check(s, "cpus:");
  s = base_spec();
  s.accel = Accel::auto_probe;
  check(s, "accel:");
  s = base_spec();
  s.port_name = "nes 0";
  check(s, "port_name:");
  s = base_spec();
  s.channel_socket = "/" + std::string(120, 'x');
  check(s, "channel_socket:");
}

TEST_CASE("qemu_argv: the data channel as a second port nes.1 on its own chardev socket") {
  auto s = base_spec();
  s.data_socket = "/run/x/data.sock";
  auto r = qemu_argv(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(has_pair(*r, "-chardev", "socket,id=nes1,server=off,path=/run/x/data.sock"));
  CHECK(has_pair(*r, "-device", "virtserialport,bus=vser0.0,chardev=nes1,name=nes.1"));
  CHECK(has_pair(*r, "-device", "virtserialport,bus=vser0.0,chardev=nes0,name=nes.0"));
  s.data_port_name = "nes.0";
  CHECK(qemu_argv(s).error().message.rfind("data_port_name:", 0) == 0);
  s = base_spec();
  s.channel_socket.reset();
  s.data_socket = "/run/x/data.sock";
  CHECK(qemu_argv(s).error().message.rfind("data_socket:", 0) == 0);
}

TEST_CASE("qemu_argv: chardev_reconnect_s makes both chardevs redial a restarted listener") {
  auto s = base_spec();
  s.data_socket = "/run/x/data.sock";
  s.chardev_reconnect_s = 1;
  auto r = qemu_argv(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(has_pair(*r, "-chardev", "socket,id=nes0,server=off,reconnect=1,path=/run/x/channel.sock"));
  CHECK(has_pair(*r, "-chardev", "socket,id=nes1,server=off,reconnect=1,path=/run/x/data.sock"));
}

TEST_CASE("qemu_argv: net_args are appended as -netdev/-device pairs; anything else is refused") {
  QemuSpec s = base_spec();
  auto none = qemu_argv(s);
  REQUIRE(none.ok());
  CHECK(std::find(none->begin(), none->end(), "-netdev") == none->end());
  s.net_args = {"-netdev", "stream,id=net0,server=off,addr.type=fd,addr.str=3", "-device",
                "virtio-net-pci,netdev=net0,mac=52:54:00:12:34:56,romfile="};
  auto a = qemu_argv(s);
  REQUIRE(a.ok());
  CHECK(std::vector<std::string>(a->end() - 4, a->end()) == s.net_args);
  for (auto bad : {std::vector<std::string>{"-netdev"}, {"-chardev", "x"}, {"-netdev", ""}, {"-netdev", "-device"}}) {
    s.net_args = bad;
    auto r = qemu_argv(s);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.starts_with("net_args"));
  }
}

TEST_CASE("qemu_argv: block devices as raw virtio-blk disks named by serial, read-only by default; bad ones named") {
  QemuSpec s = base_spec();
  s.block_devices = {BlockDevice{"/img/a,b.erofs", "nes.root"}, BlockDevice{"/vm/upper.ext4", "nes.upper", false}};
  auto r = qemu_argv(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(has_pair(*r, "-drive", "file=/img/a,,b.erofs,if=none,id=blk0,format=raw,readonly=on"));
  CHECK(has_pair(*r, "-device", "virtio-blk-pci,drive=blk0,serial=nes.root"));
  CHECK(has_pair(*r, "-drive", "file=/vm/upper.ext4,if=none,id=blk1,format=raw,readonly=off"));
  CHECK(has_pair(*r, "-device", "virtio-blk-pci,drive=blk1,serial=nes.upper"));
  // Built in with snapshot_layout too (a disk migrates), before the hot-plug ports.
  s.snapshot_layout = true;
  s.ram_file = QemuSpec::RamFile{"/vm/ram", true};
  r = qemu_argv(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  auto blk = std::find(r->begin(), r->end(), "virtio-blk-pci,drive=blk1,serial=nes.upper");
  auto rp0 = std::find(r->begin(), r->end(), "pcie-root-port,id=rp0,bus=pcie.0,chassis=1");
  REQUIRE(blk != r->end());
  REQUIRE(rp0 != r->end());
  CHECK(blk < rp0);
  auto err = [](QemuSpec x) {
    auto e = qemu_argv(x);
    return e.ok() ? std::string() : e.error().message;
  };
  for (const char* bad : {"", "a b", "a,b", "123456789012345678901"}) {
    CAPTURE(bad);
    s = base_spec();
    s.block_devices = {BlockDevice{"/img/r", bad}};
    CHECK(err(s).starts_with("block_devices[0].serial:"));
  }
  s = base_spec();
  s.block_devices = {BlockDevice{"/img/r", std::string(20, 's')}, BlockDevice{"", "b"}};
  CHECK(err(s).starts_with("block_devices[1].path: empty"));
  s.block_devices = {BlockDevice{"/img/r", "a"}, BlockDevice{"/img/s", "a"}};
  CHECK(err(s) == "block_devices[1].serial: 'a' twice");
}

TEST_CASE("accel names round-trip") {
  for (auto a : {Accel::tcg, Accel::kvm, Accel::auto_probe})
    CHECK(accel_from_string(to_string(a)) == a);
  CHECK_FALSE(accel_from_string("hvf").has_value());
}

TEST_CASE("launch: stdout and stderr drained separately to EOF, exit code reported") {
  Capture out, err;
  LaunchOptions o;
  o.argv = {"/bin/sh", "-c", "echo to-console; echo to-stderr >&2; exit 3"};
  o.console = out.sink();
  o.diagnostics = err.sink();
  auto p = VmProcess::launch(std::move(o));
  REQUIRE(p.ok());
  auto e = (*p)->wait_for(10s);
  REQUIRE(e.has_value());
  CHECK(e->code == 3);
  CHECK_FALSE(e->signal.has_value());
  CHECK((*p)->finish_output(5s));
  CHECK(out.get() == "to-console\n");
  CHECK(err.get() == "to-stderr\n");
  CHECK((*p)->diagnostics_tail() == "to-stderr\n");
  CHECK((*p)->wait_for(0ms) == e);  // idempotent after the reap
}

TEST_CASE("launch: a missing program is an error naming it, nothing left running") {
  auto p = VmProcess::launch(opts({"/nonexistent/qemu-system-x86_64"}));
  REQUIRE_FALSE(p.ok());
  CHECK(p.error().message.find("/nonexistent/qemu-system-x86_64") != std::string::npos);
  auto q = VmProcess::launch(opts({"nes-no-such-program-xyz"}));
  REQUIRE_FALSE(q.ok());
  CHECK(q.error().message.find("nes-no-such-program-xyz") != std::string::npos);
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);  // ECHILD: no child exists at all
}

TEST_CASE("launch: own session, stdin /dev/null, only fds 0-2, signal state reset") {
  // Ignore SIGINT here and block SIGUSR1: the child must not inherit either.
  struct sigaction ign {}, old {};
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGINT, &ign, &old);
  sigset_t usr1, oldmask;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &usr1, &oldmask);
  // A descriptor without CLOEXEC must not leak either.
  int leaky = ::open("/dev/null", O_RDONLY);

  Capture out;
  LaunchOptions o;
  o.argv = {"/bin/sh", "-c",
            "ls /proc/self/fd | tr '\\n' ' '; echo; readlink /proc/self/fd/0;"
            " grep -E '^(SigIgn|SigBlk)' /proc/self/status; cut -d' ' -f6 /proc/self/stat;"
            " echo pid=$$"};
  o.console = out.sink();
  auto p = VmProcess::launch(std::move(o));
  ::close(leaky);
  ::sigaction(SIGINT, &old, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &oldmask, nullptr);
  REQUIRE(p.ok());
  REQUIRE((*p)->wait_for(10s).has_value());
  REQUIRE((*p)->finish_output(5s));
  std::istringstream s(out.get());
  std::string fds, stdin_target, ign_line, blk_line, sid, pidline;
  std::getline(s, fds);
  std::getline(s, stdin_target);
  std::getline(s, ign_line);
  std::getline(s, blk_line);
  std::getline(s, sid);
  std::getline(s, pidline);
  // ls sees 0 1 2 and its own directory fd (3): nothing of ours.
  CHECK(fds == "0 1 2 3 ");
  CHECK(stdin_target == "/dev/null");
  CHECK(ign_line.find("0000000000000000") != std::string::npos);
  CHECK(blk_line.find("0000000000000000") != std::string::npos);
  CHECK(pidline == "pid=" + sid);  // session id == its own pid: setsid() ran
  CHECK(sid == std::to_string((*p)->pid()));
}

TEST_CASE("launch: fds are passed at their numbers, nothing else leaks; bad entries are refused") {
  int sp[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0);
  nes::host::Fd ours(sp[0]), theirs(sp[1]);
  Capture out;
  LaunchOptions o;
  // ls shows the numbers the child has (its own directory fd takes 3, the lowest free one); then
  // it answers through fd 5 what it read there.
  o.argv = {"/bin/sh", "-c", "ls /proc/self/fd | tr '\\n' ' '; echo; read x <&5; echo \"got:$x\" >&5"};
  o.console = out.sink();
  o.fds = {{theirs.get(), 5}};
  auto p = VmProcess::launch(std::move(o));
  REQUIRE(p.ok());
  theirs.reset();  // the child holds its own copy
  REQUIRE(::write(ours.get(), "ping\n", 5) == 5);
  char buf[64] = {};
  std::string got;
  while (got.find('\n') == std::string::npos) {
    ssize_t n = ::read(ours.get(), buf, sizeof buf);
    REQUIRE(n > 0);
    got.append(buf, static_cast<std::size_t>(n));
  }
  CHECK(got == "got:ping\n");
  auto e = (*p)->wait_for(10s);
  REQUIRE(e.has_value());
  CHECK(e->code == 0);
  REQUIRE((*p)->finish_output(5s));
  CHECK(out.get() == "0 1 2 3 5 \n");
  // Its exit closed its copy: EOF here.
  CHECK(::read(ours.get(), buf, sizeof buf) == 0);

  for (auto bad : {std::vector<std::pair<int, int>>{{ours.get(), 2}}, {{ours.get(), 1024}},
                   {{ours.get(), 4}, {ours.get(), 4}}, {{-1, 4}}}) {
    LaunchOptions b = opts({"/bin/true"});
    b.fds = bad;
    auto q = VmProcess::launch(std::move(b));
    REQUIRE_FALSE(q.ok());
    CHECK(q.error().message.starts_with("fds["));
  }
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);  // ECHILD: nothing was started
}

TEST_CASE("passt_version_date: Debian's and upstream's version texts") {
  using nes::vm::passt_version_date;
  CHECK(passt_version_date("passt 0.0~git20260728.f8df3f1-1~bpo13+1") == 20260728);
  CHECK(passt_version_date("passt 0.0~git20230309.7c7625d-1") == 20230309);
  CHECK(passt_version_date("passt 2025_05_03.587980c") == 20250503);
  CHECK(passt_version_date("passt 0^20250503.g587980c-1.fc42") == 20250503);  // Fedora's
  CHECK_FALSE(passt_version_date("passt 1.2.3"));
  CHECK_FALSE(passt_version_date("passt 120260728"));   // inside a longer number
  CHECK_FALSE(passt_version_date("passt 0.0~git20261328"));  // month 13
  CHECK_FALSE(passt_version_date(""));
}

TEST_CASE("check_passt: found, and at least kPasstMinVersion by its --version; each refusal says why") {
  TempDir dir;
  auto version = [&](const char* name, const char* text) {
    return dir.script(name, std::string("echo '") + text + "'; echo 'Copyright Red Hat'").string();
  };
  CHECK(check_passt(version("new", "passt 0.0~git20260728.f8df3f1-1~bpo13+1")));
  CHECK(check_passt(version("upstream", "passt 2026_10_02.cba3570")));
  auto old = check_passt(version("old", "passt 0.0~git20230309.7c7625d-1"));
  REQUIRE_FALSE(old);
  CHECK(old.error().message.find("is 'passt 0.0~git20230309.7c7625d-1': passt older than 20260728 loses") !=
        std::string::npos);
  CHECK(old.error().message.find("--network slirp|none") != std::string::npos);
  auto odd = check_passt(version("odd", "something else"));
  REQUIRE_FALSE(odd);
  CHECK(odd.error().message.find("names no passt version ('something else')") != std::string::npos);
  auto missing = check_passt((dir.path / "absent").string());
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message.starts_with("--network user needs passt ("));
  // One that never answers: bounded, then killed (and reaped).
  auto slow = check_passt(dir.script("slow", "exec sleep 60").string(), 200ms);
  REQUIRE_FALSE(slow);
  CHECK(slow.error().message.find("--version did not answer in 200 ms") != std::string::npos);
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);  // ECHILD: every run was reaped
}

TEST_CASE("passt: ready once its PID file is written; an early exit is reported with its stderr") {
  TempDir dir;
  nes::host::NetworkSpec net;
  net.mode = nes::host::NetworkMode::passt;
  net.publish.push_back(*nes::host::parse_publish("127.0.0.1:8080:80"));
  PasstOptions o;
  o.network = net;
  o.tmp_dir = dir.path;
  o.log = dir.path / "passt.log";
  // A stand-in: writes the PID file it is given, serves fd 3 until its peer closes.
  o.program = dir.script("passt-ok",
                         "while [ $# -gt 0 ]; do [ \"$1\" = --pid ] && p=$2; shift; done\n"
                         "echo started >&2; echo $$ > \"$p\"; cat <&3 >/dev/null; echo done >&2").string();
  {
    auto p = Passt::start(o, 10s);
    REQUIRE(p.ok());
    CHECK((*p)->qemu_fd() >= 0);
    auto e = (*p)->stop(10s);  // closes QEMU's end: the stand-in sees EOF and exits
    CHECK(e.code == 0);
  }
  std::ifstream log(o.log);
  std::string text((std::istreambuf_iterator<char>(log)), {});
  CHECK(text == "started\ndone\n");
  // No log yet: its output is kept, then written first once log_to() names the file.
  {
    PasstOptions later = o;
    later.log.clear();
    auto p = Passt::start(later, 10s);
    REQUIRE(p.ok());
    (*p)->log_to(nes::host::Fd(::open((dir.path / "later.log").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600)));
    CHECK((*p)->stop(10s).code == 0);
  }
  std::ifstream later_log(dir.path / "later.log");
  CHECK(std::string((std::istreambuf_iterator<char>(later_log)), {}) == "started\ndone\n");
  // The readiness directory is gone.
  for (auto& e : std::filesystem::directory_iterator(dir.path))
    CHECK(e.path().filename().string().find("neshost-passt-") == std::string::npos);

  o.program = dir.script("passt-busy",
                         "echo 'Failed to send 67 bytes to syslog' >&2\n"
                         "echo \"Failed to bind any port for '-t 127.0.0.1/8080:80', exiting\" >&2; exit 1").string();
  auto bad = Passt::start(o, 10s);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message ==
        "passt exited with code 1: Failed to bind any port for '-t 127.0.0.1/8080:80', exiting");

  o.program = (dir.path / "no-passt").string();
  auto missing = Passt::start(o, 10s);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.starts_with("--network user needs passt ("));
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);  // every stand-in was reaped
}

TEST_CASE("daemon_last_lines: trimmed lines joined, skipped ones left out, the last ones kept whole") {
  CHECK(daemon_last_lines("") == "");
  CHECK(daemon_last_lines("a  \n\n b\r\n") == "a  b");
  auto noise = [](std::string_view l) { return l.starts_with("noise"); };
  CHECK(daemon_last_lines("noise 1\nfirst\nnoise 2\nsecond\n", 600, noise) == "first second");
  CHECK(daemon_last_lines("one\ntwo\nthree\n", 9) == "... two three");
  CHECK(daemon_last_lines("one\ntwo\nthree\n", 13) == "one two three");
  CHECK(daemon_last_lines("short\n0123456789\n", 4) == "... 6789");
}

TEST_CASE("wait_ready: ready once confirmed, an exit with its stderr, a silent daemon ended at the bound") {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0);
  nes::host::Fd rd(p[0]), wr(p[1]);
  {
    // Readable but not confirmed: keeps waiting; the second byte confirms.
    auto d = VmProcess::launch(opts({"/bin/sleep", "100"}));
    REQUIRE(d.ok());
    int calls = 0;
    REQUIRE(::write(wr.get(), "x", 1) == 1);
    auto confirm = [&] {
      char c;
      while (::read(rd.get(), &c, 1) == 1) {}
      if (++calls == 1) REQUIRE(::write(wr.get(), "y", 1) == 1);
      return calls == 2;
    };
    auto w = wait_ready(**d, rd.get(), 10s, confirm);
    CHECK(w.outcome == DaemonWait::Outcome::ready);
    CHECK(calls == 2);
    CHECK(w.tail.empty());
    CHECK(stop_daemon(**d, 0ms).signal == SIGTERM);
  }
  {
    auto d = VmProcess::launch(opts({"/bin/sh", "-c", "echo 'it failed' >&2; exit 3"}));
    REQUIRE(d.ok());
    auto w = wait_ready(**d, rd.get(), 10s);
    CHECK(w.outcome == DaemonWait::Outcome::exited);
    CHECK(w.exit == ProcessExit{3, std::nullopt});
    CHECK(w.tail == "it failed\n");
  }
  {
    auto d = VmProcess::launch(opts({"/bin/sleep", "100"}));
    REQUIRE(d.ok());
    auto w = wait_ready(**d, rd.get(), 300ms);
    CHECK(w.outcome == DaemonWait::Outcome::timed_out);
    CHECK((*d)->exit_status().has_value());
  }
  {
    // stop_daemon: one that exits by itself within the grace is not signalled.
    auto d = VmProcess::launch(opts({"/bin/sh", "-c", "exit 0"}));
    REQUIRE(d.ok());
    CHECK(stop_daemon(**d, 10s).code == 0);
  }
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);  // every process was reaped
}

TEST_CASE("terminate: SIGTERM first; a process ignoring it is SIGKILLed after the grace") {
  {
    auto p = VmProcess::launch(opts({"/bin/sleep", "100"}));
    REQUIRE(p.ok());
    auto e = (*p)->terminate(5s);
    CHECK(e.signal == SIGTERM);
  }
  {
    Capture out;
    // Announce readiness after installing the trap, so the SIGTERM cannot arrive before it.
    auto p = VmProcess::launch(
        opts({"/bin/sh", "-c", "trap '' TERM; echo armed; exec sleep 100"}, out.sink()));
    REQUIRE(p.ok());
    // Wait (bounded) for the trap to be in place: the child says so on stdout.
    REQUIRE(out.wait_for_text("armed\n", 10s));
    pid_t pid = (*p)->pid();
    auto e = (*p)->terminate(200ms);
    CHECK(e.signal == SIGKILL);
    CHECK_FALSE(alive(pid));
  }
}

TEST_CASE("destructor: a running process is killed and reaped, its output thread joined") {
  pid_t pid;
  {
    auto p = VmProcess::launch(opts({"/bin/sleep", "100"}));
    REQUIRE(p.ok());
    pid = (*p)->pid();
    CHECK(alive(pid));
  }
  CHECK_FALSE(alive(pid));  // reaped: the pid no longer exists
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);
}

TEST_CASE("death signal: the child dies when its launcher process dies") {
  // We become a subreaper so the orphaned grandchild is reparented to us and can be reaped here.
  REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  int pfd[2];
  REQUIRE(::pipe(pfd) == 0);
  pid_t helper = ::fork();
  REQUIRE(helper >= 0);
  if (helper == 0) {
    ::close(pfd[0]);
    auto p = VmProcess::launch(opts({"/bin/sleep", "100"}));
    pid_t gc = p.ok() ? (*p)->pid() : -1;
    [[maybe_unused]] auto n = ::write(pfd[1], &gc, sizeof gc);
    ::raise(SIGKILL);  // die without running any destructor
  }
  ::close(pfd[1]);
  pid_t gc = -1;
  REQUIRE(::read(pfd[0], &gc, sizeof gc) == sizeof gc);
  ::close(pfd[0]);
  REQUIRE(gc > 0);
  int st = 0;
  REQUIRE(::waitpid(helper, &st, 0) == helper);
  CHECK(WIFSIGNALED(st));
  // The grandchild got PR_SET_PDEATHSIG's SIGKILL; waiting for it ends as soon as it is dead.
  REQUIRE(::waitpid(gc, &st, 0) == gc);
  CHECK(WIFSIGNALED(st));
  CHECK(WTERMSIG(st) == SIGKILL);
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_CASE("accel: explicit choices are kept; auto follows the probe") {
  std::string why;
  int probes = 0;
  auto yes = [&] { ++probes; return KvmProbe{true, "ok"}; };
  auto no = [&] { ++probes; return KvmProbe{false, "guest hung"}; };
  CHECK(resolve_accel(Accel::tcg, yes, &why) == Accel::tcg);
  CHECK(resolve_accel(Accel::kvm, no, &why) == Accel::kvm);
  CHECK(probes == 0);
  CHECK(resolve_accel(Accel::auto_probe, yes, &why) == Accel::kvm);
  CHECK(resolve_accel(Accel::auto_probe, no, &why) == Accel::tcg);
  CHECK(why == "guest hung");
  CHECK(probes == 2);
}

TEST_CASE("accel: the probe's verdict is kept per boot, key and age; anything else means a new probe") {
  nes::test::TempDir d;
  const auto file = d.path / "neshost" / "kvm-probe";  // its directory is created on store
  const auto kernel = d.path / "vmlinuz";
  std::ofstream(kernel) << "kernel";
  const std::string key = probe_key("qemu-system-x86_64", kernel);
  REQUIRE(!key.empty());
  CHECK(key.find(std::filesystem::canonical(kernel).native() + " 6 ") != std::string::npos);  // path, size
  CHECK(!cached_probe(file, key, 1000));  // nothing stored yet
  store_probe(file, key, {true, "a KVM probe guest booted"}, 1000);
  auto c = cached_probe(file, key, 1000 + 86400);  // a usable verdict holds for the boot
  REQUIRE(c);
  CHECK(c->usable);
  CHECK(c->reason == "a KVM probe guest booted (cached from a probe 86400 s ago)");
  CHECK(!cached_probe(file, key + "x", 1001));  // another kernel, QEMU or boot
  CHECK(!cached_probe(file, key, 999));          // from the future: not trusted
  store_probe(file, key, {false, "hung\nat the deadline"}, 2000);
  c = cached_probe(file, key, 2000 + kUnusableTtl.count() - 1);
  REQUIRE(c);
  CHECK(!c->usable);
  CHECK(c->reason.starts_with("hung at the deadline (cached"));  // one line, whatever was given
  CHECK(!cached_probe(file, key, 2000 + kUnusableTtl.count()));  // an unusable verdict expires
  // A changed kernel image is another key.
  std::ofstream(kernel) << "kernel, rebuilt";
  CHECK(probe_key("qemu-system-x86_64", kernel) != key);
  // A garbled or truncated file is no verdict.
  for (const char* bad : {"", "key only\n", "K\nmaybe\n1\nr\n", "K\nusable\n1x\nr\n", "K\nusable\n1\nno newline"}) {
    std::ofstream(file, std::ios::trunc) << bad;
    CHECK_MESSAGE(!cached_probe(file, "K", 5), bad);
  }
  CHECK(!cached_probe("", key, 5));
  CHECK(!cached_probe(file, "", 5));
  CHECK(std::distance(std::filesystem::directory_iterator(file.parent_path()), {}) == 1);  // no temp left
}

TEST_CASE("probe_kvm_boot_cached: device first; then the cached verdict, else one probe boot stored") {
  nes::test::TempDir d;
  const auto cache = d.path / "neshost" / "kvm-probe";
  const auto kernel = d.path / "vmlinuz";
  std::ofstream(kernel) << "kernel";
  int devices = 0, boots = 0;
  bool device_ok = false;
  KvmProbe verdict{true, "a KVM probe guest booted"};
  auto device = [&] { ++devices; return KvmProbe{device_ok, device_ok ? "dev ok" : "no /dev/kvm"}; };
  auto boot = [&] { ++boots; return verdict; };
  auto probe = [&](const std::filesystem::path& c, std::int64_t now) {
    return probe_kvm_boot_cached("qemu-system-x86_64", kernel, c, now, device, boot);
  };
  // No usable device: its verdict as is, no boot, nothing stored.
  auto r = probe(cache, 1000);
  CHECK_FALSE(r.usable);
  CHECK(r.reason == "no /dev/kvm");
  CHECK(boots == 0);
  CHECK_FALSE(std::filesystem::exists(cache));
  // A usable device: one probe boot, its verdict stored, then served from the cache.
  device_ok = true;
  r = probe(cache, 1000);
  CHECK(r.usable);
  CHECK(r.reason == "a KVM probe guest booted");
  CHECK(boots == 1);
  r = probe(cache, 1010);
  CHECK(r.usable);
  CHECK(r.reason == "a KVM probe guest booted (cached from a probe 10 s ago)");
  CHECK(boots == 1);
  CHECK(devices == 3);  // the device is checked every time: it costs nothing
  // An unusable verdict is served until kUnusableTtl, then the guest is booted again.
  std::ofstream(kernel) << "kernel, rebuilt";  // a new key
  verdict = {false, "hung"};
  r = probe(cache, 2000);
  CHECK_FALSE(r.usable);
  CHECK(boots == 2);
  r = probe(cache, 2000 + kUnusableTtl.count() - 1);
  CHECK(r.reason.starts_with("hung (cached"));
  CHECK(boots == 2);
  verdict = {true, "booted now"};
  r = probe(cache, 2000 + kUnusableTtl.count());
  CHECK(r.usable);
  CHECK(boots == 3);
  // No cache: a probe boot every time.
  probe({}, 3000);
  probe({}, 3000);
  CHECK(boots == 5);
}

TEST_CASE("accel: /dev/kvm checks refuse what is not a KVM device") {
  auto r = kvm_device_usable("/nonexistent/kvm");
  CHECK_FALSE(r.usable);
  CHECK(r.reason.find("/nonexistent/kvm") != std::string::npos);
  auto n = kvm_device_usable("/dev/null");
  CHECK_FALSE(n.usable);
  CHECK(n.reason.find("KVM_GET_API_VERSION") != std::string::npos);
}

TEST_CASE("probe_kvm_boot: a guest that panics as expected is usable; a hung one is not") {
  TempDir d;
  auto good = d.script("qemu-good", "echo '[ 0.5] Kernel panic - not syncing: VFS: Unable to mount root fs'");
  auto hang = d.script("qemu-hang", "exec sleep 100");
  auto odd = d.script("qemu-odd", "echo 'qemu: something else' >&2; exit 1");
  CHECK(probe_kvm_boot(good, "/k/vmlinuz", 10s).usable);
  auto h = probe_kvm_boot(hang, "/k/vmlinuz", 300ms);
  CHECK_FALSE(h.usable);
  CHECK(h.reason.find("hung") != std::string::npos);
  auto o = probe_kvm_boot(odd, "/k/vmlinuz", 10s);
  CHECK_FALSE(o.usable);
  CHECK(o.reason.find("exited with code 1") != std::string::npos);
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);
}

TEST_CASE("CrlfToLf: the serial line's CRLF becomes LF, across any chunk split") {
  const std::string in = "a\r\nb\rc\r\r\nd\r";
  const std::string want = "a\nb\rc\r\nd\r";
  for (std::size_t cut = 0; cut <= in.size(); ++cut) {
    CrlfToLf c;
    std::string got = c.feed(in.substr(0, cut));
    got += c.feed(in.substr(cut));
    got += c.finish();
    CHECK_MESSAGE(got == want, "split at " << cut);
  }
  CrlfToLf c;
  CHECK(c.feed("\r") == "");
  CHECK(c.feed("\n") == "\n");
  CHECK(c.finish() == "");
}

// ---- a VMM that outlives us (docs/host.md "Re-adoption") ----

TEST_CASE("launch: before_exec runs between fork and exec; its error kills the child, nothing runs") {
  TempDir t;
  auto prog = t.script("vmm", "echo ran; exec sleep 30");
  pid_t seen = 0;
  std::string cmd_at_gate;
  auto o = opts({prog.string()});
  o.death_signal = 0;
  o.before_exec = [&](pid_t pid) -> nes::host::Status {
    seen = pid;
    // Not exec'd yet: the child is still a copy of this test (its exe is ours).
    std::error_code ec;
    cmd_at_gate = std::filesystem::read_symlink(fmt::format("/proc/{}/exe", pid), ec).string();
    return nes::host::Ok{};
  };
  Capture out;
  o.console = out.sink();
  auto p = VmProcess::launch(std::move(o));
  REQUIRE(p);
  CHECK(seen == (*p)->pid());
  CHECK(cmd_at_gate == std::filesystem::read_symlink("/proc/self/exe").string());
  CHECK(out.wait_for_text("ran\n", std::chrono::seconds(10)));
  (*p)->terminate(std::chrono::milliseconds(200));

  auto refused = opts({prog.string()});
  pid_t gated = 0;
  refused.before_exec = [&](pid_t pid) -> nes::host::Status {
    gated = pid;
    return nes::host::Error{"vmm.json: no space left"};
  };
  auto r = VmProcess::launch(std::move(refused));
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "vmm.json: no space left");
  CHECK(gated > 0);
  CHECK_FALSE(alive(gated));  // killed and reaped before launch() returned
}

TEST_CASE("adopt: a process that is not our child, by pid and start time; its stdout pipe reopened") {
  TempDir t;
  auto fifo = t.path / "go";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto prog = t.script("vmm", "read x < " + fifo.string() + "; echo after; exec sleep 30");
  auto o = opts({prog.string()});
  o.death_signal = 0;
  auto p = VmProcess::launch(std::move(o));  // its stdout pipe's read end is the launcher's
  REQUIRE(p);
  (*p)->finish_output(std::chrono::milliseconds(0));  // the launcher stops reading, as a dead monitor
  const pid_t pid = (*p)->pid();
  std::string stat;
  std::getline(std::ifstream(fmt::format("/proc/{}/stat", pid)), stat);
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string f;
  for (int i = 3; i <= 22; ++i) fields >> f;  // field 22: start time
  const unsigned long long start = std::stoull(f);

  auto wrong = VmProcess::adopt(pid, start + 1, {}, {});
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().message.find("not the process recorded") != std::string::npos);
  Capture out;
  auto a = VmProcess::adopt(pid, start, out.sink(), {});
  REQUIRE(a);
  CHECK((*a)->adopted());
  std::ofstream(fifo) << "go\n";  // the child writes after we reopened its pipe
  CHECK(out.wait_for_text("after\n", std::chrono::seconds(10)));
  CHECK((*a)->signal(SIGKILL));
  auto e = (*a)->wait_for(std::chrono::seconds(10));
  REQUIRE(e);  // exited; its status is its parent's to read, not ours
  CHECK_FALSE(e->code);
  CHECK_FALSE(e->signal);
  (*p)->wait_for(std::chrono::seconds(10));  // the launcher reaps it
}

TEST_CASE("qemu_argv: a snapshot's layout (RAM in a file, hot-plug ports, paused for its state); its misuses named") {
  QemuSpec s;
  s.kernel = "/k";
  s.snapshot_layout = true;
  s.ram_file = QemuSpec::RamFile{"/proc/self/fd/4", false};
  s.qmp_socket = "/run/q.sock";
  s.incoming = true;
  auto a = qemu_argv(s);
  REQUIRE(a);
  auto has = [&](std::string_view x) { return std::find(a->begin(), a->end(), std::string(x)) != a->end(); };
  CHECK(has("memory-backend-file,id=mem0,size=256M,mem-path=/proc/self/fd/4,share=off"));
  CHECK(has("node,memdev=mem0"));
  CHECK(has("pcie-root-port,id=rp0,bus=pcie.0,chassis=1"));
  CHECK(has(fmt::format("pcie-root-port,id=rp{},bus=pcie.0,chassis={}", kHotplugPorts - 1, kHotplugPorts)));
  CHECK(has("-S"));
  CHECK(has("defer"));
  auto err = [](QemuSpec x) {
    auto r = qemu_argv(x);
    return r ? std::string() : r.error().message;
  };
  QemuSpec shares = s;
  shares.fs_devices.push_back({"t", "/s.sock"});
  CHECK(err(shares).starts_with("snapshot_layout:"));
  QemuSpec nic = s;
  nic.net_args = {"-netdev", "user,id=net0", "-device", "virtio-net-pci,netdev=net0"};
  CHECK(err(nic).starts_with("snapshot_layout:"));
  nic.net_args.resize(2);  // the backend alone stays on the command line
  CHECK(err(nic).empty());
  QemuSpec noram = s;
  noram.ram_file.reset();
  CHECK(err(noram).starts_with("ram_file:"));
  QemuSpec noqmp = s;
  noqmp.qmp_socket.reset();
  CHECK(err(noqmp).starts_with("incoming:"));
}

TEST_CASE("Sha256 and hash_file: lowercase hex, size, mtime in ns") {
  Sha256 empty;
  REQUIRE(empty.ok());
  CHECK(empty.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 abc;
  abc.update("a");
  abc.update("bc");
  CHECK(abc.hex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  nes::test::TempDir d;
  const auto f = d.path / "abc";
  std::ofstream(f) << "abc";
  auto h = hash_file(f);
  REQUIRE(h);
  CHECK(h->sha256 == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(h->bytes == 3);
  struct stat st{};
  REQUIRE(::stat(f.c_str(), &st) == 0);
  CHECK(h->mtime_ns == static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
  CHECK(same_file("file", f, *h));
}

TEST_CASE("check_snapshot_name: the shared name rule, no leading '.'") {
  for (const std::string& ok : std::vector<std::string>{"warm", "-x", "a.b_c-1", std::string(64, 'w')})
    CHECK_MESSAGE(check_snapshot_name(ok), ok);
  for (const std::string& bad : std::vector<std::string>{"", ".x", "..", "a/b", "a b", std::string(65, 'w')}) {
    auto s = check_snapshot_name(bad);
    REQUIRE_MESSAGE(!s, bad);
    CHECK(s.error().message == fmt::format("snapshot name '{}': not 1..64 of [A-Za-z0-9._-] (no leading '.')", bad));
  }
}

TEST_CASE("snapshot.json: round trip, and each bad field named") {
  SnapshotMeta m;
  m.name = "warm";
  m.created = "2026-12-07T00:00:00.000000000Z";
  m.qemu_version = "7.2.22";
  m.accel = "tcg";
  m.mem_mib = 256;
  m.cpus = 1;
  m.grace_ms = 2500;
  m.firmware = "qboot.rom";
  m.append = "console=ttyS0 \"quoted\"";
  m.kernel = {"/k", 10, std::string(64, 'a'), 1};
  m.initrd = {"/i", 20, std::string(64, 'b'), 2};
  m.state = {"state.qemu", 30, std::string(64, 'c'), 3};
  m.ram = {"ram", 40, std::string(64, 'd'), 4};
  m.ready = R"({"type":"ready","protocol_version":2})";
  const std::string text = encode_snapshot_meta(m);
  auto back = decode_snapshot_meta(text);
  REQUIRE(back);
  CHECK(*back == m);
  auto bad = [&](std::string from, std::string to) {
    std::string t = text;
    auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    t.replace(at, from.size(), to);
    auto r = decode_snapshot_meta(t);
    return r ? std::string() : r.error().message;
  };
  CHECK(bad(R"("format":2)", R"("format":1)").find("format: 1 (this neshost reads format 2)") !=
        std::string::npos);
  CHECK(bad(R"("grace_ms":2500)", R"("grace_ms":0)").find("snapshot.json: grace_ms:") != std::string::npos);
  CHECK(bad(R"("grace_ms":2500,)", "").find("snapshot.json: grace_ms:") != std::string::npos);
  CHECK(bad(R"("mem_mib":256)", R"("mem_mib":1)").find("mem_mib") != std::string::npos);
  CHECK(bad(R"("path":"ram")", R"("path":"../x")").find("ram.path") != std::string::npos);
  CHECK(bad(std::string(64, 'd'), "zz").find("ram.sha256") != std::string::npos);
  CHECK(bad(R"("name":"warm")", R"("name":".x")").find("name") != std::string::npos);
  CHECK(bad(R"("accel":"tcg")", R"("accel":"hvf")").find("accel") != std::string::npos);
  CHECK(!decode_snapshot_meta("[]"));

  // With an image's block root (issue 47): round trip; each of its fields checked; a format-2
  // snapshot without `root` reads as a bare VM's.
  CHECK(text.find(R"("root":null)") != std::string::npos);
  std::string no_root = text;
  no_root.replace(no_root.find(R"(,"root":null)"), 12, "");
  auto bare = decode_snapshot_meta(no_root);
  REQUIRE(bare);
  CHECK(!bare->root);
  m.root = SnapshotRoot{"sha256:" + std::string(64, 'e'), "/s/.images/roots/x/root.erofs", "sha256:" + std::string(64, 'f'),
                        "erofs"};
  const std::string with_root = encode_snapshot_meta(m);
  back = decode_snapshot_meta(with_root);
  REQUIRE(back);
  CHECK(*back == m);
  auto bad_root = [&](std::string from, std::string to) {
    std::string t = with_root;
    auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    t.replace(at, from.size(), to);
    auto r = decode_snapshot_meta(t);
    return r ? std::string() : r.error().message;
  };
  CHECK(bad_root(R"("fs":"erofs")", R"("fs":"xfs")").find("root.fs") != std::string::npos);
  CHECK(bad_root(R"("path":"/s/)", R"("path":"s/)").find("root.path") != std::string::npos);
  CHECK(bad_root("sha256:" + std::string(64, 'f'), "sha256:zz").find("root.digest") != std::string::npos);
  CHECK(bad_root("sha256:" + std::string(64, 'e'), "e").find("root.image") != std::string::npos);
  CHECK(bad_root(R"("root":{)", R"("root":[],"x":{)").find("root: not an object or null") != std::string::npos);
}
