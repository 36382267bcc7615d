#include "host/lib/data_channel.hpp"

#include <sys/ioctl.h>
#include <sys/socket.h>

#include <boost/asio/write.hpp>
#include <fmt/format.h>

#include "host/lib/endpoint.hpp"

namespace nes::host {

namespace asio = boost::asio;
using boost::system::error_code;

std::string firecracker_data_path(std::string_view uds_path) {
  return firecracker_vsock_path(uds_path, kDataVsockPort);
}

namespace {
proto::FrameRules guest_rules(const proto::Stdio& s, bool resume = false) {
  proto::FrameRules r;
  r.resume = resume;
  r.sender = proto::FrameSender::guest;
  r.terminal = s.terminal.has_value();
  r.input = s.attach_stdin;
  r.lossy = s.mode == proto::StdioMode::lossy;
  return r;
}
}  // namespace

// ---- DataReceiver ----

DataReceiver::DataReceiver(const proto::Stdio& stdio, bool resume)
    : dec_(guest_rules(stdio, resume)), terminal_(stdio.terminal.has_value()) {}

bool DataReceiver::open_process(std::uint16_t proc, const proto::Stdio& stdio) {
  return dec_.open_process(proc, guest_rules(stdio));
}

void DataReceiver::received(std::string_view bytes, std::vector<DataEvent>& out) {
  while (!dec_.failed()) {
    auto f = dec_.next(bytes);
    if (!f) break;
    switch (f->kind) {
      case proto::FrameKind::data:
        out.push_back(data_ev::Output{f->stream, std::move(f->data), f->proc});
        break;
      case proto::FrameKind::eof:
        out.push_back(data_ev::Eof{f->stream, f->proc});
        break;
      case proto::FrameKind::dropped:
        out.push_back(data_ev::Dropped{f->stream, f->dropped, f->proc});
        break;
      case proto::FrameKind::hello:
        out.push_back(data_ev::Hello{f->generation, std::move(f->data)});
        break;
      case proto::FrameKind::position:
        out.push_back(data_ev::Position{f->stream, f->position, f->proc});
        break;
      case proto::FrameKind::ack:
        out.push_back(data_ev::Ack{f->stream, f->position, f->proc});
        break;
      case proto::FrameKind::resize:  // the decoder refuses these from a guest; never here
      case proto::FrameKind::close:
        break;
    }
  }
  if (dec_.failed()) out.push_back(data_ev::Failed{dec_.error()});
}

void DataReceiver::closed(std::vector<DataEvent>& out) {
  if (!dec_.failed() && !dec_.idle())
    out.push_back(data_ev::Failed{
        fmt::format("data channel closed in the middle of a frame (at byte {})", dec_.offset())});
}

bool DataReceiver::outputs_done() const {
  return dec_.at_eof(proto::Stream::out) && (terminal_ || dec_.at_eof(proto::Stream::err));
}

/// The largest position a guest may name (2^53-1, as output_end's counts): beyond any stream's
/// real length, and far from wrapping the sums of positions the link keeps.
constexpr std::uint64_t kPositionMax = 9007199254740991ull;

// ---- DataLink ----

DataLink::DataLink(asio::io_context& io, int fd, int family, Config cfg)
    : sock_(io), drain_timer_(io), cfg_(std::move(cfg)), rx_(cfg_.stdio, cfg_.resume != nullptr),
      buf_(cfg_.read_chunk), ack_timer_(io) {
  if (cfg_.resume) {
    // This link's tallies continue the session's (a replacement host's from the log's positions).
    DataResume& r = *cfg_.resume;
    ++r.links;
    // Received counts payload that arrived: a gap's bytes never did (the guest's `sent` leaves
    // them out too: output_end stays exact).
    tallies_[{0, proto::Stream::out}] = Tally{r.pos[0] - r.gap[0], r.eof[0]};
    tallies_[{0, proto::Stream::err}] = Tally{r.pos[1] - r.gap[1], r.eof[1]};
    // An eof the earlier link saw counts here: the guest's replayed eof is skipped as a repeat,
    // and the receipt (`close`) must still go out once every stream has ended.
    out_eof_ = r.eof[0];
    err_eof_ = r.eof[1];
  }
  error_code ec;
  sock_.assign(asio::generic::stream_protocol(family, 0), fd, ec);
  if (ec) {
    ::close(fd);
    bad_ = true;
  }
}

void DataLink::start() {
  if (bad_) {
    close("data channel: cannot use the connection");
    return;
  }
  // Without resume stdin begins at byte 0 on the one connection (with resume: at the guest's
  // position, once it came).
  if (!cfg_.resume && cfg_.stdio.attach_stdin) cfg_.emit("stdin_position", "0");
  start_read();
}

void DataLink::start_read() {
  if (closed_ || reading_ || paused_embedder_ || paused_log_) return;
  reading_ = true;
  sock_.async_read_some(asio::buffer(buf_), [self = shared_from_this()](error_code ec, std::size_t n) {
    self->reading_ = false;
    if (self->closed_) return;
    std::vector<DataEvent> evs;
    self->bytes_in_ += n;
    if (n > 0) self->rx_.received(std::string_view(self->buf_.data(), n), evs);
    if (ec && !self->rx_.failed()) self->rx_.closed(evs);
    self->handle(evs);
    if (self->closed_) return;
    if (ec) {
      // With resume an end we did not make is a loss: the guest redials (docs/protocol.md).
      if (self->cfg_.resume) self->lost_ = true;
      self->close(ec == asio::error::eof ? "" : "data channel: " + ec.message());
      return;
    }
    self->start_read();
  });
}

void DataLink::handle(std::vector<DataEvent>& evs) {
  const StdioHooks* h = cfg_.hooks;
  auto now = wall_now();
  for (auto& e : evs) {
    if (closed_) return;
    if (cfg_.resume && !std::holds_alternative<data_ev::Failed>(e) && !handle_resume(e)) return;
    if (std::holds_alternative<data_ev::Hello>(e) || std::holds_alternative<data_ev::Position>(e) ||
        std::holds_alternative<data_ev::Ack>(e))
      continue;
    const std::uint16_t proc = std::visit(
        [](const auto& x) -> std::uint16_t {
          if constexpr (requires { x.proc; }) return x.proc;
          else return 0;
        },
        e);
    if (auto* o = std::get_if<data_ev::Output>(&e)) tallies_[{proc, o->stream}].received += o->bytes.size();
    if (auto* eo = std::get_if<data_ev::Eof>(&e)) {
      Tally& t = tallies_[{proc, eo->stream}];
      if (t.eof && proc == 0 && cfg_.resume) continue;  // again after a resume: it ended once
      t.eof = true;
    }
    if (proc != 0) {
      if (cfg_.exec_event) cfg_.exec_event(proc, e);
      continue;
    }
    if (auto* o = std::get_if<data_ev::Output>(&e)) {
      if (h && h->data) h->data(cfg_.vm, o->stream, o->bytes);
      if (cfg_.resume) {
        const int i = o->stream == proto::Stream::err ? 1 : 0;
        cfg_.resume->pos[i] += o->bytes.size();
        // Without a log (or with one that stopped) the embedder's hand-over is what is safe.
        if (!cfg_.log || cfg_.log->error()) {
          cfg_.resume->safe[i] = cfg_.resume->pos[i];
          safe_moved();
        }
      }
      if (cfg_.log) {
        cfg_.log->push(static_cast<OutputStream>(o->stream), std::move(o->bytes), now);
        if (cfg_.log->full()) paused_log_ = true;  // on_drained resumes
      }
    } else if (auto* eo = std::get_if<data_ev::Eof>(&e)) {
      if (h && h->eof) h->eof(cfg_.vm, eo->stream);
      if (cfg_.log) cfg_.log->push_eof(static_cast<OutputStream>(eo->stream), now);
      cfg_.emit("output_eof", std::string(proto::to_string(eo->stream)));
      (eo->stream == proto::Stream::out ? out_eof_ : err_eof_) = true;
      if (cfg_.resume) cfg_.resume->eof[eo->stream == proto::Stream::err ? 1 : 0] = true;
      maybe_close_done();
      if (closed_) return;
    } else if (auto* d = std::get_if<data_ev::Dropped>(&e)) {
      if (h && h->dropped) h->dropped(cfg_.vm, d->stream, d->bytes);
      if (cfg_.log) cfg_.log->push_dropped(static_cast<OutputStream>(d->stream), d->bytes, now);
      cfg_.emit("output_dropped", fmt::format("{} {} bytes", proto::to_string(d->stream), d->bytes));
    } else if (auto* f = std::get_if<data_ev::Failed>(&e)) {
      close(f->reason);
      return;
    }
  }
}

bool DataLink::handle_resume(DataEvent& e) {
  DataResume& r = *cfg_.resume;
  if (auto* he = std::get_if<data_ev::Hello>(&e)) {
    if (hello_) {
      close("data channel: a second hello frame on one connection");
      return false;
    }
    hello_ = true;
    if (he->vm != r.vm || he->generation != r.generation) {
      // Another VM's or generation's guest: refused, nothing of it is recorded.
      cfg_.emit("data_refused", fmt::format("the guest's hello names vm '{}' generation {}; this is vm '{}' generation {}",
                                            he->vm, he->generation, r.vm, r.generation));
      lost_ = true;  // not this session's data channel: the session waits on for its own
      closed_ = true;
      error_code ec;
      sock_.close(ec);
      outq_.clear();
      out_bytes_ = 0;
      if (cfg_.on_closed) cfg_.on_closed("refused");
      return false;
    }
    resumed_ = true;
    // Where each output stream stands here: the guest replays from there.
    std::string f;
    proto::append_position(f, proto::Stream::out, r.pos[0]);
    if (!cfg_.stdio.terminal) proto::append_position(f, proto::Stream::err, r.pos[1]);
    // Positions first: what was queued before the handshake (a resize) goes after them.
    f += std::exchange(pre_, {});
    out_bytes_ += f.size();
    outq_.push_back(std::move(f));
    start_write();
    cfg_.emit("data_resumed", fmt::format("link {} stdout {} stderr {}", r.links, r.pos[0], r.pos[1]));
    return true;
  }
  if (!hello_) {
    if (!cfg_.resume_required) {
      cfg_.resume.reset();  // a guest without resume: the data channel as before
      if (cfg_.stdio.attach_stdin) cfg_.emit("stdin_position", "0");
      return true;
    }
    close("data channel: expected the guest's hello frame first (boot.stdio.replay_bytes is set)");
    return false;
  }
  if (auto* p = std::get_if<data_ev::Position>(&e)) {
    if (p->proc != 0) return true;  // processes exec started are not resumed
    if (p->position > kPositionMax) {  // no stream gets there; sums of positions must not wrap
      close(fmt::format("position frame on {}: position {} above 2^53-1", proto::to_string(p->stream), p->position));
      return false;
    }
    if (p->stream == proto::Stream::in) {
      if (!r.in_known) {  // a host taking over: stdin continues from the guest's position
        r.in_known = true;
        r.in_sent = r.in_acked = r.in_taken = p->position;
        r.in_unacked.clear();
        if (r.in_eof) {  // an eof the embedder gave before the handshake
          std::string f;
          proto::append_eof(f, proto::Stream::in);
          (void)queue_in(std::move(f));
        }
        cfg_.emit("stdin_position", fmt::format("{}", p->position));
        stdin_go();
        return true;
      }
      if (p->position > r.in_sent || p->position < r.in_acked) {
        close(fmt::format("position frame on stdin: position {} outside the {}..{} bytes sent and not acknowledged",
                          p->position, r.in_acked, r.in_sent));
        return false;
      }
      // Re-send what the guest did not take (none twice), then the eof if it went out.
      std::string_view rest = std::string_view(r.in_unacked).substr(p->position - r.in_acked);
      std::string f;
      proto::append_data(f, proto::Stream::in, rest);
      if (r.in_eof) proto::append_eof(f, proto::Stream::in);
      r.in_unacked.erase(0, p->position - r.in_acked);
      r.in_acked = p->position;
      if (!f.empty()) (void)queue_in(std::move(f));
      cfg_.emit("stdin_position", fmt::format("{}", p->position));
      stdin_go();
      return true;
    }
    const int i = p->stream == proto::Stream::err ? 1 : 0;
    if (p->position < r.pos[i]) {
      close(fmt::format("position frame on {}: position {} behind the {} bytes received", proto::to_string(p->stream),
                        p->position, r.pos[i]));
      return false;
    }
    if (p->position > r.pos[i]) {
      // The guest's ring no longer held these: a counted gap, written into the log.
      const std::uint64_t n = p->position - r.pos[i];
      r.gap[i] += n;
      r.pos[i] = p->position;
      if (cfg_.hooks && cfg_.hooks->dropped) cfg_.hooks->dropped(cfg_.vm, p->stream, n);
      if (cfg_.log) cfg_.log->push_skipped(static_cast<OutputStream>(p->stream), n, wall_now());
      cfg_.emit("output_dropped", fmt::format("{} {} bytes (gone from the guest's replay ring)",
                                              proto::to_string(p->stream), n));
      if (!cfg_.log || cfg_.log->error()) r.safe[i] = r.pos[i];
    }
    // Streams that ended on an earlier link: their eofs come again only as repeats (skipped),
    // so the receipt is checked here, once the guest has said where it stands.
    maybe_close_done();
    return true;
  }
  if (auto* a = std::get_if<data_ev::Ack>(&e)) {
    if (a->proc != 0) return true;
    if (a->position > r.in_sent) {
      close(fmt::format("ack frame on stdin: position {} ahead of the {} bytes sent", a->position, r.in_sent));
      return false;
    }
    // What the workload took: the window's base. The guest's acks only grow on a connection;
    // its handshake ack may lie below a taking-over host's position (bytes it holds).
    r.in_taken = a->position;
    if (a->position > r.in_acked) {
      r.in_unacked.erase(0, a->position - r.in_acked);
      r.in_acked = a->position;
    }
    if (stdin_refused_ && out_bytes_ + stdin_in_flight() < stdin_window() / 2) {
      stdin_refused_ = false;
      if (cfg_.hooks && cfg_.hooks->stdin_writable) cfg_.hooks->stdin_writable(cfg_.vm);
    }
    return true;
  }
  return true;
}

void DataLink::stdin_go() {
  stdin_ready_ = true;
  // The embedder may send (again): a pump held by a refusal before the handshake, or by the
  // loss of the previous connection, goes on.
  stdin_refused_ = false;
  if (cfg_.hooks && cfg_.hooks->stdin_writable) cfg_.hooks->stdin_writable(cfg_.vm);
}

void DataLink::log_written(LogPositions p) {
  if (!cfg_.resume) return;
  DataResume& r = *cfg_.resume;
  // Positions continue across links: the log's count only ever grows with the host's.
  r.safe[0] = std::max(r.safe[0], std::min(p.out, r.pos[0]));
  r.safe[1] = std::max(r.safe[1], std::min(p.err, r.pos[1]));
  safe_moved();
}

void DataLink::safe_moved() {
  if (closed_ || !resumed_) return;
  DataResume& r = *cfg_.resume;
  bool due = false, any = false;
  for (int i = 0; i < 2; ++i) {
    if (r.safe[i] > r.acked[i]) any = true;
    if (r.safe[i] >= r.acked[i] + kAckStep) due = true;
  }
  // Whichever way the ack goes, the receipt may be due now (the last bytes reached the log).
  if (due) send_acks(true);
  else if (any && !ack_armed_) {
    ack_armed_ = true;
    ack_timer_.expires_after(kAckDelay);
    ack_timer_.async_wait([w = weak_from_this()](error_code ec) {
      auto self = w.lock();
      if (!self) return;
      self->ack_armed_ = false;
      if (!ec && !self->closed_) self->send_acks(true);
    });
  }
  maybe_close_done();
}

void DataLink::send_acks(bool) {
  DataResume& r = *cfg_.resume;
  std::string f;
  for (int i = 0; i < 2; ++i) {
    if (i == 1 && cfg_.stdio.terminal) continue;
    if (r.safe[i] <= r.acked[i]) continue;
    proto::append_ack(f, i == 0 ? proto::Stream::out : proto::Stream::err, r.safe[i]);
    r.acked[i] = r.safe[i];
  }
  if (f.empty()) return;
  out_bytes_ += f.size();
  outq_.push_back(std::move(f));
  start_write();
}

DataLink::Tally DataLink::tally(std::uint16_t proc, proto::Stream stream) const {
  auto it = tallies_.find({proc, stream});
  return it == tallies_.end() ? Tally{} : it->second;
}

std::size_t DataLink::unread() const {
  if (closed_) return 0;
  int n = 0;
  if (::ioctl(const_cast<DataLink*>(this)->sock_.native_handle(), FIONREAD, &n) != 0 || n < 0) return 0;
  return static_cast<std::size_t>(n);
}

void DataLink::pause(bool paused) {
  paused_embedder_ = paused;
  if (!paused) start_read();
}

void DataLink::log_drained() {
  if (!paused_log_) return;
  if (cfg_.log && cfg_.log->full()) return;
  paused_log_ = false;
  start_read();
}

DataLink::Exec* DataLink::find_exec(std::uint16_t proc) {
  for (Exec& x : execs_)
    if (x.proc == proc) return &x;
  return nullptr;
}

void DataLink::maybe_close_done() {
  // Every output stream of the workload ended and all of it is ours: closing tells the guest so
  // (it holds its power-off until then, docs/protocol.md "Data channel"); stdin ends with it.
  // Not while a process exec() started still has its streams here. With resume "ours" means
  // safe (in the log), and the close frame says it is the receipt.
  if (closed_ || closing_ || !(out_eof_ && (err_eof_ || cfg_.stdio.terminal) && execs_.empty())) return;
  if (!cfg_.resume || !resumed_) return close();
  DataResume& r = *cfg_.resume;
  if (!cfg_.log || cfg_.log->error()) {  // nothing more will be written: what came is all there is
    r.safe[0] = r.pos[0];
    r.safe[1] = r.pos[1];
  }
  if (r.safe[0] < r.pos[0] || (!cfg_.stdio.terminal && r.safe[1] < r.pos[1])) return;  // the log catches up first
  close_after_write();
}

void DataLink::close_after_write() {
  closing_ = true;
  std::string f;
  proto::append_close(f);
  out_bytes_ += f.size();
  outq_.push_back(std::move(f));
  if (!writing_) start_write();
}

Status DataLink::queue_in(std::string f) {
  out_bytes_ += f.size();
  outq_.push_back(std::move(f));
  start_write();
  return Ok{};
}

Result<bool*> DataLink::stdin_of(std::uint16_t proc) {
  if (closed_) return Error{"stdin: the data channel is closed"};
  // Resume: stdin goes on from the guest's position, which its handshake brings.
  if (proc == 0) {
    if (!cfg_.stdio.attach_stdin) return Error{"stdin: not attached (boot.stdio.stdin is false)"};
    if (cfg_.resume && !stdin_ready_) {
      stdin_refused_ = true;  // stdin_writable follows the guest's stdin position
      return Error{"stdin: the data channel's resume handshake is not over"};
    }
    return &stdin_eof_sent_;
  }
  Exec* x = find_exec(proc);
  if (!x) return Error{fmt::format("stdin: no process {}", proc)};
  if (!x->started) return Error{fmt::format("stdin: process {} has not started yet", proc)};
  if (!x->stdio.attach_stdin) return Error{fmt::format("stdin: not attached for process {}", proc)};
  return &x->stdin_eof_sent;
}

Status DataLink::send_stdin(std::string_view bytes, std::uint16_t proc) {
  auto st = stdin_of(proc);
  if (!st) return st.error();
  bool* eof_sent = *st;
  if (*eof_sent) return Error{"stdin: already at eof"};
  const bool windowed = cfg_.resume && proc == 0;
  if (out_bytes_ + (windowed ? stdin_in_flight() : 0) >= (windowed ? stdin_window() : cfg_.stdin_cap)) {
    stdin_refused_ = true;
    return Error{fmt::format("stdin: {} bytes queued; the guest is not reading", out_bytes_)};
  }
  if (bytes.empty()) return Ok{};
  std::string f;
  proto::append_data(f, proto::Stream::in, bytes, proc);
  if (cfg_.resume && proc == 0) {  // kept until the guest acknowledges it
    cfg_.resume->in_sent += bytes.size();
    cfg_.resume->in_unacked.append(bytes);
  }
  return queue_in(std::move(f));
}

Status DataLink::send_stdin_eof(std::uint16_t proc) {
  if (proc == 0 && cfg_.resume && cfg_.stdio.attach_stdin && !closed_ && !stdin_ready_) {
    // Before the handshake: kept, and sent after the re-sent stdin once the guest's stdin
    // position arrives (the position handler sends it when in_eof is set). Never dropped.
    cfg_.resume->in_eof = true;
    stdin_eof_sent_ = true;
    return Ok{};
  }
  auto st = stdin_of(proc);
  if (!st) return st.error();
  bool* eof_sent = *st;
  if (*eof_sent) return Ok{};
  *eof_sent = true;
  if (cfg_.resume && proc == 0) cfg_.resume->in_eof = true;
  std::string f;
  proto::append_eof(f, proto::Stream::in, proc);
  return queue_in(std::move(f));
}

Status DataLink::send_resize(std::uint16_t rows, std::uint16_t cols, std::uint16_t proc) {
  if (closed_) return Error{"resize: the data channel is closed"};
  if (proc == 0) {
    if (!cfg_.stdio.terminal) return Error{"resize: the workload has no terminal"};
  } else {
    Exec* x = find_exec(proc);
    if (!x || !x->started) return Error{fmt::format("resize: no process {} running", proc)};
    if (!x->stdio.terminal) return Error{fmt::format("resize: process {} has no terminal", proc)};
  }
  if (rows == 0 || cols == 0) return Error{fmt::format("resize: {}x{} has a zero size", rows, cols)};
  if (out_bytes_ >= cfg_.stdin_cap + 4096) return Error{"resize: the guest is not reading"};
  std::string f;
  proto::append_resize(f, rows, cols, proc);
  if (cfg_.resume && !resumed_) {
    pre_ += f;  // after the positions (the guest takes nothing before them)
    return Ok{};
  }
  return queue_in(std::move(f));
}

Status DataLink::open_exec(std::uint16_t proc, const proto::Stdio& stdio) {
  if (closed_) return Error{"exec: the data channel is closed"};
  if (find_exec(proc)) return Error{fmt::format("exec: process {} is open already", proc)};
  if (execs_.size() >= proto::kExecMax || !rx_.open_process(proc, stdio))
    return Error{fmt::format("exec: {} processes started by exec are open already (the most)", proto::kExecMax)};
  execs_.push_back(Exec{proc, stdio, false, false});
  return Ok{};
}

void DataLink::exec_started(std::uint16_t proc) {
  if (Exec* x = find_exec(proc)) x->started = true;
}

void DataLink::close_exec(std::uint16_t proc) {
  rx_.close_process(proc);
  std::erase_if(execs_, [&](const Exec& x) { return x.proc == proc; });
  if (!closed_) maybe_close_done();
}

void DataLink::start_write() {
  if (writing_ || outq_.empty() || closed_) return;
  writing_ = true;
  asio::async_write(sock_, asio::buffer(outq_.front()), [self = shared_from_this()](error_code ec, std::size_t) {
    self->writing_ = false;
    if (self->closed_) return;
    if (ec && self->cfg_.resume && self->resumed_ && !self->closing_) {
      self->lost_ = true;  // the peer went: the guest redials
      self->close("data channel: " + ec.message());
      return;
    }
    if (ec) {
      // The guest stopped reading for good (closed its end): stdin is over; reads go on.
      self->outq_.clear();
      self->out_bytes_ = 0;
      self->cfg_.emit("stdin_error", ec.message());
      return;
    }
    self->out_bytes_ -= self->outq_.front().size();
    self->outq_.pop_front();
    if (self->closing_ && self->outq_.empty()) {
      self->close();
      return;
    }
    if (self->stdin_refused_ && self->out_bytes_ + self->stdin_in_flight() < self->stdin_window() / 2) {
      self->stdin_refused_ = false;
      if (self->cfg_.hooks && self->cfg_.hooks->stdin_writable) self->cfg_.hooks->stdin_writable(self->cfg_.vm);
      if (self->closed_) return;
    }
    self->start_write();
  });
}

void DataLink::drain_then_close(std::chrono::milliseconds bound) {
  if (closed_) return;
  // The VM is finished: whatever the guest wrote before it went is in our socket buffer. Read
  // it regardless of flow control (bounded by `bound`), then close.
  paused_embedder_ = false;
  paused_log_ = false;
  start_read();
  drain_timer_.expires_after(bound);
  drain_timer_.async_wait([w = weak_from_this(), bound](error_code ec) {
    auto self = w.lock();
    if (ec || !self || self->closed_) return;
    // The guest is gone: what it wrote is finite, so the bound only meets a stuck read. What
    // is left in the socket is named, never dropped in silence (its streams then lack their eofs).
    const std::size_t left = self->unread();
    self->close(left ? fmt::format("data channel: {} bytes still unread {} ms after the VM was finished", left,
                                   bound.count())
                     : std::string());
  });
}

void DataLink::close(std::string error) {
  if (closed_) return;
  if (cfg_.resume && resumed_ && !lost_ && !closing_ && !writing_ && outq_.empty()) {
    // On purpose: the guest must not take it for a loss. One try, without waiting.
    std::string f;
    proto::append_close(f);
    (void)::send(sock_.native_handle(), f.data(), f.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  closed_ = true;
  error_code ec;
  drain_timer_.cancel();
  ack_timer_.cancel();
  sock_.close(ec);
  outq_.clear();
  out_bytes_ = 0;
  if (!error.empty()) cfg_.emit("data_error", error);
  cfg_.emit("data_closed", error.empty() ? "clean" : "error");
  if (!lost_ && cfg_.hooks && cfg_.hooks->closed) cfg_.hooks->closed(cfg_.vm, error);
  if (cfg_.on_closed) cfg_.on_closed(error);
}

}  // namespace nes::host
