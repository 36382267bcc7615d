#include "host/cli/stdio.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <string>

namespace nes::cli {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

FdKind kind_of(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return FdKind::closed;
  if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) return FdKind::file;
  if (S_ISSOCK(st.st_mode)) return FdKind::socket;
  return FdKind::stream;  // pipe, FIFO, terminal, other character device
}

}  // namespace

FdKind make_own_nonblocking(int fd) {
  FdKind k = kind_of(fd);
  if (k != FdKind::stream) return k;
  int acc = ::fcntl(fd, F_GETFL);
  if (acc < 0) return FdKind::closed;
  int mode = (acc & O_ACCMODE) == O_RDONLY ? O_RDONLY : (acc & O_ACCMODE) == O_WRONLY ? O_WRONLY : O_RDWR;
  std::string proc = "/proc/self/fd/" + std::to_string(fd);
  int n = ::open(proc.c_str(), mode | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (n < 0) return k;  // e.g. no /proc: stays blocking (writes to it are then bounded by poll)
  ::dup2(n, fd);        // dup2 clears CLOEXEC on fd: it stays inheritable as before
  ::close(n);
  return k;
}

void put_bounded(int fd, std::string_view b, std::chrono::milliseconds bound) {
  auto end = std::chrono::steady_clock::now() + bound;
  while (!b.empty()) {
    ssize_t n = ::write(fd, b.data(), b.size());
    if (n > 0) {
      b.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(left.count()));
      continue;
    }
    return;  // EPIPE and friends
  }
}

// ---- FdWriter ----

FdWriter::FdWriter(asio::io_context& io, int fd, std::size_t cap)
    : fd_(fd), kind_(kind_of(fd)), cap_(cap) {
  if (kind_ == FdKind::closed) {
    broken_ = true;
    return;
  }
  if (kind_ == FdKind::file) return;
  int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (d < 0) return;
  error_code ec;
  waiter_.emplace(io);
  waiter_->assign(d, ec);
  if (ec) {  // not pollable (e.g. /dev/null): writes to it never wait
    ::close(d);
    waiter_.reset();
  }
}

ssize_t FdWriter::put(const char* p, std::size_t n) {
  if (kind_ == FdKind::socket) return ::send(fd_, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
  return ::write(fd_, p, n);
}

void FdWriter::write(std::string_view b) {
  if (broken_ || b.empty()) return;
  q_.emplace_back(b);
  queued_ += b.size();
  if (queued_ >= cap_) was_full_ = true;
  pump();
}

void FdWriter::written(std::size_t n) {
  if (on_written) on_written(n);
  front_off_ += n;
  queued_ -= n;
  if (front_off_ == q_.front().size()) {
    q_.pop_front();
    front_off_ = 0;
  }
}

bool FdWriter::write_now() {
  while (!q_.empty() && !broken_) {
    const std::string& f = q_.front();
    ssize_t n = put(f.data() + front_off_, f.size() - front_off_);
    if (n > 0) {
      written(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    broken_ = true;  // EPIPE (the reader is gone), EIO
  }
  return false;
}

void FdWriter::pump() {
  if (write_now()) {
    if (waiter_) {
      if (!waiting_) {
        waiting_ = true;
        waiter_->async_wait(asio::posix::stream_descriptor::wait_write, [this](error_code ec) {
          waiting_ = false;
          if (!ec) pump();
        });
      }
      return;
    }
    broken_ = true;  // EAGAIN on something we cannot wait for
  }
  if (broken_) {  // what is queued is discarded
    q_.clear();
    queued_ = 0;
    front_off_ = 0;
  }
  if (was_full_ && queued_ < cap_ / 2) {
    was_full_ = false;
    if (on_drained) on_drained();
  }
  if (queued_ == 0 && on_empty) on_empty();
}

namespace {
/// `fd` is a FIFO with a name (containerd's task FIFOs), not an anonymous pipe: only a named one
/// is waited on until drained. A caller that reads an anonymous pipe only after we exit
/// (`Popen(stdout=PIPE).wait()`, then read) would otherwise wait for us while we wait for it.
bool named_fifo(int fd) {
  char link[64];
  ssize_t n = ::readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), link, sizeof link - 1);
  return n > 0 && std::string_view(link, static_cast<std::size_t>(n)).substr(0, 5) != "pipe:";
}
}  // namespace

FdWriter::Flushed FdWriter::flush(int stop_fd, std::optional<std::chrono::milliseconds> limit) {
  if (waiter_) {
    error_code ec;
    waiter_->cancel(ec);  // from here on, synchronously
  }
  Flushed f;
  const auto end = std::chrono::steady_clock::now() + limit.value_or(std::chrono::milliseconds(0));
  // A named FIFO we hold open for reading too (containerd's shims pass one read-write, as their
  // runc shim keeps a read end): its reader's going away never breaks it, so a reader that takes
  // nothing for kFifoStall is taken for none (the bytes are said, not waited on forever). A
  // write-only fd keeps the rule below: no deadline of our own.
  struct stat fst {};
  const bool held_fifo = (::fcntl(fd_, F_GETFL) & O_ACCMODE) == O_RDWR && ::fstat(fd_, &fst) == 0 &&
                         S_ISFIFO(fst.st_mode) && named_fifo(fd_);
  std::size_t last_queued = queued_;
  auto last_progress = std::chrono::steady_clock::now();
  while (write_now()) {
    // No deadline of our own: the reader's going away (the write then fails), `stop_fd` or the
    // caller's `limit` ends this (and a held FIFO's stall, above).
    if (held_fifo) {
      const auto now = std::chrono::steady_clock::now();
      if (queued_ != last_queued) {
        last_queued = queued_;
        last_progress = now;
      } else if (now - last_progress >= kFifoStall) {
        f.broken = true;
        f.stalled = true;
        break;
      }
    }
    int wait_ms = held_fifo ? 100 : -1;
    if (limit) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        f.interrupted = true;
        break;
      }
      wait_ms = static_cast<int>(std::min<long long>(left.count(), held_fifo ? 100 : 1 << 30));
    }
    pollfd p[2] = {{fd_, POLLOUT, 0}, {stop_fd, POLLIN, 0}};
    int r = ::poll(p, stop_fd >= 0 ? 2 : 1, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (stop_fd >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      f.interrupted = true;
      break;
    }
  }
  // Written is not read: a pipe's reader may stop once we are gone (containerd's ctr cancels
  // its copy from the task's FIFO as soon as the task's exit is reported), and what is still in
  // the pipe dies with it. So a named FIFO is waited on until its reader took every byte
  // (FIONREAD 0), went away (POLLERR), `stop_fd` fires or `limit` passes. Nothing signals "drained": looked at
  // every 10 ms while the reader lives.
  struct stat st {};
  std::size_t unread_left = 0;  // in the pipe when its reader went away or we were stopped
  if (queued_ == 0 && !broken_ && !f.interrupted && ::fstat(fd_, &st) == 0 && S_ISFIFO(st.st_mode) &&
      named_fifo(fd_)) {
    // A held FIFO (above) never reports POLLERR: a reader that takes nothing for kFifoStall is
    // taken for none, and what is left stays in the FIFO for whoever opens it next (said by the
    // caller as not delivered, never waited on forever).
    int last_unread = -1;
    for (;;) {
      int unread = 0;
      if (::ioctl(fd_, FIONREAD, &unread) != 0 || unread <= 0) break;
      const auto now = std::chrono::steady_clock::now();
      if (unread != last_unread) {
        last_unread = unread;
        last_progress = now;
      } else if (held_fifo && now - last_progress >= kFifoStall) {
        unread_left = static_cast<std::size_t>(unread);
        f.broken = true;
        f.stalled = true;
        break;
      }
      pollfd p[2] = {{fd_, 0, 0}, {stop_fd, POLLIN, 0}};
      int r = ::poll(p, stop_fd >= 0 ? 2 : 1, 10);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) break;
      if (p[0].revents & (POLLERR | POLLHUP)) {
        unread_left = static_cast<std::size_t>(unread);
        f.broken = true;
        break;
      }
      if ((stop_fd >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) ||
          (limit && std::chrono::steady_clock::now() >= end)) {
        unread_left = static_cast<std::size_t>(unread);
        f.interrupted = true;
        break;
      }
    }
  }
  f.broken = f.broken || broken_;
  f.left = queued_ + unread_left;
  q_.clear();
  queued_ = 0;
  front_off_ = 0;
  return f;
}

// ---- StdinPump ----

StdinPump::StdinPump(asio::io_context& io, int fd, std::function<bool(std::string_view)> send,
                     std::function<void()> eof)
    : io_(io), fd_(fd), send_(std::move(send)), eof_(std::move(eof)) {
  if (kind_of(fd) == FdKind::stream || kind_of(fd) == FdKind::socket) {
    int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (d >= 0) {
      ::fcntl(d, F_SETFL, ::fcntl(d, F_GETFL) | O_NONBLOCK);  // fd was made our own (reopened)
      error_code ec;
      sd_.emplace(io);
      sd_->assign(d, ec);
      if (ec) {
        ::close(d);
        sd_.reset();
      }
    }
  }
}

void StdinPump::start() {
  if (started_) return;
  started_ = true;
  read_more();
}

void StdinPump::resume() {
  if (stopped_ || ended_ || held_.empty()) return;
  std::string c = std::move(held_);
  held_.clear();
  deliver(std::move(c));
}

void StdinPump::deliver(std::string chunk) {
  if (stopped_) return;
  if (!send_(chunk)) {
    held_ = std::move(chunk);  // resume() retries it
    return;
  }
  sent_ += chunk.size();
  read_more();
}

void StdinPump::read_more() {
  if (stopped_ || ended_ || reading_ || !held_.empty()) return;
  auto end = [this] { finish(); };
  if (spool_) return spool_more();
  if (sd_) {
    reading_ = true;
    buf_.resize(65536);
    sd_->async_read_some(asio::buffer(buf_), [this, end](error_code ec, std::size_t n) {
      reading_ = false;
      if (stopped_) return;
      if (n > 0) return deliver(buf_.substr(0, n));
      if (ec) end();
      else read_more();
    });
    return;
  }
  // A regular file or /dev/null: reads never wait; one chunk per turn of the loop.
  reading_ = true;
  asio::post(io_, [this, end] {
    reading_ = false;
    if (stopped_) return;
    char b[65536];
    ssize_t n;
    do n = ::read(fd_, b, sizeof b); while (n < 0 && errno == EINTR);
    if (n <= 0) return end();
    deliver(std::string(b, static_cast<std::size_t>(n)));
  });
}

void StdinPump::spool_more() {
  reading_ = true;
  auto fail = [this](std::string why) {
    if (say_) say_(why + " (the workload's stdin ends here)");
    finish();
  };
  if (sent_ < spool_->size()) {
    // Bytes taken from the FIFO and not yet sent: one chunk per turn of the loop.
    asio::post(io_, [this, fail] {
      reading_ = false;
      if (stopped_) return;
      buf_.resize(65536);
      const std::uint64_t want = std::min<std::uint64_t>(buf_.size(), spool_->size() - sent_);
      auto n = spool_->read_at(sent_, buf_.data(), static_cast<std::size_t>(want));
      if (!n) return fail(n.error().message);
      if (*n == 0) return fail(fmt::format("{} bytes of stdin.spool missing at byte {}", spool_->size() - sent_, sent_));
      deliver(buf_.substr(0, *n));
    });
    return;
  }
  auto t = spool_->take(sd_ ? sd_->native_handle() : fd_, 65536);
  if (!t) {
    reading_ = false;
    return fail(t.error().message);
  }
  if (!t->warning.empty() && say_) say_(t->warning);
  if (t->eof) {
    reading_ = false;
    return finish();
  }
  if (t->bytes > 0) {
    reading_ = false;
    return spool_more();  // sent_ < size() now: sends the chunk on the next turn
  }
  if (!sd_) {
    reading_ = false;
    return fail("stdin: not a FIFO the loop can wait on");
  }
  sd_->async_wait(asio::posix::stream_descriptor::wait_read, [this](error_code ec) {
    reading_ = false;
    if (stopped_) return;
    if (ec) return finish();
    read_more();
  });
}

void StdinPump::finish() {
  if (ended_) return;
  ended_ = true;
  if (eof_) eof_();
}

}  // namespace nes::cli
