// The CLI's own stdin/stdout/stderr for `neshost run`: writes that never block (a stdout nobody
// reads must not keep neshost past its deadlines) and a stdin pump with flow control. Why:
// docs/vm.md "Workload stdio".
#pragma once

#include <utility>  // before Asio 1.74

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "host/lib/base.hpp"
#include "host/monitor/stdin_spool.hpp"

namespace nes::cli {

/// What one of our standard fds is.
enum class FdKind { file, stream, socket, closed };

/// Makes our own `fd` (0, 1 or 2) non-blocking without changing the open file description other
/// processes share with us: a pipe, FIFO or terminal is reopened through /proc/self/fd/N
/// (O_NONBLOCK, O_NOCTTY) and the new description dup2()ed over `fd`. A regular file stays as it
/// is (a disk write ends on its own); a socket stays blocking (FdWriter sends with
/// MSG_DONTWAIT). After this, no write of ours to a pipe or terminal can block — fmt::print and
/// the console thread included; a write that would block fails with EAGAIN instead.
FdKind make_own_nonblocking(int fd);

/// Bytes of one output stream queued for a local fd (the user's terminal, a pipe) before the
/// data channel is paused for it: `run`'s stdout and stderr, each exec'd process's.
inline constexpr std::size_t kOutputQueueCap = 1u << 20;

/// Writes to one fd from the io_context without ever blocking: what the fd does not take now is
/// queued and written when it becomes writable. The queue is the caller's to bound: full() says
/// when to stop its source (e.g. Host::pause_output) and on_drained when to resume. A write
/// error (EPIPE: the reader went away) discards everything from then on, as docker does.
class FdWriter {
 public:
  /// `fd` is not owned (it stays open); `cap` bytes of queue make full() true.
  FdWriter(boost::asio::io_context& io, int fd, std::size_t cap);
  /// Queues `b` and writes what the fd takes now.
  void write(std::string_view b);
  std::size_t queued() const { return queued_; }
  bool full() const { return queued_ >= cap_; }
  bool broken() const { return broken_; }
  /// Called (on the io_context) when the queue falls below cap/2 after being full.
  std::function<void()> on_drained;
  /// Called (on the io_context) whenever a write leaves the queue empty (all written, or
  /// discarded after an error). It must not destroy the writer (post that).
  std::function<void()> on_empty;
  /// Called (synchronously, right after the write(2)) with each count of bytes the fd took: a
  /// caller that must know what was delivered counts here (host/monitor/output_resume.hpp).
  std::function<void(std::size_t)> on_written;
  /// What flush() did with the queue.
  struct Flushed {
    std::size_t left = 0;      // bytes not written (dropped), 0 when all went out
    bool interrupted = false;  // `stop_fd` became readable, or `limit` passed, with bytes left
    bool broken = false;       // the reader is gone (EPIPE, EIO): it takes nothing more
    bool stalled = false;      // with `broken`: a named FIFO's reader took nothing for kFifoStall
  };
  /// How long a named FIFO's unread bytes may sit untouched after the queue is written before
  /// flush() stops waiting for a reader (2000 ms): a FIFO someone holds open for reading without
  /// reading (containerd's shims keep a read end; `ctr run -d` never reads) reports no POLLERR.
  static constexpr std::chrono::milliseconds kFifoStall{2000};
  /// At exit, synchronously: write everything while the reader lives, however slowly it takes it
  /// (a paused pager, a reader that sleeps between reads: no deadline, a slow consumer costs time,
  /// never bytes). Ends when the queue is written, when the fd breaks (the reader went away), when
  /// `stop_fd` (>= 0; e.g. a signalfd of SIGINT/SIGTERM, nothing is read from it) becomes
  /// readable, or once `limit` has passed if one is given (an end the caller was asked for, such
  /// as a time limit): the caller's ways to give up, after which it must say how many bytes were
  /// left.
  Flushed flush(int stop_fd, std::optional<std::chrono::milliseconds> limit = std::nullopt);

 private:
  void pump();
  /// Writes queued bytes while the fd takes them. True: it would block with bytes left (EAGAIN);
  /// false: the queue is empty or the fd broke (broken_ set; EPIPE, EIO).
  bool write_now();
  void written(std::size_t n);  // n bytes of the front chunk went out
  ssize_t put(const char* p, std::size_t n);

  int fd_;
  FdKind kind_;
  std::size_t cap_;
  std::optional<boost::asio::posix::stream_descriptor> waiter_;  // a dup of fd_, for readiness
  std::deque<std::string> q_;
  std::size_t front_off_ = 0;
  std::size_t queued_ = 0;
  bool waiting_ = false, broken_ = false, was_full_ = false;
};

/// Reads one fd (neshost's stdin for `run -i`) on the io_context and hands chunks to `send`;
/// when `send` refuses one (the guest is not reading: Host::send_stdin's queue is full) the chunk
/// is held and reading stops until resume(). At EOF (or a read error) `eof` is called once.
class StdinPump {
 public:
  StdinPump(boost::asio::io_context& io, int fd, std::function<bool(std::string_view)> send,
            std::function<void()> eof);
  /// Starts reading (idempotent).
  void start();
  /// The consumer can take more: retry the held chunk, read on.
  void resume();
  /// Stops reading for good (no eof callback).
  void stop() { stopped_ = true; }
  /// The fd (a FIFO) is never read directly: its bytes are spliced into `spool` and sent from
  /// there, starting at spool offset `from` (a replacement: the guest's stdin position), so a
  /// monitor killed at any instant loses nothing (host/monitor/stdin_spool.hpp). Before start().
  /// A spool error ends stdin (eof), said through `say`.
  void through(host::StdinSpool& spool, std::uint64_t from, std::function<void(std::string)> say) {
    spool_ = &spool;
    sent_ = from;
    say_ = std::move(say);
  }

 private:
  void read_more();
  void spool_more();  // read_more() through the spool
  void finish();      // the end of stdin: eof_ once
  void deliver(std::string chunk);

  boost::asio::io_context& io_;
  int fd_;
  std::optional<boost::asio::posix::stream_descriptor> sd_;  // pipes, terminals; else sync reads
  std::function<bool(std::string_view)> send_;
  std::function<void()> eof_;
  host::StdinSpool* spool_ = nullptr;
  std::uint64_t sent_ = 0;  // the next spool byte to send
  std::function<void(std::string)> say_;
  std::string held_;
  std::string buf_;
  bool started_ = false, reading_ = false, stopped_ = false, ended_ = false;
};

/// Writes `b` to our own non-blocking fd 2 (after make_own_nonblocking), waiting at most
/// `bound` for room in total; what does not fit in time is dropped. For the console and QEMU's
/// diagnostics, which must never hold up the thread that drains them.
void put_bounded(int fd, std::string_view b, std::chrono::milliseconds bound);

}  // namespace nes::cli
