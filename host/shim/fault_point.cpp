#include "host/shim/fault_point.hpp"

#include "host/monitor/fault_point.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace nes::shim {

void fault_point(std::string_view name) {
#ifdef NES_FAULT_POINTS
  // `stop:NAME`: frozen there (SIGSTOP), for a test that replaces the shim while containerd is
  // down (a shim that dies while containerd runs is cleaned up, never replaced).
  if (const char* want = std::getenv("NESINIT_SHIM_FAULT"); want && std::string_view(want) == "stop:" + std::string(name)) {
    const std::string line = "containerd-shim-nesinit-v2: fault point " + std::string(name) + ": SIGSTOP\n";
    [[maybe_unused]] auto n = ::write(2, line.data(), line.size());
    ::raise(SIGSTOP);
    return;
  }
#endif
  monitor::fault_point(name, "NESINIT_SHIM_FAULT", "containerd-shim-nesinit-v2");
}

int fault_errno(std::string_view name) {
#ifdef NES_FAULT_POINTS
  const char* want = std::getenv("NESINIT_SHIM_FAULT");
  if (!want) return 0;
  std::string_view w(want);
  if (!w.starts_with("eio:") || w.substr(4) != name) return 0;
  std::fprintf(stderr, "containerd-shim-nesinit-v2: fault point %s: EIO\n", want);
  std::fflush(stderr);
  return EIO;
#else
  (void)name;
  return 0;
#endif
}

bool fault_points_built() {
#ifdef NES_FAULT_POINTS
  return true;
#else
  return false;
#endif
}

}  // namespace nes::shim
