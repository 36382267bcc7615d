// The per-VM monitor's pieces that are not the VM itself (docs/host.md "Detached VMs"): turning
// `neshost run -d` into a monitor in its own session that outlives the CLI, and the control
// socket `<state>/<vm>/control.sock` through which any fresh process asks the monitor to stop
// the VM or signal its workload. The monitor is the ordinary `neshost run` process; only its
// start and its stdio differ when detached.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "host/fd.hpp"
#include "host/result.hpp"
#include "protocol/messages.hpp"

namespace nes::cli {

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

/// The monitor's control socket. Requests are one line each, one per connection, answered with
/// one line ("ok" or "error: WHY"):
///   `stop`      ordered shutdown of the guest (as SIGTERM to `neshost run`)
///   `kill SIG`  signal 1..64 to the workload's process group
///   `resize ROWS COLS`  the workload's terminal size (run -t), each 1..65535
///   `ps`        the guest's processes: "ok " and their JSON array (protocol `processes`)
/// Only peers with our uid (or root) are served (SO_PEERCRED); requests over 256 bytes or slower
/// than 2 s are dropped, a reply not ready 5 s after its request is never sent.
class ControlServer {
 public:
  /// Called once per request; calls `reply` once with the answer line (without '\n'), now or
  /// later on the io_context.
  using Handler = std::function<void(std::string_view request, std::function<void(std::string reply)> reply)>;
  /// Bind `path` (0600; any stale socket there is replaced: the caller owns the VM's generation)
  /// and serve on `io`. The path may be longer than sun_path (bound through /proc/self/fd).
  static host::Result<std::unique_ptr<ControlServer>> start(boost::asio::io_context& io,
                                                            const std::filesystem::path& path,
                                                            Handler handler);
  /// Stops serving and unlinks the socket.
  ~ControlServer();
  struct Impl;

 private:
  explicit ControlServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

/// Send one request to the control socket at `path` and return the monitor's reply line (without
/// '\n'). Bounded by `timeout`. Errors: no monitor listening (ECONNREFUSED/ENOENT), timeout.
/// The guest's processes through the control socket at `path` (request `ps`), decoded. Errors:
/// no monitor, its error line (e.g. the guest did not answer), a reply that is not `processes`.
host::Result<proto::Processes> guest_processes(const std::filesystem::path& path);

/// The longest reply control_request() reads: bytes (a `ps` answer of 512 processes fits).
inline constexpr std::size_t kControlReplyMax = 1u << 20;

host::Result<std::string> control_request(const std::filesystem::path& path, std::string_view request,
                                          std::chrono::milliseconds timeout = std::chrono::seconds(5));

}  // namespace nes::cli
