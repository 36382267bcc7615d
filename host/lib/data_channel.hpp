// The host end of a VM's data channel: the workload's stdin/stdout/stderr as binary frames
// (protocol/frame.hpp, docs/protocol.md "Data channel") on a connection of their own beside the
// lifecycle channel. DataReceiver is the sans-I/O core (frames in, events out); DataLink is the
// thin Asio object around it that Host owns per VM: bounded reads (paused while the embedder or
// the log cannot keep up), a bounded stdin queue, never a wait on the lifecycle channel. A framing
// error ends only the data channel; the session and its outcome go on. Why: docs/host.md
// "Workload output".
#pragma once

#include <utility>  // before Asio 1.74

#include <boost/asio/io_context.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "host/lib/log_writer.hpp"
#include "host/lib/base.hpp"
#include "protocol/channels.hpp"
#include "protocol/frame.hpp"
#include "protocol/messages.hpp"

namespace nes::host {

/// Embedder callbacks for workload stdio, called on the io_context thread; they must not block
/// (queue and return; call Host::pause_output() to stop the flow while a consumer is behind).
/// `vm` names the VM (from the endpoint, never from guest data).
struct StdioHooks {
  /// Bytes the workload wrote to `stream` (out or err), in order, 1..65536 per call.
  std::function<void(const std::string& vm, proto::Stream stream, std::string_view bytes)> data;
  /// The workload's `stream` reached its end (no more data on it).
  std::function<void(const std::string& vm, proto::Stream stream)> eof;
  /// Lossy mode: the guest dropped `bytes` of `stream` before the next data of that stream.
  std::function<void(const std::string& vm, proto::Stream stream, std::uint64_t bytes)> dropped;
  /// The data channel ended: `error` empty for a clean end, else why (a framing error such as
  /// "data frame: stream 7 unknown (frame at byte 0)", a read error, closed mid-frame).
  std::function<void(const std::string& vm, const std::string& error)> closed;
  /// The stdin queue fell below half its cap after send_stdin() refused: send more now.
  std::function<void(const std::string& vm)> stdin_writable;
};

/// The built-in workload log (docs/host.md): STATE/VM/workload.log, CRI format, rotated.
struct WorkloadLogOptions {
  bool enabled = true;
  std::uint64_t max_size = 10u << 20;  // bytes per file (LogOptions::max_size)
  unsigned max_files = 5;              // files kept (LogOptions::max_files)
  std::size_t queue_cap = 4u << 20;    // bytes queued for the log thread before reads pause
};

/// "<uds>_7001": where a Firecracker/Cloud Hypervisor guest's data channel (vsock port 7001)
/// arrives (their hybrid-vsock convention, as firecracker_vsock_path()).
std::string firecracker_data_path(std::string_view uds_path);
/// The data channel's vsock port in production (the control channel's is 7000).
inline constexpr std::uint32_t kDataVsockPort = proto::kDataVsockPort;

/// Events of the guest -> host direction; `proc` is whose streams (0 the workload, else the
/// process exec() started with that number).
namespace data_ev {
struct Output { proto::Stream stream; std::string bytes; std::uint16_t proc = 0; };
struct Eof { proto::Stream stream; std::uint16_t proc = 0; };
struct Dropped { proto::Stream stream; std::uint64_t bytes; std::uint16_t proc = 0; };
struct Failed { std::string reason; };  // a framing error, or the stream ended mid-frame
/// Data channel resume (docs/protocol.md "Data channel resume"): the guest's hello, a position
/// (stdin: the next stdin byte it expects; stdout/stderr: where its next data starts), an ack of
/// stdin.
struct Hello { std::uint64_t generation; std::string vm; };
struct Position { proto::Stream stream; std::uint64_t position; std::uint16_t proc = 0; };
struct Ack { proto::Stream stream; std::uint64_t position; std::uint16_t proc = 0; };
}  // namespace data_ev
using DataEvent = std::variant<data_ev::Output, data_ev::Eof, data_ev::Dropped, data_ev::Failed, data_ev::Hello,
                               data_ev::Position, data_ev::Ack>;

/// Data channel resume, the host's side (docs/protocol.md "Data channel resume"): what outlives
/// one connection of a VM's data channel, owned by the host for the session and handed to each
/// DataLink. Positions count payload bytes of a stream since it began.
struct DataResume {
  std::string vm;                  // the hello must name these
  std::uint64_t generation = 0;
  /// Workload output: the next byte expected per stream (out, err), and bytes the guest said
  /// are gone (position jumps).
  std::uint64_t pos[2] = {0, 0};
  std::uint64_t gap[2] = {0, 0};
  bool eof[2] = {false, false};
  /// Safe per stream (written into workload.log, or handed to the embedder when there is no
  /// log), and the last position acknowledged to the guest.
  std::uint64_t safe[2] = {0, 0};
  std::uint64_t acked[2] = {0, 0};
  /// Workload stdin: bytes sent in all, the guest's last ack, the bytes in between (kept for a
  /// resend), and whether the eof went out. `in_known`: this host has sent stdin in this
  /// generation (a host taking over learns the position from the guest's first position).
  std::uint64_t in_sent = 0;
  std::uint64_t in_acked = 0;
  std::string in_unacked;
  /// The guest's last stdin ack as it stands: bytes the workload took. The stdin window
  /// (proto::kStdinWindow) counts from it; after a takeover it may lie below in_acked (the
  /// guest still held bytes it had received: its handshake ack says so).
  std::uint64_t in_taken = 0;
  bool in_eof = false;
  bool in_known = true;
  /// Connections so far (the first is 1).
  unsigned links = 0;
};
/// Acks go out each time the safe position moved this many bytes, or kAckDelay after any move.
inline constexpr std::uint64_t kAckStep = 64u << 10;
inline constexpr std::chrono::milliseconds kAckDelay{20};


/// Sans-I/O receiver of the guest -> host direction. Rules follow `boot.stdio`: output on
/// stdout/stderr only (stdout only with a terminal), dropped frames only in lossy mode. After a
/// Failed event it consumes nothing more. Memory: at most one frame (8 + 65536 bytes) held.
class DataReceiver {
 public:
  /// `resume`: the resume frames are legal (hello, positions, acks of stdin).
  explicit DataReceiver(const proto::Stdio& stdio, bool resume = false);
  /// Frames of process `proc` (exec) are legal from now on, by its own `stdio` (false: too many).
  bool open_process(std::uint16_t proc, const proto::Stdio& stdio);
  /// Process `proc` is over: its late frames are skipped.
  void close_process(std::uint16_t proc) { dec_.close_process(proc); }
  /// Bytes from the channel, any split; events appended to `out` in order.
  void received(std::string_view bytes, std::vector<DataEvent>& out);
  /// The byte stream ended (EOF or a read error): Failed if a frame was cut off.
  void closed(std::vector<DataEvent>& out);
  bool failed() const { return dec_.failed(); }
  /// Every output stream has had its eof frame.
  bool outputs_done() const;

 private:
  proto::FrameDecoder dec_;
  bool terminal_;
};

/// One VM's live data channel (the Asio side). Created by Host when the guest connects.
class DataLink : public std::enable_shared_from_this<DataLink> {
 public:
  struct Config {
    std::string vm;
    proto::Stdio stdio;
    const StdioHooks* hooks = nullptr;          // outlives the link (HostOptions)
    std::shared_ptr<AsyncLog> log;              // may be null (no built-in log)
    std::size_t read_chunk = 256u << 10;        // bytes per read (four full data frames)
    std::size_t stdin_cap = 256u << 10;         // bytes of stdin frames queued at most
    std::function<void(std::string kind, std::string detail)> emit;  // one Event
    /// After the link is closed, once; `error` as StdioHooks::closed's.
    std::function<void(const std::string& error)> on_closed;
    /// Output, eof and dropped events of processes exec() started (proc != 0): not the
    /// workload's hooks, not its log.
    std::function<void(std::uint16_t proc, DataEvent& e)> exec_event;
    /// Data channel resume: set when the guest may resume (the boot set replay_bytes, or this
    /// host takes a session over). The guest's first frame must then be its hello, naming
    /// `resume->vm` and `resume->generation`; the host answers with its positions and keeps
    /// `resume` up to date. `resume_required`: a guest without a hello is refused (the boot
    /// turned resume on).
    std::shared_ptr<DataResume> resume;
    bool resume_required = false;
  };
  DataLink(boost::asio::io_context& io, int fd, int family, Config cfg);
  /// Starts reading.
  void start();
  /// Queues stdin bytes of process `proc` (0 the workload) as data frames. Errors: no stdin
  /// attached, stdin already at eof, channel closed, no such process or not started yet, queue
  /// full ("stdin: N bytes queued; the guest is not reading").
  Status send_stdin(std::string_view bytes, std::uint16_t proc = 0);
  /// Queues the stdin eof frame of `proc` (once).
  Status send_stdin_eof(std::uint16_t proc = 0);
  /// Queues a resize frame for `proc`. Errors: no terminal, zero size, closed.
  Status send_resize(std::uint16_t rows, std::uint16_t cols, std::uint16_t proc = 0);
  /// A process exec() is about to start, with `stdio`: its frames become legal (call before the
  /// `exec` line goes out). Errors: closed, too many at once.
  Status open_exec(std::uint16_t proc, const proto::Stdio& stdio);
  /// Its exec_started arrived: stdin frames may go to it now (the guest knows the number).
  void exec_started(std::uint16_t proc);
  /// Its end was reported: its late frames are skipped; the channel may close once the workload's
  /// outputs are done and no process exec() started is open.
  void close_exec(std::uint16_t proc);
  /// Bytes of stdin frames queued.
  std::size_t stdin_queued() const { return out_bytes_; }
  /// The embedder's flow control: while paused, nothing is read (the guest then holds, or drops
  /// in lossy mode, what the workload writes).
  void pause(bool paused);
  /// The log thread caught up (posted by Host from AsyncLog's on_drained).
  void log_drained();
  /// Read what remains up to EOF, at most `bound`, then close (the VM is finished). What is
  /// still unread in the socket then is reported: the close's error names its bytes.
  void drain_then_close(std::chrono::milliseconds bound);
  /// Close now (idempotent). With resume, the guest is told first (a close frame, when the
  /// socket takes it now) that this close is on purpose and not a loss.
  void close(std::string error = {});
  bool is_open() const { return !closed_; }
  /// Resume: the connection ended without the host closing it (EOF, a read or write error): the
  /// guest may redial; nothing about the output's end is decided by it.
  bool lost() const { return lost_; }
  /// Resume: the safe positions moved (the log wrote them; AsyncLog::on_written, posted).
  void log_written(LogPositions p);

  /// What the host received of one output stream: payload bytes handed on (to the hooks and the
  /// log, or to the exec's hooks), and whether its eof frame came. Kept after the close.
  struct Tally {
    std::uint64_t received = 0;  // bytes
    bool eof = false;
  };
  Tally tally(std::uint16_t proc, proto::Stream stream) const;
  /// Every output stream of the workload had its eof frame.
  bool outputs_done() const { return out_eof_ && (err_eof_ || cfg_.stdio.terminal.has_value()); }
  /// Reads are held back (the embedder's pause_output, or the log is behind).
  bool paused() const { return paused_embedder_ || paused_log_; }
  /// Bytes waiting in the socket, not read yet (FIONREAD); 0 once closed.
  std::size_t unread() const;
  /// Bytes read from the channel so far, frames included (a progress counter).
  std::uint64_t bytes_in() const { return bytes_in_; }
  /// Output still moves here: reads are paused, bytes wait unread in the socket, or bytes were
  /// read since bytes_in() was `mark`. A deadline that meets a live but slow consumer (or a slow
  /// guest still sending) restarts instead of cutting the output (docs/host.md "Output lost").
  bool moving(std::uint64_t mark) const { return !closed_ && (paused() || unread() > 0 || bytes_in_ != mark); }

 private:
  void start_read();
  void start_write();
  void handle(std::vector<DataEvent>& evs);
  /// Resume: one of the handshake's or an ack's events; false when it closed the link.
  bool handle_resume(DataEvent& e);
  void safe_moved();
  void send_acks(bool all);
  void close_after_write();
  void stdin_go();  // resume: the guest's stdin position came: stdin may flow
  /// Bytes of stdin queued, and (resume) sent and not taken by the workload, at most: the
  /// stdin cap, and with resume no more than proto::kStdinWindow (the init's buffer is sized
  /// for it: the channel it shares with the output acks never stalls).
  std::size_t stdin_window() const {
    return cfg_.resume ? std::min(cfg_.stdin_cap, proto::kStdinWindow) : cfg_.stdin_cap;
  }
  /// Resume: the workload's stdin sent and not yet taken by it (the window's use); else 0.
  std::uint64_t stdin_in_flight() const { return cfg_.resume ? cfg_.resume->in_sent - cfg_.resume->in_taken : 0; }

  boost::asio::generic::stream_protocol::socket sock_;
  boost::asio::steady_timer drain_timer_;
  Config cfg_;
  DataReceiver rx_;
  std::vector<char> buf_;
  std::deque<std::string> outq_;
  std::size_t out_bytes_ = 0;
  bool bad_ = false;  // the fd could not be adopted
  bool reading_ = false, writing_ = false, closed_ = false;
  bool paused_embedder_ = false, paused_log_ = false;
  bool stdin_eof_sent_ = false, stdin_refused_ = false;
  bool out_eof_ = false, err_eof_ = false;  // the guest's eof frames seen
  bool lost_ = false;                      // resume: ended by the peer or an error, not by us
  bool hello_ = false;                     // resume: the guest's hello came on this link
  bool resumed_ = false;                   // resume: this link runs with positions
  bool closing_ = false;                   // the close frame is queued: close once written
  std::string pre_;                        // resume: frames (resizes) held until the positions are out
  bool stdin_ready_ = false;               // resume: the guest's stdin position came on this link
  boost::asio::steady_timer ack_timer_;
  bool ack_armed_ = false;
  std::uint64_t bytes_in_ = 0;
  /// Per (process, stream): at most the workload's two and two per process exec() opened.
  std::map<std::pair<std::uint16_t, proto::Stream>, Tally> tallies_;
  /// Processes exec() started whose streams are open here, at most proto::kExecMax.
  struct Exec {
    std::uint16_t proc = 0;
    proto::Stdio stdio;
    bool started = false;
    bool stdin_eof_sent = false;
  };
  std::vector<Exec> execs_;
  Exec* find_exec(std::uint16_t proc);
  /// The eof flag of `proc`'s stdin, or why no stdin may be sent to it.
  Result<bool*> stdin_of(std::uint16_t proc);
  Status queue_in(std::string frame);
  void maybe_close_done();  // the receipt: the workload's outputs done, no exec open
};

}  // namespace nes::host
