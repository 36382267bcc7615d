#include "log.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace nes::init {

bool Log::enabled(Severity s) const {
  switch (s) {
    case Severity::error:
    case Severity::warn: return true;
    case Severity::info: return level_ != LogLevel::quiet;
    case Severity::debug: return level_ == LogLevel::debug;
  }
  return true;
}

void Log::line(Severity s, std::string_view phase, std::string_view text) const {
  if (!enabled(s)) return;
  constexpr std::size_t kMax = 4096;
  std::string out;
  out.reserve(32 + phase.size() + std::min(text.size(), kMax));
  out += "nesinit: ";
  out += phase;
  out += ": ";
  if (s == Severity::error) out += "error: ";
  if (s == Severity::warn) out += "warning: ";
  out += text.substr(0, kMax);
  if (text.size() > kMax) out += "...";
  out += '\n';
  // One write per line. A line the fd cannot take now is dropped and counted (the log must never
  // stop PID 1); the count goes out ahead of the next line that fits.
  if (unreported_) {
    std::string note = fmt::format("nesinit: log: warning: {} line(s) dropped (output not read)\n",
                                   unreported_);
    if (!write_now(note)) {
      ++dropped_, ++unreported_;
      return;
    }
    unreported_ = 0;
  }
  if (!write_now(out)) ++dropped_, ++unreported_;
}

bool Log::write_now(std::string_view rest) const {
  if (poll_first_) {
    pollfd p{fd_, POLLOUT, 0};
    if (::poll(&p, 1, 0) != 1 || !(p.revents & POLLOUT)) return false;
  }
  const int fd = own_fd_ >= 0 ? own_fd_ : fd_;
  // A short write (the pipe filled up mid-line) loses the rest of that line: retrying would wait.
  for (int tries = 0; !rest.empty() && tries < 4; ++tries) {
    ssize_t n = is_socket_ ? ::send(fd, rest.data(), rest.size(), MSG_DONTWAIT | MSG_NOSIGNAL)
                           : ::write(fd, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
  return rest.empty();
}

base::Status Log::make_nonblocking() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return base::errno_error(errno, "fstat");
  if (S_ISREG(st.st_mode)) return base::Ok{};
  if (S_ISSOCK(st.st_mode)) {
    is_socket_ = true;
    return base::Ok{};
  }
  // fmt, not snprintf: the init's only printf-family call linked musl's printf core (~9 KiB).
  char path[32]{};
  fmt::format_to_n(path, sizeof path - 1, "/proc/self/fd/{}", fd_);
  int fd = ::open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    poll_first_ = true;
    return base::errno_error(errno, path);
  }
  if (own_fd_ >= 0) ::close(own_fd_);
  own_fd_ = fd;
  return base::Ok{};
}

Log::~Log() {
  if (own_fd_ >= 0) ::close(own_fd_);
}

std::string errno_text(int err) {
  const char* name = nullptr;
  switch (err) {
    case 0: return "no error";
    case ENOENT: name = "ENOENT"; break;
    case EACCES: name = "EACCES"; break;
    case EPERM: name = "EPERM"; break;
    case ENOEXEC: name = "ENOEXEC"; break;
    case ENOTDIR: name = "ENOTDIR"; break;
    case EINVAL: name = "EINVAL"; break;
    case EBUSY: name = "EBUSY"; break;
    case EEXIST: name = "EEXIST"; break;
    case ENODEV: name = "ENODEV"; break;
    case ECONNREFUSED: name = "ECONNREFUSED"; break;
    case ETIMEDOUT: name = "ETIMEDOUT"; break;
    case EROFS: name = "EROFS"; break;
    case ENOMEM: name = "ENOMEM"; break;
    default: break;
  }
  std::string s = name ? fmt::format("{} ({})", name, std::strerror(err))
                       : fmt::format("errno {} ({})", err, std::strerror(err));
  return s;
}

}  // namespace nes::init
