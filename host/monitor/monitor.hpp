// The per-VM monitor's pieces that are not the VM itself (docs/host.md "Detached VMs"): turning
// `neshost run -d` into a monitor in its own session that outlives the CLI, and the control
// socket `<state>/<vm>/control.sock` through which any fresh process asks the monitor to stop
// the VM or signal its workload. The monitor is the ordinary `neshost run` process; only its
// start and its stdio differ when detached.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host/lib/base.hpp"
#include "host/monitor/control.hpp"
#include "protocol/messages.hpp"

namespace nes::monitor {

/// What detach() left the calling process as.
struct Detached {
  /// true: this is the CLI (the creator); it should exit with `exit_status`.
  bool creator = false;
  int exit_status = 0;
  /// In the monitor: the write end of the creator's pipe; notify_started() writes to it.
  host::Fd notify;
};

/// `run -d`: fork; the child becomes the monitor (setsid: its own session, no controlling
/// terminal, so closing the terminal or the creator's exit does not touch it; stdin and stdout
/// /dev/null, stderr appended to `<state>/<vm>/monitor.log`) and returns to run the VM. The
/// creator waits until the monitor reports the workload started (prints the VM id on stdout,
/// exits 0), or until the monitor ends without that (prints why: the reconciled state and the
/// log's tail; exits with the outcome's status, 125 if there is none). Bounded by `bound`.
/// Call before any thread exists. Errors (pipe, fork, the log) are returned in the creator.
host::Result<Detached> detach(const std::filesystem::path& state, const std::string& vm,
                              std::chrono::milliseconds bound);
/// In the monitor: tell the creator the workload started (once; later calls do nothing).
void notify_started(host::Fd& notify);

/// The monitor's control socket: the transport. Requests are one line each, one per connection,
/// answered with one line, or more for `exec` (the vocabulary, each line's exact text and its
/// bounds: host/monitor/control.hpp; control_handler() below turns typed handlers into this
/// server's Handler):
///   `stop`      ordered shutdown of the guest (as SIGTERM to `neshost run`): `ok` or `error: WHY`
///   `kill SIG [PROC]`  signal 1..64 to the workload's process group (or exec'd process PROC's)
///   `resize ROWS COLS [PROC]`  the workload's terminal size (run -t), each 1..65535 (or PROC's)
///   `ps`        the guest's processes: "ok " and their JSON array (protocol `processes`)
///   `exec FLAGS JSON`  `neshost exec`: the request carries its fds 0-2 (SCM_RIGHTS); answered
///               "ok waiting for the workload to start" (zero or more times, while the VM boots),
///               "ok started PID PROC", then, once it ended, "ok exit STATUS[ WHY]" (exec.hpp);
///               or "error: WHY" instead at any point
/// Only peers with our uid (or root) are served (SO_PEERCRED); requests over kControlRequestMax
/// bytes, with more than 3 fds, or slower than 2 s are dropped; a reply not begun 5 s after its
/// request is never sent (a reply that says more follows is bounded by its sender).
class ControlServer {
 public:
  /// Answers a request with one line (without '\n'); `more`: further lines follow (the
  /// connection stays open), else the connection closes after this one.
  using Reply = std::function<void(std::string line, bool more)>;
  /// Called once per request with the fds it carried (at most 3); calls `reply` at least once,
  /// now or later on the io_context.
  using Handler = std::function<void(std::string_view request, std::vector<host::Fd> fds, Reply reply)>;
  /// Bind `path` (0600; any stale socket there is replaced: the caller owns the VM's generation)
  /// and serve on `io`. The path may be longer than sun_path (bound through /proc/self/fd).
  static host::Result<std::unique_ptr<ControlServer>> start(boost::asio::io_context& io,
                                                            const std::filesystem::path& path,
                                                            Handler handler);
  /// Stops serving and unlinks the socket.
  ~ControlServer();
  /// No new connection or request from now on (the socket is unlinked; the handler is never
  /// called again); replies to requests already handed out still go out. For a monitor whose VM
  /// is over while `neshost exec` clients still take their output and wait for the last reply.
  void stop_accepting();
  struct Impl;

 private:
  explicit ControlServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

/// The guest's processes through the control socket at `path` (request `ps`), decoded. Errors:
/// no monitor, its error line (e.g. the guest did not answer), a reply that is not `processes`.
host::Result<proto::Processes> guest_processes(const std::filesystem::path& path);

/// A pod's container's cgroup through the control socket at `path` (request `resources`): the
/// guest's answer (its `error` set when it refused), or an Error (no monitor, the monitor's
/// error line: the guest did not answer, an init without the feature).
host::Result<proto::ContainerResourcesReply> container_resources(const std::filesystem::path& path,
                                                                 const proto::ContainerResourcesRequest& r);

/// The longest reply line control_request() and ControlSession read: bytes (control::kReplyMax).
inline constexpr std::size_t kControlReplyMax = control::kReplyMax;
/// The longest request line the control socket reads: bytes (control::kRequestMax).
inline constexpr std::size_t kControlRequestMax = control::kRequestMax;

/// Answers one control request with a typed reply: encoded (control::encode) and sent; the
/// connection stays open for more unless control::is_final(reply).
using ControlRespond = std::function<void(control::Reply reply)>;

/// What the monitor does for each control request (host/monitor/control.hpp), called on the
/// server's io_context. A handler left empty answers its request "error: REQUEST: not served
/// here". Fds a request other than `exec` carried are closed.
struct ControlHandlers {
  /// The VM generation this monitor serves: a request targeting another one (control::Targeted)
  /// is answered "error: generation: ..." naming both. 0: unknown, not checked.
  std::uint64_t generation = 0;
  /// `stop`: Ok or the error, answered "ok" / "error: WHY".
  std::function<host::Status()> stop;
  /// `kill SIG [PROC]`, likewise.
  std::function<host::Status(const control::Kill&)> kill;
  /// `resize ROWS COLS [PROC]`, likewise.
  std::function<host::Status(const control::Resize&)> resize;
  /// `pause` / `resume`, likewise.
  std::function<host::Status()> pause, resume;
  /// `ps`: calls `done` once, now or later on the io_context; answered "ok JSON" / "error: WHY".
  std::function<void(std::function<void(host::Result<proto::Processes>)> done)> ps;
  /// `resources JSON`: calls `done` once; answered "ok JSON" / "error: WHY".
  std::function<void(const proto::ContainerResourcesRequest& r,
                     std::function<void(host::Result<proto::ContainerResourcesReply>)> done)>
      resources;
  /// `exec FLAGS JSON` with the fds it carried (at most 3): answers through `respond` at least
  /// once, a final reply last (Waiting and Started say more follows).
  std::function<void(control::Exec request, std::vector<host::Fd> fds, ControlRespond respond)> exec;
  /// `wait PROC`: answers through `respond`, now or later: Waiting or Started first while the
  /// process runs, a final control::Exited or control::Error last.
  std::function<void(const control::Wait& request, ControlRespond respond)> wait;
  /// `close-stdin`: Ok or the error, answered "ok" / "error: WHY".
  std::function<host::Status()> close_stdin;
};

/// The sequence numbers of the journaled controls (control::Targeted::seq) a monitor applied:
/// the last control::kSeqsKept, the oldest forgotten first.
struct AppliedSeqs {
  std::deque<std::uint64_t> kept;
  bool seen(std::uint64_t seq) const;
  void keep(std::uint64_t seq);
};

/// The server's dispatch: each line parsed with control::parse_targeted (a line that does not
/// parse is answered "error: " and why, naming the field; one aimed at another generation than
/// handlers.generation, "error: generation: ..."), handed to its handler in `handlers`,
/// the handler's answer encoded with control::encode. A request with a sequence number whose
/// answer was Ok before (one of the last control::kSeqsKept) is answered Ok and not handed on
/// again. For ControlServer::start.
ControlServer::Handler control_handler(ControlHandlers handlers);

/// A connected control socket for a request that lives on (`exec`): the request sent with
/// `fds` (SCM_RIGHTS), then read_line() for each answer line. Errors: no monitor listening.
class ControlSession {
 public:
  /// Errors also: a request control::validate() refuses (nothing is sent), more than 3 fds.
  static host::Result<ControlSession> open(const std::filesystem::path& path, const control::Request& request,
                                           const std::vector<int>& fds);
  /// As above, aimed at one generation (control::Targeted; no retry without it).
  static host::Result<ControlSession> open(const std::filesystem::path& path, const control::Targeted& request,
                                           const std::vector<int>& fds);
  /// The next reply (control::parse_reply), waiting at most `timeout` (nullopt: no bound).
  /// Errors: the monitor closed or reset the connection (err ECONNRESET, or the recv(2) errno),
  /// timeout (ETIMEDOUT), a line over kControlReplyMax, a line that does not parse ("unexpected
  /// answer: " and why).
  host::Result<control::Reply> read_reply(std::optional<std::chrono::milliseconds> timeout);
  int fd() const { return sock_.get(); }
  /// The connection itself, for a caller that reads the answers on its own loop (nothing has
  /// been read from it yet unless read_line() was called).
  host::Fd take() { return std::move(sock_); }

 private:
  explicit ControlSession(host::Fd s) : sock_(std::move(s)) {}
  host::Fd sock_;
  std::string buf_;
};

/// Send one request to the control socket at `path` and return the monitor's reply (its first
/// line, parsed). Bounded by `timeout`. Errors: a request control::validate() refuses (nothing is
/// sent), no monitor listening (ECONNREFUSED/ENOENT), timeout, no reply, a reply that does not
/// parse ("PATH: unexpected reply: " and why). The monitor's own `error: WHY` is a Reply
/// (control::Error), not an Error.
host::Result<control::Reply> control_request(const std::filesystem::path& path, const control::Request& request,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(5));
/// As above, aimed at one generation (control::Targeted): a monitor of another generation answers
/// control::Error naming both; one that predates the prefix ("unknown request") gets the bare
/// request once.
host::Result<control::Reply> control_request(const std::filesystem::path& path, const control::Targeted& request,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(5));
/// control_request() for a request answered "ok" or "error: WHY" (stop, kill, resize): Ok, or
/// the reply line that was not "ok" as the Error's message (e.g. "error: no such process"), or
/// control_request()'s error.
host::Status control_call(const std::filesystem::path& path, const control::Request& request,
                          std::chrono::milliseconds timeout = std::chrono::seconds(5));
host::Status control_call(const std::filesystem::path& path, const control::Targeted& request,
                          std::chrono::milliseconds timeout = std::chrono::seconds(5));

}  // namespace nes::monitor

// The names host/cli and host/shim spelled `nes::cli::` before this header moved to nes::monitor;
// kept until the shim (rewritten on another branch at the time) spells them nes::monitor:: too.
namespace nes::cli {
namespace control = monitor::control;
using monitor::control_call;
using monitor::control_handler;
using monitor::control_request;
using monitor::ControlHandlers;
using monitor::ControlRespond;
using monitor::ControlServer;
using monitor::ControlSession;
using monitor::detach;
using monitor::Detached;
using monitor::guest_processes;
using monitor::kControlReplyMax;
using monitor::kControlRequestMax;
using monitor::notify_started;
}  // namespace nes::cli
