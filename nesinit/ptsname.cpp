// Size: ptsname_r(3) for the musl init, without snprintf. musl's (a weak alias of its
// __ptsname_r) formats "/dev/pts/N" with snprintf, the init's only printf-family call, which
// linked musl's whole printf core (~9 KiB). This strong definition replaces it, with musl's
// contract: TIOCGPTN's number as "/dev/pts/N"; 0, or an error number (also left in errno): the
// ioctl's, ERANGE if `len` is too short.
#include <errno.h>
#include <stdlib.h>
#include <sys/ioctl.h>

#include <cstddef>

extern "C" int ptsname_r(int fd, char* buf, std::size_t len) {
  unsigned pty = 0;
  if (::ioctl(fd, TIOCGPTN, &pty) != 0) return errno;
  char digits[10];
  std::size_t n = 0;
  do digits[n++] = static_cast<char>('0' + pty % 10); while ((pty /= 10) != 0);
  static const char prefix[] = "/dev/pts/";
  const std::size_t need = sizeof prefix - 1 + n + 1;
  if (!buf || len < need) return errno = ERANGE;
  for (std::size_t i = 0; i < sizeof prefix - 1; ++i) *buf++ = prefix[i];
  while (n) *buf++ = digits[--n];
  *buf = '\0';
  return 0;
}
