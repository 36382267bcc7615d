#include "host/lib/record.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fmt/format.h>
#include <simdjson.h>
#include <system_error>
#include <thread>
#include <tuple>

#include "host/lib/base.hpp"
#include "host/lib/signals_blocked.hpp"
#include "base/small_file.hpp"
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

std::string json_string(std::string_view s) { return proto::json_quote(s); }

namespace {
std::string opt_u8(const std::optional<std::uint8_t>& v) {
  return v ? fmt::format("{}", *v) : std::string("null");
}

/// `,"name":{"stdout":N,"stderr":M}` with the streams that are set; nothing when none is.
std::string counts_field(std::string_view name, const StreamCounts& c) {
  if (c.empty()) return {};
  std::string s = fmt::format(R"(,"{}":{{)", name);
  if (c.out) s += fmt::format(R"("stdout":{})", *c.out);
  if (c.err) s += fmt::format(R"({}"stderr":{})", c.out ? "," : "", *c.err);
  return s + "}";
}
}  // namespace

std::string encode_record(const Record& r) {
  std::string output = counts_field("lost", r.lost) + counts_field("truncated", r.truncated);
  if (!r.lost_reason.empty()) output += R"(,"lost_reason":)" + json_string(r.lost_reason);
  return fmt::format(
      R"({{"schema_version":{},"vm":{},"generation":{},"outcome":"{}","exit_code":{},"signal":{},)"
      R"("exit_status":{},"reason":{},"started_at":"{}","finished_at":"{}"{}}})"
      "\n",
      Record::kSchemaVersion, json_string(r.vm), r.generation, proto::to_string(r.outcome),
      opt_u8(r.exit_code), opt_u8(r.signal), r.exit_status, json_string(r.reason),
      format_rfc3339(r.started_at), format_rfc3339(r.finished_at), output);
}

int reported_status(const Record& r) {
  const bool workloads = r.outcome == proto::Outcome::exited || r.outcome == proto::Outcome::signalled;
  return output_lost(r) && workloads ? kStatusOutputLost : r.exit_status;
}

std::vector<std::string> describe_loss(const Record& r) {
  std::vector<std::string> out;
  const std::string why = r.lost_reason.empty() ? "" : ": " + r.lost_reason;
  for (auto [name, lost, cut] : {std::tuple{"stdout", r.lost.out, r.truncated.out},
                                 std::tuple{"stderr", r.lost.err, r.truncated.err}}) {
    if (lost) out.push_back(fmt::format("{} bytes of {} lost{}", *lost, name, why));
    if (cut) out.push_back(fmt::format("{} truncated: its eof never arrived ({} bytes received)", name, *cut));
  }
  return out;
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
    } else if (key == "lost" || key == "truncated") {
      StreamCounts& c = key == "lost" ? r.lost : r.truncated;
      simdjson::dom::object counts;
      if (v.get(counts)) return Error{fmt::format("{}: expected an object of byte counts", key)};
      for (auto [stream, n] : counts) {
        std::uint64_t x;
        if (n.get_uint64().get(x))
          return Error{fmt::format("{}.{}: expected an unsigned 64-bit integer", key, stream)};
        if (stream == "stdout") c.out = x;
        else if (stream == "stderr") c.err = x;
      }
    } else if (key == "lost_reason") {
      std::string_view s;
      if (v.get_string().get(s)) return Error{"lost_reason: expected a string"};
      r.lost_reason = std::string(s);
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

namespace {

std::string errno_text(int e) { return std::strerror(e); }

/// The largest outcome.json read back: bytes (a record is a few hundred).
constexpr std::size_t kRecordCap = 1u << 20;

/// `<vm>/outcome.json` inside the VM's directory `dirfd` (`shown` names it in errors): never
/// through a symlink or a FIFO planted there; Error::err is ENOENT when there is none.
Result<std::string> read_outcome_at(int dirfd, const fs::path& shown) {
  return base::read_small_file(dirfd, kOutcomeFile, kRecordCap, {.shown = shown.native()});
}

std::atomic<std::uint64_t> g_temp_counter{0};  // unique temp names within this process

/// This protocol's temp names: `.outcome.json.PID.N.tmp`, beside the record.
std::string temp_name() {
  return fmt::format(".{}.{}.{}.tmp", kOutcomeFile, ::getpid(), g_temp_counter++);
}
bool is_temp_name(std::string_view n) {
  static const std::string prefix = fmt::format(".{}.", kOutcomeFile);
  return n.starts_with(prefix) && n.ends_with(".tmp");
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

namespace {

/// One record of a group commit: its VM dir and per-VM lock, held from the generation check to
/// the end of its round, and the temp file of the current attempt.
struct Pending {
  const Record* rec = nullptr;
  std::size_t index = 0;  // into the caller's batch
  fs::path dir;           // <state_dir>/<vm>, for messages
  Fd dir_fd, lock;
  bool created = false;   // this round made the VM dir: its entry needs the state dir fsynced
  std::string bytes;      // the encoded record
  std::string tmp;        // this attempt's temp name ("" once renamed or removed)
  Fd tmp_fd;
  Record amended;         // amend_record(): the record on disk with the new output fields
};

/// fsync(2), or the test hook in its place; 0 or the errno. Nothing at all with `sync` off.
int sync_fd(const WriteOptions& opt, int fd) {
  if (!opt.sync) return 0;
  if (opt.fsync) return opt.fsync(fd);
  return ::fsync(fd) == 0 ? 0 : errno;
}

/// Threads one round's fsyncs are spread over (the calling thread is one of them).
constexpr std::size_t kSyncFanout = 16;

/// fsync each fd of `fds`, all at once: up to kSyncFanout threads take them in turn, so the
/// kernel merges them into shared journal commits and shared device cache flushes (fsyncs issued
/// one after another on ext4 each wait for a cache flush of their own, even once their journal
/// transaction is committed). `errs[i]` is 0 or fds[i]'s errno.
void sync_all(const WriteOptions& opt, const std::vector<int>& fds, std::vector<int>& errs) {
  errs.assign(fds.size(), 0);
  if (!opt.sync || fds.empty()) return;
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next++) < fds.size();) errs[i] = sync_fd(opt, fds[i]);
  };
  std::vector<std::thread> helpers;
  const std::size_t extra = std::min(fds.size(), kSyncFanout) - 1;
  try {
    SignalsBlocked quiet;  // helpers never take a process signal
    for (std::size_t t = 0; t < extra; ++t) helpers.emplace_back(work);
  } catch (const std::system_error&) {
    // No more threads now: the ones running and this one share the rest.
  }
  work();
  for (auto& t : helpers) t.join();
}

/// Steps 1-2 of the protocol for one record: its VM dir (made without the parent fsync, which the
/// round does once for all), the per-VM flock, the generation check, leftover temps removed.
/// Returns the settled result (stale, already recorded, an error), or nullopt with `p` ready.
/// `amend`: the record of r's generation must be on disk already; `p.amended` becomes it with
/// r's output fields, and is what gets written.
std::optional<Result<WriteResult>> prepare(const fs::path& state_dir, const Record& r,
                                           const WriteOptions& opt, Pending& p, bool amend) {
  auto dres = detail::open_vm_dir_deferred(state_dir, r.vm, p.created);
  if (!dres) return Result<WriteResult>{dres.error()};
  p.dir_fd = std::move(*dres);
  p.dir = state_dir / r.vm;

  // Per-VM lock (lock_vm): serialises writers of this VM across threads and processes. Bounded,
  // never through a symlink (a dangling `.lock` would otherwise create its target).
  auto lock_res = lock_vm(p.dir_fd.get(), p.dir, opt.lock_tries);
  if (!lock_res) return Result<WriteResult>{lock_res.error()};
  p.lock = std::move(*lock_res);

  // Generation check under the lock: an older generation never replaces a newer record, and the
  // first record of a generation wins (outcome finality). Only a record of this VM counts: one
  // naming another VM is not ours, whatever its generation, and is replaced.
  auto existing = read_outcome_at(p.dir_fd.get(), p.dir / kOutcomeFile);
  if (existing) {
    if (auto old = parse_record(*existing); old && old->vm == r.vm) {
      if (old->generation > r.generation)
        return Result<WriteResult>{WriteResult{WriteResult::Kind::stale, *old, 0}};
      if (old->generation == r.generation && !amend)
        return Result<WriteResult>{WriteResult{WriteResult::Kind::already_recorded, *old, 0}};
      if (old->generation == r.generation) {
        // The first outcome stays; only what is known of its output now is added.
        p.amended = std::move(*old);
        if (!r.lost.empty()) p.amended.lost = r.lost;
        if (!r.truncated.empty()) p.amended.truncated = r.truncated;
        if (!r.lost_reason.empty()) p.amended.lost_reason = r.lost_reason;
      }
    }
    // An unparsable record cannot be a torn write of ours (rename is atomic); replace it.
  }
  if (amend && p.amended.vm.empty())
    return Result<WriteResult>{Error{fmt::format("amending {}: no record of generation {} on disk",
                                                 (p.dir / kOutcomeFile).string(), r.generation)}};
  // Not a regular file (a FIFO, a directory, a symlink): renameat replaces a FIFO or symlink;
  // a directory there makes every attempt fail with a clear error.

  // Leftover temps of crashed writers are garbage: only outcome.json is ever read.
  if (int dup_fd = ::fcntl(p.dir_fd.get(), F_DUPFD_CLOEXEC, 0); dup_fd >= 0) {
    if (DIR* dp = ::fdopendir(dup_fd)) {
      while (dirent* e = ::readdir(dp))
        if (is_temp_name(e->d_name)) ::unlinkat(p.dir_fd.get(), e->d_name, 0);
      ::closedir(dp);
    } else {
      ::close(dup_fd);
    }
  }
  p.rec = amend ? &p.amended : &r;
  return std::nullopt;
}

/// One attempt of step 3 for every record of a round together: write each temp, fsync them all,
/// rename each over its outcome.json, fsync every VM dir and (once, if the round made VM dirs)
/// the state dir. Each record still gets every fsync its own durability needs, on any
/// filesystem, but phase by phase and issued at once (sync_all): a journalling filesystem commits
/// the round's temps in one transaction and its renames in the next, with shared cache flushes.
/// An error names the failing step and carries its errno; then no temp of the attempt is left
/// behind.
Status attempt_round(int state_fd, const fs::path& state_dir, const std::vector<Pending*>& ps,
                     const WriteOptions& opt) {
  auto hook = [&](WriteStep s) { return opt.at_step ? opt.at_step(s) : 0; };
  auto fail = [&](std::string what, int e) -> Status {
    for (auto* p : ps) {
      p->tmp_fd.reset();
      if (!p->tmp.empty()) ::unlinkat(p->dir_fd.get(), p->tmp.c_str(), 0);
      p->tmp.clear();
    }
    return Error{std::move(what), e ? e : EIO};
  };
  for (auto* p : ps) {
    p->tmp = temp_name();
    const fs::path shown = p->dir / p->tmp;
    p->tmp_fd = Fd{::openat(p->dir_fd.get(), p->tmp.c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)};
    if (!p->tmp_fd) {
      int e = errno;
      p->tmp.clear();
      return fail("create temp " + shown.string(), e);
    }
    std::size_t off = 0;
    while (off < p->bytes.size()) {
      ssize_t n = ::write(p->tmp_fd.get(), p->bytes.data() + off, p->bytes.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        return fail("write " + shown.string(), errno);
      }
      off += static_cast<std::size_t>(n);
    }
    if (int e = hook(WriteStep::temp_written)) return fail("write " + shown.string(), e);
  }
  std::vector<int> fds, errs;
  for (auto* p : ps) fds.push_back(p->tmp_fd.get());
  sync_all(opt, fds, errs);
  for (std::size_t k = 0; k < ps.size(); ++k) {
    auto* p = ps[k];
    const fs::path shown = p->dir / p->tmp;
    if (int e = errs[k]) return fail("fsync " + shown.string(), e);
    if (int e = hook(WriteStep::temp_fsynced)) return fail("fsync " + shown.string(), e);
    if (::close(p->tmp_fd.release()) != 0) return fail("close " + shown.string(), errno);
  }
  for (auto* p : ps) {
    // rename(2) replaces a directory entry, never follows one: a symlink planted at outcome.json
    // is itself replaced.
    const std::string shown = "rename to " + (p->dir / kOutcomeFile).string();
    if (::renameat(p->dir_fd.get(), p->tmp.c_str(), p->dir_fd.get(), kOutcomeFile) != 0)
      return fail(shown, errno);
    p->tmp.clear();
    if (int e = hook(WriteStep::renamed)) return fail(shown, e);
  }
  fds.clear();
  for (auto* p : ps) fds.push_back(p->dir_fd.get());
  if (state_fd >= 0) fds.push_back(state_fd);
  sync_all(opt, fds, errs);
  for (std::size_t k = 0; k < ps.size(); ++k) {
    int e = errs[k];
    if (!e) e = hook(WriteStep::dir_fsynced);
    if (e) return fail("fsync " + ps[k]->dir.string(), e);
  }
  if (state_fd >= 0 && errs.back()) return fail("fsync " + state_dir.string(), errs.back());
  return Ok{};
}

/// One round of write_records(): each VM at most once, within the batch bounds.
void write_round(const fs::path& state_dir, std::span<const Record> batch,
                 std::vector<std::string>& encoded, const std::vector<std::size_t>& round,
                 const WriteOptions& opt, std::vector<Result<WriteResult>>& out, bool amend) {
  std::vector<Pending> ps(round.size());
  std::vector<Pending*> live;
  bool created = false;
  for (std::size_t k = 0; k < round.size(); ++k) {
    std::size_t i = round[k];
    if (auto settled = prepare(state_dir, batch[i], opt, ps[k], amend)) {
      out[i] = std::move(*settled);
      ps[k] = Pending{};  // its lock is released at once
      continue;
    }
    ps[k].index = i;
    ps[k].bytes = amend ? encode_record(*ps[k].rec) : std::move(encoded[i]);
    created = created || ps[k].created;
    live.push_back(&ps[k]);
  }
  if (live.empty()) return;
  const int attempts = std::max(1, opt.attempts);
  auto fail_all = [&](const std::string& what, int err) {
    for (auto* p : live) {
      std::string msg = fmt::format("recording outcome of {}: {}: {} (after {} attempts", p->rec->vm,
                                    what, errno_text(err), attempts);
      if (live.size() > 1) msg += fmt::format("; one group commit of {} records", live.size());
      out[p->index] = Error{msg + ")"};
    }
  };
  Fd state_fd;
  if (created && opt.sync) {
    state_fd = Fd{::open(state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    if (!state_fd) return fail_all("open " + state_dir.string(), errno);
  }
  Status last = Ok{};
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    last = attempt_round(state_fd ? state_fd.get() : -1, state_dir, live, opt);
    if (!last) continue;
    for (auto* p : live) out[p->index] = WriteResult{WriteResult::Kind::written, *p->rec, attempt};
    return;
  }
  fail_all(last.error().message, last.error().err);
}

}  // namespace

namespace {
/// write_records(), or with `amend` amend_record() of each record.
std::vector<Result<WriteResult>> write_records_as(const fs::path& state_dir, std::span<const Record> batch,
                                                  const WriteOptions& opt, bool amend) {
  std::vector<Result<WriteResult>> out(batch.size(), Result<WriteResult>{Error{"not written"}});
  std::vector<std::string> encoded;
  encoded.reserve(batch.size());
  for (const auto& r : batch) encoded.push_back(encode_record(r));
  std::vector<std::size_t> todo(batch.size());
  for (std::size_t i = 0; i < todo.size(); ++i) todo[i] = i;
  const std::size_t max_records = std::max<std::size_t>(1, opt.batch_records);
  while (!todo.empty()) {
    // A round holds each VM once (a second record of a VM would wait on the lock its first holds)
    // and stays within the bounds; the rest goes to the next round, in order.
    std::vector<std::size_t> round, later;
    std::vector<std::string_view> vms;
    std::size_t bytes = 0;
    for (auto i : todo) {
      bool fits = round.size() < max_records &&
                  (round.empty() || bytes + encoded[i].size() <= opt.batch_bytes) &&
                  std::find(vms.begin(), vms.end(), batch[i].vm) == vms.end();
      if (!fits) { later.push_back(i); continue; }
      round.push_back(i);
      vms.push_back(batch[i].vm);
      bytes += encoded[i].size();
    }
    write_round(state_dir, batch, encoded, round, opt, out, amend);
    todo = std::move(later);
  }
  return out;
}
}  // namespace

std::vector<Result<WriteResult>> write_records(const fs::path& state_dir,
                                               std::span<const Record> batch,
                                               const WriteOptions& opt) {
  return write_records_as(state_dir, batch, opt, false);
}

Result<WriteResult> amend_record(const fs::path& state_dir, const Record& r, const WriteOptions& opt) {
  return std::move(write_records_as(state_dir, std::span<const Record>(&r, 1), opt, true).front());
}

Result<WriteResult> write_record(const fs::path& state_dir, const Record& r,
                                 const WriteOptions& opt) {
  return std::move(write_records(state_dir, std::span<const Record>(&r, 1), opt).front());
}

Result<std::optional<Record>> read_record(const fs::path& state_dir, std::string_view vm) {
  auto d = open_vm_dir(state_dir, vm, false);
  if (!d) return d.error();
  if (!*d) return std::optional<Record>{};
  auto path = record_path(state_dir, vm);
  auto text = read_outcome_at(d->get(), path);
  if (!text && text.error().err == ENOENT) return std::optional<Record>{};
  if (!text) return text.error();
  auto r = parse_record_of(*text, vm, path);
  if (!r) return r.error();
  return std::optional<Record>{std::move(*r)};
}

}  // namespace nes::host
