#include "loop.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <optional>

#include "cgroup.hpp"
#include "data_io.hpp"
#include "guest.hpp"
#include "mounts.hpp"
#include "network.hpp"
#include "procs.hpp"
#include "rootfs.hpp"
#include "protocol/codec.hpp"
#include "protocol/line_reader.hpp"
#include "overload.hpp"
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

/// Whether this PID 1 may set the hostname: a guest always; a sandbox only in a UTS namespace
/// of its own (in the machine's it would rename the machine).
bool may_set_hostname(Mode mode) {
  if (mode == Mode::guest) return true;
  auto uts = ns_inode("uts");
  return uts && *uts != kInitialUtsNsInode;
}

class Pid1 final : private DataEvents {
 public:
  Pid1(Mode mode, const Config& cfg, const Log& log, int sfd, Reaper& reaper)
      : mode_(mode), cfg_(cfg), log_(log), sfd_(sfd), reaper_(reaper),
        session_(SessionOptions{cfg.grace_ms, cfg.ack_timeout_ms, cfg.boot_timeout_ms, cfg.halt,
                                cfg.connect_timeout_ms, mode == Mode::guest, may_set_hostname(mode),
                                cfg.data_channel.has_value(), mode == Mode::guest,
                                mode == Mode::guest || cfg.own_netns, mode == Mode::guest}) {}

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
  // DataEvents: the data channel's verdicts, queued in the order found.
  void push(ev::DataError&& e) override { pending_.push_back(std::move(e)); }
  void push(ev::DataLost&& e) override { pending_.push_back(std::move(e)); }
  void push(ev::OutputsDone&& e) override { pending_.push_back(std::move(e)); }
  void push(ev::ExecOutputsDone&& e) override { pending_.push_back(std::move(e)); }
  void push(ev::ExecClosed&& e) override { pending_.push_back(std::move(e)); }

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
    // A port reopened after act::CloseChannel is the same host stream: what was queued (a line
    // begun included) goes first, so no line reaches the host cut. A new socket starts clean.
    if (!(port && keep_out_)) out_.clear();
    keep_out_ = false;
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
    const bool port = std::holds_alternative<VirtioPortAddr>(ch);
    auto fd = attempt(ch, d.attempt_ms);
    if (fd && port && d.redial) {
      // A redialled port counts only with its host side connected again (as the lifecycle's).
      pollfd p{fd->get(), POLLIN, 0};
      if (::poll(&p, 1, 0) > 0 && (p.revents & POLLHUP)) fd = base::Error{std::strerror(ENOTCONN), ENOTCONN};
    }
    if (!fd) {
      const base::Error& e = fd.error();
      pending_.push_front(ev::DataFailed{fmt::format("data channel {}: {}", to_string(ch), e.message), e.err,
                                         retryable(e.err)});
      return;
    }
    data_.connected(std::move(*fd), port, d);
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
                   [&](act::Send& s) { send(s.msg, s.generation); },
                   [&](act::DialData& d) { do_dial_data(d); },
                   [&](act::DataGiveUp&) { data_.give_up(); },
                   [&](act::Dial& d) { do_dial(d); },
                   [&](act::Seed& sd) { seed(sd.entropy, sd.realtime_ns, log_); },
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
                     data_.flushing();
                     report_flushing(0);
                   },
                   [&](act::PowerOff& p) { power_off(p.halt); },
                   [&](act::ListProcesses&) { pending_.push_front(ev::ProcessList{read_processes()}); },
                   [&](act::ContainerResources& c) { pending_.push_front(ev::ResourcesDone{container_resources(c.req)}); },
                   [&](act::SpawnExec& x) { do_spawn_exec(x); },
                   [&](act::CloseExec& x) { data_.close_exec(x.proc); },
                   [&](act::CheckHeld& c) { pending_.push_front(ev::Held{c.proc, data_.held(c.proc)}); },
                   [&](act::CloseChannel&) { close_channel(); },
               },
               a);
  }

  void send(const proto::GuestMessage& m, std::optional<std::uint64_t> generation) {
    if (!chan_) return;
    std::string line = proto::encode_line(m, proto::GuestEnvelope{generation});
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
    keep_out_ = false;
    pending_.push_back(ev::Eof{});
  }

  /// act::CloseChannel: closes the lifecycle channel; the session redials and re-sends what it
  /// owes. On a socket what is queued goes with it (the next connection is a new stream); on a
  /// virtio port it is kept for the reopened port (do_dial), whose host side is the same stream.
  void close_channel() {
    chan_.reset();
    keep_out_ = is_port_;
    if (!keep_out_) out_.clear();
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
    // A read-only root took its mount points (the shares', the /etc files') in memory: sealed
    // now, before anything runs in it (rootfs.hpp).
    if (b.root && b.root->ro) {
      if (auto r = seal_read_only("/"); !r) {
        pending_.push_front(ev::MountFailed{proto::MountFailed{b.root->tag, "root " + r.error().message, r.error().err}});
        return;
      }
      log_.info("root", "/ sealed read-only");
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
      auto made = data_.open_workload(*b.stdio);
      if (!made) {
        pending_.push_front(ev::StartFailed{
            proto::StartFailed{made.error().message, made.error().err, proto::StartFailClass::other}});
        return;
      }
      cfds = *made;
    }
    auto r = spawn(b.exec, b.geometry, b.console ? Stdio::console : Stdio::inherit, reaper_,
                   b.stdio ? &cfds : nullptr);
    // The workload has its copies: the init keeps only its own ends.
    data_.workload_spawned();
    if (r) pending_.push_front(ev::Started{*r});
    else pending_.push_front(ev::StartFailed{std::move(r).error()});
  }

  /// act::SpawnExec: its fds (pipes, a PTY, or /dev/null for all three), then spawn. Its frames
  /// become legal on the data channel before it runs, so the host's first stdin is not refused.
  void do_spawn_exec(const act::SpawnExec& x) {
    auto failed = [&](base::Error e) {
      pending_.push_front(ev::ExecFailed{x.proc, proto::StartFailed{std::move(e.message), e.err, proto::StartFailClass::other}});
    };
    // exec.container: its root must be a directory (ENOENT/ENOTDIR: class not_found, 127).
    std::vector<ContainerStep> steps;
    JoinPlan join;
    Enclosure where;
    if (x.container) {
      struct stat st {};
      int err = ::stat(x.container->root.c_str(), &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
      if (err != 0)
        return pending_.push_front(ev::ExecFailed{x.proc, proto::StartFailed{
            fmt::format("exec.container.root: {}: {}", x.container->root, std::strerror(err)), err,
            classify(SpawnStep::exec, err)}});
      std::vector<std::string> etc;
      for (const char* f : {"hosts", "resolv.conf", "hostname"})
        if (::access(fmt::format("/etc/{}", f).c_str(), F_OK) == 0) etc.emplace_back(f);
      steps = plan_container(*x.container, etc);
      where = Enclosure{&steps, x.container->hostname.has_value(), nullptr};
    } else if (x.in_pid > 0) {
      join = plan_join(x.in_pid);
      where.join = &join;
    }
    ChildFds cfds;
    base::Fd null;  // without streams: /dev/null for all three
    if (x.stdio) {
      auto made = data_.open_exec(x.proc, *x.stdio);
      if (!made) return failed(std::move(made).error());
      cfds = *made;
    } else {
      null.reset(::open("/dev/null", O_RDWR | O_CLOEXEC));
      if (!null) return failed(base::errno_error(errno, "exec: open /dev/null"));
      cfds = ChildFds{{null.get(), null.get(), null.get()}, false};
    }
    // The container's cgroup (cgroup.hpp), in the VM only: a sandbox's /sys/fs/cgroup is the
    // machine's, not the init's to change (a container with limits is refused there).
    std::string procs;
    const bool own_cgroup = x.container && mode_ == Mode::guest;
    if (x.container && !own_cgroup && x.container->resources)
      return failed(base::Error{"exec.container.resources: no cgroup of its own outside a VM (sandbox mode)", EPERM});
    if (own_cgroup) {
      auto made = cgroups_.create(x.proc, x.container->resources);
      if (!made) {
        base::Error e = std::move(made).error();
        e.message = (x.container->resources ? "exec.container.resources." : "exec.container: ") + e.message;
        return failed(std::move(e));
      }
      procs = std::move(*made);
    } else if (x.in_pid > 0 && mode_ == Mode::guest) {
      procs = cgroups_.procs_of(x.in_pid);
    }
    if (!procs.empty()) where.cgroup_procs = procs.c_str();
    log_.info("exec", "process {}: {}", x.proc, x.exec.argv.empty() ? std::string() : x.exec.argv[0]);
    auto r = spawn(x.exec, x.geometry, Stdio::inherit, reaper_, &cfds, Role::exec, where);
    if (own_cgroup) r ? cgroups_.started(x.proc, *r) : cgroups_.failed(x.proc);
    null.reset();
    data_.exec_spawned(x.proc, static_cast<bool>(r));
    if (!r) {
      proto::StartFailed f = std::move(r).error();
      if (x.container && f.reason.starts_with("execve"))
        f.reason += fmt::format(" (in exec.container.root {})", x.container->root);
      pending_.push_front(ev::ExecFailed{x.proc, std::move(f)});
      return;
    }
    // Started first, then (with no streams) its outputs are done at once.
    if (!x.stdio) pending_.push_front(ev::ExecOutputsDone{x.proc});
    pending_.push_front(ev::ExecStarted{x.proc, *r});
  }

  /// act::ContainerResources: the update written (refused naming the field), then the use read.
  proto::ContainerResourcesReply container_resources(const proto::ContainerResourcesRequest& r) {
    proto::ContainerResourcesReply out{r.proc, std::nullopt, std::nullopt};
    auto dir = cgroups_.running(r.proc);
    if (!dir) {
      out.error = fmt::format("proc: container {} has no cgroup of its own", r.proc);
      return out;
    }
    if (r.update) {
      if (auto s = write_resources(*dir, *r.update, true); !s) out.error = s.error().message;
      else log_.info("cgroup", "container {}: limits updated", r.proc);
    }
    if (auto st = read_stats(*dir)) out.stats = *st;
    else if (!out.error) out.error = st.error().message;
    return out;
  }

  /// Bytes written to either channel: the final flush's measure of progress.
  std::uint64_t written() const { return bytes_written_ + data_.written(); }

  /// One round of the final flush (act::Flush): write what is queued on both channels, read the
  /// workload's output on, watch the data channel for the host's close; then report what is left
  /// and only then look at the deadlines (a report of progress re-arms the idle timer first).
  void flush_once() {
    const std::uint64_t before = written();
    const std::uint64_t now = monotonic_ms();
    const int timeout = deadline_timeout(now);
    pollfd p[1 + DataIo::kStdioFds];
    // The lifecycle channel is watched for the host's hang-up too: a held flush waits only for
    // as long as the host is there.
    p[0] = {chan_ ? chan_.get() : -1, static_cast<short>(POLLRDHUP | (out_.empty() ? 0 : POLLOUT)), 0};
    data_.flush_poll_set(p + 1, now);
    if (::poll(p, 1 + DataIo::kStdioFds, timeout) > 0) {
      if (p[0].revents & (POLLHUP | POLLERR | POLLRDHUP)) {
        // hung up (the host closed it; a virtio port without its host): give up on it
        chan_.reset();
      } else if (p[0].revents & POLLOUT) {
        flush();
      }
      data_.on_flush_poll(p + 1);
    }
    report_flushing(written() - before);
    drain();
    fire_due_timers();
  }

  /// ev::Flushing: what the channels still owe, as the I/O left it.
  void report_flushing(std::uint64_t written) {
    ev::Flushing f;
    f.written = written;
    f.control_queued = chan_ && !out_.empty();
    data_.report(f);
    f.channel_open = static_cast<bool>(chan_);
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
    data_.close();
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
    for (const ExecReaped& x : r.execs) {
      cgroups_.reaped(x.pid);
      pending_.push_back(ev::ExecReaped{x.pid, x.status});
    }
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
    if (auto at = data_.retry_at()) {
      if (*at > now) {
        std::uint64_t left = *at - now;
        if (timeout < 0 || left < static_cast<std::uint64_t>(timeout)) timeout = static_cast<int>(left);
      }
    }
    pollfd p[2 + DataIo::kPollFds] = {
        {sfd_, POLLIN, 0}, {watch_chan ? chan_.get() : -1, static_cast<short>(POLLIN | (out_.empty() ? 0 : POLLOUT)), 0}};
    const std::size_t n = 2 + data_.poll_set(p + 2, now);
    int r = ::poll(p, static_cast<nfds_t>(n), timeout);
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
    data_.on_poll(p + 2);
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
  std::string out_;
  proto::LineReader reader_;
  std::deque<Event> pending_;
  DataIo data_{log_, *this};  // the data channel (boot.stdio) and the fds of its processes
  ContainerCgroups cgroups_;  // the cgroups of the containers exec started (guest mode)
  std::optional<std::uint64_t> deadline_[kTimerCount];
  bool is_port_ = false;    // the channel is a virtio-serial port (no EOF semantics)
  bool keep_out_ = false;   // out_ waits for the port act::CloseChannel closed to be reopened
  bool port_down_ = false;  // its host side was seen disconnected
  bool host_seen_ = false;  // the host has sent at least one byte
  std::optional<std::uint64_t> port_retry_at_;
  unsigned poll_errors_ = 0;  // consecutive poll(2) failures
  std::uint64_t bytes_written_ = 0;  // to the lifecycle channel
  bool flushing_ = false;            // act::Flush came: only flush rounds from now on
};

}  // namespace

void run_pid1(Mode mode, const Config& cfg, const Log& log, int sfd, Reaper& reaper) {
  Pid1 p(mode, cfg, log, sfd, reaper);
  p.run();
}

}  // namespace nes::init
