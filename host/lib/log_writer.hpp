// The workload's log: STATE/VM/workload.log in the CRI container log format that kubelet,
// `crictl logs` and podman's k8s-file driver read, size-bounded with rotation after docker's
// json-file driver (max-size / max-file). LogWriter is the synchronous core (formats, writes,
// rotates; testable alone); AsyncLog runs one on its own thread behind a bounded queue so that a
// slow disk never stalls the loop that serves the VM. Why: docs/host.md "Workload output".
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "host/lib/base.hpp"
#include "host/lib/record.hpp"

namespace nes::host {

/// A workload output stream. The values are the data channel's stream ids (docs/protocol.md
/// "Data channel"): 1 stdout, 2 stderr.
enum class OutputStream : std::uint8_t { out = 1, err = 2 };
/// "stdout" / "stderr": the CRI log format's stream field.
std::string_view to_string(OutputStream s);

/// Where and how big the log is.
struct LogOptions {
  std::filesystem::path path;               // e.g. STATE/VM/workload.log
  std::uint64_t max_size = 10u << 20;       // bytes per file before it is rotated (docker
                                            // max-size; kubelet's containerLogMaxSize 10Mi)
  unsigned max_files = 5;                   // files kept, the live one included (docker max-file;
                                            // kubelet's containerLogMaxFiles 5); 1 = truncate
  std::size_t max_line = 16u << 10;         // content bytes per record: longer lines are split
                                            // into P records (containerd's 16 KiB)
  /// The VM generation whose output this is (fencing): each record's tag field carries it as a
  /// second tag, `F:g3` (the CRI format's tag delimiter ':'; kubelet reads the first tag only).
  /// 0: none, the bare `F`/`P`.
  std::uint64_t generation = 0;
  /// Data channel resume: the sidecar file holding each stream's position (content bytes
  /// written to the log files since the stream began), e.g. STATE/VM/workload.log.pos. Empty:
  /// none. An existing one is read at open(): positions continue from it (a host taking over).
  std::filesystem::path positions;
};

/// Each output stream's position in the log: content bytes written to the files (write(2)
/// returned: in the page cache, which a killed process does not lose) since the stream began.
/// A partial line held in memory is not counted until it is written.
struct LogPositions {
  std::uint64_t out = 0;
  std::uint64_t err = 0;
  /// The live file's size when they were counted: a host taking over cuts the file back to it
  /// (bytes past it are a write the killed host never finished: the guest sends them again).
  std::uint64_t file = 0;
  bool operator==(const LogPositions&) const = default;
};
/// Reads a positions sidecar (LogOptions::positions); nullopt when absent or malformed.
std::optional<LogPositions> read_log_positions(const std::filesystem::path& path);
/// Smallest max_size accepted (bytes): a record of max_line content must fit.
inline constexpr std::uint64_t kMinLogSize = 64u << 10;

/// Checks the options; errors name the field (max_size, max_files, max_line, path).
Status check_log_options(const LogOptions& o);

/// The rotated files of `path`, newest first: path.1, path.2, ... (docker's naming), those that exist.
std::vector<std::filesystem::path> rotated_logs(const std::filesystem::path& path);

/// One CRI log record, parsed (for `neshost logs` and tests).
struct LogRecord {
  WallTime time{};
  OutputStream stream = OutputStream::out;
  bool partial = false;   // tag P: content does not end a line; F: a '\n' follows content
  std::string content;    // without the record's own '\n'
  std::optional<std::uint64_t> generation;  // a `g<N>` tag after the first (LogOptions::generation)
};
/// RFC 3339 with an optional fraction of 1..9 digits and `Z` or a numeric offset, as Go's
/// time.RFC3339Nano parser accepts; nullopt if malformed.
std::optional<WallTime> parse_log_time(std::string_view s);
/// Parse one record line (without its '\n'): `<RFC3339Nano> <stdout|stderr> <P|F>[:TAG...] <content>`.
/// Accepts any fraction width and a numeric offset, as Go's time.RFC3339Nano parser does; tags
/// after the first are read as kubelet does (split at ':', only the first decides P or F), and a
/// `g<N>` among them is the record's generation; others are ignored (forward compatible).
/// Error names what is malformed ("timestamp", "stream", "tag").
Result<LogRecord> parse_log_line(std::string_view line);

/// Formats workload output as CRI records and writes them with rotation. The records of one
/// write() call go out in one writev(2) whose iovecs point at the caller's bytes (no copy of
/// the content). Complete lines become F
/// records at once; an unfinished line is held (at most max_line bytes per stream) until its
/// newline, the max_line limit, flush_partial() or close(), and then written as P. Concatenating
/// the records' contents (F adds its '\n') gives back exactly the bytes written. Not thread-safe.
/// Write errors (ENOSPC, EIO) never throw: logging stops, error() says why, the caller goes on.
class LogWriter {
 public:
  /// Opens (appends to) opt.path, creating it with mode 0640. Errors: bad options, open failure.
  static Result<std::unique_ptr<LogWriter>> open(LogOptions opt);

  /// Bytes of `stream` received at `t` (any split, any bytes).
  void write(OutputStream stream, std::string_view bytes, WallTime t) {
    append(stream, bytes, t);
    flush();
  }
  /// As write(), but the records may stay pending (pointing into `bytes`) until the next
  /// flush(), eof(), dropped() or flush_partial(): `bytes` must live until then. Lets a caller
  /// with many small writes at hand make one writev(2) of them.
  void append(OutputStream stream, std::string_view bytes, WallTime t);
  /// `n` bytes of `stream` were dropped by the guest (lossy mode): any held partial line is
  /// written, then one F record on that stream: "[neshost: N bytes of stdout dropped]".
  void dropped(OutputStream stream, std::uint64_t n, WallTime t);
  /// A gap in `stream` the log must show (dropped, lost, truncated output): any held partial
  /// line is written, then one F record "[neshost: WHAT]", e.g. "[neshost: 12 bytes of stdout
  /// lost]".
  void gap(OutputStream stream, std::string_view what, WallTime t);
  /// A resume gap: `n` bytes of `stream` the guest framed and no longer holds (gone from its
  /// replay ring: docs/protocol.md "Data channel resume"). Written as dropped() writes it, and
  /// the stream's position (positions(), the sidecar) moves past them, so a host taking over
  /// asks the guest for what follows them and never counts the same gap twice.
  void skipped(OutputStream stream, std::uint64_t n, WallTime t);
  /// Writes held partial lines as P records (end of stream, or output idle), then flush().
  void flush_partial(WallTime t);
  /// Writes the pending records to the file (write() and eof() do so before they return).
  void flush();
  /// The stream's end: its held partial line is written, then flush().
  void eof(OutputStream stream, WallTime t);
  /// Total record bytes written to files so far (all files).
  std::uint64_t bytes_written() const { return written_total_; }
  /// Each stream's position (LogPositions), as of the last flush.
  LogPositions positions() const { return pos_; }
  /// Why logging stopped, if it did.
  const std::optional<std::string>& error() const { return error_; }

  explicit LogWriter(LogOptions opt) : opt_(std::move(opt)) {}
  ~LogWriter() { flush(); }
  LogWriter(const LogWriter&) = delete;
  LogWriter& operator=(const LogWriter&) = delete;

 private:
  /// Queues one record; `stable`: content outlives the next flush() (else it is copied).
  void record(OutputStream s, bool partial, std::string_view content, WallTime t, bool stable);
  bool rotate();
  void fail(std::string why);

  LogOptions opt_;
  Fd fd_;
  std::uint64_t size_ = 0;        // bytes in the live file
  std::uint64_t written_total_ = 0;
  std::string held_[2];           // unfinished line per stream
  LogPositions pos_;              // as of the last flush
  bool counting_ = true;          // records made now carry workload bytes (a gap's do not)
  Fd pos_fd_;                     // the positions sidecar, if any
  void write_positions();
  struct Pending {
    char hdr[64];                 // "<timestamp> <stream> <tag>[:g<generation>] " (at most 58)
    std::uint8_t hlen;
    std::string_view content;
    std::uint8_t counted = 0;     // workload bytes of stream 1 (stdout) or 2 (stderr); 0: a gap's text
    std::uint64_t skipped = 0;    // a resume gap's record: the stream's position moves by this, not by its text
    bool newline = false;         // an F record: a '\n' of the stream follows its content
  };
  std::vector<Pending> pend_;     // records not yet written
  std::uint64_t pend_bytes_ = 0;
  std::deque<std::string> keep_;  // copies of contents that would not live until flush()
  std::optional<std::string> error_;
};

/// A LogWriter on its own thread. push() never blocks: it queues (the caller bounds the queue
/// with queued_bytes() against queue_cap, pausing its source, e.g. the data channel, above it).
/// `on_drained` is called (on the writer thread) each time the queue falls below half of the cap
/// after having been above it; the caller posts it to its loop. Output idle for 200 ms flushes
/// held partial lines, so `neshost logs -f` shows a prompt without its newline.
class AsyncLog {
 public:
  /// Opens the writer (errors as LogWriter::open) and starts the thread.
  static Result<std::unique_ptr<AsyncLog>> start(LogOptions opt, std::size_t queue_cap,
                                                 std::function<void()> on_drained);
  ~AsyncLog();  // close(2 s)
  AsyncLog(const AsyncLog&) = delete;
  AsyncLog& operator=(const AsyncLog&) = delete;

  void push(OutputStream s, std::string_view bytes, WallTime t);
  /// As push(), taking the bytes without a copy.
  void push(OutputStream s, std::string&& bytes, WallTime t);
  void push_eof(OutputStream s, WallTime t);
  void push_dropped(OutputStream s, std::uint64_t n, WallTime t);
  /// As LogWriter::gap(): one "[neshost: WHAT]" record on `s`.
  void push_gap(OutputStream s, std::string what, WallTime t);
  /// As LogWriter::skipped(): a resume gap of `n` bytes on `s`.
  void push_skipped(OutputStream s, std::uint64_t n, WallTime t);
  /// Bytes queued and not yet written.
  std::size_t queued_bytes() const;
  /// The writer's positions (LogWriter::positions) as of its last flush.
  LogPositions positions() const;
  /// Called on the writer thread after a flush that moved the positions (the caller posts it
  /// to its loop); replaces the previous one. Cleared by close().
  void on_written(std::function<void(LogPositions)> cb);
  /// Over the cap: the caller should stop feeding until on_drained.
  bool full() const { return queued_bytes() >= cap_; }
  /// Writes what is queued, up to `bound`, then stops the thread (a thread stuck in a write past
  /// the bound is left to finish on its own; nothing here waits for it). Idempotent.
  /// Returns true if everything queued was written.
  bool close(std::chrono::milliseconds bound);
  /// Why logging stopped, if it did (from the writer thread).
  std::optional<std::string> error() const;

  struct State;
  AsyncLog() = default;

 private:
  std::shared_ptr<State> st_;
  std::size_t cap_ = 0;
  std::thread thread_;
  bool closed_ = false;
};

}  // namespace nes::host
