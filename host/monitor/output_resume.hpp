// How the workload's output reaches containerd's FIFOs (or a `--log-uri` file) exactly once across
// a SIGKILLed monitor (docs/host.md "Re-adoption", "Output and stdin carry over"). The monitor
// that starts a VM records its stdout/stderr sinks in vmm.json (host::VmmSink) and counts, per
// stream, the bytes written to them in `output.pos`; a replacement reopens the sinks and goes on
// at the first byte not yet delivered: what the guest replays (from workload.log's positions,
// docs/protocol.md "Data channel resume") past what the sink already has, and, when the sink is
// behind the log (the monitor died with output queued for a slow reader), the bytes between
// taken back out of workload.log's records first.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "host/lib/base.hpp"
#include "host/lib/log_writer.hpp"
#include "host/monitor/vmm_record.hpp"

namespace nes::monitor {

/// STATE/VM/output.pos: the count file (OutputTally).
inline constexpr char kOutputPos[] = "output.pos";

/// `output.pos`: two little-endian u64 (stdout's, then stderr's bytes written to their sinks by
/// every monitor of this generation), mapped MAP_SHARED: a count is one store into the page
/// cache right after write(2) returned, which a SIGKILL cannot undo (the process's death does
/// not lose a shared mapping's pages). A kill landing inside that write(2) itself (after the
/// kernel took the bytes, before the store) repeats at most that write's bytes: the one window
/// left, as wide as the system call.
class OutputTally {
 public:
  /// Opens (with `create`: creates, zeroed, replacing an earlier generation's) and maps the file.
  /// Errors name the file.
  static host::Result<OutputTally> open(const std::filesystem::path& state, const std::string& vm, bool create);
  OutputTally(OutputTally&& o) noexcept : map_(o.map_) { o.map_ = nullptr; }
  OutputTally& operator=(OutputTally&& o) noexcept;
  OutputTally(const OutputTally&) = delete;
  OutputTally& operator=(const OutputTally&) = delete;
  ~OutputTally();
  /// Bytes of `s` delivered to its sink so far.
  std::uint64_t delivered(host::OutputStream s) const;
  /// `n` more bytes of `s` were written to its sink.
  void add(host::OutputStream s, std::uint64_t n);

 private:
  explicit OutputTally(volatile std::uint64_t* m) : map_(m) {}
  volatile std::uint64_t* map_ = nullptr;
};

/// Our `fd` (1 or 2) as a sink a replacement can open again: a FIFO or a regular file reached by
/// an absolute path naming the same inode (readlink of /proc/self/fd/N); nullopt otherwise.
std::optional<host::VmmSink> output_sink_of(int fd);

/// A recorded sink opened for writing without blocking: a FIFO read-write (as the shim opens
/// containerd's: the pipe keeps a reader, output waits in it rather than failing with EPIPE), a
/// file appended to. Errors name the path.
host::Result<host::Fd> open_sink(const host::VmmSink& sink);

/// What workload.log (`log`, its rotated files before it) holds of stream `s` of `generation`
/// between stream positions `from` and `to` (LogPositions: content bytes since the stream began),
/// the live file read only up to `live_size` (LogPositions::file). Records of other generations
/// and the log's own gap notes ("[neshost: ...]") are not the stream's. `missing`: how many of
/// those bytes the files no longer hold (rotated away), at the front.
struct LoggedBytes {
  std::string bytes;
  std::uint64_t missing = 0;
};
LoggedBytes logged_bytes(const std::filesystem::path& log, host::OutputStream s, std::uint64_t generation,
                         std::uint64_t from, std::uint64_t to, std::uint64_t live_size);

}  // namespace nes::monitor
