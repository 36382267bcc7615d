// The shim's log: its stderr, which `serve` points at the bundle's `log` FIFO (containerd copies
// it into its own log while it holds the task's connection).
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace nes::shim {

/// Writes "containerd-shim-nesinit-v2: " + `text` + "\n" to fd 2 with write(2), and never fails
/// or throws: a log that no one reads any more (containerd closes its end of the `log` FIFO when
/// it lets go of a task, e.g. a pod's sandbox deleted while the pod's shim serves its containers:
/// EPIPE) loses the line, counted by log_lines_lost(). (fmt::print to stderr throws on such a
/// write, which ended a pod's shim in the middle of a container's Delete: issue 44.)
void log_line(std::string_view text);

/// log_line() of fmt::format(f, args...).
template <class... A>
void log(fmt::format_string<A...> f, A&&... args) {
  log_line(fmt::format(f, std::forward<A>(args)...));
}

/// Lines log_line() could not write (in full) since the process started.
std::uint64_t log_lines_lost();

}  // namespace nes::shim
