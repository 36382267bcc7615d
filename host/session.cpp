#include "host/session.hpp"

#include <fmt/format.h>

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

std::string_view guest_type(const proto::GuestMessage& m) {
  static constexpr std::string_view names[] = {"ready",        "mounted",         "mount_failed",
                                               "started",      "start_failed",    "workload_exited",
                                               "protocol_error"};
  return names[m.index()];
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

Session::Session(SessionConfig cfg) : cfg_(std::move(cfg)), reader_(cfg_.line_cap) {}

std::vector<Action> Session::take() {
  std::vector<Action> v;
  v.swap(out_);
  return v;
}

void Session::log(std::string kind, std::string detail) {
  out_.push_back(act::Log{std::move(kind), std::move(detail)});
}

void Session::log_limited(std::uint64_t& counter, std::string kind, std::string detail) {
  ++counter;
  if (counter <= kLogRepeat) log(std::move(kind), std::move(detail));
  else if (counter == kLogRepeat + 1) log(std::move(kind), "further ones are not logged");
}

void Session::send(const proto::HostMessage& m) {
  out_.push_back(act::Send{proto::encode(m) + "\n"});
}

void Session::send_boot() {
  proto::Boot b = cfg_.descriptor;
  // The host's policy always wins over what the descriptor said: under `keep` the workload's
  // exit must not power the VM off, so the guest waits for our `shutdown`.
  b.on_exit.terminal = cfg_.on_exit != OnExitPolicy::keep;
  send(b);
  log("boot_sent", fmt::format("terminal={}", b.on_exit.terminal));
}

void Session::close_stream() {
  if (!stream_open_) return;
  stream_open_ = false;
  ready_ = false;
  out_.push_back(act::CloseStream{});
}

void Session::vm_started(WallTime now) {
  if (started_at_) return;
  started_at_ = now;
  log("vm_started", "");
  if (outcome_) return;
  if (!ready_ever_) out_.push_back(act::ArmTimer{TimerKind::ready, cfg_.ready_timeout});
  if (cfg_.wall_timeout && !cfg_.wall_from_started)
    out_.push_back(act::ArmTimer{TimerKind::wall, *cfg_.wall_timeout});
}

bool Session::stream_opened(WallTime) {
  if (stream_open_) {
    log("refused", "a session for this VM is already live");
    return false;
  }
  if (outcome_ || finished_) {
    log("refused", "this VM generation already has its outcome");
    return false;
  }
  stream_open_ = true;
  stream_ever_ = true;
  ready_ = false;
  reader_ = proto::LineReader(cfg_.line_cap);
  pending_line_bytes_ = 0;
  lines_ = 0;
  log("connected", "");
  return true;
}

void Session::received(std::string_view bytes, WallTime now) {
  if (!stream_open_) return;
  std::size_t before = pending_line_bytes_;
  if (auto nl = bytes.rfind('\n'); nl != std::string_view::npos) {
    before = 0;
    pending_line_bytes_ = bytes.size() - nl - 1;
  } else {
    pending_line_bytes_ += bytes.size();
  }
  reader_.feed(bytes);
  while (auto line = reader_.next()) {
    if (!stream_open_) return;  // a violation closed the stream: act on nothing after it
    ++lines_;
    if (line->kind == proto::Line::Kind::too_long) {
      protocol_violation(fmt::format("line {}: {} bytes, longer than the {}-byte cap", lines_,
                                     line->length, cfg_.line_cap),
                         now);
      continue;
    }
    handle_line(line->text, now);
  }
  if (!stream_open_) return;
  // An endless line (no '\n' ever) must not wait for a newline to be judged: the reader already
  // drops its bytes; end the session as soon as the cap is passed (+1 for a tolerated '\r').
  if (pending_line_bytes_ > cfg_.line_cap + 1 && before <= cfg_.line_cap + 1)
    protocol_violation(fmt::format("line {}: more than {} bytes without a newline", lines_ + 1,
                                   cfg_.line_cap),
                       now);
}

void Session::handle_line(std::string_view line, WallTime now) {
  auto decoded = proto::decode_guest(line);
  if (auto* err = std::get_if<proto::DecodeError>(&decoded)) {
    protocol_violation(fmt::format("line {}: {}", lines_, bounded(err->reason)), now);
  } else if (auto* unk = std::get_if<proto::UnknownMessage>(&decoded)) {
    log_limited(unknown_, "skipped", fmt::format("unknown type '{}'", bounded(unk->type)));
  } else {
    handle_message(std::get<proto::GuestMessage>(decoded), now);
  }
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

void Session::handle_message(const proto::GuestMessage& m, WallTime now) {
  if (auto* r = std::get_if<proto::Ready>(&m)) {
    if (ready_) {
      // virtio-serial has no connection events: a second `ready` is a restarted guest.
      if (outcome_) {
        log("guest_restarted", "after the outcome: not booted again");
        if (shutdown_requested_) {
          send(proto::Shutdown{});
          shutdown_sent_ = true;
        }
        return;
      }
      log("guest_restarted", "second ready on this stream: new session");
    } else if (outcome_) {
      log_limited(ignored_, "ignored_after_outcome", "ready");
      return;
    }
    ready_ = true;
    ready_ever_ = true;
    out_.push_back(act::CancelTimer{TimerKind::ready});
    if (r->protocol_version != proto::kProtocolVersion) {
      finalize(proto::Outcome::version_mismatch, std::nullopt, std::nullopt, std::nullopt,
               fmt::format("guest speaks protocol version {}; this host speaks version {}",
                           r->protocol_version, proto::kProtocolVersion),
               now);
      close_stream();
      return;
    }
    log("ready", fmt::format("protocol_version={}", r->protocol_version));
    if (shutdown_requested_) {
      // Shut down before anything ran: no boot descriptor.
      send(proto::Shutdown{});
      shutdown_sent_ = true;
      log("shutdown_sent", "before boot");
      return;
    }
    send_boot();
    if (stop_pending_) {
      send(proto::Stop{});
      stop_pending_ = false;
      stop_sent_ = true;
      log("stop_sent", "requested before boot");
    }
    return;
  }
  if (!ready_) {
    protocol_violation(fmt::format("line {}: expected `ready` first, got `{}`", lines_, guest_type(m)),
                       now);
    return;
  }
  bool final_kind = std::holds_alternative<proto::MountFailed>(m) ||
                    std::holds_alternative<proto::StartFailed>(m) ||
                    std::holds_alternative<proto::WorkloadExited>(m);
  if (final_kind && outcome_) {
    log_limited(ignored_, "ignored_after_outcome", std::string(guest_type(m)));
    return;
  }
  std::visit(
      [&](const auto& msg) {
        using T = std::decay_t<decltype(msg)>;
        if constexpr (std::is_same_v<T, proto::Mounted>) {
          log("mounted", "");
        } else if constexpr (std::is_same_v<T, proto::Started>) {
          log("started", fmt::format("pid={}", msg.pid));
          if (cfg_.wall_timeout && cfg_.wall_from_started && !outcome_)
            out_.push_back(act::ArmTimer{TimerKind::wall, *cfg_.wall_timeout});
        } else if constexpr (std::is_same_v<T, proto::MountFailed>) {
          finalize(proto::Outcome::mount_failed, std::nullopt, std::nullopt, std::nullopt,
                   fmt::format("share '{}' failed to mount (errno {}): {}", bounded(msg.tag),
                               msg.err, bounded(msg.reason)),
                   now);
        } else if constexpr (std::is_same_v<T, proto::StartFailed>) {
          finalize(proto::Outcome::start_failed, std::nullopt, std::nullopt, msg.cls,
                   fmt::format("workload failed to start ({}, errno {}): {}",
                               proto::to_string(msg.cls), msg.err, bounded(msg.reason)),
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
            finalize(proto::Outcome::exited, msg.exit_code, std::nullopt, std::nullopt,
                     fmt::format("workload exited with code {}", *msg.exit_code), now);
          } else {
            finalize(proto::Outcome::signalled, std::nullopt, msg.signal, std::nullopt,
                     fmt::format("workload killed by signal {}", *msg.signal), now);
          }
        } else if constexpr (std::is_same_v<T, proto::ProtocolError>) {
          log("guest_protocol_error", bounded(msg.reason));
        }
      },
      m);
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
  recording_ = true;
  out_.push_back(act::WriteRecord{std::move(r)});
}

void Session::record_durable(const Record& on_disk) {
  if (!recording_) return;
  recording_ = false;
  durable_ = true;
  if (outcome_ && on_disk != *outcome_)
    log("already_recorded", fmt::format("generation {} was recorded first: {}", on_disk.generation,
                                        proto::to_string(on_disk.outcome)));
  outcome_ = on_disk;
  log("recorded", fmt::format("{} exit_status={}", proto::to_string(on_disk.outcome),
                              on_disk.exit_status));
  if (stop_phase_ == 3) {  // already gave up waiting for the VM
    finish(false);
    return;
  }
  if (cfg_.on_exit == OnExitPolicy::keep && !shutdown_requested_) {
    log("kept", "the VM stays up until shutdown()");
    maybe_finish();
    return;
  }
  begin_shutdown();
}

void Session::record_failed(std::string error) {
  if (!recording_) return;
  recording_ = false;
  record_failed_ = true;
  log("record_failed", std::move(error));
  if (stop_phase_ == 3) {
    finish(false);
    return;
  }
  if (cfg_.on_exit == OnExitPolicy::keep && !shutdown_requested_) {
    maybe_finish();
    return;
  }
  begin_shutdown();
}

void Session::begin_shutdown() {
  shutdown_requested_ = true;
  // A `shutdown` sent before the guest's final report is not its ack (docs/protocol.md "Outcome
  // finality": only one after workload_exited is). Once the outcome is durable, send it once more,
  // so the guest powers off now instead of waiting out its ack_timeout_ms.
  const bool recorded = durable_ || record_failed_;
  if (stream_open_ && ready_ && (!shutdown_sent_ || (recorded && !ack_sent_))) {
    send(proto::Shutdown{});
    shutdown_sent_ = true;
    ack_sent_ = recorded;
    log("shutdown_sent", recorded ? "ack of the recorded outcome" : "requested");
  }
  if (!vm_exited_ && stop_phase_ == 0) {
    stop_phase_ = 1;
    out_.push_back(act::ArmTimer{TimerKind::stop, cfg_.stop_timeout});
  }
  maybe_finish();
}

void Session::maybe_finish() {
  if (finished_ || !vm_exited_ || !(durable_ || record_failed_)) return;
  finish(true);
}

void Session::finish(bool allow_remove) {
  if (finished_) return;
  // The remove hook deletes the VM's resources: only once the record is durable and the VM is
  // known (from the embedder) to be gone.
  if (allow_remove && cfg_.on_exit == OnExitPolicy::remove && durable_ && vm_exited_) {
    out_.push_back(act::CallRemove{});
    log("remove", "");
  }
  close_stream();
  out_.push_back(act::CancelTimer{TimerKind::stop});
  finished_ = true;
  out_.push_back(act::Finished{});
  log("finished", "");
}

void Session::timer_fired(TimerKind k, WallTime now) {
  switch (k) {
    case TimerKind::ready:
      if (!ready_ever_ && !outcome_) {
        finalize(proto::Outcome::no_ready, std::nullopt, std::nullopt, std::nullopt,
                 fmt::format("no `ready` within {} ms of vm_started", cfg_.ready_timeout.count()),
                 now);
        close_stream();
      }
      break;
    case TimerKind::wall:
      if (!outcome_)
        finalize(proto::Outcome::timeout, std::nullopt, std::nullopt, std::nullopt,
                 fmt::format("still running at the host's {} ms limit", cfg_.wall_timeout->count()),
                 now);
      break;
    case TimerKind::stop:
      if (vm_exited_) {
        // The VM is gone but its stream never reached EOF: stop waiting for late bytes.
        if (!outcome_)
          finalize(proto::Outcome::channel_lost, std::nullopt, std::nullopt, std::nullopt,
                   "VM exited; its channel stayed open and no outcome arrived", now);
        close_stream();
        maybe_finish();
        break;
      }
      if (stop_phase_ == 1) {
        stop_phase_ = 2;
        log("destroy", fmt::format("no vm_exited {} ms after shutdown", cfg_.stop_timeout.count()));
        out_.push_back(act::CallDestroy{});
        destroy_called_ = true;
        out_.push_back(act::ArmTimer{TimerKind::stop, cfg_.stop_timeout});
      } else if (stop_phase_ == 2) {
        stop_phase_ = 3;
        log("gave_up", fmt::format("no vm_exited {} ms after destroy", cfg_.stop_timeout.count()));
        if (!outcome_)
          finalize(proto::Outcome::channel_lost, std::nullopt, std::nullopt, std::nullopt,
                   "VM did not exit and no outcome arrived", now);
        if (durable_ || record_failed_) finish(false);
      }
      break;
  }
}

void Session::vm_exited(WallTime now) {
  if (vm_exited_) return;
  vm_exited_ = true;
  log("vm_exited", "");
  out_.push_back(act::CancelTimer{TimerKind::ready});
  out_.push_back(act::CancelTimer{TimerKind::stop});
  if (!outcome_) {
    if (stream_open_) {
      // Bytes the guest wrote just before power-off may still be queued ahead of the EOF: read
      // them first (bounded by the stop deadline) so a reported outcome is never lost.
      out_.push_back(act::ArmTimer{TimerKind::stop, cfg_.stop_timeout});
      return;
    }
    finalize(proto::Outcome::channel_lost, std::nullopt, std::nullopt, std::nullopt,
             ready_ever_ ? "VM exited before reporting an outcome" : "VM exited before `ready`",
             now);
  }
  maybe_finish();
}

void Session::stream_closed(WallTime now) {
  if (!stream_open_) return;
  stream_open_ = false;
  bool partial = reader_.partial();
  bool had_session = ready_;
  ready_ = false;
  log("disconnected", partial ? "in the middle of a line" : "");
  if (!had_session && !outcome_) {
    // No `ready` on this stream: it carried no session (a stale-path probe, a peer that gave up).
    // The ready deadline and vm_exited still bound the wait; another stream may come.
    log("no_session", "stream closed before `ready`");
    if (vm_exited_) {
      finalize(proto::Outcome::channel_lost, std::nullopt, std::nullopt, std::nullopt,
               ready_ever_ ? "VM exited before reporting an outcome" : "VM exited before `ready`",
               now);
      maybe_finish();
    }
    return;
  }
  if (!outcome_) {
    std::string why = partial ? fmt::format("channel closed in the middle of line {} ({} bytes)",
                                            lines_ + 1, pending_line_bytes_)
                              : std::string("channel closed before an outcome");
    finalize(proto::Outcome::channel_lost, std::nullopt, std::nullopt, std::nullopt, why, now);
  }
  maybe_finish();
}

Status Session::stop() {
  if (finished_) return Error{"stop: the session is over"};
  if (outcome_) return Error{fmt::format("stop: the workload already ended ({})",
                                         proto::to_string(outcome_->outcome))};
  if (stream_open_ && ready_) {
    send(proto::Stop{});
    stop_sent_ = true;
    log("stop_sent", "");
  } else {
    stop_pending_ = true;
    log("stop_pending", "sent right after the boot descriptor");
  }
  return Ok{};
}

Status Session::kill(int signal) {
  if (signal < 1 || signal > 64) return Error{fmt::format("signal: expected 1..64, got {}", signal)};
  if (finished_) return Error{"kill: the session is over"};
  if (!(stream_open_ && ready_)) return Error{"kill: no booted session to signal"};
  send(proto::Kill{static_cast<std::uint8_t>(signal)});
  log("kill_sent", fmt::format("signal={}", signal));
  return Ok{};
}

Status Session::shutdown(WallTime) {
  if (finished_) return Error{"shutdown: the session is over"};
  begin_shutdown();
  return Ok{};
}

}  // namespace nes::host
