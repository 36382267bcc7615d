// The workload's stdio on the data channel (docs/protocol.md "Data channel"), in two parts:
// - StdioCore, sans-I/O: bytes read from the workload's output go in, data-channel frames come
//   out; frames from the host go in, bytes for the workload's stdin come out. It decides every
//   bound (how much may be read from which fd now) and never touches an fd, so its rules are
//   tested by driving it directly (tests/init/stdio_test.cpp).
// - make_stdio: the fds themselves, pipes or a pseudo-terminal, for the loop to poll.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/fd.hpp"
#include "base/result.hpp"
#include "protocol/frame.hpp"
#include "protocol/messages.hpp"

namespace nes::init {

/// Largest single read from a pipe, the PTY or the data channel: bytes.
inline constexpr std::size_t kStdioChunk = 65536;
/// Framed bytes prepared for one run of writes to the data channel, at most (plus one round).
inline constexpr std::size_t kTxBatch = 256u << 10;
/// Bytes from the host held for the workload's stdin before the init stops reading the data
/// channel (the host is then backpressured by its transport). With resume, the host's window
/// (proto::kStdinWindow, one send past it) bounds what is held below this, so the channel is
/// always read and the host's output acks never wait behind stdin.
inline constexpr std::size_t kStdinCap = 2 * proto::kStdinWindow + 2 * proto::kFrameDataMax;
/// Data channel resume: the init acknowledges stdin (an ack frame) each time the workload took
/// this many more bytes (written into its pipe or PTY, or discarded once it closed stdin), so
/// the host's window moves as the workload reads, never as the init merely buffers.
inline constexpr std::uint64_t kStdinAckStep = 64 * 1024;

/// One output stream's unsent bytes: at most `cap`. Lossless: the reader stops when full (room()
/// is 0). Lossy: a ring that drops the oldest unsent bytes and counts them.
class OutputBuffer {
 public:
  OutputBuffer(std::size_t cap, bool lossy) : cap_(cap), lossy_(lossy) {}
  /// Bytes the reader may read now (lossless: cap - size; lossy: always kStdioChunk).
  std::size_t room() const;
  /// Append what was read; in lossy mode the oldest bytes beyond `cap` are dropped and counted.
  void push(std::string_view bytes);
  /// Unsent bytes, oldest first.
  std::string_view view() const { return std::string_view(buf_).substr(head_); }
  /// Remove the first `n` bytes (they were framed).
  void consume(std::size_t n);
  std::size_t size() const { return buf_.size() - head_; }
  /// Bytes dropped since the last take_dropped() (lossy only).
  std::uint64_t take_dropped() { return std::exchange(dropped_, 0); }
  std::uint64_t dropped_pending() const { return dropped_; }
  /// A dropped count taken but never sent (its frame died with a lost channel) is due again.
  void add_dropped(std::uint64_t n) { dropped_ += n; }

 private:
  std::size_t cap_;
  bool lossy_;
  std::string buf_;
  std::size_t head_ = 0;  // bytes at the front already consumed (compacted lazily)
  std::uint64_t dropped_ = 0;
};

/// The init's side of one process's stdio, without fds: the workload's (process 0) or that of a
/// process `exec` started (its number, framed in bytes 2-3). Streams: stdout and stderr (with a
/// terminal only stdout, which carries the PTY's output) and stdin. Call order is free; every
/// query reflects all calls so far. The workload's core decodes the whole data channel: frames
/// of other processes are held (take_foreign()) for StdioMux, which hands them to theirs
/// (on_frame()) and decides what the cores sharing the channel do together (stdio_mux.hpp).
class StdioCore {
 public:
  explicit StdioCore(const proto::Stdio& s, std::uint16_t proc = 0);
  std::uint16_t proc() const { return proc_; }

  // ---- workload output -> data channel
  /// Bytes the loop may read from `s`'s pipe (or the PTY, stdout) now; 0: do not read it.
  std::size_t out_room(proto::Stream s) const;
  /// Bytes were read from `s`.
  void on_output(proto::Stream s, std::string_view bytes);
  /// `s`'s pipe (or the PTY) reached EOF: after its buffered bytes, an eof frame follows.
  void on_output_eof(proto::Stream s);
  /// Both output streams reached EOF (with a terminal: the PTY). Their frames are queued.
  bool outputs_done() const;
  /// Resume: every byte framed is acknowledged by a host (the rings and tx are empty), the eofs
  /// are framed and the channel is linked; without resume, true. With it the workload's exit is
  /// reported only once a host holds its whole output (StdioMux::take_outputs_done), so a host
  /// that took over meanwhile never records an outcome before the output it still has to get.
  bool delivered() const;
  /// Framed bytes to write to the data channel now ("" when nothing is due). Stable until sent().
  std::string_view tx();
  /// `n` bytes of tx() were written.
  void sent(std::size_t n);
  /// True while frames are buffered or due (the loop polls for POLLOUT).
  bool tx_pending();
  /// Framed bytes of the batch tx() began are not all written, or a direct frame is not all
  /// moved: what no other process's bytes may interrupt on a shared channel (StdioMux).
  bool tx_unfinished() const { return open_ && (tx_head_ != tx_.size() || direct_); }
  /// Bytes of output held (both streams and framed), for the loop's flush decisions and tests.
  std::size_t buffered() const;

  // ---- workload output -> data channel without passing through the init (splice(2))
  // Lossless output from pipes need not be copied into the init and out again: the loop may
  // move it from the pipe to the channel with splice(2). The core frames it all the same: a
  // direct frame is a data frame whose header the loop sends first and whose payload it then
  // takes from the stream's pipe, exactly as many bytes as the header says, before any other
  // frame goes out. Until taken the bytes stay in the pipe, so a workload blocks when the host
  // is slow, as lossless mode wants.
  /// Direct frames are possible: pipes (no terminal), lossless, no resume (a spliced byte
  /// leaves no copy for the replay ring), the channel open, and the loop has not given up on
  /// them (direct_fill()).
  bool direct_mode() const;
  /// Payload bytes a new direct frame of `s` may carry now (0: not now: the stream is at EOF,
  /// bytes are buffered or framed, or a direct frame is in progress).
  std::size_t direct_room(proto::Stream s) const;
  /// A direct frame just begun: `header` (kFrameHeader bytes) goes to the channel first, then
  /// `bytes` payload bytes from the stream's pipe.
  struct DirectFrame {
    std::size_t bytes = 0;
    char header[proto::kFrameHeader] = {};
  };
  /// `avail` bytes (>= 1) wait in `s`'s pipe: begins a direct frame of min(avail,
  /// direct_room(s)) of them; nullopt when direct_room(s) is 0.
  std::optional<DirectFrame> direct_begin(proto::Stream s, std::size_t avail);
  /// The direct frame in progress: its stream and its payload bytes still in the workload's pipe.
  struct Direct {
    proto::Stream stream;
    std::size_t left;
  };
  std::optional<Direct> direct_pending() const { return open_ ? direct_ : std::nullopt; }
  /// `n` payload bytes of the frame in progress were taken from the pipe.
  void direct_taken(std::size_t n);
  /// The frame in progress is out in full (header and payload): frames may follow.
  void direct_done() { direct_.reset(); }
  /// The channel's fd cannot take spliced bytes: `framed` bytes of the frame in progress
  /// (header and payload, in order, after those already sent) are queued for tx() instead, and
  /// no direct frame begins again in this session.
  void direct_fill(std::string_view framed);
  /// Direct frames cannot be used at all (the loop could not set them up): none begin.
  void direct_unsupported() { direct_ok_ = false; }
  /// Which output stream the loop should serve first in this round (alternates with each
  /// direct frame, so a flood on one stream does not starve the other).
  proto::Stream first_stream() const { return err_first_ ? proto::Stream::err : proto::Stream::out; }

  // ---- data channel -> workload stdin
  /// Bytes the loop may read from the data channel now (0: stop reading it; backpressure).
  std::size_t rx_room() const;
  /// Bytes read from the data channel. Frames are decoded; a framing error closes the channel.
  void on_rx(std::string_view bytes);
  /// One decoded frame for this core's process (stdin data/eof, resize).
  void on_frame(const proto::Frame& f);
  /// Frames decoded by on_rx() that belong to another process, oldest first; taking clears them.
  std::vector<proto::Frame> take_foreign() { return std::exchange(foreign_, {}); }
  /// Frames of process `proc` are legal on the channel from now on (its `exec.stdio`).
  bool open_process(std::uint16_t proc, const proto::Stdio& s);
  /// Process `proc` was reported: its late frames are skipped.
  void close_process(std::uint16_t proc) { decoder_.close_process(proc); }
  /// The host closed its side: stdin's eof (an EOF inside a frame is a framing error).
  void on_rx_eof();
  /// Bytes due to the workload's stdin (pipe or PTY master) now.
  std::string_view in_pending() const { return std::string_view(in_).substr(in_head_); }
  /// `n` bytes of in_pending() were written.
  void in_written(std::size_t n);
  /// stdin's eof was received and every byte before it written: close the stdin pipe now (with a
  /// terminal: the PTY stays open; its EOF character ^D was queued instead). The loop then calls
  /// in_closed().
  bool in_close_due() const { return in_eof_ && !in_closed_ && in_pending().empty(); }
  /// The workload's stdin is closed (the loop closed it, or a write said EPIPE): later stdin
  /// data is discarded, as a pipe nobody reads would.
  void in_closed();
  /// A resize from the host not yet applied (TIOCSWINSZ), if any; taking it clears it.
  std::optional<proto::Terminal> take_resize() { return std::exchange(resize_, std::nullopt); }

  // ---- the data channel itself
  /// The first framing error the host caused ("" if none); the loop closes the channel.
  const std::string& rx_error() const;
  /// The data channel is gone (error, write failure, power-off): output is read and discarded
  /// from now on, so the workload never blocks on a channel that no longer exists.
  void channel_closed();
  bool channel_open() const { return open_; }
  bool terminal() const { return terminal_; }

  // ---- data channel resume (docs/protocol.md "Data channel resume"; the workload's core only)
  // Every output stream's payload has positions (bytes since it began); each byte framed stays
  // in the stream's replay ring (at most `boot.stdio.replay_bytes`) until the host acknowledges
  // it (an ack frame), so a redialled channel resumes where the host stands. Lossless: a full
  // ring stops framing (the buffer, then the pipe, then the workload wait). Lossy: the oldest
  // bytes leave the ring; only a resume that needs them counts them (a gap). Each connection
  // begins with the handshake: the init's hello and stdin position go first; it frames nothing
  // else until the host's position of every output stream arrived, then sends each stream's
  // position (past a gap: ahead of the host's), what the ring holds from there, and its eof if
  // it was framed.
  /// Turns resume on (`s.replay_bytes` > 0 from the constructor's stdio) and begins the first
  /// connection's handshake. `generation`, `vm`: the session's (boot), for the hello frame.
  void enable_resume(std::uint64_t generation, std::string_view vm);
  bool resume() const { return resume_; }
  /// The channel was lost (no close frame from the host): nothing goes out until
  /// channel_resumed(); output stays (lossless: the workload blocks once the buffers are full).
  /// Frames queued and not written are forgotten (their data is in the ring; a lossy dropped
  /// count in them is counted again).
  void channel_lost();
  /// A redialled channel is connected: the handshake begins again (a fresh frame decoder).
  void channel_resumed();
  /// True between channel_lost() and channel_resumed().
  bool suspended() const { return suspended_; }
  /// The handshake of this connection is over (every output stream's position came).
  bool linked() const { return !resume_ || awaiting_ == 0; }
  /// The host's close frame came: its next EOF is on purpose (the receipt, or a cut), not a loss.
  bool host_closed() const { return host_closed_; }
  /// Position of the oldest byte of `s` the ring holds (== framed_total(s) when empty).
  std::uint64_t ring_start(proto::Stream s) const { return out(s).ring_start; }
  /// Bytes of `s` held in the ring (framed, not acknowledged).
  std::size_t ring_size(proto::Stream s) const { return out(s).ring.size() - out(s).ring_head; }
  /// Payload bytes of `s` framed in all, resume gaps included: the stream's next position.
  std::uint64_t framed_total(proto::Stream s) const { return out(s).framed; }
  /// Bytes of `s` a resume found gone from the ring (sent as a position jump: the host counts them).
  std::uint64_t gap(proto::Stream s) const { return out(s).gap; }
  /// Stdin payload bytes received from the host in all: the init's stdin position.
  std::uint64_t stdin_position() const { return in_pos_; }
  /// Stdin payload bytes the workload took (written to it, or discarded after it closed its
  /// stdin): what the init's stdin acks report. stdin_position() minus what is held.
  std::uint64_t stdin_taken() const;

  // ---- the account of each output stream (docs/protocol.md "output_end")
  /// Payload bytes of `s` framed for the data channel so far (written or still queued), less
  /// what a resume found gone from the replay ring: what `output_end.sent` reports.
  std::uint64_t framed(proto::Stream s) const { return out(s).framed - out(s).gap; }
  /// Bytes of `s` the init threw away unframed: held when the channel closed, or read after it.
  /// With the pipe's unread bytes (FIONREAD, the loop's), what `output_end.unsent` reports.
  std::uint64_t discarded(proto::Stream s) const { return out(s).discarded; }
  /// Bytes of `s` read from its pipe and held, not yet framed.
  std::size_t held(proto::Stream s) const { return out(s).buf.size(); }
  /// `s`'s eof frame is framed: nothing of it can be lost by the init any more.
  bool eof_framed(proto::Stream s) const { return out(s).eof_sent; }

 private:
  struct Out {
    explicit Out(OutputBuffer b) : buf(std::move(b)) {}
    OutputBuffer buf;
    bool eof = false;       // the pipe reached EOF
    bool eof_sent = false;  // its eof frame is framed
    std::uint64_t framed = 0;     // payload bytes framed (or taken into a direct frame)
    std::uint64_t discarded = 0;  // bytes thrown away unframed (the channel is gone)
    // Resume: framed bytes not acknowledged, positions [ring_start, framed).
    std::string ring;
    std::size_t ring_head = 0;
    std::uint64_t ring_start = 0;
    std::uint64_t gap = 0;        // bytes a resume found gone from the ring, each position once
    std::uint64_t gap_end = 0;    // the end of the last gap: positions below it are counted already
    bool awaiting = false;        // this connection's position for it has not come yet
  };
  Out& out(proto::Stream s) { return s == proto::Stream::err ? err_ : out_; }
  const Out& out(proto::Stream s) const { return s == proto::Stream::err ? err_ : out_; }
  void frame_more();
  /// Resume: `n` bytes (the front of `o.buf`) framed: into the ring (lossy: the oldest leave).
  void keep(Out& o, std::string_view bytes);
  /// Resume: the ring of `o` forgets positions before `pos`.
  static void release(Out& o, std::uint64_t pos);
  void begin_handshake();
  void on_position(proto::Stream s, std::uint64_t pos);
  void on_ack(proto::Stream s, std::uint64_t pos);
  /// Resume: an ack of stdin when the workload took kStdinAckStep more since the last one.
  void ack_stdin();
  /// stdin's eof reached a terminal: its ^D queued after the held bytes (not a payload byte).
  void queue_veof();
  /// tx() is written out and framing would add nothing: a direct frame may start.
  bool tx_idle() const;

  std::uint16_t proc_;
  bool terminal_;
  bool lossy_;
  bool open_ = true;
  std::vector<proto::Frame> foreign_;
  bool direct_ok_ = true;
  std::optional<Direct> direct_;  // the direct frame whose payload is not all moved yet
  Out out_, err_;
  std::string tx_;
  std::size_t tx_head_ = 0;
  bool err_first_ = false;  // round-robin between the two streams, one frame each
  proto::FrameDecoder decoder_;
  std::string in_;
  std::size_t in_head_ = 0;
  bool in_eof_ = false;
  bool in_veof_ = false;  // in_ ends with the PTY's ^D (not a payload byte)
  bool in_closed_ = false;
  std::optional<proto::Terminal> resize_;
  std::string eof_error_;  // the channel ended inside a frame
  // Resume.
  proto::FrameRules rx_rules_;
  std::size_t replay_cap_ = 0;
  bool resume_ = false;
  bool suspended_ = false;
  bool host_closed_ = false;
  int awaiting_ = 0;            // output streams whose position has not come on this connection
  std::uint64_t generation_ = 0;
  std::string vm_;
  std::string ctl_;             // control frames (hello, positions, acks, the replay) for the next batch
  std::uint64_t in_pos_ = 0;    // stdin payload bytes received
  std::uint64_t in_acked_ = 0;  // stdin_taken() as of the last ack sent
  std::string resume_error_;    // the host broke the handshake or acked ahead
};

/// The fds of a workload's stdio. `child[i]` become the workload's fds 0..2 (the PTY slave for
/// all three with a terminal); the init keeps the others, all O_CLOEXEC|O_NONBLOCK.
struct StdioFds {
  base::Fd child_in, child_out, child_err;  // closed by the loop right after the spawn
  base::Fd in;    // write end of the stdin pipe (pipes with stdin attached), or none
  base::Fd out;   // read end of the stdout pipe, or the PTY master (read and write)
  base::Fd err;   // read end of the stderr pipe (pipes only)
  bool terminal = false;
  /// Lossless pipes each hold the stream's buffer_bytes (F_SETPIPE_SZ): output may wait in them
  /// and move to the channel with splice(2) (StdioCore's direct frames).
  bool pipes_hold_buffer = false;
};

/// Opens the fds `s` asks for: pipes (stdin from /dev/null unless attached), or a PTY from
/// /dev/ptmx sized rows x cols. Returns the fds, or an error naming the step, with its errno.
base::Result<StdioFds> make_stdio(const proto::Stdio& s);

}  // namespace nes::init
