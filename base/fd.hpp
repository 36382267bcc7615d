// RAII owner of one file descriptor: the init's and the host's. Header-only, std and unistd only.
#pragma once

#include <unistd.h>

#include <utility>

namespace nes::base {

/// Owns one fd, closed (close(2), its error ignored) on destruction and on reset. -1 = none (any
/// negative value owns nothing and is never closed). Move-only: a moved-from Fd owns none.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) { reset(); fd_ = std::exchange(o.fd_, -1); }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  /// The owned fd, still owned; negative (-1) when none.
  int get() const { return fd_; }
  /// Whether an fd is owned (>= 0).
  explicit operator bool() const { return fd_ >= 0; }
  /// Give up ownership: returns the fd (negative when none), which the caller now closes; owns -1.
  int release() { return std::exchange(fd_, -1); }
  /// Close the owned fd (if any), then own `fd` (-1: none).
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace nes::base
