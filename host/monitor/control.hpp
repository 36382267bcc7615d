// The monitor's control socket, as one typed definition (docs/host.md "Detached VMs"): every
// request a client sends to `<state>/<vm>/control.sock` and every reply line the monitor sends
// back, their exact text, and their bounds. The server (host/monitor/monitor.hpp
// control_handler), the `neshost` commands (stop, kill, top, exec) and the containerd shim all
// encode and parse through here, so the wire has one owner.
//
// The wire: one request line per connection, answered by one reply line (two or more for
// `exec`: `ok waiting` while the workload is not yet started, `ok started`, then `ok exit` or
// `error:`). Lines end with '\n' (not part of the text here); fields are separated by exactly
// one space; numbers are decimal. The text is kept byte for byte as the monitors and clients of
// before this definition wrote it, so old and new interoperate.
//
// Pure (no I/O): parse and encode only. parse_* never crash on any input and return an Error
// whose message names the request or reply and the field; encode is total (a field over its
// bound is cut to it, a '\n' inside free text becomes ' ', so one value is always one line) and
// parse(encode(v)) == v for every v that validate() accepts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "host/lib/base.hpp"
#include "protocol/messages.hpp"

namespace nes::monitor::control {

/// The longest request line the control socket reads: bytes without '\n' (an `exec` with its
/// environment).
inline constexpr std::size_t kRequestMax = 64u << 10;
/// The longest reply line a client reads: bytes without '\n' (a `ps` answer of 512 processes fits).
inline constexpr std::size_t kReplyMax = 1u << 20;
/// The longest `error: MESSAGE` message: bytes (encode cuts a longer one).
inline constexpr std::size_t kErrorMessageMax = 4096;
/// The longest `ok exit STATUS WHY` reason: bytes (encode cuts a longer one; the monitors before
/// this definition cut it at the same length).
inline constexpr std::size_t kExitWhyMax = 1024;

// ---- requests ----

/// `stop`: an ordered shutdown of the guest (what SIGTERM to `neshost run` does). Reply: Ok or
/// Error.
struct Stop {
  bool operator==(const Stop&) const = default;
};

/// `pause`: stop the VM's vCPUs (QMP `stop`; docker pause, containerd's Pause). The guest and its
/// workload make no progress and its clock stands still until `resume`; the monitor keeps its
/// channels. Reply: Ok (also when already paused) or Error (no VMM to pause: --sandbox; QMP's).
struct Pause {
  bool operator==(const Pause&) const = default;
};

/// `resume`: run the VM's vCPUs again (QMP `cont`; docker unpause). Reply: Ok (also when it was
/// not paused) or Error.
struct Resume {
  bool operator==(const Resume&) const = default;
};

/// `kill SIGNAL` or `kill SIGNAL PROC`: signal SIGNAL (1..64) to the workload's process group, or
/// to process PROC (1..65535, the number `ok started` gave) that `exec` started. Reply: Ok or
/// Error.
struct Kill {
  int signal = 0;
  std::optional<std::uint16_t> proc;
  bool operator==(const Kill&) const = default;
};

/// `resize ROWS COLS` or `resize ROWS COLS PROC`: the terminal size of the workload (run -t), or
/// of process PROC; ROWS, COLS and PROC each 1..65535. Reply: Ok or Error.
struct Resize {
  std::uint16_t rows = 0;
  std::uint16_t cols = 0;
  std::optional<std::uint16_t> proc;
  bool operator==(const Resize&) const = default;
};

/// `ps`: the guest's processes (protocol `list_processes`). Reply: ProcessList or Error.
struct Ps {
  bool operator==(const Ps&) const = default;
};

/// `exec FLAGS JSON`: start another process in the guest (`neshost exec`, the shim's Exec). The
/// request carries the client's fds 0, 1, 2 (SCM_RIGHTS) when JSON has `stdio`. FLAGS is `-`
/// (none) or, each at most once and in any order, the letters `e` (the workload's environment
/// with JSON's on top), `c` (the workload's cwd unless JSON sets one), `u` (the workload's
/// uid/gid/groups); encoded in the order `ecu`. JSON is the protocol's `exec` message
/// (protocol/codec.hpp; its `proc` is replaced by the monitor's number). Replies: Waiting (any
/// number, while the VM boots), then Started and, once it ended and its output is written,
/// Exited; or Error at any point instead.
struct Exec {
  bool env = false;
  bool cwd = false;
  bool user = false;
  proto::ExecProcess process;
  bool operator==(const Exec&) const = default;
};

/// `wait PROC`: the end of process PROC (1..65535) that `exec` started, for a client that is not
/// the one whose `exec` connection started it (a replaced containerd shim re-adopting its execs).
/// Replies: for a process that runs, Started (Waiting before it has started), then Exited once it
/// ended and its output is written, as its `exec` connection gets them; for one of the last
/// kWaitEndedKept processes that ended, Exited at once; else Error (no such process). A
/// (kWaitersMax+1)th wait on one process ends the oldest with Error.
struct Wait {
  std::uint16_t proc = 0;
  bool operator==(const Wait&) const = default;
};
/// How many ended `exec` processes a monitor remembers for `wait` (the oldest forgotten first).
inline constexpr std::size_t kWaitEndedKept = 64;
/// How many `wait` requests one process may have pending at once (a newer one ends the oldest).
inline constexpr std::size_t kWaitersMax = 8;

/// `close-stdin`: the workload's stdin may end: a monitor run with --stdin-hold closes its own
/// writer on its stdin FIFO, so the EOF comes once the FIFO's other writers are gone (containerd's
/// CloseIO). Idempotent. Reply: Ok or Error.
struct CloseStdin {
  bool operator==(const CloseStdin&) const = default;
};

/// `resources JSON`: a running container's cgroup in the guest (the shim's Update and Stats of a
/// pod's container): JSON is the protocol's `container_resources` message (its `proc` the
/// container's process number, `update` the limits to write). Reply: ResourcesReply or Error.
struct Resources {
  proto::ContainerResourcesRequest request;
  bool operator==(const Resources&) const = default;
};

/// Any control request.
using Request = std::variant<Stop, Kill, Resize, Ps, Exec, Pause, Resume, Wait, CloseStdin, Resources>;

/// A request aimed at one generation of the VM (fencing, additive): on the wire the prefix
/// `generation G ` (G 1..2^53-1) before the request, e.g. `generation 3 kill 9`. A monitor that
/// serves another generation of the VM refuses it with `error: generation: ...` naming both, so a
/// client that read the VM's state for one generation never acts on the next one. Without it
/// (`generation` unset: the bare request, as clients before it send) any monitor of the VM
/// takes the request. A monitor that predates the prefix answers `error: unknown request ...`;
/// control_request() then sends the bare request once (that monitor cannot check).
///
/// A journaled control (additive, after any generation prefix): `seq S ` (S 1..2^53-1) before
/// the request, e.g. `generation 3 seq 17 kill 10`: the containerd shim's per-task sequence
/// number, recorded in its task record before it is sent (docs/containerd.md "Controls
/// journaled"). A monitor that already applied sequence S (answered Ok, one of the last
/// kSeqsKept) answers Ok again without applying it twice; a failed one is not kept (a retry
/// tries it again). A monitor that predates the prefix answers `error: unknown request 'seq
/// ...`; control_request() then sends the request without it once.
struct Targeted {
  std::optional<std::uint64_t> generation;
  Request request;
  std::optional<std::uint64_t> seq;
  bool operator==(const Targeted&) const = default;
};
/// How many applied sequence numbers a monitor remembers (the oldest forgotten first).
inline constexpr std::size_t kSeqsKept = 64;
/// The largest sequence number (JSON's exact integers, as the task record keeps it).
inline constexpr std::uint64_t kSeqMax = proto::kGenerationMax;
/// The largest generation a request may target (JSON's exact integers, as the protocol's).
inline constexpr std::uint64_t kGenerationMax = proto::kGenerationMax;

// ---- replies ----

/// `ok`: the request was done.
struct Ok {
  bool operator==(const Ok&) const = default;
};

/// `error: MESSAGE`: the request was refused or failed; MESSAGE (possibly empty, at most
/// kErrorMessageMax bytes, no '\n') says why. Final: nothing follows on the connection.
struct Error {
  std::string message;
  bool operator==(const Error&) const = default;
};

/// `ok waiting for the workload to start` (parsed: `ok waiting` alone or followed by a space and
/// any text): an `exec` waits for the workload to start; more lines follow.
struct Waiting {
  bool operator==(const Waiting&) const = default;
};

/// `ok started PID PROC`: an `exec`'s process runs as guest pid PID (1..2147483647), the
/// monitor's process number PROC (1..65535: what `kill`/`resize` name). More lines follow.
struct Started {
  std::int32_t pid = 0;
  std::uint16_t proc = 0;
  bool operator==(const Started&) const = default;
};

/// `ok exit STATUS` or `ok exit STATUS WHY`: an `exec`'s process ended with exit status STATUS
/// (0..255, docker exec's: the code, 128+N for signal N, 126/127 cannot start, 125 the host side
/// failed) and its output was written; WHY (at most kExitWhyMax bytes, no '\n'; empty: none) says
/// what went wrong, if anything. Final.
struct Exited {
  int status = 0;
  std::string why;
  bool operator==(const Exited&) const = default;
};

/// `ok JSON`, JSON the protocol's `processes` message (one line): the answer to `ps`. Final.
struct ProcessList {
  proto::Processes processes;
  bool operator==(const ProcessList&) const = default;
};

/// `ok JSON`, JSON the protocol's `container_resources_reply` message from the guest (one line): the
/// answer to `resources` (its `error` set when the guest refused the update). Final.
struct ResourcesReply {
  proto::ContainerResourcesReply reply;
  bool operator==(const ResourcesReply&) const = default;
};

/// Any reply line.
using Reply = std::variant<Ok, Error, Waiting, Started, Exited, ProcessList, ResourcesReply>;

/// Whether `r` ends its connection (Ok, Error, Exited, ProcessList) or more lines follow
/// (Waiting, Started).
bool is_final(const Reply& r);

// ---- the codec ----

/// The request line (without '\n'), e.g. `kill 9 3`.
std::string encode(const Request& r);
/// The request line with its target's prefix if set, e.g. `generation 3 kill 9 3`.
std::string encode(const Targeted& t);
/// The reply line (without '\n'), e.g. `ok exit 0`.
std::string encode(const Reply& r);

/// One request line (without its '\n'). Errors name the request and the field, e.g.
/// `kill: SIGNAL: expected an integer 1..64, got '65'`, `request: over 65536 bytes`,
/// `unknown request 'frob'` (the text quoted at most 64 bytes, escaped).
host::Result<Request> parse_request(std::string_view line);
/// One request line (without its '\n') with an optional `generation G ` prefix, then an
/// optional `seq S ` prefix. Errors as parse_request, and `generation: G: expected an integer
/// 1..9007199254740991, got '0'` (likewise `seq: S: ...`).
host::Result<Targeted> parse_targeted(std::string_view line);
/// One reply line (without its '\n'). Errors name the reply and the field, e.g.
/// `exit: STATUS: expected an integer 0..255, got '300'`, `unknown reply 'hello'`.
host::Result<Reply> parse_reply(std::string_view line);

/// Would the peer parse `r` back as `r`? Ok, else the error it would report (or one saying a
/// field cannot be written as it is, e.g. a JSON string that is not UTF-8). Senders of values
/// built from outside input check with it first.
host::Status validate(const Request& r);
host::Status validate(const Targeted& t);
host::Status validate(const Reply& r);

}  // namespace nes::monitor::control
