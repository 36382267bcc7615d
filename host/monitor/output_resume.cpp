// The workload's output delivered exactly once across monitors (host/monitor/output_resume.hpp).
#include "host/monitor/output_resume.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "host/lib/state_dir.hpp"

namespace nes::monitor {

namespace fs = std::filesystem;

namespace {
constexpr std::size_t kTallyBytes = 2 * sizeof(std::uint64_t);
constexpr std::string_view kGapNote = "[neshost: ";  // LogWriter's gap/dropped/skipped records
int index_of(host::OutputStream s) { return s == host::OutputStream::err ? 1 : 0; }
}  // namespace

host::Result<OutputTally> OutputTally::open(const fs::path& state, const std::string& vm, bool create) {
  const fs::path path = host::vm_path(state, vm, kOutputPos);
  auto f = host::open_vm_file(state, vm, kOutputPos, O_RDWR | (create ? O_CREAT | O_TRUNC : 0));
  if (!f) return host::Error{fmt::format("{}: {}", path.string(), f.error().message)};
  if (!*f) return host::Error{fmt::format("{}: missing", path.string())};  // ENOENT without O_CREAT
  struct stat st{};
  if (::fstat(f->get(), &st) != 0) return host::Error{fmt::format("{}: fstat: {}", path.string(), std::strerror(errno))};
  if (create && ::ftruncate(f->get(), kTallyBytes) != 0)
    return host::Error{fmt::format("{}: ftruncate: {}", path.string(), std::strerror(errno))};
  if (!create && static_cast<std::size_t>(st.st_size) != kTallyBytes)
    return host::Error{fmt::format("{}: {} bytes, not {}", path.string(), st.st_size, kTallyBytes)};
  void* m = ::mmap(nullptr, kTallyBytes, PROT_READ | PROT_WRITE, MAP_SHARED, f->get(), 0);
  if (m == MAP_FAILED) return host::Error{fmt::format("{}: mmap: {}", path.string(), std::strerror(errno))};
  return OutputTally(static_cast<volatile std::uint64_t*>(m));
}

OutputTally& OutputTally::operator=(OutputTally&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(const_cast<std::uint64_t*>(map_), kTallyBytes);
    map_ = o.map_;
    o.map_ = nullptr;
  }
  return *this;
}

OutputTally::~OutputTally() {
  if (map_) ::munmap(const_cast<std::uint64_t*>(map_), kTallyBytes);
}

std::uint64_t OutputTally::delivered(host::OutputStream s) const { return map_ ? map_[index_of(s)] : 0; }

void OutputTally::add(host::OutputStream s, std::uint64_t n) {
  if (map_) map_[index_of(s)] = map_[index_of(s)] + n;
}

std::optional<host::VmmSink> output_sink_of(int fd) {
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode))) return std::nullopt;
  char link[4096];
  const ssize_t n = ::readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), link, sizeof link - 1);
  if (n <= 0 || link[0] != '/') return std::nullopt;  // "pipe:[N]": anonymous, cannot be reopened
  const std::string path(link, static_cast<std::size_t>(n));
  struct stat ps{};
  if (::stat(path.c_str(), &ps) != 0 || ps.st_dev != st.st_dev || ps.st_ino != st.st_ino) return std::nullopt;
  host::VmmSink s;
  s.path = path;
  s.kind = S_ISFIFO(st.st_mode) ? host::VmmSink::Kind::fifo : host::VmmSink::Kind::file;
  return s;
}

host::Result<host::Fd> open_sink(const host::VmmSink& sink) {
  const bool fifo = sink.kind == host::VmmSink::Kind::fifo;
  host::Fd f(::open(sink.path.c_str(), (fifo ? O_RDWR | O_NONBLOCK : O_WRONLY | O_APPEND) | O_CLOEXEC | O_NOCTTY));
  if (!f) return host::Error{fmt::format("open {}: {}", sink.path.string(), std::strerror(errno))};
  struct stat st{};
  if (::fstat(f.get(), &st) != 0 || (fifo ? !S_ISFIFO(st.st_mode) : !S_ISREG(st.st_mode)))
    return host::Error{fmt::format("{}: no longer a {}", sink.path.string(), fifo ? "FIFO" : "regular file")};
  return f;
}

namespace {

/// Stream `s`'s bytes of `generation` in one log file's first `limit` bytes (all: nullopt).
std::string stream_bytes(const fs::path& file, host::OutputStream s, std::uint64_t generation,
                         std::optional<std::uint64_t> limit) {
  std::string text, out;
  host::Fd f(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!f) return out;
  char buf[1 << 16];
  for (;;) {
    std::size_t want = sizeof buf;
    if (limit) {
      if (text.size() >= *limit) break;
      want = std::min<std::uint64_t>(want, *limit - text.size());
    }
    const ssize_t n = ::read(f.get(), buf, want);
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t nl = text.find('\n', at);
    if (nl == std::string::npos) break;  // a record the writer never finished: not counted
    auto rec = host::parse_log_line(std::string_view(text).substr(at, nl - at));
    at = nl + 1;
    if (!rec || rec->stream != s || rec->generation.value_or(generation) != generation) continue;
    if (!rec->partial && rec->content.starts_with(kGapNote)) continue;  // the log's note, not the stream's
    out += rec->content;
    if (!rec->partial) out += '\n';
  }
  return out;
}

}  // namespace

LoggedBytes logged_bytes(const fs::path& log, host::OutputStream s, std::uint64_t generation, std::uint64_t from,
                         std::uint64_t to, std::uint64_t live_size) {
  LoggedBytes r;
  if (to <= from) return r;
  const std::uint64_t need = to - from;
  // Newest first: the live file up to live_size, then log.1, log.2, ...: the stream's last
  // `need` bytes end at position `to`, the live file's end.
  std::string tail = stream_bytes(log, s, generation, live_size);
  for (const auto& older : host::rotated_logs(log)) {
    if (tail.size() >= need) break;
    tail.insert(0, stream_bytes(older, s, generation, std::nullopt));
  }
  if (tail.size() >= need) {
    r.bytes = tail.substr(tail.size() - need);
  } else {
    r.missing = need - tail.size();
    r.bytes = std::move(tail);
  }
  return r;
}

}  // namespace nes::monitor
