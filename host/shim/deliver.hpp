// A control request delivered once the VM's monitor and its guest can take it (the VM may still
// be booting when containerd, which reports the task RUNNING once Start answered, sends it).
// docs/containerd.md "Controls while the guest boots".
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>

#include <boost/asio/io_context.hpp>

#include "host/lib/base.hpp"
#include "host/monitor/monitor.hpp"

namespace nes::shim {

/// Whether a control request's failure means only "not yet": the VM's control socket does not
/// exist or nothing listens on it yet (`no monitor at PATH: ...`), or the monitor answered that
/// its guest has not booted (`the guest is not ready yet`, pause; `no booted session`, kill).
/// Anything else (a refusal, a finished session, a timeout) is the answer.
bool not_ready_yet(const host::Error& e);

/// One try of a delivery: `again` (not yet: tried again in 20 ms), else `status` is the answer.
struct Attempt {
  bool again = false;
  host::Status status = host::Ok{};
};
/// How a delivery ended: answered (the status is the answer), gave_up (the bound passed: the
/// last try's error, "... (still not ready after N s)"), unwanted (`still_wanted()` turned false:
/// "the task is no longer running").
enum class Delivered { answered, gave_up, unwanted };

/// The one "deliver when the monitor listens" loop: `attempt` at once, then every 20 ms while it
/// says `again` and `still_wanted()` is true, for at most `bound` from the first try; then
/// `done(status, how)`. `attempt`, `still_wanted` and `done` are called on `io`'s thread only,
/// `done` exactly once (unless `io` is destroyed first).
void retry_when_ready(boost::asio::io_context& io, std::function<Attempt()> attempt, std::chrono::milliseconds bound,
                      std::function<bool()> still_wanted, std::function<void(host::Status, Delivered)> done);

/// One try that sends `request` to the control socket `control` (control_request, 2 s): again
/// while the socket does not exist or the monitor does not answer (no reply, no connection);
/// the monitor's reply is the answer (Ok, or its line, e.g. "error: ...", as the error).
Attempt control_attempt(const std::filesystem::path& control, const cli::control::Request& request);
/// As above, a journaled control (its sequence number: a retry after a lost answer is applied once).
Attempt control_attempt(const std::filesystem::path& control, const cli::control::Targeted& request);

/// Sends `request` to the control socket `control` on `io`'s thread: at once, then every 20 ms
/// while not_ready_yet() says so and `still_wanted()` is true, for at most `bound` from the first
/// try; then `done` gets the monitor's answer: Ok, the last error (after the bound, "... (still
/// not ready after N s)"), or, when `still_wanted()` turned false, "the task is no longer
/// running". Each try is one blocking control_call of at most 2 s. `still_wanted` and `done` are
/// called on `io`'s thread only, `done` exactly once (unless `io` is destroyed first). A
/// retry_when_ready() whose try is one control_call.
void deliver_when_ready(boost::asio::io_context& io, std::filesystem::path control, cli::control::Request request,
                        std::chrono::milliseconds bound, std::function<bool()> still_wanted,
                        std::function<void(host::Status)> done);
/// As above, a journaled control (control::Targeted: its sequence number, so a try whose answer
/// was lost and that is tried again is applied once).
void deliver_when_ready(boost::asio::io_context& io, std::filesystem::path control, cli::control::Targeted request,
                        std::chrono::milliseconds bound, std::function<bool()> still_wanted,
                        std::function<void(host::Status)> done);

}  // namespace nes::shim
