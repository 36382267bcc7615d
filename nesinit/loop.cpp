#include "loop.hpp"

#include <poll.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <optional>

#include "mounts.hpp"
#include "protocol/codec.hpp"
#include "protocol/line_reader.hpp"
#include "session.hpp"
#include "shutdown.hpp"
#include "transport.hpp"
#include "workload.hpp"

namespace nes::init {

std::uint64_t monotonic_ms() {
  timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000u + static_cast<std::uint64_t>(ts.tv_nsec) / 1000000u;
}

namespace {

/// Bytes queued for the host but not yet written; beyond this the host is not reading and the
/// channel is treated as lost (every message is small; a healthy host drains it at once).
constexpr std::size_t kOutCap = 1u << 20;
/// How often a virtio port with no host connected is looked at again: ms.
constexpr std::uint64_t kPortRetryMs = 100;

template <class... F>
struct Overload : F... { using F::operator()...; };
template <class... F>
Overload(F...) -> Overload<F...>;

class Pid1 {
 public:
  Pid1(Mode mode, const Config& cfg, const Log& log, int sfd, Reaper& reaper)
      : mode_(mode), cfg_(cfg), log_(log), sfd_(sfd), reaper_(reaper),
        session_(SessionOptions{cfg.grace_ms, cfg.ack_timeout_ms, cfg.boot_timeout_ms, cfg.halt}) {}

  [[noreturn]] void run() {
    dial();
    for (;;) {
      drain();
      if (session_.waiting_for_children()) {
        reap();
        if (!pending_.empty()) continue;
      }
      poll_once();
    }
  }

 private:
  // ---- dialling ------------------------------------------------------------------------------
  void dial() {
    const Channel ch = *cfg_.channel;
    int stop_sig = 0;
    auto wait = [&](std::uint32_t ms, int fd) -> bool {
      // The backoff (and a connect in progress, `fd`) waits on the signalfd: a shutdown signal
      // ends the dialling at once, SIGCHLD is reaped (a module helper may exit), anything else
      // waits for the loop.
      const std::uint64_t until = monotonic_ms() + ms;
      for (;;) {
        std::uint64_t now = monotonic_ms();
        if (now >= until) return true;
        pollfd p[2] = {{sfd_, POLLIN, 0}, {fd, POLLOUT, 0}};
        int r = ::poll(p, fd >= 0 ? 2 : 1, static_cast<int>(until - now));
        if (r < 0 && errno != EINTR) {
          poll_backoff();
          continue;
        }
        if (r <= 0) continue;
        if (fd >= 0 && p[1].revents) return true;
        if (!p[0].revents) continue;
        for (int sig : read_signals()) {
          if (sig == SIGCHLD) reaper_.reap();
          else if (sig == SIGTERM || sig == SIGINT || sig == SIGPWR) stop_sig = sig;
          else deferred_signals_.push_back(sig);
        }
        if (stop_sig) return false;
      }
    };
    log_.info("dial", "{} (up to {} ms)", to_string(ch), cfg_.connect_timeout_ms);
    int fd = nes::init::dial(ch, mode_ == Mode::guest, cfg_.connect_timeout_ms, wait, monotonic_ms, log_);
    if (fd < 0) {
      std::string why = stop_sig ? fmt::format("dialling {} abandoned: signal {}", to_string(ch), stop_sig)
                                 : fmt::format("dialling {} failed: {}", to_string(ch), std::strerror(-fd));
      pending_.push_back(ev::ChannelFailed{why});
      return;
    }
    chan_ = fd;
    is_port_ = std::holds_alternative<VirtioPortAddr>(ch);
    pending_.push_back(ev::ChannelUp{});
    for (int sig : deferred_signals_) pending_.push_back(ev::Signal{sig});
    deferred_signals_.clear();
  }

  // ---- events and actions ----------------------------------------------------------------------
  /// The result of an action the loop performs synchronously (mount, spawn) goes to the *front*
  /// of the queue: the session sees `started` right after `spawn`, before any event that was
  /// already waiting (e.g. an EOF found while sending `mounted`).
  void drain() {
    while (!pending_.empty()) {
      Event e = std::move(pending_.front());
      pending_.pop_front();
      for (Action& a : session_.handle(e)) perform(a);
    }
  }

  void perform(Action& a) {
    std::visit(Overload{
                   [&](act::Send& s) { send(s.msg); },
                   [&](act::Mount&) { do_mounts(); },
                   [&](act::Spawn&) { do_spawn(); },
                   [&](act::SignalGroup& s) {
                     int e = signal_group(pgid_, s.signo);
                     log_.info("signal-group", "signal {} to group {}{}", s.signo, pgid_,
                               e ? fmt::format(": {}", std::strerror(e)) : std::string());
                   },
                   [&](act::SignalAll& s) {
                     int e = signal_all(s.signo);
                     log_.debug("signal-all", "signal {}{}", s.signo,
                                e ? fmt::format(": {}", std::strerror(e)) : std::string());
                   },
                   [&](act::ArmTimer& t) {
                     deadline_[static_cast<int>(t.timer)] = monotonic_ms() + t.ms;
                     log_.debug("timer", "{} armed for {} ms", to_string(t.timer), t.ms);
                   },
                   [&](act::CancelTimer& t) { deadline_[static_cast<int>(t.timer)].reset(); },
                   [&](act::Note& n) { log_.line(n.severity, n.phase, n.text); },
                   [&](act::PowerOff& p) { power_off(p.halt); },
               },
               a);
  }

  void send(const proto::GuestMessage& m) {
    if (chan_ < 0) return;
    std::string line = proto::encode_line(m);
    if (log_.enabled(Severity::debug))
      log_.debug("send", "{}", std::string_view(line).substr(0, line.size() - 1));
    else
      log_.info("send", "{}", proto::type_name(m));
    if (out_.size() + line.size() > kOutCap) {
      log_.error("channel", "host not reading ({} bytes queued); treating the channel as lost", out_.size());
      lose_channel();
      return;
    }
    out_ += line;
    flush();
  }

  /// Write what the socket takes now. Returns false if the channel broke.
  bool flush() {
    while (chan_ >= 0 && !out_.empty()) {
      ssize_t n = ::write(chan_, out_.data(), out_.size());
      if (n > 0) {
        out_.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return true;
      log_.warn("channel", "write: {}", n < 0 ? std::strerror(errno) : "wrote nothing");
      lose_channel();
      return false;
    }
    return true;
  }

  void lose_channel() {
    if (chan_ < 0) return;
    ::close(chan_);
    chan_ = -1;
    out_.clear();
    pending_.push_back(ev::Eof{});
  }

  void do_mounts() {
    const proto::Boot& b = *session_.boot();
    log_.info("mount", "{} share(s)", b.mounts.size());
    if (auto f = shares_.mount_all(b.mounts, log_)) {
      pending_.push_front(ev::MountFailed{*f});
      return;
    }
    log_.info("mounted", "all shares mounted");
    pending_.push_front(ev::MountsDone{});
  }

  void do_spawn() {
    const proto::Boot& b = *session_.boot();
    if (b.hostname) {
      // A sandbox in the machine's own UTS namespace must not rename the machine.
      auto uts = ns_inode("uts");
      if (mode_ == Mode::sandbox && (!uts || *uts == kInitialUtsNsInode)) {
        log_.warn("hostname", "'{}' not set: this sandbox shares the machine's UTS namespace", *b.hostname);
      } else if (::sethostname(b.hostname->data(), b.hostname->size()) != 0) {
        int e = errno;
        pending_.push_front(ev::StartFailed{proto::StartFailed{
            fmt::format("sethostname {}: {}", *b.hostname, std::strerror(e)), e, proto::StartFailClass::other}});
        return;
      } else {
        log_.info("hostname", "{}", *b.hostname);
      }
    }
    log_.info("spawn", "{}", b.exec.argv.empty() ? std::string() : b.exec.argv[0]);
    auto r = spawn(b.exec, b.geometry, mode_ == Mode::guest ? Stdio::console : Stdio::inherit, reaper_);
    if (auto* pid = std::get_if<pid_t>(&r)) {
      pgid_ = *pid;
      pending_.push_front(ev::Started{*pid});
    } else {
      pending_.push_front(ev::StartFailed{std::get<proto::StartFailed>(r)});
    }
  }

  [[noreturn]] void power_off(proto::Halt halt) {
    // Give the last lines (the outcome) a bounded chance to leave before the channel closes.
    const std::uint64_t until = monotonic_ms() + 1000;
    while (chan_ >= 0 && !out_.empty()) {
      std::uint64_t now = monotonic_ms();
      if (now >= until) break;
      pollfd p{chan_, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(until - now)) <= 0) continue;
      if (!(p.revents & POLLOUT)) break;  // hung up (a virtio port without its host): give up
      if (!flush()) break;
    }
    if (chan_ >= 0) ::close(chan_);
    chan_ = -1;
    log_.info("halt", "orphans reaped: {}", reaper_.orphans_total());
    final_act(mode_, shares_, halt, reaper_, log_);
  }

  /// poll(2) itself failed (ENOMEM, or EINVAL from a bad fd set): nothing the loop can fix at
  /// once. Wait, doubling from 10 ms to 1 s, so a persistent failure is not a busy loop, and log
  /// the first few only; the deadlines still fire after each wait.
  void poll_backoff() {
    const int e = errno;
    ++poll_errors_;
    if (poll_errors_ <= 3) log_.error("loop", "poll: {} (retrying with backoff)", std::strerror(e));
    const std::uint64_t ms = std::min<std::uint64_t>(10ull << std::min<unsigned>(poll_errors_ - 1, 7), 1000);
    timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000L};
    while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }

  // ---- I/O -------------------------------------------------------------------------------------
  std::vector<int> read_signals() {
    std::vector<int> sigs;
    signalfd_siginfo si[16];
    for (;;) {
      ssize_t n = ::read(sfd_, si, sizeof si);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      for (std::size_t i = 0; i < static_cast<std::size_t>(n) / sizeof si[0]; ++i)
        sigs.push_back(static_cast<int>(si[i].ssi_signo));
    }
    return sigs;
  }

  void reap() {
    Reaped r = reaper_.reap();
    if (r.orphans) log_.debug("reap", "{} orphan(s) reaped", r.orphans);
    if (r.workload) pending_.push_back(ev::Exited{*r.workload});
    if (r.no_children && session_.waiting_for_children()) pending_.push_back(ev::NoChildren{});
  }

  void poll_once() {
    const std::uint64_t now = monotonic_ms();
    int timeout = -1;
    for (auto& d : deadline_)
      if (d) {
        std::uint64_t left = *d > now ? *d - now : 0;
        if (timeout < 0 || left < static_cast<std::uint64_t>(timeout))
          timeout = static_cast<int>(std::min<std::uint64_t>(left, 1u << 30));
      }
    // A virtio port whose host side is not connected polls as POLLHUP without end: leave it out
    // of the poll set until its retry time, which then bounds the timeout like a timer.
    bool watch_chan = chan_ >= 0;
    if (watch_chan && port_retry_at_) {
      if (*port_retry_at_ > now) {
        watch_chan = false;
        std::uint64_t left = *port_retry_at_ - now;
        if (timeout < 0 || left < static_cast<std::uint64_t>(timeout)) timeout = static_cast<int>(left);
      } else {
        port_retry_at_.reset();
      }
    }
    pollfd p[2] = {{sfd_, POLLIN, 0}, {chan_, static_cast<short>(POLLIN | (out_.empty() ? 0 : POLLOUT)), 0}};
    int r = ::poll(p, watch_chan ? 2 : 1, timeout);
    if (!watch_chan) p[1].revents = 0;
    if (r < 0 && errno != EINTR) poll_backoff();
    else if (r >= 0) poll_errors_ = 0;

    const std::uint64_t after = monotonic_ms();
    for (int i = 0; i < kTimerCount; ++i)
      if (deadline_[i] && *deadline_[i] <= after) {
        deadline_[i].reset();
        pending_.push_back(ev::TimerFired{static_cast<Timer>(i)});
      }
    if (r <= 0) return;
    if (p[0].revents & POLLIN) {
      for (int sig : read_signals()) {
        // SIGCHLD: one reaper, one waiter; merged SIGCHLDs are covered by reaping until none.
        if (sig == SIGCHLD) reap();
        else pending_.push_back(ev::Signal{sig});
      }
    }
    if (chan_ >= 0 && (p[1].revents & POLLOUT)) flush();
    if (chan_ >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) read_channel();
  }

  void read_channel() {
    char buf[65536];
    ssize_t n = ::read(chan_, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n == 0 && is_port_ && !host_seen_) {
      // virtio-serial has no connection events: read() == 0 means "no host connected right now".
      // Before the host has sent anything that is the window between the port appearing and
      // the VMM's port-open: not an EOF. Look again in kPortRetryMs (the boot deadline bounds
      // the wait). Once the host has spoken, a hang-up is its EOF, as on a socket.
      if (!port_down_) log_.info("channel", "virtio port: host side not connected yet; waiting");
      port_down_ = true;
      port_retry_at_ = monotonic_ms() + kPortRetryMs;
      return;
    }
    if (n > 0) {
      if (port_down_) log_.info("channel", "virtio port: host side connected");
      port_down_ = false;
      host_seen_ = true;
    }
    if (n <= 0) {
      if (n < 0) log_.warn("channel", "read: {}", std::strerror(errno));
      if (reader_.partial()) log_.warn("channel", "EOF in the middle of a line; the partial line is dropped");
      lose_channel();
      return;
    }
    reader_.feed(std::string_view(buf, static_cast<std::size_t>(n)));
    while (auto line = reader_.next()) {
      if (log_.enabled(Severity::debug) && line->kind == proto::Line::Kind::text)
        log_.debug("recv", "{}", line->text);
      pending_.push_back(ev::Line{std::move(*line)});
    }
  }

  Mode mode_;
  const Config& cfg_;
  const Log& log_;
  int sfd_;
  Reaper& reaper_;
  Session session_;
  Shares shares_;
  int chan_ = -1;
  pid_t pgid_ = 0;
  std::string out_;
  proto::LineReader reader_;
  std::deque<Event> pending_;
  std::vector<int> deferred_signals_;
  std::optional<std::uint64_t> deadline_[kTimerCount];
  bool is_port_ = false;    // the channel is a virtio-serial port (no EOF semantics)
  bool port_down_ = false;  // its host side was seen disconnected
  bool host_seen_ = false;  // the host has sent at least one byte
  std::optional<std::uint64_t> port_retry_at_;
  unsigned poll_errors_ = 0;  // consecutive poll(2) failures
};

}  // namespace

void run_pid1(Mode mode, const Config& cfg, const Log& log, int sfd, Reaper& reaper) {
  Pid1 p(mode, cfg, log, sfd, reaper);
  p.run();
}

}  // namespace nes::init
