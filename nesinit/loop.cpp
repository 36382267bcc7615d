#include "loop.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <optional>

#include "mounts.hpp"
#include "network.hpp"
#include "procs.hpp"
#include "rootfs.hpp"
#include "protocol/codec.hpp"
#include "protocol/line_reader.hpp"
#include "overload.hpp"
#include "session.hpp"
#include "shutdown.hpp"
#include "stdio.hpp"
#include "stdio_mux.hpp"
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

/// Whether this PID 1 may set the hostname: a guest always; a sandbox only in a UTS namespace
/// of its own (in the machine's it would rename the machine).
bool may_set_hostname(Mode mode) {
  if (mode == Mode::guest) return true;
  auto uts = ns_inode("uts");
  return uts && *uts != kInitialUtsNsInode;
}

class Pid1 {
 public:
  Pid1(Mode mode, const Config& cfg, const Log& log, int sfd, Reaper& reaper)
      : mode_(mode), cfg_(cfg), log_(log), sfd_(sfd), reaper_(reaper),
        session_(SessionOptions{cfg.grace_ms, cfg.ack_timeout_ms, cfg.boot_timeout_ms, cfg.halt,
                                cfg.connect_timeout_ms, mode == Mode::guest, may_set_hostname(mode),
                                cfg.data_channel.has_value(), mode == Mode::guest,
                                mode == Mode::guest || cfg.own_netns}) {}

  [[noreturn]] void run() {
    pending_.push_back(ev::Start{to_string(*cfg_.channel)});
    for (;;) {
      drain();
      if (flushing_) {
        flush_once();
        continue;
      }
      if (session_.waiting_for_children()) {
        reap();
        if (!pending_.empty()) continue;
      }
      poll_once();
    }
  }

 private:
  /// The fds of a process `exec` started with `exec.stdio`, until the session closes it; its
  /// core is the mux's (StdioMux::core(proc)).
  struct ExecFds {
    std::uint16_t proc = 0;
    StdioFds fds;
  };

  // ---- dialling ------------------------------------------------------------------------------
  /// One attempt at `ch` that holds the loop at most `attempt_ms` and never past the next armed
  /// timer (a connect in progress: vsock); a pending signal ends it at once (-ECANCELED; the loop
  /// reads the signal next: ECANCELED).
  base::Result<base::Fd> attempt(const Channel& ch, std::uint32_t attempt_ms) {
    auto wait = [&](std::uint32_t ms, int fd) -> bool {
      pollfd p[2] = {{sfd_, POLLIN, 0}, {fd, POLLOUT, 0}};
      int r = ::poll(p, fd >= 0 ? 2 : 1, static_cast<int>(ms));
      return !(r > 0 && (p[0].revents & POLLIN));
    };
    std::uint64_t until = monotonic_ms() + attempt_ms;
    for (auto& t : deadline_)
      if (t) until = std::min(until, *t);
    return dial_once(ch, mode_ == Mode::guest, until, wait, monotonic_ms);
  }

  /// One attempt at the lifecycle channel (act::Dial: the first dial or a redial). With
  /// `need_peer` a virtio port counts only with its host side connected (no POLLHUP).
  void do_dial(const act::Dial& d) {
    const Channel ch = *cfg_.channel;
    const bool port = std::holds_alternative<VirtioPortAddr>(ch);
    auto fd = attempt(ch, d.attempt_ms);
    if (fd && port && d.need_peer) {
      pollfd p{fd->get(), POLLIN, 0};
      if (::poll(&p, 1, 0) > 0 && (p.revents & POLLHUP)) fd = base::Error{std::strerror(ENOTCONN), ENOTCONN};
    }
    if (!fd) {
      pending_.push_front(ev::DialFailed{fd.error().message, retryable(fd.error().err)});
      return;
    }
    chan_ = std::move(*fd);
    is_port_ = port;
    out_.clear();
    reader_ = proto::LineReader();
    host_seen_ = port && d.need_peer;  // a port just seen connected: its next hang-up is an EOF
    port_down_ = false;
    port_retry_at_.reset();
    log_.info("channel", "{} {}", d.need_peer ? "redialled" : "dialled", to_string(ch));
    pending_.push_front(ev::ChannelUp{});
  }

  /// One attempt at the data channel (act::DialData). The session asks for one only with an
  /// address configured (SessionOptions::has_data_channel).
  void do_dial_data(const act::DialData& d) {
    if (!cfg_.data_channel) return;
    const Channel ch = *cfg_.data_channel;
    auto fd = attempt(ch, d.attempt_ms);
    if (!fd) {
      const base::Error& e = fd.error();
      pending_.push_front(ev::DataFailed{fmt::format("data channel {}: {}", to_string(ch), e.message), e.err,
                                         retryable(e.err)});
      return;
    }
    data_ = std::move(*fd);
    data_is_port_ = std::holds_alternative<VirtioPortAddr>(ch);
    mux_.emplace(d.stdio);
    log_.info("data", "connected to {}", to_string(ch));
    pending_.push_front(ev::DataUp{});
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
                   [&](act::DialData& d) { do_dial_data(d); },
                   [&](act::Dial& d) { do_dial(d); },
                   [&](act::Mount& m) { do_mounts(m); },
                   [&](act::Spawn& s) { do_spawn(s); },
                   [&](act::SignalGroup& s) {
                     auto r = signal_group(s.pgid, s.signo);
                     log_.info("signal-group", "signal {} to group {}{}", s.signo, s.pgid,
                               r ? std::string() : ": " + r.error().message);
                   },
                   [&](act::SignalAll& s) {
                     auto r = signal_all(s.signo);
                     log_.debug("signal-all", "signal {}{}", s.signo, r ? std::string() : ": " + r.error().message);
                   },
                   [&](act::ArmTimer& t) {
                     deadline_[static_cast<int>(t.timer)] = monotonic_ms() + t.ms;
                     log_.debug("timer", "{} armed for {} ms", to_string(t.timer), t.ms);
                   },
                   [&](act::CancelTimer& t) { deadline_[static_cast<int>(t.timer)].reset(); },
                   [&](act::Note& n) { log_.line(n.severity, n.phase, n.text); },
                   [&](act::Flush&) {
                     flushing_ = true;
                     report_flushing(0);
                   },
                   [&](act::PowerOff& p) { power_off(p.halt); },
                   [&](act::ListProcesses&) { pending_.push_front(ev::ProcessList{read_processes()}); },
                   [&](act::SpawnExec& x) { do_spawn_exec(x); },
                   [&](act::CloseExec& x) { close_exec(x.proc); },
                   [&](act::CheckHeld& c) { pending_.push_front(ev::Held{c.proc, held_bytes(c.proc)}); },
               },
               a);
  }

  void send(const proto::GuestMessage& m) {
    if (!chan_) return;
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
    while (chan_ && !out_.empty()) {
      ssize_t n = ::write(chan_.get(), out_.data(), out_.size());
      if (n > 0) {
        out_.erase(0, static_cast<std::size_t>(n));
        bytes_written_ += static_cast<std::uint64_t>(n);
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
    if (!chan_) return;
    chan_.reset();
    out_.clear();
    pending_.push_back(ev::Eof{});
  }

  void do_mounts(const act::Mount& b) {
    // A share as `/` comes first: every other share's `at` is inside it.
    if (b.root) {
      if (auto r = switch_root(*b.root, log_); !r) {
        pending_.push_front(ev::MountFailed{std::move(r).error()});
        return;
      }
    }
    log_.info("mount", "{} share(s)", b.mounts.size());
    if (auto r = shares_.mount_all(b.mounts, log_); !r) {
      pending_.push_front(ev::MountFailed{std::move(r).error()});
      return;
    }
    log_.info("mounted", "all shares mounted");
    if (b.network) {
      // Its files are bound over /etc: in a sandbox, never in the namespace it was started in.
      if (auto iso = shares_.isolate(); !iso) {
        pending_.push_front(ev::NetworkFailed{proto::NetworkFailed{
            "files", "namespace", fmt::format("own mount namespace: {}", iso.error().message), iso.error().err}});
        return;
      }
      if (auto r = configure_network(*b.network, b.hostname, log_); !r) {
        pending_.push_front(ev::NetworkFailed{std::move(r).error()});
        return;
      }
    }
    pending_.push_front(ev::MountsDone{});
  }

  void do_spawn(const act::Spawn& b) {
    if (b.hostname) {
      if (::sethostname(b.hostname->data(), b.hostname->size()) != 0) {
        int e = errno;
        pending_.push_front(ev::StartFailed{proto::StartFailed{
            fmt::format("sethostname {}: {}", *b.hostname, std::strerror(e)), e, proto::StartFailClass::other}});
        return;
      }
      log_.info("hostname", "{}", *b.hostname);
    }
    log_.info("spawn", "{}", b.exec.argv.empty() ? std::string() : b.exec.argv[0]);
    ChildFds cfds;
    if (b.stdio) {
      auto made = make_stdio(*b.stdio);
      if (!made) {
        pending_.push_front(ev::StartFailed{
            proto::StartFailed{made.error().message, made.error().err, proto::StartFailClass::other}});
        return;
      }
      fds_ = std::move(made).value();
      if (!fds_.pipes_hold_buffer && mux_) mux_->workload().direct_unsupported();  // the init buffers instead
      if (fds_.terminal) {
        cfds = ChildFds{{fds_.child_in.get(), fds_.child_in.get(), fds_.child_in.get()}, true};
      } else {
        cfds = ChildFds{{fds_.child_in.get(), fds_.child_out.get(), fds_.child_err.get()}, false};
      }
    }
    auto r = spawn(b.exec, b.geometry, b.console ? Stdio::console : Stdio::inherit, reaper_,
                   b.stdio ? &cfds : nullptr);
    // The workload has its copies: the init keeps only its own ends, so EOF means the workload
    // (and whatever inherited its fds) closed them.
    fds_.child_in.reset();
    fds_.child_out.reset();
    fds_.child_err.reset();
    if (r) pending_.push_front(ev::Started{*r});
    else pending_.push_front(ev::StartFailed{std::move(r).error()});
  }

  /// act::SpawnExec: its fds (pipes, a PTY, or /dev/null for all three), then spawn. Its frames
  /// become legal on the data channel before it runs, so the host's first stdin is not refused.
  void do_spawn_exec(const act::SpawnExec& x) {
    auto failed = [&](base::Error e) {
      pending_.push_front(ev::ExecFailed{x.proc, proto::StartFailed{std::move(e.message), e.err, proto::StartFailClass::other}});
    };
    ExecFds io;
    io.proc = x.proc;
    ChildFds cfds;
    if (x.stdio) {
      auto made = make_stdio(*x.stdio);
      if (!made) return failed(std::move(made).error());
      io.fds = std::move(made).value();
      if (!mux_ || !mux_->open(x.proc, *x.stdio))
        return failed(base::Error{"exec: the data channel cannot take another process", EAGAIN});
      const int in = io.fds.child_in.get();
      cfds = io.fds.terminal ? ChildFds{{in, in, in}, true}
                             : ChildFds{{in, io.fds.child_out.get(), io.fds.child_err.get()}, false};
    } else {
      io.fds.child_in.reset(::open("/dev/null", O_RDWR | O_CLOEXEC));
      if (!io.fds.child_in) return failed(base::errno_error(errno, "exec: open /dev/null"));
      const int n = io.fds.child_in.get();
      cfds = ChildFds{{n, n, n}, false};
    }
    log_.info("exec", "process {}: {}", x.proc, x.exec.argv.empty() ? std::string() : x.exec.argv[0]);
    auto r = spawn(x.exec, x.geometry, Stdio::inherit, reaper_, &cfds, Role::exec);
    io.fds.child_in.reset();
    io.fds.child_out.reset();
    io.fds.child_err.reset();
    if (!r) {
      if (mux_) mux_->close(x.proc);
      pending_.push_front(ev::ExecFailed{x.proc, std::move(r).error()});
      return;
    }
    const bool no_output = !x.stdio;
    if (x.stdio) execs_.push_back(std::move(io));
    // Started first, then (with no streams) its outputs are done at once.
    if (no_output) pending_.push_front(ev::ExecOutputsDone{x.proc});
    pending_.push_front(ev::ExecStarted{x.proc, *r});
  }

  /// Bytes unread in `fd` (a pipe or the PTY master): FIONREAD, 0 when it cannot tell.
  static std::uint64_t unread(const base::Fd& fd) {
    int n = 0;
    return fd && ::ioctl(fd.get(), FIONREAD, &n) == 0 && n > 0 ? static_cast<std::uint64_t>(n) : 0;
  }

  /// Stream `s`'s account (ev::OutputAccount): framed, and given up (thrown away, unread in its
  /// pipe). Bytes read and not framed yet count as sent when `at_eof` (the stream is at EOF on an
  /// open channel: they are framed next, nothing more comes), else as given up. Either way
  /// sent + unsent is every byte of `s` the init has seen, which is what the host's count needs.
  static ev::OutputAccount account(const StdioCore& c, const StdioFds& f, proto::Stream s, bool at_eof = false) {
    const base::Fd& fd = s == proto::Stream::err ? f.err : f.out;
    const std::uint64_t held = c.held(s);
    return {c.framed(s) + (at_eof ? held : 0), c.discarded(s) + (at_eof ? 0 : held) + unread(fd),
            c.eof_framed(s)};
  }
  /// stderr's account; none with a terminal (one stream: the PTY's).
  static std::optional<ev::OutputAccount> err_account(const StdioCore& c, const StdioFds& f, bool at_eof = false) {
    if (f.terminal) return std::nullopt;
    return account(c, f, proto::Stream::err, at_eof);
  }

  /// act::CheckHeld: what process `proc` still holds of its output (its core's buffers, a frame
  /// begun, its pipes' unread bytes).
  std::uint64_t held_bytes(std::uint16_t proc) {
    if (!mux_) return 0;
    const StdioFds* f = &fds_;
    if (proc != 0) {
      auto x = std::find_if(execs_.begin(), execs_.end(), [&](const ExecFds& e) { return e.proc == proc; });
      if (x == execs_.end()) return 0;
      f = &x->fds;
    }
    const StdioCore* c = mux_->core(proc);
    return (c ? c->buffered() : 0) + unread(f->out) + unread(f->err);
  }

  /// act::CloseExec: its pipes close (late output is lost with them); the mux skips its late
  /// frames from the host and drops its core once its turn on the channel is over. Its streams'
  /// accounts go to the session first (ev::ExecClosed).
  void close_exec(std::uint16_t proc) {
    auto x = std::find_if(execs_.begin(), execs_.end(), [&](const ExecFds& e) { return e.proc == proc; });
    if (const StdioCore* c = mux_ ? mux_->core(proc) : nullptr; c && x != execs_.end())
      pending_.push_back(ev::ExecClosed{proc, account(*c, x->fds, proto::Stream::out), err_account(*c, x->fds),
                                        c->outputs_done()});
    if (mux_) mux_->close(proc);
    std::erase_if(execs_, [&](const ExecFds& x) { return x.proc == proc; });
  }

  /// One round of the final flush (act::Flush): write what is queued on both channels, read the
  /// workload's output on, watch the data channel for the host's close; then report what is left
  /// and only then look at the deadlines (a report of progress re-arms the idle timer first).
  void flush_once() {
    const std::uint64_t before = bytes_written_;
    const int timeout = deadline_timeout(monotonic_ms());
    pollfd p[1 + kStdioFds];
    // The lifecycle channel is watched for the host's hang-up too: a held flush waits only for
    // as long as the host is there.
    p[0] = {chan_ ? chan_.get() : -1, static_cast<short>(POLLRDHUP | (out_.empty() ? 0 : POLLOUT)), 0};
    stdio_poll_set(p + 1);
    // Watched for the host's close (POLLHUP) even when there is nothing to read or write.
    if (data_ && p[1 + kData].fd < 0 && !data_retry_at_) p[1 + kData] = {data_.get(), 0, 0};
    if (::poll(p, 1 + kStdioFds, timeout) > 0) {
      if (data_ && (p[1 + kData].revents & (POLLHUP | POLLERR))) data_hup_ = true;
      if (p[0].revents & (POLLHUP | POLLERR | POLLRDHUP)) {
        // hung up (the host closed it; a virtio port without its host): give up on it
        chan_.reset();
      } else if (p[0].revents & POLLOUT) {
        flush();
      }
      stdio_handle(p + 1);
    }
    report_flushing(bytes_written_ - before);
    drain();
    fire_due_timers();
  }

  /// ev::Flushing: what the channels still owe, as the I/O left it.
  void report_flushing(std::uint64_t written) {
    ev::Flushing f;
    f.written = written;
    f.control_queued = chan_ && !out_.empty();
    f.data_open = data_ && mux_;
    f.data_unsent = mux_ && mux_->tx_pending();
    f.outputs_done = mux_ && mux_->workload().outputs_done();
    f.receipt = data_rx_eof_ || data_hup_;
    f.output_bytes = mux_ ? mux_->workload().buffered() : 0;
    f.channel_open = static_cast<bool>(chan_);
    if (mux_) {
      f.out = account(mux_->workload(), fds_, proto::Stream::out);
      f.err = err_account(mux_->workload(), fds_);
    }
    pending_.push_back(f);
  }

  /// poll(2)'s timeout until the next armed deadline, ms (-1: none armed).
  int deadline_timeout(std::uint64_t now) const {
    int timeout = -1;
    for (auto& d : deadline_)
      if (d) {
        std::uint64_t left = *d > now ? *d - now : 0;
        if (timeout < 0 || left < static_cast<std::uint64_t>(timeout))
          timeout = static_cast<int>(std::min<std::uint64_t>(left, 1u << 30));
      }
    return timeout;
  }

  /// Every deadline passed becomes ev::TimerFired.
  void fire_due_timers() {
    const std::uint64_t now = monotonic_ms();
    for (int i = 0; i < kTimerCount; ++i)
      if (deadline_[i] && *deadline_[i] <= now) {
        deadline_[i].reset();
        pending_.push_back(ev::TimerFired{static_cast<Timer>(i)});
      }
  }

  [[noreturn]] void power_off(proto::Halt halt) {
    close_data();
    chan_.reset();
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
  /// Signals taken from the signalfd by one read(), in arrival order.
  struct Signals {
    int sig[16];
    std::size_t n = 0;
    const int* begin() const { return sig; }
    const int* end() const { return sig + n; }
  };
  /// One read() per wakeup and no allocation (a reaping storm wakes the loop once per batch of
  /// SIGCHLDs): signalfd merges a pending standard signal, so more than 16 at once is rare, and
  /// any left over keep the fd readable for the next poll.
  Signals read_signals() {
    Signals s;
    signalfd_siginfo si[16];
    ssize_t n;
    do n = ::read(sfd_, si, sizeof si);
    while (n < 0 && errno == EINTR);
    for (ssize_t i = 0; n > 0 && i < n / static_cast<ssize_t>(sizeof si[0]); ++i)
      s.sig[s.n++] = static_cast<int>(si[i].ssi_signo);
    return s;
  }

  void reap() {
    Reaped r = reaper_.reap();
    if (r.orphans) log_.debug("reap", "{} orphan(s) reaped", r.orphans);
    if (r.workload) pending_.push_back(ev::Exited{*r.workload});
    for (const ExecReaped& x : r.execs) pending_.push_back(ev::ExecReaped{x.pid, x.status});
    if (r.no_children && session_.waiting_for_children()) pending_.push_back(ev::NoChildren{});
  }

  void poll_once() {
    const std::uint64_t now = monotonic_ms();
    int timeout = deadline_timeout(now);
    // A virtio port whose host side is not connected polls as POLLHUP without end: leave it out
    // of the poll set until its retry time, which then bounds the timeout like a timer.
    bool watch_chan = static_cast<bool>(chan_);
    if (watch_chan && port_retry_at_) {
      if (*port_retry_at_ > now) {
        watch_chan = false;
        std::uint64_t left = *port_retry_at_ - now;
        if (timeout < 0 || left < static_cast<std::uint64_t>(timeout)) timeout = static_cast<int>(left);
      } else {
        port_retry_at_.reset();
      }
    }
    if (data_retry_at_) {
      if (*data_retry_at_ > now) {
        std::uint64_t left = *data_retry_at_ - now;
        if (timeout < 0 || left < static_cast<std::uint64_t>(timeout)) timeout = static_cast<int>(left);
      }
    }
    pollfd p[2 + kStdioFds + kExecFds * proto::kExecMax] = {
        {sfd_, POLLIN, 0}, {watch_chan ? chan_.get() : -1, static_cast<short>(POLLIN | (out_.empty() ? 0 : POLLOUT)), 0}};
    stdio_poll_set(p + 2);
    const std::size_t nexec = std::min(execs_.size(), proto::kExecMax);
    for (std::size_t i = 0; i < nexec; ++i) exec_poll_set(execs_[i], p + 2 + kStdioFds + kExecFds * i);
    int r = ::poll(p, static_cast<nfds_t>(2 + kStdioFds + kExecFds * nexec), timeout);
    if (r < 0 && errno != EINTR) poll_backoff();
    else if (r >= 0) poll_errors_ = 0;

    fire_due_timers();
    if (r <= 0) return;
    if (p[0].revents & POLLIN) {
      for (int sig : read_signals()) {
        // SIGCHLD: one reaper, one waiter; merged SIGCHLDs are covered by reaping until none.
        if (sig == SIGCHLD) reap();
        else pending_.push_back(ev::Signal{sig});
      }
    }
    if (chan_ && (p[1].revents & POLLOUT)) flush();
    if (chan_ && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) read_channel();
    stdio_handle(p + 2);
    for (std::size_t i = 0; i < nexec; ++i) exec_handle(execs_[i], p + 2 + kStdioFds + kExecFds * i);
    if (data_ && mux_ && mux_->tx_pending()) write_data();
  }

  // ---- the workload's stdio (boot.stdio): the data channel, the pipes or the PTY ----------------
  // Indices into the stdio part of a poll set.
  enum { kData = 0, kOut = 1, kErr = 2, kIn = 3, kStdioFds = 4 };
  // ... and into an exec'd process's part (stdout or the PTY, stderr, stdin).
  enum { kExecOut = 0, kExecErr = 1, kExecIn = 2, kExecFds = 3 };
  /// Direct frames moved per readable pipe before the loop looks at its other fds again (1 MiB).
  static constexpr int kDirectBurst = 16;

  /// Fills the stdio part of a poll set: each fd only with what the core wants now (fd -1 when
  /// nothing, so a hung-up pipe the core is not reading cannot make poll spin).
  void stdio_poll_set(pollfd* p) {
    for (int i = 0; i < kStdioFds; ++i) p[i] = {-1, 0, 0};
    if (!mux_) return;
    StdioCore& c = mux_->workload();
    const std::uint64_t now = monotonic_ms();
    if (data_retry_at_ && *data_retry_at_ <= now) data_retry_at_.reset();
    if (data_ && !data_retry_at_) {
      short ev = 0;
      if (!data_rx_eof_ && mux_->rx_room() > 0) ev |= POLLIN;
      if (mux_->tx_pending()) ev |= POLLOUT;
      if (ev) p[kData] = {data_.get(), ev, 0};
    }
    // Direct mode: a pipe is read only when its bytes can go to the channel at once.
    auto wanted = [&](proto::Stream s) { return c.direct_mode() ? c.direct_room(s) > 0 : c.out_room(s) > 0; };
    if (fds_.out && wanted(proto::Stream::out)) p[kOut] = {fds_.out.get(), POLLIN, 0};
    if (fds_.err && wanted(proto::Stream::err)) p[kErr] = {fds_.err.get(), POLLIN, 0};
    if (!c.in_pending().empty()) {
      // With a terminal stdin is the PTY master too: one fd, polled for both directions.
      if (fds_.terminal && fds_.out) {
        if (p[kOut].fd >= 0) p[kOut].events |= POLLOUT;
        else p[kOut] = {fds_.out.get(), POLLOUT, 0};
      } else if (fds_.in) {
        p[kIn] = {fds_.in.get(), POLLOUT, 0};
      }
    }
  }

  /// Performs the I/O poll found ready, then what the core asks for (resize, closing stdin, a
  /// framing error, both outputs at EOF).
  void stdio_handle(const pollfd* p) {
    if (!mux_) return;
    StdioCore& c = mux_->workload();
    // Both ready: the core says which goes first (they take turns). In direct mode the bytes
    // waiting in either pipe go out before an EOF found in this round is framed, so output
    // written before the workload ended is not overtaken by the other stream's eof.
    const bool err_first = c.first_stream() == proto::Stream::err;
    const int order[2] = {err_first ? kErr : kOut, err_first ? kOut : kErr};
    auto stream_of = [](int i) { return i == kErr ? proto::Stream::err : proto::Stream::out; };
    auto ready = [&](int i) { return (p[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0; };
    if (c.direct_mode()) {
      for (int i : order)
        if (ready(i)) move_output(stream_of(i), i == kErr ? fds_.err : fds_.out);
      for (int i : order)
        if (ready(i)) read_eof(stream_of(i), i == kErr ? fds_.err : fds_.out);
    } else {
      for (int i : order)
        if (ready(i)) read_once(c, fds_.terminal, stream_of(i), i == kErr ? fds_.err : fds_.out);
    }
    if ((p[kIn].revents | (fds_.terminal ? p[kOut].revents : 0)) & (POLLOUT | POLLERR | POLLHUP))
      write_stdin(c, fds_);
    if (p[kData].revents & POLLOUT) write_data();
    if (p[kData].revents & (POLLIN | POLLHUP | POLLERR)) read_data(p[kData].revents);
    if (data_ && c.tx_pending()) write_data();  // new output: try at once, it rarely blocks
    stdin_side(c, fds_);
    if (data_ && !c.rx_error().empty()) {
      log_.warn("data", "{}; closing the data channel", c.rx_error());
      pending_.push_back(ev::DataError{c.rx_error()});
      close_data();
    }
    if (mux_->take_outputs_done(0))
      pending_.push_back(ev::OutputsDone{account(c, fds_, proto::Stream::out, true), err_account(c, fds_, true)});
  }

  /// What the core asks of its stdin side now: a resize, bytes to write, the close after eof.
  void stdin_side(StdioCore& c, StdioFds& f) {
    if (auto ws = c.take_resize(); ws && f.terminal && f.out) {
      winsize w{};
      w.ws_row = ws->rows;
      w.ws_col = ws->cols;
      if (::ioctl(f.out.get(), TIOCSWINSZ, &w) != 0) log_.warn("data", "TIOCSWINSZ: {}", std::strerror(errno));
      else log_.debug("data", "resize {}x{}", ws->rows, ws->cols);
    }
    if (!c.in_pending().empty()) write_stdin(c, f);
    if (c.in_close_due()) {
      if (!f.terminal) f.in.reset();  // the process reads EOF
      c.in_closed();
    }
  }

  /// An exec'd process's part of the poll set (copying, as the workload's without splice).
  void exec_poll_set(ExecFds& x, pollfd* p) {
    for (int i = 0; i < kExecFds; ++i) p[i] = {-1, 0, 0};
    StdioCore* core = mux_ ? mux_->core(x.proc) : nullptr;
    if (!core) return;
    StdioCore& c = *core;
    if (x.fds.out && c.out_room(proto::Stream::out) > 0) p[kExecOut] = {x.fds.out.get(), POLLIN, 0};
    if (x.fds.err && c.out_room(proto::Stream::err) > 0) p[kExecErr] = {x.fds.err.get(), POLLIN, 0};
    // A close due wakes the loop too (an empty pipe is writable): a process started after the
    // host's EOF has nothing else to wake it, and its stdin must still end.
    if (!c.in_pending().empty() || c.in_close_due()) {
      if (x.fds.terminal && x.fds.out) p[kExecOut].fd = x.fds.out.get(), p[kExecOut].events |= POLLOUT;
      else if (x.fds.in) p[kExecIn] = {x.fds.in.get(), POLLOUT, 0};
    }
  }

  void exec_handle(ExecFds& x, const pollfd* p) {
    StdioCore* core = mux_ ? mux_->core(x.proc) : nullptr;
    if (!core) return;
    StdioCore& c = *core;
    const short ready = POLLIN | POLLHUP | POLLERR;
    if (p[kExecOut].revents & ready) read_once(c, x.fds.terminal, proto::Stream::out, x.fds.out);
    if (p[kExecErr].revents & ready) read_once(c, false, proto::Stream::err, x.fds.err);
    if ((p[kExecIn].revents | (x.fds.terminal ? p[kExecOut].revents : 0)) & (POLLOUT | POLLERR | POLLHUP))
      write_stdin(c, x.fds);
    stdin_side(c, x.fds);
    if (mux_->take_outputs_done(x.proc))
      pending_.push_back(ev::ExecOutputsDone{x.proc, true, account(c, x.fds, proto::Stream::out, true),
                                             err_account(c, x.fds, true)});
  }

  /// Direct mode: frames what waits in `s`'s pipe and moves it to the channel with splice(2),
  /// up to kDirectBurst frames while the channel takes them.
  void move_output(proto::Stream s, base::Fd& fd) {
    StdioCore& c = mux_->workload();
    for (int i = 0; i < kDirectBurst && fd && data_ && c.direct_room(s) > 0; ++i) {
      int avail = 0;
      if (::ioctl(fd.get(), FIONREAD, &avail) != 0 || avail <= 0) return;  // read_eof() looks
      if (!frame_pipe_ && !open_frame_pipe()) {
        c.direct_unsupported();
        return;
      }
      auto f = c.direct_begin(s, static_cast<std::size_t>(avail));
      if (!f) return;
      // The frame pipe is empty between frames: an 8-byte write to it cannot block.
      if (::write(frame_pipe_w_.get(), f->header, sizeof f->header) != static_cast<ssize_t>(sizeof f->header)) {
        log_.error("data", "frame pipe: {}; closing the data channel", std::strerror(errno));
        close_data();
        return;
      }
      frame_pipe_bytes_ = sizeof f->header;
      write_data();
    }
  }

  /// After move_output(): `s`'s pipe polled ready and is empty now: a read finds its EOF (or
  /// bytes that came just now, which take the copying path). Not while the channel is busy
  /// (the pipe is polled again once it is not).
  void read_eof(proto::Stream s, base::Fd& fd) {
    StdioCore& c = mux_->workload();
    if (!fd) return;
    if (c.direct_mode()) {
      int avail = 0;
      if (c.direct_room(s) == 0) return;
      if (::ioctl(fd.get(), FIONREAD, &avail) == 0 && avail > 0) return;  // more came: next round
    }
    read_once(c, fds_.terminal, s, fd);
  }

  /// The frame pipe: a pipe of the init's own that holds one direct frame (header, then the
  /// payload spliced from the workload's pipe), so the frame leaves in one splice of the whole
  /// pipe. Moving part of the workload's pipe straight to a virtio port is not safe: Linux's
  /// virtio_console then queues a buffer with empty entries for what was not moved, which QEMU
  /// refuses ("zero sized buffers are not allowed"), breaking every port of the device.
  bool open_frame_pipe() {
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
      log_.info("data", "frame pipe: {}; copying output instead", std::strerror(errno));
      return false;
    }
    frame_pipe_.reset(p[0]);
    frame_pipe_w_.reset(p[1]);
    // Room for a header and a frame's payload even in small pieces (a pipe holds buffers, not bytes).
    ::fcntl(p[1], F_SETPIPE_SZ, 256 * 1024);
    return true;
  }

  /// Advances the direct frame in progress (`d`): tops the frame pipe up from the workload's
  /// pipe, then moves all of the frame pipe to the channel. Returns false when the channel
  /// takes no more now (or was closed).
  bool move_direct(const StdioCore::Direct& d) {
    StdioCore& c = mux_->workload();
    const int src = (d.stream == proto::Stream::err ? fds_.err : fds_.out).get();
    if (d.left > 0) {
      ssize_t n = src < 0 ? -1 : ::splice(src, nullptr, frame_pipe_w_.get(), nullptr, d.left, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        c.direct_taken(static_cast<std::size_t>(n));
        frame_pipe_bytes_ += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        return true;
      } else if (!(n < 0 && errno == EAGAIN && frame_pipe_bytes_ > 0)) {
        // The init is the pipe's only reader and FIONREAD counted the bytes: cannot happen.
        // A frame promised and not delivered would corrupt the stream: end the channel instead.
        log_.error("data", "{} byte(s) framed on {} cannot be taken from its pipe ({}); closing the data channel",
                   d.left, proto::to_string(d.stream), n < 0 ? std::strerror(errno) : "empty");
        close_data();
        return false;
      }
    }
    if (frame_pipe_bytes_ > 0) {
      ssize_t n = ::splice(frame_pipe_.get(), nullptr, data_.get(), nullptr, frame_pipe_bytes_, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        data_seen_ = true;
        frame_pipe_bytes_ -= static_cast<std::size_t>(n);
        bytes_written_ += static_cast<std::uint64_t>(n);
      } else if (n < 0 && errno == EINTR) {
        return true;
      } else if (n < 0 && errno == EAGAIN) {
        return false;
      } else if (n < 0 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
        // This channel's fd takes no spliced pages: copy this frame, and all output after it.
        log_.info("data", "splice: {}; copying output instead", std::strerror(errno));
        return copy_direct(d.stream, src);
      } else {
        log_.warn("data", "splice: {}; output from now on is discarded", n < 0 ? std::strerror(errno) : "wrote nothing");
        close_data();
        return false;
      }
    }
    if (frame_pipe_bytes_ == 0 && c.direct_pending() && c.direct_pending()->left == 0) c.direct_done();
    return true;
  }

  /// The direct frame in progress goes out as copies instead: what the frame pipe holds, then
  /// the payload still in the workload's pipe (`src`), all queued in the core's tx().
  bool copy_direct(proto::Stream s, int src) {
    StdioCore& c = mux_->workload();
    auto take = [&](int fd, std::size_t want) -> std::size_t {
      ssize_t n;
      do n = ::read(fd, io_buf_, std::min(want, sizeof io_buf_));
      while (n < 0 && errno == EINTR);
      if (n <= 0) return 0;
      c.direct_fill(std::string_view(io_buf_, static_cast<std::size_t>(n)));
      return static_cast<std::size_t>(n);
    };
    while (frame_pipe_bytes_ > 0) {
      const std::size_t n = take(frame_pipe_.get(), frame_pipe_bytes_);
      if (n == 0) break;
      frame_pipe_bytes_ -= n;
    }
    while (frame_pipe_bytes_ == 0 && src >= 0 && c.direct_pending() && c.direct_pending()->left > 0) {
      const std::size_t n = take(src, c.direct_pending()->left);
      if (n == 0) break;
      c.direct_taken(n);
    }
    if (frame_pipe_bytes_ > 0 || !c.direct_pending() || c.direct_pending()->left > 0) {
      log_.error("data", "a frame on {} could not be completed; closing the data channel", proto::to_string(s));
      close_data();
      return false;
    }
    c.direct_done();
    return true;
  }

  /// One read of `s`'s pipe or PTY into the core's buffer (or EOF).
  void read_once(StdioCore& c, bool terminal, proto::Stream s, base::Fd& fd) {
    const std::size_t room = std::min(c.out_room(s), sizeof io_buf_);
    if (room == 0 || !fd) return;
    ssize_t n = ::read(fd.get(), io_buf_, room);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n > 0) {
      c.on_output(s, std::string_view(io_buf_, static_cast<std::size_t>(n)));
      return;
    }
    // EOF; for a PTY master EIO once every slave fd is closed.
    if (n < 0 && !(terminal && errno == EIO)) log_.warn("data", "read {}: {}", proto::to_string(s), std::strerror(errno));
    c.on_output_eof(s);
    if (terminal) c.in_closed();
    fd.reset();
  }

  void write_stdin(StdioCore& c, StdioFds& f) {
    const int fd = f.terminal ? f.out.get() : f.in.get();
    while (fd >= 0 && !c.in_pending().empty()) {
      std::string_view v = c.in_pending();
      ssize_t n = ::write(fd, v.data(), v.size());
      if (n > 0) {
        c.in_written(static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      // EPIPE: the workload closed its stdin; what the host sends later has no reader.
      log_.info("data", "stdin: {}; discarding further input", n < 0 ? std::strerror(errno) : "short write");
      c.in_closed();
      if (!f.terminal) f.in.reset();
      return;
    }
  }

  /// Writes to the data channel what the mux says goes next (framed bytes, or the workload's
  /// direct frame to move on) while the channel takes it.
  void write_data() {
    while (data_ && mux_) {
      auto t = mux_->tx();
      if (!t) return;
      if (t->direct) {
        if (!move_direct(*t->direct)) return;
        continue;
      }
      ssize_t n = ::write(data_.get(), t->bytes.data(), t->bytes.size());
      if (n > 0) {
        data_seen_ = true;
        mux_->sent(static_cast<std::size_t>(n));
        bytes_written_ += static_cast<std::uint64_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      log_.warn("data", "write: {}; output from now on is discarded", n < 0 ? std::strerror(errno) : "wrote nothing");
      close_data();
      return;
    }
  }

  void read_data(short revents) {
    StdioMux& m = *mux_;
    const std::size_t room = std::min(m.rx_room(), sizeof io_buf_);
    if (data_is_port_ && !(revents & POLLIN)) {
      // A virtio port with no host connected polls as POLLHUP: not an EOF (there is none on a
      // port); look again in kPortRetryMs.
      if (port_closed_by_host()) return;
      data_retry_at_ = monotonic_ms() + kPortRetryMs;
      data_hup_ = true;
      return;
    }
    data_hup_ = false;
    if (room == 0) return;
    ssize_t n = ::read(data_.get(), io_buf_, room);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n > 0) {
      data_seen_ = true;
      m.on_rx(std::string_view(io_buf_, static_cast<std::size_t>(n)));
      return;
    }
    if (data_is_port_ && n == 0) {
      if (port_closed_by_host()) return;
      data_retry_at_ = monotonic_ms() + kPortRetryMs;
      data_hup_ = true;
      return;
    }
    if (n < 0) {
      log_.warn("data", "read: {}", std::strerror(errno));
      close_data();
      return;
    }
    // The host closed its sending side: stdin's EOF. Output may still go the other way.
    log_.info("data", "EOF from the host");
    data_rx_eof_ = true;
    m.on_rx_eof();
  }

  /// A virtio data port hung up after its host took or sent bytes on it: the host closed the data
  /// channel (a port has no EOF of its own), e.g. it gave up on the output on purpose. Outside
  /// the final flush (where that close is the receipt) the channel is closed here, so the
  /// workload's output is discarded and counted (output_end) instead of held for good.
  bool port_closed_by_host() {
    if (!data_seen_ || flushing_) return false;
    log_.info("data", "the host closed the data channel (port hang-up); output from now on is discarded");
    close_data();
    return true;
  }

  void close_data() {
    data_.reset();
    frame_pipe_.reset();  // a frame half-sent dies with the channel
    frame_pipe_w_.reset();
    frame_pipe_bytes_ = 0;
    if (!mux_) return;
    mux_->channel_closed();
    // Every stdin is closed with it: each process reads EOF instead of waiting for good.
    for (ExecFds& x : execs_)
      if (!x.fds.terminal) x.fds.in.reset();
    if (!fds_.terminal) fds_.in.reset();
  }

  void read_channel() {
    char buf[65536];
    ssize_t n = ::read(chan_.get(), buf, sizeof buf);
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
  Shares shares_{mode_ != Mode::guest};  // a sandbox mounts in a namespace of its own
  base::Fd chan_;             // the lifecycle channel, or none
  base::Fd data_;             // the data channel (boot.stdio), or none
  bool data_is_port_ = false;
  bool data_rx_eof_ = false;  // the host closed its sending side
  bool data_hup_ = false;     // a virtio data port's host side is not connected (last look)
  bool data_seen_ = false;    // bytes moved on the data channel: its host was there
  std::optional<std::uint64_t> data_retry_at_;  // a virtio data port without its host: look again then
  std::optional<StdioMux> mux_;  // the data channel's processes, from its dial on
  StdioFds fds_;
  base::Fd frame_pipe_, frame_pipe_w_;  // direct frames on their way (read and write ends)
  std::size_t frame_pipe_bytes_ = 0;    // bytes in the frame pipe, not yet on the channel
  std::vector<ExecFds> execs_;  // at most proto::kExecMax (the session's bound)
  char io_buf_[kStdioChunk];
  std::string out_;
  proto::LineReader reader_;
  std::deque<Event> pending_;
  std::optional<std::uint64_t> deadline_[kTimerCount];
  bool is_port_ = false;    // the channel is a virtio-serial port (no EOF semantics)
  bool port_down_ = false;  // its host side was seen disconnected
  bool host_seen_ = false;  // the host has sent at least one byte
  std::optional<std::uint64_t> port_retry_at_;
  unsigned poll_errors_ = 0;  // consecutive poll(2) failures
  std::uint64_t bytes_written_ = 0;  // to either channel: the final flush's measure of progress
  bool flushing_ = false;            // act::Flush came: only flush rounds from now on
};

}  // namespace

void run_pid1(Mode mode, const Config& cfg, const Log& log, int sfd, Reaper& reaper) {
  Pid1 p(mode, cfg, log, sfd, reaper);
  p.run();
}

}  // namespace nes::init
