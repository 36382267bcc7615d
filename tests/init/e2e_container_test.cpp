// End-to-end: containers inside the VM (`exec.container`, `exec.in`; docs/protocol.md
// "Containers"). The real static init as PID 1 of a fresh pid + mount + net + uts namespace
// (`unshare --net`: its loopback is its own; nothing reaches this machine's network), two
// container roots built at test time (busybox-static and a marker file each). Each container sees
// its own root and not the other's, is PID 1 of its own pid namespace, has its hostname, shares
// the VM's loopback; one's end is its exec_exited and leaves the other and the workload running;
// an exec into one sees its root and pid namespace; bad input is exec_failed naming the field.
// Every mount is made in the sandbox's private mount namespace (the container's own, below it):
// the test checks that none shows in the machine's mount table, nor in the sandbox's.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "e2e_checks.hpp"

using namespace nes::init::test;
namespace proto = nes::proto;
namespace fs = std::filesystem;
using proto::Stream;

namespace {

/// A container root under `dir`: /bin/busybox (static) with the applets the scripts use, and
/// /marker-NAME holding NAME.
fs::path make_root(const fs::path& dir, const std::string& name) {
  const fs::path r = dir / ("root-" + name);
  fs::create_directories(r / "bin");
  fs::create_directories(r / "www");
  fs::copy_file("/bin/busybox", r / "bin/busybox");
  for (const char* a : {"sh", "echo", "cat", "test", "hostname", "wget", "httpd", "ls", "ps", "usleep", "touch", "grep"})
    fs::create_symlink("busybox", r / "bin" / a);
  std::ofstream(r / ("marker-" + name)) << name << "\n";
  std::ofstream(r / "www/index.html") << "page-of-" << name << "\n";
  return r;
}

proto::ExecProcess in_container(std::uint16_t proc, const fs::path& root, const std::string& host,
                                std::vector<std::string> argv) {
  proto::ExecProcess x;
  x.proc = proc;
  x.exec.argv = std::move(argv);
  x.exec.env = {{"PATH", "/bin"}};
  x.stdio = proto::Stdio{};
  x.container = proto::Container{root.string(), host, false};
  return x;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("containers: own root, pid namespace and hostname; shared loopback; exits, exec into one, bad input") {
  SandboxOptions o;
  o.data = true;
  o.data_rules = proto::FrameRules{proto::FrameSender::guest, false, false, false};
  o.init_args = {"--grace-ms=2000"};
  o.unshare_args = {"--net", "--uts"};
  o.wrapper = {"/bin/sh", "-c", "ip link set lo up && exec \"$@\"", "sh"};
  Sandbox sb(o);
  const fs::path a = make_root(sb.dir(), "a");
  const fs::path b = make_root(sb.dir(), "b");

  // The workload (the pod's PID 1 stand-in) waits for its stdin's EOF.
  proto::Boot boot = make_boot({"/bin/sh", "-c", "cat >/dev/null; echo workload-done"});
  boot.stdio = proto::Stdio{};
  boot.stdio->attach_stdin = true;
  REQUIRE_MESSAGE(sb.start(boot), sb.last_error());
  REQUIRE(sb.wait_until([&] { return sb.data_connected(); }));

  // 1: container a, serving its page on the VM's loopback (httpd as its PID 1).
  REQUIRE(sb.send(in_container(1, a, "web", {"/bin/sh", "-c",
      "echo pid=$$; hostname; cat /marker-a; test -e /marker-b || echo no-b; echo procs: /proc/[0-9]*; "
      "test -c /dev/null && test -L /dev/ptmx && test -d /dev/pts && test -d /dev/shm && echo dev-ok; "
      "touch /sys/x 2>/dev/null || echo sys-ro; test -f /etc/hosts && echo hosts-ok; "
      "echo ready; exec httpd -f -p 127.0.0.1:8080 -h /www"})));
  const auto s1 = next_after_accounts<proto::ExecStarted>(sb);
  CHECK(s1.proc == 1);
  CHECK(s1.pid > 1);  // as the init sees it
  REQUIRE(sb.wait_until([&] { return sb.proc_data(1, Stream::out).find("ready\n") != std::string::npos; }));
  const std::string out1 = sb.proc_data(1, Stream::out);
  CAPTURE(out1);
  CHECK(out1 == "pid=1\nweb\na\nno-b\nprocs: /proc/1\ndev-ok\nsys-ro\nhosts-ok\nready\n");

  // 2: container b: its own root, PID 1 too, with mounts (exec.container.mounts: a volume
  // read-write and read-only, a file at /dev/termination-log, a tmpfs); fetches a's page over
  // 127.0.0.1 (bounded retries while httpd binds), then exits 5.
  const fs::path vol = sb.dir() / "vol", term = sb.dir() / "termination-log";
  fs::create_directories(vol);
  std::ofstream(vol / "seed") << "seed\n";
  std::ofstream(term) << "";
  proto::ExecProcess x2 = in_container(2, b, "db", {"/bin/sh", "-c",
      "echo pid=$$; hostname; cat /marker-b; test -e /marker-a || echo no-a; echo procs: /proc/[0-9]*; "
      "cat /data/vol/seed; echo from-b > /data/vol/from-b; printf bye > /dev/termination-log; "
      "(echo x > /ro/y) 2>/dev/null || echo ro-refused; grep -q ' /scratch tmpfs ' /proc/mounts && echo scratch-tmpfs; "
      "test -k /scratch && echo sticky; "
      "n=0; until wget -q -O - http://127.0.0.1:8080/index.html; do n=$((n+1)); "
      "[ $n -lt 500 ] || exit 9; usleep 10000; done; exit 5"});
  x2.container->mounts = {{"/data/vol", vol.string(), proto::FsType::bind},
                          {"/ro", vol.string(), proto::FsType::bind, true},
                          {"/dev/termination-log", term.string(), proto::FsType::bind},
                          {"/scratch", "", proto::FsType::tmpfs, false, true, true, false, "size=1m,mode=1777"}};
  REQUIRE(sb.send(x2));
  CHECK(next_after_accounts<proto::ExecStarted>(sb).proc == 2);
  auto e2 = next_exec_exit(sb);
  CHECK(e2 == proto::ExecExited{2, 5, std::nullopt});
  CHECK(sb.proc_data(2, Stream::out) ==
        "pid=1\ndb\nb\nno-a\nprocs: /proc/1\nseed\nro-refused\nscratch-tmpfs\nsticky\npage-of-a\n");
  CHECK(slurp((vol / "from-b").string()) == "from-b\n");  // the host's directory itself
  CHECK(slurp(term.string()) == "bye");                   // the host's file itself
  CHECK(!fs::exists(vol / "y"));

  // 3: an exec into container a: a's root, a's pid namespace (httpd is its PID 1), its hostname.
  proto::ExecProcess x3;
  x3.proc = 3;
  x3.exec.argv = {"/bin/sh", "-c", "cat /marker-a; test -e /marker-b || echo no-b; hostname; "
                                   "cat /proc/1/comm; test $$ -gt 1 && echo not-pid-1; read l; echo got:$l; cat"};
  x3.exec.env = {{"PATH", "/bin"}};
  x3.stdio = proto::Stdio{};
  x3.stdio->attach_stdin = true;
  x3.in = 1;
  REQUIRE(sb.send(x3));
  CHECK(next_after_accounts<proto::ExecStarted>(sb).proc == 3);
  // Its stdin, then its eof (CloseIO), reach it inside the container: `cat` ends at the eof.
  std::string in3;
  proto::append_data(in3, Stream::in, "hello\n", 3);
  proto::append_eof(in3, Stream::in, 3);
  sb.send_data(in3);
  CHECK(next_exec_exit(sb) == proto::ExecExited{3, 0, std::nullopt});
  CHECK(sb.proc_data(3, Stream::out) == "a\nno-b\nweb\nhttpd\nnot-pid-1\ngot:hello\n");

  // Bad input: exec_failed naming the field; nothing runs, the rest untouched.
  proto::ExecProcess bad = in_container(4, sb.dir() / "no-such-root", "x", {"/bin/sh"});
  REQUIRE(sb.send(bad));
  const auto f4v = next_after_accounts<proto::ExecFailed>(sb);
  const auto* f4 = &f4v;
  CHECK(f4->proc == 4);
  CHECK(f4->reason == "exec.container.root: " + (sb.dir() / "no-such-root").string() + ": No such file or directory");
  CHECK(f4->cls == proto::StartFailClass::not_found);
  bad = in_container(5, a, "x", {"/bin/nope"});
  REQUIRE(sb.send(bad));
  const auto f5v = next_after_accounts<proto::ExecFailed>(sb);
  const auto* f5 = &f5v;
  CHECK(f5->reason == "execve /bin/nope: No such file or directory (in exec.container.root " + a.string() + ")");
  CHECK(f5->cls == proto::StartFailClass::not_found);
  proto::ExecProcess x6 = x3;
  x6.proc = 6;
  x6.in = 2;  // ended
  REQUIRE(sb.send(x6));
  const auto f6v = next_after_accounts<proto::ExecFailed>(sb);
  const auto* f6 = &f6v;
  CHECK(f6->reason == "exec.in: no container is running as process 2");

  // No mount of a container's reached the sandbox's mount table, nor the machine's.
  const std::string sandbox_mounts = slurp("/proc/" + std::to_string(sb.unshare_pid()) + "/mountinfo");
  CHECK(sandbox_mounts.find(sb.dir().string()) == std::string::npos);
  CHECK(slurp("/proc/self/mountinfo").find(sb.dir().string()) == std::string::npos);

  // a is still serving: killed through kill{9, proc}, its end is its own; the workload goes on.
  REQUIRE(sb.send(proto::Kill{9, 1}));
  CHECK(next_exec_exit(sb) == proto::ExecExited{1, std::nullopt, 9});
  sb.send_data([] {
    std::string f;
    proto::append_eof(f, Stream::in);
    return f;
  }());
  CHECK(next_exit(sb) == proto::WorkloadExited::code(0));
  CHECK(sb.data_out() == "workload-done\n");
  CHECK(sb.shutdown_powered_off());
}
