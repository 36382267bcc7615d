// The one way the init and the host read a small file whole: a /proc or /sys entry, a config
// file, a record in the state dir. Bounded (a file a peer or another process can write never
// makes us allocate without limit), never through a symlink, never blocked by a FIFO planted in
// its place. Header-only, exception-free, std and fmt only (the init is measured in KiB: no
// iostream, no std::to_string).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "base/fd.hpp"
#include "base/result.hpp"

namespace nes::base {

/// What read_small_file does with a file longer than its cap.
enum class Longer {
  fail,      ///< an Error (err EFBIG): the file is not what the caller expects
  truncate,  ///< its first `cap` bytes: procfs text the caller cuts anyway (argv, stat fields)
};

/// How read_small_file reads one file; every field has the default of a file no one should be
/// able to plant (a record, a /proc entry).
struct SmallFileOptions {
  /// A file longer than the cap: an error, or its first `cap` bytes.
  Longer longer = Longer::fail;
  /// Follow a symlink as the last component: a config file in an image the user built, where a
  /// symlinked /etc file is ordinary. Off: such a symlink is refused (ELOOP).
  bool follow_symlink = false;
  /// The name errors use; empty: the file's name as given.
  std::string_view shown = {};
};

namespace detail {

/// What went wrong in read_small_file; each has one message shape (kSmallFileShape).
enum class SmallFileFailure { open, symlink, not_regular, read, too_large };
inline constexpr std::string_view kSmallFileShape[] = {
    "open {}", "{}: is a symlink; refusing to follow it", "{}: not a regular file", "read {}",
    "{}: larger than {} bytes"};

/// read_small_file's Error for `what` on the file `shown`: its message names the file (then the
/// errno `err`, or the cap, as its shape has them); Error::err is `err`. Out of line, one
/// formatting call for every shape: a failure path costs the init one call.
[[gnu::noinline]] inline Result<std::string> small_file_failed(SmallFileFailure what, std::string_view shown, int err,
                                                               std::size_t cap) {
  std::string m = fmt::format(fmt::runtime(kSmallFileShape[static_cast<int>(what)]), shown, cap);
  if (what == SmallFileFailure::open || what == SmallFileFailure::read) return errno_error(err, m);
  return Error{std::move(m), err};
}

inline int small_file_flags(const SmallFileOptions& o) {
  return O_RDONLY | O_CLOEXEC | O_NONBLOCK | (o.follow_symlink ? 0 : O_NOFOLLOW);
}

/// read_small_file once the open(2) is done: `f` is the file, or none with errno set by the open.
[[gnu::noinline]] inline Result<std::string> read_opened(Fd f, std::size_t cap, const SmallFileOptions& o,
                                                         std::string_view shown) {
  using F = SmallFileFailure;
  if (!f) return small_file_failed(errno == ELOOP ? F::symlink : F::open, shown, errno, cap);
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) return small_file_failed(F::read, shown, errno, cap);
  if (!S_ISREG(st.st_mode)) return small_file_failed(F::not_regular, shown, 0, cap);
  // Plain blocking reads from here on (O_NONBLOCK was for the open only).
  ::fcntl(f.get(), F_SETFL, 0);
  std::string out;
  char buf[4096];
  for (;;) {
    // Truncating: never read past the cap (a /proc file is generated as it is read).
    const std::size_t want = o.longer == Longer::truncate ? std::min(sizeof buf, cap - out.size()) : sizeof buf;
    if (want == 0) break;
    const ssize_t n = ::read(f.get(), buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return small_file_failed(F::read, shown, errno, cap);
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > cap) return small_file_failed(F::too_large, shown, EFBIG, cap);
  }
  return out;
}

}  // namespace detail

/// The contents of the regular file `name`, opened relative to `dirfd`, at most `cap` bytes. The
/// open is O_NONBLOCK (a FIFO in its place cannot hang it) and, unless `o.follow_symlink`,
/// O_NOFOLLOW; then anything but a regular file is refused (procfs and sysfs entries are regular
/// files). EINTR is retried.
/// Errors name the file and carry the errno in Error::err: ENOENT for no such file, which a
/// caller that takes "absent" as "none" tests for; ELOOP for a refused symlink; EFBIG for longer
/// than `cap` with Longer::fail; 0 for not a regular file.
inline Result<std::string> read_small_file(int dirfd, const char* name, std::size_t cap, const SmallFileOptions& o = {}) {
  return detail::read_opened(Fd{::openat(dirfd, name, detail::small_file_flags(o))}, cap, o,
                             o.shown.empty() ? std::string_view(name) : o.shown);
}

/// read_small_file for a path (relative to the working directory, or absolute).
inline Result<std::string> read_small_file(const char* path, std::size_t cap, const SmallFileOptions& o = {}) {
  return detail::read_opened(Fd{::open(path, detail::small_file_flags(o))}, cap, o,
                             o.shown.empty() ? std::string_view(path) : o.shown);
}

}  // namespace nes::base
