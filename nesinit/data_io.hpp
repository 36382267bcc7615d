// The data channel's I/O (boot.stdio): the channel's fd, the workload's and each exec'd
// process's pipes or PTY, the frame pipe of direct frames, and the read buffer. It performs what
// the mux and its cores (stdio_mux.hpp, stdio.hpp) decide: which fds to poll for what, reads and
// writes until EAGAIN, splice(2) of direct frames, FIONREAD's held counts, a virtio port's
// hang-up; it reports their verdicts as session events (ev::DataError, OutputsDone,
// ExecOutputsDone, ExecClosed). The loop (loop.cpp) owns the poll and the session.
#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "base/fd.hpp"
#include "base/result.hpp"
#include "log.hpp"
#include "session.hpp"
#include "stdio.hpp"
#include "stdio_mux.hpp"
#include "workload.hpp"

namespace nes::init {

/// Where DataIo's verdicts go, in the order the I/O found them: the loop queues each as its
/// session event (and so the Event variant is built and destroyed in one place).
class DataEvents {
 public:
  /// One each: ev::DataError, DataLost, OutputsDone, ExecOutputsDone, ExecClosed.
  virtual void push(ev::DataError&& e) = 0;
  virtual void push(ev::DataLost&& e) = 0;
  virtual void push(ev::OutputsDone&& e) = 0;
  virtual void push(ev::ExecOutputsDone&& e) = 0;
  virtual void push(ev::ExecClosed&& e) = 0;

 protected:
  ~DataEvents() = default;
};

/// The data channel and the fds of the processes whose streams it carries. One per init; its
/// verdicts go to `events` as the I/O finds them.
class DataIo {
 public:
  /// Indices into the workload's part of a poll set: the channel, stdout (or the PTY), stderr, stdin.
  enum { kData = 0, kOut = 1, kErr = 2, kIn = 3, kStdioFds = 4 };
  /// ... and into an exec'd process's part (stdout or the PTY, stderr, stdin).
  enum { kExecOut = 0, kExecErr = 1, kExecIn = 2, kExecFds = 3 };
  /// The most pollfds poll_set() fills: the workload's part and every exec slot's.
  static constexpr std::size_t kPollFds = kStdioFds + kExecFds * proto::kExecMax;

  DataIo(const Log& log, DataEvents& events) : log_(log), events_(events) {}
  DataIo(const DataIo&) = delete;
  DataIo& operator=(const DataIo&) = delete;

  /// The data channel's dial succeeded: `fd` (non-blocking; a virtio port when `is_port`) carries
  /// the workload's streams as `d.stdio` says, and those of the execs opened later. With
  /// `d.resume` (docs/protocol.md "Data channel resume") the workload's output is kept until the
  /// host acknowledges it, and a later connected() is the redialled channel: its handshake
  /// resumes the streams where the host stands.
  void connected(base::Fd fd, bool is_port, const act::DialData& d);
  /// act::DataGiveUp: the resume window is over without a host: the channel is closed for good
  /// (output from now on is discarded and counted, as close()).
  void give_up();
  /// The channel was lost and is being redialled (resume).
  bool lost() const { return lost_; }

  /// The workload's pipes or PTY as `s` says; the child's ends (fds 0-2) to spawn it with, valid
  /// until workload_spawned(). Errors: make_stdio's (the step, its errno).
  base::Result<ChildFds> open_workload(const proto::Stdio& s);
  /// An exec'd process's pipes or PTY as `s` says, and its frames made legal on the channel
  /// (StdioMux::open); the child's ends, valid until exec_spawned(). Errors: make_stdio's, or
  /// EAGAIN when the channel (none, or no slot) cannot take another process.
  base::Result<ChildFds> open_exec(std::uint16_t proc, const proto::Stdio& s);
  /// The spawn is over: the child's ends of the workload's fds close, so EOF means the workload
  /// (and whatever inherited its fds) closed them.
  void workload_spawned();
  /// The spawn of `proc` is over: the child's ends close; its fds are kept when `ok` (if
  /// open_exec made any), else its process closes on the mux.
  void exec_spawned(std::uint16_t proc, bool ok);

  /// act::CheckHeld: what process `proc` still holds of its output (its core's buffers, a frame
  /// begun, its pipes' unread bytes), in bytes; 0 when it has none or is unknown.
  std::uint64_t held(std::uint16_t proc);
  /// act::CloseExec: its pipes close (late output is lost with them); the mux skips its late
  /// frames from the host and drops its core once its turn on the channel is over. Its streams'
  /// accounts go to the session first (ev::ExecClosed).
  void close_exec(std::uint16_t proc);
  /// Closes the data channel (a frame half-sent dies with it) and, with it, every process's stdin
  /// (pipes: each reads EOF instead of waiting for good). Idempotent.
  void close();
  /// act::Flush came: from now on a virtio port's hang-up is the host's receipt, not a close.
  void flushing() { flushing_ = true; }

  /// A virtio data port without its host is looked at again then (CLOCK_MONOTONIC ms), if set.
  std::optional<std::uint64_t> retry_at() const { return retry_at_; }
  /// Fills `p` (room for kPollFds) with the fds to poll now: the workload's part, then one part
  /// per exec. Returns how many entries are used. `now`: monotonic_ms().
  std::size_t poll_set(pollfd* p, std::uint64_t now);
  /// Performs what poll found ready in a poll_set() of `p`, then writes what is due.
  void on_poll(const pollfd* p);
  /// The final flush's set (kStdioFds entries): the workload's part, the channel watched for the
  /// host's close (POLLHUP) even with nothing to read or write.
  void flush_poll_set(pollfd* p, std::uint64_t now);
  /// Performs what poll found ready in a flush_poll_set() of `p`.
  void on_flush_poll(const pollfd* p);

  /// Sets ev::Flushing's data fields (`f`'s as default-constructed): what the data channel still
  /// owes, as the I/O left it.
  void report(ev::Flushing& f);
  /// Bytes written to the data channel so far (the final flush's measure of progress).
  std::uint64_t written() const { return bytes_written_; }

 private:
  /// The fds of a process `exec` started with `exec.stdio`, until the session closes it; its
  /// core is the mux's (StdioMux::core(proc)).
  struct ExecFds {
    std::uint16_t proc = 0;
    StdioFds fds;
  };

  /// `proc`'s fds, or null.
  ExecFds* find(std::uint16_t proc);
  void stdio_poll_set(pollfd* p, std::uint64_t now);
  void stdio_handle(const pollfd* p);
  void stdin_side(StdioCore& c, StdioFds& f);
  void exec_poll_set(ExecFds& x, pollfd* p);
  void exec_handle(ExecFds& x, const pollfd* p);
  /// ExecOutputsDone for `x` once its outputs are at EOF and written (StdioMux::take_outputs_done).
  void exec_outputs_done(ExecFds& x);
  void move_output(proto::Stream s, base::Fd& fd);
  void read_eof(proto::Stream s, base::Fd& fd);
  bool open_frame_pipe();
  bool move_direct(const StdioCore::Direct& d);
  bool copy_direct(proto::Stream s, int src);
  void read_once(StdioCore& c, bool terminal, proto::Stream s, base::Fd& fd);
  void write_stdin(StdioCore& c, StdioFds& f);
  void write_data();
  void read_data(short revents);
  void port_hung_up();
  /// The channel ended without the host's close frame: with resume, the output is kept and the
  /// session redials (ev::DataLost); without, close().
  void lose(const char* why);

  const Log& log_;
  DataEvents& events_;
  base::Fd data_;             // the data channel (boot.stdio), or none
  bool is_port_ = false;
  bool rx_eof_ = false;       // the host closed its sending side
  bool hup_ = false;          // a virtio data port's host side is not connected (last look)
  bool seen_ = false;         // bytes moved on the data channel: its host was there
  bool flushing_ = false;     // act::Flush came
  bool lost_ = false;         // resume: lost, being redialled
  std::optional<std::uint64_t> retry_at_;  // a virtio data port without its host: look again then
  std::optional<StdioMux> mux_;  // the data channel's processes, from its dial on
  StdioFds fds_;                 // the workload's
  base::Fd frame_pipe_, frame_pipe_w_;  // direct frames on their way (read and write ends)
  std::size_t frame_pipe_bytes_ = 0;    // bytes in the frame pipe, not yet on the channel
  std::vector<ExecFds> execs_;  // at most proto::kExecMax (the session's bound)
  bool staged_ = false;         // execs_.back() is open_exec's, its spawn not over yet
  std::uint64_t bytes_written_ = 0;
  char io_buf_[kStdioChunk];
};

}  // namespace nes::init
