// FdWriter's last flush (host/cli/stdio.hpp), `neshost run`'s final writes of the workload's
// output, against a real pipe: a reader that takes its bytes slowly, in steps, and stops for
// longer than any old deadline still gets every byte; a signal (a signalfd, as `run` passes)
// ends the wait with the exact count of what was left; a reader that goes away ends it too.
// Nothing here sleeps to order events: the reader's pauses are its slowness, and every hand-over
// between the threads is a future or the pipe itself.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "host/cli/stdio.hpp"
#include "host/lib/base.hpp"

using namespace nes;
using namespace std::chrono_literals;

namespace {

/// A pipe whose write end is non-blocking (as make_own_nonblocking leaves `run`'s stdout) and
/// small (4 KiB), so the writer's queue holds almost everything.
struct Pipe {
  host::Fd r, w;
  Pipe() {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    r.reset(p[0]);
    w.reset(p[1]);
    ::fcntl(w.get(), F_SETPIPE_SZ, 4096);
    ::fcntl(w.get(), F_SETFL, ::fcntl(w.get(), F_GETFL) | O_NONBLOCK);
  }
  std::size_t unread() const {
    int n = 0;
    ::ioctl(r.get(), FIONREAD, &n);
    return static_cast<std::size_t>(n);
  }
};

std::string pattern(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + i / 4096) % 26);
  return s;
}

/// Reads up to `n` bytes from `fd` (blocking), appended to `into`; false at EOF or an error.
bool read_some(int fd, std::string& into, std::size_t n) {
  char buf[4096];
  ssize_t k;
  do k = ::read(fd, buf, std::min(n, sizeof buf)); while (k < 0 && errno == EINTR);
  if (k <= 0) return false;
  into.append(buf, static_cast<std::size_t>(k));
  return true;
}

/// SIGINT and SIGTERM blocked in this thread (and the threads it starts), read from a signalfd:
/// as `neshost run` holds them for its last writes. Unblocked again when it goes.
struct StopSignals {
  sigset_t set{}, old{};
  host::Fd fd;
  StopSignals() {
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    ::pthread_sigmask(SIG_BLOCK, &set, &old);
    fd.reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    REQUIRE(fd);
  }
  ~StopSignals() {
    signalfd_siginfo si;
    while (::read(fd.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    }
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
};

/// An FdWriter on a Pipe with `n` bytes of a pattern queued (the pipe takes at most 4 KiB of
/// them), SIGINT/SIGTERM on a signalfd: `neshost run` at its last writes.
struct Rig {
  boost::asio::io_context io;
  Pipe p;
  StopSignals stop;
  std::string all;
  std::unique_ptr<cli::FdWriter> w;
  explicit Rig(std::size_t n)
      : all(pattern(n)), w(std::make_unique<cli::FdWriter>(io, p.w.get(), cli::kOutputQueueCap)) {
    w->write(all);
  }
  cli::FdWriter::Flushed flush() { return w->flush(stop.fd.get()); }
  /// The writer (its own duplicate of the write end too) and our write end closed: EOF for the
  /// reader once it has taken everything.
  void close_writer() {
    w.reset();
    p.w.reset();
  }
};

}  // namespace

TEST_CASE("flush waits for a slow reader, however long it stops between reads: every byte, in order") {
  Rig r(256u << 10);
  REQUIRE(r.w->queued() > 0);
  // A throttled reader, as `| python3 slow_reader.py` or a pager: 4 KiB per step, a step every
  // 2 ms, and once a stop of 3 s (`sleep 3` between reads: longer than the 2 s the last flush
  // used to give a reader that took nothing before it dropped the rest).
  std::string got;
  std::thread reader([&] {
    for (int step = 0; read_some(r.p.r.get(), got, 4096); ++step)
      std::this_thread::sleep_for(step == 8 ? 3000ms : 2ms);
  });
  auto f = r.flush();
  r.close_writer();
  reader.join();
  CHECK(f.left == 0);
  CHECK(!f.interrupted);
  CHECK(!f.broken);
  CHECK(got.size() == r.all.size());
  CHECK(got == r.all);
}

TEST_CASE("flush ends on a signal while the reader takes nothing: the bytes left are counted exactly") {
  Rig r(200u << 10);
  // The reader takes 40 KiB in steps, then stops reading and sends SIGINT (a user giving up on a
  // paused pager); it reads the rest only once the writer has counted what it left.
  std::string got;
  std::promise<void> counted;
  std::thread reader([&, done = counted.get_future()]() mutable {
    while (got.size() < (40u << 10) && read_some(r.p.r.get(), got, (40u << 10) - got.size())) {
    }
    ::kill(::getpid(), SIGINT);
    done.wait();
    while (read_some(r.p.r.get(), got, 4096)) {
    }
  });
  auto f = r.flush();
  const std::size_t in_pipe = r.p.unread();  // written, not read yet: not lost
  const std::size_t still_queued = r.w->queued();
  r.close_writer();
  counted.set_value();
  reader.join();
  CHECK(f.interrupted);
  CHECK(!f.broken);
  CHECK(f.left > 0);
  CHECK(f.left == r.all.size() - (40u << 10) - in_pipe);
  CHECK(got.size() + f.left == r.all.size());
  CHECK(got == r.all.substr(0, got.size()));
  CHECK(still_queued == 0);
}

TEST_CASE("flush ends when the reader goes away (EPIPE): what is left is counted, not an interruption") {
  ::signal(SIGPIPE, SIG_IGN);  // as `neshost run`
  Rig r(64u << 10);
  std::string got;
  std::thread reader([&] {
    read_some(r.p.r.get(), got, 1000);
    r.p.r.reset();  // `| head -c 1000`: the reader is gone
  });
  auto f = r.flush();
  reader.join();
  CHECK(f.broken);
  CHECK(!f.interrupted);
  CHECK(f.left > 0);
  CHECK(f.left < r.all.size());
}

TEST_CASE("a limit the caller gives (neshost run after --timeout) ends the flush too, the count exact") {
  Rig r(128u << 10);
  auto f = r.w->flush(r.stop.fd.get(), 100ms);  // the reader takes nothing at all
  CHECK(f.interrupted);
  CHECK(!f.broken);
  CHECK(f.left == r.all.size() - r.p.unread());
}
