#include "host/monitor/stdin_spool.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "host/lib/state_dir.hpp"

namespace nes::host {

namespace fs = std::filesystem;

Result<StdinSpool> StdinSpool::open(const fs::path& state_dir, std::string_view vm, bool fresh) {
  StdinSpool s;
  s.path_ = vm_path(state_dir, vm, kStdinSpoolFile);
  // The first monitor creates (truncates) it; a replacement finds it or nothing.
  auto f = open_vm_file(state_dir, vm, kStdinSpoolFile, O_RDWR | O_CLOEXEC | (fresh ? O_CREAT | O_TRUNC : 0));
  if (!f) return Error{fmt::format("{}: {}", s.path_.string(), f.error().message)};
  s.fd_ = std::move(*f);
  struct stat st {};
  if (::fstat(s.fd_.get(), &st) != 0) return Error{fmt::format("{}: stat: {}", s.path_.string(), std::strerror(errno))};
  s.size_ = static_cast<std::uint64_t>(st.st_size);
  if (fresh) {
    // Probe, on the empty file only (a hole punched in a kept byte would zero it): a filesystem
    // that cannot punch holes would let the file grow with all stdin ever sent.
    if (::fallocate(s.fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 1) != 0 && errno == EOPNOTSUPP)
      return Error{fmt::format("{}: its filesystem cannot punch holes (fallocate: {}): the spool could not be bounded",
                               s.path_.string(), std::strerror(errno))};
  } else if (s.size_ > 0) {
    // What an earlier monitor punched: the first byte with data (holes are whole kPunchStep steps).
    off_t d = ::lseek(s.fd_.get(), 0, SEEK_DATA);
    s.held_from_ = d < 0 ? s.size_ : static_cast<std::uint64_t>(d);
  }
  return s;
}

Result<StdinSpool::Take> StdinSpool::take(int fifo, std::size_t max) {
  loff_t off = static_cast<loff_t>(size_);
  ssize_t n;
  do n = ::splice(fifo, nullptr, fd_.get(), &off, max, SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN) return Take{};
    return Error{fmt::format("{}: splice from the stdin FIFO: {}", path_.string(), std::strerror(errno))};
  }
  if (n == 0) return Take{0, true, {}};
  size_ += static_cast<std::uint64_t>(n);
  // Punch whole steps that fell more than kKeep behind the end.
  if (size_ > kKeep) {
    const std::uint64_t upto = (size_ - kKeep) / kPunchStep * kPunchStep;
    if (upto > held_from_) {
      if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(held_from_),
                      static_cast<off_t>(upto - held_from_)) != 0) {
        // The bytes are in the file already: they go on; the file grows, said once.
        if (!punch_failed_) {
          punch_failed_ = true;
          return Take{static_cast<std::size_t>(n), false,
                      fmt::format("{}: punching bytes {}..{}: {} (the spool grows from here)", path_.string(),
                                  held_from_, upto, std::strerror(errno))};
        }
      } else {
        held_from_ = upto;
      }
    }
  }
  return Take{static_cast<std::size_t>(n), false, {}};
}

Result<std::size_t> StdinSpool::read_at(std::uint64_t offset, char* buf, std::size_t n) const {
  ssize_t r;
  do r = ::pread(fd_.get(), buf, n, static_cast<off_t>(offset));
  while (r < 0 && errno == EINTR);
  if (r < 0) return Error{fmt::format("{}: read at {}: {}", path_.string(), offset, std::strerror(errno))};
  return static_cast<std::size_t>(r);
}

}  // namespace nes::host
