// The durable outcome record `<state_dir>/<vm>/outcome.json`: its schema, its JSON form (written
// with fmt, read with simdjson), and the crash-durable write protocol (docs/host.md "Durability").
// The state dir itself (the VM id check, its file names and paths, open_vm_dir(), the per-VM
// lock): host/lib/state_dir.hpp, included here.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"
#include "host/lib/state_dir.hpp"
#include "protocol/status.hpp"

namespace nes::host {

/// Wall-clock instants in records (UTC, nanoseconds).
using WallTime = std::chrono::time_point<std::chrono::system_clock, std::chrono::nanoseconds>;

/// The current wall-clock time at nanosecond resolution.
WallTime wall_now();
/// RFC 3339 UTC with nanoseconds, e.g. `2026-11-30T10:40:00.123456789Z`.
std::string format_rfc3339(WallTime t);
/// Inverse of format_rfc3339 (exactly that shape: 9 fraction digits, `Z`); nullopt if malformed.
std::optional<WallTime> parse_rfc3339(std::string_view s);

/// JSON string literal (with quotes) for `s`, escaped exactly as protocol/'s encoder escapes
/// strings (proto::json_quote: control characters, `"`, `\`; valid UTF-8 kept as is, each invalid
/// byte U+FFFD).
std::string json_string(std::string_view s);

/// A byte count per workload output stream (stdout, stderr); unset: none for that stream.
struct StreamCounts {
  std::optional<std::uint64_t> out, err;  // bytes
  bool empty() const { return !out && !err; }
  bool operator==(const StreamCounts&) const = default;
};

/// One recorded outcome (schema_version 1). `exit_code` is set only for `exited`, `signal` only for
/// `signalled`; `exit_status` comes from protocol/status.hpp's table. The output fields are
/// additive (written only when set, docs/host.md "Output lost") and come after the outcome, by
/// amend_record().
struct Record {
  static constexpr int kSchemaVersion = 1;
  std::string vm;
  std::uint64_t generation = 0;
  proto::Outcome outcome = proto::Outcome::channel_lost;
  std::optional<std::uint8_t> exit_code;
  std::optional<std::uint8_t> signal;
  int exit_status = proto::kStatusHostFailure;
  std::string reason;
  WallTime started_at{};
  WallTime finished_at{};
  /// Exact bytes of workload output lost per stream (the guest's `output_lost`: unsent + sent -
  /// bytes the host received): `"lost":{"stdout":N,"stderr":M}`.
  StreamCounts lost;
  /// Streams cut short by an amount nobody counted (their eof never arrived and no
  /// `output_lost` came): bytes the host received of each. `"truncated":{"stdout":N}`.
  StreamCounts truncated;
  /// Why `lost`, one line (e.g. "the VM was stopped while its output was still being read").
  std::string lost_reason;
  bool operator==(const Record&) const = default;
};

/// Exit status 125 (the host side failed, docker run's): what `neshost run`, `wait` and the shim
/// report instead of the workload's status when its output was lost or truncated.
inline constexpr int kStatusOutputLost = proto::kStatusHostFailure;
/// The exit status to report for `r`: kStatusOutputLost when any output was lost or truncated and
/// the outcome is the workload's own (exited, signalled: a caller could not tell that status from
/// a complete run), else r.exit_status (a host verdict such as timeout's 124 already says the run
/// was cut short; the loss is still said, describe_loss()).
int reported_status(const Record& r);
/// Some of the workload's output was lost or truncated.
inline bool output_lost(const Record& r) { return !r.lost.empty() || !r.truncated.empty(); }
/// One line per stream lost or truncated, e.g. "1234567 bytes of stdout lost: the VM was stopped
/// while its output was still being read", "stderr truncated: its eof never arrived (12 bytes
/// received)". Empty when all output was delivered.
std::vector<std::string> describe_loss(const Record& r);

/// The record as one compact JSON object plus '\n'. Absent exit_code/signal are written as null.
std::string encode_record(const Record& r);
/// Parse and validate a record; the error names the field, e.g. `generation: expected unsigned
/// 64-bit integer`. Unknown fields are ignored (later schema additions).
Result<Record> parse_record(std::string_view json);

/// Steps of one durable write attempt, in order (docs/host.md "Durability").
enum class WriteStep { temp_written, temp_fsynced, renamed, dir_fsynced };
std::string_view to_string(WriteStep s);
std::optional<WriteStep> write_step_from_string(std::string_view s);

/// Knobs of write_record() and write_records(). `at_step` (tests only) runs after each step of
/// each attempt of each record; a non-zero return is treated as that errno failing the step (fault
/// injection). `fsync` (tests only) replaces fsync(2) on every file and directory the protocol
/// syncs, returning 0 or an errno, to count the calls or fail one; it is called from several
/// threads at once (a round's fsyncs are issued together).
struct WriteOptions {
  int attempts = 3;                          // each attempt starts from a fresh temp file
  int lock_tries = 500;                      // flock(LOCK_NB) tries, 10 ms apart (5 s bound)
  std::function<int(WriteStep)> at_step;     // nullptr in production
  std::function<int(int fd)> fsync;          // nullptr in production: fsync(2)
  bool sync = true;  // false skips every fsync: NOT crash-durable; only to measure its cost
  std::size_t batch_records = 64;            // records per group-commit round (each holds 3 fds)
  std::size_t batch_bytes = 1u << 20;        // encoded bytes per round (a lone record always fits)
};

/// What write_record() did.
struct WriteResult {
  enum class Kind {
    written,           // `record` is now durable on disk
    already_recorded,  // a record of the same generation was there first; it is kept (first wins)
    stale              // the disk holds a newer generation; nothing was written
  };
  Kind kind = Kind::written;
  Record on_disk;   // the record on disk afterwards
  int attempts = 0; // attempts used (written only)
};

/// Durably record `r` under `<state_dir>/<r.vm>/outcome.json`: create the directories (0700; fsync
/// the parent of each one created), take the per-VM flock `<vm>/.lock`, compare generations, then
/// fresh temp file in the same directory, write, fsync, rename over outcome.json, fsync the
/// directory. Any failing step unlinks the temp and starts over with a fresh one (a retried fsync
/// after EIO can report success for lost data); after `attempts` the last error is returned.
/// Blocking: call it on a worker thread, never on an io_context thread.
Result<WriteResult> write_record(const std::filesystem::path& state_dir, const Record& r,
                                 const WriteOptions& opt = {});

/// Group commit: durably record every record of `batch` under `state_dir` together, keeping each
/// record's guarantees of write_record() (docs/host.md "Group commit"). In rounds of at most
/// `batch_records` records and `batch_bytes` encoded bytes, each VM at most once per round (a
/// later record of the same VM goes to a later round, in order): every record of a round is
/// prepared (dirs, lock, generation check), then all temps are written, all fsynced, all renamed,
/// all VM dirs fsynced, and the state dir is fsynced once for every VM dir the round made. From
/// the first temp written to the last fsync a round is one unit: a failing step fails the attempt
/// of every record in it, the round starts over from fresh temps, and after `attempts` every
/// record of the round gets the error (none is reported written). Returns one result per record,
/// in `batch` order. Blocking: call it on a worker thread.
std::vector<Result<WriteResult>> write_records(const std::filesystem::path& state_dir,
                                               std::span<const Record> batch,
                                               const WriteOptions& opt = {});

/// Add what became known of the workload's output after the outcome: under the VM's lock, the
/// record of `r.vm` generation `r.generation` on disk is rewritten with r's `lost`, `truncated`
/// and `lost_reason` (each replacing the one on disk when set), everything else as first recorded
/// (the first outcome wins), by the same protocol as write_record() (fresh temp, fsync, rename,
/// fsync dir, retried from a fresh temp). Returns `written` with the amended record, or `stale`
/// (a newer generation is on disk). Errors: no record of that generation on disk, I/O. Blocking.
Result<WriteResult> amend_record(const std::filesystem::path& state_dir, const Record& r,
                                 const WriteOptions& opt = {});

/// Read `<state_dir>/<vm>/outcome.json` (at most 1 MiB). nullopt if there is none; an error if it
/// cannot be read or parsed, if the VM dir or the record is a symlink or not what it should be
/// (a FIFO there is refused without blocking), or if the record names another VM. Temp files
/// beside it are ignored.
Result<std::optional<Record>> read_record(const std::filesystem::path& state_dir,
                                          std::string_view vm);

}  // namespace nes::host
