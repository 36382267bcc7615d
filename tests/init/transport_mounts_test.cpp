// Transport address handling and dialling (Unix sockets only; vsock is never connected here),
// virtio-serial port lookup in a fake sysfs, and the pure parts of mounting.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <linux/vm_sockets.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/fd.hpp"
#include "nesinit/block.hpp"
#include "nesinit/mounts.hpp"
#include "nesinit/rootfs.hpp"
#include "nesinit/transport.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes::init;
namespace proto = nes::proto;
namespace fs = std::filesystem;

namespace {
using TempDir = nes::test::TempDir;
using nes::base::Fd;
int lowest_free_fd() {
  int fd = ::open("/dev/null", O_RDONLY);
  ::close(fd);
  return fd;
}
int listen_unix(const std::string& path, int backlog = 4) {
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(s, backlog) == 0);
  return s;
}
const Log& quiet_log() {
  static Log l(2, LogLevel::quiet);
  return l;
}
}  // namespace

TEST_CASE("vsock address handling (no socket is created)") {
  SockAddr a = vsock_sockaddr(VsockAddr{2, 7000});
  auto* vm = reinterpret_cast<const sockaddr_vm*>(&a.storage);
  CHECK(vm->svm_family == AF_VSOCK);
  CHECK(vm->svm_cid == 2u);
  CHECK(vm->svm_port == 7000u);
  CHECK(a.len == sizeof(sockaddr_vm));
  SockAddr b = vsock_sockaddr(VsockAddr{4294967295u, 1});
  CHECK(reinterpret_cast<const sockaddr_vm*>(&b.storage)->svm_cid == 4294967295u);
}

TEST_CASE("dial refuses vsock outside a guest, before creating any socket") {
  int before = lowest_free_fd();
  CHECK(dial_once(Channel{VsockAddr{2, 7000}}, /*guest=*/false).error().err == EPERM);
  CHECK(lowest_free_fd() == before);
  CHECK_FALSE(retryable(EPERM));  // the session gives up at once
}

TEST_CASE("unix sockaddr") {
  SockAddr a = unix_sockaddr(UnixAddr{"/tmp/x.sock"});
  auto* un = reinterpret_cast<const sockaddr_un*>(&a.storage);
  CHECK(un->sun_family == AF_UNIX);
  CHECK(std::string(un->sun_path) == "/tmp/x.sock");
}

TEST_CASE("virtio-serial port lookup by name in sysfs") {
  TempDir t;
  fs::create_directories(t.path / "vport0p0");
  fs::create_directories(t.path / "vport1p1");
  fs::create_directories(t.path / "vport1p2");  // no name file
  std::ofstream(t.path / "vport0p0" / "name") << "org.qemu.guest_agent.0\n";
  std::ofstream(t.path / "vport1p1" / "name") << "nes.0\n";
  CHECK(find_virtio_port("nes.0", t.path.string(), "/devx") == std::optional<std::string>("/devx/vport1p1"));
  CHECK(find_virtio_port("org.qemu.guest_agent.0", t.path.string()) ==
        std::optional<std::string>("/dev/vport0p0"));
  CHECK(!find_virtio_port("nes", t.path.string()));
  CHECK(!find_virtio_port("nes.0", (t.path / "missing").string()));
}

TEST_CASE("dial_once: no listener yet is retryable; a listener: connected, non-blocking, CLOEXEC") {
  TempDir t;
  const std::string path = (t.path / "s").string();
  auto none = dial_once(Channel{UnixAddr{path}}, false);
  REQUIRE_FALSE(none);
  CHECK(none.error().err == ENOENT);
  CHECK(none.error().message == std::strerror(ENOENT));
  CHECK(retryable(ENOENT));
  Fd l(listen_unix(path));
  auto f = dial_once(Channel{UnixAddr{path}}, false);
  REQUIRE(f);
  const int fd = f->get();
  CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
  CHECK((::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
  Fd peer(::accept(l.get(), nullptr, nullptr));
  CHECK(::write(fd, "x\n", 2) == 2);
  char c[2];
  CHECK(::read(peer.get(), c, 2) == 2);
}

TEST_CASE("retryable: not there yet or cut short, versus refused for good") {
  for (int e : {ENOENT, ECONNREFUSED, ECONNRESET, ENODEV, EAGAIN, ETIMEDOUT, ENXIO, ENOTCONN, ECANCELED})
    CHECK_MESSAGE(retryable(e), e);
  for (int e : {EACCES, EPERM, EINVAL, ENAMETOOLONG, ENOTSOCK})
    CHECK_MESSAGE(!retryable(e), e);
}

TEST_CASE("dial_once: a Unix listener whose backlog is full never blocks: EAGAIN at once, retryable") {
  TempDir t;
  const std::string path = (t.path / "s").string();
  Fd l(listen_unix(path, /*backlog=*/0));
  Fd filler(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  SockAddr a = unix_sockaddr(UnixAddr{path});
  REQUIRE(::connect(filler.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.len) == 0);
  // The queue is full now: a blocking connect() would wait for accept().
  std::uint64_t now = 0;
  int waits = 0;
  auto r = dial_once(Channel{UnixAddr{path}}, false, 1000, [&](std::uint32_t, int) { ++waits; return true; },
                     [&] { return now; });
  REQUIRE_FALSE(r);
  CHECK(r.error().err == EAGAIN);
  CHECK(waits == 0);  // a Unix connect answers at once: nothing to wait for
  CHECK(retryable(EAGAIN));
}

TEST_CASE("connect_socket: a connect in progress (the vsock path's shape, over loopback TCP) is "
          "waited for through wait(), bounded by the deadline, and closed on the way out") {
  // A TCP listener with backlog 0 and one connection queued drops further SYNs: connect() reports
  // EINPROGRESS, exactly what a vsock connect to a host that does not answer does.
  Fd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(l.get(), reinterpret_cast<sockaddr*>(&in), sizeof in) == 0);
  socklen_t len = sizeof in;
  REQUIRE(::getsockname(l.get(), reinterpret_cast<sockaddr*>(&in), &len) == 0);
  REQUIRE(::listen(l.get(), 0) == 0);
  Fd filler(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(::connect(filler.get(), reinterpret_cast<sockaddr*>(&in), sizeof in) == 0);
  SockAddr a;
  std::memcpy(&a.storage, &in, sizeof in);
  a.len = sizeof in;
  const int before = lowest_free_fd();
  std::uint64_t now = 0;
  std::vector<int> fds;
  auto r = connect_socket(AF_INET, a, 700,
                          [&](std::uint32_t ms, int fd) { fds.push_back(fd); now += std::min<std::uint32_t>(ms, 100); return true; },
                          [&] { return now; });
  REQUIRE_FALSE(r);
  CHECK(r.error().err == ETIMEDOUT);
  REQUIRE(!fds.empty());
  CHECK(fds.front() >= 0);  // it waited on the socket, not blind
  CHECK(now >= 700);
  CHECK(lowest_free_fd() == before);
  auto r2 = connect_socket(AF_INET, a, 60000, [&](std::uint32_t, int) { return false; }, [&] { return now; });
  REQUIRE_FALSE(r2);
  CHECK(r2.error().err == ECANCELED);
  CHECK(lowest_free_fd() == before);
  // Once the backlog frees, the same path connects: the wait returns on writability.
  Fd accepted(::accept(l.get(), nullptr, nullptr));
  auto r3 = connect_socket(AF_INET, a, now + 10000,
                          [&](std::uint32_t ms, int fd) {
                            pollfd p{fd, POLLOUT, 0};
                            ::poll(&p, 1, static_cast<int>(std::min<std::uint32_t>(ms, 5000)));
                            return true;
                          },
                          [&] { return now; });
  CHECK(r3);  // owned: closed at the end of the test
}

TEST_CASE("validate_mount: fields named in errors") {
  proto::Mount m{"work", "/work", false, proto::FsType::virtiofs};
  CHECK(validate_mount(m, 0));
  m.at = "work";
  CHECK(validate_mount(m, 2).error().message.find("mounts[2].at") == 0);
  m.at = "/";
  CHECK_FALSE(validate_mount(m, 0));
  m.at = "//";
  CHECK_FALSE(validate_mount(m, 0));
  m.at = "/a/../etc";
  CHECK(validate_mount(m, 0).error().message.find("'..'") != std::string::npos);
  m.at = "/a/./b";
  CHECK_FALSE(validate_mount(m, 0));
  m.at = "/a/b..c/";
  CHECK(validate_mount(m, 0));
  m.tag = "";
  CHECK(validate_mount(m, 1).error().message.find("mounts[1].tag") == 0);
  proto::Mount b{"relative", "/x", false, proto::FsType::bind};
  CHECK(validate_mount(b, 0).error().message.find("mounts[0].tag") == 0);
  b.tag = "/srv/data";
  CHECK(validate_mount(b, 0));
}

TEST_CASE("mount calls: always nosuid,nodev; ro; bind via a remount") {
  auto v = mount_call({"work", "/w", true, proto::FsType::virtiofs});
  CHECK(v == MountCall{"work", "virtiofs", MS_NOSUID | MS_NODEV | MS_RDONLY, ""});
  auto p = mount_call({"share", "/s", false, proto::FsType::ninep});
  CHECK(p == MountCall{"share", "9p", MS_NOSUID | MS_NODEV, "trans=virtio,version=9p2000.L"});
  auto t = mount_call({"scratch", "/t", false, proto::FsType::tmpfs});
  CHECK(t.fstype == "tmpfs");
  CHECK(t.flags == (MS_NOSUID | MS_NODEV));
  proto::Mount b{"/src", "/dst", true, proto::FsType::bind};
  CHECK(mount_call(b) == MountCall{"/src", "", MS_BIND, ""});
  CHECK(bind_remount_flags(b) == (MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | MS_RDONLY));
  b.ro = false;
  CHECK((bind_remount_flags(b) & MS_RDONLY) == 0);
}

TEST_CASE("mkdir_p and is_mount_point") {
  TempDir t;
  CHECK(mkdir_p((t.path / "a/b/c").string()));
  CHECK(fs::is_directory(t.path / "a/b/c"));
  CHECK(mkdir_p((t.path / "a/b/c/").string()));
  std::ofstream(t.path / "file") << "x";
  CHECK(mkdir_p((t.path / "file/sub").string()).error().err == ENOTDIR);
  CHECK(mkdir_p((t.path / "file").string()).error().err == ENOTDIR);
  CHECK(is_mount_point("/"));
  CHECK(is_mount_point("/proc"));
  CHECK(!is_mount_point(t.path.string() + "/a"));
  CHECK(!is_mount_point(t.path.string() + "/missing"));
}

TEST_CASE("make_file: a single file's mount point, parents made, what is there kept, no symlink followed") {
  TempDir t;
  CHECK(make_file((t.path / "etc/x/hosts").string()));
  CHECK(fs::is_regular_file(t.path / "etc/x/hosts"));
  CHECK(fs::file_size(t.path / "etc/x/hosts") == 0);
  std::ofstream(t.path / "etc/kept") << "contents";
  CHECK(make_file((t.path / "etc/kept").string()));
  CHECK(fs::file_size(t.path / "etc/kept") == 8);  // never truncated
  fs::create_symlink(t.path / "elsewhere", t.path / "etc/link");
  CHECK(make_file((t.path / "etc/link").string()).error().err == ELOOP);
  CHECK(!fs::exists(t.path / "elsewhere"));
  CHECK(make_file((t.path / "etc/kept/sub").string()).error().err == ENOTDIR);
  CHECK(make_file("relative").error().err == EINVAL);
}

// Issue 44: `neshost run --rootfs DIR --read-only` on a plain root (bin/ and an empty etc/). The
// init stages the share under a tmpfs overlay, makes its mount points there, then seals it; the
// share (here a read-only bind of DIR, as virtiofsd serves it) is never written.
TEST_CASE("a read-only root: mount points made in memory, then sealed; nothing lands in the directory") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: needs root (a mount namespace of its own)");
    return;
  }
  TempDir t;
  const fs::path dir = t.path / "root", lower = t.path / "lower", upper = t.path / "upper", nr = t.path / "new";
  fs::create_directories(dir / "bin");
  fs::create_directories(dir / "etc");
  std::ofstream(dir / "bin/true") << "#!/bin/sh\n";
  for (const fs::path& p : {lower, nr}) fs::create_directories(p);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // A mount namespace of its own, private: nothing reaches the machine's mount table, and all
    // of it goes with this process.
    int bad = 0;
    auto expect = [&](bool ok, int bit) { bad |= ok ? 0 : bit; };
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(100);
    if (::mount(dir.c_str(), lower.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
        ::mount(nullptr, lower.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0)
      ::_exit(101);
    if (!stage_read_only(lower.string(), upper.string(), nr.string())) ::_exit(102);
    const std::string n = nr.string();
    for (const char* d : {"/dev", "/proc", "/sys", "/run", "/tmp", "/data"}) expect(static_cast<bool>(mkdir_p(n + d)), 1);
    for (const char* f : {"/etc/resolv.conf", "/etc/hosts", "/etc/hostname"}) expect(static_cast<bool>(make_file(n + f)), 2);
    expect(::mount("tmpfs", (n + "/tmp").c_str(), "tmpfs", 0, nullptr) == 0, 4);
    expect(seal_read_only(n).ok(), 8);
    // Sealed: writes fail as on a read-only root; the mounts on top keep their own flags.
    errno = 0;
    expect(::open((n + "/new-file").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644) < 0 && errno == EROFS, 16);
    expect(::mkdir((n + "/etc/x").c_str(), 0755) != 0 && errno == EROFS, 32);
    const int fd = ::open((n + "/tmp/scratch").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    expect(fd >= 0, 64);
    if (fd >= 0) ::close(fd);
    // The share's own files are there; the root looks as the share's does.
    struct stat a {}, b {};
    expect(::access((n + "/bin/true").c_str(), F_OK) == 0, 128);
    expect(::stat(n.c_str(), &a) == 0 && ::stat(dir.c_str(), &b) == 0 && a.st_mode == b.st_mode && a.st_uid == b.st_uid, 256);
    ::_exit(bad);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  // Nothing landed in the directory: still bin/ and an empty etc/.
  std::vector<std::string> top;
  for (const auto& e : fs::directory_iterator(dir)) top.push_back(e.path().filename().string());
  std::sort(top.begin(), top.end());
  CHECK(top == std::vector<std::string>{"bin", "etc"});
  CHECK(fs::is_empty(dir / "etc"));
}

// Issue 47: a block root's disks are found by their virtio-blk serial, not by /dev/vdX's probe order.
TEST_CASE("find_block_device: the disk whose sysfs serial matches, a trailing newline ignored; none is ENODEV, bounded") {
  TempDir t;
  const fs::path sys = t.path / "block";
  for (const char* d : {"vda", "vdb", "vdc", "loop0"}) fs::create_directories(sys / d);
  std::ofstream(sys / "vda/serial") << "nes.upper\n";
  std::ofstream(sys / "vdc/serial") << "nes.root\n";  // vdb and loop0: no serial attribute
  auto r = find_block_device("nes.root", 0, sys.c_str());
  REQUIRE_MESSAGE(r.ok(), r.error().message);
  CHECK(*r == "/dev/vdc");
  CHECK(*find_block_device("nes.upper", 0, sys.c_str()) == "/dev/vda");
  auto none = find_block_device("nes.ro", 30, sys.c_str());  // a prefix of a serial is not it
  REQUIRE(!none.ok());
  CHECK(none.error().err == ENODEV);
  CHECK(none.error().message.starts_with("no disk with serial nes.ro"));
  CHECK(find_block_device("x", 0, (t.path / "missing").c_str()).error().err == ENODEV);
}

// Issue 47: a block root's tmpfs upper is capped at upper_mib: a write past it is ENOSPC for the
// writer, and the overlay (and the lower) stay as they were.
TEST_CASE("stage_read_only: upper_mib caps the tmpfs upper; past it a write is ENOSPC") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: needs root (a mount namespace of its own)");
    return;
  }
  TempDir t;
  const fs::path dir = t.path / "root", upper = t.path / "upper", nr = t.path / "new";
  fs::create_directories(dir / "etc");
  fs::create_directories(nr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(100);
    if (!stage_read_only(dir.string(), upper.string(), nr.string(), 1)) ::_exit(101);
    const int fd = ::open((nr / "big").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) ::_exit(102);
    static char chunk[64 * 1024];
    int err = 0;
    for (int i = 0; i < 64 && !err; ++i)  // 4 MiB at most into a 1 MiB upper
      if (::write(fd, chunk, sizeof chunk) < 0) err = errno;
    ::close(fd);
    ::_exit(err == ENOSPC ? 0 : 103);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(!fs::exists(dir / "big"));
}
