#include "host/shim/fault_point.hpp"

#include "host/monitor/fault_point.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace nes::shim {

void fault_point(std::string_view name) {
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
