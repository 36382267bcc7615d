// The data channel's binary frames: the workload's stdin/stdout/stderr beside the lifecycle
// channel (docs/protocol.md "Data channel"). The header is modelled on docker's multiplexed attach
// stream (8 bytes: stream, then a big-endian length), with a kind byte for eof/resize/dropped.
// Sans-I/O: the encoder appends bytes to a string, the decoder is fed bytes in any split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nes::proto {

/// Which of the workload's streams a frame belongs to (byte 0). Not named stdin/stdout/stderr:
/// those are macros in <stdio.h>.
enum class Stream : std::uint8_t { in = 0, out = 1, err = 2 };

/// What a frame carries (byte 1). 4..7 are data channel resume's (docs/protocol.md "Data channel
/// resume"), legal only when `boot.stdio.replay_bytes` is set: ack, position (u64 stream
/// positions), hello (the guest's first frame: generation and VM), close (the host closes on
/// purpose: not a loss).
enum class FrameKind : std::uint8_t { data = 0, eof = 1, resize = 2, dropped = 3, ack = 4, position = 5, hello = 6, close = 7 };

/// Header size in bytes: stream, kind, u16 big-endian process number, u32 big-endian payload
/// length.
inline constexpr std::size_t kFrameHeader = 8;
/// Largest payload of a data frame, in bytes (a data frame carries 1..kFrameDataMax bytes).
inline constexpr std::size_t kFrameDataMax = 65536;
/// Data channel resume's stdin window, bytes: a host keeps at most this much of the workload's
/// stdin sent and not yet taken by the workload (the guest's stdin acks say what it took; one
/// send may go past it by its own size). The init's stdin buffer holds twice this plus two
/// frames, so it always has room to read the channel and the host's output acks, which share
/// it, never wait behind stdin (docs/protocol.md "Data channel resume", "Acks").
inline constexpr std::size_t kStdinWindow = 256u << 10;
/// Processes started by `exec` that may run at once in one session (docs/protocol.md "Exec").
inline constexpr std::size_t kExecMax = 16;
/// Longest VM name a hello frame carries, bytes (its payload: u64 generation, then the name).
inline constexpr std::size_t kHelloVmMax = 255;

/// One decoded frame. Only the member of its kind is meaningful: `data` for data (1..65536
/// bytes), `rows`/`cols` for resize (each >= 1, character cells), `dropped` for dropped (bytes
/// lost to lossy mode since the previous data frame of that stream), `position` for ack and
/// position (bytes of that stream's payload since it began), `generation` and `data` (the VM's
/// name) for hello. `proc`: whose streams (bytes 2-3): 0 the workload, 1..65535 the process
/// `exec` started with that number.
struct Frame {
  std::uint16_t proc = 0;
  Stream stream = Stream::out;
  FrameKind kind = FrameKind::data;
  std::string data;
  std::uint16_t rows = 0;
  std::uint16_t cols = 0;
  std::uint64_t dropped = 0;
  std::uint64_t position = 0;
  std::uint64_t generation = 0;
  bool operator==(const Frame&) const = default;
};

/// "stdin", "stdout", "stderr" (the CRI log's names for the output streams).
std::string_view to_string(Stream s);
/// "data", "eof", "resize", "dropped", "ack", "position", "hello", "close".
std::string_view to_string(FrameKind k);

// ---- encoding ----------------------------------------------------------------------------------

/// Appends data frames carrying `bytes` on `s` to `out`, split at kFrameDataMax; nothing when
/// `bytes` is empty (an empty data frame does not exist on the wire).
void append_data(std::string& out, Stream s, std::string_view bytes, std::uint16_t proc = 0);
/// Appends only the header of a data frame of `len` (1..kFrameDataMax) bytes on `s`: the
/// caller sends exactly `len` payload bytes after it (the init moves them with splice(2)).
void append_data_header(std::string& out, Stream s, std::size_t len, std::uint16_t proc = 0);
/// Appends an eof frame (no payload) on `s`.
void append_eof(std::string& out, Stream s, std::uint16_t proc = 0);
/// Appends a resize frame (stream stdin). Precondition: rows, cols >= 1 (else the peer refuses it).
void append_resize(std::string& out, std::uint16_t rows, std::uint16_t cols, std::uint16_t proc = 0);
/// Appends a dropped frame on `s` (u64 big-endian count of bytes dropped).
void append_dropped(std::string& out, Stream s, std::uint64_t count, std::uint16_t proc = 0);
/// Appends an ack frame on `s` (u64 big-endian position): host -> guest on stdout/stderr, the
/// bytes before `position` are safe on the host; guest -> host on stdin, the stdin bytes before
/// `position` are the init's.
void append_ack(std::string& out, Stream s, std::uint64_t position, std::uint16_t proc = 0);
/// Appends a position frame on `s` (u64 big-endian): the resume handshake's "next byte of `s`".
void append_position(std::string& out, Stream s, std::uint64_t position, std::uint16_t proc = 0);
/// Appends the guest's hello (stream stdin, process 0): u64 generation, then `vm` (at most
/// kHelloVmMax bytes; longer is the caller's error, refused by the peer).
void append_hello(std::string& out, std::uint64_t generation, std::string_view vm);
/// Appends the host's close (stream stdin, process 0, no payload).
void append_close(std::string& out);
/// Appends `f` as written (a data frame over kFrameDataMax is split like append_data).
void append_frame(std::string& out, const Frame& f);
/// `f` as bytes (append_frame to an empty string).
std::string encode_frame(const Frame& f);

// ---- decoding ----------------------------------------------------------------------------------

/// Who sent the bytes a decoder reads: it decides which streams and kinds are legal.
/// host: stdin data/eof and resize; guest: stdout/stderr data/eof and dropped.
enum class FrameSender { host, guest };

/// What the receiver knows of the session (from `boot.stdio`), beyond the frame grammar.
struct FrameRules {
  FrameSender sender = FrameSender::guest;
  bool terminal = false;  // a PTY: resize is legal (host); all output is stdout (guest)
  bool input = false;     // stdin attached: stdin data/eof legal (host)
  bool lossy = false;     // lossy mode: dropped frames legal (guest)
  bool resume = false;    // boot.stdio.replay_bytes: ack, position, hello (guest), close (host) legal
};

/// Sans-I/O incremental decoder of one direction of the data channel. Feed bytes in any split;
/// it holds at most one frame (kFrameHeader + kFrameDataMax bytes). The first framing error is
/// final: the decoder consumes nothing more and the receiver closes the data channel.
/// Process 0 (the workload) is judged by the constructor's rules; a process started by `exec`
/// only once open_process() gave its own, and a closed one's late frames are skipped.
/// Errors name the kind, the stream and what is wrong, e.g. `data frame: stream 7 unknown`,
/// `eof frame on stdout: stream already at eof`, each followed by ` (frame at byte N)`.
/// Framing errors (docs/protocol.md): unknown stream or kind, reserved bytes non-zero, a length
/// over the cap or wrong for the kind, a frame after eof on its stream, a stream or kind the
/// sender may not send, resize without a terminal or with a zero size, a process never opened,
/// a resume frame (ack, position, hello, close) without `resume` or on a stream it does not
/// name (hello and close: stdin of process 0; ack and position: stdin from the guest, an output
/// stream from the host). Resume frames are not judged by their stream's eof.
class FrameDecoder {
 public:
  explicit FrameDecoder(FrameRules rules);
  /// Frames of process `proc` (1..65535) are legal from now on, judged by `rules` (its own
  /// `exec.stdio`), its streams not at eof. At most kExecMax are open at once (false: refused).
  bool open_process(std::uint16_t proc, FrameRules rules);
  /// `proc` is over: frames of it still in flight are consumed and skipped, not returned.
  void close_process(std::uint16_t proc);
  /// Consumes bytes from the front of `in` until one frame is complete (returned), `in` is used
  /// up (nullopt), or an error is found (nullopt; failed() is then true). `in` is advanced past
  /// what was consumed: call again with the rest. Never reads past a frame it returns.
  std::optional<Frame> next(std::string_view& in);
  /// True once a framing error was found.
  bool failed() const { return !error_.empty(); }
  /// The error's reason ("" if none).
  const std::string& error() const { return error_; }
  /// True when no partial frame is buffered: an EOF of the byte stream here is clean.
  bool idle() const { return have_ == 0 && !failed(); }
  /// True once an eof frame arrived on `s`.
  bool at_eof(Stream s) const { return eof_[static_cast<std::size_t>(s)]; }
  /// Bytes consumed so far (offset of the next byte in the channel).
  std::uint64_t offset() const { return offset_; }

 private:
  struct Proc {
    std::uint16_t proc = 0;
    FrameRules rules;
    bool eof[3] = {false, false, false};
  };
  bool check_header();
  bool finish(Frame& out);
  bool fail(std::string reason);

  FrameRules rules_;
  std::vector<Proc> procs_;    // open exec'd processes, at most kExecMax
  std::uint16_t highest_ = 0;  // the highest process number ever opened
  bool skip_ = false;          // the current frame belongs to a closed process
  std::uint16_t proc_ = 0;     // the current frame's process
  unsigned char hdr_[kFrameHeader] = {};
  std::size_t have_ = 0;       // bytes of the current frame received (header + payload)
  std::uint32_t len_ = 0;      // payload length of the current frame (valid after the header)
  std::string payload_;
  std::uint64_t offset_ = 0;   // bytes consumed before this call's position
  std::uint64_t start_ = 0;    // offset of the current frame's first byte
  bool eof_[3] = {false, false, false};
  std::string error_;
};

}  // namespace nes::proto
