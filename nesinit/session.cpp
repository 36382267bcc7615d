#include "session.hpp"

#include <cerrno>
#include <csignal>

#include "overload.hpp"

namespace nes::init {

namespace {

std::string describe(const proto::WorkloadExited& w) {
  if (w.signal) return fmt::format("signal {}", *w.signal);
  return fmt::format("exit_code {}", w.exit_code.value_or(0));
}
}  // namespace

std::string_view to_string(Timer t) {
  switch (t) {
    case Timer::dial: return "dial";
    case Timer::boot: return "boot";
    case Timer::workload_grace: return "workload_grace";
    case Timer::workload_kill: return "workload_kill";
    case Timer::all_grace: return "all_grace";
    case Timer::all_kill: return "all_kill";
    case Timer::ack: return "ack";
    case Timer::drain: return "drain";
    case Timer::reconnect: return "reconnect";
    case Timer::redial: return "redial";
    case Timer::data_dial: return "data_dial";
    case Timer::data_redial: return "data_redial";
    case Timer::data_reconnect: return "data_reconnect";
    case Timer::flush_idle: return "flush_idle";
    case Timer::flush_cap: return "flush_cap";
    case Timer::exec_drain: return "exec_drain";
    case Timer::ack_window: return "ack_window";
  }
  return "?";
}

std::string_view to_string(Phase p) {
  switch (p) {
    case Phase::idle_before_channel: return "idle_before_channel";
    case Phase::awaiting_boot: return "awaiting_boot";
    case Phase::mounting: return "mounting";
    case Phase::starting: return "starting";
    case Phase::running: return "running";
    case Phase::settled: return "settled";
    case Phase::shutting_down: return "shutting_down";
    case Phase::done: return "done";
  }
  return "?";
}

std::string_view to_string(Stage s) {
  switch (s) {
    case Stage::none: return "none";
    case Stage::workload_term: return "workload_term";
    case Stage::workload_kill: return "workload_kill";
    case Stage::all_term: return "all_term";
    case Stage::all_kill: return "all_kill";
    case Stage::await_ack: return "await_ack";
    case Stage::flush: return "flush";
    case Stage::final: return "final";
  }
  return "?";
}

proto::Halt Session::halt() const {
  if (boot_ && boot_->on_exit.halt) return *boot_->on_exit.halt;
  return opt_.halt;
}

Actions Session::handle(const Event& e) {
  out_.clear();
  // Once the final act is asked for, nothing else happens (the loop never returns from it).
  // During the flush before it only the flush's own reports and timers count: the outcome is
  // settled, the processes are gone, and nothing is read from the host any more; a data channel
  // being redialled (resume) still hears how its dials go, so what its rings hold reaches a host.
  const bool flush_event = std::holds_alternative<ev::Flushing>(e) || std::holds_alternative<ev::TimerFired>(e) ||
                           std::holds_alternative<ev::DataUp>(e) || std::holds_alternative<ev::DataFailed>(e) ||
                           std::holds_alternative<ev::DataLost>(e);
  if (phase_ != Phase::done && (stage_ != Stage::flush || flush_event))
    std::visit([this](const auto& x) { on(x); }, e);
  Actions r;
  r.swap(out_);
  return r;
}

// ---- helpers -------------------------------------------------------------------------------------

void Session::note(Severity s, std::string_view phase, std::string text) {
  out_.push_back(act::Note{s, std::string(phase), std::move(text)});
}

void Session::send(proto::GuestMessage m) {
  if (!channel_open_) {
    note(Severity::warn, "channel", fmt::format("closed; not sent: {}", proto::type_name(m)));
    return;
  }
  // Fencing: every line after `boot` names the generation it belongs to (docs/protocol.md).
  out_.push_back(act::Send{std::move(m), boot_ ? boot_->generation : std::nullopt});
}

void Session::arm(Timer t, std::uint32_t ms) {
  armed_[static_cast<int>(t)] = true;
  out_.push_back(act::ArmTimer{t, ms});
}

void Session::cancel(Timer t) {
  if (!armed_[static_cast<int>(t)]) return;
  armed_[static_cast<int>(t)] = false;
  out_.push_back(act::CancelTimer{t});
}

void Session::term_workload() {
  // The workload receives at most one SIGTERM from the init, ever: `stop`, `kill{15}`, EOF and
  // shutdown step 1 all share it, and its grace period runs from the first one.
  if (term_sent_ || workload_pid_ <= 0) return;
  term_sent_ = true;
  out_.push_back(act::SignalGroup{SIGTERM, workload_pid_});
  arm(Timer::workload_grace, opt_.grace_ms);
}

void Session::settle(proto::GuestMessage outcome) {
  if (outcome_) {
    // Outcome finality: the first final event stands; a later one is only logged.
    note(Severity::warn, "outcome",
         fmt::format("{} after the outcome {}; not reported", proto::type_name(outcome),
                     proto::type_name(*outcome_)));
    return;
  }
  outcome_ = outcome;
  send(std::move(outcome));
  const bool terminal = boot_ ? boot_->on_exit.terminal : true;
  if (phase_ == Phase::shutting_down) {
    // Reported during a shutdown: the host gets ack_timeout_ms to acknowledge it.
    if (!acked_ && channel_open_ && !ack_armed_) {
      arm(Timer::ack, opt_.ack_timeout_ms);
      ack_armed_ = true;
    }
    return;
  }
  if (terminal) {
    begin_shutdown("terminal outcome");
  } else {
    // Not terminal: stay up, reaping and serving the channel, until `shutdown`.
    phase_ = Phase::settled;
    note(Severity::info, "settled", "not terminal; waiting for shutdown");
  }
}

// ---- events --------------------------------------------------------------------------------------

void Session::on(const ev::Start& s) {
  if (phase_ != Phase::idle_before_channel || dialling_) return;
  // The first dial: attempts until one connects, one fails for good, a shutdown signal, or
  // connect_timeout_ms in all. Giving up is not an exit: it runs the ordered shutdown.
  dialling_ = true;
  channel_ = s.channel;
  redial_ms_ = kRedialFirstMs;
  note(Severity::info, "dial", fmt::format("{} (up to {} ms)", channel_, opt_.connect_timeout_ms));
  arm(Timer::dial, opt_.connect_timeout_ms);
  dial_once();
}

void Session::dial_once() {
  // The first dial's attempt may take all the time left (the loop holds it no longer than the
  // next timer, Timer::dial); a redial's is short, the reconnect window's backoff spaces them.
  ++attempts_;
  if (dialling_) out_.push_back(act::Dial{opt_.connect_timeout_ms, false});
  else out_.push_back(act::Dial{kRedialAttemptMs, true});
}

void Session::give_up_dialling(std::string why) {
  dialling_ = false;
  cancel(Timer::dial);
  cancel(Timer::redial);
  note(Severity::error, "channel", std::move(why));
  begin_shutdown("no channel");
}

void Session::on(const ev::ChannelUp&) {
  if (reconnecting_) return resume_channel();
  if (phase_ != Phase::idle_before_channel) return;
  if (dialling_) {
    dialling_ = false;
    cancel(Timer::dial);
    cancel(Timer::redial);
    note(Severity::info, "dial", fmt::format("{} connected (attempt {})", channel_, attempts_));
  }
  channel_open_ = true;
  phase_ = Phase::awaiting_boot;
  // The guest speaks first and sends its version before reading anything.
  send(proto::Ready{proto::kProtocolVersion, std::nullopt, proto::all_features()});
  arm(Timer::boot, opt_.boot_timeout_ms);
}

void Session::on(const ev::Line& l) {
  if (l.line.kind == proto::Line::Kind::too_long) {
    send(proto::ProtocolError{fmt::format("line of {} bytes exceeds the cap; dropped", l.line.length)});
    note(Severity::warn, "protocol", fmt::format("dropped an over-long line ({} bytes)", l.line.length));
    return;
  }
  on(ev::Message{proto::decode_host(l.line.text)});
}

void Session::on(const ev::Message& m) {
  std::visit(Overload{
                 [&](const proto::DecodeError& e) {
                   // Malformed: answered, not acted on; the session goes on.
                   note(Severity::warn, "protocol", e.reason);
                   send(proto::ProtocolError{e.reason});
                 },
                 [&](const proto::UnknownMessage& u) {
                   note(Severity::info, "protocol", fmt::format("skipped unknown type '{}'", u.type));
                 },
                 [&](const proto::HostMessage& hm) {
                   std::visit(Overload{
                                  [&](const proto::Boot& b) { on_boot(b); },
                                  [&](const proto::Stop&) { on_stop("stop"); },
                                  [&](const proto::Kill& k) {
                                    if (k.proc) on_kill_exec(k.signal, *k.proc);
                                    else on_kill(k.signal);
                                  },
                                  [&](const proto::ExecProcess& x) { on_exec(x); },
                                  [&](const proto::Shutdown&) { on_shutdown_msg(); },
                                  // Answered in any phase: it changes nothing.
                                  [&](const proto::ListProcesses&) { out_.push_back(act::ListProcesses{}); },
                                  [&](const proto::ContainerResourcesRequest& r) { on_container_resources(r); },
                              },
                              hm);
                 },
             },
             m.msg);
}

void Session::on_boot(const proto::Boot& b) {
  if (phase_ != Phase::awaiting_boot) {
    // Exactly one boot is acted on per connection.
    note(Severity::warn, "boot", fmt::format("another boot in phase {}; ignored", to_string(phase_)));
    return;
  }
  cancel(Timer::boot);
  boot_ = b;
  phase_ = Phase::mounting;
  note(Severity::info, "boot",
       fmt::format("argv[0]={} mounts={} terminal={} stdio={}", b.exec.argv.empty() ? "" : b.exec.argv[0],
                   b.mounts.size(), b.on_exit.terminal, b.stdio ? "data channel" : "console"));
  // A restored snapshot's clones share its CRNG state and clock: each gets its own first.
  if (b.entropy || b.realtime_ns) {
    if (opt_.may_seed) out_.push_back(act::Seed{b.entropy, b.realtime_ns});
    else note(Severity::info, "seed", "a sandbox: entropy and realtime_ns are the machine's to set; skipped");
  }
  // With stdio the data channel comes first: if it cannot be had, nothing is mounted or started.
  // Its dial is bounded and retried like the first dial's.
  if (!b.stdio) return mount();
  if (!opt_.has_data_channel)
    return data_gave_up("data channel: no address configured (--data-channel=ADDR or nesinit.data=ADDR)", 0);
  dialling_data_ = true;
  data_backoff_ms_ = kRedialFirstMs;
  arm(Timer::data_dial, opt_.connect_timeout_ms);
  out_.push_back(data_dial(opt_.connect_timeout_ms, false));
}

act::DialData Session::data_dial(std::uint32_t attempt_ms, bool redial) const {
  act::DialData d{attempt_ms, *boot_->stdio, false, 0, {}, false};
  d.resume = boot_->stdio->replay_bytes > 0 && boot_->reconnect_ms > 0;
  d.generation = boot_->generation.value_or(0);
  d.vm = boot_->vm.value_or("");
  d.redial = redial;
  return d;
}

void Session::mount() {
  if (boot_->root && !opt_.may_switch_root)
    return on(ev::MountFailed{proto::MountFailed{boot_->root->tag, "root: only a guest's PID 1 switches root", EPERM}});
  if (boot_->network && !opt_.may_configure_network)
    return on(ev::NetworkFailed{proto::NetworkFailed{
        "-", "namespace", "this sandbox shares the machine's network namespace (own_netns=1 if it does not)", EPERM}});
  out_.push_back(act::Mount{boot_->root, boot_->mounts, boot_->network, boot_->hostname});
}

void Session::end_data_dial() {
  dialling_data_ = false;
  cancel(Timer::data_dial);
  cancel(Timer::data_redial);
}

void Session::data_gave_up(std::string reason, int err) {
  end_data_dial();
  if (phase_ != Phase::mounting) return;
  note(Severity::error, "data", reason);
  settle(proto::StartFailed{std::move(reason), err, proto::StartFailClass::other});
}

void Session::on(const ev::DataUp&) {
  if (resuming_data_) {
    resuming_data_ = false;
    // The window (data_reconnect) stays armed: a host that takes the connection and drops it
    // again before the handshake must not open a fresh window each time. Firing after a resume
    // that held, it does nothing.
    cancel(Timer::data_redial);
    note(Severity::info, "data", "the data channel is redialled: its output resumes");
    return;
  }
  if (!dialling_data_) return;
  data_up_ = true;
  end_data_dial();
  if (phase_ != Phase::mounting || !boot_ || !boot_->stdio) return;
  mount();
}

void Session::on(const ev::DataFailed& f) {
  if (resuming_data_) {
    note(Severity::debug, "data", f.reason);
    arm(Timer::data_redial, data_backoff_ms_);
    data_backoff_ms_ = std::min(data_backoff_ms_ * 2, kRedialMaxMs);
    return;
  }
  if (!dialling_data_) return;
  last_data_error_ = f.reason;
  last_data_err_ = f.err;
  if (!f.retryable) return data_gave_up(f.reason, f.err);
  note(Severity::debug, "data", f.reason);
  arm(Timer::data_redial, data_backoff_ms_);
  data_backoff_ms_ = std::min(data_backoff_ms_ * 2, kRedialMaxMs);
}

void Session::on(const ev::DataError& e) {
  // The host broke the data channel's framing: the loop closed it; the session goes on.
  note(Severity::warn, "data", e.reason);
  send(proto::ProtocolError{fmt::format("data channel: {}", e.reason)});
}

void Session::on(const ev::DataLost& l) {
  // Data channel resume: the host went without closing the channel. Redialled like the
  // lifecycle channel, for up to reconnect_ms; the workload's output waits in the init.
  if (phase_ == Phase::done || resuming_data_ || !boot_ || !boot_->stdio) return;
  note(Severity::warn, "data", fmt::format("{}; redialling for up to {} ms", l.reason, boot_->reconnect_ms));
  resuming_data_ = true;
  if (armed_[static_cast<int>(Timer::data_reconnect)]) {
    // Lost again inside the window of an earlier loss (a connection the host dropped, or
    // refused, before the handshake): the same window, the backoff going on; no tight loop.
    arm(Timer::data_redial, data_backoff_ms_);
    data_backoff_ms_ = std::min(data_backoff_ms_ * 2, kRedialMaxMs);
    return;
  }
  data_backoff_ms_ = kRedialFirstMs;
  arm(Timer::data_reconnect, boot_->reconnect_ms);
  out_.push_back(data_dial(kRedialAttemptMs, true));
}

void Session::on(const ev::OutputsDone& d) {
  if (outputs_done_) return;
  outputs_done_ = true;
  account_workload(d.out, d.err, "");
  if (!held_exit_) return;
  cancel(Timer::drain);
  note(Severity::info, "exited", "stdout and stderr at EOF");
  report_held_exit();
}

void Session::on(const ev::ProcessList& p) { send(p.list); }
void Session::on(const ev::ResourcesDone& d) { send(d.reply); }

void Session::on_container_resources(const proto::ContainerResourcesRequest& r) {
  for (const ExecState& e : execs_)
    if (e.proc == r.proc && e.container && e.pid > 0 && !e.held) return out_.push_back(act::ContainerResources{r});
  send(proto::ContainerResourcesReply{r.proc, fmt::format("proc: no container is running as process {}", r.proc), std::nullopt});
}

void Session::on_stop(std::string_view why) {
  if (workload_pid_ <= 0) {
    note(Severity::info, "stop", fmt::format("{}: no workload running; nothing to do", why));
    return;
  }
  if (term_sent_) {
    note(Severity::info, "stop", fmt::format("{}: SIGTERM already sent; not repeated", why));
    return;
  }
  note(Severity::info, "stop", fmt::format("{}: SIGTERM to the workload's group", why));
  term_workload();
}

void Session::on_kill(int signo) {
  if (signo == SIGTERM) return on_stop("kill{15}");
  if (workload_pid_ <= 0) {
    note(Severity::info, "kill", fmt::format("signal {}: no workload running; nothing to do", signo));
    return;
  }
  note(Severity::info, "kill", fmt::format("signal {} to the workload's group", signo));
  out_.push_back(act::SignalGroup{signo, workload_pid_});
}

void Session::on_shutdown_msg() {
  host_shutdown_ = true;
  // The host read the outcome, so every line before it on this connection: the accounts sent
  // ahead of it are confirmed (a connection's lines arrive in order).
  if (outcome_ && channel_open_ && acct_before_outcome_) acct_confirmed_ = true;
  if (outcome_ && !acked_) {
    acked_ = true;
    cancel(Timer::ack);
    cancel(Timer::ack_window);
    note(Severity::info, "ack", "host acknowledged the outcome");
  }
  if (phase_ == Phase::shutting_down) {
    if (stage_ == Stage::await_ack) enter_await_ack();
    return;
  }
  begin_shutdown("host sent shutdown");
}

bool Session::survives_loss() const {
  // After boot, with a window, while something is still owed to a host: the workload's run or
  // an outcome it has not acknowledged (until its window is over). Not after the host's own
  // `shutdown`.
  if (!boot_ || boot_->reconnect_ms == 0 || host_shutdown_ || acked_) return false;
  if (phase_ != Phase::shutting_down) return true;
  return (outcome_ && !ack_window_over_) || held_exit_.has_value();
}

bool Session::keeps_outcome() const {
  return channel_open_ && outcome_ && !acked_ && !ack_window_over_ && survives_loss();
}

void Session::begin_reconnect() {
  reconnecting_ = true;
  redial_ms_ = kRedialFirstMs;
  // The ack wait is suspended while there is no channel: the reconnect window bounds it instead.
  if (armed_[static_cast<int>(Timer::ack)]) cancel(Timer::ack);
  ack_armed_ = false;
  note(Severity::warn, "channel", fmt::format("lost; redialling for up to {} ms (the workload is left alone)",
                                              boot_->reconnect_ms));
  arm(Timer::reconnect, boot_->reconnect_ms);
  dial_once();
}

void Session::resume_channel() {
  reconnecting_ = false;
  channel_open_ = true;
  acct_before_outcome_ = false;  // the accounts went on the lost connection: its host may not have read them
  cancel(Timer::reconnect);
  cancel(Timer::redial);
  const bool pending = outcome_ && !acked_;
  note(Severity::info, "channel", fmt::format("redialled; resuming (outcome pending: {})", pending));
  send(proto::Ready{proto::kProtocolVersion,
                    proto::Resume{boot_->vm.value_or(""), boot_->generation.value_or(1),
                                  started_ever_, pending},
                    proto::all_features()});
  if (!pending) return;
  send(*outcome_);  // the final event again, until acknowledged
  if (phase_ == Phase::shutting_down && !ack_armed_) {
    arm(Timer::ack, opt_.ack_timeout_ms);
    ack_armed_ = true;
  }
}

void Session::on(const ev::DialFailed& f) {
  if (dialling_) {
    note(Severity::debug, "dial", fmt::format("{} attempt {}: {}", channel_, attempts_, f.reason));
    last_dial_error_ = f.reason;
    // Not there yet (no listener, no port): try again after the backoff. Anything else
    // (EACCES, EPERM, a bad address) will not change by waiting.
    if (!f.retryable) return give_up_dialling(fmt::format("dialling {} failed: {}", channel_, f.reason));
  } else if (reconnecting_) {
    // Every failure is retried: the reconnect window bounds the redialling, not the error.
    if (redial_ms_ == kRedialFirstMs || redial_ms_ == kRedialMaxMs)
      note(Severity::debug, "channel", fmt::format("redial: {}: {}", channel_, f.reason));
  } else {
    return;
  }
  arm(Timer::redial, redial_ms_);
  redial_ms_ = std::min(redial_ms_ * 2, kRedialMaxMs);
}

void Session::on(const ev::Eof&) {
  if (!channel_open_) return;
  channel_open_ = false;
  note(Severity::info, "channel", "EOF from the host");
  if (survives_loss()) return begin_reconnect();
  if (phase_ == Phase::shutting_down) {
    // Nobody is left to acknowledge: the outcome was sent or can no longer be.
    if (stage_ == Stage::await_ack) enter_await_ack();
    return;
  }
  // Before boot: nothing to run. While running: the workload's one SIGTERM (shutdown step 1).
  begin_shutdown("channel EOF");
}

void Session::on(const ev::MountsDone&) {
  if (phase_ != Phase::mounting) return;
  send(proto::Mounted{});
  phase_ = Phase::starting;
  std::optional<std::string> hostname = boot_->hostname;
  if (hostname && !opt_.may_set_hostname) {
    note(Severity::warn, "hostname", fmt::format("'{}' not set: this sandbox shares the machine's UTS namespace", *hostname));
    hostname.reset();
  }
  out_.push_back(act::Spawn{std::move(hostname), boot_->exec, boot_->geometry, boot_->stdio, opt_.console_stdio});
}

void Session::on(const ev::MountFailed& f) {
  if (phase_ != Phase::mounting) return;
  note(Severity::error, "mount", fmt::format("{}: {}", f.failure.tag.value_or(""), f.failure.reason));
  settle(f.failure);  // nothing is started
}

void Session::on(const ev::NetworkFailed& f) {
  if (phase_ != Phase::mounting) return;
  note(Severity::error, "network", fmt::format("{} {}: {}", f.failure.interface, f.failure.step, f.failure.reason));
  settle(f.failure);  // nothing is started
}

void Session::on(const ev::Started& s) {
  if (phase_ != Phase::starting) return;
  workload_pid_ = s.pid;
  started_ever_ = true;
  phase_ = Phase::running;
  note(Severity::info, "started", fmt::format("pid {}", s.pid));
  send(proto::Started{s.pid});
}

void Session::on(const ev::StartFailed& f) {
  if (phase_ != Phase::starting) return;
  note(Severity::error, "start", fmt::format("{} ({})", f.failure.reason, proto::to_string(f.failure.cls)));
  settle(f.failure);  // no workload_exited follows
}

void Session::on(const ev::Exited& x) {
  if (workload_pid_ <= 0) return;
  workload_pid_ = 0;
  cancel(Timer::workload_grace);
  cancel(Timer::workload_kill);
  note(Severity::info, "exited", describe(x.status));
  if (boot_ && boot_->stdio && !outputs_done_) {
    // Its last output must reach the data channel before the outcome, but a process that
    // inherited stdout may keep it open for good: wait for EOF at most drain_ms.
    held_exit_ = x.status;
    arm(Timer::drain, boot_->stdio->drain_ms);
  } else {
    settle(x.status);
  }
  if (phase_ == Phase::shutting_down &&
      (stage_ == Stage::workload_term || stage_ == Stage::workload_kill))
    enter_all_term();
}

void Session::on(const ev::Signal& s) {
  switch (s.signo) {
    // Ordered shutdown: SIGTERM (a supervisor), SIGINT (Ctrl-Alt-Del once RB_DISABLE_CAD is set,
    // or a terminal), SIGPWR (power failure / a VMM's power button via a UPS-style daemon).
    case SIGTERM:
    case SIGINT:
    case SIGPWR:
      // Before the channel is up a shutdown signal ends the dialling at once (nothing can be
      // booted without a host): the ordered shutdown, as when dialling gives up.
      if (dialling_) return give_up_dialling(fmt::format("dialling {} abandoned: signal {}", channel_, s.signo));
      // While the data channel is dialled: nothing starts (start_failed), then the signal's own
      // shutdown.
      if (dialling_data_)
        data_gave_up(fmt::format("data channel: dialling abandoned: signal {}", s.signo), EINTR);
      if (phase_ == Phase::shutting_down) {
        note(Severity::info, "signal", fmt::format("signal {} during shutdown; already shutting down", s.signo));
        return;
      }
      begin_shutdown(fmt::format("signal {}", s.signo));
      return;
    // Forwarded to the workload's process group (tini's set): terminal hang-up, quit/dump, user
    // signals, window size change, continue.
    case SIGHUP:
    case SIGQUIT:
    case SIGUSR1:
    case SIGUSR2:
    case SIGWINCH:
    case SIGCONT:
      if (workload_pid_ > 0) {
        note(Severity::info, "signal", fmt::format("forwarding signal {} to the workload's group", s.signo));
        out_.push_back(act::SignalGroup{s.signo, workload_pid_});
      } else {
        note(Severity::info, "signal", fmt::format("signal {}: no workload; dropped", s.signo));
      }
      return;
    default:
      // SIGTTIN/SIGTTOU/SIGTSTP: PID 1 never stops. SIGPIPE: the write reports EPIPE instead.
      // Anything else (SIGALRM, real-time signals, ...): nothing of ours; logged and dropped.
      note(Severity::debug, "signal", fmt::format("signal {} ignored", s.signo));
      return;
  }
}

void Session::on(const ev::TimerFired& t) {
  const int i = static_cast<int>(t.timer);
  if (!armed_[i]) return;  // cancelled meanwhile
  armed_[i] = false;
  switch (t.timer) {
    case Timer::dial:
      if (dialling_)
        give_up_dialling(fmt::format("dialling {} failed: {}", channel_,
                                     last_dial_error_.empty() ? "timed out" : last_dial_error_));
      return;
    case Timer::boot:
      if (phase_ == Phase::awaiting_boot)
        begin_shutdown(fmt::format("no boot within {} ms", opt_.boot_timeout_ms));
      return;
    case Timer::workload_grace:
      grace_expired_ = true;
      if (stage_ == Stage::workload_term && workload_pid_ > 0) {
        note(Severity::info, "shutdown", fmt::format("workload still up after {} ms grace: SIGKILL to its group", opt_.grace_ms));
        out_.push_back(act::SignalGroup{SIGKILL, workload_pid_});
        stage_ = Stage::workload_kill;
        arm(Timer::workload_kill, kKillWaitMs);
      }
      return;
    case Timer::workload_kill:
      if (stage_ == Stage::workload_kill) {
        note(Severity::error, "shutdown", "workload not reaped after SIGKILL; going on without it");
        enter_all_term();
      }
      return;
    case Timer::all_grace:
      if (stage_ == Stage::all_term) {
        note(Severity::info, "kill-all", fmt::format("processes left after {} ms grace: SIGKILL to all", opt_.grace_ms));
        out_.push_back(act::SignalAll{SIGKILL});
        stage_ = Stage::all_kill;
        arm(Timer::all_kill, kKillWaitMs);
      }
      return;
    case Timer::all_kill:
      if (stage_ == Stage::all_kill) {
        note(Severity::error, "shutdown", "processes left after SIGKILL; going on without them");
        enter_await_ack();
      }
      return;
    case Timer::reconnect:
      if (!reconnecting_) return;
      reconnecting_ = false;
      cancel(Timer::redial);
      note(Severity::warn, "channel", fmt::format("no host within {} ms", boot_->reconnect_ms));
      if (phase_ == Phase::shutting_down) {
        if (stage_ == Stage::await_ack) enter_await_ack();  // nobody left to acknowledge
        return;
      }
      begin_shutdown("channel lost; the reconnect window is over");
      return;
    case Timer::redial:
      if (dialling_ || reconnecting_) dial_once();
      return;
    case Timer::data_dial:
      if (dialling_data_)
        data_gave_up(last_data_error_.empty() ? "data channel: not connected in time" : last_data_error_,
                     last_data_error_.empty() ? ETIMEDOUT : last_data_err_);
      return;
    case Timer::data_redial:
      if (dialling_data_) out_.push_back(data_dial(opt_.connect_timeout_ms, false));
      else if (resuming_data_) out_.push_back(data_dial(kRedialAttemptMs, true));
      return;
    case Timer::data_reconnect:
      if (!resuming_data_) return;
      resuming_data_ = false;
      cancel(Timer::data_redial);
      note(Severity::warn, "data", fmt::format("no host took the data channel within {} ms; its output is discarded from now on",
                                               boot_->reconnect_ms));
      out_.push_back(act::DataGiveUp{});
      return;
    case Timer::drain:
      // The window counts only while nothing of the output waits for the host: ask what is held.
      if (held_exit_) out_.push_back(act::CheckHeld{0});
      return;
    case Timer::flush_idle:
    case Timer::flush_cap:
      if (stage_ != Stage::flush || flush_held_) return;
      if (flush_data_owed_)
        note(Severity::warn, "halt", fmt::format("{} byte(s) of the workload's output not sent before power-off",
                                                 flush_output_bytes_));
      // One more bounded round for the output_end lines themselves.
      if (account_workload(last_flush_.out, last_flush_.err,
                           t.timer == Timer::flush_cap ? "the flush's 15 s bound is over"
                                                       : "nothing was written for 1 s and no live host holds the flush")) {
        flush_data_owed_ = false;
        return arm(Timer::flush_idle, kFlushIdleMs);
      }
      enter_final();
      return;
    case Timer::exec_drain:
      // Every exec'd process reaped and still waiting for its output: reported once it holds
      // nothing more (CheckHeld's answer), else its window starts again.
      for (const ExecState& x : execs_)
        if (x.held) out_.push_back(act::CheckHeld{x.proc});
      return;
    case Timer::ack:
      note(Severity::warn, "ack", fmt::format("no acknowledgement within {} ms", opt_.ack_timeout_ms));
      if (keeps_outcome()) {
        // A host that stalls past the ack timeout may be dying: the outcome must outlive it. So,
        // within the reconnect window, a missing ack is a lost channel: close it, redial, and
        // hand the outcome to whichever host answers (a resumed `ready`, the outcome again),
        // until one acknowledges it or the window (counted from the first such timeout) ends.
        if (!armed_[static_cast<int>(Timer::ack_window)]) arm(Timer::ack_window, boot_->reconnect_ms);
        channel_open_ = false;
        out_.push_back(act::CloseChannel{});
        return begin_reconnect();
      }
      ack_expired_ = true;
      if (stage_ == Stage::await_ack) enter_await_ack();
      return;
    case Timer::ack_window:
      // The outcome was kept for the whole window and no host acknowledged it: today's end.
      ack_window_over_ = true;
      note(Severity::warn, "ack", fmt::format("no host acknowledged the outcome within {} ms", boot_->reconnect_ms));
      ack_expired_ = true;
      if (reconnecting_) {
        reconnecting_ = false;
        cancel(Timer::reconnect);
        cancel(Timer::redial);
      }
      if (stage_ == Stage::await_ack) enter_await_ack();
      return;
  }
}

void Session::on(const ev::NoChildren&) {
  if (!waiting_for_children()) return;
  cancel(Timer::all_grace);
  cancel(Timer::all_kill);
  note(Severity::info, "shutdown", "no processes left");
  enter_await_ack();
}

// ---- ordered shutdown ------------------------------------------------------------------------------

void Session::begin_shutdown(std::string reason) {
  if (phase_ == Phase::shutting_down || phase_ == Phase::done) return;
  phase_ = Phase::shutting_down;
  cancel(Timer::boot);
  if (dialling_data_) {
    // Nothing will be mounted or started now: the data channel is not needed.
    end_data_dial();
    note(Severity::info, "data", "dialling abandoned: shutting down");
  }
  note(Severity::info, "shutdown", fmt::format("begin: {}", reason));
  if (outcome_ && !acked_ && channel_open_ && !ack_armed_) {
    arm(Timer::ack, opt_.ack_timeout_ms);
    ack_armed_ = true;
  }
  stage_ = Stage::workload_term;
  if (workload_pid_ <= 0) return enter_all_term();
  // Step 1: the workload's group gets its one SIGTERM (unless already sent), then up to grace_ms
  // (counted from that first SIGTERM), then SIGKILL.
  if (!term_sent_) {
    note(Severity::info, "term-workload", "SIGTERM to the workload's group");
    term_workload();
  } else if (grace_expired_) {
    note(Severity::info, "kill-workload", "grace since the earlier SIGTERM is over: SIGKILL to its group");
    out_.push_back(act::SignalGroup{SIGKILL, workload_pid_});
    stage_ = Stage::workload_kill;
    arm(Timer::workload_kill, kKillWaitMs);
  } else {
    note(Severity::info, "term-workload", "SIGTERM already sent; waiting out its grace");
  }
}

void Session::enter_all_term() {
  // Step 2: everything else (orphans, daemons the workload left behind).
  stage_ = Stage::all_term;
  note(Severity::info, "term-all", "SIGTERM to all remaining processes");
  out_.push_back(act::SignalAll{SIGTERM});
  arm(Timer::all_grace, opt_.grace_ms);
}

void Session::report_held_exit() {
  proto::WorkloadExited w = *held_exit_;
  held_exit_.reset();
  settle(w);
  if (stage_ == Stage::await_ack) enter_await_ack();
}

void Session::enter_await_ack() {
  stage_ = Stage::await_ack;
  // A reaped workload's outcome still waiting for its output: the drain timer bounds the wait.
  if (held_exit_) return note(Severity::info, "ack", "waiting for the workload's output to end");
  // Power off only once the outcome is safe: acknowledged by `shutdown`, or nobody is listening
  // (EOF), or ack_timeout_ms passed, or there is nothing to acknowledge.
  if (reconnecting_ && outcome_ && !acked_)
    return note(Severity::info, "ack", "waiting for the channel to come back (reconnect window)");
  if (!outcome_ || acked_ || !channel_open_ || ack_expired_) return enter_flush();
  note(Severity::info, "ack", "waiting for the host's acknowledgement");
}

void Session::enter_flush() {
  // The last lines (the outcome) and the workload's last output leave before the channels close.
  // A host that acknowledged the outcome is alive: its receipt is awaited for as long as it stays
  // connected, however slowly its reader takes the output (a live host is never timed out: only
  // it knows its reader, and it ends the wait itself by closing the data channel). Without that
  // proof the wait is bounded: kFlushIdleMs without progress, kFlushMaxMs in all.
  stage_ = Stage::flush;
  // A data channel being redialled (resume) keeps its redial and its window: what its rings
  // hold is owed to the next host (the flush waits for it, Flushing.data_unsent), and powering
  // off without redialling would lose it uncounted by any host that took over meanwhile.
  for (int i = 0; i < kTimerCount; ++i) {
    const auto t = static_cast<Timer>(i);
    if (resuming_data_ && (t == Timer::data_redial || t == Timer::data_reconnect)) continue;
    if (armed_[i]) cancel(t);
  }
  out_.push_back(act::Flush{});
  flush_held_ = acked_ && channel_open_;
  if (flush_held_) return note(Severity::info, "halt", "holding power-off for the host's receipt (it acknowledged the outcome)");
  bound_flush();
}

void Session::bound_flush() {
  flush_held_ = false;
  arm(Timer::flush_idle, kFlushIdleMs);
  arm(Timer::flush_cap, kFlushMaxMs);
}

void Session::on(const ev::Flushing& f) {
  if (stage_ != Stage::flush) return;
  last_flush_ = f;
  if (flush_held_ && !f.channel_open) {
    note(Severity::warn, "halt", "the host hung up while its receipt was awaited; the flush is bounded from now on");
    bound_flush();
  }
  // Written is not received: bytes in the VMM's queues die with the VM. The host closes the data
  // channel once it has every output stream's EOF: that close is the receipt. A close before it
  // (the host ended the wait on purpose) gives up what is left, counted in output_end.
  const bool data_pending = f.data_unsent || !f.outputs_done;
  const bool given_up = f.data_open && f.receipt && data_pending;
  flush_data_owed_ = f.data_open && !given_up && (data_pending || !f.receipt);
  flush_output_bytes_ = f.output_bytes;
  if (f.control_queued || flush_data_owed_) {
    if (f.written > 0 && !flush_held_) arm(Timer::flush_idle, kFlushIdleMs);
    return;
  }
  // Nothing owed: the accounts not sent yet go first (the next report says they are out).
  if (account_workload(f.out, f.err, given_up ? "the host closed the data channel before the output's end" : "")) {
    if (flush_held_) bound_flush();
    return;
  }
  enter_final();
}

bool Session::account_workload(const ev::OutputAccount& out, const std::optional<ev::OutputAccount>& err,
                               std::string_view why) {
  if (workload_accounted_ || !data_up_ || !boot_ || !boot_->stdio) return false;
  workload_accounted_ = true;
  acct_out_ = out;
  acct_err_ = err;
  acct_before_outcome_ = channel_open_ && !outcome_;
  acct_logged_ = send_accounts(0, out, err, why);
  return channel_open_ && (stage_ != Stage::flush || last_flush_.channel_open);
}

unsigned Session::send_accounts(std::uint16_t proc, const ev::OutputAccount& out,
                                const std::optional<ev::OutputAccount>& err, std::string_view why) {
  unsigned logged = 0;
  for (proto::Stream s : {proto::Stream::out, proto::Stream::err}) {
    if (s == proto::Stream::err && !err) continue;
    const ev::OutputAccount& a = s == proto::Stream::out ? out : *err;
    // At EOF (`why` empty) only bytes thrown away are given up; else also a stream not at its end.
    if (a.unsent > 0 || (!why.empty() && !a.eof_framed)) {
      note(Severity::warn, proc == 0 ? "output" : "exec",
           fmt::format("{}{}: {} byte(s) given up, {} sent: {}", proc == 0 ? "" : fmt::format("process {} ", proc),
                       proto::to_string(s), a.unsent, a.sent, why.empty() ? "the data channel closed before its end" : why));
      logged |= s == proto::Stream::out ? 1u : 2u;
    }
    send(proto::OutputEnd{proc, s, a.sent, a.unsent});
  }
  return logged;
}

void Session::log_unconfirmed_accounts() {
  if (!workload_accounted_ || acct_confirmed_) return;
  for (proto::Stream s : {proto::Stream::out, proto::Stream::err}) {
    const unsigned bit = s == proto::Stream::out ? 1u : 2u;
    if ((acct_logged_ & bit) || (s == proto::Stream::err && !acct_err_)) continue;
    const ev::OutputAccount& a = s == proto::Stream::out ? acct_out_ : *acct_err_;
    note(Severity::warn, "output",
         fmt::format("{}: {} byte(s) given up, {} sent: no host confirmed this account (a host that died lost "
                     "what it had not read of those sent)",
                     proto::to_string(s), a.unsent, a.sent));
    acct_logged_ |= bit;
  }
}

void Session::enter_final() {
  log_unconfirmed_accounts();
  stage_ = Stage::final;
  phase_ = Phase::done;
  for (int i = 0; i < kTimerCount; ++i)
    if (armed_[i]) cancel(static_cast<Timer>(i));
  out_.push_back(act::PowerOff{halt()});
}

}  // namespace nes::init

namespace nes::init {

// ---- exec: more processes beside the workload ------------------------------------------------------

void Session::on_exec(const proto::ExecProcess& x) {
  auto refuse = [&](std::string why) {
    note(Severity::warn, "exec", fmt::format("process {}: {}", x.proc, why));
    send(proto::ExecFailed{x.proc, std::move(why), std::nullopt, proto::StartFailClass::other});
  };
  if (phase_ != Phase::running || workload_pid_ <= 0)
    return refuse(fmt::format("exec: the workload is not running (phase {})", to_string(phase_)));
  for (const ExecState& e : execs_)
    if (e.proc == x.proc) return refuse(fmt::format("exec.proc: process {} is already running", x.proc));
  if (execs_.size() >= proto::kExecMax)
    return refuse(fmt::format("exec: {} processes started by exec are running already (the most)", proto::kExecMax));
  if (x.stdio && !(boot_ && boot_->stdio))
    return refuse("exec.stdio: this session has no data channel (boot.stdio unset)");
  std::int32_t in_pid = 0;
  if (x.in) {
    for (const ExecState& e : execs_)
      if (e.proc == *x.in && e.container && e.pid > 0 && !e.held) in_pid = e.pid;
    if (in_pid <= 0) return refuse(fmt::format("exec.in: no container is running as process {}", *x.in));
  }
  execs_.push_back(ExecState{x.proc, 0, false, std::nullopt, x.container.has_value()});
  note(Severity::info, "exec", fmt::format("process {}: {}{}", x.proc, x.exec.argv.empty() ? "" : x.exec.argv[0],
                                          x.container ? fmt::format(" (container {})", x.container->root)
                                          : x.in ? fmt::format(" (in process {})", *x.in) : std::string()));
  out_.push_back(act::SpawnExec{x.proc, x.exec, boot_ ? boot_->geometry : proto::Geometry{}, x.stdio,
                                x.container, in_pid});
}

void Session::on(const ev::ExecStarted& e) {
  for (ExecState& x : execs_)
    if (x.proc == e.proc) x.pid = e.pid;
  send(proto::ExecStarted{e.proc, e.pid});
}

void Session::on(const ev::ExecFailed& e) {
  std::erase_if(execs_, [&](const ExecState& x) { return x.proc == e.proc; });
  send(proto::ExecFailed{e.proc, e.failure.reason, e.failure.err, e.failure.cls});
  out_.push_back(act::CloseExec{e.proc});
}

void Session::on(const ev::ExecReaped& r) {
  for (std::size_t i = 0; i < execs_.size(); ++i) {
    if (execs_[i].pid != r.pid) continue;
    execs_[i].held = r.status;
    if (execs_[i].outputs_done) return report_exec(i);
    // Its output may still be on its way (a background child can also keep it open): bounded.
    std::uint32_t ms = boot_ && boot_->stdio ? boot_->stdio->drain_ms : proto::kStdioDrainDefaultMs;
    if (!armed_[static_cast<int>(Timer::exec_drain)]) arm(Timer::exec_drain, ms);
    return;
  }
}

void Session::on(const ev::ExecOutputsDone& d) {
  for (std::size_t i = 0; i < execs_.size(); ++i)
    if (execs_[i].proc == d.proc) {
      if (execs_[i].outputs_done) return;
      execs_[i].outputs_done = true;
      if (d.stdio) send_accounts(d.proc, d.out, d.err, "");
      if (execs_[i].held) report_exec(i);
      return;
    }
}

void Session::on(const ev::Held& h) {
  const std::uint32_t ms = boot_ && boot_->stdio ? boot_->stdio->drain_ms : proto::kStdioDrainDefaultMs;
  if (h.proc == 0) {
    if (!held_exit_) return;
    if (h.bytes > 0) return arm(Timer::drain, ms);  // the host is behind: the window starts again
    note(Severity::info, "exited", fmt::format("output not at EOF {} ms after the reap, nothing of it held; reporting", ms));
    return report_held_exit();
  }
  for (std::size_t i = 0; i < execs_.size(); ++i) {
    if (execs_[i].proc != h.proc || !execs_[i].held) continue;
    if (h.bytes > 0) {
      if (!armed_[static_cast<int>(Timer::exec_drain)]) arm(Timer::exec_drain, ms);
      return;
    }
    note(Severity::info, "exec", fmt::format("process {}: output not at EOF after the drain window, nothing of it held; reported", h.proc));
    return report_exec(i);
  }
}

void Session::on(const ev::ExecClosed& c) {
  // Reported before its streams ended (a background holder keeps them open, or the data channel
  // went): their accounts now; what is not framed is given up with them.
  if (c.outputs_done) return;  // accounted when its eofs were framed
  send_accounts(c.proc, c.out, c.err, "reported before the end of its output; the rest is not read");
}

void Session::report_exec(std::size_t i) {
  const ExecState x = execs_[i];
  execs_.erase(execs_.begin() + static_cast<std::ptrdiff_t>(i));
  note(Severity::info, "exec", fmt::format("process {} (pid {}) ended: {}", x.proc, x.pid,
                                          x.held->signal ? fmt::format("signal {}", *x.held->signal)
                                                         : fmt::format("exit {}", *x.held->exit_code)));
  send(proto::ExecExited{x.proc, x.held->exit_code, x.held->signal});
  out_.push_back(act::CloseExec{x.proc});
  bool held = false;
  for (const ExecState& e : execs_) held = held || e.held.has_value();
  if (!held) cancel(Timer::exec_drain);
}

void Session::on_kill_exec(int signo, std::uint16_t proc) {
  for (const ExecState& x : execs_)
    if (x.proc == proc && x.pid > 0 && !x.held) {
      note(Severity::info, "kill", fmt::format("signal {} to process {}'s group", signo, proc));
      out_.push_back(act::SignalGroup{signo, x.pid});
      return;
    }
  // Already ended (its exec_exited may be on its way) or never started: nothing to signal.
  note(Severity::info, "kill", fmt::format("signal {}: no process {} running; nothing to do", signo, proc));
}

}  // namespace nes::init
