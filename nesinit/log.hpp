// Logging of the init: one line per event to one fd (stderr; in guest mode that is /dev/console).
// Format `nesinit: <phase>: <detail>` so tests and people can follow the phase order.
#pragma once

#include <string_view>

#include <fmt/format.h>

#include "base/result.hpp"

namespace nes::init {

/// Verbosity (`log=` key / `--log=`): quiet = warnings and errors only, info = one line per
/// phase (default), debug = every message sent and received as well.
enum class LogLevel { quiet, info, debug };

/// Severity of one line.
enum class Severity { error, warn, info, debug };

/// A line sink: no buffering (each line is one write(2), so lines of the init and of the workload
/// on a shared console never tear), bounded line length (4 KiB; longer details are cut).
/// It never stops PID 1: once make_nonblocking() ran, a line the fd cannot take at once (a pipe
/// nobody reads, a console that is slow) is dropped and counted, and the count is written ahead
/// of the next line that fits.
class Log {
 public:
  explicit Log(int fd = 2, LogLevel level = LogLevel::info) : fd_(fd), level_(level) {}
  Log(const Log&) = delete;
  Log& operator=(const Log&) = delete;
  ~Log();
  /// Write through a non-blocking description of the same file: a pipe or character device is
  /// reopened through /proc/self/fd (its own O_NONBLOCK, so the workload that shares the fd is
  /// unaffected); a socket is written with MSG_DONTWAIT; a regular file never blocks. On an error
  /// (its err the errno) every write is preceded by a zero-timeout poll for POLLOUT instead.
  base::Status make_nonblocking();
  /// Lines dropped so far because the fd could not take them.
  unsigned long dropped() const { return dropped_; }
  void set_level(LogLevel l) { level_ = l; }
  LogLevel level() const { return level_; }
  bool enabled(Severity s) const;

  /// Write `nesinit: <phase>: <text>` if `s` is enabled at the current level.
  void line(Severity s, std::string_view phase, std::string_view text) const;

  template <typename... A>
  void info(std::string_view phase, fmt::format_string<A...> f, A&&... a) const {
    if (enabled(Severity::info)) line(Severity::info, phase, fmt::format(f, std::forward<A>(a)...));
  }
  template <typename... A>
  void debug(std::string_view phase, fmt::format_string<A...> f, A&&... a) const {
    if (enabled(Severity::debug)) line(Severity::debug, phase, fmt::format(f, std::forward<A>(a)...));
  }
  template <typename... A>
  void warn(std::string_view phase, fmt::format_string<A...> f, A&&... a) const {
    line(Severity::warn, phase, fmt::format(f, std::forward<A>(a)...));
  }
  template <typename... A>
  void error(std::string_view phase, fmt::format_string<A...> f, A&&... a) const {
    line(Severity::error, phase, fmt::format(f, std::forward<A>(a)...));
  }

 private:
  bool write_now(std::string_view bytes) const;  // all of it, or false (nothing more tried)

  int fd_;
  LogLevel level_;
  int own_fd_ = -1;          // the non-blocking reopen, when there is one
  bool is_socket_ = false;
  bool poll_first_ = false;  // no non-blocking description: poll before each write
  mutable unsigned long dropped_ = 0;
  mutable unsigned long unreported_ = 0;
};

/// strerror-like text for an errno value ("ENOENT (No such file or directory)").
std::string errno_text(int err);

}  // namespace nes::init
