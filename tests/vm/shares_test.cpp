// Unit tests of the shares' host side (host/vm/virtiofsd.*, host/vm/volume.*, the virtio-fs part
// of qemu_argv): `-v` parsing against the real file system, the daemon's argv, and its lifecycle
// with real processes (stand-in daemons that fail, stay silent or get ready, and the fetched
// virtiofsd itself when $NESHOST_VIRTIOFSD names it). No QEMU here (tests/vm/vm_test.py boots it).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "host/vm/qemu_argv.hpp"
#include "host/vm/virtiofsd.hpp"
#include "host/vm/volume.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes::vm;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

/// Cases that could not run, and why: the run then exits 77 (meson's SKIP) instead of passing.
static std::vector<std::string> g_skipped;

namespace {

using TempDir = nes::test::TempDir;

bool has_pair(const std::vector<std::string>& a, const std::string& k, const std::string& v) {
  for (std::size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == k && a[i + 1] == v) return true;
  return false;
}
bool has(const std::vector<std::string>& a, const std::string& x) {
  return std::find(a.begin(), a.end(), x) != a.end();
}

QemuSpec spec() {
  QemuSpec s;
  s.kernel = "/k/vmlinuz";
  s.append = "console=ttyS0";
  return s;
}

fs::path script(const TempDir& d, const std::string& name, const std::string& body) {
  fs::path p = d.path / name;
  std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
  fs::permissions(p, fs::perms::owner_all);
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// No child of this process is left (every daemon was reaped).
bool no_children() {
  int st;
  return ::waitpid(-1, &st, WNOHANG) < 0 && errno == ECHILD;
}

}  // namespace

TEST_CASE("qemu_argv: shares make guest RAM a shared memfd, one vhost-user-fs-pci each") {
  auto s = spec();
  s.mem_mib = 128;
  s.fs_devices = {{"nes.root", "/rt/nes.root.sock"}, {"nes.v0", "/rt/a,b.sock"}};
  auto r = qemu_argv(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(has_pair(*r, "-object", "memory-backend-memfd,id=mem0,size=128M,share=on"));
  CHECK(has_pair(*r, "-numa", "node,memdev=mem0"));
  CHECK(has_pair(*r, "-chardev", "socket,id=fs0,path=/rt/nes.root.sock"));
  CHECK(has_pair(*r, "-device", "vhost-user-fs-pci,chardev=fs0,tag=nes.root"));
  CHECK(has_pair(*r, "-chardev", "socket,id=fs1,path=/rt/a,,b.sock"));
  CHECK(has_pair(*r, "-device", "vhost-user-fs-pci,chardev=fs1,tag=nes.v0"));

  auto plain = qemu_argv(spec());
  REQUIRE_MESSAGE(plain.ok(), plain.error().message);
  CHECK(!has(*plain, "-object"));  // no share: ordinary private RAM
  CHECK(!has(*plain, "-numa"));
}

TEST_CASE("qemu_argv: shares and the data channel together: both ports and every fs device") {
  auto s = spec();
  s.channel_socket = "/rt/channel.sock";
  s.data_socket = "/rt/data.sock";
  s.fs_devices = {{"nes.v0", "/rt/nes.v0.sock"}};
  auto r = qemu_argv(s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(has_pair(*r, "-chardev", "socket,id=nes1,server=off,path=/rt/data.sock"));
  CHECK(has_pair(*r, "-device", "virtserialport,bus=vser0.0,chardev=nes0,name=nes.0"));
  CHECK(has_pair(*r, "-device", "virtserialport,bus=vser0.0,chardev=nes1,name=nes.1"));
  CHECK(has_pair(*r, "-chardev", "socket,id=fs0,path=/rt/nes.v0.sock"));
  CHECK(has_pair(*r, "-device", "vhost-user-fs-pci,chardev=fs0,tag=nes.v0"));
  CHECK(has_pair(*r, "-object", "memory-backend-memfd,id=mem0,size=256M,share=on"));
}

TEST_CASE("qemu_argv: bad share devices are named") {
  auto bad = [](std::vector<FsDevice> d, const char* field) {
    auto s = spec();
    s.fs_devices = std::move(d);
    auto r = qemu_argv(s);
    CHECK(!r.ok());
    CHECK_MESSAGE(r.error().message.rfind(field, 0) == 0, r.error().message);
  };
  bad({{"", "/s"}}, "fs_devices[0].tag:");
  bad({{std::string(37, 't'), "/s"}}, "fs_devices[0].tag:");
  bad({{"a b", "/s"}}, "fs_devices[0].tag:");
  bad({{"a", "/s"}, {"a", "/t"}}, "fs_devices[1].tag:");
  bad({{"a", ""}}, "fs_devices[0].socket:");
  bad({{"a", "/" + std::string(120, 's')}}, "fs_devices[0].socket:");
  CHECK(check_share_tag(std::string(36, 't')));
}

TEST_CASE("parse_volume: docker's HOST:GUEST[:ro|rw], HOST resolved, GUEST normalised") {
  TempDir d;
  fs::create_directory(d.path / "data");
  fs::create_directory_symlink(d.path / "data", d.path / "link");
  auto v = parse_volume((d.path / "data").string() + ":/work");
  REQUIRE(v.ok());
  CHECK(v->host == fs::canonical(d.path / "data"));
  CHECK(v->guest == "/work");
  CHECK(!v->ro);
  v = parse_volume((d.path / "link").string() + "://srv//x/:ro");
  REQUIRE(v.ok());
  CHECK(v->host == fs::canonical(d.path / "data"));  // a symlinked HOST is the directory it names
  CHECK(v->guest == "/srv/x");
  CHECK(v->ro);
  v = parse_volume((d.path / "data").string() + ":/w:rw");
  REQUIRE(v.ok());
  CHECK(!v->ro);
  // A relative HOST is relative to the current directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(d.path);
  v = parse_volume("data:/w");
  fs::current_path(cwd);
  REQUIRE(v.ok());
  CHECK(v->host == fs::canonical(d.path / "data"));
}

TEST_CASE("parse_volume: every bad spelling is refused naming --volume and why") {
  TempDir d;
  fs::create_directory(d.path / "data");
  std::ofstream(d.path / "file") << "x";
  const std::string h = (d.path / "data").string();
  auto refused = [](const std::string& spec, const std::string& why) {
    auto v = parse_volume(spec);
    REQUIRE_MESSAGE(!v.ok(), spec);
    CHECK_MESSAGE(v.error().message.find("--volume '" + spec + "'") == 0, v.error().message);
    CHECK_MESSAGE(v.error().message.find(why) != std::string::npos, v.error().message);
  };
  refused((d.path / "missing").string() + ":/w", "does not exist");
  ::mkfifo((d.path / "fifo").c_str(), 0600);
  refused((d.path / "fifo").string() + ":/w", "neither a directory nor a regular file");
  refused((d.path / "file").string() + ":/dev", "/dev");  // a file below /dev, not /dev itself
  refused(h + ":work", "absolute");
  refused(h + ":", "absolute");
  refused(h + ":/", "must not be /");
  refused(h + ":/proc", "/proc");
  refused(h + ":/proc/sys", "/proc");
  refused(h + ":/sys", "/sys");
  refused(h + ":/dev/shm", "/dev");
  refused(h + ":/w/../etc", "'..'");
  refused(h + ":/w/./x", "'.'");
  refused(h + ":/w:rox", "not ro or rw");
  refused(h + ":/w:ro:z", "HOST:GUEST");
  refused(h, "HOST:GUEST");
  refused(":/w", "HOST is empty");
  CHECK(check_guest_path("/procx"));  // only the directory itself and below it
  CHECK(check_guest_path("/devices"));
  std::vector<Volume> twice{{"/a", "/w", false}, {"/b", "/w", true}};
  CHECK(check_volumes(twice).error().message.find("/w is given twice") != std::string::npos);
}

TEST_CASE("parse_volume: a regular file is a file volume, also below /dev (CRI's termination log)") {
  TempDir d;
  std::ofstream(d.path / "hosts") << "x";
  auto v = parse_volume((d.path / "hosts").string() + ":/etc/hosts:ro");
  REQUIRE(v.ok());
  CHECK(v->file);
  CHECK(v->ro);
  CHECK(v->guest == "/etc/hosts");
  v = parse_volume((d.path / "hosts").string() + ":/dev/termination-log");
  REQUIRE(v.ok());
  CHECK(v->file);
  fs::create_directory(d.path / "dir");
  v = parse_volume((d.path / "dir").string() + ":/w");
  REQUIRE(v.ok());
  CHECK(!v->file);
}

TEST_CASE("virtiofsd_argv with file binds: each made in a private mount namespace, ro honoured, none on ours") {
  // The argv runs for real with a stand-in for virtiofsd that reports what it sees at the targets.
  TempDir d;
  std::ofstream(d.path / "src-ro") << "read only\n";
  std::ofstream(d.path / "src-rw") << "";
  fs::create_directory(d.path / "staging");
  std::ofstream(d.path / "staging" / "0");
  std::ofstream(d.path / "staging" / "1");
  const fs::path probe = d.path / "probe.sh";
  std::ofstream(probe) << "#!/bin/sh\ncd \"$(dirname \"$0\")\"/staging || exit 9\n"
                          "[ \"$1\" = --socket-path=/rt/s ] || exit 8\n"
                          "cat 0; (echo x >> 0) 2>/dev/null || echo ro-refused; echo written > 1\n";
  fs::permissions(probe, fs::perms::owner_all);
  VirtiofsdOptions o;
  o.program = probe.string();
  o.socket = "/rt/s";
  o.share = {"nes.files", d.path / "staging", false};
  o.binds = {{d.path / "src-ro", d.path / "staging" / "0", true}, {d.path / "src-rw", d.path / "staging" / "1", false}};
  auto a = virtiofsd_argv(o);
  CHECK(a.at(0) == "unshare");
  std::string cmd;
  for (const auto& s : a) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += q + "' ";
  }
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[256];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  CHECK(::pclose(p) == 0);
  CHECK(out == "read only\nro-refused\n");
  std::ifstream rw(d.path / "src-rw");
  std::string line;
  std::getline(rw, line);
  CHECK(line == "written");  // through the bind, to the host's file
  CHECK(fs::file_size(d.path / "staging" / "0") == 0);  // the staging file itself untouched
  std::ifstream mi("/proc/self/mountinfo");
  std::string all((std::istreambuf_iterator<char>(mi)), std::istreambuf_iterator<char>());
  CHECK(all.find((d.path / "staging").string()) == std::string::npos);
}

TEST_CASE("virtiofsd_argv: namespace sandbox, cache auto, --readonly only for ro") {
  VirtiofsdOptions o;
  o.program = "/usr/libexec/virtiofsd";
  o.socket = "/rt/nes.v0.sock";
  o.share = {"nes.v0", "/srv/data", false};
  auto a = virtiofsd_argv(o);
  CHECK(a.at(0) == "/usr/libexec/virtiofsd");
  CHECK(has(a, "--socket-path=/rt/nes.v0.sock"));
  CHECK(has(a, "--shared-dir=/srv/data"));
  CHECK(has(a, "--sandbox=namespace"));
  CHECK(has(a, "--cache=auto"));
  CHECK(!has(a, "--readonly"));
  o.share.ro = true;
  CHECK(has(virtiofsd_argv(o), "--readonly"));
}

TEST_CASE("Virtiofsd::start: a daemon that fails names the share and carries its message") {
  TempDir d;
  VirtiofsdOptions o;
  o.program = script(d, "fake", "echo 'Error: No such file or directory (os error 2)' >&2; exit 1");
  o.socket = d.path / "s.sock";
  o.share = {"nes.v3", "/srv/data", false};
  o.log = d.path / "virtiofsd.log";
  auto r = Virtiofsd::start(o, 10s);
  REQUIRE(!r.ok());
  const auto& m = r.error().message;
  CHECK_MESSAGE(m.find("share 'nes.v3' (/srv/data)") == 0, m);
  CHECK_MESSAGE(m.find("exited with code 1") != std::string::npos, m);
  CHECK_MESSAGE(m.find("No such file or directory (os error 2)") != std::string::npos, m);
  CHECK(slurp(o.log).find("os error 2") != std::string::npos);
  CHECK(no_children());

  o.program = (d.path / "absent").string();
  r = Virtiofsd::start(o, 10s);
  REQUIRE(!r.ok());
  CHECK_MESSAGE(r.error().message.find("share 'nes.v3'") == 0, r.error().message);
  CHECK(no_children());
}

TEST_CASE("Virtiofsd::start: a silent daemon is killed at the bound; a ready one is stopped") {
  TempDir d;
  VirtiofsdOptions o;
  o.socket = d.path / "s.sock";
  o.share = {"nes.v0", d.path, false};
  o.log = d.path / "log";
  o.program = script(d, "silent", "exec sleep 100");
  auto r = Virtiofsd::start(o, 300ms);
  REQUIRE(!r.ok());
  CHECK_MESSAGE(r.error().message.find("not listening after 300 ms") != std::string::npos, r.error().message);
  CHECK(no_children());

  // The ready line split across two writes is still seen.
  o.program = script(d, "ready", "printf '[INFO virtiofsd] Waiting for vhost-user ' >&2; sleep 0.1; "
                                 "echo 'socket connection...' >&2; exec sleep 100");
  r = Virtiofsd::start(o, 10s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  auto e = (*r)->stop(100ms);  // it will not exit by itself: SIGTERM after the grace
  CHECK(e.signal == SIGTERM);
  CHECK(slurp(o.log).find("Waiting for vhost-user socket connection") != std::string::npos);
  {
    auto again = Virtiofsd::start(o, 10s);
    REQUIRE(again.ok());
  }  // the destructor kills and reaps a running daemon
  CHECK(no_children());
}

TEST_CASE("Virtiofsd::start: the real virtiofsd listens, refuses a missing directory, dies when stopped") {
  const char* prog = std::getenv("NESHOST_VIRTIOFSD");
  if (!prog || ::access(prog, X_OK) != 0) {
    // Not a pass: the run exits 77 (meson: SKIP) unless something failed.
    g_skipped.push_back(std::string("the real virtiofsd (") + (prog ? prog : "NESHOST_VIRTIOFSD unset") +
                        ") is not there or not executable: run scripts/fetch-virtiofsd.sh");
    MESSAGE(g_skipped.back());
    return;
  }
  TempDir d;
  fs::create_directory(d.path / "data");
  VirtiofsdOptions o;
  o.program = prog;
  o.socket = d.path / "s.sock";
  o.share = {"nes.v0", d.path / "data", true};
  o.log = d.path / "log";
  auto r = Virtiofsd::start(o, 10s);
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  struct stat st {};
  REQUIRE(::stat(o.socket.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));  // it exists before start() returns: QEMU may connect at once
  auto e = (*r)->stop(0ms);
  CHECK((e.signal || e.code));
  r = Virtiofsd::start(VirtiofsdOptions{prog, d.path / "t.sock", {"nes.v1", d.path / "gone", false}, d.path / "log2"}, 10s);
  REQUIRE(!r.ok());
  CHECK_MESSAGE(r.error().message.find("share 'nes.v1'") == 0, r.error().message);
  CHECK_MESSAGE(r.error().message.find("virtiofsd exited") != std::string::npos, r.error().message);
  CHECK(no_children());
}

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  if (ctx.shouldExit() || rc != 0 || g_skipped.empty()) return rc;
  for (const auto& why : g_skipped) std::fprintf(stderr, "SKIP: %s\n", why.c_str());
  return 77;
}
