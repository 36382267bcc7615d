#include "host/vm/virtiofsd.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "host/vm/daemon.hpp"
#include "protocol/limits.hpp"

namespace nes::vm {

namespace {
// What virtiofsd (1.x) logs at info level once its listening socket exists.
constexpr std::string_view kReadyLine = "Waiting for vhost-user socket connection";
}  // namespace

host::Status check_share_tag(std::string_view tag) {
  if (tag.empty() || tag.size() > 36) return host::Error{fmt::format("tag '{}' must be 1..36 bytes", tag)};
  for (char c : tag)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return host::Error{fmt::format("tag '{}' must be of [A-Za-z0-9._-]", tag)};
  return host::Ok{};
}

std::vector<std::string> virtiofsd_argv(const VirtiofsdOptions& o) {
  std::vector<std::string> a{o.program, "--socket-path=" + o.socket.native(),
                             "--shared-dir=" + o.share.dir.native(), "--sandbox=namespace",
                             fmt::format("--cache={}", kCacheMode), "--log-level=info"};
  if (o.share.ro) a.emplace_back("--readonly");
  if (o.binds.empty() && !o.overlay) return a;
  // Paths travel as positional arguments, never inside the script: nothing in them is parsed
  // (overlayfs' own option string excepted: its paths are checked for ',' and ':' by the planner).
  std::vector<std::string> w{"unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                             "set -e; if [ \"$1\" = overlay ]; then "
                             "mount -t overlay overlay -o \"lowerdir=$2,upperdir=$3,workdir=$4\" -- \"$5\"; shift 5; fi; "
                             "while [ \"$1\" != -- ]; do mount --bind -- \"$1\" \"$2\"; "
                             "if [ \"$3\" = ro ]; then mount -o remount,bind,ro -- \"$2\"; fi; shift 3; done; "
                             "shift; exec \"$@\"",
                             "sh"};
  if (o.overlay) {
    w.emplace_back("overlay");
    w.push_back(o.overlay->lower.native());
    w.push_back(o.overlay->upper.native());
    w.push_back(o.overlay->work.native());
    w.push_back(o.share.dir.native());
  }
  for (const auto& b : o.binds) {
    w.push_back(b.source.native());
    w.push_back(b.target.native());
    w.emplace_back(b.ro ? "ro" : "rw");
  }
  w.emplace_back("--");
  w.insert(w.end(), a.begin(), a.end());
  return w;
}

struct Virtiofsd::State {
  std::mutex mu;
  host::Fd log;
  std::size_t logged = 0;
  std::string window;  // the last bytes seen, so the ready line is found across chunk borders
  bool ready = false;
  host::Fd ready_ev;   // eventfd, written once when the ready line appears

  void feed(std::string_view b) {
    std::lock_guard lk(mu);
    if (log) append_bounded_log(log.get(), b, VirtiofsdOptions::kLogCap, logged);
    if (ready) return;
    window.append(b);
    if (window.find(kReadyLine) != std::string::npos) {
      ready = true;
      std::uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(ready_ev.get(), &one, sizeof one);
      window.clear();
    } else if (window.size() > kReadyLine.size()) {
      window.erase(0, window.size() - kReadyLine.size());
    }
  }
};

host::Result<std::unique_ptr<Virtiofsd>> Virtiofsd::start(const VirtiofsdOptions& o,
                                                          std::chrono::milliseconds bound) {
  const std::string who = fmt::format("share '{}' ({})", o.share.tag, o.share.dir.native());
  if (auto t = check_share_tag(o.share.tag); !t) return host::Error{who + ": " + t.error().message};
  if (o.socket.native().size() > proto::kUnixPathMax)
    return host::Error{fmt::format("{}: socket path '{}' is longer than sun_path", who, o.socket.native())};
  auto st = std::make_shared<State>();
  st->ready_ev.reset(::eventfd(0, EFD_CLOEXEC));
  if (!st->ready_ev) return host::Error{fmt::format("eventfd: {}", std::strerror(errno))};
  if (!o.log.empty()) {
    st->log.reset(::open(o.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!st->log) return host::Error{fmt::format("{}: {}: {}", who, o.log.native(), std::strerror(errno))};
  }
  LaunchOptions lo;
  lo.argv = virtiofsd_argv(o);
  lo.console = [st](std::string_view b) { st->feed(b); };
  lo.diagnostics = [st](std::string_view b) { st->feed(b); };
  if (o.outlive) {
    lo.death_signal = 0;
    lo.ignore_sigpipe = true;
  }
  lo.before_exec = o.before_exec;
  auto p = VmProcess::launch(std::move(lo));
  if (!p) return host::Error{fmt::format("{}: cannot start virtiofsd: {}", who, p.error().message)};
  auto d = std::make_unique<Virtiofsd>(Key{}, std::move(*p), st, o.share);

  // Ready, exited, or silent for too long: whichever comes first.
  auto w = wait_ready(*d->proc_, st->ready_ev.get(), bound);
  switch (w.outcome) {
    case DaemonWait::Outcome::ready: return d;
    case DaemonWait::Outcome::exited:
      return host::Error{fmt::format("{}: virtiofsd {}: {}", who, w.exit ? describe(*w.exit) : "exited",
                                     daemon_last_lines(w.tail))};
    case DaemonWait::Outcome::timed_out:
      return host::Error{fmt::format("{}: virtiofsd not listening after {} ms{}{}", who, bound.count(),
                                     w.tail.empty() ? "" : ": ", daemon_last_lines(w.tail))};
  }
  return host::Error{who + ": virtiofsd: unreachable"};
}

ProcessExit Virtiofsd::stop(std::chrono::milliseconds grace) { return stop_daemon(*proc_, grace); }

Virtiofsd::~Virtiofsd() = default;  // VmProcess's destructor kills and reaps a running daemon

}  // namespace nes::vm
