// An image's block root (host/image/block_root.hpp) on a real temp store, nothing mounted: a tree
// with owners, setuid, security.capability, hard links, a device, a fifo, a symlink and an old
// mtime packed by mkfs.erofs (read back from the image's own inodes) and by mke2fs -d (read back
// with debugfs); the cache hit that does not hash again; a file changed on disk refused, naming
// it; two builds of one image at once building it once; GC removing it with the image's root.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "tests/support/shell_output.hpp"
#include "tests/support/temp_dir.hpp"

#include "host/image/block_root.hpp"

using namespace nes::image;
namespace fs = std::filesystem;

namespace {

const std::string kHex(64, 'c');

using nes::test::TempDir;  // tests/support/temp_dir.hpp

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, std::string_view s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

using sh_fn = std::string (*)(const std::string&);
constexpr sh_fn sh = nes::test::shell_output;  // tests/support/shell_output.hpp

// A VFS_CAP_REVISION_2 security.capability value: cap_net_raw (13) permitted, effective.
std::string cap_value() {
  std::string v(20, '\0');
  std::uint32_t words[5] = {0x02000001u, 1u << 13, 0, 0, 0};
  std::memcpy(v.data(), words, 20);
  return v;
}

/// roots/HEX/rootfs in the store at `state`, as unpack_image leaves one.
fs::path make_tree(const Store& s) {
  Digest cfg{kHex};
  fs::path r = s.root_path(cfg);
  fs::create_directories(r / "d");
  spit(r / "a", "hello\n");
  REQUIRE(::chown((r / "a").c_str(), 1000, 1001) == 0);
  REQUIRE(::chmod((r / "a").c_str(), 0640) == 0);
  REQUIRE(::link((r / "a").c_str(), (r / "d/b").c_str()) == 0);
  spit(r / "cap", std::string(10000, 'x'));
  REQUIRE(::chmod((r / "cap").c_str(), 04755) == 0);
  std::string cap = cap_value();
  REQUIRE(::lsetxattr((r / "cap").c_str(), "security.capability", cap.data(), cap.size(), 0) == 0);
  REQUIRE(::mknod((r / "null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0);
  REQUIRE(::chmod((r / "null").c_str(), 0666) == 0);  // past the umask
  REQUIRE(::mkfifo((r / "fifo").c_str(), 0600) == 0);
  REQUIRE(::symlink("/bin/busybox", (r / "sh").c_str()) == 0);
  struct timespec ts[2] = {{1577934245, 123456789}, {1577934245, 123456789}};  // 2020-01-02 03:04:05.123456789
  REQUIRE(::utimensat(AT_FDCWD, (r / "d").c_str(), ts, 0) == 0);
  return r;
}

/// The fields of one EROFS inode, read from the image's bytes (erofs_fs.h: the superblock at
/// 1024, inodes at meta_blkaddr * 4096 + nid * 32, compact 32 or extended 64 bytes, inline
/// xattrs after the inode). The nid comes from `dump.erofs --path`.
struct ErofsInode {
  unsigned mode = 0, nlink = 0, uid = 0, gid = 0;
  std::uint32_t rdev = 0;
  std::int64_t mtime = 0;
  std::uint32_t mtime_nsec = 0;
  std::string capability;  // security.capability's value, "" when absent
};

template <class T>
T at(const std::string& img, size_t off) {
  T v{};
  REQUIRE(off + sizeof(T) <= img.size());
  std::memcpy(&v, img.data() + off, sizeof(T));
  return v;
}

ErofsInode erofs_inode(const fs::path& file, const std::string& path) {
  std::string out = sh(fmt::format("dump.erofs --path={} {} 2>&1", path, file.string()));
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(out, m, std::regex("NID: (\\d+)")), out);
  size_t nid = std::stoul(m[1]);
  std::string img = slurp(file);
  size_t meta = at<std::uint32_t>(img, 1024 + 0x28);
  size_t off = meta * 4096 + nid * 32;
  ErofsInode n;
  auto format = at<std::uint16_t>(img, off);
  auto icount = at<std::uint16_t>(img, off + 2);
  n.mode = at<std::uint16_t>(img, off + 4);
  n.rdev = at<std::uint32_t>(img, off + 16);
  size_t isize;
  if (format & 1) {  // extended
    n.uid = at<std::uint32_t>(img, off + 24);
    n.gid = at<std::uint32_t>(img, off + 28);
    n.mtime = static_cast<std::int64_t>(at<std::uint64_t>(img, off + 32));
    n.mtime_nsec = at<std::uint32_t>(img, off + 40);
    n.nlink = at<std::uint32_t>(img, off + 44);
    isize = 64;
  } else {
    n.nlink = at<std::uint16_t>(img, off + 6);
    n.uid = at<std::uint16_t>(img, off + 24);
    n.gid = at<std::uint16_t>(img, off + 26);
    n.mtime = static_cast<std::int64_t>(at<std::uint64_t>(img, 1024 + 24));  // the build time
    isize = 32;
  }
  if (icount > 0) {
    size_t x = off + isize, end = x + 12 + (icount - 1u) * 4u;
    x += 12 + at<std::uint8_t>(img, x + 4) * 4u;  // header, shared xattr ids (none here)
    while (x + 4 <= end) {
      auto name_len = at<std::uint8_t>(img, x);
      auto index = at<std::uint8_t>(img, x + 1);
      auto value_size = at<std::uint16_t>(img, x + 2);
      std::string name = img.substr(x + 4, name_len);
      if (index == 6 && name == "capability") n.capability = img.substr(x + 4 + name_len, value_size);
      x += (4u + name_len + value_size + 3u) & ~3u;
    }
  }
  return n;
}

}  // namespace

TEST_CASE("erofs: owners, modes, xattrs, hard links, devices, mtimes survive") {
  TempDir t;
  auto s = Store::open(t.path);
  REQUIRE(s);
  make_tree(*s);
  auto r = ensure_block_root(*s, "sha256:" + kHex);
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
  CHECK(r->path == s->root() / "roots" / kHex / "root.erofs");
  CHECK(r->fs == BlockFs::erofs);
  CHECK(r->size == fs::file_size(r->path));
  CHECK(r->size % 4096 == 0);
  CHECK(r->digest == sha256_of(slurp(r->path)).str());
  CHECK(sh(fmt::format("fsck.erofs {} >/dev/null 2>&1 && echo ok", r->path.string())) == "ok\n");

  auto a = erofs_inode(r->path, "/a");
  CHECK(a.mode == (S_IFREG | 0640));
  CHECK(a.uid == 1000);
  CHECK(a.gid == 1001);
  CHECK(a.nlink == 2);
  auto b = erofs_inode(r->path, "/d/b");  // the hard link: the same inode
  CHECK(b.nlink == 2);
  CHECK(b.uid == 1000);
  auto cap = erofs_inode(r->path, "/cap");
  CHECK(cap.mode == (S_IFREG | 04755));
  CHECK(cap.capability == cap_value());
  auto dev = erofs_inode(r->path, "/null");
  CHECK(dev.mode == (S_IFCHR | 0666));
  CHECK(dev.rdev == ((3u & 0xff) | (1u << 8)));  // new_encode_dev(1, 3)
  CHECK(erofs_inode(r->path, "/fifo").mode == (S_IFIFO | 0600));
  CHECK((erofs_inode(r->path, "/sh").mode & S_IFMT) == S_IFLNK);
  auto d = erofs_inode(r->path, "/d");
  CHECK(d.mtime == 1577934245);
  CHECK(d.mtime_nsec == 123456789);
  CHECK(sh(fmt::format("dump.erofs --path=/a {} 2>&1", r->path.string())).find("Size: 6 ") != std::string::npos);
}

TEST_CASE("ext4: owners, modes, xattrs, hard links, devices survive (debugfs)") {
  TempDir t;
  auto s = Store::open(t.path);
  REQUIRE(s);
  make_tree(*s);
  auto r = ensure_block_root(*s, kHex, BlockFs::ext4);
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
  CHECK(r->path.filename() == "root.ext4");
  CHECK(r->digest == sha256_of(slurp(r->path)).str());
  auto stat = [&](const char* p) { return sh(fmt::format("debugfs -R 'stat {}' {} 2>/dev/null", p, r->path.string())); };
  std::string a = stat("/a");
  CHECK(std::regex_search(a, std::regex("User: +1000 +Group: +1001")));
  CHECK(std::regex_search(a, std::regex("Mode: +0640")));
  CHECK(std::regex_search(a, std::regex("Links: 2")));
  std::string cap = stat("/cap");
  CHECK(std::regex_search(cap, std::regex("Mode: +04755")));
  CHECK(cap.find("security.capability (20)") != std::string::npos);
  CHECK(std::regex_search(stat("/null"), std::regex("Device major/minor number: 01:03")));
  CHECK(std::regex_search(stat("/fifo"), std::regex("Type: FIFO")));
  CHECK(sh(fmt::format("debugfs -R 'cat /d/b' {} 2>/dev/null", r->path.string())) == "hello\n");
  CHECK(sh(fmt::format("e2fsck -fn {} >/dev/null 2>&1 && echo ok", r->path.string())) == "ok\n");
}

TEST_CASE("cached: no rehash while unchanged; a changed file refused naming it; a touched one rehashed") {
  TempDir t;
  auto s = Store::open(t.path);
  REQUIRE(s);
  make_tree(*s);
  auto r = ensure_block_root(*s, kHex);
  REQUIRE(r);
  fs::path rec = r->path.string() + ".json";
  REQUIRE(fs::exists(rec));

  // The record names another digest but the file's identity is the recorded one: accepted as
  // recorded, which only a run that did not hash the file can do.
  std::string text = slurp(rec), fake = text;
  fake.replace(fake.find(r->digest), r->digest.size(), "sha256:" + std::string(64, 'e'));
  spit(rec, fake);
  auto cached = ensure_block_root(*s, kHex);
  REQUIRE(cached);
  CHECK(cached->digest == "sha256:" + std::string(64, 'e'));
  spit(rec, text);
  cached = ensure_block_root(*s, kHex);
  REQUIRE(cached);
  CHECK(cached->digest == r->digest);
  CHECK(verify_block_root(*cached));

  // Same bytes, new ctime/mtime: hashed again, accepted, the record refreshed.
  struct timespec ts[2] = {{1, 0}, {1, 0}};
  REQUIRE(::utimensat(AT_FDCWD, r->path.c_str(), ts, 0) == 0);
  CHECK(verify_block_root(*r));
  CHECK(slurp(rec) != text);
  CHECK(slurp(rec).find(r->digest) != std::string::npos);

  // One byte changed in place: refused by both, naming the file; never rebuilt over.
  {
    std::fstream f(r->path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    f.put('!');
  }
  auto v = verify_block_root(*r);
  REQUIRE(!v);
  CHECK(v.error().message.find(r->path.string()) != std::string::npos);
  CHECK(v.error().message.find("changed on disk") != std::string::npos);
  auto again = ensure_block_root(*s, kHex);
  REQUIRE(!again);
  CHECK(again.error().message.find("changed on disk") != std::string::npos);

  // Removed: built again, the same image bytes (fixed UUID; the tree's mtimes) apart from the
  // build time, so only its presence is checked.
  fs::remove(r->path);
  auto rebuilt = ensure_block_root(*s, kHex);
  REQUIRE(rebuilt);
  CHECK(verify_block_root(*rebuilt));
  fs::remove(rebuilt->path);
  CHECK(!verify_block_root(*rebuilt));
}

TEST_CASE("bad input: no unpacked root, a bad digest, a missing tool") {
  TempDir t;
  auto s = Store::open(t.path);
  REQUIRE(s);
  auto r = ensure_block_root(*s, kHex);
  REQUIRE(!r);
  CHECK(r.error().message.find("not unpacked") != std::string::npos);
  CHECK(!ensure_block_root(*s, "sha512:abc"));
  make_tree(*s);
  std::string path = ::getenv("PATH") ? ::getenv("PATH") : "";
  ::setenv("PATH", t.path.c_str(), 1);
  auto no_tool = ensure_block_root(*s, kHex);
  ::setenv("PATH", path.c_str(), 1);
  REQUIRE(!no_tool);
  CHECK(no_tool.error().message.find("erofs-utils") != std::string::npos);
  for (auto& e : fs::directory_iterator(s->root() / "roots" / kHex)) CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);
}

TEST_CASE("two builds at once build once; GC removes the block root with its image's root") {
  TempDir t;
  auto s = Store::open(t.path);
  REQUIRE(s);
  make_tree(*s);
  // A mkfs.erofs first in PATH that counts its runs, then runs Debian's.
  fs::path bin = t.path / "bin";
  fs::create_directories(bin);
  spit(bin / "mkfs.erofs", fmt::format("#!/bin/sh\necho run >> {}\nexec /usr/bin/mkfs.erofs \"$@\"\n", (t.path / "runs").string()));
  fs::permissions(bin / "mkfs.erofs", fs::perms::owner_all);
  std::string path = ::getenv("PATH") ? ::getenv("PATH") : "";
  ::setenv("PATH", (bin.string() + ":" + path).c_str(), 1);
  Result<BlockRoot> r1 = Error{"not run"}, r2 = Error{"not run"};
  {
    std::thread a([&] { r1 = ensure_block_root(*s, kHex); });
    std::thread b([&] { r2 = ensure_block_root(*s, kHex); });
    a.join();
    b.join();
  }
  ::setenv("PATH", path.c_str(), 1);
  REQUIRE(r1);
  REQUIRE(r2);
  CHECK(r1->digest == r2->digest);
  CHECK(slurp(t.path / "runs") == "run\n");
  CHECK(verify_block_root(*r1));

  auto kept = s->gc({Digest{kHex}});
  REQUIRE(kept);
  CHECK(fs::exists(r1->path));
  auto rep = s->gc();
  REQUIRE(rep);
  CHECK(rep->roots == std::vector<std::string>{kHex});
  CHECK(!fs::exists(r1->path));
  CHECK(!fs::exists(r1->path.parent_path()));
}
