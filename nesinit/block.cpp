#include "block.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>

#include "base/fd.hpp"

namespace nes::init {

namespace {

/// Whether `dir`/`name`/serial holds `serial` (one read: the attribute is a few bytes).
bool serial_is(const char* dir, const char* name, std::string_view serial) {
  const std::string path = std::string(dir) + "/" + name + "/serial";
  base::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return false;  // not a virtio-blk disk (no serial attribute)
  char buf[64];
  ssize_t n = ::read(fd.get(), buf, sizeof buf);
  if (n <= 0) return false;
  std::string_view got(buf, static_cast<std::size_t>(n));
  while (!got.empty() && (got.back() == '\n' || got.back() == '\0')) got.remove_suffix(1);
  return got == serial;
}

}  // namespace

base::Result<std::string> find_block_device(std::string_view serial, int wait_ms, const char* sys_block) {
  for (int slept = 0, tick = 5;; slept += tick, tick = std::min(2 * tick, 50)) {
    if (DIR* d = ::opendir(sys_block)) {
      std::string found;
      while (const dirent* e = ::readdir(d))
        if (e->d_name[0] != '.' && serial_is(sys_block, e->d_name, serial)) {
          found = std::string("/dev/") + e->d_name;
          break;
        }
      ::closedir(d);
      if (!found.empty()) return found;
    }
    if (slept >= wait_ms)
      return base::errno_error(ENODEV, "no disk with serial " + std::string(serial));
    const timespec ts{0, tick * 1000000L};
    ::nanosleep(&ts, nullptr);
  }
}

}  // namespace nes::init
