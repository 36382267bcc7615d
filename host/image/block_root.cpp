#include "host/image/block_root.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <simdjson.h>

#include "host/image/tool.hpp"
#include "host/vm/sha256.hpp"

namespace nes::image {

namespace fs = std::filesystem;
namespace sj = simdjson;

namespace {

constexpr std::uint64_t kMaxRecord = 4096;

/// The identity of the file when it was hashed: any change means "hash it again".
struct Identity {
  std::uint64_t dev = 0, ino = 0, size = 0;
  std::int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const Identity&) const = default;
};

Identity identity_of(const struct stat& st) {
  return Identity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
                  static_cast<std::uint64_t>(st.st_size),
                  static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                  static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec};
}

struct Record {
  std::string digest;
  Identity id;
};

fs::path record_path(const fs::path& file) { return fs::path(file.string() + ".json"); }

std::string record_json(const Record& r) {
  return fmt::format(R"({{"digest":"{}","size":{},"dev":{},"ino":{},"mtime_ns":{},"ctime_ns":{}}})"
                     "\n",
                     r.digest, r.id.size, r.id.dev, r.id.ino, r.id.mtime_ns, r.id.ctime_ns);
}

/// The record beside `file`; err ENOENT when there is none.
Result<Record> read_record(const fs::path& file) {
  fs::path p = record_path(file);
  host::Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return host::errno_error(errno, fmt::format("block root record {}", p.string()));
  std::string text(kMaxRecord + 1, '\0');
  ssize_t n;
  do n = ::read(fd.get(), text.data(), text.size());
  while (n < 0 && errno == EINTR);
  if (n < 0) return host::errno_error(errno, fmt::format("read {}", p.string()));
  if (static_cast<std::uint64_t>(n) > kMaxRecord) return Error{fmt::format("{}: larger than {} bytes", p.string(), kMaxRecord)};
  text.resize(static_cast<size_t>(n));
  sj::dom::parser parser;
  sj::dom::element root;
  Error bad{fmt::format("block root record {}: not a record (digest, size, dev, ino, mtime_ns, ctime_ns)", p.string())};
  if (parser.parse(sj::padded_string(text)).get(root)) return bad;
  Record r;
  std::string_view d;
  std::uint64_t dev, ino, size;
  std::int64_t mt, ct;
  if (root["digest"].get(d) || root["size"].get(size) || root["dev"].get(dev) || root["ino"].get(ino) ||
      root["mtime_ns"].get(mt) || root["ctime_ns"].get(ct))
    return bad;
  auto dg = Digest::parse(d);
  if (!dg) return bad;
  r.digest = dg->str();
  r.id = Identity{dev, ino, size, mt, ct};
  return r;
}

/// SHA-256 of the whole file `fd`, from offset 0; "sha256:HEX".
Result<std::string> hash_fd(int fd, const fs::path& what) {
  vm::Sha256 h;
  std::vector<char> buf(1 << 20);
  off_t off = 0;
  for (;;) {
    ssize_t r = ::pread(fd, buf.data(), buf.size(), off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return host::errno_error(errno, fmt::format("read {}", what.string()));
    if (r == 0) break;
    h.update(std::string_view(buf.data(), static_cast<size_t>(r)));
    off += r;
  }
  return sha256_digest(h).str();
}

/// What `mke2fs -d` needs for `dir`: bytes of data blocks and the inode count (lstat, never
/// following a symlink; hard links counted once).
struct TreeSize {
  std::uint64_t blocks = 0, inodes = 0;
};
TreeSize measure_tree(const fs::path& dir) {
  TreeSize t;
  std::error_code ec;
  std::set<std::pair<dev_t, ino_t>> seen;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st;
    if (::lstat(it->path().c_str(), &st) != 0) continue;
    if (st.st_nlink > 1 && !S_ISDIR(st.st_mode) && !seen.insert({st.st_dev, st.st_ino}).second) continue;
    ++t.inodes;
    if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode) || (S_ISLNK(st.st_mode) && st.st_size >= 60))
      t.blocks += (static_cast<std::uint64_t>(st.st_size) + 4095) / 4096 + (S_ISDIR(st.st_mode) ? 1 : 0);
  }
  return t;
}

/// Builds the image of `src` into `out` (an existing empty file).
Status make_fs(BlockFs fs_kind, const fs::path& src, const fs::path& out, int attempt) {
  if (fs_kind == BlockFs::erofs) {
    // Uncompressed (the guest reads it at the disk's speed; LZ4 trades CPU for size), xattrs kept
    // (-x default: inline, shared when repeated), per-file mtimes kept (extended inodes where they
    // differ from the build time), numeric owners as in the tree. A fixed UUID: the same tree
    // makes the same bytes apart from the build time.
    return run_tool({"mkfs.erofs", "--quiet", "-U", "00000000-0000-0000-0000-000000000000", out.string(), src.string()},
                    "erofs-utils");
  }
  TreeSize t = measure_tree(src);
  // 4 KiB blocks, 256-byte inodes (xattrs in the inode), no journal and no reserved blocks (it is
  // never written after this), room for the metadata: the estimate doubles on each retry.
  std::uint64_t inodes = t.inodes + t.inodes / 8 + 1024;
  std::uint64_t bytes = (t.blocks + t.blocks / 8) * 4096 + inodes * 256 + (16u << 20);
  bytes <<= attempt;
  bytes = (bytes + (4u << 20) - 1) / (4u << 20) * (4u << 20);
  return run_tool({"mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-I", "256", "-N", std::to_string(inodes), "-m", "0",
                   "-O", "^has_journal", "-E", "root_owner=0:0", "-d", src.string(), out.string(),
                   std::to_string(bytes / 1024) + "k"},
                  "e2fsprogs");
}

Result<Lock> flock_path(const fs::path& p) {
  host::Fd fd(::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd) return host::errno_error(errno, fmt::format("open {}", p.string()));
  while (::flock(fd.get(), LOCK_EX) != 0)
    if (errno != EINTR) return host::errno_error(errno, fmt::format("flock {}", p.string()));
  return Lock(std::move(fd));
}

/// verify_block_root's work on an open file: Ok, or "changed on disk"; the record refreshed
/// when only the identity changed.
Status verify_open(const BlockRoot& root, const Record& rec) {
  host::Fd fd(::open(root.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return host::errno_error(errno, fmt::format("block root {}", root.path.string()));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return host::errno_error(errno, fmt::format("stat {}", root.path.string()));
  if (!S_ISREG(st.st_mode)) return Error{fmt::format("block root {}: not a regular file", root.path.string())};
  if (rec.digest != root.digest)
    return Error{fmt::format("block root {}: changed on disk ({} expected, {} recorded)", root.path.string(), root.digest,
                             rec.digest)};
  Identity now = identity_of(st);
  if (now == rec.id) return Ok{};
  auto d = hash_fd(fd.get(), root.path);
  if (!d) return d.error();
  if (*d != root.digest)
    return Error{fmt::format("block root {}: changed on disk ({} expected, {} found)", root.path.string(), root.digest, *d)};
  // Same bytes, new identity (a copied store, a touch): remember it so the next run does not hash.
  if (::fstat(fd.get(), &st) == 0) (void)write_file_durable(record_path(root.path), record_json({*d, identity_of(st)}));
  return Ok{};
}

}  // namespace

std::string_view block_fs_name(BlockFs fs_kind) { return fs_kind == BlockFs::ext4 ? "ext4" : "erofs"; }

Status verify_block_root(const BlockRoot& root) {
  auto rec = read_record(root.path);
  if (!rec) return rec.error();
  return verify_open(root, *rec);
}

Result<BlockRoot> ensure_block_root(const Store& store, std::string_view config_digest, BlockFs fs_kind) {
  auto cfg = config_digest.starts_with("sha256:") ? Digest::parse(config_digest) : Digest::from_hex(config_digest);
  if (!cfg) return cfg.error();
  fs::path src = store.root_path(*cfg);
  fs::path dir = src.parent_path();
  struct stat st;
  if (::stat(src.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Error{fmt::format("image {}: not unpacked ({} missing)", cfg->str(), src.string()), ENOENT};
  BlockRoot root;
  root.fs = fs_kind;
  root.path = dir / fmt::format("root.{}", block_fs_name(fs_kind));

  auto hold = store.hold();  // GC (rmi, image prune) is refused while this runs
  if (!hold) return hold.error();
  auto lock = flock_path(dir / "root.lock");
  if (!lock) return lock.error();

  if (::stat(root.path.c_str(), &st) == 0) {
    auto rec = read_record(root.path);
    if (rec) {
      root.digest = rec->digest;
      root.size = static_cast<std::uint64_t>(st.st_size);
      if (auto s = verify_open(root, *rec); !s) return s.error();
      return root;
    }
    if (rec.error().err != ENOENT) return rec.error();
    // No record: a build that died between its rename and its record. Built again below.
  } else if (errno != ENOENT) {
    return host::errno_error(errno, fmt::format("block root {}", root.path.string()));
  }

  // Left by a build that was killed: nobody else builds here (we hold the lock).
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().starts_with(".tmp-root.")) fs::remove(e.path(), ec);

  std::string tmpl = (dir / fmt::format(".tmp-root.{}.XXXXXX", block_fs_name(fs_kind))).string();
  host::Fd tmpfd(::mkstemp(tmpl.data()));
  if (!tmpfd) return host::errno_error(errno, fmt::format("block root: mkstemp in {}", dir.string()));
  fs::path tmp = tmpl;
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      if (!p.empty()) ::unlink(p.c_str());
    }
  } cleanup{tmp};
  tmpfd.reset();
  Status made = make_fs(fs_kind, src, tmp, 0);
  if (!made && fs_kind == BlockFs::ext4) {
    ::truncate(tmp.c_str(), 0);
    made = make_fs(fs_kind, src, tmp, 2);  // the estimate was short (very many small files): 4x
  }
  if (!made) return Error{fmt::format("block root of image {}: {}", cfg->str(), made.error().message), made.error().err};

  host::Fd fd(::open(tmp.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return host::errno_error(errno, fmt::format("open {}", tmp.string()));
  if (::fsync(fd.get()) != 0) return host::errno_error(errno, fmt::format("fsync {}", tmp.string()));
  auto d = hash_fd(fd.get(), tmp);
  if (!d) return d.error();
  ::fchmod(fd.get(), 0444);  // never written again: QEMU attaches it read-only
  if (::rename(tmp.c_str(), root.path.c_str()) != 0)
    return host::errno_error(errno, fmt::format("block root: rename into {}", root.path.string()));
  cleanup.p.clear();
  if (::fstat(fd.get(), &st) != 0) return host::errno_error(errno, fmt::format("stat {}", root.path.string()));
  root.digest = *d;
  root.size = static_cast<std::uint64_t>(st.st_size);
  if (auto s = write_file_durable(record_path(root.path), record_json({*d, identity_of(st)})); !s) return s.error();
  return root;
}

}  // namespace nes::image
