#include "data_io.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "loop.hpp"

namespace nes::init {

namespace {

/// How often a virtio port with no host connected is looked at again: ms.
constexpr std::uint64_t kPortRetryMs = 100;
/// Direct frames moved per readable pipe before the loop looks at its other fds again (1 MiB).
constexpr int kDirectBurst = 16;

/// Bytes unread in `fd` (a pipe or the PTY master): FIONREAD, 0 when it cannot tell.
std::uint64_t unread(const base::Fd& fd) {
  int n = 0;
  return fd && ::ioctl(fd.get(), FIONREAD, &n) == 0 && n > 0 ? static_cast<std::uint64_t>(n) : 0;
}

/// Stream `s`'s account (ev::OutputAccount): framed, and given up (thrown away, unread in its
/// pipe). Bytes read and not framed yet count as sent when `at_eof` (the stream is at EOF on an
/// open channel: they are framed next, nothing more comes), else as given up. Either way
/// sent + unsent is every byte of `s` the init has seen, which is what the host's count needs.
ev::OutputAccount account(const StdioCore& c, const StdioFds& f, proto::Stream s, bool at_eof = false) {
  const base::Fd& fd = s == proto::Stream::err ? f.err : f.out;
  const std::uint64_t held = c.held(s);
  return {c.framed(s) + (at_eof ? held : 0), c.discarded(s) + (at_eof ? 0 : held) + unread(fd),
          c.eof_framed(s)};
}
/// stderr's account; none with a terminal (one stream: the PTY's).
std::optional<ev::OutputAccount> err_account(const StdioCore& c, const StdioFds& f, bool at_eof = false) {
  if (f.terminal) return std::nullopt;
  return account(c, f, proto::Stream::err, at_eof);
}

/// The child's fds 0-2 for `f`: with a terminal the PTY slave for all three.
ChildFds child_fds(const StdioFds& f) {
  const int in = f.child_in.get();
  return f.terminal ? ChildFds{{in, in, in}, true} : ChildFds{{in, f.child_out.get(), f.child_err.get()}, false};
}

void close_child_ends(StdioFds& f) {
  f.child_in.reset();
  f.child_out.reset();
  f.child_err.reset();
}

}  // namespace

void DataIo::connected(base::Fd fd, bool is_port, const act::DialData& d) {
  data_ = std::move(fd);
  is_port_ = is_port;
  rx_eof_ = hup_ = false;
  retry_at_.reset();
  if (mux_ && lost_) {
    // The redialled channel: a port was seen connected by the dial (its next hang-up is a loss).
    lost_ = false;
    seen_ = is_port;
    mux_->channel_resumed();
    return;
  }
  mux_.emplace(d.stdio);
  if (d.resume) mux_->workload().enable_resume(d.generation, d.vm);
}

void DataIo::give_up() {
  if (!lost_) return;
  lost_ = false;
  close();
}

void DataIo::lose(const char* why) {
  if (!mux_ || !mux_->workload().resume() || mux_->workload().host_closed()) {
    close();
    return;
  }
  log_.warn("data", "{}: the data channel is lost; its output is kept for a redialled one", why);
  data_.reset();
  frame_pipe_.reset();
  frame_pipe_w_.reset();
  frame_pipe_bytes_ = 0;
  hup_ = false;
  retry_at_.reset();
  lost_ = true;
  mux_->channel_lost();
  events_.push(ev::DataLost{why});
}

base::Result<ChildFds> DataIo::open_workload(const proto::Stdio& s) {
  auto made = make_stdio(s);
  if (!made) return std::move(made).error();
  fds_ = std::move(made).value();
  if (!fds_.pipes_hold_buffer && mux_) mux_->workload().direct_unsupported();  // the init buffers instead
  return child_fds(fds_);
}

base::Result<ChildFds> DataIo::open_exec(std::uint16_t proc, const proto::Stdio& s) {
  auto made = make_stdio(s);
  if (!made) return std::move(made).error();
  if (!mux_ || !mux_->open(proc, s)) return base::Error{"exec: the data channel cannot take another process", EAGAIN};
  ExecFds& x = execs_.emplace_back();
  x.proc = proc;
  x.fds = std::move(made).value();
  staged_ = true;
  return child_fds(x.fds);
}

void DataIo::workload_spawned() { close_child_ends(fds_); }

void DataIo::exec_spawned(std::uint16_t proc, bool ok) {
  if (staged_) {
    close_child_ends(execs_.back().fds);
    if (!ok) execs_.pop_back();
  }
  staged_ = false;
  if (!ok && mux_) mux_->close(proc);
}

DataIo::ExecFds* DataIo::find(std::uint16_t proc) {
  for (ExecFds& x : execs_)
    if (x.proc == proc) return &x;
  return nullptr;
}

std::uint64_t DataIo::held(std::uint16_t proc) {
  if (!mux_) return 0;
  const StdioFds* f = &fds_;
  if (proc != 0) {
    const ExecFds* x = find(proc);
    if (!x) return 0;
    f = &x->fds;
  }
  const StdioCore* c = mux_->core(proc);
  return (c ? c->buffered() : 0) + unread(f->out) + unread(f->err);
}

void DataIo::close_exec(std::uint16_t proc) {
  ExecFds* x = find(proc);
  if (const StdioCore* c = mux_ ? mux_->core(proc) : nullptr; c && x)
    events_.push(ev::ExecClosed{proc, account(*c, x->fds, proto::Stream::out), err_account(*c, x->fds),
                                     c->outputs_done()});
  if (mux_) mux_->close(proc);
  if (x) execs_.erase(execs_.begin() + (x - execs_.data()));  // one per proc: the mux opens it once
}

void DataIo::report(ev::Flushing& f) {
  f.receipt = rx_eof_ || hup_;
  if (!mux_) return;
  StdioCore& w = mux_->workload();
  // Resume: the receipt is the host's close frame (an EOF without it is a loss); a channel being
  // redialled is still open, and owes what its ring holds.
  if (w.resume()) f.receipt = w.host_closed() && (rx_eof_ || hup_ || !data_);
  f.data_open = static_cast<bool>(data_) || lost_;
  f.data_unsent = mux_->tx_pending() || lost_ || (w.resume() && !w.host_closed() && w.buffered() > 0);
  f.outputs_done = w.outputs_done();
  f.output_bytes = w.buffered();
  f.out = account(w, fds_, proto::Stream::out);
  f.err = err_account(w, fds_);
}

std::size_t DataIo::poll_set(pollfd* p, std::uint64_t now) {
  stdio_poll_set(p, now);
  const std::size_t nexec = std::min(execs_.size(), proto::kExecMax);
  for (std::size_t i = 0; i < nexec; ++i) exec_poll_set(execs_[i], p + kStdioFds + kExecFds * i);
  return kStdioFds + kExecFds * nexec;
}

void DataIo::on_poll(const pollfd* p) {
  stdio_handle(p);
  const std::size_t nexec = std::min(execs_.size(), proto::kExecMax);
  for (std::size_t i = 0; i < nexec; ++i) exec_handle(execs_[i], p + kStdioFds + kExecFds * i);
  if (data_ && mux_ && mux_->tx_pending()) {
    write_data();
    // An exec'd process's outputs are done once its last frames are out (take_outputs_done).
    for (std::size_t i = 0; i < nexec; ++i) exec_outputs_done(execs_[i]);
  }
}

void DataIo::flush_poll_set(pollfd* p, std::uint64_t now) {
  stdio_poll_set(p, now);
  // Watched for the host's close (POLLHUP) even when there is nothing to read or write.
  if (data_ && p[kData].fd < 0 && !retry_at_) p[kData] = {data_.get(), 0, 0};
}

void DataIo::on_flush_poll(const pollfd* p) {
  if (data_ && (p[kData].revents & (POLLHUP | POLLERR))) hup_ = true;
  stdio_handle(p);
}

/// Fills the stdio part of a poll set: each fd only with what the core wants now (fd -1 when
/// nothing, so a hung-up pipe the core is not reading cannot make poll spin).
void DataIo::stdio_poll_set(pollfd* p, std::uint64_t now) {
  for (int i = 0; i < kStdioFds; ++i) p[i] = {-1, 0, 0};
  if (!mux_) return;
  StdioCore& c = mux_->workload();
  if (retry_at_ && *retry_at_ <= now) retry_at_.reset();
  if (data_ && !retry_at_) {
    short ev = 0;
    if (!rx_eof_ && mux_->rx_room() > 0) ev |= POLLIN;
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
void DataIo::stdio_handle(const pollfd* p) {
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
  if (data_ && !c.rx_error().empty() && !lost_) {
    log_.warn("data", "{}; closing the data channel", c.rx_error());
    events_.push(ev::DataError{c.rx_error()});
    close();
  }
  if (mux_->take_outputs_done(0))
    events_.push(ev::OutputsDone{account(c, fds_, proto::Stream::out, true), err_account(c, fds_, true)});
}

/// What the core asks of its stdin side now: a resize, bytes to write, the close after eof.
void DataIo::stdin_side(StdioCore& c, StdioFds& f) {
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
void DataIo::exec_poll_set(ExecFds& x, pollfd* p) {
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

void DataIo::exec_handle(ExecFds& x, const pollfd* p) {
  StdioCore* core = mux_ ? mux_->core(x.proc) : nullptr;
  if (!core) return;
  StdioCore& c = *core;
  const short ready = POLLIN | POLLHUP | POLLERR;
  if (p[kExecOut].revents & ready) read_once(c, x.fds.terminal, proto::Stream::out, x.fds.out);
  if (p[kExecErr].revents & ready) read_once(c, false, proto::Stream::err, x.fds.err);
  if ((p[kExecIn].revents | (x.fds.terminal ? p[kExecOut].revents : 0)) & (POLLOUT | POLLERR | POLLHUP))
    write_stdin(c, x.fds);
  stdin_side(c, x.fds);
  exec_outputs_done(x);
}

void DataIo::exec_outputs_done(ExecFds& x) {
  StdioCore* c = mux_ ? mux_->core(x.proc) : nullptr;
  if (c && mux_->take_outputs_done(x.proc))
    events_.push(ev::ExecOutputsDone{x.proc, true, account(*c, x.fds, proto::Stream::out, true),
                                          err_account(*c, x.fds, true)});
}
/// Direct mode: frames what waits in `s`'s pipe and moves it to the channel with splice(2),
/// up to kDirectBurst frames while the channel takes them.
void DataIo::move_output(proto::Stream s, base::Fd& fd) {
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
      close();
      return;
    }
    frame_pipe_bytes_ = sizeof f->header;
    write_data();
  }
}

/// After move_output(): `s`'s pipe polled ready and is empty now: a read finds its EOF (or
/// bytes that came just now, which take the copying path). Not while the channel is busy
/// (the pipe is polled again once it is not).
void DataIo::read_eof(proto::Stream s, base::Fd& fd) {
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
bool DataIo::open_frame_pipe() {
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
bool DataIo::move_direct(const StdioCore::Direct& d) {
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
      close();
      return false;
    }
  }
  if (frame_pipe_bytes_ > 0) {
    ssize_t n = ::splice(frame_pipe_.get(), nullptr, data_.get(), nullptr, frame_pipe_bytes_, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n > 0) {
      seen_ = true;
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
      close();
      return false;
    }
  }
  if (frame_pipe_bytes_ == 0 && c.direct_pending() && c.direct_pending()->left == 0) c.direct_done();
  return true;
}

/// The direct frame in progress goes out as copies instead: what the frame pipe holds, then
/// the payload still in the workload's pipe (`src`), all queued in the core's tx().
bool DataIo::copy_direct(proto::Stream s, int src) {
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
    close();
    return false;
  }
  c.direct_done();
  return true;
}

/// One read of `s`'s pipe or PTY into the core's buffer (or EOF).
void DataIo::read_once(StdioCore& c, bool terminal, proto::Stream s, base::Fd& fd) {
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

void DataIo::write_stdin(StdioCore& c, StdioFds& f) {
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
void DataIo::write_data() {
  while (data_ && mux_) {
    auto t = mux_->tx();
    if (!t) return;
    if (t->direct) {
      if (!move_direct(*t->direct)) return;
      continue;
    }
    ssize_t n = ::write(data_.get(), t->bytes.data(), t->bytes.size());
    if (n > 0) {
      seen_ = true;
      mux_->sent(static_cast<std::size_t>(n));
      bytes_written_ += static_cast<std::uint64_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (mux_->workload().resume() && !mux_->workload().host_closed()) return lose(n < 0 ? std::strerror(errno) : "write");
    log_.warn("data", "write: {}; output from now on is discarded", n < 0 ? std::strerror(errno) : "wrote nothing");
    close();
    return;
  }
}

void DataIo::read_data(short revents) {
  StdioMux& m = *mux_;
  const std::size_t room = std::min(m.rx_room(), sizeof io_buf_);
  // A virtio port with no host connected polls as POLLHUP: not an EOF (there is none on a port).
  if (is_port_ && !(revents & POLLIN)) return port_hung_up();
  hup_ = false;
  if (room == 0) return;
  ssize_t n = ::read(data_.get(), io_buf_, room);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n > 0) {
    seen_ = true;
    m.on_rx(std::string_view(io_buf_, static_cast<std::size_t>(n)));
    return;
  }
  if (is_port_ && n == 0) return port_hung_up();
  if (n < 0) {
    log_.warn("data", "read: {}", std::strerror(errno));
    lose("read error");
    return;
  }
  if (m.workload().resume() && !m.workload().host_closed()) return lose("EOF without the host's close");
  // The host closed its sending side: stdin's EOF. Output may still go the other way.
  log_.info("data", "EOF from the host");
  rx_eof_ = true;
  m.on_rx_eof();
}

/// A virtio data port polled POLLHUP or read 0. Before its host took or sent bytes on it, no
/// host is connected yet: look again in kPortRetryMs. After, the host closed the data channel
/// (a port has no EOF of its own), e.g. it gave up on the output on purpose. Outside the final
/// flush (where that close is the receipt) the channel is closed here, so the workload's output
/// is discarded and counted (output_end) instead of held for good.
void DataIo::port_hung_up() {
  if (seen_ && mux_ && mux_->workload().resume() && !mux_->workload().host_closed()) return lose("port hang-up");
  if (seen_ && !flushing_) {
    log_.info("data", "the host closed the data channel (port hang-up); output from now on is discarded");
    close();
    return;
  }
  retry_at_ = monotonic_ms() + kPortRetryMs;
  hup_ = true;
}

void DataIo::close() {
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

}  // namespace nes::init
