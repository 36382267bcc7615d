#include "host/cli/terminal.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>

namespace nes::cli {

std::optional<TermSize> terminal_size(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_row == 0 || ws.ws_col == 0) return std::nullopt;
  return TermSize{ws.ws_row, ws.ws_col};
}

host::Result<std::unique_ptr<RawMode>> RawMode::enter(int fd) {
  if (!::isatty(fd)) return host::Error{fmt::format("fd {} is not a terminal", fd)};
  termios saved{};
  if (::tcgetattr(fd, &saved) != 0) return host::Error{fmt::format("tcgetattr: {}", std::strerror(errno))};
  termios raw = saved;
  ::cfmakeraw(&raw);
  if (::tcsetattr(fd, TCSANOW, &raw) != 0)
    return host::Error{fmt::format("tcsetattr: {}", std::strerror(errno))};
  return std::make_unique<RawMode>(fd, saved);
}

void RawMode::restore() {
  if (restored_) return;
  restored_ = true;
  int r;
  do r = ::tcsetattr(fd_, TCSANOW, &saved_); while (r != 0 && errno == EINTR);
}

}  // namespace nes::cli
