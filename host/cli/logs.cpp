// `neshost logs`: print a VM's workload log (STATE/VM/workload.log and its rotated files, CRI
// format, host/lib/log_writer.hpp) as `docker logs` does: stdout records to stdout, stderr records to
// stderr, byte-exact; also after the VM is gone; -f follows a running VM until its `neshost run`
// exits.
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>
#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/lib/base.hpp"
#include "host/lib/log_writer.hpp"
#include "host/lib/state_dir.hpp"
#include "host/monitor/reconcile.hpp"

namespace nes::cli {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kLogsHelp = R"(usage: neshost logs [--state DIR] [-f] [--tail N] [--since TIME] [--timestamps] VM

Print the workload's output from DIR/VM/workload.log (and its rotated files, oldest first): its
stdout on stdout, its stderr on stderr, byte-exact. Works after the VM is gone.
  -f, --follow      keep printing new output while the VM is running
  --tail N          only the last N lines (per the log, both streams together)
  --since TIME      only output logged at or after TIME: RFC 3339 (2025-01-02T15:04:05Z), Unix
                    seconds, or a duration ago (90s, 10m, 1h30m)
  -t, --timestamps  prefix each line with its RFC 3339 timestamp
  --state DIR       state directory (default as `neshost run`)
Exit 1 if there is no log for VM.
)";

/// "1h30m", "90s", "10m", "2h": Go duration subset (integer counts of h, m, s).
std::optional<std::chrono::seconds> parse_ago(std::string_view v) {
  if (v.empty()) return std::nullopt;
  std::int64_t total = 0, n = 0;
  bool have = false;
  for (char c : v) {
    if (c >= '0' && c <= '9') {
      n = n * 10 + (c - '0');
      if (n > 100'000'000) return std::nullopt;
      have = true;
    } else if (have && (c == 'h' || c == 'm' || c == 's')) {
      total += n * (c == 'h' ? 3600 : c == 'm' ? 60 : 1);
      n = 0;
      have = false;
    } else {
      return std::nullopt;
    }
  }
  if (have) return std::nullopt;
  return std::chrono::seconds(total);
}

host::Result<host::WallTime> parse_since(std::string_view v) {
  if (auto t = host::parse_log_time(v)) return *t;
  if (auto ago = parse_ago(v)) return host::wall_now() - *ago;
  auto secs = parse_uint("since", v, 0, 1ull << 40);
  if (secs) return host::WallTime{std::chrono::seconds(*secs)};
  return host::Error{fmt::format(
      "--since: '{}' is neither RFC 3339, Unix seconds, nor a duration like 10m", v)};
}

/// Writes everything (blocking: nothing else waits on `logs`). false on EPIPE & co.
bool put(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    s.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

struct Printer {
  bool timestamps = false;
  std::optional<host::WallTime> since;
  bool at_line_start[2] = {true, true};
  bool ok = true;
  std::size_t bad = 0;

  /// One record line (no '\n').
  void line(std::string_view l) {
    auto r = host::parse_log_line(l);
    if (!r) {
      ++bad;  // a torn or foreign line: skipped, counted, reported once at the end
      return;
    }
    emit(*r);
  }
  void emit(const host::LogRecord& r) {
    if (since && r.time < *since) return;
    int i = r.stream == host::OutputStream::err ? 1 : 0;
    std::string out;
    if (timestamps && at_line_start[i]) out = host::format_rfc3339(r.time) + " ";
    out += r.content;
    if (!r.partial) out += '\n';
    at_line_start[i] = !r.partial;
    if (!put(i == 1 ? 2 : 1, out)) ok = false;
  }
};

/// Reads a file incrementally, record line by record line (a torn last line is kept).
struct Reader {
  host::Fd fd;
  std::string pending;
  ino_t ino = 0;
  /// Reads what is there; calls f(line) per complete line.
  template <class F>
  void drain(F&& f) {
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(fd.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      pending.append(buf, static_cast<std::size_t>(n));
      std::size_t pos = 0;
      for (;;) {
        auto nl = pending.find('\n', pos);
        if (nl == std::string::npos) break;
        f(std::string_view(pending).substr(pos, nl - pos));
        pos = nl + 1;
      }
      pending.erase(0, pos);
    }
  }
};

std::optional<Reader> open_reader(const fs::path& p) {
  Reader r;
  r.fd.reset(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!r.fd) return std::nullopt;
  struct stat st {};
  if (::fstat(r.fd.get(), &st) == 0) r.ino = st.st_ino;
  return r;
}

int logs_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {
      {"state"}, {"follow", false, "-f"}, {"tail", true, "-n"}, {"since"}, {"timestamps", false, "-t"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("logs", p.error().message);
  if (p->help) {
    fmt::print("{}", kLogsHelp);
    return 0;
  }
  if (p->positional.size() != 1) return usage_error("logs", "exactly one VM is required");
  const std::string vmid = p->positional[0];
  if (auto id = host::check_vm_id(vmid); !id) return usage_error("logs", "VM: " + id.error().message);
  fs::path state = p->has("state") ? fs::path(*p->get("state")) : default_state_dir();
  Printer pr;
  pr.timestamps = p->has("timestamps");
  if (auto v = p->get("since")) {
    auto t = parse_since(*v);
    if (!t) return usage_error("logs", t.error().message);
    pr.since = *t;
  }
  std::optional<std::uint64_t> tail;
  if (auto v = p->get("tail")) {
    if (*v != "all") {
      auto n = parse_uint("tail", *v, 0, 1ull << 40);
      if (!n) return usage_error("logs", n.error().message);
      tail = *n;
    }
  }
  const bool follow = p->has("follow");
  const fs::path log = host::vm_path(state, vmid, host::kWorkloadLog);
  adopt_orphan("logs", state, vmid);  // its output flows again (into the log) once it is served

  // inotify on the VM's directory before the first read: nothing written in between is missed.
  host::Fd in(follow ? ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK) : -1);
  if (in) ::inotify_add_watch(in.get(), (state / vmid).c_str(), IN_MODIFY | IN_CREATE | IN_MOVED_TO);

  auto rotated = host::rotated_logs(log);
  auto live = open_reader(log);
  if (!live && rotated.empty()) {
    fmt::print(stderr, "neshost logs: no workload log for VM '{}' in {}\n", vmid, state.string());
    return 1;
  }
  // What is there now, oldest file first; with --tail only the last N lines (records up to and
  // including an F count as one line).
  // --tail N: the N lines that ended last (an unfinished last line is one), as `docker logs
  // --tail` shows the last lines printed. Needs every record first (bounded by the log's own
  // bound, max-size x max-file).
  std::vector<host::LogRecord> all;
  auto take = [&](std::string_view l) {
    auto r = host::parse_log_line(l);
    if (!r) {
      ++pr.bad;
      return;
    }
    if (!tail) return pr.emit(*r);
    all.push_back(std::move(*r));
  };
  for (auto it = rotated.rbegin(); it != rotated.rend(); ++it)
    if (auto r = open_reader(*it)) r->drain(take);
  if (live) live->drain(take);
  if (tail) {
    // Backwards: a stream's line starts (seen from its end) at an F record, or at the stream's
    // last record; its P records before that belong to it.
    std::vector<bool> pick(all.size(), false);
    std::uint64_t lines = 0;
    bool started[2] = {false, false}, picking[2] = {false, false}, done[2] = {false, false};
    for (std::size_t k = all.size(); k-- > 0;) {
      int i = all[k].stream == host::OutputStream::err ? 1 : 0;
      if (done[i]) continue;
      if (!started[i] || !all[k].partial) {
        started[i] = true;
        if (lines < *tail) {
          ++lines;
          picking[i] = true;
        } else {
          done[i] = true;
          continue;
        }
      }
      if (picking[i]) pick[k] = true;
    }
    for (std::size_t k = 0; k < all.size(); ++k)
      if (pick[k]) pr.emit(all[k]);
  }

  // Follow: new records as they come; a rotation (a new file at the path) is followed after the
  // old file is read to its end. Ends once the VM's `neshost run` is gone and the log is read.
  while (follow && pr.ok) {
    adopt_orphan("logs", state, vmid);  // a monitor that dies while we follow is replaced too
    auto st = host::reconcile(state, vmid);
    bool running = st && *st && (*st)->status == host::VmStatus::running;
    if (!live) live = open_reader(log);
    if (live) {
      live->drain([&](std::string_view l) { pr.line(l); });
      struct stat st {};
      if (::stat(log.c_str(), &st) == 0 && st.st_ino != live->ino) {
        live->drain([&](std::string_view l) { pr.line(l); });  // the rest of the rotated file
        live = open_reader(log);
        continue;
      }
    }
    if (!running) break;
    // Woken by any change in the VM's directory; at most 500 ms apart to see the run's exit.
    pollfd pf{in.get(), POLLIN, 0};
    ::poll(&pf, 1, 500);
    char ev[4096];
    while (::read(in.get(), ev, sizeof ev) > 0) {}
  }
  if (pr.bad)
    fmt::print(stderr, "neshost logs: {} malformed line(s) in {} skipped\n", pr.bad, log.string());
  return 0;
}

const Registrar logs_reg{{"logs", "print a VM's workload output (its log), -f to follow", logs_main}};

}  // namespace
}  // namespace nes::cli
