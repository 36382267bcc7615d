// P6: workload stdout -> host log file throughput. The real init in sandbox mode (PID 1 of a fresh
// pid + mount namespace, Unix lifecycle and data channels) runs `head -c N /dev/zero`; the host
// library receives the frames and writes STATE/VM/workload.log (CRI format). Peer, in the same
// invocation, alternating: `head -c N /dev/zero > FILE` on the same file system. Medians of runs.
// A second row, in the same invocation and alternating too: the same run with data channel resume
// on (`reconnect` set: the replay ring, output copied instead of spliced, acks) against today's
// path (the first row's runs).
// Usage: stdio_bench [MiB] [runs]   (defaults 256, 3; needs root: unshare --pid). Env: NESINIT_BIN.
// Prints Markdown table rows (the header is bench.cpp's).
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <string>
#include <vector>

#include "host/lib/host.hpp"

extern char** environ;
namespace fs = std::filesystem;
namespace asio = boost::asio;
namespace host = nes::host;
namespace proto = nes::proto;
using Clock = std::chrono::steady_clock;

namespace {

pid_t spawn(const std::vector<std::string>& args, const char* out_path = nullptr) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path ? out_path : "/dev/null",
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  if (posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

int wait_pid(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return st;
}

double raw_run(const fs::path& dir, std::uint64_t bytes) {
  fs::path f = dir / "raw.out";
  auto t = Clock::now();
  pid_t p = spawn({"head", "-c", std::to_string(bytes), "/dev/zero"}, f.c_str());
  if (p < 0) throw std::runtime_error("spawn head");
  wait_pid(p);
  double s = std::chrono::duration<double>(Clock::now() - t).count();
  fs::remove(f);
  return s;
}

struct NesRun {
  double seconds = 0;
  std::uint64_t logged = 0;  // bytes of workload.log
  int exit_status = -1;
};

NesRun nesinit_run(const fs::path& dir, const std::string& init, std::uint64_t bytes, int n, bool resume = false) {
  asio::io_context io;
  std::string vm = fmt::format("p6-{}", n);
  host::HostOptions o;
  o.state_dir = dir / "state";
  o.workload_log.max_size = 4ull << 30;  // one file: the figure is the write path, not rotation
  pid_t child = -1;
  bool finished = false;
  o.hooks.destroy = [&](const std::string&, std::uint64_t) {
    if (child > 0) ::kill(child, SIGKILL);
  };
  o.on_event = [&](const host::Event& e) {
    if (e.kind == "finished") {
      finished = true;
      io.stop();
    }
  };
  host::Host h(io, o);
  host::SessionConfig c;
  c.vm = vm;
  c.descriptor.exec.argv = {"head", "-c", std::to_string(bytes), "/dev/zero"};
  c.descriptor.exec.env = {{"PATH", "/usr/bin:/bin"}};
  c.descriptor.stdio = proto::Stdio{};
  c.stop_timeout = std::chrono::seconds(30);
  if (resume) c.reconnect = std::chrono::seconds(30);  // the host then turns data channel resume on
  if (!h.add_vm(c)) throw std::runtime_error("add_vm");
  fs::path ctl = dir / (vm + ".sock"), data = dir / (vm + ".data");
  host::UnixListenOptions u;
  u.path = ctl.string();
  if (!h.listen_unix(vm, u)) throw std::runtime_error("listen");
  u.path = data.string();
  if (!h.listen_data_unix(vm, u)) throw std::runtime_error("listen data");
  auto t = Clock::now();
  child = spawn({"unshare", "--pid", "--fork", "--mount-proc", init, "--channel=unix:" + ctl.string(),
                 "--data-channel=unix:" + data.string(), "--log=quiet"});
  if (child < 0) throw std::runtime_error("spawn nesinit");
  (void)h.vm_started(vm);
  asio::posix::stream_descriptor exit_watch(io, static_cast<int>(::syscall(SYS_pidfd_open, child, 0)));
  exit_watch.async_wait(asio::posix::stream_descriptor::wait_read, [&](boost::system::error_code) {
    wait_pid(child);
    child = -1;
    (void)h.vm_exited(vm);
  });
  io.run();
  NesRun r;
  r.seconds = std::chrono::duration<double>(Clock::now() - t).count();
  if (child > 0) {
    ::kill(child, SIGKILL);
    wait_pid(child);
  }
  std::error_code ec;
  r.logged = fs::file_size(o.state_dir / vm / "workload.log", ec);
  if (auto* s = h.session(vm); s && s->outcome()) r.exit_status = s->outcome()->exit_status;
  (void)finished;
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  int runs = argc > 2 ? std::atoi(argv[2]) : 3;
  const char* init = std::getenv("NESINIT_BIN");
  if (!init) init = "build/nesinit/nesinit";
  const std::uint64_t bytes = mib << 20;
  std::string tmpl = (fs::temp_directory_path() / "p6-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) return 1;
  fs::path dir = tmpl;
  std::vector<double> raw, nes, res;
  std::uint64_t logged = 0, logged_res = 0;
  int status = -1, status_res = -1;
  try {
    for (int i = 0; i < runs; ++i) {
      raw.push_back(raw_run(dir, bytes));
      auto r = nesinit_run(dir, init, bytes, i);
      nes.push_back(r.seconds);
      logged = r.logged;
      status = r.exit_status;
      fs::remove_all(dir / "state");
      auto q = nesinit_run(dir, init, bytes, 1000 + i, true);
      res.push_back(q.seconds);
      logged_res = q.logged;
      status_res = q.exit_status;
      fs::remove_all(dir / "state");
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "stdio_bench: {}\n", e.what());
    fs::remove_all(dir);
    return 1;
  }
  fs::remove_all(dir);
  double raw_mbs = static_cast<double>(bytes) / (1 << 20) / median(raw);
  double nes_mbs = static_cast<double>(bytes) / (1 << 20) / median(nes);
  fmt::print("| P6 workload stdout -> host workload.log, {} MiB, sandbox, Unix data channel (median of {}; "
             "exit {}, log {} bytes) | MiB/s | {:.0f} | raw `head -c {}M /dev/zero > FILE` | {:.0f} | {:.2f} |\n",
             mib, runs, status, logged, nes_mbs, mib, raw_mbs, nes_mbs / raw_mbs);
  double res_mbs = static_cast<double>(bytes) / (1 << 20) / median(res);
  fmt::print("| P6 with data channel resume (replay ring 1 MiB per stream, output copied not spliced, acked "
             "from the log's positions), {} MiB, sandbox (median of {}, alternating with the row above; exit {}, "
             "log {} bytes) | MiB/s | {:.0f} | today's path (the row above) | {:.0f} | {:.2f} |\n",
             mib, runs, status_res, logged_res, res_mbs, nes_mbs, res_mbs / nes_mbs);
  return 0;
}
