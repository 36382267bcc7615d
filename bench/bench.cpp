// bench: nesinit measured side by side with tini, catatonit and dumb-init (Debian's), every figure
// a ratio against a peer run in the same invocation, contenders alternating, medians of repeats.
// Usage: bench [--iterations N] [--storm N] [--out FILE] [--p1-only]   (needs root: unshare --pid)
// Env: NESINIT_BIN (the static init), NES_STORM_BIN (bench/storm); optional NESINIT_BASE: a second
// build of the init (say, main's before a change) that joins P1's rotation as one more contender,
// so a change is measured against what it replaces in the same invocation. Prints a Markdown table.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "protocol/protocol.hpp"

extern char** environ;
namespace fs = std::filesystem;
namespace proto = nes::proto;

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

/// An owned file descriptor.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept { reset(); fd = std::exchange(o.fd, -1); return *this; }
  ~Fd() { reset(); }
  void reset() { if (fd >= 0) ::close(fd); fd = -1; }
};

/// A spawned process, killed (SIGKILL) and reaped if still running when it goes out of scope.
struct Proc {
  pid_t pid = -1;
  int status = 0;
  Proc() = default;
  Proc(Proc&& o) noexcept : pid(std::exchange(o.pid, -1)), status(o.status) {}
  ~Proc() {
    if (pid > 0) { ::kill(pid, SIGKILL); while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {} }
  }
  /// Wait (bounded by `limit_ms`, then SIGKILL) and return the wait status. Woken by a pidfd
  /// (poll(2)) the moment the process ends, so sub-millisecond cycles are measured without a
  /// polling interval's granularity; falls back to a 0.2 ms poll where pidfd_open is missing.
  int wait(int limit_ms = 60000) {
    auto t = Clock::now();
    int pfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    while (true) {
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) { pid = -1; if (pfd >= 0) ::close(pfd); return status; }
      if (ms_since(t) > limit_ms) { ::kill(pid, SIGKILL); }
      if (pfd >= 0) {
        pollfd p{pfd, POLLIN, 0};
        ::poll(&p, 1, 100);
      } else {
        struct timespec ts{0, 200000};  // 0.2 ms poll of a child we own: bench only, not a test
        nanosleep(&ts, nullptr);
      }
    }
  }
};

/// posix_spawn argv; stdout/stderr to `out_fd` (or /dev/null when -1).
Proc spawn(const std::vector<std::string>& args, int out_fd = -1) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (out_fd >= 0) {
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
  } else {
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  }
  Proc p;
  int rc = posix_spawnp(&p.pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error(fmt::format("spawn {}: {}", args[0], std::strerror(rc)));
  return p;
}

/// Run to completion, return everything it wrote on stdout+stderr (bounded to 1 MiB).
std::string run_capture(const std::vector<std::string>& args) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  Fd r(p[0]), w(p[1]);
  Proc pr = spawn(args, w.fd);
  w.reset();
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(r.fd, buf, sizeof buf)) > 0 && out.size() < (1u << 20)) out.append(buf, n);
  pr.wait();
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

const std::vector<std::string> kNs = {"unshare", "--pid", "--fork", "--mount-proc"};

std::vector<std::string> ns(std::vector<std::string> rest) {
  std::vector<std::string> v = kNs;
  v.insert(v.end(), rest.begin(), rest.end());
  return v;
}

/// One peer init: how to run ARGV under it as PID 1 of a fresh pid namespace.
struct Peer {
  std::string name;
  std::string bin;
  std::function<std::vector<std::string>(const std::vector<std::string>&)> cmd;
};

std::vector<Peer> peers() {
  std::vector<Peer> v;
  auto add = [&](std::string name, std::string bin, std::vector<std::string> pre) {
    if (access(bin.c_str(), X_OK) != 0) return;
    v.push_back({name, bin, [bin, pre](const std::vector<std::string>& a) {
                   std::vector<std::string> c = {bin};
                   c.insert(c.end(), pre.begin(), pre.end());
                   c.insert(c.end(), a.begin(), a.end());
                   return ns(c);
                 }});
  };
  add("tini-static", "/usr/bin/tini-static", {"-s", "--"});
  add("catatonit", "/usr/bin/catatonit", {"--"});
  add("dumb-init", "/usr/bin/dumb-init", {});
  return v;
}

/// A scripted host for nesinit over a Unix socket: one full session per call.
struct NesRun {
  double total_ms = 0;     // spawn -> namespace init reaped
  double protocol_ms = 0;  // accept -> workload_exited -> shutdown (the ack) written
  // The cycle's phases as the host sees them (ms): spawn -> accept (the init's start-up and dial),
  // accept -> ready read, boot written -> started read (mounts, spawn, exec), started ->
  // workload_exited read (the workload runs, is reaped, reported), the ack written -> the
  // namespace's init reaped (ordered shutdown, the pid namespace's end).
  double dial_ms = 0, ready_ms = 0, start_ms = 0, exit_ms = 0, shutdown_ms = 0;
  std::string output;      // what the namespace wrote on stdout/stderr
  std::optional<proto::WorkloadExited> exited;
};

std::string read_line(int fd, std::string& buf, int timeout_ms) {
  auto t = Clock::now();
  while (true) {
    auto nl = buf.find('\n');
    if (nl != std::string::npos) {
      std::string l = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      return l;
    }
    int left = timeout_ms - static_cast<int>(ms_since(t));
    if (left <= 0) throw std::runtime_error("timed out waiting for a line from nesinit");
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    char b[4096];
    ssize_t n = read(fd, b, sizeof b);
    if (n <= 0) throw std::runtime_error("channel closed before the expected line");
    buf.append(b, n);
  }
}

/// A listening Unix socket at `path` (replaced if present).
Fd listen_unix(const fs::path& path) {
  fs::remove(path);
  Fd l(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  if (bind(l.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l.fd, 1) != 0)
    throw std::runtime_error("bind/listen " + path.string());
  return l;
}

/// One full session of nesinit as PID 1 of a fresh pid namespace. `stdio`: the descriptor asks
/// for the workload's stdout/stderr on the data channel (as `neshost run` without -i: stdin is
/// /dev/null), which the host reads to both eofs and then closes, the receipt the init waits for
/// before its power-off; otherwise the workload inherits the init's fds.
NesRun nesinit_cycle(const std::string& init, const fs::path& dir,
                     const std::vector<std::string>& argv, bool capture, bool stdio = false) {
  NesRun r;
  fs::path sock = dir / "ch.sock", dsock = dir / "data.sock";
  Fd l = listen_unix(sock);
  Fd dl;
  if (stdio) dl = listen_unix(dsock);
  int p[2] = {-1, -1};
  if (capture && pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  Fd pr(p[0]), pw(p[1]);
  std::vector<std::string> cmd = {init, "--channel=unix:" + sock.string(), "--log=quiet"};
  if (stdio) cmd.push_back("--data-channel=unix:" + dsock.string());
  auto t0 = Clock::now();
  Proc proc = spawn(ns(cmd), pw.fd);
  pw.reset();
  pollfd pf{l.fd, POLLIN, 0};
  if (poll(&pf, 1, 10000) != 1) throw std::runtime_error("nesinit did not dial in");
  Fd c(accept4(l.fd, nullptr, nullptr, SOCK_CLOEXEC));
  auto ta = Clock::now();
  r.dial_ms = std::chrono::duration<double, std::milli>(ta - t0).count();
  std::string buf;
  auto ready = proto::decode_guest(read_line(c.fd, buf, 10000));
  r.ready_ms = ms_since(ta);
  if (!std::holds_alternative<proto::GuestMessage>(ready)) throw std::runtime_error("bad ready");
  proto::Boot b;
  b.exec.argv = argv;
  b.exec.env = {{"PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}};
  b.on_exit.terminal = true;
  if (stdio) b.stdio = proto::Stdio{};
  std::string line = proto::encode_line(proto::HostMessage{b});
  if (write(c.fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    throw std::runtime_error("write boot");
  auto tb = Clock::now(), ts = tb;
  Fd dc;  // the data channel, closed by us once both output streams are at eof
  proto::FrameDecoder dec(proto::FrameRules{});
  bool data_done = !stdio;
  while (!r.exited || !data_done) {
    if (ms_since(tb) > 60000) throw std::runtime_error("no workload_exited or data eofs within 60 s");
    if (buf.find('\n') == std::string::npos || r.exited) {
      pollfd pf2[2] = {{r.exited ? -1 : c.fd, POLLIN, 0}, {dc.fd >= 0 ? dc.fd : dl.fd, POLLIN, 0}};
      if (::poll(pf2, data_done ? 1 : 2, 1000) <= 0) continue;
      if (pf2[1].revents && !data_done) {
        if (dc.fd < 0) {
          dc = Fd(accept4(dl.fd, nullptr, nullptr, SOCK_CLOEXEC));
        } else {
          char db[65536];
          ssize_t n = ::read(dc.fd, db, sizeof db);
          if (n <= 0) throw std::runtime_error("data channel closed before both eofs");
          std::string_view in(db, static_cast<std::size_t>(n));
          while (dec.next(in)) {
          }
          if (dec.failed()) throw std::runtime_error("data channel: " + dec.error());
          if (dec.at_eof(proto::Stream::out) && dec.at_eof(proto::Stream::err)) {
            dc.reset();  // the receipt
            data_done = true;
          }
        }
      }
      if (!(pf2[0].revents & (POLLIN | POLLHUP))) continue;
    }
    auto d = proto::decode_guest(read_line(c.fd, buf, 60000));
    if (auto* m = std::get_if<proto::GuestMessage>(&d)) {
      if (std::holds_alternative<proto::Started>(*m)) {
        ts = Clock::now();
        r.start_ms = std::chrono::duration<double, std::milli>(ts - tb).count();
      }
      if (auto* e = std::get_if<proto::WorkloadExited>(m)) r.exited = *e;
      if (auto* f = std::get_if<proto::StartFailed>(m)) throw std::runtime_error("start_failed: " + f->reason);
    }
  }
  line = proto::encode_line(proto::HostMessage{proto::Shutdown{}});
  r.exit_ms = ms_since(ts);
  if (write(c.fd, line.data(), line.size()) < 0) throw std::runtime_error("write shutdown");
  auto tk = Clock::now();
  r.protocol_ms = std::chrono::duration<double, std::milli>(tk - ta).count();
  if (capture) {
    char b2[4096];
    ssize_t n;
    while ((n = read(pr.fd, b2, sizeof b2)) > 0 && r.output.size() < (1u << 20)) r.output.append(b2, n);
  }
  proc.wait();
  r.shutdown_ms = ms_since(tk);
  r.total_ms = ms_since(t0);
  return r;
}

double timed(const std::vector<std::string>& cmd) {
  auto t = Clock::now();
  Proc p = spawn(cmd);
  p.wait();
  return ms_since(t);
}

std::string grep_value(const std::string& text, const std::string& key) {
  auto i = text.find(key);
  if (i == std::string::npos) return {};
  auto e = text.find('\n', i);
  return text.substr(i + key.size(), e == std::string::npos ? std::string::npos : e - i - key.size());
}

double kib_of(const std::string& vmrss) { return std::atof(vmrss.c_str()); }

struct Row {
  std::string figure, unit;
  double nes;
  std::vector<std::pair<std::string, double>> peers;
};

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string fmt_num(double v) { return v >= 100 ? fmt::format("{:.0f}", v) : fmt::format("{:.3g}", v); }

}  // namespace

int main(int argc, char** argv) {
  int iterations = 200, storm = 10000;
  bool p1_only = false;
  std::string out = "bench/results/latest.md";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* f) {
      if (i + 1 >= argc) { fmt::print(stderr, "bench: {} needs a value\n", f); std::exit(2); }
      return std::string(argv[++i]);
    };
    if (a == "--iterations") iterations = std::atoi(val("--iterations").c_str());
    else if (a == "--storm") storm = std::atoi(val("--storm").c_str());
    else if (a == "--out") out = val("--out");
    else if (a == "--p1-only") p1_only = true;
    else { fmt::print(stderr, "usage: bench [--iterations N] [--storm N] [--out FILE] [--p1-only]\n"); return 2; }
  }
  const char* init_env = std::getenv("NESINIT_BIN");
  const char* storm_env = std::getenv("NES_STORM_BIN");
  if (!init_env || !storm_env) { fmt::print(stderr, "bench: set NESINIT_BIN and NES_STORM_BIN\n"); return 2; }
  std::string init = fs::absolute(init_env).string(), storm_bin = fs::absolute(storm_env).string();
  const char* base_env = std::getenv("NESINIT_BASE");
  const std::string base = base_env && *base_env ? fs::absolute(base_env).string() : std::string();
  char tmpl[] = "/tmp/nesbench.XXXXXX";
  if (!mkdtemp(tmpl)) { fmt::print(stderr, "bench: mkdtemp failed\n"); return 1; }
  fs::path dir = tmpl;
  struct Cleanup { fs::path d; ~Cleanup() { std::error_code ec; fs::remove_all(d, ec); } } cleanup{dir};
  auto ps = peers();
  std::vector<Row> rows;

  try {
    // P1: full cycle of /bin/true, contenders alternating (rotation), medians.
    std::map<std::string, std::vector<double>> t;
    auto cycle = [&](const std::string& who, const std::string& bin, bool stdio = false) {
      auto r = nesinit_cycle(bin, dir, {"/bin/true"}, false, stdio);
      if (!r.exited || r.exited->exit_code != 0) throw std::runtime_error("true did not exit 0");
      t[who].push_back(r.total_ms);
      t[who + " protocol share"].push_back(r.protocol_ms);
      t[who + " dial"].push_back(r.dial_ms);
      t[who + " ready"].push_back(r.ready_ms);
      t[who + " start"].push_back(r.start_ms);
      t[who + " exit"].push_back(r.exit_ms);
      t[who + " shutdown"].push_back(r.shutdown_ms);
    };
    const int extra = base.empty() ? 0 : 1;
    for (int i = 0; i < iterations; ++i) {
      int k = static_cast<int>(ps.size()) + 3 + extra;
      for (int j = 0; j < k; ++j) {
        int which = (i + j) % k;
        if (which == 0) {
          cycle("nesinit", init);
        } else if (which == k - 1) {
          cycle("stdio", init, true);
        } else if (which == 1) {
          t["bare"].push_back(timed(ns({"/bin/true"})));
        } else if (which - 2 < static_cast<int>(ps.size())) {
          auto& p = ps[which - 2];
          t[p.name].push_back(timed(p.cmd({"/bin/true"})));
        } else {
          cycle("base", base);
        }
      }
    }
    // How steady a ratio is within this run: the iterations cut into 5 consecutive fifths, the
    // ratio of the medians in each; "lo-hi" over the fifths (a figure that moves between
    // machines shows it here first).
    auto fifths = [&](const std::string& a, const std::string& b) {
      const auto& x = t[a];
      const auto& y = t[b];
      const std::size_t n = std::min(x.size(), y.size());
      std::vector<double> r;
      for (std::size_t k = 0; k < 5 && n >= 5; ++k) {
        std::vector<double> xa(x.begin() + k * n / 5, x.begin() + (k + 1) * n / 5);
        std::vector<double> yb(y.begin() + k * n / 5, y.begin() + (k + 1) * n / 5);
        const double d = median(yb);
        if (d > 0) r.push_back(median(xa) / d);
      }
      if (r.empty()) return std::string("-");
      auto [lo, hi] = std::minmax_element(r.begin(), r.end());
      return fmt::format("{:.2f}-{:.2f}", *lo, *hi);
    };
    Row p1{"P1 full cycle `/bin/true` (median of " + std::to_string(iterations) + "; each peer's ratio per fifth of the run)",
           "ms", median(t["nesinit"]), {}};
    p1.peers.push_back({fmt::format("bare ns (floor; {})", fifths("nesinit", "bare")), median(t["bare"])});
    for (auto& p : ps) p1.peers.push_back({fmt::format("{} ({})", p.name, fifths("nesinit", p.name)), median(t[p.name])});
    if (!base.empty())
      p1.peers.push_back({fmt::format("NESINIT_BASE ({}; {})", base, fifths("nesinit", "base")), median(t["base"])});
    rows.push_back(p1);
    rows.push_back({"P1 nesinit protocol share (accept → workload_exited → ack)", "ms",
                    median(t["nesinit protocol share"]), {{"nesinit full cycle", median(t["nesinit"])}}});
    // The same cycle with stdout/stderr on the data channel, as `neshost run` asks for them:
    // reported against the cycle without (the goal's row), and tini-static for scale.
    Row p1s{"P1 full cycle `/bin/true`, stdout/stderr on the data channel (boot.stdio, the host reads both eofs "
            "and closes it; median of " + std::to_string(iterations) + ")", "ms", median(t["stdio"]), {}};
    p1s.peers.push_back({"nesinit without stdio", median(t["nesinit"])});
    if (!ps.empty()) p1s.peers.push_back({ps[0].name, median(t[ps[0].name])});
    rows.push_back(p1s);
    // Where the cycle goes, phase by phase (medians; the base's in the same rotation).
    auto phases = [&](const std::string& who) {
      return fmt::format("spawn→accept {:.3f}, accept→ready {:.3f}, boot→started {:.3f}, "
                         "started→exited {:.3f}, ack→reaped {:.3f}",
                         median(t[who + " dial"]), median(t[who + " ready"]), median(t[who + " start"]),
                         median(t[who + " exit"]), median(t[who + " shutdown"]));
    };
    Row ph{"P1 nesinit phases, ms: " + phases("nesinit"), "ms", median(t["nesinit"]), {}};
    if (!base.empty()) ph.peers.push_back({"NESINIT_BASE phases: " + phases("base"), median(t["base"])});
    else ph.peers.push_back({"tini-static", ps.empty() ? 0.0 : median(t[ps[0].name])});
    rows.push_back(ph);
    if (!p1_only) {  // P2-P4

    // P2: stripped static size.
    fs::path stripped = dir / "nesinit.stripped";
    run_capture({"strip", "-o", stripped.string(), init});
    Row p2{"P2 stripped static binary", "KiB", fs::file_size(stripped) / 1024.0, {}};
    for (auto [n, b] : {std::pair{"tini-static", "/usr/bin/tini-static"}, {"catatonit", "/usr/bin/catatonit"}})
      if (fs::exists(b)) p2.peers.push_back({n, fs::file_size(b) / 1024.0});
    rows.push_back(p2);

    // P3: VmRSS of PID 1 while the workload runs (read by the workload from /proc/1/status).
    const std::vector<std::string> rss_cmd = {"/bin/sh", "-c", "grep VmRSS /proc/1/status"};
    std::map<std::string, std::vector<double>> rss;
    for (int i = 0; i < 5; ++i) {
      rss["nesinit"].push_back(kib_of(grep_value(nesinit_cycle(init, dir, rss_cmd, true).output, "VmRSS:")));
      for (auto& p : ps) rss[p.name].push_back(kib_of(grep_value(run_capture(p.cmd(rss_cmd)), "VmRSS:")));
    }
    Row p3{"P3 PID 1 VmRSS while the workload runs", "KiB", median(rss["nesinit"]), {}};
    for (auto& p : ps) p3.peers.push_back({p.name, median(rss[p.name])});
    rows.push_back(p3);

    // P4: reaping storm: N orphans by double fork; time until PID 1 reaped them all.
    std::map<std::string, std::vector<double>> st;
    std::map<std::string, int> left;
    const std::vector<std::string> storm_cmd = {storm_bin, std::to_string(storm)};
    auto parse = [&](const std::string& name, const std::string& o) {
      st[name].push_back(std::atof(grep_value(o, "reaped_ms=").c_str()));
      left[name] = std::max(left[name], std::atoi(grep_value(o, "zombies_left=").c_str()));
    };
    std::vector<std::string> order = {"nesinit"};
    for (auto& p : ps)
      if (p.name != "dumb-init") order.push_back(p.name);
    // The floor: a PID 1 that only blocks in wait(2) (bench/floor_init.cpp, beside the storm).
    const std::string floor_bin = (fs::path(storm_bin).parent_path() / "floor_init").string();
    const bool has_floor = access(floor_bin.c_str(), X_OK) == 0;
    if (has_floor) order.push_back("floor");
    // 5 rounds, each contender once per round, the order rotated every round: a load burst from
    // elsewhere on the machine then lands on each of them alike.
    constexpr int kStormRounds = 5;
    for (int i = 0; i < kStormRounds; ++i)
      for (std::size_t k = 0; k < order.size(); ++k) {
        const std::string& who = order[(k + i) % order.size()];
        if (who == "nesinit") {
          parse(who, nesinit_cycle(init, dir, storm_cmd, true).output);
        } else if (who == "floor") {
          std::vector<std::string> c = {floor_bin};
          c.insert(c.end(), storm_cmd.begin(), storm_cmd.end());
          parse(who, run_capture(ns(c)));
        } else {
          for (auto& p : ps)
            if (p.name == who) parse(who, run_capture(p.cmd(storm_cmd)));
        }
      }
    auto spread = [&](const std::string& who) {
      auto [lo, hi] = std::minmax_element(st[who].begin(), st[who].end());
      return fmt::format("{:.0f}-{:.0f}", *lo, *hi);
    };
    // The per-round ratio (each round ran every contender once, back to back): "lo-hi".
    auto per_round = [&](const std::string& who) {
      std::vector<double> r;
      for (std::size_t k = 0; k < st["nesinit"].size() && k < st[who].size(); ++k)
        if (st[who][k] > 0) r.push_back(st["nesinit"][k] / st[who][k]);
      if (r.empty()) return std::string("-");
      auto [lo, hi] = std::minmax_element(r.begin(), r.end());
      return fmt::format("{:.2f}-{:.2f}", *lo, *hi);
    };
    Row p4{fmt::format("P4 reaping storm, {} orphans (median of {}, rotated; nesinit {} ms, zombies left {})",
                       storm, kStormRounds, spread("nesinit"), left["nesinit"]),
           "ms", median(st["nesinit"]), {}};
    for (auto& p : ps)
      if (p.name != "dumb-init")
        p4.peers.push_back({fmt::format("{} ({} ms, left {}; per-round ratio {})", p.name, spread(p.name), left[p.name],
                                        per_round(p.name)),
                            median(st[p.name])});
    if (has_floor)
      p4.peers.push_back({fmt::format("floor: a PID 1 that only blocks in wait(2) ({} ms, left {}; per-round ratio {})",
                                      spread("floor"), left["floor"], per_round("floor")),
                          median(st["floor"])});
    rows.push_back(p4);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench: {}\n", e.what());
    return 1;
  }

  std::string table = "| figure | unit | nesinit | peer | peer value | nesinit / peer |\n|---|---|---|---|---|---|\n";
  for (auto& r : rows)
    for (auto& [pn, pv] : r.peers)
      table += fmt::format("| {} | {} | {} | {} | {} | {:.2f} |\n", r.figure, r.unit, fmt_num(r.nes), pn,
                           fmt_num(pv), pv > 0 ? r.nes / pv : 0.0);
  std::string head = fmt::format("# nesinit bench — {}\n\nmachine: {}, {} cores; commit {}\n\n",
                                 trim(run_capture({"date", "-u", "+%Y-%m-%dT%H:%M:%SZ"})),
                                 trim(run_capture({"uname", "-srm"})),
                                 sysconf(_SC_NPROCESSORS_ONLN),
                                 trim(run_capture({"git", "rev-parse", "--short", "HEAD"})));
  fmt::print("{}{}", head, table);
  if (!out.empty()) {
    fs::create_directories(fs::path(out).parent_path());
    std::ofstream(out) << head << table;
  }
  return 0;
}
