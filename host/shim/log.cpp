#include "host/shim/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>

namespace nes::shim {

namespace {
std::atomic<std::uint64_t> lost{0};
}

void log_line(std::string_view text) {
  std::string line;
  line.reserve(text.size() + 32);
  line.append("containerd-shim-nesinit-v2: ").append(text).push_back('\n');
  std::size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(2, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      lost.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    off += static_cast<std::size_t>(n);
  }
}

std::uint64_t log_lines_lost() { return lost.load(std::memory_order_relaxed); }

}  // namespace nes::shim
