#include "host/lib/state_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fmt/format.h>
#include <thread>
#include <vector>

namespace nes::host {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int e) { return std::strerror(e); }

/// mkdir with mode 0700; if it was created, fsync its parent so the new entry is durable.
Status make_dir_durable(const fs::path& dir) {
  if (::mkdir(dir.c_str(), 0700) == 0) {
    fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
    return fsync_dir(parent);
  }
  if (errno == EEXIST) {
    struct stat st{};
    if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Ok{};
    return Error{fmt::format("{}: exists and is not a directory", dir.string())};
  }
  return Error{fmt::format("mkdir {}: {}", dir.string(), errno_text(errno))};
}

/// `what` for an openat() error inside the state dir: a symlink (ELOOP from O_NOFOLLOW) is named.
std::string open_error(const fs::path& shown, int e) {
  if (e == ELOOP) return fmt::format("{}: is a symlink; refusing to follow it in the state dir", shown.string());
  return fmt::format("open {}: {}", shown.string(), errno_text(e));
}

/// open_vm_dir(); with `created` non-null, a VM dir made here is reported through it instead of
/// being fsynced into the state dir at once.
Result<Fd> open_vm_dir_impl(const fs::path& state_dir, std::string_view vm, bool create,
                            bool* created) {
  if (created) *created = false;
  if (auto id = check_vm_id(vm); !id) return id.error();
  if (create)
    if (auto s = make_dirs_durable(state_dir); !s) return s.error();
  Fd state{::open(state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (!state) {
    if (errno == ENOENT && !create) return Fd{};
    return Error{fmt::format("open {}: {}", state_dir.string(), errno_text(errno))};
  }
  const std::string name(vm);
  const fs::path shown = state_dir / name;
  if (create) {
    if (::mkdirat(state.get(), name.c_str(), 0700) == 0) {
      if (created) *created = true;
      else if (::fsync(state.get()) != 0)
        return Error{fmt::format("fsync {}: {}", state_dir.string(), errno_text(errno))};
    } else if (errno != EEXIST) {
      return Error{fmt::format("mkdir {}: {}", shown.string(), errno_text(errno))};
    }
  }
  Fd d{::openat(state.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
  if (!d) {
    if (errno == ENOENT && !create) return Fd{};
    if (errno == ENOTDIR) {
      // O_NOFOLLOW|O_DIRECTORY on a symlink gives ENOTDIR on some kernels, ELOOP on others.
      struct stat st{};
      if (::fstatat(state.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
        return Error{open_error(shown, ELOOP)};
      return Error{fmt::format("{}: exists and is not a directory", shown.string())};
    }
    return Error{open_error(shown, errno)};
  }
  // Records are private (they hold the workload's argv-derived reasons): 0700 whoever made it.
  struct stat st{};
  if (create && ::fstat(d.get(), &st) == 0 && (st.st_mode & 077) && st.st_uid == ::geteuid())
    ::fchmod(d.get(), 0700);
  return d;
}

std::atomic<std::uint64_t> g_temp_counter{0};  // unique temp names within this process

}  // namespace

std::string virtiofsd_log_name(std::string_view tag) { return fmt::format("virtiofsd-{}.log", tag); }

Status check_name(std::string_view what, std::string_view name) {
  if (name.empty()) return Error{fmt::format("{} is empty", what)};
  if (name.size() > kMaxNameBytes)
    return Error{fmt::format("{} is {} bytes; at most {}", what, name.size(), kMaxNameBytes)};
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok)
      return Error{fmt::format("{} may hold only [A-Za-z0-9._-]; got byte 0x{:02x}", what,
                               static_cast<unsigned char>(c))};
  }
  return Ok{};
}

Status check_vm_id(std::string_view id) {
  // The leading byte is checked once the length is (an empty or long id says that first).
  if (!id.empty() && id.size() <= kMaxNameBytes && (id.front() == '.' || id.front() == '-'))
    return Error{fmt::format("vm id '{}' starts with '{}'", id, id.front())};
  return check_name("vm id", id);
}

fs::path vm_path(const fs::path& state_dir, std::string_view vm, std::string_view name) {
  return state_dir / std::string(vm) / std::string(name);
}
fs::path record_path(const fs::path& state_dir, std::string_view vm) {
  return vm_path(state_dir, vm, kOutcomeFile);
}
fs::path monitor_path(const fs::path& state_dir, std::string_view vm) {
  return vm_path(state_dir, vm, kMonitorFile);
}
fs::path stop_path(const fs::path& state_dir, std::string_view vm) {
  return vm_path(state_dir, vm, kStopFile);
}
fs::path control_path(const fs::path& state_dir, std::string_view vm) {
  return vm_path(state_dir, vm, kControlSocket);
}

Result<Fd> open_vm_dir(const fs::path& state_dir, std::string_view vm, bool create) {
  return open_vm_dir_impl(state_dir, vm, create, nullptr);
}

Result<Fd> detail::open_vm_dir_deferred(const fs::path& state_dir, std::string_view vm, bool& created) {
  return open_vm_dir_impl(state_dir, vm, true, &created);
}

Result<Fd> open_regular_at(int dirfd, const char* name, int flags, const fs::path& shown,
                           bool& missing) {
  missing = false;
  Fd f{::openat(dirfd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600)};
  if (!f) {
    if (errno == ENOENT) { missing = true; return Fd{}; }
    return Error{open_error(shown, errno)};
  }
  struct stat st{};
  if (::fstat(f.get(), &st) != 0) return Error{fmt::format("stat {}: {}", shown.string(), errno_text(errno))};
  if (!S_ISREG(st.st_mode)) return Error{fmt::format("{}: not a regular file", shown.string())};
  // Back to blocking I/O for a regular file (O_NONBLOCK means nothing there, but keep it plain).
  ::fcntl(f.get(), F_SETFL, ::fcntl(f.get(), F_GETFL) & ~O_NONBLOCK);
  return f;
}

Result<Fd> open_vm_file(const fs::path& state_dir, std::string_view vm, std::string_view name,
                        int flags) {
  auto d = open_vm_dir(state_dir, vm, (flags & O_CREAT) != 0);
  if (!d) return d.error();
  const fs::path shown = vm_path(state_dir, vm, name);
  if (!*d) return Error{fmt::format("open {}: {}", shown.string(), errno_text(ENOENT))};
  bool missing = false;
  auto f = open_regular_at(d->get(), std::string(name).c_str(), flags, shown, missing);
  if (!f) return f.error();
  if (missing) return Error{fmt::format("open {}: {}", shown.string(), errno_text(ENOENT))};
  return f;
}

Status make_dirs_durable(const fs::path& dir) {
  // Create missing ancestors first (each one fsynced into its parent). The state dir's own path is
  // the user's choice (it may go through a symlink); inside it nothing is followed.
  std::vector<fs::path> chain;
  for (fs::path p = dir; !p.empty() && p != p.root_path(); p = p.parent_path()) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) break;
    chain.push_back(p);
    if (p.parent_path() == p) break;
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it)
    if (auto s = make_dir_durable(*it); !s) return s;
  return Ok{};
}

Status fsync_dir(const fs::path& dir) {
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d && ::fsync(d.get()) == 0) return Ok{};
  const int e = errno;
  return Error{fmt::format("fsync {}: {}", dir.string(), errno_text(e)), e};
}

Status write_durable(const fs::path& dir, std::string_view name, std::string_view bytes) {
  auto tmp = dir / fmt::format(".{}.{}.{}.tmp", name, ::getpid(), g_temp_counter++);
  Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600)};
  if (!f) return Error{fmt::format("create {}: {}", tmp.string(), errno_text(errno))};
  auto fail = [&](std::string_view what) {
    int e = errno;
    ::unlink(tmp.c_str());
    return Error{fmt::format("{} {}: {}", what, (dir / std::string(name)).string(), errno_text(e))};
  };
  std::string_view left = bytes;
  while (!left.empty()) {
    ssize_t n = ::write(f.get(), left.data(), left.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("write");
    left.remove_prefix(static_cast<std::size_t>(n));
  }
  if (::fsync(f.get()) != 0) return fail("fsync");
  f.reset();
  if (::rename(tmp.c_str(), (dir / std::string(name)).c_str()) != 0) return fail("rename");
  if (auto s = fsync_dir(dir); !s) return s;
  return Ok{};
}

Result<Fd> lock_vm(int vm_dirfd, const fs::path& vm_dir, int tries) {
  const fs::path lock_path = vm_dir / kLockFile;
  bool missing = false;
  auto lock = open_regular_at(vm_dirfd, kLockFile, O_RDWR | O_CREAT, lock_path, missing);
  if (!lock) return lock.error();
  if (missing) return Error{fmt::format("open {}: {}", lock_path.string(), errno_text(ENOENT))};
  for (int i = 0;; ++i) {
    if (::flock(lock->get(), LOCK_EX | LOCK_NB) == 0) return lock;
    if (errno != EWOULDBLOCK && errno != EINTR)
      return Error{fmt::format("flock {}: {}", lock_path.string(), errno_text(errno))};
    if (i + 1 >= tries)
      return Error{fmt::format("flock {}: still held by another writer ({} tries 10 ms apart)",
                               lock_path.string(), tries)};
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace nes::host
