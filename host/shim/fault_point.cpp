#include "host/shim/fault_point.hpp"

#include <signal.h>

#include <cstdio>
#include <cstdlib>

namespace nes::shim {

void fault_point(std::string_view name) {
#ifdef NES_FAULT_POINTS
  const char* want = std::getenv("NESINIT_SHIM_FAULT");
  if (!want || name != want) return;
  std::fprintf(stderr, "containerd-shim-nesinit-v2: fault point %s: SIGKILL\n", want);
  std::fflush(stderr);
  ::raise(SIGKILL);
#else
  (void)name;
#endif
}

}  // namespace nes::shim
