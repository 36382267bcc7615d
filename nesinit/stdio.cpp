#include "stdio.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace nes::init {

using proto::Stream;

// ---- OutputBuffer --------------------------------------------------------------------------------

std::size_t OutputBuffer::room() const {
  if (lossy_) return kStdioChunk;
  return size() >= cap_ ? 0 : std::min(cap_ - size(), kStdioChunk);
}

void OutputBuffer::push(std::string_view b) {
  if (lossy_ && size() + b.size() > cap_) {
    std::size_t drop = size() + b.size() - cap_;
    const std::size_t old = std::min(drop, size());
    head_ += old;  // the oldest unsent bytes go first
    drop -= old;
    b.remove_prefix(drop);  // more than the whole ring: only the newest cap bytes are kept
    dropped_ += old + drop;
  }
  if (head_ > 0 && head_ >= buf_.size() / 2) {
    buf_.erase(0, head_);  // amortised: at most as many bytes moved as were consumed
    head_ = 0;
  }
  buf_.append(b);
}

void OutputBuffer::consume(std::size_t n) {
  head_ += std::min(n, size());
  if (head_ == buf_.size()) {
    buf_.clear();
    head_ = 0;
  }
}

// ---- StdioCore -----------------------------------------------------------------------------------

StdioCore::StdioCore(const proto::Stdio& s, std::uint16_t proc)
    : proc_(proc),
      terminal_(s.terminal.has_value()),
      lossy_(s.mode == proto::StdioMode::lossy),
      out_{OutputBuffer(s.buffer_bytes, s.mode == proto::StdioMode::lossy)},
      err_{OutputBuffer(s.buffer_bytes, s.mode == proto::StdioMode::lossy)},
      decoder_(proto::FrameRules{proto::FrameSender::host, s.terminal.has_value(), s.attach_stdin, false}),
      rx_rules_{proto::FrameSender::host, s.terminal.has_value(), s.attach_stdin, false},
      replay_cap_(s.replay_bytes) {
  // With a terminal there is no stderr: it is the PTY, like stdout.
  if (terminal_) err_.eof = err_.eof_sent = true;
  // Without stdin attached the workload has /dev/null (or a terminal nobody types on): nothing
  // to write or close, and a stray eof must not become a ^D.
  if (!s.attach_stdin) in_closed_ = true;
}

std::size_t StdioCore::out_room(Stream s) const {
  const Out& o = out(s);
  if (o.eof) return 0;
  if (!open_) return kStdioChunk;  // nobody to send to: read and discard
  return o.buf.room();
}

void StdioCore::on_output(Stream s, std::string_view bytes) {
  if (!open_) {
    out(s).discarded += bytes.size();
    return;
  }
  out(s).buf.push(bytes);
}

void StdioCore::on_output_eof(Stream s) { out(s).eof = true; }

bool StdioCore::outputs_done() const { return out_.eof && err_.eof; }

bool StdioCore::delivered() const {
  // The host's close frame is its receipt: it holds all it will take (the eofs came, the log
  // has every byte before them), whether or not its last acks went out before it.
  if (!resume_ || !open_ || host_closed_) return true;
  return !suspended_ && linked() && buffered() == 0 && out_.eof_sent && (terminal_ || err_.eof_sent);
}

void StdioCore::frame_more() {
  // One frame per stream per round, alternating which goes first, so a flood on one stream does
  // not starve the other. A dropped count always precedes the stream's next data.
  // Rounds are batched up to kTxBatch bytes: a virtio port takes at most 32 KiB per write(2)
  // (drivers/char/virtio_console.c) and every write is a virtqueue kick, so frames written one
  // by one would end each in a short write; batched, only the batch's tail is short.
  tx_.clear();
  tx_head_ = 0;
  if (resume_) {
    if (suspended_) return;
    tx_.swap(ctl_);  // the handshake, the replay and acks go first
    if (!linked()) return;
  }
  for (;;) {
    const std::size_t before = tx_.size();
    for (int i = 0; i < 2; ++i) {
      const Stream s = (i == 0) == err_first_ ? Stream::err : Stream::out;
      Out& o = out(s);
      if (o.buf.dropped_pending()) proto::append_dropped(tx_, s, o.buf.take_dropped(), proc_);
      const std::string_view v = o.buf.view();
      std::size_t n = std::min(v.size(), proto::kFrameDataMax);
      // Lossless resume: a full replay ring holds the rest back until the host acknowledges.
      if (resume_ && !lossy_) n = std::min(n, replay_cap_ - std::min(replay_cap_, ring_size(s)));
      if (n > 0) {
        proto::append_data(tx_, s, v.substr(0, n), proc_);
        if (resume_) keep(o, v.substr(0, n));
        o.buf.consume(n);
        o.framed += n;
      }
      if (o.eof && !o.eof_sent && o.buf.size() == 0) {
        proto::append_eof(tx_, s, proc_);
        o.eof_sent = true;
      }
    }
    err_first_ = !err_first_;
    if (tx_.size() == before || tx_.size() >= kTxBatch) break;
  }
}

void StdioCore::keep(Out& o, std::string_view bytes) {
  if (o.ring_head > 0 && o.ring_head >= o.ring.size() / 2) {
    o.ring.erase(0, o.ring_head);  // amortised, as OutputBuffer
    o.ring_head = 0;
  }
  o.ring.append(bytes);
  const std::size_t held = o.ring.size() - o.ring_head;
  if (held > replay_cap_) {  // lossy: the oldest unacknowledged bytes leave (a gap only if a resume needs them)
    o.ring_head += held - replay_cap_;
    o.ring_start += held - replay_cap_;
  }
}

void StdioCore::release(Out& o, std::uint64_t pos) {
  if (pos <= o.ring_start) return;
  const std::uint64_t n = std::min<std::uint64_t>(pos - o.ring_start, o.ring.size() - o.ring_head);
  o.ring_head += static_cast<std::size_t>(n);
  o.ring_start += n;
  if (o.ring_head == o.ring.size()) {
    o.ring.clear();
    o.ring_head = 0;
  }
}

void StdioCore::enable_resume(std::uint64_t generation, std::string_view vm) {
  if (replay_cap_ == 0) return;
  resume_ = true;
  generation_ = generation;
  vm_.assign(vm.substr(0, proto::kHelloVmMax));
  rx_rules_.resume = true;
  decoder_ = proto::FrameDecoder(rx_rules_);
  direct_ok_ = false;
  begin_handshake();
}

void StdioCore::begin_handshake() {
  suspended_ = false;
  host_closed_ = false;
  ctl_.clear();
  proto::append_hello(ctl_, generation_, vm_);
  // stdin attached: where the host resumes it (a stdin the workload closed still counts its
  // bytes, so the host re-sends nothing twice).
  // Then an ack of what the workload took: the host's window starts there, not at the position
  // (a host taking over would otherwise send a window more while the init still holds bytes).
  if (rx_rules_.input) {
    proto::append_position(ctl_, Stream::in, in_pos_, proc_);
    in_acked_ = stdin_taken();
    proto::append_ack(ctl_, Stream::in, in_acked_, proc_);
  }
  awaiting_ = 0;
  for (Out* o : {&out_, &err_}) {
    o->awaiting = !(o == &err_ && terminal_);
    awaiting_ += o->awaiting ? 1 : 0;
  }
}

void StdioCore::channel_lost() {
  if (!resume_) return channel_closed();
  suspended_ = true;
  direct_.reset();
  // What was queued and not written in full: data and eof frames come again from the ring and
  // the eof flags; a lossy dropped count would be lost with it, so it is counted again.
  std::size_t at = 0;
  while (at + proto::kFrameHeader <= tx_.size()) {
    const auto* h = reinterpret_cast<const unsigned char*>(tx_.data() + at);
    const std::size_t len = (std::size_t{h[4]} << 24) | (std::size_t{h[5]} << 16) | (std::size_t{h[6]} << 8) | h[7];
    const std::size_t end = at + proto::kFrameHeader + len;
    if (end > tx_head_ && h[1] == static_cast<unsigned char>(proto::FrameKind::dropped) && len == 8) {
      std::uint64_t n = 0;
      for (int i = 0; i < 8; ++i) n = (n << 8) | h[8 + i];
      out(static_cast<Stream>(h[0])).buf.add_dropped(n);
    }
    at = end;
  }
  tx_.clear();
  tx_head_ = 0;
  ctl_.clear();
  decoder_ = proto::FrameDecoder(rx_rules_);
  foreign_.clear();
  eof_error_.clear();
}

void StdioCore::channel_resumed() {
  if (!resume_ || !open_) return;
  begin_handshake();
}

void StdioCore::on_position(Stream s, std::uint64_t pos) {
  Out& o = out(s);
  if (!o.awaiting) {
    resume_error_ = fmt::format("position frame on {}: not during a handshake", proto::to_string(s));
    return;
  }
  if (pos > o.framed) {
    resume_error_ = fmt::format("position frame on {}: position {} ahead of the {} bytes sent", proto::to_string(s),
                                pos, o.framed);
    return;
  }
  o.awaiting = false;
  --awaiting_;
  std::uint64_t from = pos;
  if (pos < o.ring_start) {  // gone from the ring: a gap the host counts
    // A host may ask again from before an earlier gap (a replacement's stale log position):
    // those positions were counted then, so `gap` never exceeds what was framed (gap_end is an
    // earlier ring_start, which only grows: never past this one).
    o.gap += o.ring_start - std::max(pos, o.gap_end);
    o.gap_end = o.ring_start;
    from = o.ring_start;
  }
  release(o, from);
  proto::append_position(ctl_, s, from, proc_);
  proto::append_data(ctl_, s, std::string_view(o.ring).substr(o.ring_head), proc_);
  if (o.eof_sent) proto::append_eof(ctl_, s, proc_);
}

void StdioCore::on_ack(Stream s, std::uint64_t pos) {
  Out& o = out(s);
  if (pos > o.framed) {
    resume_error_ = fmt::format("ack frame on {}: position {} ahead of the {} bytes sent", proto::to_string(s), pos,
                                o.framed);
    return;
  }
  release(o, pos);
}
std::string_view StdioCore::tx() {
  if (!open_) return {};
  // While a direct frame is in progress only its own bytes (direct_fill) may go out.
  if (tx_head_ == tx_.size() && !direct_) frame_more();
  return std::string_view(tx_).substr(tx_head_);
}

void StdioCore::sent(std::size_t n) { tx_head_ = std::min(tx_head_ + n, tx_.size()); }

bool StdioCore::tx_pending() { return !tx().empty() || (open_ && direct_); }

std::size_t StdioCore::buffered() const {
  // Resume: bytes the host has not acknowledged are held too (a resume may need them).
  const std::size_t ring = resume_ ? ring_size(Stream::out) + ring_size(Stream::err) : 0;
  return out_.buf.size() + err_.buf.size() + (tx_.size() - tx_head_) + (direct_ ? direct_->left : 0) + ring;
}

bool StdioCore::direct_mode() const { return direct_ok_ && open_ && !terminal_ && !lossy_ && !resume_; }

bool StdioCore::tx_idle() const {
  if (tx_head_ != tx_.size() || direct_) return false;
  for (const Out* o : {&out_, &err_})
    if (o->buf.size() > 0 || o->buf.dropped_pending() || (o->eof && !o->eof_sent)) return false;
  return true;
}

std::size_t StdioCore::direct_room(Stream s) const {
  if (!direct_mode() || out(s).eof || !tx_idle()) return 0;
  return proto::kFrameDataMax;
}

std::optional<StdioCore::DirectFrame> StdioCore::direct_begin(Stream s, std::size_t avail) {
  const std::size_t n = std::min(avail, direct_room(s));
  if (n == 0) return std::nullopt;
  DirectFrame f;
  f.bytes = n;
  std::string h;
  proto::append_data_header(h, s, n, proc_);
  std::memcpy(f.header, h.data(), proto::kFrameHeader);
  direct_ = Direct{s, n};
  err_first_ = s == Stream::out;  // the other stream goes first next time
  return f;
}

void StdioCore::direct_taken(std::size_t n) {
  if (!direct_) return;
  n = std::min(n, direct_->left);
  direct_->left -= n;
  out(direct_->stream).framed += n;
}

void StdioCore::direct_fill(std::string_view framed) {
  direct_ok_ = false;
  if (!direct_ || !open_) return;
  if (tx_head_ == tx_.size()) {
    tx_.clear();
    tx_head_ = 0;
  }
  tx_.append(framed);
}

const std::string& StdioCore::rx_error() const {
  return decoder_.failed() ? decoder_.error() : !resume_error_.empty() ? resume_error_ : eof_error_;
}

std::size_t StdioCore::rx_room() const {
  if (!open_ || suspended_ || !rx_error().empty() || !foreign_.empty()) return 0;
  const std::size_t held = in_.size() - in_head_;
  // The decoder may hand over a whole data frame from what is read: leave room for one.
  if (held + proto::kFrameDataMax > kStdinCap) return 0;
  return std::min(kStdinCap - proto::kFrameDataMax - held, kStdioChunk);
}

bool StdioCore::open_process(std::uint16_t proc, const proto::Stdio& s) {
  return decoder_.open_process(proc, proto::FrameRules{proto::FrameSender::host, s.terminal.has_value(),
                                                       s.attach_stdin, false});
}

void StdioCore::on_rx(std::string_view bytes) {
  while (resume_error_.empty() && !suspended_) {
    auto f = decoder_.next(bytes);
    if (!f) break;
    if (f->proc != proc_) foreign_.push_back(std::move(*f));
    else on_frame(*f);
  }
}

void StdioCore::on_frame(const proto::Frame& f) {
  if (resume_ && !linked() && f.kind != proto::FrameKind::position && f.kind != proto::FrameKind::close) {
    // The host's positions open every connection; nothing else may come before them.
    resume_error_ = fmt::format("{} frame on {}: before the host's positions", proto::to_string(f.kind),
                                proto::to_string(f.stream));
    return;
  }
  switch (f.kind) {
    case proto::FrameKind::data:
      in_pos_ += f.data.size();
      if (in_closed_) {  // the workload closed its stdin: nobody reads these (taken: discarded)
        ack_stdin();
        break;
      }
      if (in_head_ > 0 && in_head_ >= in_.size() / 2) {
        in_.erase(0, in_head_);
        in_head_ = 0;
      }
      in_ += f.data;
      break;
    case proto::FrameKind::eof:
      if (in_eof_) break;  // again after a resume: it ended once
      in_eof_ = true;
      queue_veof();
      break;
    case proto::FrameKind::resize: resize_ = proto::Terminal{f.rows, f.cols}; break;
    case proto::FrameKind::position: on_position(f.stream, f.position); break;
    case proto::FrameKind::ack: on_ack(f.stream, f.position); break;
    case proto::FrameKind::close: host_closed_ = true; break;
    case proto::FrameKind::dropped:
    case proto::FrameKind::hello: break;  // not legal from the host: the decoder refused it
  }
}

void StdioCore::on_rx_eof() {
  if (!decoder_.idle()) {
    // A partial frame at EOF: a framing error like any other.
    if (!decoder_.failed() && eof_error_.empty())
      eof_error_ = fmt::format("data channel closed inside a frame (at byte {})", decoder_.offset());
    return;
  }
  if (!in_eof_) {
    in_eof_ = true;
    queue_veof();
  }
}

void StdioCore::queue_veof() {
  if (!terminal_ || in_closed_) return;
  in_ += '\x04';  // a PTY has no half-close: its VEOF, ^D
  in_veof_ = true;
}

std::uint64_t StdioCore::stdin_taken() const {
  if (in_closed_) return in_pos_;
  const std::size_t held = in_.size() - in_head_ - (in_veof_ ? 1 : 0);
  return in_pos_ - held;
}

void StdioCore::ack_stdin() {
  if (!resume_ || !rx_rules_.input || suspended_ || !open_) return;
  const std::uint64_t t = stdin_taken();
  if (t < in_acked_ + kStdinAckStep) return;
  proto::append_ack(ctl_, Stream::in, t, proc_);
  in_acked_ = t;
}

void StdioCore::in_written(std::size_t n) {
  in_head_ = std::min(in_head_ + n, in_.size());
  if (in_head_ == in_.size()) {
    in_.clear();
    in_head_ = 0;
    in_veof_ = false;
  }
  ack_stdin();
}

void StdioCore::in_closed() {
  in_closed_ = true;
  in_.clear();
  in_head_ = 0;
  in_veof_ = false;
  ack_stdin();
}

void StdioCore::channel_closed() {
  open_ = false;
  suspended_ = false;
  direct_.reset();
  for (Out* o : {&out_, &err_}) {
    o->discarded += o->buf.size();
    o->buf.consume(o->buf.size());
    o->ring.clear();  // framed (in `sent`): the host counts what it lacks
    o->ring_head = 0;
    o->ring_start = o->framed;
  }
  ctl_.clear();
  tx_.clear();
  tx_head_ = 0;
}

// ---- fds -----------------------------------------------------------------------------------------

namespace {
base::Error sys_error(std::string_view what) { return base::errno_error(errno, what); }

void set_nonblock(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }
}  // namespace

base::Result<StdioFds> make_stdio(const proto::Stdio& s) {
  StdioFds f;
  if (s.terminal) {
    f.terminal = true;
    f.out.reset(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!f.out) return sys_error("stdio: posix_openpt");
    if (::grantpt(f.out.get()) != 0) return sys_error("stdio: grantpt");
    if (::unlockpt(f.out.get()) != 0) return sys_error("stdio: unlockpt");
    char name[128];
    if (::ptsname_r(f.out.get(), name, sizeof name) != 0) return sys_error("stdio: ptsname");
    // O_NOCTTY here: the init must never get a controlling terminal; the child takes it with
    // TIOCSCTTY after setsid.
    f.child_in.reset(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!f.child_in) return sys_error(fmt::format("stdio: open {}", name));
    winsize ws{};
    ws.ws_row = s.terminal->rows;
    ws.ws_col = s.terminal->cols;
    if (::ioctl(f.out.get(), TIOCSWINSZ, &ws) != 0) return sys_error("stdio: TIOCSWINSZ");
    set_nonblock(f.out.get());
    return f;
  }
  int p[2];
  if (s.attach_stdin) {
    if (::pipe2(p, O_CLOEXEC) != 0) return sys_error("stdio: pipe (stdin)");
    f.child_in.reset(p[0]);
    f.in.reset(p[1]);
    set_nonblock(f.in.get());
  } else {
    f.child_in.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!f.child_in) return sys_error("stdio: open /dev/null");
  }
  if (::pipe2(p, O_CLOEXEC) != 0) return sys_error("stdio: pipe (stdout)");
  f.out.reset(p[0]);
  f.child_out.reset(p[1]);
  if (::pipe2(p, O_CLOEXEC) != 0) return sys_error("stdio: pipe (stderr)");
  f.err.reset(p[0]);
  f.child_err.reset(p[1]);
  set_nonblock(f.out.get());
  set_nonblock(f.err.get());
  // Lossless output waits in the pipes themselves (the init moves it on with splice(2) when the
  // channel takes it): give each the stream's buffer, so a workload blocks no sooner than with
  // a buffer in the init. Beyond fs.pipe-max-size this needs CAP_SYS_RESOURCE (a guest's PID 1
  // has it); a pipe the kernel would not grow leaves the bytes to the init's own buffer instead.
  if (s.mode == proto::StdioMode::lossless) {
    const int want = static_cast<int>(std::max<std::uint32_t>(s.buffer_bytes, 65536));
    f.pipes_hold_buffer = true;
    for (int fd : {f.out.get(), f.err.get()}) {
      ::fcntl(fd, F_SETPIPE_SZ, want);
      if (::fcntl(fd, F_GETPIPE_SZ) < static_cast<int>(s.buffer_bytes)) f.pipes_hold_buffer = false;
    }
  }
  return f;
}

}  // namespace nes::init
