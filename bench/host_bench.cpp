// host_bench: P5. Sessions/s for N concurrent fake guests (one Unix endpoint each) against one
// Host, with durable records on the disk and with the state dir on tmpfs (fsync is free there:
// the same code without the disk's durability cost), next to the raw rate of the durable-write
// floor on the same directory (write + fsync + rename + fsync dir). Also host memory per session
// (VmRSS growth while all sessions are live / N). Prints Markdown rows.
// Usage: host_bench [--guests N] [--disk DIR] [--tmpfs DIR]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "tests/host/support.hpp"

using namespace nes;
using namespace nes::host;
using namespace nes::test;

namespace {

using Clock = std::chrono::steady_clock;
double secs_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

long vmrss_kib() {
  std::ifstream f("/proc/self/status");
  std::string l;
  while (std::getline(f, l))
    if (l.rfind("VmRSS:", 0) == 0) return std::atol(l.c_str() + 6);
  return 0;
}

struct Run {
  double sessions_per_s = 0;
  double kib_per_session = 0;
  int records = 0;
};

/// N guests: ready, boot, started, workload_exited{code}, wait for shutdown (the ack), close.
Run sessions(int n, const std::string& tmpdir) {
  setenv("TMPDIR", tmpdir.c_str(), 1);
  Harness h;
  std::vector<std::string> paths;
  long rss0 = vmrss_kib();
  for (int i = 0; i < n; ++i) {
    auto c = h.config(fmt::format("vm{:04}", i));
    c.descriptor.exec.argv = {"/bin/sh", "-c", fmt::format("exit {}", i % 256)};
    paths.push_back(h.add(c));
  }
  asio::io_context gio;
  std::atomic<int> errors{0};
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    auto log = std::make_shared<GuestLog>();
    auto id = fmt::format("vm{:04}", i);
    asio::co_spawn(gio,
                   guest_at(paths[i], {step::Send{ready_line()}, step::Expect{"boot"},
                                       step::Send{started_line(i + 2) + exited_line(i % 256)},
                                       step::Expect{"shutdown"}, step::Close{}},
                            log),
                   [&, log, id](std::exception_ptr) {
                     if (!log->error.empty()) ++errors;
                     asio::post(h.io, [&, id] { (void)h.host->vm_exited(id); });
                   });
  }
  std::thread guests([&] { gio.run(); });
  long peak = 0;
  bool ok = h.run_until([&] {
    peak = std::max(peak, vmrss_kib());
    return h.host->live_sessions() == 0;
  }, std::chrono::seconds(300));
  double el = secs_since(t0);
  guests.join();
  Run r;
  for (int i = 0; i < n; ++i) r.records += h.record(fmt::format("vm{:04}", i)) ? 1 : 0;
  if (!ok || errors) fmt::print(stderr, "host_bench: {} guest errors, finished={}\n", errors.load(), ok);
  r.sessions_per_s = n / el;
  r.kib_per_session = double(peak - rss0) / n;
  return r;
}

/// The floor: write + fsync + rename + fsync(dir) of a small file, `n` times, under `parent`.
double raw_fsync_per_s(const std::string& parent, int n) {
  setenv("TMPDIR", parent.c_str(), 1);
  TempDir d;
  int dfd = ::open(d.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  std::string body(300, 'x');  // about the size of an outcome record
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    auto tmp = d.path / fmt::format(".tmp{}", i);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || ::write(fd, body.data(), body.size()) < 0 || ::fsync(fd) != 0) return 0;
    ::close(fd);
    if (::rename(tmp.c_str(), (d.path / "outcome.json").c_str()) != 0 || ::fsync(dfd) != 0) return 0;
  }
  double r = n / secs_since(t0);
  ::close(dfd);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 1000;
  std::string disk = "/var/tmp", tmpfs = "/dev/shm";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) { fmt::print(stderr, "usage: host_bench [--guests N] [--disk DIR] [--tmpfs DIR]\n"); return 2; }
    if (a == "--guests") n = std::atoi(argv[++i]);
    else if (a == "--disk") disk = argv[++i];
    else if (a == "--tmpfs") tmpfs = argv[++i];
    else { fmt::print(stderr, "host_bench: unknown flag {}\n", a); return 2; }
  }
  if (raise_nofile() < 4 * n) { fmt::print(stderr, "host_bench: RLIMIT_NOFILE too low for {} guests\n", n); return 1; }
  // Alternate: disk, tmpfs, disk, tmpfs, disk, tmpfs; medians of three.
  std::vector<double> d, t, f, kib;
  int lost = 0;
  for (int k = 0; k < 3; ++k) {
    auto a = sessions(n, disk);
    auto b = sessions(n, tmpfs);
    d.push_back(a.sessions_per_s);
    t.push_back(b.sessions_per_s);
    kib.push_back(a.kib_per_session);
    lost += (n - a.records) + (n - b.records);
    f.push_back(raw_fsync_per_s(disk, n));
  }
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  fmt::print("| P5 host sessions/s, {} concurrent guests, durable records on disk (records lost: {}) | sessions/s | {:.0f} | raw write+fsync+rename+fsync-dir floor | {:.0f} | {:.2f} |\n",
             n, lost, med(d), med(f), med(d) / med(f));
  fmt::print("| P5 host sessions/s, {} concurrent guests, state on tmpfs (no disk cost) | sessions/s | {:.0f} | durable on disk | {:.0f} | {:.2f} |\n",
             n, med(t), med(d), med(t) / med(d));
  fmt::print("| P5 host memory per live session (VmRSS growth / {}) | KiB | {:.1f} | — | — | — |\n", n, med(kib));
  return lost == 0 ? 0 : 1;
}
