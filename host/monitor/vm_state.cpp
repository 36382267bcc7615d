// What a monitor keeps of its VM in STATE/VM/ (host/monitor/vm_state.hpp).
#include "host/monitor/vm_state.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "host/lib/state_dir.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/monitor/say.hpp"

namespace nes::monitor {

namespace fs = std::filesystem;
using cli::RunPlan;
using cli::ServeConfig;
using cli::put_bounded;

std::optional<host::VmmStdin> stdin_source_of(int fd) {
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode))) return std::nullopt;
  char link[4096];
  const ssize_t n = ::readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), link, sizeof link - 1);
  if (n <= 0 || link[0] != '/') return std::nullopt;
  const std::string path(link, static_cast<std::size_t>(n));
  struct stat ps{};
  if (::stat(path.c_str(), &ps) != 0 || ps.st_dev != st.st_dev || ps.st_ino != st.st_ino) return std::nullopt;
  host::VmmStdin src;
  src.path = path;
  if (S_ISREG(st.st_mode)) {
    src.kind = host::VmmStdin::Kind::file;
    const off_t off = ::lseek(fd, 0, SEEK_CUR);
    src.offset = off > 0 ? static_cast<std::uint64_t>(off) : 0;
  }
  return src;
}

std::function<host::Status(pid_t)> record_gate(const RunPlan& plan, VmResources& run, std::string name) {
  if (!run.vmm_info) return {};
  return [&plan, &run, name = std::move(name)](pid_t pid) -> host::Status {
    auto id = host::identity_of(pid);
    if (!id) return host::Error{fmt::format("/proc/{}/stat: cannot read the new process's identity", pid)};
    host::VmmInfo v = *run.vmm_info;
    if (name.empty()) v.vmm = *id;
    else v.daemons.push_back({name, *id});
    if (auto s = host::write_vmm(plan.state_dir, v); !s) return s;
    run.vmm_info = std::move(v);
    return host::Ok{};
  };
}

namespace {

/// vmm.json (and boot.json, the descriptor; -i's stdin.spool) for a VMM that outlives us, before
/// anything that outlives us starts: what a replacement monitor serves the rest of the generation
/// with (docs/host.md "Re-adoption").
host::Status write_vmm_records(const RunPlan& plan, VmResources& run) {
  const ServeConfig& cfg = plan.serve;
  const std::string& vmid = plan.vm;
  // vmm.json (and boot.json, the descriptor) before anything that outlives us starts.
  host::VmmInfo v;
  v.vm = vmid;
  v.generation = cfg.session.generation;
  v.runtime_dir = plan.runtime_dir;
  v.channel_socket = plan.channel_socket;
  v.data_socket = plan.data_socket;
  v.sandbox = plan.sandbox;
  v.on_exit = cfg.session.on_exit;
  v.stop_timeout = cfg.session.stop_timeout;
  v.grace = cfg.session.grace;
  v.reconnect = cfg.session.reconnect;
  v.log_max_size = plan.workload_log.max_size;
  v.log_max_files = plan.workload_log.max_files;
  v.rm = plan.rm;
  if (plan.interactive) {
    // -i: a replacement monitor goes on feeding the workload's stdin from where it comes.
    v.stdin_source = stdin_source_of(0);
    if (v.stdin_source && v.stdin_source->kind == host::VmmStdin::Kind::fifo) {
      auto sp = host::StdinSpool::open(cfg.state_dir, vmid, true);
      if (!sp) {
        // Unbounded or unwritable: no replacement feeds it; it ends with this monitor, said.
        say("neshost run: {} (a replacement monitor gives the workload's stdin its EOF)\n", sp.error().message);
        v.stdin_source.reset();
      } else {
        run.stdin_spool = std::move(*sp);
      }
    }
  }
  // The output's sinks, when another process can open them again (containerd's FIFOs, a
  // --log-uri file): a replacement writes on to them at the first byte not yet delivered.
  v.stdout_sink = output_sink_of(1);
  v.stderr_sink = output_sink_of(2);
  if (v.stdout_sink || v.stderr_sink) {
    auto t = OutputTally::open(cfg.state_dir, vmid, true);
    if (!t) {
      say("neshost run: {} (a replacement monitor writes the output to workload.log alone)\n", t.error().message);
      v.stdout_sink.reset();
      v.stderr_sink.reset();
    } else {
      run.output_tally = std::move(*t);
      run.count_out = v.stdout_sink.has_value();
      run.count_err = v.stderr_sink.has_value();
    }
  }
  // netns mode: the tap and redirects, so that whoever ends the VM tears them down.
  if (plan.network.mode == host::NetworkMode::netns && plan.network.link)
    v.netns = host::VmmNetns{plan.network.netns, plan.network.link->tap, plan.network.link->name};
  // passt started before the state dir existed; it exits by itself while QEMU never held its
  // socket's other end (ours closes with us), so it is recorded only now.
  if (run.passt)
    if (auto id = host::identity_of(run.passt->pid())) v.daemons.push_back({"passt", *id});
  if (auto s = host::write_boot(cfg.state_dir, vmid, cfg.session.descriptor); !s) return s;
  if (auto s = host::write_vmm(cfg.state_dir, v); !s) return s;
  run.vmm_info = std::move(v);
  return host::Ok{};
}

}  // namespace

host::Status open_vm_state(RunPlan& plan, VmResources& run) {
  ServeConfig& cfg = plan.serve;
  const std::string& vmid = plan.vm;
  // 0700 like serve's (records and console logs are private), and never through a symlink.
  if (auto d = host::open_vm_dir(cfg.state_dir, vmid, true); !d)
    return host::Error{fmt::format("--state: {}", d.error().message)};
  // This process is the VM's monitor for a new generation (host/monitor/reconcile.hpp): reusing a VM id
  // starts a newer one, which nothing of an older one can change. monitor.json names this process
  // for good (pid, start time, boot id): what `neshost stop` and `kill` find it by.
  const host::ProcessIdentity self = host::self_identity().value_or(host::ProcessIdentity{::getpid(), 0, {}});
  {
    host::MonitorInfo mi;
    mi.vm = vmid;
    mi.monitor = self;
    mi.created_at = host::wall_now();
    mi.command = plan.command;
    mi.ports = plan.ports;
    auto gen = host::begin_generation(cfg.state_dir, mi);
    if (!gen) return gen.error();
    cfg.session.generation = *gen;
  }
  auto console = std::make_shared<ConsoleOut>();
  const fs::path console_log = host::vm_path(cfg.state_dir, vmid, host::kConsoleLog);
  if (auto f = host::open_vm_file(cfg.state_dir, vmid, host::kConsoleLog, O_WRONLY | O_CREAT | O_TRUNC))
    console->open_log(std::move(*f));
  console->show = plan.console;
  run.console = std::move(console);
  run.console_log = console_log;
  if (plan.vmm_survives)
    if (auto s = write_vmm_records(plan, run); !s) return s;
  if (run.passt) {
    run.passt_log = host::vm_path(cfg.state_dir, vmid, host::kPasstLog);
    if (auto f = host::open_vm_file(cfg.state_dir, vmid, host::kPasstLog, O_WRONLY | O_CREAT | O_TRUNC))
      run.passt->log_to(std::move(*f));
    else  // its output stays in memory (bounded), where an early exit's message is read from
      say("neshost run: {}: {} (passt's output is not kept)\n", run.passt_log.string(), f.error().message);
  }
  return host::Ok{};
}

}  // namespace nes::monitor
