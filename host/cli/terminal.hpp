// The local terminal for `neshost run -t`: its size (for the guest's PTY and SIGWINCH resizes)
// and raw mode, restored on every exit path (RAII). Raw mode as `docker run -it` and `ssh -t`
// set it (cfmakeraw): keys, ^C included, go to the workload's terminal, whose line discipline
// turns ^C into SIGINT for its foreground process group. Why: docs/vm.md "Terminal".
#pragma once

#include <termios.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "host/lib/base.hpp"

namespace nes::cli {

/// Rows and columns of a terminal, in character cells.
struct TermSize {
  std::uint16_t rows = 24;
  std::uint16_t cols = 80;
};

/// The size of the terminal on `fd` (TIOCGWINSZ); nullopt if `fd` is not a terminal or reports
/// a zero size.
std::optional<TermSize> terminal_size(int fd);

/// Raw mode on one terminal for as long as this object lives. The settings from before are put
/// back by restore() or the destructor (TCSAFLUSH is not used on restore: typed-ahead input
/// stays), whichever comes first.
class RawMode {
 public:
  /// Saves the settings of the terminal on `fd`, then applies cfmakeraw(3). Errors: not a
  /// terminal, tcgetattr/tcsetattr failures (with errno text).
  static host::Result<std::unique_ptr<RawMode>> enter(int fd);
  ~RawMode() { restore(); }
  RawMode(const RawMode&) = delete;
  RawMode& operator=(const RawMode&) = delete;
  /// Puts the saved settings back (idempotent).
  void restore();

  RawMode(int fd, const termios& saved) : fd_(fd), saved_(saved) {}

 private:
  int fd_;
  termios saved_;
  bool restored_ = false;
};

}  // namespace nes::cli
