#include "host/lib/data_channel.hpp"

#include <sys/ioctl.h>

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
proto::FrameRules guest_rules(const proto::Stdio& s) {
  proto::FrameRules r;
  r.sender = proto::FrameSender::guest;
  r.terminal = s.terminal.has_value();
  r.input = s.attach_stdin;
  r.lossy = s.mode == proto::StdioMode::lossy;
  return r;
}
}  // namespace

// ---- DataReceiver ----

DataReceiver::DataReceiver(const proto::Stdio& stdio)
    : dec_(guest_rules(stdio)), terminal_(stdio.terminal.has_value()) {}

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
      case proto::FrameKind::resize:  // the decoder refuses it from a guest; never here
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

// ---- DataLink ----

DataLink::DataLink(asio::io_context& io, int fd, int family, Config cfg)
    : sock_(io), drain_timer_(io), cfg_(std::move(cfg)), rx_(cfg_.stdio), buf_(cfg_.read_chunk) {
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
    const std::uint16_t proc = std::visit(
        [](const auto& x) -> std::uint16_t {
          if constexpr (requires { x.proc; }) return x.proc;
          else return 0;
        },
        e);
    if (auto* o = std::get_if<data_ev::Output>(&e)) tallies_[{proc, o->stream}].received += o->bytes.size();
    if (auto* eo = std::get_if<data_ev::Eof>(&e)) tallies_[{proc, eo->stream}].eof = true;
    if (proc != 0) {
      if (cfg_.exec_event) cfg_.exec_event(proc, e);
      continue;
    }
    if (auto* o = std::get_if<data_ev::Output>(&e)) {
      if (h && h->data) h->data(cfg_.vm, o->stream, o->bytes);
      if (cfg_.log) {
        cfg_.log->push(static_cast<OutputStream>(o->stream), std::move(o->bytes), now);
        if (cfg_.log->full()) paused_log_ = true;  // on_drained resumes
      }
    } else if (auto* eo = std::get_if<data_ev::Eof>(&e)) {
      if (h && h->eof) h->eof(cfg_.vm, eo->stream);
      if (cfg_.log) cfg_.log->push_eof(static_cast<OutputStream>(eo->stream), now);
      cfg_.emit("output_eof", std::string(proto::to_string(eo->stream)));
      (eo->stream == proto::Stream::out ? out_eof_ : err_eof_) = true;
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
  // Not while a process exec() started still has its streams here.
  if (out_eof_ && (err_eof_ || cfg_.stdio.terminal) && execs_.empty()) close();
}

Status DataLink::queue_in(std::string f) {
  out_bytes_ += f.size();
  outq_.push_back(std::move(f));
  start_write();
  return Ok{};
}

Result<bool*> DataLink::stdin_of(std::uint16_t proc) {
  if (closed_) return Error{"stdin: the data channel is closed"};
  if (proc == 0) {
    if (!cfg_.stdio.attach_stdin) return Error{"stdin: not attached (boot.stdio.stdin is false)"};
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
  if (out_bytes_ >= cfg_.stdin_cap) {
    stdin_refused_ = true;
    return Error{fmt::format("stdin: {} bytes queued; the guest is not reading", out_bytes_)};
  }
  if (bytes.empty()) return Ok{};
  std::string f;
  proto::append_data(f, proto::Stream::in, bytes, proc);
  return queue_in(std::move(f));
}

Status DataLink::send_stdin_eof(std::uint16_t proc) {
  auto st = stdin_of(proc);
  if (!st) return st.error();
  bool* eof_sent = *st;
  if (*eof_sent) return Ok{};
  *eof_sent = true;
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
    if (ec) {
      // The guest stopped reading for good (closed its end): stdin is over; reads go on.
      self->outq_.clear();
      self->out_bytes_ = 0;
      self->cfg_.emit("stdin_error", ec.message());
      return;
    }
    self->out_bytes_ -= self->outq_.front().size();
    self->outq_.pop_front();
    if (self->stdin_refused_ && self->out_bytes_ < self->cfg_.stdin_cap / 2) {
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
  closed_ = true;
  error_code ec;
  drain_timer_.cancel();
  sock_.close(ec);
  outq_.clear();
  out_bytes_ = 0;
  if (!error.empty()) cfg_.emit("data_error", error);
  cfg_.emit("data_closed", error.empty() ? "clean" : "error");
  if (cfg_.hooks && cfg_.hooks->closed) cfg_.hooks->closed(cfg_.vm, error);
  if (cfg_.on_closed) cfg_.on_closed(error);
}

}  // namespace nes::host
