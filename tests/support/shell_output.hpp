// A test's own tool run through the shell (dump.erofs, debugfs, e2fsck, ...): its standard output.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace nes::test {

/// Standard output of `sh -c cmd` (popen(3)), read to its end; stderr is the test's. Aborts the
/// test binary if the shell cannot be started (nothing the test checks could run without it).
inline std::string shell_output(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    std::perror("popen");
    std::abort();
  }
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

}  // namespace nes::test
