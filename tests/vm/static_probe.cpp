// A static test program for `neshost run --rootfs DIR`: the only file in DIR besides what
// mkinitrd adds. Prints its argv[1], whether it is PID 1 (it must not be: nesinit is), and the
// hostname it was given, then exits 5. Raw syscalls only, so a static link stays small.
#include <unistd.h>

#include <cstring>

namespace {
void out(const char* s) { [[maybe_unused]] auto n = ::write(1, s, std::strlen(s)); }
}  // namespace

int main(int argc, char** argv) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  out("static probe: ");
  out(argc > 1 ? argv[1] : "(no argument)");
  out(::getpid() == 1 ? " pid1=yes" : " pid1=no");
  out(" hostname=");
  out(host);
  out("\n");
  return 5;
}
