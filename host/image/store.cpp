#include "host/image/store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include <fmt/format.h>

namespace nes::image {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kLayoutFile = R"({"imageLayoutVersion":"1.0.0"})";
constexpr std::uint64_t kMaxIndex = 16 << 20;

Status fsync_dir(const fs::path& dir) {
  host::Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d || ::fsync(d.get()) != 0) return host::errno_error(errno, fmt::format("fsync {}", dir.string()));
  return Ok{};
}

Status write_all(int fd, const char* p, size_t n, std::string_view what) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return host::errno_error(errno, what);
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Ok{};
}

Result<std::string> read_fd(int fd, std::uint64_t max, std::string_view what) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return host::errno_error(errno, fmt::format("read {}", what));
    if (r == 0) break;
    if (out.size() + static_cast<size_t>(r) > max) return Error{fmt::format("{}: larger than {} bytes", what, max)};
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

Result<Lock> flock_file(const fs::path& p, int op, std::string_view what) {
  host::Fd fd(::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd) return host::errno_error(errno, fmt::format("open {}", p.string()));
  while (::flock(fd.get(), op) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) return Error{fmt::format("{}: busy", what), EWOULDBLOCK};
    return host::errno_error(errno, fmt::format("flock {}", p.string()));
  }
  return Lock(std::move(fd));
}

std::string index_json(const std::vector<Descriptor>& manifests) {
  std::string s = fmt::format(R"({{"schemaVersion":2,"mediaType":"{}","manifests":[)", media::kOciIndex);
  for (size_t i = 0; i < manifests.size(); ++i) {
    if (i) s += ",";
    s += descriptor_json(manifests[i]);
  }
  return s + "]}\n";
}

}  // namespace

Status write_file_durable(const fs::path& path, std::string_view data, unsigned mode, bool sync_dir) {
  fs::path tmp = path;
  tmp += fmt::format(".{}.tmp", ::getpid());
  host::Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!fd) return host::errno_error(errno, fmt::format("create {}", tmp.string()));
  auto w = write_all(fd.get(), data.data(), data.size(), fmt::format("write {}", tmp.string()));
  if (w && ::fsync(fd.get()) != 0) w = host::errno_error(errno, fmt::format("fsync {}", tmp.string()));
  if (w && ::rename(tmp.c_str(), path.c_str()) != 0) w = host::errno_error(errno, fmt::format("rename to {}", path.string()));
  if (!w) {
    ::unlink(tmp.c_str());
    return w;
  }
  return sync_dir ? fsync_dir(path.parent_path()) : Status(Ok{});
}

// ---- BlobWriter ----

Status BlobWriter::write(std::span<const std::byte> bytes) {
  if (present_) return Ok{};
  if (failed_) return Error{fmt::format("blob {}: writer already failed", expected_.str())};
  if (written_ + bytes.size() > expected_size_) {
    failed_ = true;
    return Error{fmt::format("blob {}: more than the expected {} bytes", expected_.str(), expected_size_)};
  }
  hash_->update(bytes);
  written_ += bytes.size();
  while (!bytes.empty()) {
    if (buf_.empty() && bytes.size() >= kWriteChunk) {  // a whole chunk: straight to the file
      if (auto f = put(bytes.first(kWriteChunk)); !f) return f;
      bytes = bytes.subspan(kWriteChunk);
      continue;
    }
    const std::size_t take = std::min(bytes.size(), kWriteChunk - buf_.size());
    buf_.insert(buf_.end(), bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(take));
    bytes = bytes.subspan(take);
    if (buf_.size() == kWriteChunk)
      if (auto f = flush(); !f) return f;
  }
  return Ok{};
}

Status BlobWriter::flush() {
  if (buf_.empty()) return Ok{};
  auto f = put(buf_);
  buf_.clear();
  return f;
}

Status BlobWriter::put(std::span<const std::byte> piece) {
  auto w = write_all(file_.get(), reinterpret_cast<const char*>(piece.data()), piece.size(),
                     fmt::format("blob {}: write", expected_.str()));
  if (!w) {
    failed_ = true;
    return w;
  }
  // Writeback of this piece starts now (asynchronously: no wait), so the fsync in commit() finds
  // at most the last piece dirty. An error here is only advice lost: the fsync still decides.
  (void)::sync_file_range(file_.get(), static_cast<off_t>(in_file_), static_cast<off_t>(piece.size()),
                          SYNC_FILE_RANGE_WRITE);
  in_file_ += piece.size();
  return Ok{};
}

Result<Digest> BlobWriter::commit(bool sync_dir) {
  if (present_) return expected_;
  if (failed_ || !file_) return Error{fmt::format("blob {}: writer already failed", expected_.str())};
  failed_ = true;  // one commit per writer
  if (written_ != expected_size_)
    return Error{fmt::format("blob {}: size mismatch: expected {} bytes, got {}", expected_.str(), expected_size_, written_)};
  Digest got = sha256_digest(*hash_);
  if (got != expected_)
    return Error{fmt::format("blob {}: digest mismatch: the {} bytes received hash to {}", expected_.str(), written_, got.str())};
  if (auto f = flush(); !f) return f.error();
  if (::fsync(file_.get()) != 0) return host::errno_error(errno, fmt::format("blob {}: fsync", expected_.str()));
  fs::path dst = root_ / "blobs/sha256" / expected_.hex;
  std::string proc = fmt::format("/proc/self/fd/{}", file_.get());
  if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, dst.c_str(), AT_SYMLINK_FOLLOW) != 0 && errno != EEXIST)
    return host::errno_error(errno, fmt::format("blob {}: link into {}", expected_.str(), dst.parent_path().string()));
  file_.reset();
  if (sync_dir)
    if (auto s = fsync_dir(dst.parent_path()); !s) return s.error();
  lock_.reset();
  return expected_;
}

// ---- Store ----

bool Store::exists(const fs::path& state_dir) {
  struct stat st;
  return ::stat((state_dir / ".images" / "index.json").c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Result<Store> Store::open(const fs::path& state_dir) {
  fs::path root = state_dir / ".images";
  std::error_code ec;
  for (const char* sub : {"", "blobs/sha256", "ingest", "roots"}) {
    fs::create_directories(root / sub, ec);
    if (ec) return Error{fmt::format("image store {}: {}", (root / sub).string(), ec.message()), ec.value()};
  }
  Store s(root);
  if (!fs::exists(root / "oci-layout") || !fs::exists(root / "index.json")) {
    auto l = s.lock_index();
    if (!l) return l.error();
    // Both files fsynced, the directory once (write_index() fsyncs it after its rename).
    if (!fs::exists(root / "oci-layout"))
      if (auto w = write_file_durable(root / "oci-layout", kLayoutFile, 0644, false); !w) return w.error();
    if (!fs::exists(root / "index.json")) {
      if (auto w = s.write_index({}); !w) return w.error();
    } else if (auto d = fsync_dir(root); !d) {
      return d.error();
    }
  }
  auto layout = [&]() -> Result<std::string> {
    host::Fd fd(::open((root / "oci-layout").c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return host::errno_error(errno, fmt::format("open {}", (root / "oci-layout").string()));
    return read_fd(fd.get(), 4096, (root / "oci-layout").string());
  }();
  if (!layout) return layout.error();
  if (layout->find("\"imageLayoutVersion\"") == std::string::npos)
    return Error{fmt::format("image store {}: oci-layout has no imageLayoutVersion", root.string())};
  return s;
}

Result<Lock> Store::lock_index() const { return flock_file(root_ / "lock", LOCK_EX, "image store index"); }

Result<Lock> Store::hold() const { return flock_file(root_ / "gc.lock", LOCK_SH, "image store"); }

Result<BlobWriter> Store::begin_blob(const Digest& expected, std::uint64_t expected_size, bool wait) {
  BlobWriter w;
  w.root_ = root_;
  w.expected_ = expected;
  w.expected_size_ = expected_size;
  auto l = flock_file(root_ / "ingest" / (expected.hex + ".lock"), LOCK_EX | (wait ? 0 : LOCK_NB),
                      fmt::format("blob {}: another writer is ingesting it", expected.str()));
  if (!l) return l.error();
  w.lock_ = l->take();
  if (has_blob(expected)) {
    w.present_ = true;
    w.lock_.reset();
    return w;
  }
  w.file_.reset(::open((root_ / "ingest").c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644));
  if (!w.file_) return host::errno_error(errno, fmt::format("blob {}: create in {}", expected.str(), (root_ / "ingest").string()));
  w.hash_ = std::make_unique<vm::Sha256>();
  w.buf_.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(expected_size, BlobWriter::kWriteChunk)));
  return w;
}

Status Store::sync_blobs() const { return fsync_dir(root_ / "blobs/sha256"); }

bool Store::has_blob(const Digest& d) const {
  struct stat st;
  return ::stat(blob_path(d).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Result<host::Fd> Store::open_blob(const Digest& d) const {
  host::Fd fd(::open(blob_path(d).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return host::errno_error(errno, fmt::format("blob {}", d.str()));
  return fd;
}

Result<std::string> Store::read_blob(const Digest& d, std::uint64_t max) const {
  auto fd = open_blob(d);
  if (!fd) return fd.error();
  auto data = read_fd(fd->get(), max, fmt::format("blob {}", d.str()));
  if (!data) return data.error();
  if (sha256_of(*data) != d) return Error{fmt::format("blob {}: its content does not match its digest (the store was altered)", d.str())};
  return data;
}

Result<std::vector<Descriptor>> Store::read_index() const {
  fs::path p = root_ / "index.json";
  host::Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return host::errno_error(errno, fmt::format("open {}", p.string()));
  auto data = read_fd(fd.get(), kMaxIndex, p.string());
  if (!data) return data.error();
  auto ix = parse_index(*data, p.string());
  if (!ix) return ix.error();
  return std::move(ix->manifests);
}

Status Store::write_index(const std::vector<Descriptor>& manifests) const {
  return write_file_durable(root_ / "index.json", index_json(manifests));
}

Status Store::set_ref(std::string_view name, const Descriptor& desc) {
  auto l = lock_index();
  if (!l) return l.error();
  auto ix = read_index();
  if (!ix) return ix.error();
  std::vector<Descriptor> out;
  for (auto& d : *ix) {
    auto it = d.annotations.find(std::string(kRefNameAnnotation));
    if (it != d.annotations.end() && it->second == name) continue;
    out.push_back(std::move(d));
  }
  Descriptor nd = desc;
  nd.annotations[std::string(kRefNameAnnotation)] = std::string(name);
  out.push_back(std::move(nd));
  return write_index(out);
}

Status Store::remove_ref(std::string_view name) {
  auto l = lock_index();
  if (!l) return l.error();
  auto ix = read_index();
  if (!ix) return ix.error();
  std::vector<Descriptor> out;
  bool found = false;
  for (auto& d : *ix) {
    auto it = d.annotations.find(std::string(kRefNameAnnotation));
    if (it != d.annotations.end() && it->second == name) {
      found = true;
      continue;
    }
    out.push_back(std::move(d));
  }
  if (!found) return Error{fmt::format("no such image: {}", name), ENOENT};
  return write_index(out);
}

Result<std::vector<StoreRef>> Store::refs() const {
  auto ix = read_index();
  if (!ix) return ix.error();
  std::vector<StoreRef> out;
  for (auto& d : *ix) {
    auto it = d.annotations.find(std::string(kRefNameAnnotation));
    out.push_back({it == d.annotations.end() ? std::string() : it->second, std::move(d)});
  }
  return out;
}

Result<std::optional<Descriptor>> Store::find_ref(std::string_view name) const {
  auto r = refs();
  if (!r) return r.error();
  for (auto& x : *r)
    if (x.name == name) return std::optional<Descriptor>(std::move(x.desc));
  return std::optional<Descriptor>();
}

Result<std::vector<Digest>> Store::reachable(const Descriptor& desc) const {
  std::vector<Digest> out;
  std::vector<Descriptor> todo{desc};
  std::set<Digest> seen;
  while (!todo.empty()) {
    Descriptor d = std::move(todo.back());
    todo.pop_back();
    if (!seen.insert(d.digest).second) continue;
    out.push_back(d.digest);
    bool doc = d.media_type == media::kOciIndex || d.media_type == media::kDockerList ||
               d.media_type == media::kOciManifest || d.media_type == media::kDockerManifest;
    if (!doc || !has_blob(d.digest)) continue;
    auto data = read_blob(d.digest, 4 << 20);
    if (!data) return data.error();
    std::string what = fmt::format("manifest {}", d.digest.str());
    auto kind = sniff_document(*data, what);
    if (!kind) return kind.error();
    if (*kind == DocKind::index) {
      auto ix = parse_index(*data, what);
      if (!ix) return ix.error();
      for (auto& m : ix->manifests) todo.push_back(std::move(m));
    } else {
      auto m = parse_manifest(*data, what);
      if (!m) return m.error();
      todo.push_back(m->config);
      for (auto& l : m->layers) todo.push_back(std::move(l));
    }
  }
  return out;
}

Result<GcReport> Store::gc(const std::set<Digest>& keep_roots) {
  auto g = flock_file(root_ / "gc.lock", LOCK_EX | LOCK_NB, "image store: a pull or load is writing to it");
  if (!g) return Error{"the image store is busy (a pull or load is writing to it): try again when it is done", EWOULDBLOCK};
  auto l = lock_index();
  if (!l) return l.error();
  auto ix = read_index();
  if (!ix) return ix.error();
  std::set<Digest> live;
  for (const auto& d : *ix) {
    auto r = reachable(d);
    if (!r) return r.error();
    live.insert(r->begin(), r->end());
  }
  GcReport rep;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_ / "blobs/sha256", ec)) {
    auto d = Digest::from_hex(e.path().filename().string());
    if (!d || live.count(*d)) continue;
    struct stat st;
    if (::lstat(e.path().c_str(), &st) == 0) rep.bytes += static_cast<std::uint64_t>(st.st_size);
    if (::unlink(e.path().c_str()) == 0) rep.blobs.push_back(*d);
  }
  for (const auto& e : fs::directory_iterator(root_ / "roots", ec)) {
    auto d = Digest::from_hex(e.path().filename().string());
    if (d && (live.count(*d) || keep_roots.count(*d))) continue;
    std::error_code ec2;
    fs::remove_all(e.path(), ec2);
    if (d) rep.roots.push_back(d->hex);
  }
  for (const auto& e : fs::directory_iterator(root_ / "ingest", ec)) {
    std::error_code ec2;
    fs::remove_all(e.path(), ec2);  // no writer holds the store: every lock file and staging dir is stale
  }
  if (auto s = fsync_dir(root_ / "blobs/sha256"); !s) return s.error();
  return rep;
}

}  // namespace nes::image
