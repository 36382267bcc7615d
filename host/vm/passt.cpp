#include "host/vm/passt.hpp"

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "host/vm/daemon.hpp"

namespace nes::vm {

namespace {

constexpr std::string_view kWayOut =
    "scripts/fetch-passt.sh fetches one, or point NESHOST_PASST at one, or use --network slirp|none";
constexpr char kPidName[] = "passt.pid";
constexpr unsigned kNobody = 65534;  // the user passt drops to when started as root (`--runas`)

/// passt's last stderr lines as one line, without its syslog complaints ("Failed to send N bytes
/// to syslog": it logs to both and there may be no syslog).
std::string last_lines(std::string_view text) {
  return daemon_last_lines(text, 600, [](std::string_view line) {
    return line.starts_with("Failed to send ") && line.ends_with("to syslog");
  });
}

/// A private directory for passt's PID file, owned by the user passt runs as, removed with this.
struct ReadyDir {
  std::filesystem::path path;
  ~ReadyDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

/// `program` found (a path, or a name in PATH), else the error both check_passt() and
/// Passt::start() give: it names passt, why, and the way out.
host::Status passt_found(const std::string& program) {
  if (program.empty()) return host::Error{fmt::format("--network user needs passt (no program named); {}", kWayOut)};
  if (auto r = resolve_program(program); !r)
    return host::Error{fmt::format("--network user needs passt ({}); {}", r.error().message, kWayOut)};
  return host::Ok{};
}

}  // namespace

std::optional<int> passt_version_date(std::string_view t) {
  auto digits = [&](std::size_t at, std::size_t n) -> std::optional<int> {
    if (at + n > t.size()) return std::nullopt;
    int v = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      if (t[i] < '0' || t[i] > '9') return std::nullopt;
      v = v * 10 + (t[i] - '0');
    }
    return v;
  };
  for (std::size_t i = 0; i + 8 <= t.size(); ++i) {
    if (i > 0 && t[i - 1] >= '0' && t[i - 1] <= '9') continue;  // a date starts a digit run
    auto y = digits(i, 4);
    if (!y || *y < 2020 || *y > 2099) continue;
    std::size_t at = i + 4;
    bool sep = at < t.size() && t[at] == '_';
    if (sep) ++at;
    auto m = digits(at, 2);
    at += 2;
    if (sep && (at >= t.size() || t[at++] != '_')) continue;
    auto d = digits(at, 2);
    if (m && d && *m >= 1 && *m <= 12 && *d >= 1 && *d <= 31) return *y * 10000 + *m * 100 + *d;
  }
  return std::nullopt;
}

host::Status check_passt(const std::string& program, std::chrono::milliseconds bound) {
  if (auto f = passt_found(program); !f) return f;
  // `passt --version` prints its version and copyright to stdout, then exits 0.
  auto text = std::make_shared<std::string>();
  auto mu = std::make_shared<std::mutex>();
  LaunchOptions lo;
  lo.argv = {program, "--version"};
  lo.console = [text, mu](std::string_view b) {
    std::lock_guard lk(*mu);
    if (text->size() < 4096) text->append(b.substr(0, 4096 - text->size()));
  };
  auto p = VmProcess::launch(std::move(lo));
  if (!p) return host::Error{fmt::format("cannot run {} --version: {}; {}", program, p.error().message, kWayOut)};
  if (!(*p)->wait_for(bound)) {
    (*p)->terminate(std::chrono::milliseconds(0));
    (*p)->finish_output(bound);
    return host::Error{fmt::format("{} --version did not answer in {} ms; {}", program, bound.count(), kWayOut)};
  }
  (*p)->finish_output(bound);
  std::string out;
  {
    std::lock_guard lk(*mu);
    out = text->substr(0, text->find('\n'));
  }
  auto date = passt_version_date(out);
  if (!date) return host::Error{fmt::format("{} --version names no passt version ('{}'); {}", program, out, kWayOut)};
  if (*date < kPasstMinVersion)
    return host::Error{fmt::format("{} is '{}': passt older than {} loses guest-bound TCP data under QEMU "
                                   "(docs/network.md); {}", program, out, kPasstMinVersion, kWayOut)};
  return host::Ok{};
}

struct Passt::State {
  std::mutex mu;
  host::Fd log;
  std::size_t logged = 0;
  bool keep = false;   // no log yet: keep the output in `early`
  std::string early;   // at most kLogCap bytes
  void feed(std::string_view b) {
    std::lock_guard lk(mu);
    write_locked(b);
  }
  void write_locked(std::string_view b) {
    if (!log && keep) {
      early.append(b.substr(0, PasstOptions::kLogCap - std::min(early.size(), PasstOptions::kLogCap)));
      return;
    }
    if (log) append_bounded_log(log.get(), b, PasstOptions::kLogCap, logged);
  }
};

host::Result<std::unique_ptr<Passt>> Passt::start(const PasstOptions& o, std::chrono::milliseconds bound) {
  if (auto f = passt_found(o.program); !f) return f.error();
  auto argv = host::passt_argv(o.network, o.program, kPasstChildFd);
  if (!argv) return argv.error();

  // Readiness: passt writes its PID file once it has set up (ports bound); we watch its directory.
  ReadyDir ready;
  std::string tmpl = (o.tmp_dir / "neshost-passt-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) return host::Error{fmt::format("passt: mkdtemp {}: {}", tmpl, std::strerror(errno))};
  ready.path = tmpl;
  const bool root = ::geteuid() == 0;
  if (root && ::chown(tmpl.c_str(), kNobody, kNobody) != 0)
    return host::Error{fmt::format("passt: chown {}: {}", tmpl, std::strerror(errno))};
  host::Fd ino(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  if (!ino || ::inotify_add_watch(ino.get(), tmpl.c_str(), IN_CLOSE_WRITE) < 0)
    return host::Error{fmt::format("passt: inotify on {}: {}", tmpl, std::strerror(errno))};
  argv->insert(argv->end(), {"--pid", (ready.path / kPidName).string()});
  if (root) argv->insert(argv->end(), {"--runas", fmt::format("{}:{}", kNobody, kNobody)});

  int sp[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0)
    return host::Error{fmt::format("passt: socketpair: {}", std::strerror(errno))};
  host::Fd passt_end(sp[0]), qemu_end(sp[1]);

  auto st = std::make_shared<State>();
  st->keep = o.log.empty();
  if (!o.log.empty()) {
    st->log.reset(::open(o.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!st->log) return host::Error{fmt::format("passt: {}: {}", o.log.native(), std::strerror(errno))};
  }
  LaunchOptions lo;
  lo.argv = std::move(*argv);
  lo.console = [st](std::string_view b) { st->feed(b); };
  lo.diagnostics = [st](std::string_view b) { st->feed(b); };
  if (o.outlive) {
    lo.death_signal = 0;
    lo.ignore_sigpipe = true;
  }
  lo.before_exec = o.before_exec;
  lo.fds = {{passt_end.get(), kPasstChildFd}};
  auto p = VmProcess::launch(std::move(lo));
  if (!p) return host::Error{fmt::format("cannot start passt: {}", p.error().message)};
  passt_end.reset();  // passt holds its own copy: its end closes when passt exits
  auto d = std::make_unique<Passt>(Key{}, std::move(*p), st, std::move(qemu_end));

  // Ready (the PID file written), exited, or silent for too long: whichever comes first. Any
  // close-after-write in the directory is passt's PID file (nothing else writes there).
  auto pid_written = [&ino] {
    alignas(inotify_event) char buf[4096];
    bool written = false;
    ssize_t n;
    while ((n = ::read(ino.get(), buf, sizeof buf)) > 0)
      for (char* q = buf; q < buf + n;) {
        auto* ev = reinterpret_cast<inotify_event*>(q);
        if (ev->len && std::strcmp(ev->name, kPidName) == 0) written = true;
        q += sizeof(inotify_event) + ev->len;
      }
    return written;
  };
  auto w = wait_ready(*d->proc_, ino.get(), bound, pid_written);
  std::string why = last_lines(w.tail);
  switch (w.outcome) {
    case DaemonWait::Outcome::ready: return d;
    case DaemonWait::Outcome::exited:
      return host::Error{fmt::format("passt {}{}{}", w.exit ? describe(*w.exit) : "exited", why.empty() ? "" : ": ", why)};
    case DaemonWait::Outcome::timed_out:
      return host::Error{fmt::format("passt not ready after {} ms{}{}", bound.count(), why.empty() ? "" : ": ", why)};
  }
  return host::Error{"passt: unreachable"};
}

void Passt::log_to(host::Fd log) {
  std::lock_guard lk(st_->mu);
  st_->log = std::move(log);
  std::string early = std::move(st_->early);
  st_->early.clear();
  st_->write_locked(early);
}

std::string Passt::last_words() const { return last_lines(proc_->diagnostics_tail()); }

ProcessExit Passt::stop(std::chrono::milliseconds grace) {
  close_qemu_fd();
  return stop_daemon(*proc_, grace);
}

Passt::~Passt() = default;  // VmProcess's destructor kills and reaps a running passt

}  // namespace nes::vm
