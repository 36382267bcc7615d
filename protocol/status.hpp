// Outcome -> exit status: the one table both ends and the CLI use (docs/protocol.md; docker/podman
// conventions, docs/facts.md "Exit-status conventions").
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "messages.hpp"

namespace nes::proto {

/// How a session ended, as the host records it.
enum class Outcome {
  exited,            // workload_exited{exit_code}
  signalled,         // workload_exited{signal}
  start_failed,      // start_failed{class}
  mount_failed,      // mount_failed
  network_failed,    // network_failed
  channel_lost,      // EOF/reset before a final event
  protocol_error,    // malformed/over-long guest line before a final event
  no_ready,          // no `ready` within the deadline from vm_started
  version_mismatch,  // ready.protocol_version != 2
  timeout,           // the host's wall limit expired
  stopped,           // the host ended the session (shutdown()) and the guest reported nothing
};

/// Exit-status constants (POSIX shell; timeout(1); docker/podman for host-side failures).
inline constexpr int kStatusTimeout = 124;        // timeout(1)
inline constexpr int kStatusHostFailure = 125;    // docker run: the daemon/host side failed
inline constexpr int kStatusNotExecutable = 126;  // POSIX shell: found but not executable
inline constexpr int kStatusNotFound = 127;       // POSIX shell: command not found
inline constexpr int kStatusSignalBase = 128;     // POSIX shell: 128+N killed by signal N
/// 143 = 128+SIGTERM: what docker reports for a container `docker stop` ended. Used for
/// Outcome::stopped, where the host asked for the end and the guest reported nothing.
inline constexpr int kStatusStopped = 143;

/// Exit status of a workload_exited report: the code, or 128+signal.
int exit_status(const WorkloadExited& m);
/// 127 for not_found, 126 otherwise.
int exit_status(const StartFailed& m);
/// 125.
int exit_status(const MountFailed& m);
/// 125.
int exit_status(const NetworkFailed& m);
/// The status of a recorded outcome. `exit_code`/`signal`/`cls` are consulted for exited,
/// signalled and start_failed respectively; every host-side failure is 125, timeout 124,
/// stopped 143.
int exit_status(Outcome o, std::optional<std::uint8_t> exit_code = std::nullopt,
                std::optional<std::uint8_t> signal = std::nullopt,
                std::optional<StartFailClass> cls = std::nullopt);

/// Wire/record names ("exited", "not_found", "virtiofs", "poweroff", ...), and their inverses.
std::string_view to_string(Outcome o);
std::string_view to_string(StartFailClass c);
std::string_view to_string(FsType f);
std::string_view to_string(Halt h);
std::string_view to_string(StdioMode m);
std::optional<Outcome> outcome_from_string(std::string_view s);

}  // namespace nes::proto
