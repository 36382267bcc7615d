#include "log.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
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
  // One write per line; a short write or EINTR is retried, any other failure is dropped (the log
  // must never stop PID 1).
  std::string_view rest = out;
  while (!rest.empty()) {
    ssize_t n = ::write(fd_, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
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
