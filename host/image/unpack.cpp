#include "host/image/unpack.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "host/image/entry_name.hpp"

namespace nes::image {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kWhiteout = ".wh.";
constexpr std::string_view kOpaque = ".wh..wh..opq";

int openat2_beneath(int dirfd, const std::string& path, int flags) {
  struct open_how how {};
  how.flags = static_cast<std::uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  int fd;
  do fd = static_cast<int>(::syscall(SYS_openat2, dirfd, path.empty() ? "." : path.c_str(), &how, sizeof how));
  while (fd < 0 && errno == EINTR);
  return fd;
}

/// The bytes libarchive reads, hashed and counted on the way (the layer's digest checked at the end).
struct Source {
  int fd;
  vm::Sha256 hash;
  std::uint64_t read = 0;
  char buf[1 << 17];
  int err = 0;
};

la_ssize_t source_read(struct archive*, void* p, const void** out) {
  auto* s = static_cast<Source*>(p);
  for (;;) {
    ssize_t n = ::read(s->fd, s->buf, sizeof s->buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      s->err = errno;
      return -1;
    }
    s->hash.update(std::as_bytes(std::span(s->buf, static_cast<size_t>(n))));
    s->read += static_cast<std::uint64_t>(n);
    *out = s->buf;
    return n;
  }
}

struct ArchiveCloser {
  void operator()(struct archive* a) const { archive_read_free(a); }
};

/// Removes `name` under `dirfd` (a tree, never following a symlink). ENOENT is success.
int remove_tree(int dirfd, const char* name) {
  if (::unlinkat(dirfd, name, 0) == 0 || errno == ENOENT) return 0;
  if (errno != EISDIR && errno != EPERM) return errno;
  int sub = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sub < 0) return errno;
  DIR* d = ::fdopendir(sub);
  if (!d) {
    int e = errno;
    ::close(sub);
    return e;
  }
  std::vector<std::string> names;
  while (auto* de = ::readdir(d))
    if (std::string_view n = de->d_name; n != "." && n != "..") names.emplace_back(n);
  int rc = 0;
  for (const auto& n : names)
    if (int e = remove_tree(::dirfd(d), n.c_str())) rc = e;
  ::closedir(d);
  if (rc) return rc;
  return ::unlinkat(dirfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT ? 0 : errno;
}

/// Removes everything under the directory `dirfd` (whose path in the root is `path`) that this
/// layer did not write (`keep`): an opaque directory hides the lower layers' entries only.
int remove_lower(int dirfd, const std::string& path, const std::set<std::string>& keep) {
  int dup = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return errno;
  DIR* d = ::fdopendir(dup);
  if (!d) {
    int e = errno;
    ::close(dup);
    return e;
  }
  ::rewinddir(d);
  std::vector<std::pair<std::string, bool>> names;
  while (auto* de = ::readdir(d))
    if (std::string_view n = de->d_name; n != "." && n != "..") names.emplace_back(n, de->d_type == DT_DIR);
  ::closedir(d);
  for (const auto& [n, isdir] : names) {
    std::string child = path.empty() ? n : path + "/" + n;
    if (!keep.count(child)) {
      if (int e = remove_tree(dirfd, n.c_str())) return e;
    } else if (isdir) {
      int sub = ::openat(dirfd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) return errno;
      int e = remove_lower(sub, child, keep);
      ::close(sub);
      if (e) return e;
    }
  }
  return 0;
}

/// One layer being applied.
class Applier {
 public:
  Applier(int root, const Descriptor& layer, UnpackStats& st) : root_(root), layer_(layer), st_(st) {}

  Status run(int layer_fd) {
    Source src{layer_fd, {}, 0, {}, 0};
    std::unique_ptr<struct archive, ArchiveCloser> a(archive_read_new());
    archive_read_support_filter_gzip(a.get());
    archive_read_support_filter_zstd(a.get());
    archive_read_support_format_tar(a.get());
    if (archive_read_open(a.get(), &src, nullptr, source_read, nullptr) != ARCHIVE_OK)
      return fail_archive(a.get(), src, "cannot open as tar, tar+gzip or tar+zstd");
    for (;;) {
      struct archive_entry* e = nullptr;
      int r = archive_read_next_header(a.get(), &e);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return fail_archive(a.get(), src, "corrupt or truncated archive");
      if (auto s = entry(a.get(), e); !s) return s;
      ++st_.entries;
    }
    // the rest of the stream (tar's zero blocks beyond what libarchive needed), then the digest
    for (;;) {
      const void* p;
      la_ssize_t n = source_read(nullptr, &src, &p);
      if (n < 0) return host::errno_error(src.err, fmt::format("layer {}: read", layer_.digest.str()));
      if (n == 0) break;
    }
    if (src.read != layer_.size)
      return Error{fmt::format("layer {}: {} bytes in the store, the manifest says {}", layer_.digest.str(), src.read, layer_.size)};
    if (sha256_digest(src.hash) != layer_.digest)
      return Error{fmt::format("layer {}: its bytes hash to {} (the store was altered)", layer_.digest.str(), sha256_digest(src.hash).str())};
    // directory times last, deepest first: their entries changed them as they were written
    for (auto it = dir_times_.rbegin(); it != dir_times_.rend(); ++it) {
      host::Fd parent(openat2_beneath(root_, it->parent, O_PATH | O_DIRECTORY));
      if (parent) ::utimensat(parent.get(), it->base.c_str(), it->times, AT_SYMLINK_NOFOLLOW);
    }
    return Ok{};
  }

 private:
  struct DirTime {
    std::string parent, base;
    struct timespec times[2];
  };

  Error fail_archive(struct archive* a, const Source& src, std::string_view what) {
    if (src.err) return host::errno_error(src.err, fmt::format("layer {}: read", layer_.digest.str()));
    const char* m = archive_error_string(a);
    return Error{fmt::format("layer {}: {}{}{}", layer_.digest.str(), what, m ? ": " : "", m ? m : "")};
  }

  Error bad(std::string_view name, std::string_view why, int err = 0) const {
    std::string m = fmt::format("layer {}: entry '{}': {}", layer_.digest.str(), name.substr(0, 512), why);
    if (err) m += fmt::format(": {}", std::strerror(err));
    return Error{std::move(m), err};
  }

  /// `name` made relative and clean ("./a//b/" -> "a/b"); an error for absolute names and `..`,
  /// naming the entry `entry` and, for a hard link's target, `what`.
  Result<std::string> clean(std::string_view raw, std::string_view entry, std::string_view what = {}) const {
    std::string pre = what.empty() ? std::string() : fmt::format("{} '{}': ", what, raw.substr(0, 512));
    if (raw.size() > 4096) return bad(entry, pre + "name longer than 4096 bytes");
    if (!raw.empty() && raw.front() == '/') return bad(entry, pre + "absolute name: it would land outside the image root");
    std::optional<std::string> out = clean_entry_name(raw, false);
    if (!out) return bad(entry, pre + "'..' in its name: it would land outside the image root");
    return std::move(*out);
  }

  /// The parent directory of `path` (relative, clean), resolved beneath the root; missing parents
  /// are made (0755, root's) as docker and umoci do.
  Result<host::Fd> parent_of(const std::string& path, std::string_view name) {
    auto slash = path.rfind('/');
    std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash);
    host::Fd fd(openat2_beneath(root_, dir, O_PATH | O_DIRECTORY));
    if (fd) return fd;
    if (errno == EXDEV || errno == ELOOP)
      return bad(name, "its parent directory leaves the image root through a symlink", errno);
    if (errno != ENOENT) return bad(name, "its parent directory", errno);
    // make the missing ones, one component at a time, each resolved beneath the root again
    std::string sofar;
    size_t i = 0;
    while (i < dir.size()) {
      size_t j = dir.find('/', i);
      if (j == std::string::npos) j = dir.size();
      std::string next = sofar.empty() ? dir.substr(i, j - i) : sofar + "/" + dir.substr(i, j - i);
      host::Fd cur(openat2_beneath(root_, next, O_PATH | O_DIRECTORY));
      if (!cur) {
        if (errno == EXDEV || errno == ELOOP)
          return bad(name, "its parent directory leaves the image root through a symlink", errno);
        if (errno != ENOENT) return bad(name, "its parent directory", errno);
        host::Fd up(openat2_beneath(root_, sofar, O_PATH | O_DIRECTORY));
        if (!up || ::mkdirat(up.get(), dir.substr(i, j - i).c_str(), 0755) != 0)
          return bad(name, "making its parent directory", errno);
        written_.insert(next);
      }
      sofar = next;
      i = j + 1;
    }
    fd.reset(openat2_beneath(root_, dir, O_PATH | O_DIRECTORY));
    if (!fd) return bad(name, "its parent directory", errno);
    return fd;
  }

  static std::string base_of(const std::string& path) {
    auto slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
  }

  Status entry(struct archive* a, struct archive_entry* e) {
    const char* raw_c = archive_entry_pathname(e);
    std::string_view raw = raw_c ? raw_c : "";
    auto path = clean(raw, raw);
    if (!path) return path.error();
    if (path->empty()) return Ok{};  // "./": the root itself keeps the store's mode and owner
    std::string base = base_of(*path);
    auto parent = parent_of(*path, raw);
    if (!parent) return parent.error();
    int pfd = parent->get();
    std::string dir = path->size() > base.size() ? path->substr(0, path->size() - base.size() - 1) : std::string();

    if (base.compare(0, kWhiteout.size(), kWhiteout) == 0) {
      ++st_.whiteouts;
      if (base == kOpaque) {
        host::Fd d(openat2_beneath(root_, dir, O_RDONLY | O_DIRECTORY));
        if (!d) return bad(raw, "opaque directory", errno);
        if (int err = remove_lower(d.get(), dir, written_)) return bad(raw, "clearing the opaque directory", err);
        return Ok{};
      }
      std::string target = base.substr(kWhiteout.size());
      if (target.empty() || target == "." || target == "..") return bad(raw, "whiteout of nothing");
      if (int err = remove_tree(pfd, target.c_str())) return bad(raw, "whiteout", err);
      return Ok{};
    }

    struct stat old;
    bool exists = ::fstatat(pfd, base.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0;
    const mode_t type = archive_entry_filetype(e);
    auto replace = [&]() -> int {  // make room for a new entry (a directory stays for a directory)
      if (!exists) return 0;
      if (S_ISDIR(old.st_mode) && type == AE_IFDIR) return 0;
      return remove_tree(pfd, base.c_str());
    };
    written_.insert(*path);

    if (const char* hl = archive_entry_hardlink(e)) {
      auto tpath = clean(hl, raw, "hard link target");
      if (!tpath) return tpath.error();
      if (tpath->empty()) return bad(raw, "hard link to the root");
      auto tparent = parent_of(*tpath, raw);
      if (!tparent) return tparent.error();
      if (*tpath == *path) return Ok{};
      if (int err = replace()) return bad(raw, "replacing the old entry", err);
      if (::linkat(tparent->get(), base_of(*tpath).c_str(), pfd, base.c_str(), 0) != 0)
        return bad(raw, fmt::format("hard link to '{}'", *tpath), errno);
      return Ok{};
    }

    if (int err = replace()) return bad(raw, "replacing the old entry", err);
    const mode_t perm = archive_entry_perm(e) & 07777;
    host::Fd file;
    switch (type) {
      case AE_IFDIR:
        if (!(exists && S_ISDIR(old.st_mode)) && ::mkdirat(pfd, base.c_str(), 0700) != 0) return bad(raw, "mkdir", errno);
        break;
      case AE_IFREG: {
        file.reset(::openat(pfd, base.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!file) return bad(raw, "create", errno);
        if (auto s = write_data(a, file.get(), raw); !s) return s;
        break;
      }
      case AE_IFLNK: {
        const char* t = archive_entry_symlink(e);
        if (!t || !*t) return bad(raw, "symlink without a target");
        if (::symlinkat(t, pfd, base.c_str()) != 0) return bad(raw, "symlink", errno);
        break;
      }
      case AE_IFCHR:
      case AE_IFBLK:
        if (::mknodat(pfd, base.c_str(), (type == AE_IFCHR ? S_IFCHR : S_IFBLK) | 0600,
                      makedev(archive_entry_rdevmajor(e), archive_entry_rdevminor(e))) != 0)
          return bad(raw, "mknod", errno);
        break;
      case AE_IFIFO:
        if (::mknodat(pfd, base.c_str(), S_IFIFO | 0600, 0) != 0) return bad(raw, "mkfifo", errno);
        break;
      default:
        return bad(raw, fmt::format("unsupported entry type 0{:o}", type));
    }
    return metadata(e, pfd, base, file.get(), type, perm, raw, *path);
  }

  Status write_data(struct archive* a, int fd, std::string_view raw) {
    const void* buf;
    size_t size;
    la_int64_t offset;
    la_int64_t end = 0;
    for (;;) {
      int r = archive_read_data_block(a, &buf, &size, &offset);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
        const char* m = archive_error_string(a);
        return bad(raw, fmt::format("corrupt or truncated archive: {}", m ? m : "reading its content"));
      }
      const char* p = static_cast<const char*>(buf);
      size_t left = size;
      la_int64_t at = offset;
      while (left > 0) {
        ssize_t w = ::pwrite(fd, p, left, at);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return bad(raw, "write", errno);
        p += w;
        left -= static_cast<size_t>(w);
        at += w;
      }
      st_.bytes += size;
      end = offset + static_cast<la_int64_t>(size);
    }
    (void)end;
    return Ok{};
  }

  Status metadata(struct archive_entry* e, int pfd, const std::string& base, int fd, mode_t type, mode_t perm,
                  std::string_view raw, const std::string& path) {
    const char* b = base.c_str();
    if (type == AE_IFREG && archive_entry_size_is_set(e) &&
        ::ftruncate(fd, static_cast<off_t>(archive_entry_size(e))) != 0)  // a sparse file's tail hole
      return bad(raw, "truncate", errno);
    if (::fchownat(pfd, b, static_cast<uid_t>(archive_entry_uid(e)), static_cast<gid_t>(archive_entry_gid(e)),
                   AT_SYMLINK_NOFOLLOW) != 0)
      return bad(raw, "chown", errno);
    if (type != AE_IFLNK && ::fchmodat(pfd, b, perm, 0) != 0) return bad(raw, "chmod", errno);
    // xattrs after chown (a chown clears security.capability), never on a symlink
    archive_entry_xattr_reset(e);
    const char* name;
    const void* value;
    size_t vsize;
    if (type != AE_IFLNK && archive_entry_xattr_count(e) > 0) {
      host::Fd target(::openat(pfd, b, O_PATH | O_NOFOLLOW | O_CLOEXEC));
      if (!target) return bad(raw, "open for xattrs", errno);
      std::string proc = fmt::format("/proc/self/fd/{}", target.get());
      while (archive_entry_xattr_next(e, &name, &value, &vsize) == ARCHIVE_OK) {
        if (::setxattr(proc.c_str(), name, value, vsize, 0) != 0)
          return bad(raw, fmt::format("xattr {}", name), errno);
      }
    }
    struct timespec times[2];
    times[0].tv_sec = archive_entry_atime_is_set(e) ? archive_entry_atime(e) : archive_entry_mtime(e);
    times[0].tv_nsec = archive_entry_atime_is_set(e) ? archive_entry_atime_nsec(e) : archive_entry_mtime_nsec(e);
    times[1].tv_sec = archive_entry_mtime(e);
    times[1].tv_nsec = archive_entry_mtime_nsec(e);
    if (type == AE_IFDIR) {
      auto slash = path.rfind('/');
      dir_times_.push_back({slash == std::string::npos ? std::string() : path.substr(0, slash), base, {times[0], times[1]}});
    } else if (::utimensat(pfd, b, times, AT_SYMLINK_NOFOLLOW) != 0) {
      return bad(raw, "set times", errno);
    }
    return Ok{};
  }

  int root_;
  const Descriptor& layer_;
  UnpackStats& st_;
  std::set<std::string> written_;  // paths this layer wrote (an opaque directory keeps them)
  std::vector<DirTime> dir_times_;
};

}  // namespace

Status apply_layer(int root_fd, int layer_fd, const Descriptor& layer, UnpackStats& stats) {
  if (!is_layer_media_type(layer.media_type))
    return Error{fmt::format("layer {}: media type '{}' is not a layer this store unpacks (tar, tar+gzip, tar+zstd)",
                             layer.digest.str(), layer.media_type)};
  return Applier(root_fd, layer, stats).run(layer_fd);
}

Result<Manifest> resolve_manifest(const Store& store, std::string_view name, std::string_view platform,
                                  Descriptor* manifest_desc) {
  auto ref = store.find_ref(name);
  if (!ref) return ref.error();
  if (!*ref) return Error{fmt::format("no such image: {}", name), ENOENT};
  Descriptor d = **ref;
  for (int depth = 0; depth < 4; ++depth) {
    auto data = store.read_blob(d.digest, 4 << 20);
    if (!data) return data.error();
    std::string what = fmt::format("image {}: manifest {}", name, d.digest.str());
    auto kind = sniff_document(*data, what);
    if (!kind) return kind.error();
    if (*kind == DocKind::manifest) {
      if (manifest_desc) *manifest_desc = d;
      return parse_manifest(*data, what);
    }
    auto ix = parse_index(*data, what);
    if (!ix) return ix.error();
    auto sel = select_platform(*ix, platform, what);
    if (!sel) return sel.error();
    d = *sel;
  }
  return Error{fmt::format("image {}: indexes nested deeper than 4", name)};
}

Result<fs::path> unpack_image(Store& store, const Manifest& manifest, UnpackStats* stats) {
  fs::path final_root = store.root_path(manifest.config.digest);
  if (fs::is_directory(final_root)) return final_root;
  auto hold = store.hold();  // gc() would remove a roots/.tmp-* it finds
  if (!hold) return hold.error();
  std::string tmpl = (store.root() / "roots" / ".tmp-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) return host::errno_error(errno, fmt::format("unpack: mkdtemp in {}", (store.root() / "roots").string()));
  fs::path tmp = tmpl;
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      if (!p.empty()) fs::remove_all(p, ec);
    }
  } cleanup{tmp};
  if (::mkdir((tmp / "rootfs").c_str(), 0755) != 0) return host::errno_error(errno, "unpack: mkdir rootfs");
  host::Fd root(::open((tmp / "rootfs").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root) return host::errno_error(errno, "unpack: open rootfs");
  UnpackStats st;
  for (const auto& layer : manifest.layers) {
    auto fd = store.open_blob(layer.digest);
    if (!fd) return Error{fmt::format("layer {}: not in the store", layer.digest.str()), fd.error().err};
    if (auto s = apply_layer(root.get(), fd->get(), layer, st); !s) return s.error();
  }
  ::syncfs(root.get());
  fs::path dst = final_root.parent_path();
  if (::rename(tmp.c_str(), dst.c_str()) != 0) {
    if (errno == EEXIST || errno == ENOTEMPTY) return final_root;  // another unpack of it won
    return host::errno_error(errno, fmt::format("unpack: rename into {}", dst.string()));
  }
  cleanup.p.clear();
  if (stats) *stats = st;
  return final_root;
}

}  // namespace nes::image
