#include "host/record.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fmt/format.h>
#include <simdjson.h>
#include <thread>

#include "host/fd.hpp"
#include "protocol/codec.hpp"

namespace nes::host {

namespace fs = std::filesystem;

WallTime wall_now() {
  return std::chrono::time_point_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now());
}

std::string format_rfc3339(WallTime t) {
  auto ns = t.time_since_epoch().count();
  auto secs = ns / 1'000'000'000;
  auto frac = ns % 1'000'000'000;
  if (frac < 0) { frac += 1'000'000'000; --secs; }
  std::time_t tt = static_cast<std::time_t>(secs);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
}

std::optional<WallTime> parse_rfc3339(std::string_view s) {
  // YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ = 30 bytes
  if (s.size() != 30) return std::nullopt;
  auto digits = [&](std::size_t pos, std::size_t n) -> std::optional<long> {
    long v = 0;
    for (std::size_t i = pos; i < pos + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return std::nullopt;
      v = v * 10 + (s[i] - '0');
    }
    return v;
  };
  if (s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[19] != '.' ||
      s[29] != 'Z')
    return std::nullopt;
  auto Y = digits(0, 4), M = digits(5, 2), D = digits(8, 2), h = digits(11, 2), m = digits(14, 2),
       sec = digits(17, 2), f = digits(20, 9);
  if (!Y || !M || !D || !h || !m || !sec || !f) return std::nullopt;
  if (*M < 1 || *M > 12 || *D < 1 || *D > 31 || *h > 23 || *m > 59 || *sec > 60) return std::nullopt;
  std::tm tm{};
  tm.tm_year = static_cast<int>(*Y - 1900);
  tm.tm_mon = static_cast<int>(*M - 1);
  tm.tm_mday = static_cast<int>(*D);
  tm.tm_hour = static_cast<int>(*h);
  tm.tm_min = static_cast<int>(*m);
  tm.tm_sec = static_cast<int>(*sec);
  std::time_t tt = timegm(&tm);
  return WallTime{std::chrono::nanoseconds{static_cast<std::int64_t>(tt) * 1'000'000'000 + *f}};
}

std::optional<std::string> vm_id_problem(std::string_view id) {
  if (id.empty()) return std::string("vm id is empty");
  if (id.size() > 64) return fmt::format("vm id is {} bytes; at most 64", id.size());
  if (id.front() == '.' || id.front() == '-')
    return fmt::format("vm id '{}' starts with '{}'", id, id.front());
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return fmt::format("vm id may hold only [A-Za-z0-9._-]; got byte 0x{:02x}",
                                static_cast<unsigned char>(c));
  }
  return std::nullopt;
}

std::string json_string(std::string_view s) { return proto::json_quote(s); }

namespace {
std::string opt_u8(const std::optional<std::uint8_t>& v) {
  return v ? fmt::format("{}", *v) : std::string("null");
}
}  // namespace

std::string encode_record(const Record& r) {
  return fmt::format(
      R"({{"schema_version":{},"vm":{},"generation":{},"outcome":"{}","exit_code":{},"signal":{},)"
      R"("exit_status":{},"reason":{},"started_at":"{}","finished_at":"{}"}})"
      "\n",
      Record::kSchemaVersion, json_string(r.vm), r.generation, proto::to_string(r.outcome),
      opt_u8(r.exit_code), opt_u8(r.signal), r.exit_status, json_string(r.reason),
      format_rfc3339(r.started_at), format_rfc3339(r.finished_at));
}

Result<Record> parse_record(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::element root;
  if (auto err = parser.parse(padded).get(root))
    return Error{fmt::format("record: not valid JSON ({})", simdjson::error_message(err))};
  simdjson::dom::object obj;
  if (root.get(obj)) return Error{"record: expected a JSON object"};
  Record r;
  bool seen_schema = false, seen_vm = false, seen_gen = false, seen_outcome = false,
       seen_status = false, seen_reason = false, seen_start = false, seen_finish = false;
  auto u8_or_null = [](simdjson::dom::element v, std::string_view name, std::uint64_t lo,
                       std::uint64_t hi) -> Result<std::optional<std::uint8_t>> {
    if (v.is_null()) return std::optional<std::uint8_t>{};
    std::uint64_t x;
    if (v.get_uint64().get(x) || x < lo || x > hi)
      return Error{fmt::format("{}: expected null or an integer {}..{}", name, lo, hi)};
    return std::optional<std::uint8_t>{static_cast<std::uint8_t>(x)};
  };
  auto time_of = [](simdjson::dom::element v, std::string_view name) -> Result<WallTime> {
    std::string_view s;
    if (v.get_string().get(s)) return Error{fmt::format("{}: expected an RFC 3339 string", name)};
    auto t = parse_rfc3339(s);
    if (!t) return Error{fmt::format("{}: expected YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ", name)};
    return *t;
  };
  for (auto [key, v] : obj) {
    if (key == "schema_version") {
      std::uint64_t x;
      if (v.get_uint64().get(x) || x != Record::kSchemaVersion)
        return Error{fmt::format("schema_version: expected {}", Record::kSchemaVersion)};
      seen_schema = true;
    } else if (key == "vm") {
      std::string_view s;
      if (v.get_string().get(s)) return Error{"vm: expected a string"};
      r.vm = std::string(s);
      seen_vm = true;
    } else if (key == "generation") {
      if (v.get_uint64().get(r.generation))
        return Error{"generation: expected an unsigned 64-bit integer"};
      seen_gen = true;
    } else if (key == "outcome") {
      std::string_view s;
      if (v.get_string().get(s)) return Error{"outcome: expected a string"};
      auto o = proto::outcome_from_string(s);
      if (!o) return Error{fmt::format("outcome: unknown value '{}'", s)};
      r.outcome = *o;
      seen_outcome = true;
    } else if (key == "exit_code") {
      auto x = u8_or_null(v, "exit_code", 0, 255);
      if (!x) return x.error();
      r.exit_code = *x;
    } else if (key == "signal") {
      auto x = u8_or_null(v, "signal", 1, 64);
      if (!x) return x.error();
      r.signal = *x;
    } else if (key == "exit_status") {
      std::int64_t x;
      if (v.get_int64().get(x) || x < 0 || x > 255)
        return Error{"exit_status: expected an integer 0..255"};
      r.exit_status = static_cast<int>(x);
      seen_status = true;
    } else if (key == "reason") {
      std::string_view s;
      if (v.get_string().get(s)) return Error{"reason: expected a string"};
      r.reason = std::string(s);
      seen_reason = true;
    } else if (key == "started_at") {
      auto t = time_of(v, "started_at");
      if (!t) return t.error();
      r.started_at = *t;
      seen_start = true;
    } else if (key == "finished_at") {
      auto t = time_of(v, "finished_at");
      if (!t) return t.error();
      r.finished_at = *t;
      seen_finish = true;
    }
  }
  const char* missing = !seen_schema ? "schema_version" : !seen_vm ? "vm" : !seen_gen ? "generation"
                        : !seen_outcome ? "outcome" : !seen_status ? "exit_status"
                        : !seen_reason ? "reason" : !seen_start ? "started_at"
                        : !seen_finish ? "finished_at" : nullptr;
  if (missing) return Error{fmt::format("{}: required field missing", missing)};
  return r;
}

std::string_view to_string(WriteStep s) {
  switch (s) {
    case WriteStep::temp_written: return "temp_written";
    case WriteStep::temp_fsynced: return "temp_fsynced";
    case WriteStep::renamed: return "renamed";
    case WriteStep::dir_fsynced: return "dir_fsynced";
  }
  return "?";
}

std::optional<WriteStep> write_step_from_string(std::string_view s) {
  for (auto st : {WriteStep::temp_written, WriteStep::temp_fsynced, WriteStep::renamed,
                  WriteStep::dir_fsynced})
    if (to_string(st) == s) return st;
  return std::nullopt;
}

fs::path record_path(const fs::path& state_dir, std::string_view vm) {
  return state_dir / std::string(vm) / "outcome.json";
}

namespace {

std::string errno_text(int e) { return std::strerror(e); }

/// mkdir with mode 0700; if it was created, fsync its parent so the new entry is durable.
Status make_dir_durable(const fs::path& dir) {
  if (::mkdir(dir.c_str(), 0700) == 0) {
    fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
    Fd d{::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    if (!d || ::fsync(d.get()) != 0)
      return Error{fmt::format("fsync {}: {}", parent.string(), errno_text(errno))};
    return Ok{};
  }
  if (errno == EEXIST) {
    struct stat st{};
    if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Ok{};
    return Error{fmt::format("{}: exists and is not a directory", dir.string())};
  }
  return Error{fmt::format("mkdir {}: {}", dir.string(), errno_text(errno))};
}

Status make_dirs_durable(const fs::path& dir) {
  // Create missing ancestors first (each one fsynced into its parent). The state dir's own path is
  // the user's choice (it may go through a symlink); inside it nothing is followed.
  std::vector<fs::path> chain;
  for (fs::path p = dir; !p.empty() && p != p.root_path(); p = p.parent_path()) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) break;
    chain.push_back(p);
    if (p.parent_path() == p) break;
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it)
    if (auto s = make_dir_durable(*it); !s) return s;
  return Ok{};
}

/// `what` for an openat() error inside the state dir: a symlink (ELOOP from O_NOFOLLOW) is named.
std::string open_error(const fs::path& shown, int e) {
  if (e == ELOOP) return fmt::format("{}: is a symlink; refusing to follow it in the state dir", shown.string());
  return fmt::format("open {}: {}", shown.string(), errno_text(e));
}

/// Open `name` inside `dirfd` with O_NOFOLLOW (and O_NONBLOCK, so a FIFO planted there cannot
/// hang the open), then require a regular file. ENOENT is reported as `missing`.
Result<Fd> open_regular_at(int dirfd, const char* name, int flags, const fs::path& shown,
                           bool& missing) {
  missing = false;
  Fd f{::openat(dirfd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600)};
  if (!f) {
    if (errno == ENOENT) { missing = true; return Fd{}; }
    return Error{open_error(shown, errno)};
  }
  struct stat st{};
  if (::fstat(f.get(), &st) != 0) return Error{fmt::format("stat {}: {}", shown.string(), errno_text(errno))};
  if (!S_ISREG(st.st_mode)) return Error{fmt::format("{}: not a regular file", shown.string())};
  // Back to blocking I/O for a regular file (O_NONBLOCK means nothing there, but keep it plain).
  ::fcntl(f.get(), F_SETFL, ::fcntl(f.get(), F_GETFL) & ~O_NONBLOCK);
  return f;
}

Result<std::string> read_small_at(int dirfd, const char* name, const fs::path& shown,
                                  std::size_t cap, bool& missing) {
  auto f = open_regular_at(dirfd, name, O_RDONLY, shown, missing);
  if (!f) return f.error();
  if (missing) return std::string();
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(f->get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{fmt::format("read {}: {}", shown.string(), errno_text(errno))};
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > cap) return Error{fmt::format("{}: larger than {} bytes", shown.string(), cap)};
  }
  return out;
}

std::atomic<std::uint64_t> g_temp_counter{0};  // unique temp names within this process

bool is_temp_name(std::string_view n) {
  return n.starts_with(".outcome.json.") && n.ends_with(".tmp");
}

/// One attempt: fresh temp, write, fsync, rename, fsync dir, all relative to the VM dir's fd.
/// Returns 0 or the failing errno and sets `what` to the failing step's description.
int attempt_write(int dirfd, const fs::path& dir, const std::string& bytes, const WriteOptions& opt,
                  std::string& what) {
  const std::string tmp = fmt::format(".outcome.json.{}.{}.tmp", ::getpid(), g_temp_counter++);
  const fs::path shown = dir / tmp;
  auto fail = [&](std::string w, int e) {
    what = std::move(w);
    ::unlinkat(dirfd, tmp.c_str(), 0);
    return e ? e : EIO;
  };
  auto hook = [&](WriteStep s) { return opt.at_step ? opt.at_step(s) : 0; };
  Fd f{::openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)};
  if (!f) return fail("create temp " + shown.string(), errno);
  std::size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(f.get(), bytes.data() + off, bytes.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write " + shown.string(), errno);
    }
    off += static_cast<std::size_t>(n);
  }
  if (int e = hook(WriteStep::temp_written)) return fail("write " + shown.string(), e);
  if (opt.sync && ::fsync(f.get()) != 0) return fail("fsync " + shown.string(), errno);
  if (int e = hook(WriteStep::temp_fsynced)) return fail("fsync " + shown.string(), e);
  if (::close(f.release()) != 0) return fail("close " + shown.string(), errno);
  // rename(2) replaces a directory entry, never follows one: a symlink planted at outcome.json is
  // itself replaced.
  if (::renameat(dirfd, tmp.c_str(), dirfd, "outcome.json") != 0) return fail("rename to outcome.json", errno);
  if (int e = hook(WriteStep::renamed)) return fail("rename to outcome.json", e);
  int e = opt.sync && ::fsync(dirfd) != 0 ? errno : 0;
  if (!e) e = hook(WriteStep::dir_fsynced);
  if (e) { what = "fsync " + dir.string(); return e; }
  return 0;
}

/// Parse a record read from `<vm>/outcome.json` and check it is that VM's: a record naming
/// another VM (planted, or copied between dirs) is refused.
Result<Record> parse_record_of(std::string_view text, std::string_view vm, const fs::path& shown) {
  auto r = parse_record(text);
  if (!r) return Error{fmt::format("{}: {}", shown.string(), r.error().message)};
  if (r->vm != vm)
    return Error{fmt::format("{}: the record names vm {} but lives in the directory of vm {}",
                             shown.string(), json_string(r->vm), json_string(vm))};
  return r;
}

}  // namespace

Result<Fd> open_vm_dir(const fs::path& state_dir, std::string_view vm, bool create) {
  if (auto p = vm_id_problem(vm)) return Error{*p};
  if (create)
    if (auto s = make_dirs_durable(state_dir); !s) return s.error();
  Fd state{::open(state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (!state) {
    if (errno == ENOENT && !create) return Fd{};
    return Error{fmt::format("open {}: {}", state_dir.string(), errno_text(errno))};
  }
  const std::string name(vm);
  const fs::path shown = state_dir / name;
  if (create) {
    if (::mkdirat(state.get(), name.c_str(), 0700) == 0) {
      if (::fsync(state.get()) != 0)
        return Error{fmt::format("fsync {}: {}", state_dir.string(), errno_text(errno))};
    } else if (errno != EEXIST) {
      return Error{fmt::format("mkdir {}: {}", shown.string(), errno_text(errno))};
    }
  }
  Fd d{::openat(state.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
  if (!d) {
    if (errno == ENOENT && !create) return Fd{};
    if (errno == ENOTDIR) {
      // O_NOFOLLOW|O_DIRECTORY on a symlink gives ENOTDIR on some kernels, ELOOP on others.
      struct stat st{};
      if (::fstatat(state.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
        return Error{open_error(shown, ELOOP)};
      return Error{fmt::format("{}: exists and is not a directory", shown.string())};
    }
    return Error{open_error(shown, errno)};
  }
  // Records are private (they hold the workload's argv-derived reasons): 0700 whoever made it.
  struct stat st{};
  if (create && ::fstat(d.get(), &st) == 0 && (st.st_mode & 077) && st.st_uid == ::geteuid())
    ::fchmod(d.get(), 0700);
  return d;
}

Result<Fd> open_vm_file(const fs::path& state_dir, std::string_view vm, std::string_view name,
                        int flags) {
  auto d = open_vm_dir(state_dir, vm, (flags & O_CREAT) != 0);
  if (!d) return d.error();
  const fs::path shown = state_dir / std::string(vm) / std::string(name);
  if (!*d) return Error{fmt::format("open {}: {}", shown.string(), errno_text(ENOENT))};
  bool missing = false;
  auto f = open_regular_at(d->get(), std::string(name).c_str(), flags, shown, missing);
  if (!f) return f.error();
  if (missing) return Error{fmt::format("open {}: {}", shown.string(), errno_text(ENOENT))};
  return f;
}

Result<WriteResult> write_record(const fs::path& state_dir, const Record& r,
                                 const WriteOptions& opt) {
  auto dres = open_vm_dir(state_dir, r.vm, true);
  if (!dres) return dres.error();
  Fd dir_fd = std::move(*dres);
  const fs::path dir = state_dir / r.vm;

  // Per-VM lock: serialises writers of this VM across threads and processes (flock is per open
  // file description). Bounded: LOCK_NB, retried. Never through a symlink (a dangling `.lock`
  // would otherwise create its target), and only a regular file.
  const fs::path lock_path = dir / ".lock";
  bool lock_missing = false;
  auto lock_res = open_regular_at(dir_fd.get(), ".lock", O_RDWR | O_CREAT, lock_path, lock_missing);
  if (!lock_res) return lock_res.error();
  Fd lock = std::move(*lock_res);
  for (int i = 0;; ++i) {
    if (::flock(lock.get(), LOCK_EX | LOCK_NB) == 0) break;
    if (errno != EWOULDBLOCK && errno != EINTR)
      return Error{fmt::format("flock {}: {}", lock_path.string(), errno_text(errno))};
    if (i + 1 >= opt.lock_tries)
      return Error{fmt::format("flock {}: still held by another writer", lock_path.string())};
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  // Generation check under the lock: an older generation never replaces a newer record, and the
  // first record of a generation wins (outcome finality). Only a record of this VM counts: one
  // naming another VM is not ours, whatever its generation, and is replaced.
  bool missing = false;
  auto existing = read_small_at(dir_fd.get(), "outcome.json", dir / "outcome.json", 1u << 20, missing);
  if (existing && !missing) {
    if (auto old = parse_record(*existing); old && old->vm == r.vm) {
      if (old->generation > r.generation) return WriteResult{WriteResult::Kind::stale, *old, 0};
      if (old->generation == r.generation)
        return WriteResult{WriteResult::Kind::already_recorded, *old, 0};
    }
    // An unparsable record cannot be a torn write of ours (rename is atomic); replace it.
  }
  // Not a regular file (a FIFO, a directory, a symlink): renameat replaces a FIFO or symlink;
  // a directory there makes every attempt fail with a clear error.

  // Leftover temps of crashed writers are garbage: only outcome.json is ever read.
  if (int dup_fd = ::fcntl(dir_fd.get(), F_DUPFD_CLOEXEC, 0); dup_fd >= 0) {
    if (DIR* dp = ::fdopendir(dup_fd)) {
      while (dirent* e = ::readdir(dp))
        if (is_temp_name(e->d_name)) ::unlinkat(dir_fd.get(), e->d_name, 0);
      ::closedir(dp);
    } else {
      ::close(dup_fd);
    }
  }

  std::string bytes = encode_record(r);
  std::string what;
  int err = 0;
  for (int attempt = 1; attempt <= std::max(1, opt.attempts); ++attempt) {
    err = attempt_write(dir_fd.get(), dir, bytes, opt, what);
    if (!err) return WriteResult{WriteResult::Kind::written, r, attempt};
  }
  return Error{fmt::format("recording outcome of {}: {}: {} (after {} attempts)", r.vm, what,
                           errno_text(err), std::max(1, opt.attempts))};
}

Result<std::optional<Record>> read_record(const fs::path& state_dir, std::string_view vm) {
  auto d = open_vm_dir(state_dir, vm, false);
  if (!d) return d.error();
  if (!*d) return std::optional<Record>{};
  bool missing = false;
  auto path = record_path(state_dir, vm);
  auto text = read_small_at(d->get(), "outcome.json", path, 1u << 20, missing);
  if (!text) return text.error();
  if (missing) return std::optional<Record>{};
  auto r = parse_record_of(*text, vm, path);
  if (!r) return r.error();
  return std::optional<Record>{std::move(*r)};
}

}  // namespace nes::host
