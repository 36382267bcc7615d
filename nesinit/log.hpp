// Logging of the init: one line per event to one fd (stderr; in guest mode that is /dev/console).
// Format `nesinit: <phase>: <detail>` so tests and people can follow the phase order.
#pragma once

#include <string_view>

#include <fmt/format.h>

namespace nes::init {

/// Verbosity (`log=` key / `--log=`): quiet = warnings and errors only, info = one line per
/// phase (default), debug = every message sent and received as well.
enum class LogLevel { quiet, info, debug };

/// Severity of one line.
enum class Severity { error, warn, info, debug };

/// A line sink: no buffering (each line is one write(2), so lines of the init and of the workload
/// on a shared console never tear), bounded line length (4 KiB; longer details are cut).
class Log {
 public:
  explicit Log(int fd = 2, LogLevel level = LogLevel::info) : fd_(fd), level_(level) {}
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
  int fd_;
  LogLevel level_;
};

/// strerror-like text for an errno value ("ENOENT (No such file or directory)").
std::string errno_text(int err);

}  // namespace nes::init
