#include "host/vm/snapshot.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <simdjson.h>

#include "base/fd.hpp"
#include "host/lib/record.hpp"
#include "host/lib/state_dir.hpp"
#include "host/vm/sha256.hpp"

namespace nes::vm {

namespace {
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::chrono::milliseconds left(Clock::time_point deadline) {
  auto l = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return l.count() < 0 ? std::chrono::milliseconds(0) : l;
}

std::string file_json(const SnapshotFile& f) {
  return fmt::format(R"({{"path":{},"bytes":{},"sha256":{},"mtime_ns":{}}})", host::json_string(f.path.native()),
                     f.bytes, host::json_string(f.sha256), f.mtime_ns);
}

host::Status ignore_shared(Qmp& qmp, std::chrono::milliseconds within) {
  auto r = qmp.execute("migrate-set-capabilities",
                       R"({"capabilities":[{"capability":"x-ignore-shared","state":true}]})", within);
  if (!r) return r.error();
  return host::Ok{};
}

/// Waits for QMP's query-migrate to say `completed` (or `failed`: its error-desc).
host::Status await_migration(Qmp& qmp, std::string_view what, Clock::time_point deadline) {
  simdjson::dom::parser p;
  for (;;) {
    auto r = qmp.execute("query-migrate", "", left(deadline) + std::chrono::seconds(1));
    if (!r) return r.error();
    simdjson::dom::object o;
    std::string_view status;
    if (p.parse(simdjson::padded_string(*r)).get(o) || o["status"].get_string().get(status)) status = "";
    if (status == "completed") return host::Ok{};
    if (status == "failed" || status == "cancelled") {
      std::string_view desc;
      if (o["error-desc"].get_string().get(desc)) desc = "no reason given";
      return host::Error{fmt::format("{}: {}", what, desc)};
    }
    if (Clock::now() >= deadline) return host::Error{fmt::format("{}: not done in time (status '{}')", what, status)};
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}
}  // namespace

host::Status check_snapshot_name(std::string_view n) {
  if (!host::check_name("snapshot name", n) || n.front() == '.')
    return host::Error{fmt::format("snapshot name '{}': not 1..64 of [A-Za-z0-9._-] (no leading '.')", n)};
  return host::Ok{};
}

namespace {
/// A file's modification time, in ns since the epoch (SnapshotFile::mtime_ns).
std::int64_t mtime_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

/// SHA-256, size and mtime of an open file, read from its start (pread: the offset is kept).
host::Result<SnapshotFile> hash_fd(int fd, const fs::path& path) {
  Sha256 sha;
  if (!sha.ok()) return host::Error{"sha256: no context"};
  std::vector<char> buf(1 << 20);
  SnapshotFile f{path, 0, {}, 0};
  struct stat st{};
  if (::fstat(fd, &st) != 0) return host::errno_error(errno, fmt::format("stat {}", path.native()));
  if (!S_ISREG(st.st_mode)) return host::Error{fmt::format("{}: not a regular file", path.native())};
  f.mtime_ns = mtime_ns(st);
  for (;;) {
    ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(f.bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return host::errno_error(errno, fmt::format("read {}", path.native()));
    if (n == 0) break;
    sha.update(std::string_view(buf.data(), static_cast<std::size_t>(n)));
    f.bytes += static_cast<std::uint64_t>(n);
  }
  f.sha256 = sha.hex();
  return f;
}

/// Whether the open file `fd` is `recorded` (same_file()'s rule, on a descriptor).
host::Status same_fd(std::string_view what, int fd, const fs::path& p, const SnapshotFile& then) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return host::errno_error(errno, fmt::format("{}: {}", what, p.native()));
  if (!S_ISREG(st.st_mode)) return host::Error{fmt::format("{}: {} is not a regular file", what, p.native())};
  if (static_cast<std::uint64_t>(st.st_size) == then.bytes && mtime_ns(st) == then.mtime_ns) return host::Ok{};
  // Touched since: only its bytes can say whether it is still the same file.
  auto h = hash_fd(fd, p);
  if (!h) return host::Error{fmt::format("{}: {}", what, h.error().message)};
  if (h->bytes != then.bytes)
    return host::Error{fmt::format("{}: {} has {} bytes; made with {}", what, p.native(), h->bytes, then.bytes)};
  if (h->sha256 != then.sha256)
    return host::Error{fmt::format("{}: {} has SHA-256 {}; made with {}", what, p.native(), h->sha256.substr(0, 16),
                                   then.sha256.substr(0, 16))};
  return host::Ok{};
}

/// A snapshot's own file, opened once: never through a symlink, never blocking (a FIFO), only
/// a regular file.
host::Result<base::Fd> open_own(const fs::path& p) {
  base::Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd) return host::errno_error(errno, fmt::format("open {}", p.native()));
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return host::errno_error(errno, fmt::format("stat {}", p.native()));
  if (!S_ISREG(st.st_mode)) return host::Error{fmt::format("{}: not a regular file", p.native())};
  return fd;
}
}  // namespace

host::Result<SnapshotFile> hash_file(const fs::path& path) {
  base::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return host::errno_error(errno, fmt::format("open {}", path.native()));
  return hash_fd(fd.get(), path);
}

std::string encode_snapshot_meta(const SnapshotMeta& m) {
  return fmt::format(
      R"({{"format":{},"name":{},"created":{},"qemu_version":{},"accel":{},"mem_mib":{},"cpus":{},"grace_ms":{},)"
      R"("firmware":{},)"
      R"("append":{},"kernel":{},"initrd":{},"state":{},"ram":{},"ready":{},"root":{}}})",
      m.format, host::json_string(m.name), host::json_string(m.created), host::json_string(m.qemu_version),
      host::json_string(m.accel), m.mem_mib, m.cpus, m.grace_ms, m.firmware ? host::json_string(*m.firmware) : "null",
      host::json_string(m.append), file_json(m.kernel), file_json(m.initrd), file_json(m.state), file_json(m.ram),
      host::json_string(m.ready),
      m.root ? fmt::format(R"({{"image":{},"path":{},"digest":{},"fs":{}}})", host::json_string(m.root->image),
                           host::json_string(m.root->path.native()), host::json_string(m.root->digest),
                           host::json_string(m.root->fs))
             : std::string("null"));
}

host::Result<SnapshotMeta> decode_snapshot_meta(std::string_view json) {
  simdjson::dom::parser p;
  simdjson::dom::object o;
  simdjson::dom::element root;
  if (auto e = p.parse(simdjson::padded_string(json)).get(root); e)
    return host::Error{fmt::format("snapshot.json: not valid JSON ({}; truncated?)", simdjson::error_message(e))};
  if (root.get(o)) return host::Error{"snapshot.json: not a JSON object"};
  auto bad = [](std::string_view field, std::string_view why) {
    return host::Error{fmt::format("snapshot.json: {}: {}", field, why)};
  };
  SnapshotMeta m;
  std::uint64_t u = 0;
  if (o["format"].get_uint64().get(u)) return bad("format", "missing or not a number");
  if (u != kSnapshotFormat)
    return bad("format", fmt::format("{} (this neshost reads format {})", u, kSnapshotFormat));
  m.format = static_cast<std::uint32_t>(u);
  auto str = [&](std::string_view key, std::string& out) -> host::Status {
    std::string_view v;
    if (o[key].get_string().get(v)) return bad(key, "missing or not a string");
    out = std::string(v);
    return host::Ok{};
  };
  for (auto [k, dst] : {std::pair<std::string_view, std::string*>{"name", &m.name}, {"created", &m.created},
                        {"qemu_version", &m.qemu_version}, {"accel", &m.accel}, {"append", &m.append}, {"ready", &m.ready}})
    if (auto s = str(k, *dst); !s) return s.error();
  if (o["mem_mib"].get_uint64().get(u) || u < 64 || u > 1024 * 1024) return bad("mem_mib", "missing or outside 64..1048576");
  m.mem_mib = static_cast<std::uint32_t>(u);
  if (o["cpus"].get_uint64().get(u) || u < 1 || u > 64) return bad("cpus", "missing or outside 1..64");
  m.cpus = static_cast<std::uint32_t>(u);
  if (o["grace_ms"].get_uint64().get(u) || u < 1 || u > kSnapshotMaxGraceMs)
    return bad("grace_ms", fmt::format("missing or outside 1..{}", kSnapshotMaxGraceMs));
  m.grace_ms = static_cast<std::uint32_t>(u);
  if (std::string_view fw; !o["firmware"].get_string().get(fw)) m.firmware = std::string(fw);
  else if (!o["firmware"].is_null()) return bad("firmware", "not a string or null");
  auto file = [&](std::string_view key, SnapshotFile& f) -> host::Status {
    simdjson::dom::object fo;
    std::string_view path, sha;
    if (o[key].get(fo)) return bad(key, "missing or not an object");
    if (fo["path"].get_string().get(path) || path.empty()) return bad(fmt::format("{}.path", key), "missing or empty");
    if (fo["bytes"].get_uint64().get(f.bytes)) return bad(fmt::format("{}.bytes", key), "missing or not a number");
    if (fo["mtime_ns"].get_int64().get(f.mtime_ns)) return bad(fmt::format("{}.mtime_ns", key), "missing or not a number");
    if (fo["sha256"].get_string().get(sha) || sha.size() != 64 ||
        sha.find_first_not_of("0123456789abcdef") != std::string_view::npos)
      return bad(fmt::format("{}.sha256", key), "missing or not 64 lowercase hex digits");
    f.path = std::string(path);
    f.sha256 = std::string(sha);
    return host::Ok{};
  };
  for (auto [k, f] : {std::pair<std::string_view, SnapshotFile*>{"kernel", &m.kernel}, {"initrd", &m.initrd},
                      {"state", &m.state}, {"ram", &m.ram}})
    if (auto s = file(k, *f); !s) return s.error();
  if (m.state.path != kSnapshotStateFile) return bad("state.path", fmt::format("not '{}'", kSnapshotStateFile));
  if (m.ram.path != kSnapshotRamFile) return bad("ram.path", fmt::format("not '{}'", kSnapshotRamFile));
  if (auto s = check_snapshot_name(m.name); !s) return bad("name", s.error().message);
  if (m.accel != "tcg" && m.accel != "kvm") return bad("accel", "not tcg or kvm");
  if (m.ready.empty() || m.ready.size() > 64 * 1024 || m.ready.find('\n') != std::string::npos)
    return bad("ready", "empty, longer than 64 KiB or more than one line");
  if (simdjson::dom::element re; !o["root"].get(re) && !re.is_null()) {
    simdjson::dom::object ro;
    if (re.get(ro)) return bad("root", "not an object or null");
    SnapshotRoot r;
    auto digest = [](std::string_view d) {
      return d.size() == 71 && d.starts_with("sha256:") &&
             d.substr(7).find_first_not_of("0123456789abcdef") == std::string_view::npos;
    };
    std::string_view v;
    if (ro["image"].get_string().get(v) || !digest(v)) return bad("root.image", "missing or not sha256:<64 hex digits>");
    r.image = std::string(v);
    if (ro["path"].get_string().get(v) || v.empty() || v.front() != '/') return bad("root.path", "missing or not absolute");
    r.path = std::string(v);
    if (ro["digest"].get_string().get(v) || !digest(v)) return bad("root.digest", "missing or not sha256:<64 hex digits>");
    r.digest = std::string(v);
    if (ro["fs"].get_string().get(v) || (v != "erofs" && v != "ext4")) return bad("root.fs", "missing or not erofs or ext4");
    r.fs = std::string(v);
    m.root = std::move(r);
  }
  return m;
}

host::Result<SnapshotMeta> read_snapshot_meta(const fs::path& dir) {
  const fs::path meta = dir / kSnapshotMetaFile;
  auto fd = open_own(meta);
  if (!fd) {
    if (fd.error().err == ENOENT)
      return host::Error{fmt::format("no snapshot at {} ({} missing)", dir.native(), kSnapshotMetaFile), ENOENT};
    return fd.error();
  }
  std::string text;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd->get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return host::errno_error(errno, fmt::format("read {}", meta.native()));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > 256 * 1024) return host::Error{fmt::format("{}: longer than 256 KiB", meta.native())};
  }
  auto m = decode_snapshot_meta(text);
  if (!m) return host::Error{fmt::format("{}: {}", dir.native(), m.error().message)};
  return m;
}

host::Result<OpenSnapshot> open_snapshot(const fs::path& dir) {
  auto m = read_snapshot_meta(dir);
  if (!m) return m.error();
  OpenSnapshot o{std::move(*m), {}, {}};
  for (auto [f, fd] : {std::pair<const SnapshotFile*, base::Fd*>{&o.meta.state, &o.state}, {&o.meta.ram, &o.ram}}) {
    auto opened = open_own(dir / f->path);
    if (!opened)
      return opened.error();
    *fd = std::move(*opened);
    if (auto c = same_fd(f->path.native(), fd->get(), dir / f->path, *f); !c)
      return host::Error{fmt::format("corrupt: {}", c.error().message)};
  }
  return o;
}

host::Status same_file(std::string_view what, const fs::path& p, const SnapshotFile& then) {
  base::Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return host::errno_error(errno, fmt::format("{}: {}", what, p.native()));
  return same_fd(what, fd.get(), p, then);
}

host::Status check_snapshot(const SnapshotMeta& m, const RestoreTarget& t) {
  auto differs = [&](std::string_view what, std::string_view now, std::string_view then) {
    return host::Error{fmt::format("made with {} {}; this run has {}", what, then, now)};
  };
  auto same = [&](std::string_view what, const fs::path& p, const SnapshotFile& then) -> host::Status {
    if (auto c = same_file(what, p, then); !c)
      return host::Error{fmt::format("made with another {}", c.error().message)};
    return host::Ok{};
  };
  // The initramfs first: it holds the init, whose build is what a snapshot is most often stale for.
  if (auto s = same("init build (initramfs)", t.initrd, m.initrd); !s) return s;
  if (auto s = same("kernel", t.kernel, m.kernel); !s) return s;
  if (!t.qemu_version.empty() && t.qemu_version != m.qemu_version)
    return differs("QEMU", t.qemu_version, m.qemu_version);
  if (t.accel != m.accel) return differs("accelerator", t.accel, m.accel);
  if (t.mem_mib && *t.mem_mib != m.mem_mib)
    return differs("memory (--mem, MiB)", std::to_string(*t.mem_mib), std::to_string(m.mem_mib));
  if (t.cpus && *t.cpus != m.cpus) return differs("vCPUs (--cpus)", std::to_string(*t.cpus), std::to_string(m.cpus));
  return host::Ok{};
}

host::Result<base::Fd> copy_ram(const base::Fd& in) {
  const fs::path ram = kSnapshotRamFile;
  struct stat st{};
  if (::fstat(in.get(), &st) != 0) return host::errno_error(errno, fmt::format("stat {}", ram.native()));
  base::Fd out(::memfd_create("nesinit-ram", MFD_CLOEXEC));
  if (!out) return host::errno_error(errno, "memfd_create");
  if (::ftruncate(out.get(), st.st_size) != 0) return host::errno_error(errno, "ftruncate the RAM copy");
  std::vector<char> buf(1 << 20);
  for (off_t at = 0; at < st.st_size;) {
    off_t data = ::lseek(in.get(), at, SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;  // only a hole is left
    if (data < 0) return host::errno_error(errno, fmt::format("seek {}", ram.native()));
    off_t hole = ::lseek(in.get(), data, SEEK_HOLE);
    if (hole < 0) return host::errno_error(errno, fmt::format("seek {}", ram.native()));
    for (off_t o = data; o < hole;) {
      ssize_t n = ::pread(in.get(), buf.data(), std::min<off_t>(static_cast<off_t>(buf.size()), hole - o), o);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return host::errno_error(n < 0 ? errno : EIO, fmt::format("read {}", ram.native()));
      for (ssize_t w = 0; w < n;) {
        ssize_t k = ::pwrite(out.get(), buf.data() + w, static_cast<std::size_t>(n - w), o + w);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return host::errno_error(errno, "write the RAM copy");
        w += k;
      }
      o += n;
    }
    at = hole;
  }
  return out;
}

host::Status save_vm_state(Qmp& qmp, const base::Fd& file, std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  if (auto r = ignore_shared(qmp, within); !r) return r;
  if (auto r = qmp.execute("stop", "", left(deadline)); !r) return r.error();
  // QEMU writes the stream itself into the descriptor we pass (`fd:`): the file is ours (made
  // 0600), no shell or `cat` between, and `completed` means every byte was written to it.
  if (auto r = qmp.execute("getfd", R"({"fdname":"snapshot"})", left(deadline), file.get()); !r) return r.error();
  if (auto r = qmp.execute("migrate", R"({"uri":"fd:snapshot"})", left(deadline)); !r) return r.error();
  return await_migration(qmp, "saving the VM", deadline);
}

host::Status load_vm_state(Qmp& qmp, const base::Fd& file, std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  // QEMU reads the file itself through a descriptor we pass (`fd:`): no pipe, no `cat` between.
  // Its offset is where QEMU starts: a dup of ours, rewound.
  if (::lseek(file.get(), 0, SEEK_SET) != 0) return host::errno_error(errno, "seek the snapshot's state");
  if (auto r = ignore_shared(qmp, within); !r) return r;
  if (auto r = qmp.execute("getfd", R"({"fdname":"snapshot"})", left(deadline), file.get()); !r) return r.error();
  if (auto r = qmp.execute("migrate-incoming", R"({"uri":"fd:snapshot"})", left(deadline)); !r) return r.error();
  return await_migration(qmp, "loading the snapshot's state", deadline);
}

host::Status hotplug_share(Qmp& qmp, std::size_t port, std::size_t index, const FsDevice& share,
                           std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  auto named = [&](host::Error e) { return host::Error{fmt::format("share '{}': {}", share.tag, e.message)}; };
  if (auto r = qmp.execute("chardev-add",
                           fmt::format(R"({{"id":"fs{}","backend":{{"type":"socket","data":{{"addr":{{"type":"unix",)"
                                       R"("data":{{"path":{}}}}},"server":false}}}}}})",
                                       index, host::json_string(share.socket.native())),
                           left(deadline));
      !r)
    return named(r.error());
  if (auto r = qmp.execute("device_add",
                           fmt::format(R"({{"driver":"vhost-user-fs-pci","id":"fsdev{}","chardev":"fs{}","tag":{},"bus":"{}"}})",
                                       index, index, host::json_string(share.tag), hotplug_port(port)),
                           left(deadline));
      !r)
    return named(r.error());
  return host::Ok{};
}

host::Status hotplug_nic(Qmp& qmp, std::string_view device_json, std::chrono::milliseconds within) {
  if (auto r = qmp.execute("device_add", device_json, within); !r) return host::Error{fmt::format("NIC: {}", r.error().message)};
  return host::Ok{};
}

}  // namespace nes::vm
