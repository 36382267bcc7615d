// The workload's start: environment, PATH resolution, failure classes, and real spawns (the test
// process is a subreaper; every child is reaped by the test).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nesinit/workload.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes::init;
namespace proto = nes::proto;
namespace fs = std::filesystem;

namespace {
using TempDir = nes::test::TempDir;

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// Spawn and wait for the workload's exit through the reaper (blocking waitpid on its pid).
int run_and_wait(const proto::Exec& e, const proto::Geometry& g, proto::StartFailed* failed = nullptr) {
  Reaper r;
  auto res = spawn(e, g, Stdio::inherit, r);
  if (!res) {
    if (failed) *failed = res.error();
    CHECK(r.watched() == 0);
    return -1;
  }
  pid_t pid = *res;
  CHECK(r.watched() == pid);
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return st;
}
}  // namespace

TEST_CASE("environment: exactly exec.env plus the geometry variables; exec.env wins") {
  proto::Exec e;
  e.env = {{"A", "1"}, {"NESINIT_FPS", "override"}};
  auto env = workload_env(e, proto::Geometry{1920, 1080, 60, true});
  CHECK(env == std::vector<std::string>{"A=1", "NESINIT_FPS=override", "NESINIT_HDR=1",
                                        "NESINIT_HEIGHT=1080", "NESINIT_WIDTH=1920"});
  CHECK(workload_env(proto::Exec{}, proto::Geometry{}) ==
        std::vector<std::string>{"NESINIT_FPS=0", "NESINIT_HDR=0", "NESINIT_HEIGHT=0", "NESINIT_WIDTH=0"});
}

TEST_CASE("exec candidates: slash means as-is, else each PATH entry") {
  CHECK(exec_candidates("/bin/sh", "/x") == std::vector<std::string>{"/bin/sh"});
  CHECK(exec_candidates("./a", "/x") == std::vector<std::string>{"./a"});
  CHECK(exec_candidates("sh", "/a:/b/::/c") ==
        std::vector<std::string>{"/a/sh", "/b/sh", "sh", "/c/sh"});
  CHECK(exec_candidates("sh", kDefaultPath).front() == "/usr/local/sbin/sh");
}

TEST_CASE("classify: 127-style not_found, 126-style not_executable, other") {
  CHECK(classify(SpawnStep::exec, ENOENT) == proto::StartFailClass::not_found);
  CHECK(classify(SpawnStep::exec, ENOTDIR) == proto::StartFailClass::not_found);
  CHECK(classify(SpawnStep::exec, EACCES) == proto::StartFailClass::not_executable);
  CHECK(classify(SpawnStep::exec, ENOEXEC) == proto::StartFailClass::not_executable);
  CHECK(classify(SpawnStep::exec, E2BIG) == proto::StartFailClass::other);
  CHECK(classify(SpawnStep::chdir, ENOENT) == proto::StartFailClass::other);
  CHECK(classify(SpawnStep::setuid, EPERM) == proto::StartFailClass::other);
}

TEST_CASE("spawn for real: environment, cwd, session, fds, mask, credentials") {
  TempDir t;
  // Leak an fd without CLOEXEC into the init side: the workload must not see it.
  int leak = ::open("/dev/null", O_RDONLY);
  REQUIRE(leak >= 3);
  sigset_t blocked, old;
  sigfillset(&blocked);
  ::sigprocmask(SIG_SETMASK, &blocked, &old);  // as PID 1 has them

  proto::Exec e;
  const fs::path out = t.path / "out";
  e.argv = {"/bin/sh", "-c",
            "exec > " + out.string() + "; env | sort; echo cwd=$(pwd); "
            "echo sid=$(cut -d' ' -f6 /proc/$$/stat) pid=$$; "
            "ls /proc/self/fd | sort -n | tr '\\n' ' '; echo; id -u; id -g; id -G"};
  e.env = {{"PATH", "/usr/bin:/bin"}, {"X", "y z"}};
  e.cwd = t.path.string();
  e.uid = 0;
  e.gid = 0;
  e.groups = {0, 44};
  int st = run_and_wait(e, proto::Geometry{640, 480, 30, false});
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  ::close(leak);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  std::string o = slurp(out);
  CAPTURE(o);
  CHECK(o.find("NESINIT_WIDTH=640\n") != std::string::npos);
  CHECK(o.find("NESINIT_HEIGHT=480\n") != std::string::npos);
  CHECK(o.find("NESINIT_FPS=30\n") != std::string::npos);
  CHECK(o.find("NESINIT_HDR=0\n") != std::string::npos);
  CHECK(o.find("X=y z\n") != std::string::npos);
  CHECK(o.find("HOME=") == std::string::npos);  // exactly exec.env: nothing inherited
  CHECK(o.find("cwd=" + t.path.string() + "\n") != std::string::npos);
  // sid == pid: its own session (setsid).
  auto sid = o.find("sid=");
  auto pidp = o.find(" pid=");
  REQUIRE(sid != std::string::npos);
  CHECK(o.substr(sid + 4, pidp - sid - 4) == o.substr(pidp + 5, o.find('\n', pidp) - pidp - 5));
  CHECK(o.find("\n0 1 2 3 \n") != std::string::npos);   // 0-2 + the fd of `ls` itself
  CHECK(o.find("\n0\n0\n0 44\n") != std::string::npos);  // uid, gid, groups
}

TEST_CASE("spawn: oom_score_adj back to 0 in the workload") {
  // Lowering oom_score_adj needs CAP_SYS_RESOURCE (PID 1 sets -1000 for itself). Done in a forked
  // helper so the test process keeps its own value.
  TempDir t;
  const fs::path out = t.path / "o";
  pid_t helper = ::fork();
  REQUIRE(helper >= 0);
  if (helper == 0) {
    int fd = ::open("/proc/self/oom_score_adj", O_WRONLY);
    if (fd < 0 || ::write(fd, "-500", 4) != 4) ::_exit(77);  // no CAP_SYS_RESOURCE here
    ::close(fd);
    proto::Exec e;
    e.argv = {"/bin/sh", "-c", "cat /proc/self/oom_score_adj > " + out.string()};
    Reaper r;
    auto res = spawn(e, {}, Stdio::inherit, r);
    if (!res) ::_exit(1);
    int st;
    ::waitpid(*res, &st, 0);
    ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 2);
  }
  int st = 0;
  REQUIRE(::waitpid(helper, &st, 0) == helper);
  REQUIRE(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) {
    WARN_MESSAGE(false, "no CAP_SYS_RESOURCE: oom_score_adj cannot be lowered on this machine");
    return;
  }
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(slurp(out) == "0\n");
}

TEST_CASE("spawn: signal mask empty and dispositions default in the exec'd program") {
  TempDir t;
  const fs::path out = t.path / "sig";
  sigset_t blocked, old;
  sigfillset(&blocked);
  ::sigprocmask(SIG_SETMASK, &blocked, &old);
  auto old_usr1 = ::signal(SIGUSR1, SIG_IGN);
  auto old_hup = ::signal(SIGHUP, SIG_IGN);
  proto::Exec e;
  // No fork in the shell: `exec` with a redirection replaces sh by grep, which reads its own
  // mask and ignored set as the init left them.
  e.argv = {"/bin/sh", "-c", "exec grep -E '^Sig(Blk|Ign)' /proc/self/status > " + out.string()};
  int st = run_and_wait(e, {});
  ::signal(SIGUSR1, old_usr1);
  ::signal(SIGHUP, old_hup);
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  CHECK(WIFEXITED(st));
  CHECK(slurp(out) == "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
}

TEST_CASE("spawn: default PATH resolution when exec.env has no PATH") {
  proto::Exec e;
  e.argv = {"true"};
  int st = run_and_wait(e, {});
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
}

TEST_CASE("spawn failures: class and errno, and the child is collected") {
  proto::StartFailed f;
  proto::Exec e;
  e.argv = {"/nonexistent"};
  CHECK(run_and_wait(e, {}, &f) == -1);
  CHECK(f.cls == proto::StartFailClass::not_found);
  CHECK(f.err == ENOENT);
  CHECK(f.reason.find("/nonexistent") != std::string::npos);

  e.argv = {"/etc/passwd"};
  CHECK(run_and_wait(e, {}, &f) == -1);
  CHECK(f.cls == proto::StartFailClass::not_executable);
  CHECK(f.err == EACCES);

  e.argv = {"no-such-program-anywhere"};
  e.env = {{"PATH", "/usr/bin:/bin"}};
  CHECK(run_and_wait(e, {}, &f) == -1);
  CHECK(f.cls == proto::StartFailClass::not_found);

  e.argv = {"/bin/true"};
  e.cwd = "/nonexistent-dir";
  CHECK(run_and_wait(e, {}, &f) == -1);
  CHECK(f.cls == proto::StartFailClass::other);
  CHECK(f.err == ENOENT);
  CHECK(f.reason.find("chdir") != std::string::npos);
  // No child left behind.
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);
  CHECK(errno == ECHILD);
}

TEST_CASE("spawn: a program found only through the descriptor's PATH runs") {
  TempDir t;
  fs::path prog = t.path / "only-here";
  {
    std::ofstream f(prog);
    f << "#!/bin/sh\nexit 42\n";
  }
  fs::permissions(prog, fs::perms::owner_all);
  proto::Exec e;
  e.argv = {"only-here"};
  e.env = {{"PATH", "/nonexistent:" + t.path.string()}};
  int st = run_and_wait(e, {});
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 42);
}

TEST_CASE("plan_container: private first, the root bound onto itself, runc's mounts, the switch, then the hostname") {
  proto::Container c{"/pod/c1", "web", true};
  const auto s = plan_container(c, {"hosts", "resolv.conf", "hostname"});
  REQUIRE(s.size() > 10);
  CHECK(describe(s[0]) == "make the mounts private");
  CHECK(describe(s[1]) == "mount /pod/c1 on /pod/c1");
  std::vector<std::string> all;
  for (const auto& st : s) all.push_back(describe(st));
  auto has = [&](const std::string& d) { return std::find(all.begin(), all.end(), d) != all.end(); };
  CHECK(has("mount proc on /pod/c1/proc"));
  CHECK(has("mount tmpfs on /pod/c1/dev"));
  CHECK(has("mount /dev/null on /pod/c1/dev/null"));
  CHECK(has("mount devpts on /pod/c1/dev/pts"));
  CHECK(has("symlink /pod/c1/dev/ptmx"));
  CHECK(has("mount sysfs on /pod/c1/sys"));
  CHECK(has("mount /etc/hosts on /pod/c1/etc/hosts"));
  CHECK(has("mount /etc/resolv.conf on /pod/c1/etc/resolv.conf"));
  CHECK(!has("mount /etc/hostname on /pod/c1/etc/hostname"));  // the container has its own name
  CHECK(all[all.size() - 3] == "remount /pod/c1 read-only");
  CHECK(all[all.size() - 2] == "pivot_root into /pod/c1");
  CHECK(all.back() == "sethostname web");
  // Without a hostname: the VM's /etc/hostname, no sethostname, no read-only remount.
  const auto v = plan_container(proto::Container{"/pod/c2"}, {"hostname"});
  CHECK(describe(v.back()) == "pivot_root into /pod/c2");
  CHECK(describe(v[v.size() - 2]) == "mount /etc/hostname on /pod/c2/etc/hostname");
  const JoinPlan j = plan_join(58);
  CHECK(j.ns[0] == "/proc/58/ns/uts");
}

TEST_CASE("plan_container: the spec's mounts after runc's, a symlink in the root followed inside it, before the read-only remount") {
  TempDir t{"ctrmounts"};
  const std::string r = (t.path / "root").string();
  fs::create_directories(r + "/run");
  fs::create_directory_symlink("/run", r + "/var-run-link");  // an image's /var/run -> /run, absolute
  fs::create_directories(r + "/var");
  fs::create_directory_symlink("../run", r + "/var/run");      // ... or relative
  const std::string dir = (t.path / "vol").string(), file = (t.path / "term").string();
  fs::create_directories(dir);
  std::ofstream(file) << "";
  proto::Container c{r, std::nullopt, true};
  c.mounts.push_back({"/var/run/secrets/sa", dir, proto::FsType::bind, true, false, false, false, "", "rslave"});
  c.mounts.push_back({"/var-run-link/x", dir, proto::FsType::bind});
  c.mounts.push_back({"/dev/termination-log", file, proto::FsType::bind});
  c.mounts.push_back({"/cache", "", proto::FsType::tmpfs, false, true, true, false, "size=1m,mode=1777"});
  const auto s = plan_container(c, {});
  std::vector<std::string> all;
  for (const auto& st : s) all.push_back(describe(st));
  auto at = [&](const std::string& d) { return std::find(all.begin(), all.end(), d) - all.begin(); };
  const auto n = static_cast<long>(all.size());
  // Inside the root: /var/run resolved to the root's /run, never the VM's.
  CHECK(at("mkdir " + r + "/run/secrets") < n);
  CHECK(at("mkdir " + r + "/run/secrets/sa") < at("mount " + dir + " on " + r + "/run/secrets/sa"));
  CHECK(at("remount " + r + "/run/secrets/sa read-only") < n);
  CHECK(at("set the propagation of " + r + "/run/secrets/sa") < n);
  CHECK(at("mount " + dir + " on " + r + "/run/x") < n);
  CHECK(at("create " + r + "/dev/termination-log") > at("mount tmpfs on " + r + "/dev"));  // after runc's /dev
  CHECK(at("mount " + file + " on " + r + "/dev/termination-log") < n);
  CHECK(at("remount " + r + "/dev/termination-log read-only") == n);  // rw: no remount
  const auto tm = at("mount tmpfs on " + r + "/cache");
  REQUIRE(tm < n);
  CHECK(s[static_cast<std::size_t>(tm)].opts == "size=1m,mode=1777");
  CHECK((s[static_cast<std::size_t>(tm)].flags & (MS_NOSUID | MS_NODEV)) == (MS_NOSUID | MS_NODEV));
  CHECK(all[all.size() - 2] == "remount " + r + " read-only");  // the root last, after its mounts
  CHECK(all.back() == "pivot_root into " + r);
  const JoinPlan j = plan_join(58);
  CHECK(j.ns[0] == "/proc/58/ns/uts");
  CHECK(j.ns[1] == "/proc/58/ns/pid");
  CHECK(j.ns[2] == "/proc/58/ns/mnt");
  CHECK(j.root == "/proc/58/root");
}
