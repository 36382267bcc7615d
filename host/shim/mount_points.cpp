// A read-only root's mount points (host/shim/mount_points.hpp).
#include "host/shim/mount_points.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace nes::shim {
using host::Error;
using host::Fd;
namespace fs = std::filesystem;

namespace {

// Opens directory `name` in `dir`, creating it if missing; never through a symlink. Invalid: a
// symlink or not a directory (left alone); an error for any other failure.
host::Result<Fd> open_dir(int dir, const std::string& name, std::string_view path) {
  if (::mkdirat(dir, name.c_str(), 0755) != 0 && errno != EEXIST)
    return Error{fmt::format("root mount point {}: {}", path, std::strerror(errno))};
  Fd d(::openat(dir, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!d) return Fd{};  // a symlink or a file: the guest reports it if it matters
  return d;
}

host::Status make_path(int root, std::string_view guest, bool file) {
  Fd cur(::fcntl(root, F_DUPFD_CLOEXEC, 3));
  std::string walked;
  std::size_t i = 0;
  while (i < guest.size()) {
    while (i < guest.size() && guest[i] == '/') ++i;
    std::size_t j = guest.find('/', i);
    if (j == std::string_view::npos) j = guest.size();
    std::string name(guest.substr(i, j - i));
    i = j;
    if (name.empty()) break;
    if (name == "." || name == "..") return host::Ok{};  // never leaves the root
    walked += "/" + name;
    const bool last = guest.find_first_not_of('/', i) == std::string_view::npos;
    if (last && file) {
      Fd f(::openat(cur.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
      if (!f && errno != EEXIST) return Error{fmt::format("root mount point {}: {}", walked, std::strerror(errno))};
      return host::Ok{};
    }
    auto next = open_dir(cur.get(), name, walked);
    if (!next) return next.error();
    if (!*next) return host::Ok{};
    cur = std::move(*next);
  }
  return host::Ok{};
}

}  // namespace

host::Status make_mount_points(const fs::path& root, const std::vector<Volume>& volumes) {
  Fd r(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!r) return Error{fmt::format("root {}: {}", root.string(), std::strerror(errno))};
  for (const char* d : {"/dev", "/proc", "/sys", "/run", "/tmp", "/etc"})
    if (auto s = make_path(r.get(), d, false); !s) return s;
  for (const char* f : {"/etc/hosts", "/etc/resolv.conf", "/etc/hostname"})
    if (auto s = make_path(r.get(), f, true); !s) return s;
  for (const auto& v : volumes) {
    std::error_code ec;
    const bool file = !fs::is_directory(v.host, ec);
    if (auto s = make_path(r.get(), v.guest, file); !s) return s;
  }
  return host::Ok{};
}

}  // namespace nes::shim
