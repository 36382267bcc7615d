// host_bench: P5 of bench/ (no assertions on time; scripts/bench.sh runs it). Prints Markdown rows.
//   host_bench [N]           sessions/s at N concurrent guests with and without durable records
//                            (median of 5 alternating rounds), next to the raw fsync rate of the
//                            same directory; host memory per registered VM and per live session
//   host_bench guests DIR N MODE   (internal) the fake guests, in their own process so the host's
//                            RSS is the host's alone. MODE: exit | hold
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <algorithm>
#include <cstdio>
#include <vector>

#include "tests/host/support.hpp"

extern char** environ;

using namespace nes;
using namespace nes::host;
using namespace nes::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

int guests_main(const std::string& dir, int n, const std::string& mode) {
  raise_nofile();
  asio::io_context io;
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    auto log = std::make_shared<GuestLog>();
    std::vector<Step> script = {step::Send{ready_line()}, step::Expect{"boot"}};
    if (mode == "exit") {
      script.push_back(step::Send{exited_line(i % 256)});
      script.push_back(step::Expect{"shutdown"});
    } else {
      script.push_back(step::Expect{"shutdown"});
    }
    asio::co_spawn(io, guest_at(fmt::format("{}/vm{:04}.sock", dir, i), std::move(script), log),
                   [&failed, log](std::exception_ptr) { failed += !log->error.empty(); });
  }
  io.run();
  return failed ? 1 : 0;
}

struct GuestProc {
  pid_t pid = -1;
  GuestProc(const std::string& self, const std::string& dir, int n, const std::string& mode) {
    std::vector<std::string> a = {self, "guests", dir, std::to_string(n), mode};
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) pid = -1;
  }
  int wait() {
    int st = 0;
    if (pid > 0 && ::waitpid(pid, &st, 0) == pid) pid = -1;
    return st;
  }
  ~GuestProc() {
    if (pid > 0) { ::kill(pid, SIGKILL); wait(); }
  }
};

struct Run {
  double seconds = 0;
  int records = 0;
  long rss_kib_live = 0;        // RSS growth with n booted sessions (vs. before the Host)
  long rss_kib_registered = 0;  // RSS growth with n VMs registered and listening
};

Run serve_n(const std::string& self, int n, bool sync, bool hold) {
  long rss_start = rss_kib();
  int booted = 0;
  Harness* hp = nullptr;
  Harness h([&](HostOptions& o) {
    o.write.sync = sync;
    // Count instead of keeping every event; the VMM "exits" once its guest's channel is gone.
    o.on_event = [&](const Event& e) {
      booted += e.kind == "boot_sent";
      if (e.kind == "disconnected")
        asio::post(hp->io, [hp, vm = e.vm] { (void)hp->host->vm_exited(vm); });
    };
  });
  hp = &h;
  for (int i = 0; i < n; ++i) h.add(h.config(fmt::format("vm{:04}", i)));
  long rss_listening = rss_kib();
  auto t0 = Clock::now();
  GuestProc g(self, (h.tmp.path / "sock").string(), n, hold ? "hold" : "exit");
  Run r;
  if (hold) {
    h.run_until([&] { return booted == n; }, 120s);
    r.rss_kib_registered = rss_listening - rss_start;
    r.rss_kib_live = rss_kib() - rss_start;
    for (int i = 0; i < n; ++i) (void)h.host->shutdown(fmt::format("vm{:04}", i));
  }
  h.run_until([&] { return h.host->live_sessions() == 0; }, 300s);
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  g.wait();
  for (int i = 0; i < n; ++i) r.records += h.record(fmt::format("vm{:04}", i)).has_value();
  return r;
}

double fsync_rate(const fs::path& dir, int n, bool with_dir) {
  auto f = dir / "fsync-probe";
  int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  std::string rec(240, 'x');
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    (void)::pwrite(fd, rec.data(), rec.size(), 0);
    ::fsync(fd);
    if (with_dir) ::fsync(dfd);
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(fd);
  ::close(dfd);
  return n / s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 5 && std::string_view(argv[1]) == "guests") return guests_main(argv[2], std::atoi(argv[3]), argv[4]);
  int n = argc > 1 ? std::atoi(argv[1]) : 1000;
  raise_nofile();
  std::string self = fs::canonical("/proc/self/exe").string();
  // Memory first, in a fresh heap (freed memory of earlier runs would hide the growth).
  auto hold = serve_n(self, n, true, true);
  std::vector<double> dur, nos, ratio;
  int lost = 0;
  constexpr int kRounds = 5;
  for (int round = 0; round < kRounds; ++round) {
    // Alternate which one goes first: the disk's state after one run must not favour the other.
    bool first_sync = round % 2 == 0;
    auto a = serve_n(self, n, first_sync, false);
    auto b = serve_n(self, n, !first_sync, false);
    auto& durable = first_sync ? a : b;
    auto& nosync = first_sync ? b : a;
    dur.push_back(n / durable.seconds);
    nos.push_back(n / nosync.seconds);
    ratio.push_back(dur.back() / nos.back());
    lost += (n - durable.records) + (n - nosync.records);
  }
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  TempDir t;
  double raw = fsync_rate(t.path, 2000, true);
  fmt::print("| P5 host, {} concurrent guests, durable records (records lost: {}) | sessions/s | {:.0f} "
             "| raw write+fsync+fsync-dir, same dir | {:.0f} | {:.2f} |\n",
             n, lost, med(dur), raw, med(dur) / raw);
  fmt::print("| P5 host, {} concurrent guests, durable records (median of {} alternating rounds; "
             "per-round ratio {:.2f}-{:.2f}) | sessions/s | {:.0f} | same, without fsync | {:.0f} | {:.2f} |\n",
             n, kRounds, *std::min_element(ratio.begin(), ratio.end()),
             *std::max_element(ratio.begin(), ratio.end()), med(dur), med(nos), med(dur) / med(nos));
  fmt::print("| P5 host memory per live booted session (RSS growth / {}) | KiB | {:.1f} "
             "| per registered, listening VM | {:.1f} | {:.2f} |\n",
             n, double(hold.rss_kib_live) / n, double(hold.rss_kib_registered) / n,
             double(hold.rss_kib_live) / std::max(1L, hold.rss_kib_registered));
  return lost == 0 ? 0 : 1;
}
