#include "host/lib/session.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "host/lib/escape.hpp"
#include "protocol/codec.hpp"
#include "protocol/status.hpp"

namespace nes::host {

namespace {
/// Guest-provided text kept in a record's reason: bounded so a record stays small.
constexpr std::size_t kReasonCap = 1024;
/// Repeated events of one kind (unknown types, lines after the outcome) are logged this often.
constexpr std::uint64_t kLogRepeat = 10;

std::string bounded(std::string_view s) {
  if (s.size() <= kReasonCap) return std::string(s);
  return fmt::format("{}... ({} bytes)", s.substr(0, kReasonCap), s.size());
}
}  // namespace

std::string_view to_string(OnExitPolicy p) {
  switch (p) {
    case OnExitPolicy::stop: return "stop";
    case OnExitPolicy::keep: return "keep";
    case OnExitPolicy::remove: return "remove";
  }
  return "stop";
}

std::optional<OnExitPolicy> on_exit_from_string(std::string_view s) {
  if (s == "stop") return OnExitPolicy::stop;
  if (s == "keep") return OnExitPolicy::keep;
  if (s == "remove") return OnExitPolicy::remove;
  return std::nullopt;
}

Session::Session(SessionConfig cfg) : cfg_(std::move(cfg)) {}

std::vector<Action> Session::take() {
  std::vector<Action> v;
  v.swap(out_);
  return v;
}

void Session::log(std::string kind, std::string detail) {
  // Details carry guest text (reasons, types): escaped here, so no consumer of the event (a
  // terminal, a log file) ever sees a guest's control bytes or a forged line break.
  // Typed once, here, from our own literals: consumers switch on the milestone, not on text.
  act::Milestone m = act::Milestone::other;
  if (kind == "connected") m = act::Milestone::connected;
  else if (kind == "ready") m = act::Milestone::ready;
  else if (kind == "started") m = act::Milestone::started;
  else if (kind == "outcome") m = act::Milestone::outcome;
  else if (kind == "recorded") m = act::Milestone::recorded;
  else if (kind == "finished") m = act::Milestone::finished;
  out_.push_back(act::Log{std::move(kind), escape_text(detail), m});
}

void Session::log_guest(std::string kind, std::string detail) {
  // One counter per kind (kinds are a fixed set of literals): a guest repeating one message
  // cannot make the host log more than kLogRepeat lines of it.
  for (auto& [k, n] : guest_logs_)
    if (k == kind) return log_limited(n, std::move(kind), std::move(detail));
  guest_logs_.emplace_back(kind, 0);
  log_limited(guest_logs_.back().second, std::move(kind), std::move(detail));
}

void Session::log_limited(std::uint64_t& counter, std::string kind, std::string detail) {
  ++counter;
  if (counter <= kLogRepeat) log(std::move(kind), std::move(detail));
  else if (counter == kLogRepeat + 1) log(std::move(kind), "further ones are not logged");
}

void Session::send(const proto::HostMessage& m) {
  out_.push_back(act::Send{m});
}

namespace {

/// Why `features` (ready.features; unset: an init that predates it, with none) cannot take the
/// descriptor `cfg` would send, or nullopt if it can: each descriptor field an older init would
/// ignore needs its feature (docs/protocol.md "Features").
std::optional<std::string> missing_feature(const SessionConfig& cfg,
                                           const std::optional<std::vector<std::string>>& features) {
  const proto::Boot& d = cfg.descriptor;
  auto has = [&](std::string_view f) {
    return features && std::find(features->begin(), features->end(), f) != features->end();
  };
  const bool other_fs = std::any_of(d.mounts.begin(), d.mounts.end(),
                                    [](const proto::Mount& m) { return m.fs != proto::FsType::virtiofs; });
  struct Need {
    bool needed;
    const char* feature;
    const char* field;  // after "boot."
  };
  const Need needs[] = {
      {d.stdio.has_value(), proto::kFeatureStdio, "stdio"},
      {d.root.has_value(), proto::kFeatureRoot, "root"},
      {d.root && proto::is_block_fs(d.root->fs), proto::kFeatureRootBlock, "root.fs"},
      {d.network.has_value(), proto::kFeatureNetwork, "network"},
      {cfg.reconnect.count() > 0, proto::kFeatureReconnect, "reconnect_ms"},
      {!d.exec.groups.empty(), proto::kFeatureGroups, "exec.groups"},
      {other_fs, proto::kFeatureMountFs, "mounts[].fs"},
      {d.hostname.has_value(), proto::kFeatureHostname, "hostname"},
      {d.on_exit.halt.has_value(), proto::kFeatureHalt, "on_exit.halt"},
      {d.entropy.has_value(), proto::kFeatureEntropy, "entropy"},
      {d.realtime_ns.has_value(), proto::kFeatureRealtime, "realtime_ns"},
  };
  for (const Need& n : needs)
    if (n.needed && !has(n.feature))
      return fmt::format("the guest's init lacks feature '{}' that this descriptor needs (boot.{}); "
                         "an init without it would ignore the field: update the guest's init",
                         n.feature, n.field);
  return std::nullopt;
}

}  // namespace

void Session::send_boot(WallTime now) {
  stream_.link = Link::booted;
  reach(Phase::booted);
  proto::Boot b = cfg_.descriptor;
  // Fencing: the guest echoes the generation in every line after this one (docs/protocol.md).
  b.generation = cfg_.generation;
  if (cfg_.reconnect.count() > 0) {
    b.reconnect_ms = static_cast<std::uint32_t>(
        std::min<std::int64_t>(cfg_.reconnect.count(), proto::kReconnectMaxMs));
    b.vm = cfg_.vm;
    // Data channel resume rides on channel survival (docs/protocol.md "Data channel resume").
    if (b.stdio && data_resume_) {
      if (b.stdio->replay_bytes == 0)
        b.stdio->replay_bytes = std::max<std::uint32_t>(b.stdio->buffer_bytes, kReplayBytesDefault);
      replay_bytes_ = b.stdio->replay_bytes;
    }
  }
  // The host's policy always wins over what the descriptor said: under `keep` the workload's
  // exit must not power the VM off, so the guest waits for our `shutdown`.
  b.on_exit.terminal = cfg_.on_exit != OnExitPolicy::keep;
  // The guest's clock, when asked for (a restored snapshot's is the saved moment's): as it is now.
  if (b.realtime_ns) b.realtime_ns = static_cast<std::uint64_t>(now.time_since_epoch().count());
  send(b);
  log("boot_sent", fmt::format("terminal={}", b.on_exit.terminal));
  // The workload's limit starts with the one boot (a restarted guest gets no second arming):
  // an earlier v2 guest never sends `started`, and the mounts must be bounded too.
  if (cfg_.wall_timeout && cfg_.wall_from_started && !wall_at_boot_ && !outcome_) {
    wall_at_boot_ = true;
    arm(TimerKind::wall, *cfg_.wall_timeout);
  }
}

void Session::close_stream() {
  if (!stream_open()) return;
  stream_.link = Link::closed;
  out_.push_back(act::CloseStream{});
  end_all_execs("the guest's stream closed before the process's end was reported");
}

void Session::vm_started(WallTime now) {
  if (started_at_) return;
  started_at_ = cfg_.started_at.value_or(now);
  log("vm_started", "");
  if (outcome_) return;
  if (phase_ < Phase::ready) arm(TimerKind::ready, cfg_.ready_timeout);
  if (cfg_.resume && cfg_.wall_timeout && cfg_.wall_left) {
    // A takeover: the deadline the first host armed, not a new one.
    arm(TimerKind::wall, std::max(*cfg_.wall_left, std::chrono::milliseconds(0)));
    log("wall_rearmed", fmt::format("{} ms left of the {} ms limit", std::max<std::int64_t>(cfg_.wall_left->count(), 0),
                                    cfg_.wall_timeout->count()));
  } else if (cfg_.wall_timeout && !cfg_.wall_from_started) {
    arm(TimerKind::wall, *cfg_.wall_timeout);
  }
}

bool Session::stream_opened(WallTime now) {
  if (stream_open()) {
    log_guest("refused", "a session for this VM is already live");
    return false;
  }
  if (finished()) {
    log_guest("refused", "this VM generation is finished");
    return false;
  }
  // A stream after the outcome can only be the guest redialling to deliver or hear the ack of it.
  if (outcome_ && !awaiting_redial_) {
    log_guest("refused", "this VM generation already has its outcome");
    return false;
  }
  stream_ = StreamState{};
  stream_.link = Link::connected;
  lines_ = 0;
  overflowed_ = false;
  log_guest("connected", "");
  if (cfg_.saved_ready && !ready_taken_) {
    // A restored guest's `ready` came before its snapshot was saved: it is the first stream's
    // first line (a later stream is a redial: the guest speaks for itself).
    ready_taken_ = true;
    proto::Line l;
    l.text = *cfg_.saved_ready;
    l.length = l.text.size();
    line(l, now);
    return stream_open();  // the saved line may have ended it (a version mismatch)
  }
  return true;
}

void feed_lines(Session& s, proto::LineReader& reader, std::string_view bytes, WallTime now) {
  reader.feed(bytes);
  while (auto l = reader.next()) s.line(*l, now);
  if (reader.dropping()) s.line_overflow(now);
}

void Session::line(const proto::Line& l, WallTime now) {
  if (!stream_open()) return;  // a violation closed the stream: act on nothing after it
  ++lines_;
  overflowed_ = false;
  if (l.kind == proto::Line::Kind::too_long) {
    protocol_violation(fmt::format("line {}: {} bytes, longer than the {}-byte cap", lines_,
                                   l.length, cfg_.line_cap),
                       now);
    return;
  }
  proto::GuestEnvelope env;
  auto decoded = proto::decode_guest(l.text, env);
  if (auto* err = std::get_if<proto::DecodeError>(&decoded)) {
    protocol_violation(fmt::format("line {}: {}", lines_, bounded(err->reason)), now);
  } else if (auto* unk = std::get_if<proto::UnknownMessage>(&decoded)) {
    log_limited(unknown_, "skipped", fmt::format("unknown type '{}'", bounded(unk->type)));
  } else {
    const auto& m = std::get<proto::GuestMessage>(decoded);
    // Fencing: a line naming another generation is not this session's (a guest of an earlier
    // or later boot of this VM): nothing of it is acted on or recorded, and the stream goes as
    // if lost. A line without the field (an older init) is taken as before. A resumed `ready`
    // whose envelope agrees with its `resume` is judged by handle_resume (it names the VM too).
    const auto* ready = std::get_if<proto::Ready>(&m);
    const bool by_resume = ready && ready->resume && (!env.generation || *env.generation == ready->resume->generation);
    if (env.generation && *env.generation != cfg_.generation && !by_resume)
      return refuse_stream("generation_refused",
                           fmt::format("line {}: {}.generation: expected {} (this session's), got {}; "
                                       "nothing of it is recorded",
                                       lines_, proto::type_name(m), cfg_.generation, *env.generation),
                           now);
    handle_message(m, now);
  }
}

void Session::refuse_stream(std::string kind, std::string why, WallTime now) {
  const StreamState was = stream_;
  std::string cause = fmt::format("the host refused the guest's stream ({}: {})", kind, why);
  log_guest(std::move(kind), std::move(why));
  close_stream();
  after_stream_loss(was, 0, now, std::move(cause));
}

void Session::line_overflow(WallTime now) {
  // An endless line (no '\n' ever) must not wait for a newline to be judged: the reader already
  // drops its bytes; the session ends as soon as the cap is passed, once per line.
  if (!stream_open() || overflowed_) return;
  overflowed_ = true;
  protocol_violation(fmt::format("line {}: more than {} bytes without a newline", lines_ + 1,
                                 cfg_.line_cap),
                     now);
}

void Session::protocol_violation(std::string reason, WallTime now) {
  if (outcome_) {
    // The outcome is final: a misbehaving stream after it is only worth a log line.
    log_limited(ignored_, "protocol_error_after_outcome", std::move(reason));
    return;
  }
  finalize(proto::Outcome::protocol_error, std::nullopt, std::nullopt, std::nullopt,
           std::move(reason), now);
  close_stream();
}

void Session::handle_ready(const proto::Ready& r, WallTime now) {
  // A resumed `ready` on a stream that already had one: the guest redialled a virtio port whose
  // host side never went away, or gave up waiting for an ack on it (docs/protocol.md "Channel
  // survival"): judged as any resume, not as a guest that started over. A resumed `ready` lists
  // the features too: a host taking over (re-adoption) learns them from it.
  if (r.resume) {
    features_ = r.features;
    return handle_resume(*r.resume, now);
  }
  if (!link_at_least(Link::ready) && (cfg_.resume || awaiting_redial_ || phase_ >= Phase::booted)) {
    // A fresh `ready` where a resumed one was expected: the guest restarted (or another one
    // dialled); the workload this generation booted is gone with it. A fresh `ready` on a new
    // stream after this session booted is the same, even once nobody waits for a redial (the VM
    // exited meanwhile): one boot per session, never a second.
    log_guest("resume_expected", "a fresh `ready` instead of a resumed one");
    if (!outcome_)
      finalize(proto::Outcome::channel_lost, std::nullopt, std::nullopt, std::nullopt,
               "the guest came back without resuming its session (restarted?)", now);
    close_stream();
    return;
  }
  if (link_at_least(Link::ready)) {
    // virtio-serial has no connection events: a second fresh `ready` on the stream is a guest
    // that started over (a reboot, a crash of its init) in this same generation. Its workload is
    // gone, and booting it again would run the workload again without limit: refused. The
    // outcome is recorded once (`channel_lost`, unless one exists), and the guest, now waiting
    // for a boot, gets `shutdown` (a request: it reported nothing) once that record is durable.
    const bool booted = stream_.link == Link::booted;
    stream_ = StreamState{};
    stream_.link = Link::ready;
    log_guest("guest_restarted",
              fmt::format("protocol error: a second `ready` on this stream in generation {}: the guest "
                          "started over; not booted again",
                          cfg_.generation));
    if (!outcome_)
      lost(fmt::format("the guest started over (a second `ready` on its stream{}): its workload is gone; "
                       "not booted again",
                       booted ? " after `boot`" : ""),
           now);
    maybe_send_shutdown();  // before boot, and only once the outcome is durable
    return;
  } else if (outcome_) {
    log_limited(ignored_, "ignored_after_outcome", "ready");
    return;
  }
  stream_.link = Link::ready;
  reach(Phase::ready);
  out_.push_back(act::CancelTimer{TimerKind::ready});
  if (r.protocol_version != proto::kProtocolVersion) {
    finalize(proto::Outcome::version_mismatch, std::nullopt, std::nullopt, std::nullopt,
             fmt::format("guest speaks protocol version {}; this host speaks version {}",
                         r.protocol_version, proto::kProtocolVersion),
             now);
    close_stream();
    return;
  }
  features_ = r.features;
  if (auto lacking = missing_feature(cfg_, r.features)) {
    finalize(proto::Outcome::version_mismatch, std::nullopt, std::nullopt, std::nullopt, *lacking, now);
    close_stream();
    return;
  }
  data_resume_ = cfg_.data_resume && r.features && std::find(r.features->begin(), r.features->end(),
                                         std::string_view(proto::kFeatureDataResume)) != r.features->end();
  log_guest("ready", fmt::format("protocol_version={}", r.protocol_version));
  if (ending_ != Ending::none) {
    // Shut down before anything ran: no boot descriptor.
    maybe_send_shutdown();
    return;
  }
  send_boot(now);
  if (stop_pending_) {
    send(proto::Stop{});
    stop_pending_ = false;
    stream_.stop_sent = true;
    log("stop_sent", "requested before boot");
  }
}

void Session::handle_message(const proto::GuestMessage& m, WallTime now) {
  if (auto* r = std::get_if<proto::Ready>(&m)) return handle_ready(*r, now);
  if (!link_at_least(Link::ready)) {
    protocol_violation(fmt::format("line {}: expected `ready` first, got `{}`", lines_, proto::type_name(m)),
                       now);
    return;
  }
  bool final_kind = std::holds_alternative<proto::MountFailed>(m) ||
                    std::holds_alternative<proto::NetworkFailed>(m) ||
                    std::holds_alternative<proto::StartFailed>(m) ||
                    std::holds_alternative<proto::WorkloadExited>(m);
  if (final_kind && outcome_) {
    // The host's outcome (e.g. its wall limit) stands; the guest now waits for its ack, which the
    // durable record of that outcome allows.
    stream_.reported = true;
    log_limited(ignored_, "ignored_after_outcome", std::string(proto::type_name(m)));
    maybe_send_shutdown();
    return;
  }
  std::visit(
      [&](const auto& msg) {
        using T = std::decay_t<decltype(msg)>;
        if constexpr (std::is_same_v<T, proto::Mounted>) {
          log_guest("mounted", "");
        } else if constexpr (std::is_same_v<T, proto::Started>) {
          log_guest("started", msg.pid ? fmt::format("pid={}", *msg.pid) : std::string());
          // From the first `started` on, the limit is the workload's; later ones never move it.
          if (cfg_.wall_timeout && cfg_.wall_from_started && !outcome_ && !wall_at_started_) {
            wall_at_started_ = true;
            arm(TimerKind::wall, *cfg_.wall_timeout);
          }
        } else if constexpr (std::is_same_v<T, proto::MountFailed>) {
          stream_.reported = true;
          finalize(proto::Outcome::mount_failed, std::nullopt, std::nullopt, std::nullopt,
                   fmt::format("share {} failed to mount{}: {}",
                               msg.tag ? fmt::format("'{}'", bounded(*msg.tag)) : "(unnamed)",
                               msg.err ? fmt::format(" (errno {})", *msg.err) : "",
                               bounded(msg.reason)),
                   now);
        } else if constexpr (std::is_same_v<T, proto::NetworkFailed>) {
          stream_.reported = true;
          finalize(proto::Outcome::network_failed, std::nullopt, std::nullopt, std::nullopt,
                   fmt::format("network: {} {}{}: {}", bounded(msg.interface), bounded(msg.step),
                               msg.err ? fmt::format(" (errno {})", msg.err) : "", bounded(msg.reason)),
                   now);
        } else if constexpr (std::is_same_v<T, proto::StartFailed>) {
          stream_.reported = true;
          finalize(proto::Outcome::start_failed, std::nullopt, std::nullopt, msg.cls,
                   fmt::format("workload failed to start ({}{}): {}", proto::to_string(msg.cls),
                               msg.err ? fmt::format(", errno {}", *msg.err) : "",
                               bounded(msg.reason)),
                   now);
        } else if constexpr (std::is_same_v<T, proto::WorkloadExited>) {
          if (msg.exit_code.has_value() == msg.signal.has_value() ||
              (msg.signal && (*msg.signal < 1 || *msg.signal > 64))) {
            protocol_violation(
                fmt::format("line {}: workload_exited: expected exactly one of exit_code 0..255 "
                            "and signal 1..64",
                            lines_),
                now);
          } else if (msg.exit_code) {
            stream_.reported = true;
            finalize(proto::Outcome::exited, msg.exit_code, std::nullopt, std::nullopt,
                     fmt::format("workload exited with code {}", *msg.exit_code), now);
          } else {
            stream_.reported = true;
            finalize(proto::Outcome::signalled, std::nullopt, msg.signal, std::nullopt,
                     fmt::format("workload killed by signal {}", *msg.signal), now);
          }
        } else if constexpr (std::is_same_v<T, proto::ProtocolError>) {
          log_guest("guest_protocol_error", bounded(msg.reason));
        } else if constexpr (std::is_same_v<T, proto::Processes>) {
          out_.push_back(act::Processes{msg});
        } else if constexpr (std::is_same_v<T, proto::ContainerResourcesReply>) {
          out_.push_back(act::Resources{msg});
        } else if constexpr (std::is_same_v<T, proto::ExecStarted> || std::is_same_v<T, proto::ExecFailed> ||
                             std::is_same_v<T, proto::ExecExited>) {
          exec_report(msg);
        } else if constexpr (std::is_same_v<T, proto::OutputEnd>) {
          out_.push_back(act::OutputEnd{msg});
        }
      },
      m);
}

void Session::handle_resume(const proto::Resume& r, WallTime now) {
  // Who the peer is was decided by the endpoint; the names in `resume` must only agree with it.
  const bool resumable = cfg_.resume || (cfg_.reconnect.count() > 0 && phase_ >= Phase::booted);
  if (!resumable || r.vm != cfg_.vm || r.generation != cfg_.generation)
    return refuse_stream("resume_refused",
                         !resumable ? fmt::format("no session of VM {} to resume here", cfg_.vm)
                                    : fmt::format("the guest resumes VM {} generation {}; this is VM {} generation {}",
                                                  bounded(r.vm), r.generation, cfg_.vm, cfg_.generation),
                         now);
  // On a stream that already carried the session (a virtio port: no connection events), what was
  // sent on it before is void too: the guest awaits the ack of its outcome anew.
  stream_ = StreamState{};
  stream_.link = Link::booted;
  // Its final event follows this line; an outcome this host already holds needs no `stop`, and
  // once durable its ack may go at once (any `shutdown` after the guest's report is the ack).
  stream_.reported = r.outcome_pending && outcome_.has_value();
  reach(Phase::booted);
  awaiting_redial_ = false;
  out_.push_back(act::CancelTimer{TimerKind::ready});
  out_.push_back(act::CancelTimer{TimerKind::reconnect});
  log_guest("resumed", fmt::format("started={} outcome_pending={}", r.started, r.outcome_pending));
  if (stop_pending_) {
    send(proto::Stop{});
    stop_pending_ = false;
    stream_.stop_sent = true;
    log("stop_sent", "requested while the channel was down");
  }
  if (ending_ != Ending::none) {
    request_end();
    maybe_send_shutdown();
  }
}

void Session::finalize(proto::Outcome o, std::optional<std::uint8_t> code,
                       std::optional<std::uint8_t> sig, std::optional<proto::StartFailClass> cls,
                       std::string reason, WallTime now) {
  if (outcome_) return;  // the first final event is the outcome
  Record r;
  r.vm = cfg_.vm;
  r.generation = cfg_.generation;
  r.outcome = o;
  r.exit_code = code;
  r.signal = sig;
  r.exit_status = proto::exit_status(o, code, sig, cls);
  r.reason = std::move(reason);
  r.started_at = started_at_.value_or(now);
  r.finished_at = now;
  outcome_ = r;
  out_.push_back(act::CancelTimer{TimerKind::ready});
  out_.push_back(act::CancelTimer{TimerKind::wall});
  log("outcome", fmt::format("{} exit_status={} reason={}", proto::to_string(o), r.exit_status,
                             r.reason));
  record_ = RecordState::writing;
  out_.push_back(act::WriteRecord{std::move(r)});
}

void Session::record_durable(const Record& on_disk) {
  if (record_ != RecordState::writing) return;
  record_ = RecordState::durable;
  if (outcome_ && on_disk != *outcome_)
    log("already_recorded", fmt::format("generation {} was recorded first: {}", on_disk.generation,
                                        proto::to_string(on_disk.outcome)));
  outcome_ = on_disk;
  log("recorded", fmt::format("{} exit_status={}", proto::to_string(on_disk.outcome),
                              on_disk.exit_status));
  if (stop_phase_ == StopPhase::gave_up) {  // already gave up waiting for the VM
    finish(false);
    return;
  }
  if (cfg_.on_exit == OnExitPolicy::keep && ending_ == Ending::none) {
    log("kept", "the VM stays up until shutdown()");
    maybe_finish();
    return;
  }
  begin_shutdown();
}

void Session::record_failed(std::string error) {
  if (record_ != RecordState::writing) return;
  record_ = RecordState::failed;
  log("record_failed", std::move(error));
  if (stop_phase_ == StopPhase::gave_up) {
    finish(false);
    return;
  }
  if (cfg_.on_exit == OnExitPolicy::keep && ending_ == Ending::none) {
    maybe_finish();
    return;
  }
  begin_shutdown();
}

void Session::record_amended(const Record& on_disk) {
  if (!durable() || !outcome_ || on_disk.vm != cfg_.vm || on_disk.generation != cfg_.generation) return;
  outcome_ = on_disk;
}

void Session::expect_output_reports() { await_reports_ = true; }

void Session::exec_report(const std::variant<proto::ExecStarted, proto::ExecFailed, proto::ExecExited>& r) {
  const std::uint16_t proc = std::visit([](const auto& m) { return m.proc; }, r);
  auto it = execs_.find(proc);
  if (it == execs_.end()) return;  // not ours (late, or never asked for): nothing to tell
  ExecState& x = it->second;
  if (std::holds_alternative<proto::ExecStarted>(r)) {
    if (x.started) return;
    x.started = true;
    out_.push_back(act::CancelExecTimer{proc});
    out_.push_back(act::ExecReport{r});
  } else if (auto* f = std::get_if<proto::ExecFailed>(&r)) {
    out_.push_back(act::ExecReport{r});
    end_exec(proc, *f);
  } else {
    const auto& e = std::get<proto::ExecExited>(r);
    if (e.exit_code.has_value() == e.signal.has_value()) return;  // the decoder refuses these
    x.exited = e;
    out_.push_back(act::ExecReport{r});
    // Its last output may still be on the data channel (another connection): bounded.
    if (x.outputs_done()) end_exec(proc, e);
    else arm_exec(proc, cfg_.data_drain);
  }
}

void Session::data_opened() { data_open_ = true; }

void Session::data_closed(bool outputs_done) {
  data_open_ = false;
  if (!outputs_done) await_reports_ = true;
  // Processes exec() started lose their streams with it: their reports still end them.
  for (auto& [proc, x] : execs_)
    if (x.has_stdio) x.out_eof = x.err_eof = true;
  for (auto it = execs_.begin(); it != execs_.end();) {
    auto cur = it++;
    if (cur->second.exited) end_exec(cur->first, *cur->second.exited);
  }
}

void Session::exec_eof(std::uint16_t proc, proto::Stream stream) {
  auto it = execs_.find(proc);
  if (it == execs_.end()) return;
  (stream == proto::Stream::err ? it->second.err_eof : it->second.out_eof) = true;
  if (it->second.exited && it->second.outputs_done()) end_exec(proc, *it->second.exited);
}

void Session::exec_timer_fired(std::uint16_t proc, DataLinkState data) {
  auto it = execs_.find(proc);
  if (it == execs_.end()) return;
  ExecState& x = it->second;
  if (!x.exited) {
    if (x.started) return;  // a completion that raced its cancel: it runs, its end is reported
    return end_exec(proc, ExecLost{"no answer to exec in time (an init without exec?)"});
  }
  // Its last output may be behind a slow consumer (reads paused) or still on its way (bytes
  // unread in the socket, or read since): the window restarts rather than dropping it.
  if (data.open && data.moving) {
    if (!std::exchange(x.wait_said, true))
      log("exec_output_wait",
          fmt::format("proc={}: its output still moves; its {} ms window restarts", proc, x.window.count()));
    return arm_exec(proc, x.window);
  }
  end_exec(proc, *x.exited);
}

void Session::arm_exec(std::uint16_t proc, std::chrono::milliseconds after) {
  auto it = execs_.find(proc);
  if (it == execs_.end()) return;
  it->second.window = after;
  out_.push_back(act::ArmExecTimer{proc, after});
}

void Session::end_exec(std::uint16_t proc, ExecEnd end) {
  if (execs_.erase(proc) == 0) return;
  out_.push_back(act::ExecEnded{proc, std::move(end)});
}

void Session::end_all_execs(const std::string& why) {
  while (!execs_.empty()) {
    auto it = execs_.begin();
    if (it->second.exited) end_exec(it->first, *it->second.exited);
    else end_exec(it->first, ExecLost{why});
  }
}

void Session::arm(TimerKind k, std::chrono::milliseconds after) {
  if (k == TimerKind::stop) stop_after_ = after;
  out_.push_back(act::ArmTimer{k, after});
}

void Session::begin_shutdown() {
  raise(Ending::policy);
  request_end();
  maybe_send_shutdown();
  if (!vm_exited_ && stop_phase_ == StopPhase::idle) {
    // The stop deadline covers the grace a running workload gets before `shutdown` goes out.
    stop_phase_ = StopPhase::awaiting_exit;
    arm(TimerKind::stop, cfg_.stop_timeout + (grace_ == Grace::running ? cfg_.grace : std::chrono::milliseconds(0)));
  }
  maybe_finish();
}

void Session::request_end() {
  // A workload still running gets `stop` (its one SIGTERM) first: the guest then reports how it
  // ended before any `shutdown` exists that it could take for the ack.
  if (!link_at_least(Link::booted) || stream_.reported) return;
  if (!stream_.stop_sent) {
    send(proto::Stop{});
    stream_.stop_sent = true;
    log("stop_sent", fmt::format("ending the workload; shutdown follows within {} ms",
                                 cfg_.grace.count()));
  }
  if (grace_ == Grace::unarmed) {
    grace_ = Grace::running;
    arm(TimerKind::grace, cfg_.grace);
  }
}

void Session::maybe_send_shutdown() {
  if (ending_ == Ending::none || !link_at_least(Link::ready)) return;
  // The guest takes any `shutdown` after its final report as the ack that the outcome is durable
  // (docs/protocol.md "Outcome finality"). So while an outcome exists that is not durable, nothing
  // goes out; a record that failed is never acknowledged (the guest powers off after its own
  // ack_timeout_ms and the stop deadline bounds the wait for that).
  if (outcome_ && !durable()) return;
  if (stream_.reported) {
    if (stream_.shutdown == ShutdownSent::ack) return;
    send(proto::Shutdown{});
    stream_.shutdown = ShutdownSent::ack;
    log("shutdown_sent", "ack of the recorded outcome");
    return;
  }
  if (stream_.shutdown != ShutdownSent::none) return;
  // A booted guest that has not reported: `stop` went out; the `shutdown` follows the grace.
  const bool booted = link_at_least(Link::booted);
  if (booted && grace_ != Grace::over) return;
  send(proto::Shutdown{});
  stream_.shutdown = ShutdownSent::request;
  log("shutdown_sent", booted ? "requested: the grace after stop is over" : "before boot");
}

void Session::lost(std::string reason, WallTime now) {
  if (ending_ == Ending::host_before_outcome)
    finalize(proto::Outcome::stopped, std::nullopt, std::nullopt, std::nullopt,
             fmt::format("the host ended the session and the guest reported no outcome ({})", reason),
             now);
  else
    finalize(proto::Outcome::channel_lost, std::nullopt, std::nullopt, std::nullopt,
             std::move(reason), now);
}

void Session::maybe_finish() {
  if (finished() || !vm_exited_ || !record_settled()) return;
  finish(true);
}

void Session::finish(bool allow_remove) {
  if (finished()) return;
  // The remove hook deletes the VM's resources: only once the record is durable and the VM is
  // known (from the embedder) to be gone.
  if (allow_remove && cfg_.on_exit == OnExitPolicy::remove && durable() && vm_exited_) {
    out_.push_back(act::CallRemove{});
    log("remove", "");
  }
  close_stream();
  // Nothing can happen any more: no timer of this session stays armed (the reconnect window's
  // included, e.g. after giving up on a VM that never exited).
  for (std::size_t k = 0; k < kTimerKinds; ++k) out_.push_back(act::CancelTimer{static_cast<TimerKind>(k)});
  end_all_execs("the session is over");
  phase_ = Phase::finished;
  out_.push_back(act::Finished{});
  log("finished", "");
}

bool Session::stop_deadline_on_output(DataLinkState data) {
  // The stop deadline meets an open data channel. Output that still moves is a live guest
  // delivering to a live consumer: the deadline restarts as it was armed (the mirror of the
  // init's drain window), unless the host ends this VM on purpose (shutdown(), the wall limit),
  // whose deadline is kept. A channel at rest, or one the host ends, is cut once the outcome is
  // in (or the host asked: a workload blocked on output no longer read is let go, the rest
  // counted, so it can end and be reported before the destroy), and the guest gets data_drain
  // to count what it could not deliver and power off before the deadline runs its course.
  if (!data.open) return false;
  if (ending_ < Ending::host && data.moving) {
    if (!std::exchange(stop_deferred_said_, true))
      log("stop_deferred", fmt::format("the workload's output is still being read; the stop deadline "
                                       "restarts ({} ms) while it moves",
                                       stop_after_.count()));
    arm(TimerKind::stop, stop_after_);
    return true;
  }
  if (vm_exited_ || (!outcome_ && ending_ < Ending::host)) return false;
  out_.push_back(act::CutOutput{
      ending_ < Ending::host
          ? fmt::format("the guest did not power off within the stop deadline ({} ms)", stop_after_.count())
      : outcome_ && outcome_->outcome == proto::Outcome::timeout
          ? std::string("the VM reached its time limit while its output was still being read")
          : std::string("the VM was stopped while its output was still being read")});
  arm(TimerKind::stop, cfg_.data_drain);
  return true;
}

void Session::timer_fired(TimerKind k, WallTime now, DataLinkState data) {
  switch (k) {
    case TimerKind::ready:
      if (phase_ < Phase::ready && !outcome_) {
        finalize(proto::Outcome::no_ready, std::nullopt, std::nullopt, std::nullopt,
                 fmt::format("no `ready` within {} ms of vm_started", cfg_.ready_timeout.count()),
                 now);
        close_stream();
      }
      break;
    case TimerKind::wall:
      if (outcome_) break;
      finalize(proto::Outcome::timeout, std::nullopt, std::nullopt, std::nullopt,
               fmt::format("still running at the host's {} ms limit", cfg_.wall_timeout->count()),
               now);
      // The limit ends the workload whatever the policy: `stop`, grace, `shutdown`.
      raise(Ending::host);
      begin_shutdown();
      break;
    case TimerKind::grace:
      if (grace_ != Grace::running) break;
      grace_ = Grace::over;
      if (!stream_.reported) log("grace_over", fmt::format("no outcome {} ms after stop", cfg_.grace.count()));
      maybe_send_shutdown();
      break;
    case TimerKind::reconnect:
      if (!awaiting_redial_ || link_at_least(Link::ready)) break;
      awaiting_redial_ = false;
      if (!outcome_)
        lost(fmt::format("channel lost; the guest did not resume within {} ms",
                         (cfg_.reconnect + kReconnectSlack).count()),
             now);
      maybe_finish();
      break;
    case TimerKind::stop:
      stop_deadline(now, data);
      break;
  }
}

void Session::stop_deadline(WallTime now, DataLinkState data) {
  if (stop_deadline_on_output(data)) return;
  if (vm_exited_) {
    // Lines still arriving are the guest's last ones, read late by a loaded host: wait on (what
    // a VM that is gone left queued is finite), at most kExitRestartsMax more deadlines.
    if (stream_open() && !outcome_ && lines_ != lines_at_exit_arm_ && exit_restarts_ < kExitRestartsMax) {
      lines_at_exit_arm_ = lines_;
      ++exit_restarts_;
      log("stop_deferred", fmt::format("the VM exited and its last lines are still being read; the stop deadline "
                                       "restarts ({} ms, {} of {})",
                                       cfg_.stop_timeout.count(), exit_restarts_, kExitRestartsMax));
      arm(TimerKind::stop, cfg_.stop_timeout);
      return;
    }
    // The VM is gone but its stream never reached EOF: stop waiting for late bytes.
    if (!outcome_) lost("VM exited; its channel stayed open and no outcome arrived", now);
    close_stream();
    maybe_finish();
    return;
  }
  if (stop_phase_ == StopPhase::awaiting_exit) {
    stop_phase_ = StopPhase::destroyed;
    log("destroy", fmt::format("no vm_exited {} ms after shutdown", cfg_.stop_timeout.count()));
    out_.push_back(act::CallDestroy{});
    arm(TimerKind::stop, cfg_.stop_timeout);
  } else if (stop_phase_ == StopPhase::destroyed) {
    stop_phase_ = StopPhase::gave_up;
    log("gave_up", fmt::format("no vm_exited {} ms after destroy", cfg_.stop_timeout.count()));
    if (!outcome_) lost("VM did not exit and no outcome arrived", now);
    if (record_settled()) finish(false);
  }
}

void Session::vm_exited(WallTime now) {
  if (vm_exited_) return;
  vm_exited_ = true;
  log("vm_exited", "");
  out_.push_back(act::CancelTimer{TimerKind::ready});
  out_.push_back(act::CancelTimer{TimerKind::stop});
  if (awaiting_redial_) {
    awaiting_redial_ = false;  // nobody is left to redial
    out_.push_back(act::CancelTimer{TimerKind::reconnect});
  }
  if (stream_open() && (!outcome_ || await_reports_)) {
    // Bytes the guest wrote just before power-off may still be queued ahead of the EOF: read
    // them first (bounded by the stop deadline, which restarts while lines still arrive) so a
    // reported outcome, or its count of the output it could not deliver, is never lost.
    lines_at_exit_arm_ = lines_;
    arm(TimerKind::stop, cfg_.stop_timeout);
    return;
  }
  if (!outcome_) lost(phase_ >= Phase::ready ? "VM exited before reporting an outcome" : "VM exited before `ready`", now);
  maybe_finish();
}

void Session::stream_closed(std::size_t unfinished, WallTime now) {
  if (!stream_open()) return;
  const StreamState was = stream_;
  stream_.link = Link::closed;
  log_guest("disconnected", unfinished > 0 ? "in the middle of a line" : "");
  after_stream_loss(was, unfinished, now);
}

void Session::after_stream_loss(const StreamState& was, std::size_t unfinished, WallTime now,
                                std::string cause) {
  bool partial = unfinished > 0;
  bool had_session = was.link >= Link::ready;
  if (!had_session && !outcome_) {
    // No `ready` on this stream: it carried no session (a stale-path probe, a peer that gave up).
    // The ready deadline and vm_exited still bound the wait; another stream may come.
    log_guest("no_session", "stream closed before `ready`");
    if (vm_exited_) {
      lost(phase_ >= Phase::ready ? "VM exited before reporting an outcome" : "VM exited before `ready`", now);
      maybe_finish();
    }
    return;
  }
  if (cfg_.reconnect.count() > 0 && was.link == Link::booted && was.shutdown != ShutdownSent::ack &&
      !vm_exited_ && !finished()) {
    // Channel survival: the guest redials and resumes; nothing is decided until the window ends.
    awaiting_redial_ = true;
    log_guest("awaiting_redial", fmt::format("up to {} ms", (cfg_.reconnect + kReconnectSlack).count()));
    arm(TimerKind::reconnect, cfg_.reconnect + kReconnectSlack);
    return;
  }
  if (!outcome_) {
    std::string why = !cause.empty() ? std::move(cause)
                      : partial      ? fmt::format("channel closed in the middle of line {} ({} bytes)",
                                                   lines_ + 1, unfinished)
                                     : std::string("channel closed before an outcome");
    lost(std::move(why), now);
  }
  maybe_finish();
}

bool Session::set_terminal_size(std::uint16_t rows, std::uint16_t cols) {
  auto& st = cfg_.descriptor.stdio;
  if (phase_ >= Phase::booted || rows < 1 || cols < 1 || !st || !st->terminal) return false;
  st->terminal->rows = rows;
  st->terminal->cols = cols;
  return true;
}

Status Session::stop() {
  if (finished()) return Error{"stop: the session is over"};
  if (outcome_) return Error{fmt::format("stop: the workload already ended ({})",
                                         proto::to_string(outcome_->outcome))};
  if (link_at_least(Link::ready)) {
    send(proto::Stop{});
    stream_.stop_sent = true;
    log("stop_sent", "");
  } else {
    stop_pending_ = true;
    log("stop_pending", "sent right after the boot descriptor");
  }
  return Ok{};
}

Status Session::kill(int signal) {
  if (signal < 1 || signal > 64) return Error{fmt::format("signal: expected 1..64, got {}", signal)};
  if (finished()) return Error{"kill: the session is over"};
  if (!link_at_least(Link::ready)) return Error{"kill: no booted session to signal"};
  send(proto::Kill{static_cast<std::uint8_t>(signal)});
  log("kill_sent", fmt::format("signal={}", signal));
  if (outcome_ && data_open_)
    out_.push_back(act::CutOutput{
        fmt::format("the VM was killed (signal {}) while its output was still being read", signal)});
  return Ok{};
}

Status Session::exec(const proto::ExecProcess& x) {
  if (finished()) return Error{"exec: the session is over"};
  if (!link_at_least(Link::booted)) return Error{"exec: no booted session"};
  if (outcome_) return Error{"exec: the workload has ended"};
  if (auto ok = proto::validate(proto::HostMessage{x}); !ok) return Error{ok.error().reason};
  if ((x.container || x.in) &&
      !(features_ && std::find(features_->begin(), features_->end(), proto::kFeatureContainer) != features_->end()))
    return Error{fmt::format("exec.{}: the guest's init does not implement containers (no \"{}\" in ready.features)",
                             x.container ? "container" : "in", proto::kFeatureContainer)};
  // An init without it would run the container without its volumes, and say nothing.
  if (x.container && !x.container->mounts.empty() &&
      !(features_ && std::find(features_->begin(), features_->end(), proto::kFeatureContainerMounts) != features_->end()))
    return Error{fmt::format("exec.container.mounts: the guest's init does not implement a container's mounts (no \"{}\" "
                             "in ready.features): update the guest's init",
                             proto::kFeatureContainerMounts)};
  // An init without it would start the container with no limits of its own, and say nothing.
  if (x.container && x.container->resources &&
      !(features_ && std::find(features_->begin(), features_->end(), proto::kFeatureResources) != features_->end()))
    return Error{fmt::format("exec.container.resources: the guest's init does not implement a container's cgroup "
                             "(no \"{}\" in ready.features): update the guest's init",
                             proto::kFeatureResources)};
  // An init without it would run the process with only its gid, and say nothing.
  if (!x.exec.groups.empty() &&
      !(features_ && std::find(features_->begin(), features_->end(), proto::kFeatureGroups) != features_->end()))
    return Error{fmt::format("exec.groups: the guest's init does not implement supplementary groups (no \"{}\" in "
                             "ready.features): update the guest's init",
                             proto::kFeatureGroups)};
  send(x);
  execs_[x.proc] = ExecState{x.stdio.has_value(), x.stdio && x.stdio->terminal};
  arm_exec(x.proc, cfg_.exec_answer_wait);
  log("exec_sent", fmt::format("proc={} argv0={}", x.proc, x.exec.argv.empty() ? "" : bounded(x.exec.argv[0])));
  return Ok{};
}

Status Session::kill_exec(int signal, std::uint16_t proc) {
  if (signal < 1 || signal > 64) return Error{fmt::format("signal: expected 1..64, got {}", signal)};
  if (finished()) return Error{"kill: the session is over"};
  if (!link_at_least(Link::ready)) return Error{"kill: no booted session to signal"};
  send(proto::Kill{static_cast<std::uint8_t>(signal), proc});
  log("kill_sent", fmt::format("signal={} proc={}", signal, proc));
  return Ok{};
}

Status Session::container_resources(const proto::ContainerResourcesRequest& r) {
  if (finished()) return Error{"container_resources: the session is over"};
  if (!link_at_least(Link::ready)) return Error{"container_resources: no guest connected"};
  if (auto ok = proto::validate(proto::HostMessage{r}); !ok) return Error{ok.error().reason};
  const char* need = r.update ? proto::kFeatureContainerUpdate : proto::kFeatureContainerStats;
  if (!(features_ && std::find(features_->begin(), features_->end(), need) != features_->end()))
    return Error{fmt::format("container_resources{}: the guest's init does not implement it (no \"{}\" in "
                             "ready.features): update the guest's init",
                             r.update ? ".update" : "", need)};
  send(r);
  log("container_resources_sent", fmt::format("proc={} update={}", r.proc, r.update.has_value()));
  return Ok{};
}

Status Session::list_processes() {
  if (finished()) return Error{"list_processes: the session is over"};
  if (!link_at_least(Link::ready)) return Error{"list_processes: no guest connected"};
  send(proto::ListProcesses{});
  return Ok{};
}

Status Session::shutdown(WallTime) {
  if (finished()) return Error{"shutdown: the session is over"};
  raise(outcome_ ? Ending::host : Ending::host_before_outcome);
  begin_shutdown();
  if (outcome_ && data_open_)
    out_.push_back(act::CutOutput{"the VM was stopped while its output was still being read"});
  return Ok{};
}

}  // namespace nes::host
