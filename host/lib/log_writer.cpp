#include "host/lib/log_writer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <charconv>
#include <climits>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "host/lib/signals_blocked.hpp"

namespace nes::host {

namespace fs = std::filesystem;

std::string_view to_string(OutputStream s) { return s == OutputStream::err ? "stderr" : "stdout"; }

Status check_log_options(const LogOptions& o) {
  if (o.path.empty()) return Error{"log path: empty"};
  if (o.max_line < 1 || o.max_line > (1u << 20))
    return Error{fmt::format("max_line: {} bytes is outside 1..1048576", o.max_line)};
  if (o.max_size < kMinLogSize)
    return Error{fmt::format("max_size: {} bytes is below the minimum {} (64 KiB)", o.max_size,
                             kMinLogSize)};
  if (o.max_size < 2 * (o.max_line + 64))
    return Error{fmt::format("max_size: {} bytes cannot hold two records of max_line {} bytes",
                             o.max_size, o.max_line)};
  if (o.max_files < 1 || o.max_files > 100)
    return Error{fmt::format("max_files: {} is outside 1..100", o.max_files)};
  return Ok{};
}

std::vector<fs::path> rotated_logs(const fs::path& path) {
  std::vector<fs::path> out;
  for (int i = 1; i <= 100; ++i) {
    fs::path p = path;
    p += fmt::format(".{}", i);
    std::error_code ec;
    if (!fs::exists(p, ec)) break;
    out.push_back(p);
  }
  return out;
}

namespace {

bool digits(std::string_view s, std::size_t pos, std::size_t n, int& out) {
  if (pos + n > s.size()) return false;
  int v = 0;
  for (std::size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  out = v;
  return true;
}

}  // namespace

std::optional<WallTime> parse_log_time(std::string_view s) {
  int Y, M, D, h, m, sec;
  if (!digits(s, 0, 4, Y) || s.size() < 19 || s[4] != '-' || !digits(s, 5, 2, M) || s[7] != '-' ||
      !digits(s, 8, 2, D) || (s[10] != 'T' && s[10] != 't') || !digits(s, 11, 2, h) ||
      s[13] != ':' || !digits(s, 14, 2, m) || s[16] != ':' || !digits(s, 17, 2, sec))
    return std::nullopt;
  if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60) return std::nullopt;
  std::size_t i = 19;
  std::int64_t nanos = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    std::size_t start = i;
    std::int64_t scale = 100'000'000;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      nanos += (s[i] - '0') * scale;
      scale /= 10;
      ++i;
    }
    if (i == start || i - start > 9) return std::nullopt;
  }
  std::int64_t offset = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) {
    ++i;
  } else if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    int oh, om;
    if (!digits(s, i + 1, 2, oh) || i + 3 >= s.size() || s[i + 3] != ':' || !digits(s, i + 4, 2, om))
      return std::nullopt;
    offset = (oh * 3600 + om * 60) * (s[i] == '-' ? -1 : 1);
    i += 6;
  } else {
    return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  std::tm tm{};
  tm.tm_year = Y - 1900;
  tm.tm_mon = M - 1;
  tm.tm_mday = D;
  tm.tm_hour = h;
  tm.tm_min = m;
  tm.tm_sec = sec;
  std::int64_t t = static_cast<std::int64_t>(::timegm(&tm)) - offset;
  return WallTime{std::chrono::nanoseconds{t * 1'000'000'000 + nanos}};
}

Result<LogRecord> parse_log_line(std::string_view line) {
  auto sp1 = line.find(' ');
  if (sp1 == std::string_view::npos) return Error{"timestamp: no space after it"};
  auto ts = parse_log_time(line.substr(0, sp1));
  if (!ts) return Error{fmt::format("timestamp: '{}' is not RFC 3339", line.substr(0, sp1))};
  auto sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return Error{"stream: no space after it"};
  auto stream = line.substr(sp1 + 1, sp2 - sp1 - 1);
  LogRecord r;
  r.time = *ts;
  if (stream == "stdout") r.stream = OutputStream::out;
  else if (stream == "stderr") r.stream = OutputStream::err;
  else return Error{fmt::format("stream: '{}' is neither stdout nor stderr", stream)};
  // The tag field; kubelet also accepts a line without it (older format) but we always write it.
  auto sp3 = line.find(' ', sp2 + 1);
  auto tags = line.substr(sp2 + 1, sp3 == std::string_view::npos ? std::string_view::npos : sp3 - sp2 - 1);
  // As kubelet: the tags split at ':', the first decides; the others are extensions.
  auto colon = tags.find(':');
  auto tag = tags.substr(0, colon);
  if (tag == "P") r.partial = true;
  else if (tag != "F") return Error{fmt::format("tag: '{}' is neither P nor F", tag)};
  while (colon != std::string_view::npos) {
    tags.remove_prefix(colon + 1);
    colon = tags.find(':');
    auto ext = tags.substr(0, colon);
    std::uint64_t g = 0;
    if (ext.size() > 1 && ext[0] == 'g' && ext[1] != '0' &&
        std::from_chars(ext.data() + 1, ext.data() + ext.size(), g).ptr == ext.data() + ext.size())
      r.generation = g;
  }
  r.content = sp3 == std::string_view::npos ? std::string() : std::string(line.substr(sp3 + 1));
  return r;
}

Result<std::unique_ptr<LogWriter>> LogWriter::open(LogOptions opt) {
  if (auto s = check_log_options(opt); !s) return s.error();
  auto w = std::make_unique<LogWriter>(std::move(opt));
  w->fd_.reset(::open(w->opt_.path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640));
  if (!w->fd_) return Error{fmt::format("open {}: {}", w->opt_.path.string(), std::strerror(errno))};
  struct stat st {};
  if (::fstat(w->fd_.get(), &st) == 0) w->size_ = static_cast<std::uint64_t>(st.st_size);
  if (!w->opt_.positions.empty()) {
    if (auto p = read_log_positions(w->opt_.positions)) {
      w->pos_ = *p;
      // A write the killed host began and never counted (a SIGKILL cuts a long write(2) at a
      // page): cut back to what the positions stand for; the guest sends those bytes again.
      if (w->size_ > p->file && ::ftruncate(w->fd_.get(), static_cast<off_t>(p->file)) == 0) w->size_ = p->file;
    }
    w->pos_fd_.reset(::open(w->opt_.positions.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0640));
    if (!w->pos_fd_) return Error{fmt::format("open {}: {}", w->opt_.positions.string(), std::strerror(errno))};
    w->write_positions();
  }
  return w;
}

namespace {
/// The sidecar's one line, padded to a fixed size so that every update is one pwrite(2) at 0
/// over the last (never a shorter file with a stale tail).
constexpr std::size_t kPositionsSize = 128;
}  // namespace

std::optional<LogPositions> read_log_positions(const std::filesystem::path& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  char buf[kPositionsSize + 1] = {};
  ssize_t n = ::pread(fd.get(), buf, kPositionsSize, 0);
  if (n <= 0) return std::nullopt;
  unsigned long long o = 0, e = 0, f = 0;
  if (std::sscanf(buf, "positions stdout %llu stderr %llu file %llu", &o, &e, &f) != 3) return std::nullopt;
  return LogPositions{o, e, f};
}

void LogWriter::write_positions() {
  if (!pos_fd_) return;
  pos_.file = size_;
  std::string line = fmt::format("positions stdout {} stderr {} file {}", pos_.out, pos_.err, size_);
  line.resize(kPositionsSize - 1, ' ');
  line.push_back('\n');
  // No fsync: a killed host loses nothing of the page cache; a machine crash may lose the
  // update with the log's own bytes (the resume then asks for them again: nothing twice).
  if (::pwrite(pos_fd_.get(), line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))
    fail(fmt::format("write {}: {}", opt_.positions.string(), std::strerror(errno)));
}

void LogWriter::fail(std::string why) {
  if (!error_) error_ = std::move(why);
  fd_.reset();
}

bool LogWriter::rotate() {
  fd_.reset();
  auto nth = [&](unsigned i) {
    fs::path p = opt_.path;
    p += fmt::format(".{}", i);
    return p;
  };
  int flags = O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC;
  if (opt_.max_files == 1) {
    flags |= O_TRUNC;  // docker json-file with max-file 1: the one file starts over
  } else {
    std::error_code ec;
    fs::remove(nth(opt_.max_files - 1), ec);
    for (unsigned i = opt_.max_files - 1; i >= 2; --i) {
      fs::rename(nth(i - 1), nth(i), ec);  // ENOENT for a gap: fine
    }
    fs::rename(opt_.path, nth(1), ec);
    if (ec) {
      fail(fmt::format("rotate {}: {}", opt_.path.string(), ec.message()));
      return false;
    }
  }
  fd_.reset(::open(opt_.path.c_str(), flags, 0640));
  if (!fd_) {
    fail(fmt::format("open {}: {}", opt_.path.string(), std::strerror(errno)));
    return false;
  }
  size_ = 0;
  // The sidecar's `file` now names the new (empty) file: a host killed after the next write
  // cuts that file back to what was counted, never to the old file's size.
  write_positions();
  return true;
}

void LogWriter::record(OutputStream s, bool partial, std::string_view content, WallTime t,
                       bool stable) {
  if (!fd_) return;
  Pending p;
  std::string ts = format_rfc3339(t);
  std::string_view tag = partial ? " P" : " F";
  std::string_view sn = to_string(s);
  char gen[24];  // ":g<N>" (fencing: the generation whose output this is), or nothing
  std::size_t gl = 0;
  if (opt_.generation) gl = static_cast<std::size_t>(fmt::format_to_n(gen, sizeof gen, ":g{}", opt_.generation).out - gen);
  std::size_t h = 0;
  auto put = [&](std::string_view x) {
    std::memcpy(p.hdr + h, x.data(), x.size());
    h += x.size();
  };
  put(ts);
  put(" ");
  put(sn);
  put(tag);
  put(std::string_view(gen, gl));
  put(" ");
  p.hlen = static_cast<std::uint8_t>(h);
  const std::uint64_t len = h + content.size() + 1;
  if (size_ + pend_bytes_ > 0 && size_ + pend_bytes_ + len > opt_.max_size) {
    flush();
    if (!fd_ || !rotate()) return;
  }
  if (!stable) {
    keep_.emplace_back(content);
    content = keep_.back();
  }
  p.content = content;
  // Workload bytes (not a gap's text): the content, and the newline an F record stands for.
  p.counted = counting_ ? (s == OutputStream::err ? 2 : 1) : 0;
  p.newline = !partial;
  pend_.push_back(p);
  pend_bytes_ += len;
  if (pend_.size() >= 300) flush();  // three iovecs each, under IOV_MAX
}

void LogWriter::flush() {
  if (pend_.empty()) return;
  static const char nl = '\n';
  std::vector<iovec> iov;
  iov.reserve(pend_.size() * 3);
  for (auto& p : pend_) {
    iov.push_back({p.hdr, p.hlen});
    if (!p.content.empty()) iov.push_back({const_cast<char*>(p.content.data()), p.content.size()});
    iov.push_back({const_cast<char*>(&nl), 1});
  }
  std::size_t i = 0;
  while (fd_ && i < iov.size()) {
    int cnt = static_cast<int>(std::min<std::size_t>(iov.size() - i, IOV_MAX));
    ssize_t n = ::writev(fd_.get(), iov.data() + i, cnt);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail(fmt::format("write {}: {}", opt_.path.string(), n < 0 ? std::strerror(errno) : "short write"));
      break;
    }
    size_ += static_cast<std::uint64_t>(n);
    written_total_ += static_cast<std::uint64_t>(n);
    auto left = static_cast<std::size_t>(n);
    while (left > 0 && i < iov.size()) {  // advance past what was written
      if (left >= iov[i].iov_len) {
        left -= iov[i].iov_len;
        ++i;
      } else {
        iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
        iov[i].iov_len -= left;
        left = 0;
      }
    }
  }
  // Every record is in the file now (unless logging stopped): their content counts.
  bool moved = false;
  if (fd_) {
    for (const auto& p : pend_) {
      if (!p.counted) continue;
      (p.counted == 2 ? pos_.err : pos_.out) += p.skipped ? p.skipped : p.content.size() + (p.newline ? 1 : 0);
      moved = true;
    }
  }
  pend_.clear();
  pend_bytes_ = 0;
  keep_.clear();
  if (moved || (pos_fd_ && pos_.file != size_)) write_positions();
}

void LogWriter::append(OutputStream s, std::string_view b, WallTime t) {
  std::string& held = held_[s == OutputStream::err ? 1 : 0];
  const std::size_t L = opt_.max_line;
  // Records cut from `b` point into it (it lives until the next flush()); only an unfinished
  // line's head, at most L bytes, is ever copied (into `held`). Record boundaries are those of
  // the concatenation held + b: a line longer than L becomes P records of L bytes and an F.
  while (!b.empty() && fd_) {
    const auto nl = b.find('\n');
    if (!held.empty()) {
      // `held` (under L bytes) is the head of this line: complete it, up to L bytes.
      const std::size_t line = nl == std::string_view::npos ? b.size() : nl;
      if (nl != std::string_view::npos && held.size() + line <= L) {
        held.append(b.substr(0, line));
        record(s, false, held, t, false);
        held.clear();
        b.remove_prefix(line + 1);
        continue;
      }
      const std::size_t take = std::min(line, L - held.size());
      held.append(b.substr(0, take));
      b.remove_prefix(take);
      if (held.size() < L) break;  // no newline and under L bytes in all: keep holding
      record(s, true, held, t, false);
      held.clear();
      continue;
    }
    if (nl == std::string_view::npos) {
      while (b.size() >= L) {
        record(s, true, b.substr(0, L), t, true);
        b.remove_prefix(L);
      }
      held.assign(b);
      break;
    }
    std::string_view line = b.substr(0, nl);
    b.remove_prefix(nl + 1);
    while (line.size() > L) {
      record(s, true, line.substr(0, L), t, true);
      line.remove_prefix(L);
    }
    record(s, false, line, t, true);
  }
}

void LogWriter::eof(OutputStream s, WallTime t) {
  std::string& held = held_[s == OutputStream::err ? 1 : 0];
  if (!held.empty()) record(s, true, held, t, false);
  held.clear();
  flush();
}

void LogWriter::flush_partial(WallTime t) {
  eof(OutputStream::out, t);
  eof(OutputStream::err, t);
}

void LogWriter::dropped(OutputStream s, std::uint64_t n, WallTime t) {
  gap(s, fmt::format("{} bytes of {} dropped", n, to_string(s)), t);
}

void LogWriter::skipped(OutputStream s, std::uint64_t n, WallTime t) {
  eof(s, t);
  counting_ = false;
  const std::size_t before = pend_.size();
  record(s, false, fmt::format("[neshost: {} bytes of {} dropped]", n, to_string(s)), t, false);
  counting_ = true;
  if (n > 0 && pend_.size() > before) {
    pend_.back().counted = s == OutputStream::err ? 2 : 1;
    pend_.back().skipped = n;
  }
  flush();
}

void LogWriter::gap(OutputStream s, std::string_view what, WallTime t) {
  eof(s, t);
  counting_ = false;
  record(s, false, fmt::format("[neshost: {}]", what), t, false);
  counting_ = true;
  flush();
}

// ---- AsyncLog ----

struct AsyncLog::State {
  enum class Kind { data, eof, gap, skipped };
  struct Item {
    Kind kind;
    OutputStream stream;
    std::string bytes;  // data: the output; gap: what the record says
    std::uint64_t n = 0;
    WallTime t;
  };
  mutable std::mutex mu;
  std::condition_variable cv, done_cv;
  std::deque<Item> q;
  std::size_t queued = 0;
  std::size_t cap = 0;
  bool was_full = false;
  bool stop = false;
  bool done = false;
  std::function<void()> on_drained;
  std::function<void(LogPositions)> on_written;
  LogPositions pos;
  std::unique_ptr<LogWriter> w;
  /// After a flush (lock held): the positions moved: tell on_written (lock released meanwhile).
  void moved(std::unique_lock<std::mutex>& lk) {
    const LogPositions p = w->positions();
    if (p == pos) return;
    pos = p;
    if (!on_written) return;
    auto cb = on_written;
    lk.unlock();
    cb(p);
    lk.lock();
  }
  std::optional<std::string> err;

  void run() {
    std::unique_lock lk(mu);
    bool held = false;  // a partial line may be held by the writer
    for (;;) {
      if (q.empty() && !stop) {
        if (!cv.wait_for(lk, std::chrono::milliseconds(200), [&] { return stop || !q.empty(); })) {
          if (held) {
            lk.unlock();
            w->flush_partial(wall_now());
            lk.lock();
            held = false;
            moved(lk);
          }
          continue;
        }
      }
      if (q.empty() && stop) break;
      std::deque<Item> batch;
      batch.swap(q);
      lk.unlock();
      std::size_t n = 0;
      // One writev(2) for the whole batch where it fits: the items live until the flush below.
      for (auto& it : batch) {
        if (it.kind == Kind::data) {
          n += it.bytes.size();
          w->append(it.stream, it.bytes, it.t);
        } else if (it.kind == Kind::eof) {
          w->eof(it.stream, it.t);
        } else if (it.kind == Kind::skipped) {
          w->skipped(it.stream, it.n, it.t);
        } else {
          w->gap(it.stream, it.bytes, it.t);
        }
      }
      w->flush();
      held = true;
      lk.lock();
      queued -= n;
      if (w->error() && !err) err = w->error();
      moved(lk);
      if (was_full && queued < cap / 2) {
        was_full = false;
        if (on_drained) {
          auto cb = on_drained;
          lk.unlock();
          cb();
          lk.lock();
        }
      }
    }
    lk.unlock();
    w->flush_partial(wall_now());
    lk.lock();
    if (w->error() && !err) err = w->error();
    w.reset();  // closes the file
    done = true;
    done_cv.notify_all();
  }
};

Result<std::unique_ptr<AsyncLog>> AsyncLog::start(LogOptions opt, std::size_t queue_cap,
                                                  std::function<void()> on_drained) {
  auto w = LogWriter::open(std::move(opt));
  if (!w) return w.error();
  auto a = std::make_unique<AsyncLog>();
  a->st_ = std::make_shared<State>();
  a->cap_ = std::max<std::size_t>(queue_cap, 1);
  a->st_->cap = a->cap_;
  a->st_->w = std::move(*w);
  a->st_->pos = a->st_->w->positions();
  a->st_->on_drained = std::move(on_drained);
  SignalsBlocked quiet;  // the writer thread never takes a process signal
  a->thread_ = std::thread([st = a->st_] { st->run(); });
  return a;
}

void AsyncLog::push(OutputStream s, std::string_view bytes, WallTime t) {
  if (bytes.empty()) return;
  bool wake;  // the writer waits only on an empty queue: wake it only then
  {
    std::lock_guard lk(st_->mu);
    if (st_->stop) return;
    wake = st_->q.empty();
    st_->q.push_back({State::Kind::data, s, std::string(bytes), 0, t});
    st_->queued += bytes.size();
    if (st_->queued >= cap_) st_->was_full = true;
  }
  if (wake) st_->cv.notify_one();
}

void AsyncLog::push(OutputStream s, std::string&& bytes, WallTime t) {
  if (bytes.empty()) return;
  const std::size_t n = bytes.size();
  bool wake;  // the writer waits only on an empty queue: wake it only then
  {
    std::lock_guard lk(st_->mu);
    if (st_->stop) return;
    wake = st_->q.empty();
    st_->q.push_back({State::Kind::data, s, std::move(bytes), 0, t});
    st_->queued += n;
    if (st_->queued >= cap_) st_->was_full = true;
  }
  if (wake) st_->cv.notify_one();
}

void AsyncLog::push_eof(OutputStream s, WallTime t) {
  {
    std::lock_guard lk(st_->mu);
    if (st_->stop) return;
    st_->q.push_back({State::Kind::eof, s, {}, 0, t});
  }
  st_->cv.notify_one();
}

void AsyncLog::push_dropped(OutputStream s, std::uint64_t n, WallTime t) {
  push_gap(s, fmt::format("{} bytes of {} dropped", n, to_string(s)), t);
}

void AsyncLog::push_skipped(OutputStream s, std::uint64_t n, WallTime t) {
  {
    std::lock_guard lk(st_->mu);
    if (st_->stop) return;
    st_->q.push_back({State::Kind::skipped, s, {}, n, t});
  }
  st_->cv.notify_one();
}

void AsyncLog::push_gap(OutputStream s, std::string what, WallTime t) {
  {
    std::lock_guard lk(st_->mu);
    if (st_->stop) return;
    st_->q.push_back({State::Kind::gap, s, std::move(what), 0, t});
  }
  st_->cv.notify_one();
}

LogPositions AsyncLog::positions() const {
  std::lock_guard lk(st_->mu);
  return st_->pos;
}

void AsyncLog::on_written(std::function<void(LogPositions)> cb) {
  std::lock_guard lk(st_->mu);
  st_->on_written = std::move(cb);
}

std::size_t AsyncLog::queued_bytes() const {
  std::lock_guard lk(st_->mu);
  return st_->queued;
}

std::optional<std::string> AsyncLog::error() const {
  std::lock_guard lk(st_->mu);
  return st_->err;
}

bool AsyncLog::close(std::chrono::milliseconds bound) {
  if (closed_) return true;
  closed_ = true;
  bool done;
  {
    std::unique_lock lk(st_->mu);
    st_->stop = true;
    st_->on_drained = nullptr;  // its target (a loop) may be gone once we return
    st_->on_written = nullptr;
    st_->cv.notify_one();
    done = st_->done_cv.wait_for(lk, bound, [&] { return st_->done; });
  }
  if (done) thread_.join();
  else thread_.detach();  // stuck in a write (a hung disk): it owns its state and ends alone
  return done;
}

AsyncLog::~AsyncLog() {
  if (st_) close(std::chrono::milliseconds(2000));
}

}  // namespace nes::host
